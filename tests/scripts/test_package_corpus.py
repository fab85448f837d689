"""The corpora from Debian packages: Ding's example sentences and LibreOffice's help, their rules and errors."""

import pytest

from scripts.demo_corpus import CorpusError, split_of
from scripts.package_corpus import build_corpus, ding_pairs, help_pairs, help_texts, main

DING = [
    "# Version :: devel 2023-01-30\n",
    "Walzwerk {n} [techn.] | Walzwerke {pl} :: rolling mill | rolling mills\n",
    "durchschneiden {vi} | Die Autobahn durchschneidet das Land. | Das Schiff schneidet durch die Wellen. :: "
    "to knife through | The highway knifes through the country. | The ship knifes through the waves.\n",
    "Schund {m} | Schund [ugs.]! :: tripe | Tripe indeed [coll.]!\n",  # English side too short
    "sich freuen | Ich freue mich.; Ich bin froh. :: to be glad | I am glad.; I am happy.\n",  # alternatives
    "zählen | Er zählt bis drei. :: to count | He counts to three. | extra\n",  # sub-entries do not pair up
    "laufen | Er läuft schnell! :: to run | He runs very fast!\n",
]


def test_ding_keeps_the_example_sentences_that_pair_up():
    assert list(ding_pairs(DING)) == [
        ("The highway knifes through the country.", "Die Autobahn durchschneidet das Land."),
        ("The ship knifes through the waves.", "Das Schiff schneidet durch die Wellen."),
        ("He runs very fast!", "Er läuft schnell!"),
    ]


def test_ding_strips_annotations_before_judging_a_sentence():
    line = "gehen | Er geht nach Hause {v}. :: to go | He goes home [Br.]. | \n"
    assert list(ding_pairs([line])) == []  # the sub-entries do not pair up (3 against 2)
    line = "gehen | Er geht [ugs.] nach Hause. :: to go | He goes {coll.} home now.\n"
    assert list(ding_pairs([line])) == [("He goes home now.", "Er geht nach Hause.")]


PAGE = """<!DOCTYPE html><html><body><div id="DisplayArea">
<h1 id="hd_id1" dir="auto">{title}</h1>
<p id="par_id2" class="paragraph">{first}<span hidden="true" id="MAC1">{mac}</span><span id="sw">{rest}</span></p>
<p id="par_id3"><a name="x"></a>{same}<br></p>
<p id="other">{ignored}</p>
</div></body></html>
"""


def write_page(root, language, name, **texts):
    path = root / language / "text" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PAGE.format(**texts), encoding="utf-8")


def test_help_pairs_elements_by_id_and_leaves_hidden_variants_out(tmp_path):
    write_page(
        tmp_path,
        "en-US",
        "a.html",
        title="Load options",
        first="Choose ",
        mac="LibreOffice - Preferences",
        rest="Tools - Options.",
        same="OK",
        ignored="Menu",
    )
    write_page(
        tmp_path,
        "de",
        "a.html",
        title="Ladeoptionen",
        first="Wählen Sie ",
        mac="LibreOffice - Einstellungen",
        rest="Extras - Optionen.",
        same="OK",
        ignored="Menü",
    )
    write_page(
        tmp_path, "en-US", "only_english.html", title="Lonely", first="x", mac="", rest="y", same="z", ignored=""
    )
    assert help_texts(str(tmp_path / "de" / "text" / "a.html"))["par_id2"] == "Wählen Sie Extras - Optionen."
    # par_id3's translation equals its source, so it is skipped; the element without a par_/hd_id too
    assert list(help_pairs(str(tmp_path))) == [
        ("Load options", "Ladeoptionen"),
        ("Choose Tools - Options.", "Wählen Sie Extras - Optionen."),
    ]


def test_build_writes_hash_splits_and_ding_holds_out_more(tmp_path):
    lines = [f"zählen | Er zählt bis {i}. :: to count | He counts to {i} now.\n" for i in range(3000)]
    (tmp_path / "de-en").write_text("".join(lines), encoding="utf-8")
    counts = build_corpus("ding", str(tmp_path / "out"), str(tmp_path / "de-en"), min_pairs=100)
    assert sum(counts.values()) == 3000
    test = (tmp_path / "out" / "test.en").read_text().splitlines()
    assert test and all(split_of(s, 500) == "test" for s in test)
    assert 3000 * 0.02 < counts["test"] < 3000 * 0.09  # 5% held out, where the demo's split holds out 2%


def test_errors_name_the_file_or_folder_and_the_package(tmp_path, capsys):
    with pytest.raises(SystemExit, match=r"nowhere does not exist: --dictionary .* trans-de-en"):
        main(["ding", str(tmp_path / "out"), "--dictionary", str(tmp_path / "nowhere")])
    with pytest.raises(SystemExit, match=r"en-US does not exist: --help-dir .* libreoffice-help-en-us"):
        main(["libreoffice-help", str(tmp_path / "out"), "--help-dir", str(tmp_path)])
    (tmp_path / "de-en").write_text(DING[2], encoding="utf-8")
    with pytest.raises(CorpusError, match="only 2 usable English-German pairs"):
        build_corpus("ding", str(tmp_path / "out"), str(tmp_path / "de-en"))
    assert not (tmp_path / "out").exists()
