"""The WMT text tools: moses_text, clean_parallel and sgm_text, checked against sacremoses, sacreBLEU, perl and
plain re-computations."""

import io
import shutil
import subprocess
import sys

import pytest
import regex
from conftest import run_module

from define_fairseq.tools import clean_parallel, moses_text, sgm_text

# ----------------------------------------------------------------------------------------------- moses_text

EN = [
    "It's a well-known fact.",
    'He said: "Yes, of course."',
    "Tom & Jerry paid 1\xa0000 dollars.",
    "Isn't it 5 o'clock, Mr. Smith?",
    "a bell\x07 rang",
    "",
    "a carriage\rreturn inside",
    "  spaces   around  ",
    "<b>bold</b> [x] | y",
    "Zürich's “smart” quotes – and dashes — too…",
    "tab\tand\x0bvertical tab",
    "a line\u2028separator",
    "file\x1cseparator",
    "next\x85line",
]
DE = [
    "Der „Bundestag“ tagt heute.",
    "Das kostet 1\xa0000 Euro.",
    "Das ist eine E-Mail-Adresse, oder?",
    "Gestern war's schön.",
    "Er sagte: »Nein«, und ging.",
    "",
    "Straße\rund Weg",
    "Es kostet 3,5 Mio. €.",
]


def sacremoses_tokenize(lines, lang):
    """tokenizer.perl -a after normalize-punctuation | remove-non-printing-char, straight from sacremoses."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer = MosesPunctNormalizer(lang=lang, pre_replace_unicode_punct=False)
    tokenizer = MosesTokenizer(lang=lang)
    # remove-non-printing-char.perl: s/\p{C}/ /g
    return [
        tokenizer.tokenize(
            regex.sub(r"\p{C}", " ", normalizer.normalize(line)),
            aggressive_dash_splits=True,
            escape=True,
            return_str=True,
        )
        for line in lines
    ]


def output_lines(path):
    """The lines of a tool's output: each must end with "\\n"; split at "\\n" only."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n")
    return data.decode("utf-8").split("\n")[:-1]


def test_tokenize_equals_sacremoses_for_any_number_of_workers(tmp_path):
    # 4501 numbered lines (3 chunks of the pool), the empty ones kept empty; the last has no "\n"
    lines = [f"{i} {EN[i % len(EN)]}" if EN[i % len(EN)] else "" for i in range(4501)]
    source = tmp_path / "in.en"
    source.write_bytes("\n".join(lines).encode("utf-8"))
    assert source.read_bytes().count(b"\n") + 1 == len(lines)
    expected = sacremoses_tokenize(lines, "en")
    assert expected[5] == "" and expected[1] == "1 He said : &quot; Yes , of course . &quot;"
    run_module("define_fairseq.tools.moses_text", "tokenize", "-l", "en", "-j", "2", source, tmp_path / "j2.tok")
    moses_text.main(["tokenize", "-l", "en", str(source), str(tmp_path / "j1.tok")])
    assert output_lines(tmp_path / "j2.tok") == expected
    assert (tmp_path / "j1.tok").read_bytes() == (tmp_path / "j2.tok").read_bytes()
    assert not list(tmp_path.glob("*.tmp"))
    # many small chunks in a pool, German
    german = [f"{i} {DE[i % len(DE)]}" for i in range(60)] + DE
    assert list(moses_text.process_lines(german, "tokenize", "de", workers=2, chunk_lines=7)) == sacremoses_tokenize(
        german, "de"
    )


@pytest.mark.parametrize(
    "lang,line,expected",
    [
        ("en", "It's a well-known fact.", "It &apos;s a well @-@ known fact ."),
        ("de", "Gestern war's schön.", "Gestern war &apos; s schön ."),
        ("en", "Tom & Jerry paid 1\xa0000 dollars.", "Tom &amp; Jerry paid 1.000 dollars ."),
        ("de", "Das kostet 1\xa0000 Euro.", "Das kostet 1,000 Euro ."),
        ("de", "Der „Bundestag“ tagt heute.", "Der &quot; Bundestag &quot; tagt heute ."),
        ("en", 'He said "yes", then left.', "He said &quot; yes , &quot; then left ."),  # English quote-comma order
        ("de", 'Er sagte "ja", dann ging er.', "Er sagte &quot; ja &quot; , dann ging er ."),
        ("en", "a bell\x07 rang\x1f", "a bell rang"),  # control characters removed
        ("en", "<b>x</b> [y] | z", "&lt; b &gt; x &lt; / b &gt; &#91; y &#93; &#124; z"),
        ("en", "   ", ""),
        ("en", "zero\u200bwidth\ufeff", "zero width"),  # format characters: spaces, as remove-non-printing-char.perl
    ],
)
def test_tokenize_exact(lang, line, expected):
    assert moses_text.make_processor("tokenize", lang)(line) == expected


def test_no_normalize_keeps_the_punctuation():
    tokenize = moses_text.make_processor("tokenize", "de", normalize=False)
    assert tokenize("Der „Bundestag“ hat 1\xa0000 Sitze.") == "Der „ Bundestag “ hat 1 000 Sitze ."


def test_lines_split_at_newline_only(tmp_path, monkeypatch):
    data = ("one\rtwo\n\nthree\x0bfour\x1cfive\x85six\u2028seven\x0cend\n\n  \nlast").encode("utf-8")
    lines = data.count(b"\n") + 1
    source = tmp_path / "in.txt"
    source.write_bytes(data)
    moses_text.main(["split-compounds", str(source), str(tmp_path / "split.txt")])
    assert (tmp_path / "split.txt").read_bytes() == data + b"\n"  # nothing to split: every line as it was
    for command in ("normalize", "tokenize", "detokenize"):
        moses_text.main([command, "-l", "en", str(source), str(tmp_path / command)])
        assert len(output_lines(tmp_path / command)) == lines == 6, command
    # normalize-punctuation.perl deletes "\r"; remove-non-printing-char.perl turns the other control characters
    # into spaces; U+2028 is a separator, not one of them
    assert output_lines(tmp_path / "normalize") == ["onetwo", "", "three four five six\u2028seven end", "", "", "last"]
    # stdin to stdout
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="utf-8"))
    moses_text.main(["split-compounds"])
    assert out.getvalue() == data + b"\n"


def test_detokenize_inverts_tokenize(monkeypatch):
    sentences = [
        "It's a well-known fact.",
        "The cat sat on the mat, didn't it?",
        "Tom & Jerry cost $5.",
        "Mr. Smith lives in the U.S. now.",
        "Prices rose 5% in 2014 (see [1]).",
        'She asked: "Why not?"',
        "A | B < C > D.",
        "Die Katze saß auf der Matte.",
        "Das ist eine E-Mail-Adresse, oder?",
        "Er hat 3,5 Millionen Euro bezahlt.",
    ]
    tokenize = moses_text.make_processor("tokenize", "en")
    tokenized = "".join(tokenize(s) + "\n" for s in sentences).encode("utf-8")
    assert b"&amp;" in tokenized and b"@-@" in tokenized
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(tokenized), encoding="utf-8"))
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="utf-8"))
    moses_text.main(["detokenize", "-l", "en", "-", "-"])
    assert out.getvalue().decode("utf-8").split("\n")[:-1] == sentences


SPLIT_CASES = [
    ("well-known", "well ##AT##-##AT## known"),
    ("a-b-c", "a ##AT##-##AT## b-c"),
    ("x @-@ y", "x @ ##AT##-##AT## @ y"),
    ("a--b", "a ##AT##-##AT## -b"),
    ("- a -", "- a -"),
    ("E-Mail-Adresse und Ost-West", "E ##AT##-##AT## Mail ##AT##-##AT## Adresse und Ost ##AT##-##AT## West"),
    ("1-2 3-4-5-6", "1 ##AT##-##AT## 2 3 ##AT##-##AT## 4-5 ##AT##-##AT## 6"),
    ("", ""),
]


def test_split_compounds(tmp_path):
    for line, expected in SPLIT_CASES:
        assert moses_text.split_compounds(line) == expected, line
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line, _ in SPLIT_CASES), encoding="utf-8")
    moses_text.main(["split-compounds", str(source), str(tmp_path / "out.txt")])
    assert output_lines(tmp_path / "out.txt") == [expected for _, expected in SPLIT_CASES]
    if shutil.which("perl"):  # the command of compound_split_bleu.sh itself
        perl = subprocess.run(
            ["perl", "-pe", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"],
            input=source.read_bytes(),
            capture_output=True,
            check=True,
        ).stdout
        assert perl == (tmp_path / "out.txt").read_bytes()


def test_moses_text_errors(tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_bytes(b"fine\nbad \xff byte\n")
    with pytest.raises(SystemExit, match=r"in\.txt line 2 is not UTF-8"):
        moses_text.main(["tokenize", "-l", "en", str(source), str(tmp_path / "out.txt")])
    assert list(tmp_path.iterdir()) == [source]  # neither OUTPUT nor OUTPUT.tmp
    missing = str(tmp_path / "missing.txt")
    for argv, flag in (
        (["tokenize", "-l", "english", str(source)], "-l/--lang"),
        (["normalize", "-l", "xx", str(source)], "-l/--lang"),
        (["tokenize", "-l", "en", "-j", "0", str(source)], "-j/--workers"),
        (["detokenize", "-l", "de", missing], "missing.txt"),
        (["tokenize", str(source)], "-l/--lang"),
        (["split-compounds", str(source), str(tmp_path / "no" / "out.txt")], "does not exist"),
    ):
        with pytest.raises(SystemExit) as error:
            moses_text.main(argv)
        assert error.value.code == 2 and flag in capsys.readouterr().err, argv


# ------------------------------------------------------------------------------------------- clean_parallel

PAIRS = [  # (source, target, kept) with --max-len 10 --ratio 1.5
    ("a b c", "x y z", True),
    ("  a   b\t c ", "x  y z ", True),  # whitespace collapsed
    ("", "x y", False),  # an empty side
    ("a b", "", False),
    ("a b", "x y z", True),  # ratio exactly 1.5
    ("a b c", "x y", True),
    ("a b", "x y z w", False),  # ratio 2
    ("a b c d e f g", "x y z w v u t s r q", True),  # 10 / 7 < 1.5, 10 tokens (the maximum)
    ("a b c d e f g h", "x y z w v u t s r q p", False),  # 11 tokens
    ("a b c d", "x y z w v u", True),  # 6 / 4 = 1.5
    ("a b c d", "x y z w v u t", False),  # 7 / 4 > 1.5
    ("a\rb", "x\x0by", True),  # "\r" and "\x0b" separate tokens, they do not end lines
    ("w", "x", True),
]


def write_pairs(tmp_path, pairs):
    src, tgt = tmp_path / "in.src", tmp_path / "in.tgt"
    src.write_bytes("".join(p[0] + "\n" for p in pairs).encode("utf-8"))
    tgt.write_bytes("".join(p[1] + "\n" for p in pairs).encode("utf-8"))
    return src, tgt


def test_clean_parallel(tmp_path, capsys):
    src, tgt = write_pairs(tmp_path, PAIRS)
    clean_parallel.main([str(src), str(tgt), str(tmp_path / "out.src"), str(tmp_path / "out.tgt"), "--max-len", "10"])
    kept = [(" ".join(s.split()), " ".join(t.split())) for s, t, keep in PAIRS if keep]
    assert output_lines(tmp_path / "out.src") == [s for s, _ in kept]
    assert output_lines(tmp_path / "out.tgt") == [t for _, t in kept]
    assert output_lines(tmp_path / "out.src")[:2] == ["a b c", "a b c"]
    assert output_lines(tmp_path / "out.tgt")[-2:] == ["x y", "x"]
    assert (
        capsys.readouterr().err.strip()
        == f"clean_parallel: kept {len(kept)} of {len(PAIRS)} sentence pairs (min-len 1, max-len 10, ratio 1.5)"
    )
    assert not list(tmp_path.glob("*.tmp"))
    # --min-len 0 keeps the pairs with an empty side (no ratio for them); --min-len 2 drops the one-token pair
    clean_parallel.main(
        [str(src), str(tgt), str(tmp_path / "a"), str(tmp_path / "b"), "--min-len", "0", "--max-len", "10"]
    )
    assert len(output_lines(tmp_path / "a")) == len(kept) + 2 and "" in output_lines(tmp_path / "b")
    clean_parallel.main(
        [str(src), str(tgt), str(tmp_path / "a"), str(tmp_path / "b"), "--min-len", "2", "--ratio", "2"]
    )
    assert output_lines(tmp_path / "b") == [
        " ".join(t.split())
        for s, t, _ in PAIRS
        if 2 <= len(s.split())
        and 2 <= len(t.split())
        and max(len(s.split()), len(t.split())) <= 2 * min(len(s.split()), len(t.split()))
    ]


def test_clean_parallel_errors(tmp_path, capsys):
    src, tgt = write_pairs(tmp_path, PAIRS)
    tgt.write_bytes(tgt.read_bytes() + b"one more")  # a last line without "\n" counts
    with pytest.raises(SystemExit) as error:
        clean_parallel.main([str(src), str(tgt), str(tmp_path / "out.src"), str(tmp_path / "out.tgt")])
    message = str(error.value.code)
    assert str(src) in message and str(tgt) in message and f"{len(PAIRS)} lines" in message
    assert f"has {len(PAIRS) + 1}" in message
    assert sorted(tmp_path.iterdir()) == sorted([src, tgt])  # nothing written, no .tmp left
    for flags, flag in (
        (["--ratio", "0.9"], "--ratio"),
        (["--ratio", "nan"], "--ratio"),
        (["--min-len", "-1"], "--min-len"),
        (["--min-len", "5", "--max-len", "4"], "--max-len"),
        (["--max-len", "x"], "--max-len"),
    ):
        with pytest.raises(SystemExit) as error:
            clean_parallel.main([str(src), str(src), str(tmp_path / "a"), str(tmp_path / "b"), *flags])
        assert error.value.code == 2 and flag in capsys.readouterr().err, flags
    with pytest.raises(SystemExit) as error:
        clean_parallel.main([str(src), str(tgt), str(tmp_path / "a"), str(tmp_path / "a")])
    assert error.value.code == 2 and "the same file" in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == sorted([src, tgt])


# ------------------------------------------------------------------------------------------------- sgm_text

SGM = """<refset setid="newstest2014" srclang="any" trglang="de">
<doc sysid="ref" docid="1012-bbc" genre="news" origlang="en">
<p>
<seg id="1">Gutach:   Noch mehr Sicherheit für Fußgänger </seg>
<seg id="2">Sie stehen\tunter &amp; Strom &quot;x&quot;</seg>
</p>
<seg id="3"></seg>
<seg id="4">Ende.</seg> nach dem Tag
 <seg id="5">eingerückt: keine seg-Zeile für sacreBLEU</seg>
</doc>
</refset>
"""


def test_sgm_text(tmp_path):
    from sacrebleu.dataset.fake_sgml import FakeSGMLDataset

    sgm = tmp_path / "newstest2014-deen-ref.de.sgm"
    sgm.write_text(SGM, encoding="utf-8")
    sgm_text.main([str(sgm), str(tmp_path / "ref.de")])
    assert output_lines(tmp_path / "ref.de") == [
        "Gutach: Noch mehr Sicherheit für Fußgänger",
        "Sie stehen unter &amp; Strom &quot;x&quot;",
        "",
        "Ende. nach dem Tag",
    ]
    # sacreBLEU's own reader (its _clean is a staticmethod, so an instance without __init__ is enough)
    FakeSGMLDataset.__new__(FakeSGMLDataset)._convert_format(str(sgm), str(tmp_path / "sacrebleu.de"))
    assert (tmp_path / "ref.de").read_bytes() == (tmp_path / "sacrebleu.de").read_bytes()
    assert not list(tmp_path.glob("*.tmp"))


def test_sgm_text_errors(tmp_path):
    plain = tmp_path / "plain.de"
    plain.write_text("Gutach: Noch mehr Sicherheit\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"plain\.de has no line starting with '<seg ': not a WMT \.sgm file\?"):
        sgm_text.main([str(plain), str(tmp_path / "out")])
    latin1 = tmp_path / "latin1.sgm"
    latin1.write_bytes('<seg id="1">Fu\xdfg\xe4nger</seg>\n'.encode("latin-1"))
    with pytest.raises(SystemExit, match=r"latin1\.sgm is not UTF-8"):
        sgm_text.main([str(latin1), str(tmp_path / "out")])
    with pytest.raises(SystemExit) as error:
        sgm_text.main([str(tmp_path / "missing.sgm")])
    assert error.value.code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latin1.sgm", "plain.de"]
