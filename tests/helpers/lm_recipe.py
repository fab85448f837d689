"""The language-model recipes' test harness (recipes/{wikitext-103,wikitext-2,ptb}): stand-in archives with the real
names and layout (``recipe_mirror.py``) served from 127.0.0.1, prepare.sh run once for each corpus, and readers for
what it writes."""

from pathlib import Path

import pytest
from recipe_mirror import serve_directory, write_all, write_wrong_layout_zip
from recipe_runs import md5, ok, run_recipe

# corpus -> (archive name, URL variable, MD5 variable, text folder, split file names)
CORPORA = {
    "wikitext-103": (
        "wikitext-103-v1.zip",
        "WIKITEXT103_URL",
        "WIKITEXT103_MD5",
        "wikitext-103",
        ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens"),
    ),
    "wikitext-2": (
        "wikitext-2-v1.zip",
        "WIKITEXT2_URL",
        "WIKITEXT2_MD5",
        "wikitext-2",
        ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens"),
    ),
    "ptb": ("simple-examples.tgz", "PTB_URL", "PTB_MD5", "ptb", ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")),
}
SPLITS = ("train", "valid", "test")


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def lm_mirror(tmp_path_factory):
    """The stand-in archives served over HTTP: yields (base URL, folder, {corpus: archive path})."""
    folder = tmp_path_factory.mktemp("mirror")
    archives = write_all(folder)
    write_wrong_layout_zip(folder / "flat.zip")
    (folder / "error-page.zip").write_text("<html><body>404 Not Found</body></html>\n")
    with serve_directory(folder) as url:
        yield url, folder, archives


@pytest.fixture(scope="module")
def lm_prepared(lm_mirror, tmp_path_factory):
    """prepare.sh run once for each corpus (over HTTP, with the stand-in's MD5): {corpus: (data dir, output)}."""
    url, folder, archives = lm_mirror
    root = tmp_path_factory.mktemp("data")
    result = {}
    for corpus, (archive, url_var, md5_var, _, _) in CORPORA.items():
        data_dir = root / corpus
        proc = ok(
            run_recipe(
                f"{corpus}/prepare.sh", data_dir, env={url_var: f"{url}/{archive}", md5_var: md5(archives[corpus])}
            )
        )
        result[corpus] = (data_dir, proc.stdout + proc.stderr)
    return result


def read_binarized(data_bin, split):
    """The dictionary and the token ids of every line of a binarized split, read with fairseq's own reader."""
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(data_bin / "dict.txt"))
    dataset = data_utils.load_indexed_dataset(str(data_bin / split), dictionary)
    return dictionary, [dataset[i].tolist() for i in range(len(dataset))]


def raw_token_count(path):
    """Tokens fairseq scores in a raw text file: its words plus one end-of-sentence per line."""
    return sum(len(line.split()) + 1 for line in Path(path).read_text().splitlines())
