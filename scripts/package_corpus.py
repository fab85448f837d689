"""Build English-German corpora of other kinds than the demo's, offline, from translated text in Debian packages.

    python -m scripts.package_corpus ding OUTDIR [--dictionary FILE]
    python -m scripts.package_corpus libreoffice-help OUTDIR [--help-dir DIR]

Two sources, each a different kind of text from the demo's software messages:

* ``ding``: the example sentences of the Ding German-English dictionary (TU Chemnitz; Debian's ``trans-de-en``,
  ``/usr/share/trans/de-en``): general-domain, conversational and idiomatic sentences, about 18,000 pairs.
  A line is ``German :: English``; each side holds sub-entries separated by `` | ``, which pair up in order. A
  pair is kept when both sides are sentences (a capital letter, digit or quote first; ``.``, ``!`` or ``?`` last),
  after the dictionary's annotations in ``{...}`` and ``[...]`` are removed; sub-entries with ``;`` (lists of
  alternatives) and English sides of fewer than 3 words are skipped. Its sentences are short (8 words on
  average), so 5% of them go to test and 5% to valid (about 900 each).
* ``libreoffice-help``: LibreOffice's help (Debian's ``libreoffice-help-en-us`` and ``libreoffice-help-de``,
  ``/usr/share/libreoffice/help/{en-US,de}``): software documentation, about 33,000 pairs. Both languages are
  generated from the same sources, so each page's headings and paragraphs carry the same ``id`` (``hd_id...``,
  ``par_id...``) in both; the text of each such element (hidden platform variants left out) pairs with its
  namesake in the German page.

Then, as for the demo corpus (:mod:`scripts.demo_corpus`): whitespace normalised; a side without a
letter or longer than 50 words, and a translation equal to its source, skipped; deduplicated by the English
side (the first met wins; files and lines are read in sorted order); split by the SHA-1 of the English text
(about 2% test and 2% valid, 5% each for ``ding``). The packages need not be installed: ``apt-get download``
and ``dpkg-deb -x`` give the files (``examples/translation/corpora.sh`` does that). Each package carries its own
licence (GPL for Ding, MPL for LibreOffice's help; ``/usr/share/doc/<package>/copyright``); this tool reads
them where they are and the project redistributes none of them.
"""

import argparse
import html.parser
import os
import re
from typing import Dict, Iterator, List, Optional, Tuple

from scripts.demo_corpus import (
    MAX_WORDS,
    TEST_BUCKETS,
    CorpusError,
    add_pair_options,
    html_pages,
    normalise,
    pairs_line,
    usable_pair,
    write_splits,
)

DING_FILE = "/usr/share/trans/de-en"
HELP_DIR = "/usr/share/libreoffice/help"
HELD_OUT = {"ding": 500, "libreoffice-help": TEST_BUCKETS}  # of demo_corpus.HASH_BUCKETS, for test and for valid

_ANNOTATION = re.compile(r"\s*(\{[^}]*\}|\[[^\]]*\])")
_SENTENCE = re.compile(r"^[A-ZÄÖÜ0-9\"'„‚“‘].*[.!?][\"'“”’]?$")
_HELP_ID = re.compile(r"^(par|hd)_id")
_VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def ding_pairs(lines: Iterator[str], max_words: int = MAX_WORDS) -> Iterator[Tuple[str, str]]:
    """The (English, German) example-sentence pairs of Ding dictionary lines, after the rules of the docstring."""
    for line in lines:
        if line.startswith("#"):
            continue
        sides = line.rstrip("\n").split(" :: ")
        if len(sides) != 2:
            continue
        german, english = (side.split(" | ") for side in sides)
        if len(german) != len(english):
            continue
        for de, en in zip(german, english):
            de, en = normalise(_ANNOTATION.sub("", de)), normalise(_ANNOTATION.sub("", en))
            if not (_SENTENCE.match(de) and _SENTENCE.match(en)) or ";" in de + en or len(en.split(" ")) < 3:
                continue
            if usable_pair(en, de, max_words):
                yield en, de


class _HelpPage(html.parser.HTMLParser):
    """The text of every element of an HTML help page whose id starts with ``par_id`` or ``hd_id``."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.texts: Dict[str, str] = {}
        self._open: List[Tuple[str, bool, Optional[str]]] = []  # (tag, hidden, the id it starts, if any)
        self._current: Optional[str] = None
        self._hidden = 0
        self._text: List[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in _VOID_TAGS:
            return
        attrs = dict(attrs)
        hidden = "hidden" in attrs
        starts = attrs.get("id") if self._current is None and _HELP_ID.match(attrs.get("id") or "") else None
        self._open.append((tag, hidden, starts))
        self._hidden += hidden
        if starts:
            self._current, self._text = starts, []

    def handle_endtag(self, tag):
        if tag in _VOID_TAGS:
            return
        while self._open:  # an unclosed element (a <p> closed by its parent) ends with its parent
            name, hidden, started = self._open.pop()
            self._hidden -= hidden
            if started:
                self.texts.setdefault(started, normalise("".join(self._text)))
                self._current = None
            if name == tag:
                break

    def handle_data(self, data):
        if self._current is not None and not self._hidden:
            self._text.append(data)


def help_texts(path: str) -> Dict[str, str]:
    """``id -> text`` of one LibreOffice help page."""
    page = _HelpPage()
    with open(path, encoding="utf-8") as f:
        page.feed(f.read())
    page.close()
    return page.texts


def help_pairs(help_dir: str, max_words: int = MAX_WORDS) -> Iterator[Tuple[str, str]]:
    """The (English, German) pairs of the pages present in both ``help_dir/en-US`` and ``help_dir/de``."""
    english_root, german_root = os.path.join(help_dir, "en-US"), os.path.join(help_dir, "de")
    for root in (english_root, german_root):
        if not os.path.isdir(root):
            raise CorpusError(
                f"{root} does not exist: --help-dir must hold LibreOffice's en-US and de help "
                f"(the packages libreoffice-help-en-us and libreoffice-help-de)"
            )
    for english_page in html_pages(english_root):
        german_page = os.path.join(german_root, os.path.relpath(english_page, english_root))
        if not os.path.isfile(german_page):
            continue
        german = help_texts(german_page)
        for key, en in help_texts(english_page).items():
            de = german.get(key)
            if de is not None and usable_pair(en, de, max_words):
                yield en, de


def collect(pairs: Iterator[Tuple[str, str]]) -> Dict[str, str]:
    """English -> German, the first translation met winning."""
    out: Dict[str, str] = {}
    for en, de in pairs:
        out.setdefault(en, de)
    return out


def build_corpus(
    source: str, outdir: str, path: Optional[str] = None, min_pairs: int = 10000, max_words: int = MAX_WORDS
) -> Dict[str, int]:
    """Write ``outdir/{train,valid,test}.{en,de}`` from ``source`` (``ding`` or ``libreoffice-help``) read at
    ``path`` (default: where its package installs it); returns the number of pairs of each split."""
    if source == "ding":
        path = path or DING_FILE
        if not os.path.isfile(path):
            raise CorpusError(
                f"{path} does not exist: --dictionary must be the Ding dictionary file "
                f"(the package trans-de-en installs it as {DING_FILE})"
            )
        with open(path, encoding="utf-8") as f:
            pairs = collect(ding_pairs(f, max_words))
    elif source == "libreoffice-help":
        path = path or HELP_DIR
        pairs = collect(help_pairs(path, max_words))
    else:
        raise CorpusError(f"unknown source {source!r}; choose ding or libreoffice-help")
    if len(pairs) < min_pairs:
        raise CorpusError(
            f"only {len(pairs)} usable English-German pairs in {path}, fewer than the {min_pairs} "
            f"required (--min-pairs); is it the whole {source} text?"
        )
    return write_splits(outdir, pairs, HELD_OUT[source])


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.package_corpus",
        description="Build an English-German corpus from the Ding dictionary's example sentences or from "
        "LibreOffice's help.",
    )
    parser.add_argument("source", choices=("ding", "libreoffice-help"))
    parser.add_argument("outdir", help="where to write {train,valid,test}.{en,de}")
    parser.add_argument("--dictionary", help=f"ding: the dictionary file (default: {DING_FILE})")
    parser.add_argument("--help-dir", help=f"libreoffice-help: the folder holding en-US/ and de/ (default: {HELP_DIR})")
    add_pair_options(parser)
    args = parser.parse_args(argv)
    path = args.dictionary if args.source == "ding" else args.help_dir
    try:
        counts = build_corpus(args.source, args.outdir, path, args.min_pairs, args.max_words)
    except CorpusError as e:
        raise SystemExit(f"error: {e}")
    print(pairs_line(counts, f"{args.source} pairs", args.outdir))


if __name__ == "__main__":
    main()
