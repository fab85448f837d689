"""Build an English word-level language-modelling corpus, offline, from the HTML manuals in Debian packages.

    python -m scripts.doc_corpus ROOT OUTDIR [--min-train-tokens N] [--min-vocabulary N]

``ROOT`` is a folder the packages were unpacked into (``dpkg-deb -x``; ``examples/language_model/corpus.sh`` does
that), so that ``ROOT/usr/share/doc`` holds the manuals of :data:`SOURCES`: Python's (``python3.11-doc``),
PostgreSQL's (``postgresql-doc-15``), Git's (``git-doc``) and the Debian Administrator's Handbook in English
(``debian-handbook``): technical English prose with a long tail of names, about 3M words.

* A paragraph is the text of a ``<p>`` element or of a ``<div class="para">`` (the handbook's paragraphs), outside
  ``<pre>``, ``<script>`` and ``<style>``; a paragraph inside another is part of the outer one.
* Each becomes one line: whitespace normalised, then split into tokens, a word being a run of letters and digits
  that may hold ``.``, ``'``, ``’`` or ``-`` between two such runs (``os.path.join``, ``3.11``, ``don't``,
  ``read-only``), and every other character a token of its own (as WikiText separates punctuation). Case kept.
* Lines of fewer than 5 tokens are skipped (captions, version stamps); the others are deduplicated, the first met
  winning (sources in :data:`SOURCES`' order, files in sorted order), which drops the manuals' boilerplate.
* Pages, not lines, are split, so that valid and test hold unseen pages: by the SHA-1 of ``source/page``, about
  5% of the pages to test and 5% to valid.

Writes ``OUTDIR/{train,valid,test}.txt`` (each through a temporary name), the input of the language-model
comparisons' ``-c``. Each package carries its own licence (``/usr/share/doc/<package>/copyright``: PSF, PostgreSQL,
GPL-2 and GPL-2+ or CC-BY-SA 3.0); this tool reads them where they are and the project redistributes none of them.
"""

import argparse
import collections
import hashlib
import html.parser
import os
import re
from typing import Dict, Iterator, List, Optional, Tuple

from scripts.demo_corpus import SPLITS, CorpusError, _write_atomic, html_pages

# name -> (Debian package, folder of its English HTML under ROOT)
SOURCES: Dict[str, Tuple[str, str]] = {
    "python": ("python3.11-doc", "usr/share/doc/python3.11/html"),
    "postgresql": ("postgresql-doc-15", "usr/share/doc/postgresql-doc-15/html"),
    "git": ("git-doc", "usr/share/doc/git-doc"),
    "debian-handbook": ("debian-handbook", "usr/share/doc/debian-handbook/html/en-US"),
}
MIN_TOKENS = 5
HASH_BUCKETS = 1000
HELD_OUT = 50  # buckets of HASH_BUCKETS for test, and as many for valid

_TOKEN = re.compile(r"\w+(?:[.'’-]\w+)*|[^\w\s]")
_SKIPPED = {"pre", "script", "style"}
_VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def tokenise(text: str) -> List[str]:
    """The tokens of ``text`` after the rules of the module docstring."""
    return _TOKEN.findall(text)


class _Page(html.parser.HTMLParser):
    """The paragraphs of an HTML page, in order, as text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paragraphs: List[str] = []
        self._open: List[Tuple[str, bool]] = []  # (tag, whether it starts a paragraph)
        self._depth = 0  # paragraphs open
        self._skipped = 0  # <pre>, <script>, <style> open
        self._text: List[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in _VOID_TAGS:
            return
        if tag == "p" and any(name == "p" for name, _ in self._open):  # as in HTML, a <p> ends an open <p>
            self.handle_endtag("p")
        starts = tag == "p" or (tag == "div" and "para" in (dict(attrs).get("class") or "").split())
        self._open.append((tag, starts))
        self._skipped += tag in _SKIPPED
        if starts:
            if self._depth == 0:
                self._text = []
            self._depth += 1

    def handle_endtag(self, tag):
        if tag in _VOID_TAGS or all(name != tag for name, _ in self._open):
            return
        while self._open:  # an unclosed element (a <p> closed by its parent) ends with its parent
            name, started = self._open.pop()
            self._skipped -= name in _SKIPPED
            if started:
                self._depth -= 1
                if self._depth == 0:
                    self.paragraphs.append(" ".join("".join(self._text).split()))
            if name == tag:
                break

    def handle_data(self, data):
        if self._depth and not self._skipped:
            self._text.append(data)

    def close(self):
        super().close()
        while self._open:  # elements left open close with the page
            self.handle_endtag(self._open[0][0])


def page_paragraphs(path: str) -> List[str]:
    """The paragraphs of one HTML page, in order."""
    page = _Page()
    with open(path, encoding="utf-8", errors="replace") as f:
        page.feed(f.read())
    page.close()
    return page.paragraphs


def source_pages(root: str) -> Iterator[Tuple[str, str]]:
    """``(source/page, path)`` of every HTML page of :data:`SOURCES` under ``root``, in order."""
    for name, (package, folder) in SOURCES.items():
        top = os.path.join(root, folder)
        if not os.path.isdir(top):
            raise CorpusError(
                f"{top} does not exist: ROOT must hold the unpacked package {package} "
                f"(apt-get download {package}; dpkg-deb -x {package}_*.deb ROOT)"
            )
        for path in html_pages(top):
            yield f"{name}/{os.path.relpath(path, top)}", path


def split_of(page: str) -> str:
    """``train``, ``valid`` or ``test`` for a page, from the SHA-1 of its name."""
    bucket = int.from_bytes(hashlib.sha1(page.encode("utf-8")).digest()[:8], "big") % HASH_BUCKETS
    return "test" if bucket < HELD_OUT else "valid" if bucket < 2 * HELD_OUT else "train"


def corpus_lines(pages: Iterator[Tuple[str, str]]) -> Dict[str, List[str]]:
    """Each split's lines: tokenised paragraphs of at least ``MIN_TOKENS`` tokens, deduplicated across splits."""
    seen, splits = set(), {name: [] for name in SPLITS}
    for page, path in pages:
        split = split_of(page)
        for paragraph in page_paragraphs(path):
            tokens = tokenise(paragraph)
            line = " ".join(tokens)
            if len(tokens) >= MIN_TOKENS and line not in seen:
                seen.add(line)
                splits[split].append(line)
    return splits


def build_corpus(
    root: str, outdir: str, min_train_tokens: int = 2_000_000, min_vocabulary: int = 20_000
) -> Dict[str, Tuple[int, int]]:
    """Write ``outdir/{train,valid,test}.txt`` from the manuals under ``root``; returns each split's (lines,
    tokens). Fails, writing nothing, below ``min_train_tokens`` training tokens or ``min_vocabulary`` words seen 3
    or more times in train."""
    splits = corpus_lines(source_pages(root))
    counts = collections.Counter(token for line in splits["train"] for token in line.split(" "))
    tokens = sum(counts.values())
    vocabulary = sum(1 for c in counts.values() if c >= 3)
    if tokens < min_train_tokens or vocabulary < min_vocabulary:
        raise CorpusError(
            f"{root}: {tokens} training tokens and {vocabulary} words seen 3 or more times, fewer than "
            f"--min-train-tokens {min_train_tokens} or --min-vocabulary {min_vocabulary}; are the "
            f"packages of {', '.join(p for p, _ in SOURCES.values())} unpacked there whole?"
        )
    os.makedirs(outdir, exist_ok=True)
    for name in SPLITS:
        _write_atomic(os.path.join(outdir, name + ".txt"), splits[name])
    return {name: (len(lines), sum(len(line.split(" ")) for line in lines)) for name, lines in splits.items()}


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.doc_corpus",
        description="Build an English language-modelling corpus from the HTML manuals of Debian packages.",
    )
    parser.add_argument("root", help="the folder the packages were unpacked into (holding usr/share/doc)")
    parser.add_argument("outdir", help="where to write {train,valid,test}.txt")
    parser.add_argument(
        "--min-train-tokens", type=int, default=2_000_000, help="fail when train has fewer tokens (default: 2,000,000)"
    )
    parser.add_argument(
        "--min-vocabulary",
        type=int,
        default=20_000,
        help="fail when fewer words occur 3 or more times in train (default: 20,000)",
    )
    args = parser.parse_args(argv)
    try:
        counts = build_corpus(args.root, args.outdir, args.min_train_tokens, args.min_vocabulary)
    except CorpusError as e:
        raise SystemExit(f"error: {e}")
    print(
        ", ".join(f"{name} {lines} lines {tokens} tokens" for name, (lines, tokens) in counts.items())
        + f" -> {args.outdir}/{{train,valid,test}}.txt"
    )


if __name__ == "__main__":
    main()
