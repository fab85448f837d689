"""The plateau rule of the language-model comparisons (``docs/results.md``): a run has levelled off after U updates
when its best validation perplexity so far fell by less than 1% over the last 20% of them, from the best at or
before 0.8 U to the best at or before U. The best so far, not the last validation: a stream's validation perplexity
rises and falls with the position in the epoch (each epoch starts the streams again), by more than 1%::

    python -m scripts.plateau OUT [--window 0.2] [--threshold 0.01]

prints, for each training run of a comparison's ``OUT/runs/train`` (finished or still training), the updates its log
reaches, its gain over the last 20% of them, and the validation from which it has met the rule at every validation
since; then the first update count from which every run has: the ``-L`` to give the comparison for its plateau
point.
"""

import argparse
import json
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from scripts.results_io import LOG_ENTRY, RUN_NAME

WINDOW, THRESHOLD = 0.2, 0.01


def gain(valid: Sequence[Tuple[int, float]], at: int, window: float = WINDOW) -> Optional[float]:
    """The relative fall of the best validation perplexity over the last ``window`` of ``at`` updates:
    1 - best ppl up to ``at`` / best ppl up to (1 - window) * ``at``; None when ``at`` was not validated or no
    validation comes early enough. ``valid``: (updates, loss in base 2, fairseq's), by updates."""
    if at not in dict(valid):
        return None
    earlier = [loss for u, loss in valid if u <= (1 - window) * at]
    if not earlier:
        return None
    return 1 - 2 ** (min(loss for u, loss in valid if u <= at) - min(earlier))


def first_plateau(
    valid: Sequence[Tuple[int, float]], window: float = WINDOW, threshold: float = THRESHOLD
) -> Optional[int]:
    """The validated update count from which the run has met the rule at every validation since, or None when its
    last one does not. Not merely the first that met it: a validation perplexity that rises early (an unstable
    start) gives no gain over a window, and the run falls a long way after it."""
    since = None
    for updates, _ in valid:
        found = gain(valid, updates, window)
        if found is None:
            continue
        if found < threshold:
            since = updates if since is None else since
        else:
            since = None
    return since


def validations(log: Path) -> List[Tuple[int, float]]:
    """(updates, validation loss) of a fairseq json log, in order, the last entry kept where two share a count."""
    found = {}
    for line in log.read_text(errors="replace").splitlines():
        entry = LOG_ENTRY.search(line)
        if entry and entry["kind"] == "valid":
            values = json.loads(entry["json"])
            found[int(values["valid_num_updates"])] = float(values["valid_loss"])
    return sorted(found.items())


def report(out: Path, window: float = WINDOW, threshold: float = THRESHOLD) -> str:
    runs = sorted(d for d in (out / "runs" / "train").glob("*") if d.is_dir() and RUN_NAME.match(d.name))
    if not runs:
        raise SystemExit(f"error: {out / 'runs' / 'train'} holds no run; give the comparison's OUT")
    lines = [f"run | updates | gain over the last {window:.0%} | since (gain < {threshold:.0%} there and after)"]
    firsts = []
    for run in runs:
        log = next((run / name for name in ("train.log", "train.log.tmp") if (run / name).is_file()), None)
        valid = validations(log) if log else []
        if not valid:
            lines.append(f"{run.name} | 0 | - | -")
            firsts.append(None)
            continue
        last = valid[-1][0]
        found = gain(valid, last, window)
        first = first_plateau(valid, window, threshold)
        firsts.append(first)
        shown = "-" if found is None else f"{100 * found:.2f}%"
        lines.append(f"{run.name} | {last} | {shown} | {first if first is not None else 'not yet'}")
    if all(f is not None for f in firsts):
        lines.append(f"every run has met the rule since {max(firsts)} updates (-L {max(firsts)})")
    else:
        waiting = [r.name for r, f in zip(runs, firsts) if f is None]
        lines.append(f"not levelled off yet: {', '.join(waiting)}; train them longer (a larger -L)")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a comparison's output directory (with runs/train)")
    parser.add_argument("--window", type=float, default=WINDOW, help="the last fraction of updates (default 0.2)")
    parser.add_argument("--threshold", type=float, default=THRESHOLD, help="the gain below which (default 0.01)")
    args = parser.parse_args(argv)
    if not 0 < args.window < 1 or not 0 < args.threshold < 1:
        raise SystemExit("error: --window and --threshold are fractions between 0 and 1")
    print(report(args.out, args.window, args.threshold))


if __name__ == "__main__":
    main()
