"""The language-modelling corpus from Debian's HTML manuals: what a paragraph is, tokens, splits and errors."""

import pytest

from scripts.demo_corpus import CorpusError
from scripts.doc_corpus import SOURCES, build_corpus, main, page_paragraphs, split_of, tokenise


def test_tokens_keep_names_numbers_and_contractions_and_split_punctuation():
    assert tokenise("Call os.path.join() in 3.11, don't use the read-only “x”.") == [
        "Call",
        "os.path.join",
        "(",
        ")",
        "in",
        "3.11",
        ",",
        "don't",
        "use",
        "the",
        "read-only",
        "“",
        "x",
        "”",
        ".",
    ]


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_paragraphs_are_p_and_div_para_outside_code(tmp_path):
    page = tmp_path / "a.html"
    write(
        page,
        """<html><body><h1>Title ¶</h1>
<p>The <code>open()</code> function &amp; its   arguments.</p>
<pre>x = open("f")</pre><script>var p = "<p>no</p>";</script>
<div class="para">Outer <p>inner</p> end.</div>
<div class="note">Not a paragraph.</div>
<p>Unclosed one<p>and the next
</body></html>""",
    )
    assert page_paragraphs(str(page)) == [
        "The open() function & its arguments.",
        "Outer inner end.",
        "Unclosed one",
        "and the next",
    ]


@pytest.mark.parametrize("html", ["<p>last words", '<div class="para"><div>last words', "<div><p>last <b>words"])
def test_a_paragraph_left_open_at_the_end_of_a_page_is_kept(tmp_path, html):
    page = tmp_path / "a.html"
    write(page, html)
    assert page_paragraphs(str(page)) == ["last words"]


def manuals(root, pages):
    """A fake ROOT: every source's folder, page i of the first source holding the paragraphs pages[i]."""
    for name, (_, folder) in SOURCES.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
    first = root / next(iter(SOURCES.values()))[1]
    for i, paragraphs in enumerate(pages):
        write(first / f"p{i:03d}.html", "".join(f"<p>{p}</p>" for p in paragraphs))


def test_corpus_splits_pages_deduplicates_and_drops_short_lines(tmp_path):
    words = [f"w{i}" for i in range(40)]
    pages = [
        [" ".join(words[j % 40] for j in range(i, i + 6)), "Copyright the authors, 2023.", "Too short."]
        for i in range(120)
    ]
    manuals(tmp_path / "root", pages)
    counts = build_corpus(str(tmp_path / "root"), str(tmp_path / "out"), min_train_tokens=1, min_vocabulary=1)
    lines = {s: (tmp_path / "out" / f"{s}.txt").read_text(encoding="utf-8").splitlines() for s in counts}
    assert {s: (len(lines[s]), sum(len(l.split()) for l in lines[s])) for s in lines} == counts
    every = [line for split in lines.values() for line in split]
    assert every.count("Copyright the authors , 2023 .") == 1  # boilerplate kept once (6 tokens)
    assert "Too short ." not in every
    first = next(iter(SOURCES))
    for i, page in enumerate(pages[:40]):  # pages 40-119 repeat pages 0-39: the first met wins
        line = " ".join(tokenise(page[0]))
        assert every.count(line) == 1 and line in lines[split_of(f"{first}/p{i:03d}.html")]
    assert len(every) == 41


def test_split_of_is_a_function_of_the_page_name_alone():
    names = [f"python/library/m{i}.html" for i in range(2000)]
    splits = [split_of(n) for n in names]
    assert splits == [split_of(n) for n in names]
    assert 0.03 < splits.count("test") / len(names) < 0.07 and 0.03 < splits.count("valid") / len(names) < 0.07


def test_a_missing_manual_names_the_package(tmp_path):
    with pytest.raises(CorpusError, match="python3.11-doc"):
        build_corpus(str(tmp_path), str(tmp_path / "out"))


def test_too_small_a_corpus_is_refused_and_nothing_is_written(tmp_path, capsys):
    manuals(tmp_path / "root", [["one two three four five six"]])
    with pytest.raises(SystemExit, match="--min-train-tokens"):
        main([str(tmp_path / "root"), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
