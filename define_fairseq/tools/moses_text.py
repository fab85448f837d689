r"""Moses text processing (punctuation normalisation, tokenization, detokenization) with sacremoses, and the
compound splitting used for WMT En-De BLEU.

    python -m define_fairseq.tools.moses_text tokenize   -l LANG [-j WORKERS] [--no-normalize] [INPUT [OUTPUT]]
    python -m define_fairseq.tools.moses_text normalize  -l LANG [-j WORKERS] [INPUT [OUTPUT]]
    python -m define_fairseq.tools.moses_text detokenize -l LANG [-j WORKERS] [INPUT [OUTPUT]]
    python -m define_fairseq.tools.moses_text split-compounds [INPUT [OUTPUT]]

INPUT and OUTPUT default to stdin and stdout ("-" means them too); an OUTPUT file is written to
``OUTPUT.tmp`` and renamed at the end. Text is UTF-8. Lines are split at "\\n" only (a "\\r", "\\x0b",
"\\x1c" or "\\u2028" inside a line does not end it), and every input line gives exactly one output line,
an empty line an empty line, so the two sides of a parallel corpus stay aligned. The number of lines is
that of ``wc -l INPUT``, plus one when the last line has no "\\n"; every output line ends with "\\n".

- ``normalize``: Moses' ``normalize-punctuation.perl -l LANG | remove-non-printing-char.perl``, i.e.
  ``MosesPunctNormalizer(lang, pre_replace_unicode_punct=False)``, then every ``\p{C}`` character (control,
  format, ...: a tab too) replaced by a space, as the Perl script does (sacremoses' ``post_remove_control_chars``
  would delete it instead, gluing the words on either side).
- ``tokenize``: ``normalize`` (unless ``--no-normalize``), then Moses' ``tokenizer.perl -a -l LANG``:
  aggressive hyphen splitting (``well-known`` -> ``well @-@ known``) and XML escaping (``&`` -> ``&amp;``).
- ``detokenize``: Moses' ``detokenizer.perl -l LANG``, XML entities unescaped.
- ``split-compounds``: tensor2tensor's ``get_ende_bleu.sh`` / fairseq's ``compound_split_bleu.sh`` step,
  perl's ``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g``: each hyphen between two non-space characters becomes
  `` ##AT##-##AT## ``. Matches do not overlap and are found left to right, so, exactly as with perl,
  ``a-b-c`` gives ``a ##AT##-##AT## b-c`` (the ``b`` was used by the first match) and a tokenized
  ``x @-@ y`` gives ``x @ ##AT##-##AT## @ y``.

``-j WORKERS`` processes chunks of lines in that many processes; the output does not depend on it.
"""

import argparse
import collections
import itertools
import multiprocessing
import os
import re
import sys
from typing import Callable, Iterable, Iterator, List, Optional

import regex

if __package__:
    from .arguments import int_at_least
else:  # run as a script, as the recipes run it so that the package (and fairseq) is not loaded
    from arguments import int_at_least

CHUNK_LINES = 2000  # lines a worker processes at a time
COMMANDS = ("tokenize", "normalize", "detokenize", "split-compounds")

_COMPOUND = re.compile(r"(\S)-(\S)")
_NON_PRINTING = regex.compile(r"\p{C}")  # Unicode's "other" characters: control, format, unassigned, ...


def split_compounds(line: str) -> str:
    """``line`` with every hyphen between two non-space characters written `` ##AT##-##AT## `` (one
    left-to-right pass, non-overlapping: ``a-b-c`` -> ``a ##AT##-##AT## b-c``)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def moses_languages() -> List[str]:
    """The language codes sacremoses has nonbreaking-prefix lists for (any other falls back to English)."""
    from sacremoses.corpus import NonbreakingPrefixes

    return sorted(set(NonbreakingPrefixes().available_langs.values()))


def make_processor(command: str, lang: Optional[str] = None, normalize: bool = True) -> Callable[[str], str]:
    """The function that maps one line (without its "\\n") of ``command``'s input to its output line."""
    if command == "split-compounds":
        return split_compounds
    from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer

    if command == "detokenize":
        detokenizer = MosesDetokenizer(lang=lang)
        return lambda line: detokenizer.detokenize(line.split(), unescape=True)
    normalizer = MosesPunctNormalizer(lang=lang, pre_replace_unicode_punct=False, post_remove_control_chars=False)

    def normalize_line(line: str) -> str:
        # remove-non-printing-char.perl replaces each control/format/unassigned character by a space (sacremoses'
        # own option deletes it, gluing "a\tb" into "ab")
        return _NON_PRINTING.sub(" ", normalizer.normalize(line))

    if command == "normalize":
        return normalize_line
    if command != "tokenize":
        raise ValueError(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")
    tokenizer = MosesTokenizer(lang=lang)

    def tokenize(line: str) -> str:
        if normalize:
            line = normalize_line(line)
        return tokenizer.tokenize(line, aggressive_dash_splits=True, escape=True, return_str=True)

    return tokenize


_worker_processor: Optional[Callable[[str], str]] = None


def _init_worker(command: str, lang: Optional[str], normalize: bool) -> None:
    global _worker_processor
    _worker_processor = make_processor(command, lang, normalize)


def _run_chunk(lines: List[str]) -> List[str]:
    return [_worker_processor(line) for line in lines]


def _chunks(lines: Iterable[str], size: int) -> Iterator[List[str]]:
    lines = iter(lines)
    while True:
        chunk = list(itertools.islice(lines, size))
        if not chunk:
            return
        yield chunk


def process_lines(
    lines: Iterable[str],
    command: str,
    lang: Optional[str] = None,
    workers: int = 1,
    normalize: bool = True,
    chunk_lines: int = CHUNK_LINES,
) -> Iterator[str]:
    """The output lines of ``command`` for ``lines`` (strings without "\\n"), in order, one per line.

    With ``workers > 1`` chunks of ``chunk_lines`` lines go to a process pool, each worker building its
    sacremoses objects once. At most ``2 * workers`` chunks are in flight, so a large file is never
    held in memory as a whole (``Pool.imap`` would read all of its input ahead).
    """
    if workers <= 1:
        process = make_processor(command, lang, normalize)
        for line in lines:
            yield process(line)
        return
    with multiprocessing.Pool(workers, initializer=_init_worker, initargs=(command, lang, normalize)) as pool:
        pending = collections.deque()
        for chunk in _chunks(lines, chunk_lines):
            pending.append(pool.apply_async(_run_chunk, (chunk,)))
            if len(pending) >= 2 * workers:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


def read_lines(stream, name: str) -> Iterator[str]:
    """The lines of a binary ``stream``, split at b"\\n" only and decoded as strict UTF-8, without "\\n"."""
    for number, raw in enumerate(stream, 1):
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SystemExit(f"error: {name} line {number} is not UTF-8 text ({e}); convert the file to UTF-8")


def run(
    command: str,
    input_path: str = "-",
    output_path: str = "-",
    lang: Optional[str] = None,
    workers: int = 1,
    normalize: bool = True,
) -> int:
    """Process ``input_path`` into ``output_path`` ("-": stdin / stdout); returns the number of lines."""
    count = 0
    source = sys.stdin.buffer if input_path == "-" else open(input_path, "rb")
    tmp_path = None if output_path == "-" else output_path + ".tmp"
    try:
        target = sys.stdout.buffer if tmp_path is None else open(tmp_path, "wb")
        try:
            outputs = process_lines(
                read_lines(source, "stdin" if input_path == "-" else input_path), command, lang, workers, normalize
            )
            for line in outputs:
                target.write(line.encode("utf-8") + b"\n")
                count += 1
            target.flush()
        finally:
            if tmp_path is not None:
                target.close()
        if tmp_path is not None:
            os.replace(tmp_path, output_path)
    except BaseException:
        if tmp_path is not None and os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise
    finally:
        if input_path != "-":
            source.close()
    return count


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m define_fairseq.tools.moses_text",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    helps = {
        "tokenize": "normalize punctuation, then tokenizer.perl -a (XML escaping on)",
        "normalize": "normalize-punctuation.perl | remove-non-printing-char.perl",
        "detokenize": "detokenizer.perl (XML entities unescaped)",
        "split-compounds": "the ##AT##-##AT## compound splitting of WMT En-De BLEU scripts",
    }
    subparsers = {}
    for command in COMMANDS:
        sub = commands.add_parser(command, help=helps[command], description=helps[command])
        subparsers[command] = sub
        if command != "split-compounds":
            sub.add_argument("-l", "--lang", required=True, help="language code (en, de, ...)")
            sub.add_argument(
                "-j",
                "--workers",
                type=int_at_least(1, "--workers"),
                default=1,
                help="number of processes (default: 1); the output does not depend on it",
            )
        if command == "tokenize":
            sub.add_argument(
                "--no-normalize", action="store_true", help="tokenize without normalizing the punctuation first"
            )
        sub.add_argument("--verbose", action="store_true", help="print the number of lines on stderr at the end")
        sub.add_argument("input", metavar="INPUT", nargs="?", default="-", help="input file (default: stdin)")
        sub.add_argument("output", metavar="OUTPUT", nargs="?", default="-", help="output file (default: stdout)")
    args = parser.parse_args(argv)
    sub = subparsers[args.command]
    lang = getattr(args, "lang", None)
    if lang is not None:
        known = moses_languages()
        if lang not in known:
            sub.error(
                f"-l/--lang: sacremoses has no language {lang!r} (it would silently use English rules); "
                f"use one of {', '.join(known)}"
            )
    if args.input != "-" and not os.path.isfile(args.input):
        sub.error(f"INPUT {args.input} does not exist or is not a file")
    if args.output != "-":
        if os.path.isdir(args.output):
            sub.error(f"OUTPUT {args.output} is a directory; give a file name")
        if not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
            sub.error(f"OUTPUT {args.output}: its directory does not exist")
    try:
        count = run(
            args.command,
            args.input,
            args.output,
            lang,
            getattr(args, "workers", 1),
            not getattr(args, "no_normalize", False),
        )
    except BrokenPipeError:  # e.g. piped into head: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(1)
    except OSError as e:  # the message names the file
        raise SystemExit(f"error: {e}")
    if args.verbose:
        print(f"moses_text {args.command}: {count} lines", file=sys.stderr)


if __name__ == "__main__":
    main()
