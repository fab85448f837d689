"""The language-model recipes' prepare.sh, offline (lm_recipe.py): it downloads the stand-in archives through its
URL override, checks the layout and the checksum, and binarizes; a rerun skips what is done; the failure paths
(unreachable URL, wrong layout, checksum mismatch) stop with a clear message and leave nothing behind. Every
script has a usage and runs in strict mode."""

import shutil

import pytest
from lm_recipe import CORPORA, SPLITS, read_binarized
from recipe_mirror import closed_port_url
from recipe_runs import RECIPES, leftovers, md5, ok, run_recipe

# ------------------------------------------------------------------------------------------------ prepare.sh


@pytest.mark.parametrize("corpus", list(CORPORA))
def test_prepare_downloads_checks_and_binarizes(corpus, lm_prepared, lm_mirror, tmp_path):
    data_dir, output = lm_prepared[corpus]
    archive, _, _, text_folder, files = CORPORA[corpus]
    _, _, archives = lm_mirror
    assert (data_dir / archive).read_bytes() == archives[corpus].read_bytes()
    assert "no checksum to verify" not in output  # the MD5 given was checked
    assert sorted(p.name for p in (data_dir / text_folder).iterdir()) == sorted(files)
    assert not leftovers(data_dir)
    # the three split files are the archive's, byte for byte (unpacked here with Python)
    shutil.unpack_archive(str(archives[corpus]), str(tmp_path))
    member_dir = tmp_path / ("simple-examples/data" if corpus == "ptb" else text_folder)
    for name in files:
        assert (data_dir / text_folder / name).read_bytes() == (member_dir / name).read_bytes(), name
    # every split was binarized from its own file: decoding gives the words of each line back, in order
    data_bin = data_dir / "data-bin"
    for split, name in zip(SPLITS, files):
        dictionary, lines = read_binarized(data_bin, split)
        raw = (member_dir / name).read_text().splitlines()
        assert len(lines) == len(raw), split
        for ids, text in zip(lines, raw):  # words the training split lacks are <unk>
            assert ids == [dictionary.index(word) for word in text.split()] + [dictionary.eos()]
        if split == "train":
            assert all(dictionary[i] == word for i, word in zip(lines[0], raw[0].split()))


def test_prepare_rerun_skips_finished_steps(lm_prepared, tmp_path):
    data_dir = tmp_path / "wikitext-2"
    shutil.copytree(lm_prepared["wikitext-2"][0], data_dir)
    before = {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()}
    # a rerun neither downloads (the URL now points at a closed port) nor unpacks nor binarizes again
    proc = ok(run_recipe("wikitext-2/prepare.sh", data_dir, env={"WIKITEXT2_URL": closed_port_url("x.zip")}))
    for step in ("download", "unpack", "binarize"):
        assert f"skip {step}" in proc.stdout
    assert {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()} == before
    # with the binarized data removed, only that step runs again, and gives the same files
    dictionary = (data_dir / "data-bin" / "dict.txt").read_bytes()
    train = (data_dir / "data-bin" / "train.bin").read_bytes()
    shutil.rmtree(data_dir / "data-bin")
    proc = ok(run_recipe("wikitext-2/prepare.sh", data_dir, env={"WIKITEXT2_URL": closed_port_url("x.zip")}))
    assert "skip download" in proc.stdout and "skip unpack" in proc.stdout and "skip binarize" not in proc.stdout
    assert (data_dir / "data-bin" / "dict.txt").read_bytes() == dictionary
    assert (data_dir / "data-bin" / "train.bin").read_bytes() == train
    assert not leftovers(data_dir)


def test_prepare_unreachable_url_fails_clearly_and_leaves_nothing(tmp_path):
    url = closed_port_url("wikitext-103-v1.zip")
    data_dir = tmp_path / "new" / "wikitext-103"
    proc = run_recipe("wikitext-103/prepare.sh", data_dir, env={"WIKITEXT103_URL": url})
    assert proc.returncode != 0
    assert f"error: download of {url} failed" in proc.stderr
    assert "WIKITEXT103_URL" in proc.stderr  # says how to point it elsewhere
    assert not (tmp_path / "new").exists()
    # a data directory that existed before is kept, and holds no partial download
    existing = tmp_path / "existing"
    existing.mkdir()
    proc = run_recipe("ptb/prepare.sh", existing, env={"PTB_URL": closed_port_url("simple-examples.tgz")})
    assert proc.returncode != 0 and "error: download of" in proc.stderr and "PTB_URL" in proc.stderr
    assert list(existing.iterdir()) == []


@pytest.mark.parametrize(
    "served, message",
    [
        ("flat.zip", "unexpected layout of wikitext-103-v1.zip"),
        ("error-page.zip", "cannot unpack"),
    ],
)
def test_prepare_wrong_archive_fails_clearly_and_leaves_nothing(served, message, lm_mirror, tmp_path):
    url, _, _ = lm_mirror
    data_dir = tmp_path / "wt103"
    proc = run_recipe(
        "wikitext-103/prepare.sh", data_dir, env={"WIKITEXT103_URL": f"{url}/{served}", "WIKITEXT103_MD5": ""}
    )
    assert proc.returncode != 0
    assert message in proc.stderr
    if served == "flat.zip":  # names the file it expected and what it found instead
        assert "wikitext-103/wiki.train.tokens is missing" in proc.stderr
        assert "the archive holds: wiki.test.tokens wiki.train.tokens wiki.valid.tokens" in proc.stderr
    assert not data_dir.exists()


def test_prepare_checks_the_known_checksum_by_default(lm_mirror, tmp_path):
    url, _, archives = lm_mirror
    data_dir = tmp_path / "wt2"
    # no WIKITEXT2_MD5: the original release's MD5 applies, which the stand-in does not have
    proc = run_recipe("wikitext-2/prepare.sh", data_dir, env={"WIKITEXT2_URL": f"{url}/wikitext-2-v1.zip"})
    assert proc.returncode != 0
    assert (
        f"checksum mismatch for {url}/wikitext-2-v1.zip: MD5 {md5(archives['wikitext-2'])}, expected "
        f"542ccefacc6c27f945fb54453812b3cd" in proc.stderr
    )
    assert "WIKITEXT2_MD5" in proc.stderr
    assert not data_dir.exists()


@pytest.mark.parametrize("script", sorted(str(p.relative_to(RECIPES)) for p in RECIPES.glob("*/*.sh")))
def test_every_script_has_usage_and_strict_mode(script):
    text = (RECIPES / script).read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    proc = ok(run_recipe(script, "-h"))
    assert proc.stdout.startswith("Usage: ")


def test_unknown_config_and_missing_data_fail_clearly(tmp_path):
    proc = run_recipe("ptb/train.sh", "-d", tmp_path, "awd_lstm")
    assert proc.returncode != 0 and "unknown CONFIG 'awd_lstm'" in proc.stderr
    proc = run_recipe("ptb/train.sh", "-d", tmp_path, "-s", tmp_path / "ck", "awd_lstm_lm")
    assert proc.returncode != 0 and f"no binarized data in {tmp_path}/data-bin" in proc.stderr
    proc = run_recipe("wikitext-103/eval.sh", "-s", tmp_path, "lstm_lm_define_wt103_n3")
    assert proc.returncode != 0 and f"{tmp_path}/lstm_lm_define_wt103_n3/checkpoint_best.pt not found" in proc.stderr
