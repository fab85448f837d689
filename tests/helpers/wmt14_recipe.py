"""The WMT14 En-De recipe's test harness: its scripts run offline against stand-in archives with the real names and
layout (``wmt14_mirror.py``) served from 127.0.0.1, the tiny model settings, and readers for what the scripts write."""

from pathlib import Path

import pytest
from arch_cases import DEFINE_SMALL, TRANSFORMER
from recipe_mirror import serve_directory
from recipe_runs import md5, ok, run_recipe
from wmt14_mirror import write_wmt14

BPE_SIZE = "300"
TESTSETS = {"newstest2014": "test", "newstest2017": "test1"}
TINY = [
    "--cpu",
    "--max-update",
    "6",
    "--save-interval-updates",
    "2",
    "--keep-interval-updates",
    "5",
    "--max-tokens",
    "512",
    "--update-freq",
    "1",
    "--warmup-updates",
    "2",
    "--log-interval",
    "1",
    "--data-buffer-size",
    "0",
    *TRANSFORMER,
]
TINY_DEFINE = DEFINE_SMALL


def run_script(script, *args, env=None, popen=False):
    """Run recipes/wmt14-en-de/<script> (recipe_runs.run_recipe)."""
    return run_recipe(f"wmt14-en-de/{script}", *args, env=env, popen=popen)


def read_lines(path):
    """The lines of a text file, split on newlines only (as the recipe's tools read them)."""
    return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


def normalize(normalizer, line):
    """normalize-punctuation.perl, then remove-non-printing-char.perl (every \\p{C} character becomes a space)."""
    import regex

    return regex.sub(r"\p{C}", " ", normalizer.normalize(line))


def binarized(data_bin, subset, lang):
    """The symbols of every sentence of a binarized split, read back with fairseq's own reader."""
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(data_bin / f"dict.{lang}.txt"))
    dataset = data_utils.load_indexed_dataset(str(data_bin / f"{subset}.en-de.{lang}"), dictionary)
    return [dictionary.string(dataset[i]) for i in range(len(dataset))]


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def wmt14_mirror(tmp_path_factory):
    """The stand-in archives over HTTP: (base URL, folder, {name: archive})."""
    folder = tmp_path_factory.mktemp("wmt14-mirror")
    archives = write_wmt14(folder)
    broken = folder / "broken"
    broken.mkdir()
    (broken / "test-full.tgz").write_bytes(archives["dev"].read_bytes())  # a valid archive, but not test-full's
    with serve_directory(folder) as url:
        yield url, folder, archives


def mirror_env(wmt14_mirror):
    url, _, archives = wmt14_mirror
    # the stand-ins' own digests for the two archives whose MD5 the recipe knows
    return {"WMT14_MIRROR": url, "WMT14_TEST_MD5": md5(archives["test"]), "WMT14_TEST17_MD5": md5(archives["test17"])}


@pytest.fixture(scope="module")
def wmt14_prepared(wmt14_mirror, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("wmt14") / "data"
    proc = ok(run_script("prepare.sh", "-v", BPE_SIZE, "-j", "2", data_dir, env=mirror_env(wmt14_mirror)))
    return data_dir, proc.stdout + proc.stderr
