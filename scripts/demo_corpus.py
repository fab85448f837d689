"""Build a small English-German parallel corpus, offline, from the gettext catalogs installed on this machine.

    python -m scripts.demo_corpus OUTDIR [--locale-dir DIR] [--min-pairs N]

Source: the compiled gettext message catalogs in ``/usr/share/locale/de/LC_MESSAGES/*.mo`` (by default). Each
one pairs a program's English messages (``msgid``) with their German translation (``msgstr``), written by the
translators of that program; this is how OPUS builds its GNOME, KDE and Ubuntu corpora. On a Debian/Ubuntu
machine the ~86 catalogs of the base packages give about 43,000 unique pairs.

Licence: each catalog carries the licence of the package it comes from (mostly GPL or LGPL; the PostgreSQL
licence for the PostgreSQL ones, and so on; see ``/usr/share/doc/<package>/copyright``). This tool only reads
them from the machine it runs on, for a local demo; the project redistributes none of them.

Rules, in order:

* the header entry (empty ``msgid``) is skipped; a ``msgctxt`` prefix (text up to ``\\x04``) is removed;
  plural entries (forms separated by ``\\x00``) keep the singular ``msgid`` and the first ``msgstr`` form;
* entries that are not valid UTF-8 are skipped;
* whitespace is normalised (newlines and tabs become spaces, runs collapse, ends are stripped);
* skipped: an empty side, a side without any letter, a translation equal to its source, and a side longer
  than ``MAX_WORDS`` (50) whitespace-separated words (the few long help texts, which would only slow the
  demo's training down);
* pairs are deduplicated by the English side, keeping the first translation met when the catalogs are read
  in sorted file-name order (entries in the catalog's own order), so one English sentence never lands in two
  splits;
* the split is decided by the SHA-1 of the UTF-8 English text alone: about 2% test, 2% valid, the rest train.
  It is the same on every run, and does not depend on how the directory lists its files.

Writes ``OUTDIR/{train,valid,test}.{en,de}`` (one sentence a line, the pairs sorted by the hash, so the
order too is fixed), each file first to a temporary name and then renamed into place.
"""

import argparse
import hashlib
import os
import re
import struct
import sys
import tempfile
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

DEFAULT_LOCALE_DIR = "/usr/share/locale/de/LC_MESSAGES"
MAX_WORDS = 50
# Out of HASH_BUCKETS buckets of the SHA-1: the first TEST_BUCKETS are test, as many after them valid.
HASH_BUCKETS = 10000
TEST_BUCKETS = 200
SPLITS = ("train", "valid", "test")

_MO_MAGIC = 0x950412DE
_WHITESPACE = re.compile(r"\s+")


class CorpusError(Exception):
    """The corpus could not be built (no catalogs, too few pairs)."""


def parse_mo(data: bytes) -> List[Tuple[bytes, bytes]]:
    """The (original, translation) byte strings of a compiled gettext catalog, in the catalog's order.

    The format: a header of 32-bit words, magic 0x950412de (in the file's byte order), revision, number of
    strings N, offset of the originals table, offset of the translations table; each table holds N
    (length, offset) pairs pointing at the strings.
    """
    if len(data) < 20:
        raise ValueError("not a gettext .mo file: too short")
    for order in ("<", ">"):
        if struct.unpack(order + "I", data[:4])[0] == _MO_MAGIC:
            break
    else:
        raise ValueError("not a gettext .mo file: bad magic number")
    revision, count, originals, translations = struct.unpack(order + "4I", data[4:20])
    if revision >> 16 > 1:
        raise ValueError(f"unsupported .mo major revision {revision >> 16}")

    def string(table: int, index: int) -> bytes:
        entry = table + 8 * index
        if entry + 8 > len(data):
            raise ValueError("corrupt .mo file: string table past the end")
        length, offset = struct.unpack(order + "2I", data[entry : entry + 8])
        if offset + length > len(data):
            raise ValueError("corrupt .mo file: string past the end")
        return data[offset : offset + length]

    return [(string(originals, i), string(translations, i)) for i in range(count)]


def normalise(text: str) -> str:
    """Newlines, tabs and runs of whitespace become one space; the ends are stripped."""
    return _WHITESPACE.sub(" ", text).strip()


def _usable(text: str, max_words: int) -> bool:
    return bool(text) and any(c.isalpha() for c in text) and len(text.split(" ")) <= max_words


def usable_pair(source: str, target: str, max_words: int = MAX_WORDS) -> bool:
    """Both sides hold a letter and at most ``max_words`` words, and the translation differs from its source."""
    return source != target and _usable(source, max_words) and _usable(target, max_words)


def catalog_pairs(entries: Iterable[Tuple[bytes, bytes]], max_words: int = MAX_WORDS) -> Iterator[Tuple[str, str]]:
    """The usable (English, German) pairs of a parsed catalog, after the rules of the module docstring."""
    for msgid, msgstr in entries:
        if b"\x04" in msgid:  # msgctxt EOT msgid
            msgid = msgid.split(b"\x04", 1)[1]
        msgid = msgid.split(b"\x00", 1)[0]  # plural: the singular
        msgstr = msgstr.split(b"\x00", 1)[0]  # plural: the first form
        if not msgid:  # the header (or an empty message)
            continue
        try:
            source = normalise(msgid.decode("utf-8"))
            target = normalise(msgstr.decode("utf-8"))
        except UnicodeDecodeError:
            continue
        if not usable_pair(source, target, max_words):
            continue
        yield source, target


def catalog_files(locale_dir: str) -> List[str]:
    """The ``.mo`` files of ``locale_dir``, sorted by name; a clear error when there are none."""
    hint = (
        "The demo reads the German translations that Debian/Ubuntu packages install there; install them "
        "(do not strip locales, e.g. remove the path-exclude rule for /usr/share/locale in "
        "/etc/dpkg/dpkg.cfg.d/ and reinstall the packages), or pass --locale-dir with a directory of "
        "German .mo catalogs."
    )
    if not os.path.isdir(locale_dir):
        raise CorpusError(f"locale directory {locale_dir} does not exist. {hint}")
    names = sorted(name for name in os.listdir(locale_dir) if name.endswith(".mo"))
    files = [os.path.join(locale_dir, name) for name in names if os.path.isfile(os.path.join(locale_dir, name))]
    if not files:
        raise CorpusError(f"locale directory {locale_dir} holds no .mo files. {hint}")
    return files


def collect_pairs(files: Iterable[str], max_words: int = MAX_WORDS) -> Dict[str, str]:
    """English -> German over the catalogs, read in sorted file-name order; the first translation wins.

    A file that is not a valid catalog is skipped with a warning.
    """
    pairs: Dict[str, str] = {}
    for path in sorted(files, key=os.path.basename):
        with open(path, "rb") as f:
            data = f.read()
        try:
            entries = parse_mo(data)
        except ValueError as e:
            print(f"warning: skipping {path}: {e}", file=sys.stderr)
            continue
        for source, target in catalog_pairs(entries, max_words):
            pairs.setdefault(source, target)
    return pairs


def _digest(source: str) -> bytes:
    return hashlib.sha1(source.encode("utf-8")).digest()


def split_of(source: str, held_out: int = TEST_BUCKETS) -> str:
    """``train``, ``valid`` or ``test``, from the SHA-1 of the English text alone; ``held_out`` of the
    ``HASH_BUCKETS`` buckets go to each of test and valid."""
    bucket = int.from_bytes(_digest(source)[:8], "big") % HASH_BUCKETS
    if bucket < held_out:
        return "test"
    if bucket < 2 * held_out:
        return "valid"
    return "train"


def split_pairs(pairs: Dict[str, str], held_out: int = TEST_BUCKETS) -> Dict[str, List[Tuple[str, str]]]:
    """The pairs of each split, ordered by the hash of the English side (then the text), so fixed too."""
    splits: Dict[str, List[Tuple[str, str]]] = {name: [] for name in SPLITS}
    for source in sorted(pairs, key=lambda s: (_digest(s), s)):
        splits[split_of(source, held_out)].append((source, pairs[source]))
    return splits


def html_pages(top: str) -> Iterator[str]:
    """The path of every ``.html`` file under ``top``, folders and files in name order, so that a corpus built from
    them comes out the same on every machine."""
    for directory, subdirs, files in os.walk(top):
        subdirs.sort()
        for file in sorted(files):
            if file.endswith(".html"):
                yield os.path.join(directory, file)


def _write_atomic(path: str, lines: Iterable[str]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for line in lines:
                f.write(line + "\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def build_corpus(
    outdir: str, locale_dir: str = DEFAULT_LOCALE_DIR, min_pairs: int = 10000, max_words: int = MAX_WORDS
) -> Dict[str, int]:
    """Write ``outdir/{train,valid,test}.{en,de}``; returns the number of pairs of each split."""
    files = catalog_files(locale_dir)
    pairs = collect_pairs(files, max_words)
    if len(pairs) < min_pairs:
        raise CorpusError(
            f"only {len(pairs)} usable English-German pairs in the {len(files)} catalogs of "
            f"{locale_dir}, fewer than the {min_pairs} required (--min-pairs); install more "
            f"packages' German translations or pass --locale-dir with a fuller directory"
        )
    return write_splits(outdir, pairs)


def write_splits(outdir: str, pairs: Dict[str, str], held_out: int = TEST_BUCKETS) -> Dict[str, int]:
    """Split English -> German ``pairs`` by the hash of the English side (:func:`split_of`) and write
    ``outdir/{train,valid,test}.{en,de}`` (each file through a temporary name); returns each split's size."""
    splits = split_pairs(pairs, held_out)
    os.makedirs(outdir, exist_ok=True)
    for name in SPLITS:
        _write_atomic(os.path.join(outdir, name + ".en"), (en for en, _ in splits[name]))
        _write_atomic(os.path.join(outdir, name + ".de"), (de for _, de in splits[name]))
    return {name: len(splits[name]) for name in SPLITS}


def add_pair_options(parser: argparse.ArgumentParser) -> None:
    """The options every parallel-corpus script takes: ``--min-pairs`` and ``--max-words``."""
    parser.add_argument(
        "--min-pairs", type=int, default=10000, help="fail when fewer unique pairs come out (default: 10000)"
    )
    parser.add_argument(
        "--max-words",
        type=int,
        default=MAX_WORDS,
        help=f"skip pairs with a side longer than this many words (default: {MAX_WORDS})",
    )


def pairs_line(counts: Dict[str, int], origin: str, outdir: str) -> str:
    """What a parallel-corpus script prints: the pairs of each split, whence (``origin``) and where they went."""
    return (
        f"{sum(counts.values())} {origin}: "
        + ", ".join(f"{name} {counts[name]}" for name in SPLITS)
        + f" -> {outdir}/{{train,valid,test}}.{{en,de}}"
    )


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.demo_corpus",
        description="Build an English-German corpus from the German gettext catalogs installed on this machine.",
    )
    parser.add_argument("outdir", help="where to write {train,valid,test}.{en,de}")
    parser.add_argument(
        "--locale-dir",
        default=DEFAULT_LOCALE_DIR,
        help=f"directory of German .mo catalogs (default: {DEFAULT_LOCALE_DIR})",
    )
    add_pair_options(parser)
    args = parser.parse_args(argv)
    try:
        counts = build_corpus(args.outdir, args.locale_dir, args.min_pairs, args.max_words)
    except CorpusError as e:
        raise SystemExit(f"error: {e}")
    print(pairs_line(counts, f"pairs from {args.locale_dir}", args.outdir))


if __name__ == "__main__":
    main()
