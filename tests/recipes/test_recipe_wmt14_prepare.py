"""The WMT14 En-De recipe's prepare.sh, offline (wmt14_recipe.py): it downloads, extracts, tokenises, cleans,
learns and applies a BPE and binarizes the stand-in archives; each stage is checked against a re-computation from
the previous one. A prepare.sh killed midway and run again gives byte-identical binarized data; a wrong archive or
checksum stops it with a message that names the variable to set."""

import os
import signal

import pytest
from recipe_mirror import closed_port_url
from recipe_runs import leftovers, md5, ok
from wmt14_mirror import expected_text, write_wmt14
from wmt14_recipe import BPE_SIZE, binarized, mirror_env, normalize, read_lines, run_script

# ------------------------------------------------------------------------------------------------ prepare.sh


def test_prepare_extracts_the_right_members(wmt14_prepared, wmt14_mirror):
    data_dir, output = wmt14_prepared
    _, _, archives = wmt14_mirror
    for archive in archives.values():
        assert (data_dir / "orig" / archive.name).read_bytes() == archive.read_bytes()
    assert output.count("no checksum to verify") == 4  # the four archives without a known MD5; the others checked
    # the three training corpora concatenated (Europarl, Common Crawl, News Commentary), newstest2013 as valid, and
    # the test sets' segments as sacreBLEU reads the .sgm files (extra spaces inside <seg> dropped)
    for name, lines in expected_text().items():
        assert read_lines(data_dir / "raw" / name) == lines, name
    assert (data_dir / "settings").read_text() == f"bpe=subword-nmt size={BPE_SIZE}\n"
    assert not leftovers(data_dir)


def test_prepare_tokenises_cleans_and_segments_as_moses_and_subword_nmt(wmt14_prepared):
    from sacremoses import MosesPunctNormalizer, MosesTokenizer
    from subword_nmt.apply_bpe import BPE

    data_dir, output = wmt14_prepared
    for lang in ("en", "de"):
        normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang)
        for split in ("train", "valid", "newstest2014", "newstest2017"):
            expected = [
                tokenizer.tokenize(
                    normalize(normalizer, line), aggressive_dash_splits=True, escape=True, return_str=True
                )
                for line in read_lines(data_dir / "raw" / f"{split}.{lang}")
            ]
            assert read_lines(data_dir / "tok" / f"{split}.{lang}") == expected, (split, lang)
    # cleaning: 1 to 250 words a side, ratio at most 1.5
    pairs = list(zip(read_lines(data_dir / "tok" / "train.en"), read_lines(data_dir / "tok" / "train.de")))
    kept = [
        (en, de)
        for en, de in pairs
        if 1 <= len(en.split()) <= 250
        and 1 <= len(de.split()) <= 250
        and max(len(en.split()), len(de.split())) <= 1.5 * min(len(en.split()), len(de.split()))
    ]
    assert len(pairs) - len(kept) >= 4  # at least the stand-in's four bad pairs went
    assert (
        list(zip(read_lines(data_dir / "tok" / "train.clean.en"), read_lines(data_dir / "tok" / "train.clean.de")))
        == kept
    )
    assert f"kept {len(kept)} of {len(pairs)} sentence pairs" in output
    # one BPE code for both languages, applied to every split
    codes = read_lines(data_dir / "bpe" / "code")
    assert len(codes) == int(BPE_SIZE) + 1  # the version line, then one merge a line
    with open(data_dir / "bpe" / "code", encoding="utf-8") as code:
        bpe = BPE(code)
    for lang in ("en", "de"):
        for split in ("train", "valid", "newstest2014", "newstest2017"):
            source = data_dir / "tok" / f"{'train.clean' if split == 'train' else split}.{lang}"
            expected = [bpe.process_line(line) for line in read_lines(source)]
            assert read_lines(data_dir / "bpe" / f"{split}.{lang}") == expected, (split, lang)


def test_prepare_binarizes_every_split_with_one_dictionary(wmt14_prepared):
    data_dir, _ = wmt14_prepared
    data_bin = data_dir / "data-bin"
    assert (data_bin / "dict.en.txt").read_bytes() == (data_bin / "dict.de.txt").read_bytes()
    for subset, name in (("train", "train"), ("valid", "valid"), ("test", "newstest2014"), ("test1", "newstest2017")):
        for lang in ("en", "de"):
            assert binarized(data_bin, subset, lang) == read_lines(data_dir / "bpe" / f"{name}.{lang}"), (subset, lang)


def test_prepare_rerun_skips_finished_steps(wmt14_prepared, tmp_path):
    import shutil

    data_dir = tmp_path / "data"
    shutil.copytree(wmt14_prepared[0], data_dir)
    before = {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()}
    proc = ok(run_script("prepare.sh", "-v", BPE_SIZE, data_dir, env={"WMT14_MIRROR": closed_port_url("wmt")}))
    for step in (
        "download training-parallel-europarl-v7.tgz",
        "extract",
        "tokenize",
        "clean",
        "learn BPE",
        "apply BPE",
        "binarize",
    ):
        assert f"skip {step}" in proc.stdout, step
    assert {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()} == before
    # other BPE settings for the same folder are refused: they would mix two preparations
    proc = run_script("prepare.sh", "-v", "200", data_dir, env={"WMT14_MIRROR": closed_port_url("wmt")})
    assert proc.returncode != 0
    assert f"was prepared with bpe=subword-nmt size={BPE_SIZE}, not bpe=subword-nmt size=200" in proc.stderr


@pytest.mark.parametrize(
    "kill_at",
    [pytest.param(k, marks=pytest.mark.slow) for k in ("sacremoses tokenize", "    train.en:", "fairseq-preprocess")]
    + ["apply the BPE"],  # make test keeps the smallest case; CI runs the others once (make test-slow)
)
def test_prepare_killed_midway_and_rerun_gives_identical_data(kill_at, wmt14_prepared, wmt14_mirror, tmp_path):
    """SIGKILL to prepare.sh and all its programs as soon as a step starts (no clean-up handler runs), then a
    rerun: the binarized data are byte for byte those of an uninterrupted run."""
    data_dir = tmp_path / "data"
    env = mirror_env(wmt14_mirror)
    proc = run_script("prepare.sh", "-v", BPE_SIZE, "-j", "2", data_dir, env=env, popen=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if kill_at in line:
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    step = {
        "sacremoses tokenize": "tokenize",
        "    train.en:": "tokenize",
        "apply the BPE": "bpe-apply",
        "fairseq-preprocess": "binarize",
    }[kill_at]
    assert (data_dir / ".done" / "extract").exists()  # earlier steps had finished ...
    assert not (data_dir / ".done" / step).exists()  # ... the killed one had not
    rerun = ok(run_script("prepare.sh", "-v", BPE_SIZE, "-j", "2", data_dir, env=env))
    assert "skip extract" in rerun.stdout and f"skip {step}" not in rerun.stdout
    if kill_at == "    train.en:":  # killed after the first file of the step: the rerun keeps it, does the rest
        assert "train.en: already done" in rerun.stdout and "train.de: already done" not in rerun.stdout
    reference = wmt14_prepared[0] / "data-bin"
    files = sorted(p.name for p in reference.iterdir() if p.name != "preprocess.log")
    assert sorted(p.name for p in (data_dir / "data-bin").iterdir() if p.name != "preprocess.log") == files
    for name in files:
        assert (data_dir / "data-bin" / name).read_bytes() == (reference / name).read_bytes(), name
    assert (data_dir / "bpe" / "code").read_bytes() == (wmt14_prepared[0] / "bpe" / "code").read_bytes()
    assert not leftovers(data_dir)


def test_prepare_redoes_the_later_steps_when_an_archive_changes(wmt14_prepared, wmt14_mirror, tmp_path):
    """An archive downloaded again (here: another News Commentary) is extracted again, and every later step is
    redone from the new text: no tokenised file of the old text is trusted."""
    import shutil

    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    data_dir = tmp_path / "data"
    shutil.copytree(wmt14_prepared[0], data_dir)
    other = write_wmt14(tmp_path / "other-mirror", seed=7)["news_commentary"]
    (data_dir / "orig" / "training-parallel-nc-v9.tgz").unlink()
    proc = ok(
        run_script(
            "prepare.sh",
            "-v",
            BPE_SIZE,
            "-j",
            "2",
            data_dir,
            env={"WMT14_MIRROR": closed_port_url("wmt"), "WMT14_NEWS_COMMENTARY_URL": str(other)},
        )
    )
    assert "skip download training-parallel-europarl-v7.tgz" in proc.stdout
    assert "skip extract" not in proc.stdout and "train.en: already done" not in proc.stdout
    raw = read_lines(data_dir / "raw" / "train.en")
    assert raw != read_lines(wmt14_prepared[0] / "raw" / "train.en")
    assert raw[-1] == expected_text(seed=7)["train.en"][-1]
    normalizer, tokenizer = MosesPunctNormalizer(lang="en"), MosesTokenizer("en")
    assert read_lines(data_dir / "tok" / "train.en") == [
        tokenizer.tokenize(normalize(normalizer, line), aggressive_dash_splits=True, escape=True, return_str=True)
        for line in raw
    ]
    assert binarized(data_dir / "data-bin", "train", "en") == read_lines(data_dir / "bpe" / "train.en")
    assert len(read_lines(data_dir / "bpe" / "train.en")) == len(read_lines(data_dir / "tok" / "train.clean.en"))


def test_prepare_wrong_archive_or_checksum_fails_clearly(wmt14_mirror, tmp_path):
    url, _, archives = wmt14_mirror
    env = mirror_env(wmt14_mirror)
    # an archive without the expected members: named in the error, deleted, and downloaded again by a rerun
    data_dir = tmp_path / "broken"
    proc = run_script(
        "prepare.sh", data_dir, env={**env, "WMT14_TEST_URL": f"{url}/broken/test-full.tgz", "WMT14_TEST_MD5": ""}
    )
    assert proc.returncode != 0
    assert "test-full.tgz does not hold the expected test-full/newstest2014-deen-src.en.sgm" in proc.stderr
    assert "WMT14_TEST_URL" in proc.stderr
    assert not (data_dir / "orig" / "test-full.tgz").exists()
    assert (data_dir / "orig" / "dev.tgz").exists()  # the other downloads are kept for the rerun
    assert not (data_dir / ".done" / "download-test").exists() and not leftovers(data_dir)
    # the MD5 sacreBLEU records for the real test-full.tgz applies by default; the stand-in does not have it
    data_dir = tmp_path / "new" / "checksum"
    proc = run_script("prepare.sh", data_dir, env={"WMT14_MIRROR": url})
    assert proc.returncode != 0
    assert (
        f"checksum mismatch for {url}/test-full.tgz: MD5 {md5(archives['test'])}, expected "
        "a8cd784e006feb32ac6f3d9ec7eb389a"
    ) in proc.stderr
    assert "WMT14_TEST_MD5" in proc.stderr
    # an unreachable mirror: nothing is left of a folder this run created
    data_dir = tmp_path / "unreachable" / "data"
    proc = run_script("prepare.sh", data_dir, env={"WMT14_MIRROR": closed_port_url("wmt")})
    assert proc.returncode != 0 and "error: download of" in proc.stderr and "WMT14_EUROPARL_URL" in proc.stderr
    assert not (tmp_path / "unreachable").exists()
    # bad options
    for args, message in (
        (["-b", "wordpiece"], "give subword-nmt or sentencepiece"),
        (["-v", "0"], "-v 0: give the BPE size"),
        (["-j", "x"], "-j x: give the number"),
    ):
        proc = run_script("prepare.sh", *args, tmp_path / "unused")
        assert proc.returncode != 0 and message in proc.stderr, args
