"""Stand-in WMT14 English-German archives for testing recipes/wmt14-en-de offline.

The six archives have the real names and layout of the statmt.org originals (the members ``prepare.sh`` reads,
next to members of other language pairs that it must leave alone), with a few hundred made-up sentence pairs:

- ``training-parallel-europarl-v7.tgz``: ``training/europarl-v7.de-en.{en,de}`` (and ``fr-en``);
- ``training-parallel-commoncrawl.tgz``: ``commoncrawl.de-en.{en,de}`` at the top level (and ``fr-en``, and the
  ``.annotation`` file), with some pairs the cleaning must drop: an empty side, a side of more than 250 words, and
  lengths that differ by more than a factor of 1.5;
- ``training-parallel-nc-v9.tgz``: ``training/news-commentary-v9.de-en.{en,de}`` (and ``cs-en``);
- ``dev.tgz``: ``dev/newstest2013.{en,de}`` as plain text (and newstest2012);
- ``test-full.tgz``: ``test-full/newstest2014-deen-{src,ref}.{en,de}.sgm`` (WMT's "fake SGML");
- ``test.tgz`` (WMT17): ``test/newstest2017-ende-src.en.sgm``, ``test/newstest2017-ende-ref.de.sgm`` (and the
  ``deen`` direction).

Run ``python tests/helpers/wmt14_mirror.py DIR`` to write them into DIR, then, with DIR's absolute path::

    WMT14_MIRROR=file://DIR WMT14_TEST_MD5= WMT14_TEST17_MD5= bash recipes/wmt14-en-de/prepare.sh -v 500 /tmp/wmt14
"""

import io
import random
import sys
import tarfile
from pathlib import Path

# English -> German, a word (or a phrase) each; the sentences mix them with numbers and punctuation
LEXICON = [
    ("the", "die"),
    ("house", "Haus"),
    ("council", "Rat"),
    ("members", "Mitglieder"),
    ("government", "Regierung"),
    ("said", "sagte"),
    ("today", "heute"),
    ("new", "neue"),
    ("road", "Straße"),
    ("safety", "Sicherheit"),
    ("for", "für"),
    ("pedestrians", "Fußgänger"),
    ("city", "Stadt"),
    ("people", "Menschen"),
    ("and", "und"),
    ("with", "mit"),
    ("year", "Jahr"),
    ("percent", "Prozent"),
    ("market", "Markt"),
    ("prices", "Preise"),
    ("we", "wir"),
    ("must", "müssen"),
    ("not", "nicht"),
    ("forget", "vergessen"),
    ("it's", "es ist"),
    ("children", "Kinder"),
    ("school", "Schule"),
    ("well-known", "bekannte"),
    ("report", "Bericht"),
    ("state-of-the-art", "hochmoderne"),
    ("energy", "Energie"),
    ("policy", "Politik"),
    ("Europe", "Europa"),
    ("Parliament", "Parlament"),
    ("Commission", "EU-Kommission"),
    ("agreement", "Abkommen"),
    ("water", "Wasser"),
    ("world", "Welt"),
    ("economy", "Wirtschaft"),
    ("growth", "Wachstum"),
    ("bank", "Bank"),
    ("workers", "Arbeiter"),
    ("health", "Gesundheit"),
    ("care", "Pflege"),
    ("music", "Musik"),
    ("film", "Film"),
    ("week", "Woche"),
    ("Mr", "Herr"),
    ("President", "Präsident"),
    ("questions", "Fragen"),
    ("answers", "Antworten"),
]
PUNCTUATION = [",", ".", ":", ";", "?", "!"]
SPLIT_PAIRS = {
    "europarl": 300,
    "commoncrawl": 200,
    "news_commentary": 100,
    "newstest2013": 40,
    "newstest2012": 10,
    "newstest2014": 30,
    "newstest2017": 30,
}


def sentence_pairs(count: int, seed: int):
    """``count`` (English, German) pairs: words of the lexicon, numbers, quotes, '&', brackets and punctuation."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        picks = [rng.choice(LEXICON) for _ in range(rng.randint(3, 14))]
        en, de = [word for word, _ in picks], [word for _, word in picks]
        extra = rng.random()
        if extra < 0.15:
            number = f"{rng.randint(1, 99)} {rng.randint(100, 999)}"  # "12 500": a number Moses normalises
            en.insert(1, number)
            de.insert(1, number)
        elif extra < 0.3:
            en, de = ['"'] + en + ['"'], ["„"] + de + ["“"]
        elif extra < 0.4:
            en.insert(2, "&")
            de.insert(2, "&")
        elif extra < 0.5 and len(en) > 4:
            en, de = en[:2] + ["(" + en[2]] + [en[3] + ")"] + en[4:], de[:2] + ["(" + de[2]] + [de[3] + ")"] + de[4:]
        mark = rng.choice(PUNCTUATION)
        en_text = " ".join(en)
        en_text = en_text[0].upper() + en_text[1:] + mark
        de_text = " ".join(de)
        de_text = de_text[0].upper() + de_text[1:] + mark
        pairs.append((en_text, de_text))
    return pairs


def noisy_pairs(seed: int):
    """Pairs that clean-corpus-n's rule drops: an empty side, more than 250 words, lengths beyond a ratio of 1.5."""
    rng = random.Random(seed)
    long_side = " ".join(rng.choice(LEXICON)[0] for _ in range(260))
    return [
        ("Hello world .", ""),
        (long_side, long_side),
        ("one two three four five six seven", "eins zwei"),
        ("", "Leere Zeile"),
    ]


def _text(lines):
    return "".join(line + "\n" for line in lines).encode()


def _sgm(kind: str, setid: str, lang: str, sentences, docs: int = 3) -> bytes:
    """WMT's fake SGML: documents of <seg> lines (some with extra spaces around the text)."""
    head = (
        f'<srcset setid="{setid}" srclang="any">'
        if kind == "src"
        else f'<refset setid="{setid}" srclang="any" trglang="{lang}">'
    )
    lines = [head]
    per_doc = -(-len(sentences) // docs)
    for doc in range(docs):
        lines.append(
            f'<doc sysid="{kind if kind == "src" else "ref"}" docid="{doc + 1}-stand-in" genre="news" origlang="en">'
        )
        lines.append("<p>")
        for number, text in enumerate(sentences[doc * per_doc : (doc + 1) * per_doc], start=doc * per_doc + 1):
            padded = f"  {text} " if number % 7 == 0 else text
            lines.append(f'<seg id="{number}">{padded}</seg>')
        lines.append("</p>")
        lines.append("</doc>")
    lines.append("</srcset>" if kind == "src" else "</refset>")
    return _text(lines)


def _write_tgz(path: Path, members: dict) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        folders = sorted({str(Path(name).parent) for name in members if str(Path(name).parent) != "."})
        for folder in folders:
            info = tarfile.TarInfo(folder)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            archive.addfile(info)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return path


def write_wmt14(directory: Path, seed: int = 0) -> dict:
    """Write the six stand-in archives into ``directory``; return {name: path}, named as prepare.sh names them."""
    directory.mkdir(parents=True, exist_ok=True)
    pairs = {name: sentence_pairs(count, seed + index) for index, (name, count) in enumerate(SPLIT_PAIRS.items())}
    crawl = pairs["commoncrawl"][:100] + noisy_pairs(seed) + pairs["commoncrawl"][100:]
    decoy = _text(["decoy line"] * 5)

    def sides(name, rows=None):
        rows = pairs[name] if rows is None else rows
        return _text(en for en, _ in rows), _text(de for _, de in rows)

    def bitext(prefix, name, decoy_pair, rows=None):
        """PREFIX.de-en.{en,de}: ``name``'s pairs (or ``rows``); and PREFIX.DECOY_PAIR's two files, decoys."""
        en, de = sides(name, rows)
        files = {f"{prefix}.de-en.en": en, f"{prefix}.de-en.de": de}
        return files | {f"{prefix}.{decoy_pair}.{lang}": decoy for lang in decoy_pair.split("-")}

    archives = {
        "europarl": _write_tgz(
            directory / "training-parallel-europarl-v7.tgz", bitext("training/europarl-v7", "europarl", "fr-en")
        ),
        "commoncrawl": _write_tgz(
            directory / "training-parallel-commoncrawl.tgz",
            {
                "commoncrawl.de-en.annotation": _text(["http://example.org/stand-in"] * len(crawl)),
                **bitext("commoncrawl", "commoncrawl", "fr-en", crawl),
            },
        ),
        "news_commentary": _write_tgz(
            directory / "training-parallel-nc-v9.tgz",
            bitext("training/news-commentary-v9", "news_commentary", "cs-en"),
        ),
    }
    en, de = sides("newstest2013")
    en12, de12 = sides("newstest2012")
    archives["dev"] = _write_tgz(
        directory / "dev.tgz",
        {
            "dev/newstest2012.en": en12,
            "dev/newstest2012.de": de12,
            "dev/newstest2013.en": en,
            "dev/newstest2013.de": de,
            "dev/newstest2013-src.en.sgm": _sgm("src", "newstest2013", "en", [e for e, _ in pairs["newstest2013"]]),
        },
    )

    def sgm_files(folder, test, *members):
        """``folder``'s SGML files of ``test``: each member PAIR-KIND.LANG (e.g. deen-src.en) holds that side."""
        side = dict(zip(("en", "de"), map(list, zip(*pairs[test]))))
        files = {}
        for member in members:
            kind, lang = member.split("-")[1].split(".")
            files[f"{folder}/{test}-{member}.sgm"] = _sgm(kind, test, lang, side[lang])
        return files

    test14 = sgm_files("test-full", "newstest2014", "deen-src.en", "deen-ref.de", "deen-src.de", "deen-ref.en")
    test14["test-full/newstest2014-fren-src.en.sgm"] = _sgm("src", "newstest2014", "en", ["decoy"])
    archives["test"] = _write_tgz(directory / "test-full.tgz", test14)
    test17 = sgm_files("test", "newstest2017", "deen-src.de", "deen-ref.en", "ende-src.en", "ende-ref.de")
    archives["test17"] = _write_tgz(directory / "test.tgz", test17)
    return archives


def expected_text(seed: int = 0) -> dict:
    """What prepare.sh's raw/ folder must hold for the archives of ``write_wmt14(..., seed)``: {file name: lines}."""
    pairs = {name: sentence_pairs(count, seed + index) for index, (name, count) in enumerate(SPLIT_PAIRS.items())}
    crawl = pairs["commoncrawl"][:100] + noisy_pairs(seed) + pairs["commoncrawl"][100:]
    train = pairs["europarl"] + crawl + pairs["news_commentary"]
    files = {}
    for split, rows in (
        ("train", train),
        ("valid", pairs["newstest2013"]),
        ("newstest2014", pairs["newstest2014"]),
        ("newstest2017", pairs["newstest2017"]),
    ):
        files[f"{split}.en"] = [en for en, _ in rows]
        files[f"{split}.de"] = [de for _, de in rows]
    return files


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/helpers/wmt14_mirror.py OUTPUT_DIR")
    for name, archive in write_wmt14(Path(sys.argv[1])).items():
        print(f"{name}: {archive}")
