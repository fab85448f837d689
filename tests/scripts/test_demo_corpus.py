"""The demo corpus builder: .mo parsing, the pair rules, dedupe, the hash split and its errors."""

import os
import struct

import pytest

from scripts import demo_corpus
from scripts.demo_corpus import (
    CorpusError,
    build_corpus,
    catalog_pairs,
    collect_pairs,
    parse_mo,
    split_of,
)

REAL_LOCALE_DIR = "/usr/share/locale/de/LC_MESSAGES"


def mo_bytes(entries, byteorder="<"):
    """A compiled gettext catalog holding ``entries`` ((msgid, msgstr) str or bytes), sorted as msgfmt does."""
    encoded = sorted(
        (k.encode() if isinstance(k, str) else k, v.encode() if isinstance(v, str) else v) for k, v in entries
    )
    n = len(entries)
    originals, translations = 28, 28 + 8 * n
    offset = translations + 8 * n
    tables, blob = [b"", b""], b""
    for column in (0, 1):
        for entry in encoded:
            s = entry[column]
            tables[column] += struct.pack(byteorder + "2I", len(s), offset + len(blob))
            blob += s + b"\x00"
    header = struct.pack(byteorder + "7I", 0x950412DE, 0, n, originals, translations, 0, 0)
    return header + tables[0] + tables[1] + blob


def write_mo(path, entries, byteorder="<"):
    path.write_bytes(mo_bytes(entries, byteorder))
    return path


HEADER = ("", "Project-Id-Version: demo\nContent-Type: text/plain; charset=UTF-8\n")


def many_pairs(count, start=0):
    return [
        (f"Cannot open file number {i}", f"Datei Nummer {i} kann nicht geöffnet werden")
        for i in range(start, start + count)
    ]


@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_parse_mo_both_byte_orders(byteorder):
    entries = [HEADER, ("Open", "Öffnen"), ("Save", "Speichern")]
    parsed = parse_mo(mo_bytes(entries, byteorder))
    assert parsed == [(b"", HEADER[1].encode()), (b"Open", "Öffnen".encode()), (b"Save", b"Speichern")]


def test_parse_mo_rejects_garbage():
    with pytest.raises(ValueError, match="magic"):
        parse_mo(b"\x00" * 64)
    with pytest.raises(ValueError):
        parse_mo(b"\xde\x12\x04\x95")


def test_catalog_pairs_rules():
    entries = [
        HEADER,
        (b"menu\x04Open", "Öffnen".encode()),  # msgctxt stripped
        (b"%d file\x00%d files", "%d Datei\x00%d Dateien".encode()),  # plural: singular, first form
        ("Line one\n\tline  two ", "Zeile eins\nZeile   zwei"),  # whitespace normalised
        ("Untranslated", ""),  # empty translation
        ("OK", "OK"),  # translation equals source
        ("12 / 34", "12 : 34"),  # no letter
        ("Ready", "..."),  # no letter in the translation
        ("Bad bytes", b"Schl\xfcssel"),  # Latin-1, not UTF-8
        ("word " * 51, "Wort " * 10),  # over MAX_WORDS
        ("Short", "Wort " * 51),  # translation over MAX_WORDS
    ]
    pairs = list(catalog_pairs(parse_mo(mo_bytes(entries))))
    assert sorted(pairs) == sorted(
        [
            ("Open", "Öffnen"),
            ("%d file", "%d Datei"),
            ("Line one line two", "Zeile eins Zeile zwei"),
        ]
    )
    # 50 words is still fine
    assert list(catalog_pairs([(("w " * 50).encode(), b"Wort")])) == [(" ".join(["w"] * 50), "Wort")]


def test_dedupe_keeps_first_catalog_in_sorted_order(tmp_path):
    a = write_mo(tmp_path / "a.mo", [HEADER, ("Quit", "Beenden"), ("Copy", "Kopieren")])
    b = write_mo(tmp_path / "b.mo", [HEADER, ("Quit", "Verlassen"), ("Paste", "Einfügen")])
    expected = {"Quit": "Beenden", "Copy": "Kopieren", "Paste": "Einfügen"}
    assert collect_pairs([str(a), str(b)]) == expected
    assert collect_pairs([str(b), str(a)]) == expected


def test_invalid_catalog_is_skipped(tmp_path, capsys):
    write_mo(tmp_path / "a.mo", [HEADER, ("Quit", "Beenden")])
    (tmp_path / "broken.mo").write_bytes(b"not a catalog at all")
    assert collect_pairs(demo_corpus.catalog_files(str(tmp_path))) == {"Quit": "Beenden"}
    assert "broken.mo" in capsys.readouterr().err


def test_split_is_by_sha1_and_about_two_percent():
    import hashlib

    sources = [f"message {i}" for i in range(20000)]
    splits = [split_of(s) for s in sources]
    for s, name in zip(sources[:200], splits):
        bucket = int.from_bytes(hashlib.sha1(s.encode()).digest()[:8], "big") % 10000
        assert name == ("test" if bucket < 200 else "valid" if bucket < 400 else "train")
    for name in ("test", "valid"):
        assert 0.015 < splits.count(name) / len(splits) < 0.025
    assert [split_of(s) for s in sources] == splits


def _read_outputs(outdir):
    return {name: (outdir / name).read_bytes() for name in sorted(os.listdir(outdir))}


def test_build_corpus_deterministic_and_order_independent(tmp_path, monkeypatch):
    locale = tmp_path / "locale"
    locale.mkdir()
    write_mo(locale / "one.mo", [HEADER] + many_pairs(1500))
    write_mo(locale / "two.mo", [HEADER] + many_pairs(1500, start=1000), byteorder=">")  # 500 overlap
    (locale / "README").write_text("not a catalog")

    counts = build_corpus(str(tmp_path / "out1"), str(locale), min_pairs=100)
    assert sum(counts.values()) == 2500
    assert counts["test"] > 0 and counts["valid"] > 0
    first = _read_outputs(tmp_path / "out1")
    assert sorted(first) == sorted(f"{s}.{l}" for s in ("train", "valid", "test") for l in ("en", "de"))

    build_corpus(str(tmp_path / "out2"), str(locale), min_pairs=100)
    assert _read_outputs(tmp_path / "out2") == first

    real_listdir = os.listdir
    monkeypatch.setattr(demo_corpus.os, "listdir", lambda path: list(reversed(real_listdir(path))))
    build_corpus(str(tmp_path / "out3"), str(locale), min_pairs=100)
    assert _read_outputs(tmp_path / "out3") == first

    # every line is a pair, sides aligned, English disjoint across splits, no temporary files left behind
    english = {}
    for split in ("train", "valid", "test"):
        en = first[f"{split}.en"].decode().splitlines()
        de = first[f"{split}.de"].decode().splitlines()
        assert len(en) == len(de) == counts[split]
        for e, d in zip(en, de):
            assert e.split()[-1] == d.split()[2]  # the number matches
        english[split] = set(en)
    assert not (
        english["train"] & english["valid"] or english["train"] & english["test"] or english["valid"] & english["test"]
    )
    assert not [n for n in os.listdir(tmp_path / "out1") if n.endswith(".tmp")]


def test_missing_or_empty_locale_dir(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(CorpusError) as e:
        build_corpus(str(tmp_path / "out"), str(missing))
    assert str(missing) in str(e.value) and "--locale-dir" in str(e.value) and "does not exist" in str(e.value)

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    with pytest.raises(CorpusError) as e:
        build_corpus(str(tmp_path / "out"), str(empty))
    assert str(empty) in str(e.value) and "no .mo files" in str(e.value) and "German translations" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_too_few_pairs(tmp_path):
    write_mo(tmp_path / "a.mo", [HEADER] + many_pairs(30))
    with pytest.raises(CorpusError) as e:
        build_corpus(str(tmp_path / "out"), str(tmp_path), min_pairs=31)
    assert "only 30 " in str(e.value) and str(tmp_path) in str(e.value)
    assert build_corpus(str(tmp_path / "out"), str(tmp_path), min_pairs=30)["train"] > 0


def test_main_exits_with_the_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        demo_corpus.main([str(tmp_path / "out"), "--locale-dir", str(tmp_path / "nowhere")])
    assert isinstance(e.value.code, str) and str(tmp_path / "nowhere") in e.value.code

    write_mo(tmp_path / "a.mo", [HEADER] + many_pairs(40))
    with pytest.raises(SystemExit) as e:
        demo_corpus.main([str(tmp_path / "out"), "--locale-dir", str(tmp_path)])
    assert "only 40 " in e.value.code and "10000" in e.value.code

    demo_corpus.main([str(tmp_path / "out"), "--locale-dir", str(tmp_path), "--min-pairs", "10"])
    assert "40 pairs" in capsys.readouterr().out


@pytest.mark.skipif(not os.path.isdir(REAL_LOCALE_DIR), reason=f"{REAL_LOCALE_DIR} is absent")
def test_real_catalogs(tmp_path):
    counts = build_corpus(str(tmp_path), REAL_LOCALE_DIR)
    assert sum(counts.values()) >= 10000
    english = {
        split: set((tmp_path / f"{split}.en").read_text(encoding="utf-8").splitlines())
        for split in ("train", "valid", "test")
    }
    assert all(len(english[s]) == counts[s] for s in english)
    assert not (
        english["train"] & english["valid"] or english["train"] & english["test"] or english["valid"] & english["test"]
    )
    for split in english:
        assert sum(1 for _ in open(tmp_path / f"{split}.de", encoding="utf-8")) == counts[split]
