"""The gated convolutional LM recipes, offline: recipes/gbw/{prepare,train,eval}.sh and the gcnn_lm_8, gcnn_lm_14
and fconv_lm_dauphin_wikitext103 configs of recipes/wikitext-103/{train,eval}.sh.

Stand-in archives with the real names and layout (``recipe_mirror.py``) are served from 127.0.0.1. prepare.sh
must assemble the Google Billion Word splits from the right shards and drop the words seen fewer than 3 times;
every config's command must carry the paper's settings (parsed by fairseq's own parser); a failed download or a
wrong archive must leave nothing behind; one tiny model per corpus goes through train.sh and eval.sh, whose
perplexity must cover every token of the split and equal a plain re-computation of the evaluation the paper
describes (GBW: each sentence on its own; WikiText-103: the split as one stream).
"""

import math
import re
import tarfile
from collections import Counter
from pathlib import Path

import pytest
from conftest import needs_fairseq_eos_blocks, training_arguments
from recipe_mirror import (
    GBW_HELDOUT_SHARDS,
    GBW_LONG_SENTENCE,
    GBW_TOP,
    GBW_TRAIN_SHARDS,
    closed_port_url,
    serve_directory,
    write_gbw_tgz,
    write_wikitext_zip,
)
from recipe_runs import leftovers, md5, ok, parse_commands, run_recipe

GBW_ARCHIVE = f"{GBW_TOP}.tar.gz"


def gbw_members(archive):
    """{path below the top folder: text} of a GBW archive, read with Python's tarfile."""
    with tarfile.open(archive) as tar:
        return {
            member.name.split("/", 1)[1]: tar.extractfile(member).read().decode()
            for member in tar.getmembers()
            if member.isfile()
        }


def evaluated_tokens(log):
    return int(re.search(r"Evaluated ([0-9,]+) tokens", Path(log).read_text()).group(1).replace(",", ""))


def split_results(stdout):
    """{split: (perplexity, loss in bits)} from eval.sh's output."""
    found = re.findall(r"^(valid|test) +perplexity ([0-9.]+) +\(loss ([0-9.]+) bits/token", stdout, re.M)
    return {split: (float(ppl), float(loss)) for split, ppl, loss in found}


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """The stand-in archives served over HTTP, plus damaged GBW copies: yields (base URL, folder)."""
    folder = tmp_path_factory.mktemp("mirror")
    write_gbw_tgz(folder / GBW_ARCHIVE)
    write_gbw_tgz(folder / "gbw-missing-shard.tar.gz", missing=(GBW_TRAIN_SHARDS[56],))
    (folder / "gbw-error-page.tar.gz").write_text("<html><body>404 Not Found</body></html>\n")
    write_wikitext_zip(folder / "wikitext-103-v1.zip", "wikitext-103", seed=0)
    with serve_directory(folder) as url:
        yield url, folder


@pytest.fixture(scope="module")
def gbw_data(mirror, tmp_path_factory):
    """recipes/gbw/prepare.sh run once over HTTP with the stand-in's MD5: (data dir, its output)."""
    url, folder = mirror
    data_dir = tmp_path_factory.mktemp("data") / "gbw"
    proc = ok(
        run_recipe(
            "gbw/prepare.sh", data_dir, env={"GBW_URL": f"{url}/{GBW_ARCHIVE}", "GBW_MD5": md5(folder / GBW_ARCHIVE)}
        )
    )
    return data_dir, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def wt103_data(mirror, tmp_path_factory):
    url, folder = mirror
    data_dir = tmp_path_factory.mktemp("data") / "wikitext-103"
    ok(
        run_recipe(
            "wikitext-103/prepare.sh",
            data_dir,
            env={
                "WIKITEXT103_URL": f"{url}/wikitext-103-v1.zip",
                "WIKITEXT103_MD5": md5(folder / "wikitext-103-v1.zip"),
            },
        )
    )
    return data_dir


# ------------------------------------------------------------------------------------------- gbw/prepare.sh


def test_gbw_prepare_assembles_the_splits_and_keeps_words_seen_three_times(gbw_data, mirror):
    from fairseq.data import Dictionary, data_utils

    data_dir, output = gbw_data
    _, folder = mirror
    assert (data_dir / GBW_ARCHIVE).read_bytes() == (folder / GBW_ARCHIVE).read_bytes()
    assert "no checksum to verify" not in output  # the MD5 given was checked
    assert "--thresholdsrc 3" in output
    # train = the 99 training shards in order; valid = held-out shard 1; test = held-out shard 0 (the benchmark's)
    members = gbw_members(folder / GBW_ARCHIVE)
    text_dir = data_dir / "gbw"
    assert sorted(p.name for p in text_dir.iterdir()) == ["test.txt", "train.txt", "valid.txt"]
    assert (text_dir / "train.txt").read_text() == "".join(members[name] for name in GBW_TRAIN_SHARDS)
    assert (text_dir / "valid.txt").read_text() == members[GBW_HELDOUT_SHARDS[1]]
    assert (text_dir / "test.txt").read_text() == members[GBW_HELDOUT_SHARDS[0]]
    assert not leftovers(data_dir) and not (data_dir / "unpack.tmp").exists()

    # the dictionary: exactly the training words seen at least 3 times, with their counts
    counts = Counter((text_dir / "train.txt").read_text().split())
    data_bin = data_dir / "data-bin"
    entries = dict(line.split() for line in (data_bin / "dict.txt").read_text().splitlines())
    kept = {word: int(count) for word, count in entries.items() if not word.startswith("madeupword")}
    assert kept == {word: count for word, count in counts.items() if count >= 3}
    assert any(count < 3 for count in counts.values())  # the stand-in has rare words to drop

    # every split binarized from its own file; the words kept out of the dictionary are <unk>
    dictionary = Dictionary.load(str(data_bin / "dict.txt"))
    for split in ("train", "valid", "test"):
        dataset = data_utils.load_indexed_dataset(str(data_bin / split), dictionary)
        lines = (text_dir / f"{split}.txt").read_text().splitlines()
        assert len(dataset) == len(lines)
        for i, line in enumerate(lines):
            expected = [dictionary.index(w) if counts[w] >= 3 else dictionary.unk() for w in line.split()]
            assert dataset[i].tolist() == expected + [dictionary.eos()], (split, i)

    # a rerun skips every step (the URL now points at a closed port)
    proc = ok(run_recipe("gbw/prepare.sh", data_dir, env={"GBW_URL": closed_port_url(GBW_ARCHIVE)}))
    assert all(f"skip {step}" in proc.stdout for step in ("download", "unpack", "binarize"))


@pytest.mark.parametrize(
    "served, message",
    [
        (None, "error: download of {url} failed"),
        ("gbw-missing-shard.tar.gz", f"{GBW_TOP}/{GBW_TRAIN_SHARDS[56]} is missing or empty"),
        ("gbw-error-page.tar.gz", "cannot unpack"),
        (GBW_ARCHIVE, "checksum mismatch for {url}"),
    ],
)
def test_gbw_prepare_failures_leave_nothing_behind(served, message, mirror, tmp_path):
    base, _ = mirror
    url = closed_port_url(GBW_ARCHIVE) if served is None else f"{base}/{served}"
    env = {"GBW_URL": url, "GBW_MD5": "0" * 32 if served == GBW_ARCHIVE else ""}
    data_dir = tmp_path / "new" / "gbw"
    proc = run_recipe("gbw/prepare.sh", data_dir, env=env)
    assert proc.returncode != 0
    assert message.format(url=url) in proc.stderr
    assert "GBW_URL" in proc.stderr or "GBW_MD5" in proc.stderr  # says what to change
    if served == "gbw-missing-shard.tar.gz":  # names what it expected
        assert f"Expected the 101 files {GBW_TOP}/{{{GBW_TRAIN_SHARDS[0]},...,{GBW_HELDOUT_SHARDS[0]}}}" in proc.stderr
    assert not (tmp_path / "new").exists()
    # a data directory that existed before is kept, and holds nothing of the failed run
    existing = tmp_path / "existing"
    existing.mkdir()
    assert run_recipe("gbw/prepare.sh", existing, env=env).returncode != 0
    assert list(existing.iterdir()) == []


# ---------------------------------------------------------------------------------------- train.sh commands

PARSE_COMMANDS = r"""
import json, sys
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
MODEL_KEYS = ("dropout", "adaptive_softmax_cutoff", "decoder_embed_dim", "gcnn_layers", "decoder_layers",
              "gcnn_residual_scale", "gcnn_no_weight_norm", "gcnn_activation")
OTHER_KEYS = ("arch", "task", "sample_break_mode", "tokens_per_sample", "max_tokens", "criterion", "ddp_backend",
              "optimizer", "momentum", "lr", "clip_norm", "weight_decay", "lr_scheduler", "lr_shrink", "max_epoch",
              "skip_invalid_size_inputs_valid_test", "save_dir", "update_freq")
result = {}
for name, argv in json.load(sys.stdin).items():
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    info = {key: getattr(args, key, None) for key in OTHER_KEYS}
    # the model's settings as the model will get them: its dataclass defaults under the arch's and the command's
    for key in MODEL_KEYS:
        try:
            info[key] = getattr(cfg.model, key)
        except AttributeError:
            info[key] = None
    result[name] = info
print(json.dumps(result, default=str))
"""
WT103_CONFIGS = ("gcnn_lm_8", "gcnn_lm_14", "fconv_lm_dauphin_wikitext103")
GBW_CONFIGS = ("gcnn_lm_13", "gcnn_lm_14b", "gcnn_lm_8b")


def dry_run(corpus, config, *extra):
    proc = ok(run_recipe(f"{corpus}/train.sh", "-n", "-d", "data", "-s", "ck", config, *extra))
    assert proc.stderr == ""
    return training_arguments(proc.stdout)


def test_every_config_carries_the_papers_settings():
    from define_fairseq.models import gcnn_lm

    commands = {f"wikitext-103/{c}": dry_run("wikitext-103", c) for c in WT103_CONFIGS}
    commands.update({f"gbw/{c}": dry_run("gbw", c) for c in GBW_CONFIGS})
    commands["override"] = dry_run("gbw", "gcnn_lm_13", "--max-tokens", "2048", "--lr", "2", "--update-freq", "8")
    parsed = parse_commands(PARSE_COMMANDS, commands)
    layers = {
        "gcnn_lm_8": (280, gcnn_lm.GCNN_8),
        "gcnn_lm_14": (280, gcnn_lm.GCNN_14),
        "gcnn_lm_13": (128, gcnn_lm.GCNN_13),
        "gcnn_lm_14b": (128, gcnn_lm.GCNN_14B),
        "gcnn_lm_8b": (128, gcnn_lm.GCNN_8B),
    }
    for name, info in parsed.items():
        if name == "override":
            continue
        corpus, config = name.split("/")
        assert info["arch"] == config and info["save_dir"] == f"ck/{config}"
        # the paper: Nesterov momentum 0.99, lr 1, gradient norm clipped at 0.1; adaptive softmax
        assert (info["optimizer"], info["momentum"], info["lr"], info["clip_norm"]) == ("nag", 0.99, [1.0], 0.1)
        assert (info["criterion"], info["ddp_backend"], info["task"]) == (
            "adaptive_loss",
            "legacy_ddp",
            "language_modeling",
        )
        assert (info["lr_scheduler"], info["lr_shrink"], info["max_epoch"]) == ("reduce_lr_on_plateau", 0.5, 35)
        if config.startswith("fconv"):  # fairseq's README.conv.md command
            assert (info["dropout"], info["weight_decay"]) == (0.2, 5e-06)
            assert info["adaptive_softmax_cutoff"] == "10000,20000,200000"
            assert (info["max_tokens"], info["tokens_per_sample"], info["sample_break_mode"]) == (1024, 1024, "none")
            assert info["decoder_layers"].startswith("[(850, 6)] * 3")
            continue
        # our model as the paper draws it: weight norm, GLU, unscaled residuals, no dropout or weight decay
        assert (info["dropout"], info["weight_decay"]) == (0.0, 0.0)
        assert (info["gcnn_no_weight_norm"], info["gcnn_activation"], info["gcnn_residual_scale"]) == (
            False,
            "glu",
            1.0,
        )
        assert (info["decoder_embed_dim"], info["gcnn_layers"]) == layers[config]
        if corpus == "wikitext-103":  # contiguous 1024-token blocks, 1024 tokens per GPU (README.conv.md)
            assert info["adaptive_softmax_cutoff"] == "10000,20000,200000"
            assert (info["max_tokens"], info["tokens_per_sample"], info["sample_break_mode"]) == (1024, 1024, "none")
        else:  # one sentence per row; validation skips what the model could not take
            assert info["adaptive_softmax_cutoff"] == "10000,50000,200000"
            assert (info["max_tokens"], info["tokens_per_sample"], info["sample_break_mode"]) == (4096, 4096, "eos")
            assert info["skip_invalid_size_inputs_valid_test"] is True
    override = parsed["override"]  # arguments after the config win over the recipe's
    assert (override["max_tokens"], override["lr"], override["update_freq"]) == (2048, [2.0], [8])


# ------------------------------------------------------------------------------------- train.sh + eval.sh

# (--data-buffer-size 0: batches collated in the main thread, see SHUTDOWN_ABORT in conftest.py)
TINY = [
    "--decoder-embed-dim",
    "16",
    "--gcnn-layers",
    "[(16, 3)] * 2 + [[(8, 1), (8, 3), (24, 1)]]",
    "--adaptive-softmax-cutoff",
    "20,40",
    "--max-update",
    "2",
    "--cpu",
    "--num-workers",
    "0",
    "--no-save-optimizer-state",
    "--data-buffer-size",
    "0",
]


def load_model(checkpoint):
    from fairseq import checkpoint_utils

    import define_fairseq  # noqa: F401  (registers the architectures the checkpoint names)

    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)])
    return model.eval(), task.target_dictionary


def nll_bits(model, inputs, targets):
    """Summed negative log-likelihood in bits of ``targets`` given ``inputs`` (1-D, one sequence)."""
    import torch

    with torch.no_grad():
        lp = model.get_normalized_probs(model(inputs[None]), log_probs=True, sample={"target": targets[None]})
    return -lp.gather(-1, targets[None, :, None]).sum().item() / math.log(2)


def train_then_eval(corpus, config, data_dir, save_root, *train_args):
    ok(run_recipe(f"{corpus}/train.sh", "-d", data_dir, "-s", save_root, config, *TINY, *train_args))
    save_dir = save_root / config
    assert "done training" in (save_dir / "train.log").read_text() and (save_dir / ".done" / "train").is_file()
    proc = ok(run_recipe(f"{corpus}/eval.sh", "-d", data_dir, "-s", save_root, config, "--cpu"))
    results = split_results(proc.stdout)
    assert list(results) == ["valid", "test"]
    for ppl, loss in results.values():
        assert ppl == pytest.approx(2**loss, rel=1e-3) and 1 < ppl < 1000
    assert not leftovers(save_dir)
    signature = (save_dir / "checkpoint_best.eval.txt").read_text().splitlines()[0]
    return save_dir, results, signature


@pytest.mark.slow
@needs_fairseq_eos_blocks
def test_gbw_scores_every_sentence_on_its_own(gbw_data, tmp_path):
    """gcnn_lm_14b shrunk; trained on rows of at most 32 tokens, yet eval.sh scores the 90-word test sentence."""
    import torch
    from fairseq.data import data_utils

    data_dir = gbw_data[0]
    save_dir, results, signature = train_then_eval(
        "gbw", "gcnn_lm_14b", data_dir, tmp_path / "ck", "--tokens-per-sample", "32", "--max-tokens", "256"
    )
    assert "--sample-break-mode eos" in signature and "skip-invalid" not in signature
    model, dictionary = load_model(save_dir / "checkpoint_best.pt")
    for split in ("valid", "test"):
        lines = (data_dir / "gbw" / f"{split}.txt").read_text().splitlines()
        assert max(len(line.split()) for line in lines) == GBW_LONG_SENTENCE
        # every word and every end of sentence was scored: nothing dropped, however long
        assert evaluated_tokens(save_dir / f"checkpoint_best.eval.{split}.log") == sum(
            len(line.split()) + 1 for line in lines
        )
        # = each sentence scored on its own from a zero-padded start, the end of sentence as its first input
        dataset = data_utils.load_indexed_dataset(str(data_dir / "data-bin" / split), dictionary)
        total = tokens = 0
        for i in range(len(dataset)):
            sentence = dataset[i].long()
            total += nll_bits(model, torch.cat([sentence.new_tensor([dictionary.eos()]), sentence[:-1]]), sentence)
            tokens += len(sentence)
        assert results[split][1] == pytest.approx(total / tokens, abs=2e-4)


@pytest.mark.slow
def test_wikitext103_gcnn_scores_the_split_as_one_stream(wt103_data, tmp_path):
    """gcnn_lm_14 shrunk: rows of 960 tokens after a 64-token context give the perplexity of one pass over the
    whole split (the tiny model sees 7 tokens)."""
    import torch
    from fairseq.data import data_utils

    save_dir, results, signature = train_then_eval(
        "wikitext-103", "gcnn_lm_14", wt103_data, tmp_path / "ck", "--tokens-per-sample", "64", "--max-tokens", "128"
    )
    assert "--context-window 64" in signature and "--tokens-per-sample 1024" in signature
    model, dictionary = load_model(save_dir / "checkpoint_best.pt")
    dataset = data_utils.load_indexed_dataset(str(wt103_data / "data-bin" / "test"), dictionary)
    stream = torch.cat([dataset[i] for i in range(len(dataset))]).long()
    assert len(stream) > 960  # more than one row, so the context window matters
    raw = (wt103_data / "wikitext-103" / "wiki.test.tokens").read_text().splitlines()
    assert (
        evaluated_tokens(save_dir / "checkpoint_best.eval.test.log")
        == len(stream)
        == sum(len(line.split()) + 1 for line in raw)
    )
    inputs = torch.cat([stream.new_tensor([dictionary.eos()]), stream[:-1]])
    assert results["test"][1] == pytest.approx(nll_bits(model, inputs, stream) / len(stream), abs=2e-4)
