"""The language-model recipes (recipes/{wikitext-103,wikitext-2,ptb}/{prepare,train,eval}.sh), offline.

Stand-in archives with the real names and layout (``recipe_mirror.py``) are served from 127.0.0.1; prepare.sh
downloads them through its URL override, checks the layout and binarizes; train.sh trains one config per recipe
shrunk to a few seconds; eval.sh scores valid and test. The failure paths (unreachable URL, wrong layout,
checksum mismatch) must stop with a clear message and leave nothing behind.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BIN, REPO, training_arguments
from recipe_mirror import closed_port_url, serve_directory, write_all, write_wrong_layout_zip

RECIPES = REPO / "recipes"
PLUGIN = REPO / "define_fairseq"

# corpus -> (archive name, URL variable, MD5 variable, text folder, split file names)
CORPORA = {
    "wikitext-103": ("wikitext-103-v1.zip", "WIKITEXT103_URL", "WIKITEXT103_MD5", "wikitext-103",
                     ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")),
    "wikitext-2": ("wikitext-2-v1.zip", "WIKITEXT2_URL", "WIKITEXT2_MD5", "wikitext-2",
                   ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")),
    "ptb": ("simple-examples.tgz", "PTB_URL", "PTB_MD5", "ptb", ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")),
}
SPLITS = ("train", "valid", "test")

# What each model needs from the plugin; a train/eval test is skipped while one of these does not exist yet.
NEEDS = {
    "lstm_lm_define": ["models/lstm_lm_define.py", "tasks/stateful_lm.py"],
    "awd_lstm_lm": ["models/awd_lstm_lm.py", "tasks/stateful_lm.py", "criterions/lm_regularized_loss.py"],
    "transformer_lm_define": ["models/transformer_lm_define.py"],
    "mogrifier_lstm_lm": ["models/mogrifier_lstm_lm.py", "modules/mogrifier_lstm.py", "tasks/stateful_lm.py",
                          "criterions/lm_regularized_loss.py"],
}
CONFIG_MODEL = {
    **{f"wikitext-103/r{i}": "lstm_lm_define" for i in range(1, 6)},
    "wikitext-103/transformer_lm_wiki103": None,  # fairseq's own arch
    "wikitext-103/transformer_lm_define_wiki103": "transformer_lm_define",
    **{f"{corpus}/{config}": "awd_lstm_lm" for corpus in ("ptb", "wikitext-2")
       for config in ("awd_lstm_lm", "awd_lstm_lm_define")},
    **{config: "mogrifier_lstm_lm" for config in ("ptb/mogrifier_lstm_lm_ptb", "ptb/lstm_lm_ptb",
                                                  "wikitext-2/mogrifier_lstm_lm_wt2", "wikitext-2/lstm_lm_wt2")},
}
# The official code's learning rate and L2 penalty of each Mogrifier-paper config (lamb's tuned trials).
LAMB_LR_L2 = {"mogrifier_lstm_lm_ptb": ("0.0023", "0.000252"), "lstm_lm_ptb": ("0.00304", "0.000249"),
              "mogrifier_lstm_lm_wt2": ("0.00329", "0.00019"), "lstm_lm_wt2": ("0.00318", "0.000231")}


def missing_files(model):
    return [path for path in NEEDS.get(model, []) if not (PLUGIN / path).exists()]


def skip_unless_available(model):
    missing = missing_files(model)
    if missing:
        pytest.skip(f"not written yet: {', '.join(missing)}")


RECIPE_VARIABLES = ("WIKITEXT103_URL", "WIKITEXT2_URL", "PTB_URL", "WIKITEXT103_MD5", "WIKITEXT2_MD5", "PTB_MD5",
                    "DATA_DIR", "SAVE_ROOT", "FORCE", "TEMPERATURES")


def run_script(script, *args, env=None):
    """Run recipes/<script> with this environment's fairseq programs first on PATH; return the result. The
    variables the recipes read come from ``env`` only, never from the caller's environment."""
    full_env = {name: value for name, value in os.environ.items() if name not in RECIPE_VARIABLES}
    full_env.update(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", PREPROCESS_WORKERS="1", OMP_NUM_THREADS="1")
    full_env.update(env or {})
    return subprocess.run(["bash", str(RECIPES / script), *map(str, args)], env=full_env, capture_output=True,
                          text=True, timeout=600)


def ok(proc):
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def md5(path):
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def leftovers(directory):
    """Temporary names a run must not leave behind."""
    return [p for p in Path(directory).rglob("*") if re.search(r"\.(tmp|part|err)$", p.name)]


# ------------------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """The stand-in archives served over HTTP: yields (base URL, folder, {corpus: archive path})."""
    folder = tmp_path_factory.mktemp("mirror")
    archives = write_all(folder)
    write_wrong_layout_zip(folder / "flat.zip")
    (folder / "error-page.zip").write_text("<html><body>404 Not Found</body></html>\n")
    with serve_directory(folder) as url:
        yield url, folder, archives


@pytest.fixture(scope="module")
def prepared(mirror, tmp_path_factory):
    """prepare.sh run once for each corpus (over HTTP, with the stand-in's MD5): {corpus: (data dir, output)}."""
    url, folder, archives = mirror
    root = tmp_path_factory.mktemp("data")
    result = {}
    for corpus, (archive, url_var, md5_var, _, _) in CORPORA.items():
        data_dir = root / corpus
        proc = ok(run_script(f"{corpus}/prepare.sh", data_dir,
                             env={url_var: f"{url}/{archive}", md5_var: md5(archives[corpus])}))
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


# ------------------------------------------------------------------------------------------------ prepare.sh

@pytest.mark.parametrize("corpus", list(CORPORA))
def test_prepare_downloads_checks_and_binarizes(corpus, prepared, mirror, tmp_path):
    data_dir, output = prepared[corpus]
    archive, _, _, text_folder, files = CORPORA[corpus]
    _, _, archives = mirror
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


def test_prepare_rerun_skips_finished_steps(prepared, tmp_path):
    data_dir = tmp_path / "wikitext-2"
    shutil.copytree(prepared["wikitext-2"][0], data_dir)
    before = {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()}
    # a rerun neither downloads (the URL now points at a closed port) nor unpacks nor binarizes again
    proc = ok(run_script("wikitext-2/prepare.sh", data_dir, env={"WIKITEXT2_URL": closed_port_url("x.zip")}))
    for step in ("download", "unpack", "binarize"):
        assert f"skip {step}" in proc.stdout
    assert {p: p.stat().st_mtime_ns for p in data_dir.rglob("*") if p.is_file()} == before
    # with the binarized data removed, only that step runs again, and gives the same files
    dictionary = (data_dir / "data-bin" / "dict.txt").read_bytes()
    train = (data_dir / "data-bin" / "train.bin").read_bytes()
    shutil.rmtree(data_dir / "data-bin")
    proc = ok(run_script("wikitext-2/prepare.sh", data_dir, env={"WIKITEXT2_URL": closed_port_url("x.zip")}))
    assert "skip download" in proc.stdout and "skip unpack" in proc.stdout and "skip binarize" not in proc.stdout
    assert (data_dir / "data-bin" / "dict.txt").read_bytes() == dictionary
    assert (data_dir / "data-bin" / "train.bin").read_bytes() == train
    assert not leftovers(data_dir)


def test_prepare_unreachable_url_fails_clearly_and_leaves_nothing(tmp_path):
    url = closed_port_url("wikitext-103-v1.zip")
    data_dir = tmp_path / "new" / "wikitext-103"
    proc = run_script("wikitext-103/prepare.sh", data_dir, env={"WIKITEXT103_URL": url})
    assert proc.returncode != 0
    assert f"error: download of {url} failed" in proc.stderr
    assert "WIKITEXT103_URL" in proc.stderr  # says how to point it elsewhere
    assert not (tmp_path / "new").exists()
    # a data directory that existed before is kept, and holds no partial download
    existing = tmp_path / "existing"
    existing.mkdir()
    proc = run_script("ptb/prepare.sh", existing, env={"PTB_URL": closed_port_url("simple-examples.tgz")})
    assert proc.returncode != 0 and "error: download of" in proc.stderr and "PTB_URL" in proc.stderr
    assert list(existing.iterdir()) == []


@pytest.mark.parametrize("served, message", [
    ("flat.zip", "unexpected layout of wikitext-103-v1.zip"),
    ("error-page.zip", "cannot unpack"),
])
def test_prepare_wrong_archive_fails_clearly_and_leaves_nothing(served, message, mirror, tmp_path):
    url, _, _ = mirror
    data_dir = tmp_path / "wt103"
    proc = run_script("wikitext-103/prepare.sh", data_dir,
                      env={"WIKITEXT103_URL": f"{url}/{served}", "WIKITEXT103_MD5": ""})
    assert proc.returncode != 0
    assert message in proc.stderr
    if served == "flat.zip":  # names the file it expected and what it found instead
        assert "wikitext-103/wiki.train.tokens is missing" in proc.stderr
        assert "the archive holds: wiki.test.tokens wiki.train.tokens wiki.valid.tokens" in proc.stderr
    assert not data_dir.exists()


def test_prepare_checks_the_known_checksum_by_default(mirror, tmp_path):
    url, _, archives = mirror
    data_dir = tmp_path / "wt2"
    # no WIKITEXT2_MD5: the original release's MD5 applies, which the stand-in does not have
    proc = run_script("wikitext-2/prepare.sh", data_dir, env={"WIKITEXT2_URL": f"{url}/wikitext-2-v1.zip"})
    assert proc.returncode != 0
    assert f"checksum mismatch for {url}/wikitext-2-v1.zip: MD5 {md5(archives['wikitext-2'])}, expected " \
           f"542ccefacc6c27f945fb54453812b3cd" in proc.stderr
    assert "WIKITEXT2_MD5" in proc.stderr
    assert not data_dir.exists()


@pytest.mark.parametrize("script", sorted(str(p.relative_to(RECIPES)) for p in RECIPES.glob("*/*.sh")))
def test_every_script_has_usage_and_strict_mode(script):
    text = (RECIPES / script).read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    proc = ok(run_script(script, "-h"))
    assert proc.stdout.startswith("Usage: ")


def test_unknown_config_and_missing_data_fail_clearly(tmp_path):
    proc = run_script("ptb/train.sh", "-d", tmp_path, "awd_lstm")
    assert proc.returncode != 0 and "unknown CONFIG 'awd_lstm'" in proc.stderr
    proc = run_script("ptb/train.sh", "-d", tmp_path, "-s", tmp_path / "ck", "awd_lstm_lm")
    assert proc.returncode != 0 and f"no binarized data in {tmp_path}/data-bin" in proc.stderr
    proc = run_script("wikitext-103/eval.sh", "-s", tmp_path, "r3")
    assert proc.returncode != 0 and f"{tmp_path}/r3/checkpoint_best.pt not found" in proc.stderr


# ------------------------------------------------------------------------------------------ train.sh configs

# Parses each config's fairseq-train command with fairseq's own parser (arch defaults applied, then the
# dataclass config built), and reads the learning rate per epoch from the scheduler the command asks for.
PARSE_COMMANDS = r"""
import json, sys
import torch
from fairseq import optim, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim import lr_scheduler
result = {}
for name, argv in json.load(sys.stdin).items():
    try:
        args = options.parse_args_and_arch(options.get_training_parser(), argv)
        cfg = convert_namespace_to_omegaconf(args)
    except SystemExit as error:
        result[name] = {"error": f"argparse exit {error.code}"}
        continue
    info = {key: str(getattr(args, key, None)) for key in (
        "arch", "task", "criterion", "optimizer", "lr_scheduler", "max_epoch", "max_update", "batch_size",
        "batch_size_valid", "tokens_per_sample", "clip_norm", "weight_decay", "seed", "ddp_backend", "dropout",
        "variable_bptt", "awd_input_dropout", "awd_hidden_dropout", "awd_output_dropout",
        "awd_embed_dropout", "awd_weight_drop", "awd_ar_alpha", "awd_tar_beta", "define_n",
        "define_depth", "decoder_embed_dim", "decoder_layers", "adaptive_softmax_cutoff", "lr_patience",
        "lr_shrink", "save_dir", "max_tokens", "update_freq", "momentum", "adam_betas", "adam_eps",
        "sentence_avg", "mogrifier_l2_penalty", "mogrifier_drop_state_probability",
        "load_checkpoint_on_all_dp_ranks")}
    if args.lr_scheduler == "fixed":
        sgd = optim.build_optimizer(cfg.optimizer, [torch.nn.Parameter(torch.zeros(1))])
        scheduler = lr_scheduler.build_lr_scheduler(cfg.lr_scheduler, sgd)
        info["lr_by_epoch"] = [scheduler.step_begin_epoch(epoch) for epoch in range(1, 21)]
    else:
        info["lr"] = list(args.lr)
    result[name] = info
print(json.dumps(result))
"""


def dry_run(config, *extra, save_root="ck"):
    corpus, name = config.split("/")
    proc = ok(run_script(f"{corpus}/train.sh", "-n", "-d", "data", "-s", save_root, name, *extra))
    return training_arguments(proc.stdout)


def parse_commands(commands):
    proc = subprocess.run([sys.executable, "-c", PARSE_COMMANDS], input=json.dumps(commands), capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_config_is_a_valid_fairseq_command_with_the_papers_settings():
    available = {config: model for config, model in CONFIG_MODEL.items() if not missing_files(model)}
    if not available:
        pytest.skip("no model of the recipes is written yet")
    commands = {config: dry_run(config) for config in available}
    commands["override"] = dry_run("ptb/awd_lstm_lm", "--max-epoch", "3", "--lr", "7", save_root="elsewhere")
    parsed = parse_commands(commands)
    errors = {config: info["error"] for config, info in parsed.items() if "error" in info}
    assert not errors, errors
    for config, info in parsed.items():
        # every GPU process reads checkpoint_last.pt itself (fairseq's broadcast of it fails with torch >= 2.6)
        assert info["load_checkpoint_on_all_dp_ranks"] == "True"
        if config == "override":
            continue
        corpus, name = config.split("/")
        assert info["save_dir"] == f"ck/{name}"  # one checkpoint folder per config
        if name.startswith("r"):  # Table 9: SGD lr 20, / 10 after epoch 15, 20 epochs, BPTT 140, batch 60
            assert info["lr_by_epoch"] == [20.0] * 15 + [2.0] * 5
            assert (info["task"], info["max_epoch"]) == ("stateful_lm", "20")
            assert (info["optimizer"], info["momentum"]) == ("nag", "0.0")  # plain SGD
            assert (info["tokens_per_sample"], info["batch_size"], info["batch_size_valid"]) == ("140", "60", "10")
            assert (info["weight_decay"], info["clip_norm"], info["dropout"]) == ("0.0", "0.25", "0.1")
            assert info["criterion"] == ("cross_entropy" if name == "r1" else "adaptive_loss")
            if name != "r1":
                assert info["ddp_backend"] == "legacy_ddp"
        elif name.startswith("transformer"):  # fairseq's adaptive-input recipe
            assert (info["task"], info["criterion"], info["optimizer"]) == ("language_modeling", "adaptive_loss", "nag")
            assert (info["max_update"], info["tokens_per_sample"], info["max_tokens"]) == ("286000", "3072", "3072")
        elif name in LAMB_LR_L2:  # the official Mogrifier code's settings (lamb's tuned configs)
            lr, l2 = LAMB_LR_L2[name]
            assert (info["task"], info["criterion"], info["sentence_avg"]) == ("stateful_lm", "lm_regularized_loss",
                                                                               "True")
            assert (info["optimizer"], info["adam_betas"], info["adam_eps"]) == ("adam", "(0, 0.999)", "1e-08")
            assert (info["weight_decay"], info["clip_norm"], info["lr_scheduler"]) == ("0.0", "10.0", "fixed")
            assert info["lr_by_epoch"] == [float(lr)] * 20 and info["mogrifier_l2_penalty"] == l2
            assert (info["batch_size"], info["tokens_per_sample"], info["max_update"]) == ("64", "70", "200000")
            assert (info["seed"], info["mogrifier_drop_state_probability"]) == ("1", "0.01")
        else:  # AWD-LSTM's settings for the corpus
            batch, dropouti, dropouth, epochs, seed = {"ptb": ("20", "0.4", "0.25", "500", "141"),
                                                       "wikitext-2": ("80", "0.65", "0.2", "750", "1882")}[corpus]
            assert (info["task"], info["criterion"]) == ("stateful_lm", "lm_regularized_loss")
            assert (info["optimizer"], info["momentum"]) == ("nag", "0.0")
            assert info["lr"] == [30.0] and info["lr_scheduler"] == "reduce_lr_on_plateau"
            assert (info["batch_size"], info["batch_size_valid"], info["tokens_per_sample"]) == (batch, "10", "70")
            assert (info["max_epoch"], info["seed"], info["variable_bptt"]) == (epochs, seed, "True")
            assert (info["clip_norm"], info["weight_decay"]) == ("0.25", "1.2e-06")
            assert (info["awd_input_dropout"], info["awd_hidden_dropout"]) == (dropouti, dropouth)
            assert (info["awd_output_dropout"], info["awd_embed_dropout"]) == ("0.4", "0.1")
            assert info["awd_weight_drop"] == "0.5"
            assert (info["awd_ar_alpha"], info["awd_tar_beta"]) == ("2.0", "1.0")
    # arguments after the config win over the recipe's
    assert parsed["override"]["max_epoch"] == "3" and parsed["override"]["lr"] == [7.0]
    assert parsed["override"]["save_dir"] == "elsewhere/awd_lstm_lm"


def test_nag_without_momentum_is_plain_sgd():
    """The recipes' SGD is fairseq's nag with --momentum 0: the same steps as torch's SGD (with weight decay),
    also when the learning rate changes between steps. In float64: the two order their operations differently, and
    in float32 steps of 30 x the gradient leave rounding differences of a few units in the last place of values
    near 100, larger than a float32 tolerance for the smaller entries."""
    import torch
    from fairseq.optim.nag import NAG
    torch.manual_seed(0)
    start = torch.randn(5, 3, dtype=torch.float64)
    ours, reference = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    nag = NAG([ours], lr=30.0, momentum=0.0, weight_decay=1.2e-3)
    sgd = torch.optim.SGD([reference], lr=30.0, momentum=0.0, weight_decay=1.2e-3)
    for step, lr in enumerate([30.0, 30.0, 3.0, 0.3]):
        for optimizer in (nag, sgd):
            optimizer.param_groups[0]["lr"] = lr
        grad = torch.randn(5, 3).double()  # float32 values: nag reads the gradient in float32, losslessly
        ours.grad, reference.grad = grad.clone(), grad.clone()
        nag.step()
        sgd.step()
        torch.testing.assert_close(ours.data, reference.data, rtol=1e-10, atol=1e-10, msg=f"step {step}")


# ------------------------------------------------------------------------------------- train.sh + eval.sh

# Tiny models: the arch's structure with small widths, the recipe's optimisation settings, one epoch on CPU.
TINY = {
    "wikitext-103/r3": ["--define-n", "16", "--decoder-embed-dim", "16", "--define-k", "32",
                        "--decoder-hidden-size", "32", "--decoder-layers", "2",
                        "--adaptive-input-cutoff", "20,40", "--adaptive-softmax-cutoff", "20,40",
                        "--batch-size", "4", "--tokens-per-sample", "35", "--max-epoch", "1"],
    "wikitext-103/transformer_lm_define_wiki103": [
        "--decoder-layers", "1", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
        "--decoder-attention-heads", "2", "--define-n", "16", "--define-k", "32",
        "--adaptive-input-cutoff", "20,40", "--adaptive-softmax-cutoff", "20,40",
        "--tokens-per-sample", "64", "--max-tokens", "256", "--update-freq", "1", "--max-update", "2",
        "--warmup-updates", "1"],
    "ptb/awd_lstm_lm": ["--define-n", "16", "--decoder-embed-dim", "16", "--decoder-hidden-size", "32",
                        "--decoder-layers", "2", "--max-epoch", "1"],
    "wikitext-2/awd_lstm_lm_define": ["--define-n", "16", "--define-k", "32", "--define-depth", "3",
                                      "--decoder-embed-dim", "16", "--decoder-hidden-size", "32",
                                      "--decoder-layers", "2", "--batch-size", "10", "--max-epoch", "1"],
}
# (--data-buffer-size 0: batches collated in the main thread, see SHUTDOWN_ABORT in conftest.py)
CPU = ["--cpu", "--num-workers", "0", "--data-buffer-size", "0"]
# the transformer's evaluation blocks (3072 tokens, context 2560) shrunk to the tiny model's 64 positions
EVAL_EXTRA = {"wikitext-103/transformer_lm_define_wiki103": ["--tokens-per-sample", "64", "--context-window", "32",
                                                            "--max-tokens", "256"]}


@pytest.mark.parametrize("config", list(TINY))
def test_train_then_eval(config, prepared, tmp_path):
    skip_unless_available(CONFIG_MODEL[config])
    corpus, name = config.split("/")
    data_dir = prepared[corpus][0]
    save_root = tmp_path / "checkpoints"
    proc = ok(run_script(f"{corpus}/train.sh", "-d", data_dir, "-s", save_root, name, *TINY[config], *CPU))
    save_dir = save_root / name
    assert (save_dir / "checkpoint_best.pt").is_file() and (save_dir / "checkpoint_last.pt").is_file()
    assert "done training" in (save_dir / "train.log").read_text()
    assert (save_dir / ".done" / "train").is_file()
    # a rerun does not train again
    stamp = (save_dir / "checkpoint_last.pt").stat().st_mtime_ns
    proc = ok(run_script(f"{corpus}/train.sh", "-d", data_dir, "-s", save_root, name, *TINY[config], *CPU))
    assert "skip training" in proc.stdout and "done training" not in proc.stdout
    assert (save_dir / "checkpoint_last.pt").stat().st_mtime_ns == stamp
    if config == "ptb/awd_lstm_lm":  # an unfinished run (no marker) resumes from checkpoint_last.pt
        (save_dir / ".done" / "train").unlink()
        ok(run_script(f"{corpus}/train.sh", "-d", data_dir, "-s", save_root, name, *TINY[config], *CPU,
                      "--max-epoch", "2"))
        log = (save_dir / "train.log").read_text()
        assert "Loaded checkpoint" in log and "| epoch 002 |" in log and "| epoch 001 |" in log
        assert log.count("done training") == 2 and (save_dir / ".done" / "train").is_file()

    extra = EVAL_EXTRA.get(config, []) + ["--cpu"]
    proc = ok(run_script(f"{corpus}/eval.sh", "-d", data_dir, "-s", save_root, name, *extra))
    files = CORPORA[corpus][4][1:]  # valid, test
    results = save_dir / "checkpoint_best.eval.txt"
    assert results.read_text().splitlines()[1:] == proc.stdout.strip().splitlines()[-2:]
    for split, name_of_file in zip(("valid", "test"), files):
        match = re.search(rf"^{split} +perplexity ([0-9.]+) +\(loss ([0-9.]+) bits/token", proc.stdout, re.M)
        assert match, proc.stdout
        ppl, loss = map(float, match.groups())
        assert ppl == pytest.approx(2 ** loss, rel=1e-3)
        assert 1 < ppl < 10 * 200  # a barely trained model on a ~200-word vocabulary
        # every token of the split was scored once, as a plain count of the raw text says
        log = (save_dir / f"checkpoint_best.eval.{split}.log").read_text()
        evaluated = int(re.search(r"Evaluated ([0-9,]+) tokens", log).group(1).replace(",", ""))
        assert evaluated == raw_token_count(data_dir / CORPORA[corpus][3] / name_of_file)
        if not name.startswith("transformer"):  # the paper's evaluation batches: valid 10 streams, test 1
            assert f"--batch-size {10 if split == 'valid' else 1}" in results.read_text().splitlines()[0]
    # the same checkpoint given as a file reuses the results; FORCE=1 recomputes the same numbers
    again = ok(run_script(f"{corpus}/eval.sh", "-d", data_dir, save_dir / "checkpoint_best.pt", *extra))
    assert "skip evaluation" in again.stdout
    assert again.stdout.strip().splitlines()[-2:] == proc.stdout.strip().splitlines()[-2:]
    if config == "ptb/awd_lstm_lm":
        forced = ok(run_script(f"{corpus}/eval.sh", "-d", data_dir, "-s", save_root, name, *extra,
                               env={"FORCE": "1"}))
        assert "skip" not in forced.stdout
        assert forced.stdout.strip().splitlines()[-2:] == proc.stdout.strip().splitlines()[-2:]
    assert not leftovers(save_dir)


# A Mogrifier config, tiny: train.sh, then eval.sh with and without the softmax temperature tuned on valid.
MOGRIFIER_TINY = ["--mogrifier-hidden-size", "16", "--mogrifier-rank", "4", "--batch-size", "8",
                  "--batch-size-valid", "8", "--tokens-per-sample", "35", "--max-update", "3"]


def test_mogrifier_eval_reports_perplexity_without_and_with_the_tuned_temperature(prepared, tmp_path):
    skip_unless_available("mogrifier_lstm_lm")
    data_dir = prepared["ptb"][0]
    save_root = tmp_path / "checkpoints"
    ok(run_script("ptb/train.sh", "-d", data_dir, "-s", save_root, "mogrifier_lstm_lm_ptb", *MOGRIFIER_TINY, *CPU))
    save_dir = save_root / "mogrifier_lstm_lm_ptb"
    assert "done training" in (save_dir / "train.log").read_text()
    env = {"TEMPERATURES": "1.0 1.7"}
    proc = ok(run_script("ptb/eval.sh", "-d", data_dir, "-s", save_root, "mogrifier_lstm_lm_ptb", "--cpu", env=env))
    searched = {float(t): float(ppl) for t, ppl in re.findall(r"^ +T = ([0-9.]+): valid perplexity ([0-9.]+)$",
                                                              proc.stdout, re.M)}
    assert set(searched) == {1.0, 1.7}
    best = min(searched, key=searched.get)
    tail = proc.stdout.strip().splitlines()[-7:]
    assert tail[1] == "without softmax temperature (T = 1):"
    assert tail[4] == "with the softmax temperature tuned on valid (the Mogrifier paper's protocol):"
    plain = {line.split()[0]: float(line.split()[2]) for line in tail[2:4]}
    tuned = {line.split()[0]: float(line.split()[2]) for line in tail[5:]}
    assert list(plain) == list(tuned) == ["valid", "test"]
    assert tuned["valid"] == searched[best] == min(searched.values())
    assert plain["valid"] == pytest.approx(searched[1.0], rel=1e-3)  # T = 1 through --model-overrides: no change
    assert tail[0].startswith("==> results of ") and f"softmax temperature T = {best}, tuned on valid" in tail[-1]
    test_log = next(save_dir.glob("checkpoint_best.eval.temperature.test.T*.log"))
    assert float(re.search(r"\.T([0-9.]+)\.log$", test_log.name).group(1)) == best
    assert "Perplexity" in test_log.read_text()
    if best != 1.0:
        assert tuned["test"] != plain["test"]
    # a rerun reuses both results
    again = ok(run_script("ptb/eval.sh", "-d", data_dir, "-s", save_root, "mogrifier_lstm_lm_ptb", "--cpu", env=env))
    assert "skip evaluation" in again.stdout and "skip temperature search" in again.stdout
    assert again.stdout.strip().splitlines()[-7:] == tail
    assert not leftovers(save_dir)
