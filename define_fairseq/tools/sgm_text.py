"""Print the segments of a WMT "fake SGML" file (``newstest2014-deen-ref.de.sgm`` and the like), one a line,
exactly as sacreBLEU reads them::

    python -m define_fairseq.tools.sgm_text FILE.sgm [OUTPUT]

As sacreBLEU's ``FakeSGMLDataset``: every line that starts with ``<seg `` gives one segment,
``re.sub(r"<seg.*?>(.*)</seg>.*?", r"\\1", line)`` with its whitespace runs collapsed to one space and
stripped; all other lines (``<doc ...>``, ``<p>``, ...) are skipped. Entities such as ``&amp;`` are kept as
they are, as sacreBLEU keeps them. Without OUTPUT the text goes to stdout; OUTPUT is written to
``OUTPUT.tmp`` and renamed at the end.
"""

import argparse
import os
import re
import sys
from typing import List, Optional

_SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")
_SPACES = re.compile(r"\s+")


def segment_text(line: str) -> str:
    """The text of one ``<seg ...>...</seg>`` line, as sacreBLEU extracts and cleans it."""
    return _SPACES.sub(" ", _SEG.sub(r"\1", line).strip())


def read_segments(path: str) -> List[str]:
    """The segments of the WMT .sgm file ``path``; SystemExit with a message naming it when it has none or is
    not UTF-8."""
    try:
        with open(path, encoding="utf-8", errors="strict", newline="\n") as f:
            segments = [segment_text(line) for line in f if line.startswith("<seg ")]
    except UnicodeDecodeError as e:
        raise SystemExit(f"error: {path} is not UTF-8 text ({e})")
    if not segments:
        raise SystemExit(f"error: {path} has no line starting with '<seg ': not a WMT .sgm file?")
    return segments


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m define_fairseq.tools.sgm_text",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sgm", metavar="FILE.sgm", help="a WMT test set file in its SGML-like format")
    parser.add_argument("output", metavar="OUTPUT", nargs="?", help="where to write the text (default: stdout)")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.sgm):
        parser.error(f"FILE.sgm {args.sgm} does not exist or is not a file")
    if args.output is not None:
        if os.path.isdir(args.output):
            parser.error(f"OUTPUT {args.output} is a directory; give a file name")
        if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
            parser.error(f"OUTPUT {args.output}: its directory does not exist")
    try:
        segments = read_segments(args.sgm)
        text = "".join(segment + "\n" for segment in segments)
        if args.output is None:
            sys.stdout.flush()
            sys.stdout.buffer.write(text.encode("utf-8"))
            sys.stdout.buffer.flush()
            return
        tmp = args.output + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
            os.replace(tmp, args.output)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
    except OSError as e:  # the message names the file
        raise SystemExit(f"error: {e}")


if __name__ == "__main__":
    main()
