"""The WMT14 En-De recipe (recipes/wmt14-en-de/{prepare,train,average,eval}.sh), offline.

Stand-in archives with the real names and layout (``wmt14_mirror.py``) are served from 127.0.0.1. prepare.sh
downloads, extracts, tokenises, cleans, learns and applies a BPE and binarizes them; each stage is checked
against a re-computation from the previous one. Then the whole chain: train.sh (tiny models, CPU, a few updates,
one of them in bfloat16) -> average.sh -> eval.sh, whose BLEU files are checked against the hypotheses and
references they were computed from. A prepare.sh killed midway and run again must give byte-identical binarized
data.
"""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import BIN, REPO, training_arguments
from recipe_mirror import closed_port_url, serve_directory
from wmt14_mirror import expected_text, write_wmt14

RECIPE = REPO / "recipes" / "wmt14-en-de"
BPE_SIZE = "300"
TESTSETS = {"newstest2014": "test", "newstest2017": "test1"}
TINY = ["--cpu", "--max-update", "6", "--save-interval-updates", "2", "--keep-interval-updates", "5",
        "--max-tokens", "512", "--update-freq", "1", "--warmup-updates", "2", "--log-interval", "1",
        "--data-buffer-size", "0", "--encoder-layers", "1", "--decoder-layers", "1",
        "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
TINY_DEFINE = ["--define-n", "16", "--define-k", "64"]


def run_script(script, *args, env=None, popen=False):
    """Run recipes/wmt14-en-de/<script> with this environment's programs first on PATH. The WMT14_* variables
    come from ``env`` only."""
    full_env = {name: value for name, value in os.environ.items()
                if not name.startswith("WMT14_") and name not in ("DATA_DIR", "SAVE_ROOT", "FORCE")}
    full_env.update(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1")
    full_env.update(env or {})
    command = ["bash", str(RECIPE / script), *map(str, args)]
    if popen:  # its own process group, so that the test can kill the script and every program it started
        return subprocess.Popen(command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    return subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=600)


def ok(proc):
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def md5(path):
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def leftovers(directory):
    """Temporary names a run must not leave behind."""
    return [p for p in Path(directory).rglob("*") if re.search(r"\.(tmp|part|err)$", p.name)]


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
def mirror(tmp_path_factory):
    """The stand-in archives over HTTP: (base URL, folder, {name: archive})."""
    folder = tmp_path_factory.mktemp("wmt14-mirror")
    archives = write_wmt14(folder)
    broken = folder / "broken"
    broken.mkdir()
    (broken / "test-full.tgz").write_bytes(archives["dev"].read_bytes())  # a valid archive, but not test-full's
    with serve_directory(folder) as url:
        yield url, folder, archives


def mirror_env(mirror):
    url, _, archives = mirror
    # the stand-ins' own digests for the two archives whose MD5 the recipe knows
    return {"WMT14_MIRROR": url, "WMT14_TEST_MD5": md5(archives["test"]), "WMT14_TEST17_MD5": md5(archives["test17"])}


@pytest.fixture(scope="module")
def prepared(mirror, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("wmt14") / "data"
    proc = ok(run_script("prepare.sh", "-v", BPE_SIZE, "-j", "2", data_dir, env=mirror_env(mirror)))
    return data_dir, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------------ prepare.sh

def test_prepare_extracts_the_right_members(prepared, mirror):
    data_dir, output = prepared
    _, _, archives = mirror
    for archive in archives.values():
        assert (data_dir / "orig" / archive.name).read_bytes() == archive.read_bytes()
    assert output.count("no checksum to verify") == 4  # the four archives without a known MD5; the others checked
    # the three training corpora concatenated (Europarl, Common Crawl, News Commentary), newstest2013 as valid, and
    # the test sets' segments as sacreBLEU reads the .sgm files (extra spaces inside <seg> dropped)
    for name, lines in expected_text().items():
        assert read_lines(data_dir / "raw" / name) == lines, name
    assert (data_dir / "settings").read_text() == f"bpe=subword-nmt size={BPE_SIZE}\n"
    assert not leftovers(data_dir)


def test_prepare_tokenises_cleans_and_segments_as_moses_and_subword_nmt(prepared):
    from sacremoses import MosesPunctNormalizer, MosesTokenizer
    from subword_nmt.apply_bpe import BPE
    data_dir, output = prepared
    for lang in ("en", "de"):
        normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang)
        for split in ("train", "valid", "newstest2014", "newstest2017"):
            expected = [tokenizer.tokenize(normalize(normalizer, line), aggressive_dash_splits=True, escape=True,
                                           return_str=True) for line in read_lines(data_dir / "raw" / f"{split}.{lang}")]
            assert read_lines(data_dir / "tok" / f"{split}.{lang}") == expected, (split, lang)
    # cleaning: 1 to 250 words a side, ratio at most 1.5
    pairs = list(zip(read_lines(data_dir / "tok" / "train.en"), read_lines(data_dir / "tok" / "train.de")))
    kept = [(en, de) for en, de in pairs
            if 1 <= len(en.split()) <= 250 and 1 <= len(de.split()) <= 250
            and max(len(en.split()), len(de.split())) <= 1.5 * min(len(en.split()), len(de.split()))]
    assert len(pairs) - len(kept) >= 4  # at least the stand-in's four bad pairs went
    assert list(zip(read_lines(data_dir / "tok" / "train.clean.en"),
                    read_lines(data_dir / "tok" / "train.clean.de"))) == kept
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


def test_prepare_binarizes_every_split_with_one_dictionary(prepared):
    data_dir, _ = prepared
    data_bin = data_dir / "data-bin"
    assert (data_bin / "dict.en.txt").read_bytes() == (data_bin / "dict.de.txt").read_bytes()
    for subset, name in (("train", "train"), ("valid", "valid"), ("test", "newstest2014"), ("test1", "newstest2017")):
        for lang in ("en", "de"):
            assert binarized(data_bin, subset, lang) == read_lines(data_dir / "bpe" / f"{name}.{lang}"), (subset, lang)


def test_prepare_rerun_skips_finished_steps(prepared, tmp_path):
    import shutil
    data_dir = tmp_path / "data"
    shutil.copytree(prepared[0], data_dir)
    before = {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()}
    proc = ok(run_script("prepare.sh", "-v", BPE_SIZE, data_dir, env={"WMT14_MIRROR": closed_port_url("wmt")}))
    for step in ("download training-parallel-europarl-v7.tgz", "extract", "tokenize", "clean", "learn BPE",
                 "apply BPE", "binarize"):
        assert f"skip {step}" in proc.stdout, step
    assert {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()} == before
    # other BPE settings for the same folder are refused: they would mix two preparations
    proc = run_script("prepare.sh", "-v", "200", data_dir, env={"WMT14_MIRROR": closed_port_url("wmt")})
    assert proc.returncode != 0
    assert f"was prepared with bpe=subword-nmt size={BPE_SIZE}, not bpe=subword-nmt size=200" in proc.stderr


@pytest.mark.parametrize("kill_at", ["sacremoses tokenize", "    train.en:", "apply the BPE", "fairseq-preprocess"])
def test_prepare_killed_midway_and_rerun_gives_identical_data(kill_at, prepared, mirror, tmp_path):
    """SIGKILL to prepare.sh and all its programs as soon as a step starts (no clean-up handler runs), then a
    rerun: the binarized data are byte for byte those of an uninterrupted run."""
    data_dir = tmp_path / "data"
    env = mirror_env(mirror)
    proc = run_script("prepare.sh", "-v", BPE_SIZE, "-j", "2", data_dir, env=env, popen=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if kill_at in line:
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    step = {"sacremoses tokenize": "tokenize", "    train.en:": "tokenize", "apply the BPE": "bpe-apply",
            "fairseq-preprocess": "binarize"}[kill_at]
    assert (data_dir / ".done" / "extract").exists()  # earlier steps had finished ...
    assert not (data_dir / ".done" / step).exists()  # ... the killed one had not
    rerun = ok(run_script("prepare.sh", "-v", BPE_SIZE, "-j", "2", data_dir, env=env))
    assert "skip extract" in rerun.stdout and f"skip {step}" not in rerun.stdout
    if kill_at == "    train.en:":  # killed after the first file of the step: the rerun keeps it, does the rest
        assert "train.en: already done" in rerun.stdout and "train.de: already done" not in rerun.stdout
    reference = prepared[0] / "data-bin"
    files = sorted(p.name for p in reference.iterdir() if p.name != "preprocess.log")
    assert sorted(p.name for p in (data_dir / "data-bin").iterdir() if p.name != "preprocess.log") == files
    for name in files:
        assert (data_dir / "data-bin" / name).read_bytes() == (reference / name).read_bytes(), name
    assert (data_dir / "bpe" / "code").read_bytes() == (prepared[0] / "bpe" / "code").read_bytes()
    assert not leftovers(data_dir)


def test_prepare_redoes_the_later_steps_when_an_archive_changes(prepared, mirror, tmp_path):
    """An archive downloaded again (here: another News Commentary) is extracted again, and every later step is
    redone from the new text: no tokenised file of the old text is trusted."""
    import shutil
    from sacremoses import MosesPunctNormalizer, MosesTokenizer
    data_dir = tmp_path / "data"
    shutil.copytree(prepared[0], data_dir)
    other = write_wmt14(tmp_path / "other-mirror", seed=7)["news_commentary"]
    (data_dir / "orig" / "training-parallel-nc-v9.tgz").unlink()
    proc = ok(run_script("prepare.sh", "-v", BPE_SIZE, "-j", "2", data_dir,
                         env={"WMT14_MIRROR": closed_port_url("wmt"), "WMT14_NEWS_COMMENTARY_URL": str(other)}))
    assert "skip download training-parallel-europarl-v7.tgz" in proc.stdout
    assert "skip extract" not in proc.stdout and "train.en: already done" not in proc.stdout
    raw = read_lines(data_dir / "raw" / "train.en")
    assert raw != read_lines(prepared[0] / "raw" / "train.en") and raw[-1] == expected_text(seed=7)["train.en"][-1]
    normalizer, tokenizer = MosesPunctNormalizer(lang="en"), MosesTokenizer("en")
    assert read_lines(data_dir / "tok" / "train.en") == [
        tokenizer.tokenize(normalize(normalizer, line), aggressive_dash_splits=True, escape=True, return_str=True)
        for line in raw]
    assert binarized(data_dir / "data-bin", "train", "en") == read_lines(data_dir / "bpe" / "train.en")
    assert len(read_lines(data_dir / "bpe" / "train.en")) == len(read_lines(data_dir / "tok" / "train.clean.en"))


def test_prepare_wrong_archive_or_checksum_fails_clearly(mirror, tmp_path):
    url, _, archives = mirror
    env = mirror_env(mirror)
    # an archive without the expected members: named in the error, deleted, and downloaded again by a rerun
    data_dir = tmp_path / "broken"
    proc = run_script("prepare.sh", data_dir, env={**env, "WMT14_TEST_URL": f"{url}/broken/test-full.tgz",
                                                   "WMT14_TEST_MD5": ""})
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
    assert (f"checksum mismatch for {url}/test-full.tgz: MD5 {md5(archives['test'])}, expected "
            "a8cd784e006feb32ac6f3d9ec7eb389a") in proc.stderr
    assert "WMT14_TEST_MD5" in proc.stderr
    # an unreachable mirror: nothing is left of a folder this run created
    data_dir = tmp_path / "unreachable" / "data"
    proc = run_script("prepare.sh", data_dir, env={"WMT14_MIRROR": closed_port_url("wmt")})
    assert proc.returncode != 0 and "error: download of" in proc.stderr and "WMT14_EUROPARL_URL" in proc.stderr
    assert not (tmp_path / "unreachable").exists()
    # bad options
    for args, message in ((["-b", "wordpiece"], "give subword-nmt or sentencepiece"),
                          (["-v", "0"], "-v 0: give the BPE size"), (["-j", "x"], "-j x: give the number")):
        proc = run_script("prepare.sh", *args, tmp_path / "unused")
        assert proc.returncode != 0 and message in proc.stderr, args


# ------------------------------------------------------------------------------------------ train.sh commands

PARSE = r"""
import json, sys
from fairseq import options
from define_fairseq.tools.train import parse_args
result = {}
for name, argv in json.load(sys.stdin).items():
    program, argv = argv[0], argv[1:]
    args = parse_args(argv) if program == "define_fairseq.tools.train" else \
        options.parse_args_and_arch(options.get_training_parser(), argv)
    result[name] = {key: str(getattr(args, key, None)) for key in (
        "arch", "share_all_embeddings", "optimizer", "adam_betas", "adam_eps", "lr", "lr_scheduler",
        "warmup_updates", "warmup_init_lr", "criterion", "label_smoothing", "dropout", "max_tokens", "update_freq",
        "distributed_world_size", "max_update", "fp16", "bf16", "tpu", "clip_norm", "save_dir", "seed",
        "save_interval_updates", "keep_interval_updates", "define_n", "define_k", "define_depth")}
print(json.dumps(result))
"""


def dry_run(*args):
    proc = ok(run_script("train.sh", "-n", "-d", "data", "-s", "ck", *args))
    return ["define_fairseq.tools.train", *training_arguments(proc.stdout)]


def test_train_commands_keep_the_batch_and_the_papers_settings():
    commands = {f"{config}-{gpus}": dry_run("-g", gpus, config) for config in ("transformer_wmt_en_de",
                                                                                "transformer_define")
                for gpus in (1, 2, 4, 8)}
    commands["bf16"] = dry_run("-g", 2, "-p", "bf16", "transformer_define")
    commands["fp32"] = dry_run("-g", 1, "-p", "fp32", "transformer_define", "--max-update", "7", "--lr", "0.002")
    proc = subprocess.run([sys.executable, "-c", PARSE], input=json.dumps(commands), capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, info in parsed.items():
        config = name.rsplit("-", 1)[0] if name not in ("bf16", "fp32") else "transformer_define"
        assert info["arch"] == config and info["save_dir"] == f"ck/{config}"
        assert info["share_all_embeddings"] == "True"
        # 8 batches of 4096 tokens an update, however many GPUs
        world, update_freq = int(info["distributed_world_size"]), eval(info["update_freq"])[0]
        assert int(info["max_tokens"]) * world * update_freq == 8 * 4096, name
        # OpenNMT-py's Transformer-base recipe: Adam (0.9, 0.998), noam = inverse sqrt from 0, peak after 8000
        assert (info["optimizer"], info["adam_betas"], info["adam_eps"]) == ("adam", "(0.9, 0.998)", "1e-09")
        assert (info["lr_scheduler"], info["warmup_updates"], info["warmup_init_lr"]) == ("inverse_sqrt", "8000",
                                                                                         "0.0")
        assert (info["criterion"], info["label_smoothing"], info["dropout"]) == ("label_smoothed_cross_entropy",
                                                                                 "0.1", "0.1")
        assert (info["clip_norm"], info["save_interval_updates"], info["keep_interval_updates"]) == ("0.0", "2000",
                                                                                                     "10")
        if name != "fp32":
            assert eval(info["lr"]) == [0.000988] and info["max_update"] == "200000"
            assert abs(2 / (512 * 8000) ** 0.5 - 0.000988) < 1e-6  # noam's peak: 2 * 512^-0.5 * 8000^-0.5
        if config == "transformer_define":  # the arch's defaults are the paper's n, k, N (no flag overrides them)
            assert (info["define_n"], info["define_k"], info["define_depth"]) == ("None", "None", "None")
    assert (parsed["transformer_define-1"]["fp16"], parsed["transformer_define-1"]["bf16"]) == ("True", "False")
    # bf16 runs through the plugin's entry point: fairseq-train's own parser would ask for a TPU
    assert (parsed["bf16"]["bf16"], parsed["bf16"]["tpu"], parsed["bf16"]["fp16"]) == ("True", "False", "False")
    assert (parsed["fp32"]["fp16"], parsed["fp32"]["bf16"]) == ("False", "False")
    assert parsed["fp32"]["max_update"] == "7" and eval(parsed["fp32"]["lr"]) == [0.002]  # the user's flags win


def test_fairseq_trains_own_bf16_flag_asks_for_a_tpu():
    """Why bf16 goes through define_fairseq.tools.train: fairseq-train's parser turns --bf16 into --tpu."""
    from fairseq import options
    from define_fairseq.tools.train import parse_args
    argv = ["data", "--task", "translation", "--arch", "transformer", "--bf16"]
    assert options.parse_args_and_arch(options.get_training_parser(), argv).tpu is True
    args = parse_args(argv)
    assert args.bf16 is True and args.tpu is False
    assert parse_args(argv + ["--tpu"]).tpu is True


def test_train_bad_options_fail_clearly(tmp_path):
    proc = ok(run_script("train.sh", "-n", "-g", "3", "transformer_define", "--update-freq", "3"))
    # the user's --update-freq comes last, after the recipe's, and wins
    assert "--distributed-world-size 3" in proc.stdout and "--update-freq 3 --save-dir" in proc.stdout
    proc = run_script("eval.sh", "-s", tmp_path, "transformer_define", "--nbest", "2")
    assert proc.returncode != 0 and "do not pass --nbest" in proc.stderr
    for args, message in ((["-g", "3", "transformer_define"], "-g 3 does not divide 8"),
                          (["-g", "1", "-p", "fp8", "transformer_define"], "-p fp8: give fp16, bf16 or fp32"),
                          (["-g", "1", "transformer"], "unknown CONFIG 'transformer'")):
        proc = run_script("train.sh", "-n", *args)
        assert proc.returncode != 0 and message in proc.stderr, args
    proc = run_script("train.sh", "-d", tmp_path, "-s", tmp_path / "ck", "-g", "1", "transformer_define")
    assert proc.returncode != 0 and f"no binarized data in {tmp_path}/data-bin" in proc.stderr
    proc = run_script("average.sh", "-s", tmp_path, "transformer_define")
    assert proc.returncode != 0 and f"{tmp_path}/transformer_define not found" in proc.stderr
    proc = run_script("eval.sh", "-s", tmp_path, "-a", "5", "transformer_define")
    assert proc.returncode != 0 and f"{tmp_path}/transformer_define/checkpoint_avg5.pt not found" in proc.stderr


# ----------------------------------------------------------------------------- the chain: train, average, eval

@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory):
    """transformer_define in float32 and the baseline in bfloat16, 6 updates each, a checkpoint every 2."""
    data_dir, _ = prepared
    save_root = tmp_path_factory.mktemp("checkpoints")
    outputs = {}
    for config, precision, extra in (("transformer_define", "fp32", TINY_DEFINE), ("transformer_wmt_en_de", "bf16", [])):
        proc = ok(run_script("train.sh", "-d", data_dir, "-s", save_root, "-g", 1, "-p", precision, config,
                             *TINY, *extra))
        outputs[config] = proc.stdout
    return save_root, outputs


def state(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def test_train_writes_checkpoints_and_logs(trained):
    save_root, outputs = trained
    for config in ("transformer_define", "transformer_wmt_en_de"):
        folder = save_root / config
        assert sorted(p.name for p in folder.glob("checkpoint_*_*.pt")) == [f"checkpoint_1_{u}.pt" for u in (2, 4, 6)]
        assert (folder / ".done" / "train").exists() and (folder / "checkpoint_best.pt").exists()
        log = (folder / "train.log").read_text()
        assert log.startswith("# ") and f"--arch {config}" in log.splitlines()[0]  # the command, then its output
        assert "num_updates: 6 >= max_update: 6" in log
        last = state(folder / "checkpoint_last.pt")
        assert last["optimizer_history"][-1]["num_updates"] == 6
        floats = [v for v in last["model"].values() if v.is_floating_point()]
        # fairseq saves float32; a model trained in bfloat16 holds only values that bfloat16 represents
        in_bf16 = all(torch.equal(v, v.bfloat16().float()) for v in floats)
        assert in_bf16 == (config == "transformer_wmt_en_de")
        assert last["cfg"]["common"]["bf16"] == (config == "transformer_wmt_en_de")


@pytest.fixture(scope="module")
def averaged(trained):
    save_root, _ = trained
    proc = ok(run_script("average.sh", "-s", save_root, "-n", 3, "transformer_define"))
    return save_root / "transformer_define" / "checkpoint_avg3.pt", proc.stdout + proc.stderr


def test_average_is_the_mean_of_the_last_checkpoints(averaged, trained):
    path, output = averaged
    save_root, _ = trained
    inputs = [state(save_root / "transformer_define" / f"checkpoint_1_{u}.pt")["model"] for u in (2, 4, 6)]
    result = state(path)
    assert sorted(result["averaged_from"]) == [f"checkpoint_1_{u}.pt" for u in (2, 4, 6)]
    assert set(result["model"]) == set(inputs[0])
    for key, value in result["model"].items():
        if value.is_floating_point():
            torch.testing.assert_close(value, sum(m[key].double() for m in inputs).div(3).float(), msg=key)
    assert not leftovers(path.parent)
    # a rerun with no newer checkpoint keeps it
    proc = ok(run_script("average.sh", "-s", save_root, "-n", 3, "transformer_define"))
    assert "skip averaging" in proc.stdout
    proc = run_script("average.sh", "-s", save_root, "-n", 4, "transformer_define")
    assert proc.returncode != 0 and not (path.parent / "checkpoint_avg4.pt").exists()


BLEU_LINE = re.compile(r"^(newstest201[47]) +sacreBLEU +([0-9.]+) +tokenized compound-split BLEU +([0-9.]+) +"
                       r"\((\d+) sentences; (nrefs:1\|case:mixed\|eff:no\|tok:13a\|smooth:exp\|version:[0-9.]+)\)$")


def moses_tokenize(lines, lang="de"):
    from sacremoses import MosesPunctNormalizer, MosesTokenizer
    tokenizer, normalizer = MosesTokenizer(lang), MosesPunctNormalizer(lang)
    return [tokenizer.tokenize(normalize(normalizer, line), aggressive_dash_splits=True, escape=True,
                               return_str=True) for line in lines]


def check_bleu_folder(folder, data_dir, checkpoint, bpe="subword-nmt", beam=2, testsets=tuple(TESTSETS)):
    from sacremoses import MosesDetokenizer
    import sacrebleu
    lines = (folder / "bleu.txt").read_text().splitlines()
    assert lines[0].startswith(f"# BLEU of {checkpoint} on {data_dir} ({bpe}): beam {beam}, lenpen 0.6")
    assert len(lines) == 1 + len(testsets)
    detokenizer = MosesDetokenizer("de")
    for line, testset in zip(lines[1:], testsets):
        match = BLEU_LINE.match(line)
        assert match, line
        assert match.group(1) == testset and match.group(4) == "30"
        # the hypotheses: fairseq-generate's H lines in the order of the test set, BPE removed
        log = (folder / f"{testset}.generate.log").read_text()
        hyps = dict(re.findall(r"^H-(\d+)\t[^\t]*\t(.*)$", log, flags=re.M))
        hyps = [hyps[str(i)] for i in range(30)]
        tokenized = read_lines(folder / f"{testset}.hyp.tok")
        detokenized = read_lines(folder / f"{testset}.hyp.detok")
        if bpe == "subword-nmt":  # the output is tokenised text, detokenised for sacreBLEU
            assert tokenized == hyps and "@@" not in " ".join(tokenized)
            assert detokenized == [detokenizer.detokenize(h.split(), unescape=True) for h in tokenized]
        else:  # SentencePiece gives plain text, tokenised for the tokenised BLEU
            assert detokenized == hyps and "\u2581" not in " ".join(hyps)
            assert tokenized == moses_tokenize(detokenized)
        reference = read_lines(data_dir / "raw" / f"{testset}.de")
        # sacreBLEU on the detokenised output against the original reference, as recorded in the JSON
        recorded = json.loads((folder / f"{testset}.sacrebleu.json").read_text())
        score = sacrebleu.corpus_bleu(detokenized, [reference])
        assert float(match.group(2)) == pytest.approx(score.score, abs=0.006) == recorded["score"]
        assert recorded["signature"] == match.group(5)
        # the tokenised compound-split BLEU scored what the tokenised, compound-split files hold
        split = [re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", r) for r in moses_tokenize(reference)]
        assert read_lines(folder / f"{testset}.ref.tok.split") == split
        assert any("##AT##-##AT##" in r for r in split)  # the stand-in has hyphenated compounds
        assert read_lines(folder / f"{testset}.hyp.tok.split") == [
            re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", h) for h in tokenized]
        fairseq_score = (folder / f"{testset}.fairseq-score.txt").read_text()
        assert f"BLEU4 = {float(match.group(3)):.2f}" in fairseq_score


def test_eval_chain_writes_well_formed_bleu(averaged, prepared, trained):
    data_dir, _ = prepared
    save_root, _ = trained
    checkpoint, _ = averaged
    quick = ["--cpu", "--max-len-b", "20"]
    proc = ok(run_script("eval.sh", "-d", data_dir, "-s", save_root, "-a", 3, "-b", 2, "transformer_define", *quick))
    folder = checkpoint.parent / "bleu.checkpoint_avg3.beam2.lenpen0.6"
    check_bleu_folder(folder, data_dir, checkpoint)
    assert not leftovers(checkpoint.parent)
    # the baseline, trained in bfloat16, evaluated from its best checkpoint
    best = save_root / "transformer_wmt_en_de" / "checkpoint_best.pt"
    ok(run_script("eval.sh", "-d", data_dir, "-s", save_root, "-b", 2, "transformer_wmt_en_de", *quick))
    check_bleu_folder(best.parent / "bleu.checkpoint_best.beam2.lenpen0.6", data_dir, best)
    # reused while the checkpoint and the arguments are unchanged
    again = ok(run_script("eval.sh", "-d", data_dir, "-s", save_root, "-a", 3, "-b", 2, "transformer_define", *quick))
    assert "skip evaluation" in again.stdout and proc.stdout.strip().splitlines()[-1] in again.stdout


# ------------------------------------------------------------------------------------------ the SentencePiece option

def test_sentencepiece_option_prepares_trains_and_evaluates(mirror, tmp_path):
    import sentencepiece
    data_dir = tmp_path / "spm"
    proc = ok(run_script("prepare.sh", "-b", "sentencepiece", "-v", BPE_SIZE, "-j", "2", data_dir,
                         env=mirror_env(mirror)))
    assert "SentencePiece BPE, vocabulary 300" in proc.stdout
    assert (data_dir / "settings").read_text() == f"bpe=sentencepiece size={BPE_SIZE}\n"
    assert not (data_dir / "bpe" / "code").exists()
    model = sentencepiece.SentencePieceProcessor(model_file=str(data_dir / "bpe" / "spm.model"))
    assert model.get_piece_size() == int(BPE_SIZE)
    from sacremoses import MosesPunctNormalizer
    for lang in ("en", "de"):
        # normalised only (SentencePiece segments raw text): no Moses tokenisation, no XML escapes
        raw = read_lines(data_dir / "raw" / f"newstest2014.{lang}")
        normalizer = MosesPunctNormalizer(lang)
        assert read_lines(data_dir / "tok" / f"newstest2014.{lang}") == [normalize(normalizer, r) for r in raw]
        for split in ("train", "newstest2014"):
            source = data_dir / "tok" / f"{'train.clean' if split == 'train' else split}.{lang}"
            expected = [" ".join(model.encode(line, out_type=str)) for line in read_lines(source)]
            assert read_lines(data_dir / "bpe" / f"{split}.{lang}") == expected
            # binarized with the joint dictionary of the training pieces (a test piece it lacks is <unk>)
            vocabulary = {row.split(" ")[0] for row in read_lines(data_dir / "data-bin" / f"dict.{lang}.txt")}
            subset = "test" if split == "newstest2014" else split
            assert binarized(data_dir / "data-bin", subset, lang) == [
                " ".join(piece if piece in vocabulary else "<unk>" for piece in line.split()) for line in expected]
    save_root = tmp_path / "checkpoints"
    ok(run_script("train.sh", "-d", data_dir, "-s", save_root, "-g", 1, "-p", "fp32", "transformer_define",
                  *TINY, *TINY_DEFINE, "--max-update", "2"))
    ok(run_script("eval.sh", "-d", data_dir, "-s", save_root, "-b", 2, "-t", "newstest2014", "transformer_define",
                  "--cpu", "--max-len-b", "20"))
    best = save_root / "transformer_define" / "checkpoint_best.pt"
    check_bleu_folder(best.parent / "bleu.checkpoint_best.beam2.lenpen0.6", data_dir, best, bpe="sentencepiece",
                      testsets=("newstest2014",))


# ------------------------------------------------------------------------- the recipe's model from Python and CLI

def test_recipe_checkpoint_translates_raw_text_from_python_and_interactive(prepared, trained):
    """The hub interface and fairseq-interactive on the recipe's outputs, with the Moses tokenizer (the data
    are Moses-tokenised) and the BPE codes: raw sentences in, detokenised translations out, the same both ways."""
    from define_fairseq.models.transformer_define import TransformerDefineModel
    data_dir, _ = prepared
    save_root, _ = trained
    sentences = ["The Commission's well-known report & the \"new\" road.", "Mr President, we must not forget it."]
    hub = TransformerDefineModel.from_pretrained(
        str(save_root / "transformer_define"), "checkpoint_best.pt", data_name_or_path=str(data_dir / "data-bin"),
        tokenizer="moses", bpe="subword_nmt", bpe_codes=str(data_dir / "bpe" / "code"),
        user_dir=str(REPO / "define_fairseq"))
    hub.eval()
    encoded = hub.apply_bpe(hub.tokenize(sentences[0]))
    assert "@-@" in encoded and "&amp;" in encoded and "@@" in encoded  # tokenised as the data, then segmented
    from_python = hub.translate(sentences, beam=2, max_len_b=20)
    assert len(from_python) == 2 and all("@@" not in text and "&amp;" not in text for text in from_python)
    proc = subprocess.run(
        [str(BIN / "fairseq-interactive"), str(data_dir / "data-bin"), "--user-dir", str(REPO / "define_fairseq"),
         "--path", str(save_root / "transformer_define" / "checkpoint_best.pt"), "--source-lang", "en",
         "--target-lang", "de", "--tokenizer", "moses", "--bpe", "subword_nmt",
         "--bpe-codes", str(data_dir / "bpe" / "code"), "--beam", "2", "--max-len-b", "20", "--cpu"],
        input="".join(s + "\n" for s in sentences), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    detokenized = dict(re.findall(r"^D-(\d+)\t[^\t]*\t(.*)$", proc.stdout, flags=re.M))
    assert [detokenized[str(i)] for i in range(2)] == from_python
