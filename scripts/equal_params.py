"""The largest size at which one model has no more parameters than another, for comparisons at equal parameters::

    python -m scripts.equal_params --budget "--input-layer define --define-n 64" \\
        --size "--input-layer projective --define-n {}" -- data-bin --user-dir define_fairseq --arch ...

prints the largest integer (a multiple of ``--step``) that, put for ``{}`` in ``--size``'s arguments, builds a
model (with the fairseq-train arguments after ``--``) whose parameter count does not exceed that of the model built
with ``--budget``'s arguments; then, tab-separated, the two counts. The count must grow with the size (a width, a
hidden size), which a binary search between ``--low`` and ``--high`` relies on.
"""

import argparse
import logging
import shlex
import warnings
from typing import Callable, List, Optional, Tuple

from define_fairseq.tools.params import parameter_breakdown, setup_from_train_args


def count(argv: List[str]) -> int:
    """The parameter count of the model fairseq-train ``argv`` builds."""
    return parameter_breakdown(setup_from_train_args(argv)[2])["total"]


def largest_within(budget: int, count_at: Callable[[int], int], low: int, high: int, step: int = 1) -> Tuple[int, int]:
    """``(size, count)``: the largest multiple of ``step`` in ``[low, high]`` with ``count_at(size) <= budget`` (a
    count that grows with the size). Raises ``ValueError`` naming ``--low`` or ``--high`` when the range misses it."""
    lo, hi = -(-low // step), high // step  # the multiples of step within [low, high]
    if lo > hi or count_at(lo * step) > budget:
        raise ValueError(
            f"at --low {lo * step} the model already has more parameters than the budget {budget}: lower --low"
        )
    if count_at(hi * step) <= budget:
        raise ValueError(
            f"at --high {hi * step} the model has {count_at(hi * step)} parameters, within the budget "
            f"{budget}: raise --high"
        )
    while hi - lo > 1:  # count_at(lo * step) <= budget < count_at(hi * step)
        middle = (lo + hi) // 2
        lo, hi = (middle, hi) if count_at(middle * step) <= budget else (lo, middle)
    return lo * step, count_at(lo * step)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.equal_params", description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", required=True, help="the arguments of the model whose count is the budget")
    parser.add_argument("--size", required=True, help="the arguments of the other model, with {} for the size")
    parser.add_argument("--low", type=int, default=1, help="the smallest size tried (default: 1)")
    parser.add_argument("--high", type=int, default=4096, help="a size above the answer (default: 4096)")
    parser.add_argument(
        "--step",
        type=int,
        default=1,
        help="try multiples of this only, e.g. DeFINE's groups g_max for --define-n (default: 1)",
    )
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then fairseq-train's arguments")
    args = parser.parse_args(argv)
    common = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    if "{}" not in args.size:
        parser.error(f"--size {args.size!r} has no {{}} for the size")
    logging.disable(logging.INFO)
    warnings.filterwarnings("ignore", category=UserWarning)
    budget = count(common + shlex.split(args.budget))
    cache = {}

    if args.step < 1:
        parser.error(f"--step {args.step} must be at least 1")

    def count_at(size: int) -> int:
        if size not in cache:
            cache[size] = count(common + shlex.split(args.size.replace("{}", str(size))))
        return cache[size]

    try:
        size, total = largest_within(budget, count_at, args.low, args.high, args.step)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"{size}\t{total}\t{budget}")


if __name__ == "__main__":
    main()
