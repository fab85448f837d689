"""Stand-in corpus archives for testing the recipes offline, and a local HTTP server to serve them.

The archives have the real file names and layout of the originals, with a few hundred lines of made-up text:

- ``wikitext-103-v1.zip`` / ``wikitext-2-v1.zip``: ``wikitext-103/wiki.{train,valid,test}.tokens`` (WikiText
  style: `` = Heading = `` lines, blank lines, `` @-@ `` joins, ``<unk>``);
- ``simple-examples.tgz``: ``simple-examples/data/ptb.{train,valid,test}.txt`` (Mikolov's PTB style: lower case,
  ``<unk>``, ``N`` for numbers), next to a few of the other files of the real archive;
- ``1-billion-word-language-modeling-benchmark-r13output.tar.gz`` (Google Billion Word): the 99 training shards
  ``training-monolingual.tokenized.shuffled/news.en-000{01..99}-of-00100`` and the 50 held-out shards
  ``heldout-monolingual.tokenized.shuffled/news.en.heldout-000{00..49}-of-00050``, a few news-style sentences
  each (cased, tokenized, a long tail of rare words, and one long sentence in each of the first two held-out
  shards).

Run ``python tests/helpers/recipe_mirror.py DIR`` to write all of them into DIR, then e.g.
``WIKITEXT2_URL=file://$PWD/DIR/wikitext-2-v1.zip WIKITEXT2_MD5= recipes/wikitext-2/prepare.sh /tmp/wt2``.
"""

import contextlib
import functools
import http.server
import io
import random
import socket
import sys
import tarfile
import threading
import zipfile
from pathlib import Path

SPLIT_LINES = {"train": 400, "valid": 120, "test": 120}


def _vocabulary(size: int, seed: int):
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(2, 8))))
    return sorted(words)


def wikitext_lines(count: int, seed: int, vocab: int = 150):
    """WikiText-style lines: headings, blank lines and sentences over ``vocab`` Zipf-distributed words."""
    rng = random.Random(seed)
    words = _vocabulary(vocab, 0) + ["<unk>", ",", ".", "@-@", "the", "of"]
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    lines = []
    while len(lines) < count:
        if rng.random() < 0.1:
            title = " ".join(rng.choices(words[:40], k=rng.randint(1, 3))).capitalize()
            lines += [" \n", f" = {title} = \n", " \n"]
        else:
            sentence = rng.choices(words, weights, k=rng.randint(5, 25))
            lines.append(" " + " ".join(sentence) + " . \n")
    return "".join(lines[:count])


def ptb_lines(count: int, seed: int, vocab: int = 150):
    """Penn Treebank style lines (Mikolov's version): lower case, ``<unk>`` and ``N``, one sentence a line."""
    rng = random.Random(seed)
    words = _vocabulary(vocab, 1) + ["<unk>", "N", "the", "of", "'s"]
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    return "".join(" " + " ".join(rng.choices(words, weights, k=rng.randint(4, 20))) + " \n" for _ in range(count))


def _zip_member(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(2016, 9, 26, 0, 0, 0))
    info.external_attr = mode << 16  # Unix permissions, as a zip made on Unix carries them
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def write_wikitext_zip(path: Path, folder: str = "wikitext-103", seed: int = 0) -> Path:
    """A zip with ``folder/wiki.{train,valid,test}.tokens``, as in wikitext-103-v1.zip / wikitext-2-v1.zip."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(_zip_member(f"{folder}/", 0o40755), "")
        for index, (split, count) in enumerate(SPLIT_LINES.items()):
            archive.writestr(
                _zip_member(f"{folder}/wiki.{split}.tokens", 0o100644), wikitext_lines(count, seed + index)
            )
    return path


def write_ptb_tgz(path: Path, seed: int = 0) -> Path:
    """A gzipped tar with ``simple-examples/data/ptb.{train,valid,test}.txt`` (plus some of the real archive's
    other files), as in Mikolov's simple-examples.tgz."""
    files = {
        f"simple-examples/data/ptb.{split}.txt": ptb_lines(count, seed + index)
        for index, (split, count) in enumerate(SPLIT_LINES.items())
    }
    files["simple-examples/data/ptb.char.train.txt"] = "a _ b c\n"
    files["simple-examples/data/README"] = "Penn Treebank, pre-processed (stand-in)\n"
    files["simple-examples/1-train/README"] = "stand-in\n"
    with tarfile.open(path, "w:gz") as archive:
        for directory in ("simple-examples", "simple-examples/data", "simple-examples/1-train"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            archive.addfile(info)
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return path


GBW_TOP = "1-billion-word-language-modeling-benchmark-r13output"
GBW_TRAIN_SHARDS = [f"training-monolingual.tokenized.shuffled/news.en-{i:05d}-of-00100" for i in range(1, 100)]
GBW_HELDOUT_SHARDS = [f"heldout-monolingual.tokenized.shuffled/news.en.heldout-{i:05d}-of-00050" for i in range(50)]
GBW_LONG_SENTENCE = 90  # words of the long sentence in held-out shards 0 and 1


def gbw_lines(count: int, seed: int, vocab: int = 400, long_sentence: int = 0):
    """News-style sentences as in the One Billion Word benchmark: cased, tokenized (`` , `` `` 's `` `` n't ``),
    one a line, over ``vocab`` Zipf-distributed words (a long tail of words seen once or twice), and
    ``long_sentence`` words in one sentence placed second when it is not 0."""
    rng = random.Random(seed)
    words = ["the", ",", "of", "said", "'s", '"', "n't", "$", "1.5", "2012"] + _vocabulary(vocab, 2)
    weights = [1.0 / (rank + 1) for rank in range(len(words))]

    def sentence(length):
        tokens = rng.choices(words, weights, k=length)
        return " ".join([tokens[0].capitalize()] + tokens[1:] + ["."]) + "\n"

    lines = [sentence(rng.randint(4, 30)) for _ in range(count)]
    if long_sentence:
        lines.insert(1, sentence(long_sentence - 1))
    return "".join(lines)


def write_gbw_tgz(
    path: Path, seed: int = 0, train_lines: int = 4, heldout_lines: int = 40, missing: tuple = ()
) -> Path:
    """A gzipped tar laid out as 1-billion-word-language-modeling-benchmark-r13output.tar.gz: ``train_lines``
    sentences in each training shard, ``heldout_lines`` (and a long one) in held-out shards 0 and 1, 3 in the
    others. Members named in ``missing`` (paths below the top folder) are left out, as in a damaged re-pack."""
    files = {name: gbw_lines(train_lines, seed + index) for index, name in enumerate(GBW_TRAIN_SHARDS)}
    for index, name in enumerate(GBW_HELDOUT_SHARDS):
        files[name] = (
            gbw_lines(heldout_lines, seed + 1000 + index, long_sentence=GBW_LONG_SENTENCE)
            if index < 2
            else gbw_lines(3, seed + 1000 + index)
        )
    with tarfile.open(path, "w:gz") as archive:
        for directory in (
            GBW_TOP,
            f"{GBW_TOP}/training-monolingual.tokenized.shuffled",
            f"{GBW_TOP}/heldout-monolingual.tokenized.shuffled",
        ):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            archive.addfile(info)
        for name, text in files.items():
            if name in missing:
                continue
            data = text.encode()
            info = tarfile.TarInfo(f"{GBW_TOP}/{name}")
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return path


def write_wrong_layout_zip(path: Path) -> Path:
    """A zip whose files sit at the top level instead of inside ``wikitext-*/`` (e.g. a re-packed copy)."""
    with zipfile.ZipFile(path, "w") as archive:
        for split in SPLIT_LINES:
            archive.writestr(_zip_member(f"wiki.{split}.tokens", 0o100644), wikitext_lines(20, 7))
    return path


def write_all(directory: Path):
    """Write the stand-in archives into ``directory`` under their real names; return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "wikitext-103": write_wikitext_zip(directory / "wikitext-103-v1.zip", "wikitext-103", seed=0),
        "wikitext-2": write_wikitext_zip(directory / "wikitext-2-v1.zip", "wikitext-2", seed=10),
        "ptb": write_ptb_tgz(directory / "simple-examples.tgz", seed=20),
        "gbw": write_gbw_tgz(directory / f"{GBW_TOP}.tar.gz", seed=30),
    }


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass


@contextlib.contextmanager
def serve_directory(directory: Path):
    """Serve ``directory`` over HTTP on 127.0.0.1 (a free port) in a background thread; yield the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def closed_port_url(name: str) -> str:
    """A URL on 127.0.0.1 at a port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/{name}"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/helpers/recipe_mirror.py OUTPUT_DIR")
    for corpus, archive in write_all(Path(sys.argv[1])).items():
        print(f"{corpus}: {archive}")
