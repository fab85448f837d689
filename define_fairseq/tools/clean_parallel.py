"""Drop the sentence pairs of a parallel corpus that are too short, too long or too unequal in length, with the
length and ratio rules of Moses' ``clean-corpus-n.perl`` (not its other filters, e.g. on very long words)::

    python -m define_fairseq.tools.clean_parallel SRC_IN TGT_IN SRC_OUT TGT_OUT [--min-len 1] [--max-len 250] \\
        [--ratio 1.5]

Pair ``i`` (line ``i`` of SRC_IN and of TGT_IN) is kept when both sides have between ``--min-len`` and
``--max-len`` whitespace-separated tokens (inclusive) and the longer side has at most ``--ratio`` times the
tokens of the shorter one (checked only when both sides have a token, which with the default
``--min-len 1`` is always). A kept line is written with its whitespace runs collapsed to single spaces and
stripped. Lines are split at "\\n" only; the files are UTF-8 text and must have the same number of lines.
Both outputs are written to ``*.tmp`` and renamed at the end; on an error neither is written.
"""

import argparse
import os
import sys
from typing import Iterator, List, Optional, Tuple

if __package__:
    from .arguments import int_at_least
else:  # run as a script, as the recipes run it so that the package (and fairseq) is not loaded
    from arguments import int_at_least


def count_lines(path: str) -> int:
    """Lines of ``path`` split at b"\\n": ``wc -l``, plus one when the last line has no "\\n"."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def read_lines(path: str) -> Iterator[str]:
    """The lines of ``path`` (split at "\\n" only, strict UTF-8), without their "\\n"."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                yield raw.rstrip(b"\n").decode("utf-8")
            except UnicodeDecodeError as e:
                raise SystemExit(f"error: {path} line {number} is not UTF-8 text ({e}); convert it to UTF-8")


def keep_pair(src_tokens: List[str], tgt_tokens: List[str], min_len: int, max_len: int, ratio: float) -> bool:
    """Whether a pair with these tokens passes the length and length-ratio filters."""
    ns, nt = len(src_tokens), len(tgt_tokens)
    if not (min_len <= ns <= max_len and min_len <= nt <= max_len):
        return False
    if ns >= 1 and nt >= 1 and max(ns, nt) / min(ns, nt) > ratio:
        return False
    return True


def clean_parallel(
    src_in: str, tgt_in: str, src_out: str, tgt_out: str, min_len: int = 1, max_len: int = 250, ratio: float = 1.5
) -> Tuple[int, int]:
    """Write the kept pairs of ``src_in``/``tgt_in`` to ``src_out``/``tgt_out``; returns (kept, total)."""
    for path in (src_in, tgt_in):
        if not os.path.isfile(path):
            raise SystemExit(f"error: input file {path} does not exist")
    n_src, n_tgt = count_lines(src_in), count_lines(tgt_in)
    if n_src != n_tgt:
        raise SystemExit(
            f"error: {src_in} has {n_src} lines but {tgt_in} has {n_tgt}; the two sides of a "
            f"parallel corpus must have one line per sentence pair"
        )
    tmp_paths = (src_out + ".tmp", tgt_out + ".tmp")
    kept = total = 0
    try:
        with open(tmp_paths[0], "w", encoding="utf-8", newline="\n") as src_file, open(
            tmp_paths[1], "w", encoding="utf-8", newline="\n"
        ) as tgt_file:
            for src_line, tgt_line in zip(read_lines(src_in), read_lines(tgt_in)):
                total += 1
                src_tokens, tgt_tokens = src_line.split(), tgt_line.split()
                if keep_pair(src_tokens, tgt_tokens, min_len, max_len, ratio):
                    src_file.write(" ".join(src_tokens) + "\n")
                    tgt_file.write(" ".join(tgt_tokens) + "\n")
                    kept += 1
        if total != n_src:
            raise SystemExit(
                f"error: {src_in} or {tgt_in} changed while being read ({n_src} lines counted, {total} read)"
            )
        os.replace(tmp_paths[0], src_out)
        os.replace(tmp_paths[1], tgt_out)
    except BaseException:
        for path in tmp_paths:
            if os.path.exists(path):
                os.remove(path)
        raise
    return kept, total


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ratio must be a number, got {text!r}")
    if not value >= 1.0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"--ratio must be at least 1 (longer side / shorter side), got {text}")
    return value


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m define_fairseq.tools.clean_parallel",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("src_in", metavar="SRC_IN", help="source side, one sentence a line")
    parser.add_argument("tgt_in", metavar="TGT_IN", help="target side, line i translates line i of SRC_IN")
    parser.add_argument("src_out", metavar="SRC_OUT", help="where to write the kept source lines")
    parser.add_argument("tgt_out", metavar="TGT_OUT", help="where to write the kept target lines")
    parser.add_argument(
        "--min-len", type=int_at_least(0, "--min-len"), default=1, help="fewest tokens a side may have (default: 1)"
    )
    parser.add_argument(
        "--max-len", type=int_at_least(0, "--max-len"), default=250, help="most tokens a side may have (default: 250)"
    )
    parser.add_argument(
        "--ratio",
        type=_ratio,
        default=1.5,
        help="largest allowed length ratio, longer side / shorter side (default: 1.5)",
    )
    args = parser.parse_args(argv)
    if args.max_len < args.min_len:
        parser.error(f"--max-len ({args.max_len}) must be at least --min-len ({args.min_len})")
    if os.path.abspath(args.src_out) == os.path.abspath(args.tgt_out):
        parser.error(f"SRC_OUT and TGT_OUT are the same file ({args.src_out}); give two names")
    for name, path in (("SRC_OUT", args.src_out), ("TGT_OUT", args.tgt_out)):
        if os.path.isdir(path):
            parser.error(f"{name} {path} is a directory; give a file name")
        if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            parser.error(f"{name} {path}: its directory does not exist")
    try:
        kept, total = clean_parallel(
            args.src_in, args.tgt_in, args.src_out, args.tgt_out, args.min_len, args.max_len, args.ratio
        )
    except OSError as e:  # the message names the file
        raise SystemExit(f"error: {e}")
    print(
        f"clean_parallel: kept {kept} of {total} sentence pairs (min-len {args.min_len}, max-len {args.max_len}, "
        f"ratio {args.ratio:g})",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
