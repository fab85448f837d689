"""transformer_xl_lm: the memory across segments against one pass, causality, incremental decoding, the paper's
parameter counts (Table 2), the fairseq programs with the stateful task, folding, and clear errors."""

import re

import lm_helpers as lm
import pytest
import torch
from arch_cases import REGULARIZED, TXL_TINY
from conftest import ADAM, needs_fairseq_eos_blocks, setup_model, training_arguments

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)
from define_fairseq.tools.params import parameter_breakdown, write_dictionaries

WT103_VOCAB = 267_735
TINY = [*TXL_TINY, "--dropout", "0.0"]
INPUT_FLAGS = {"standard": [], "projective": ["--input-layer", "projective"], "define": ["--input-layer", "define"]}
# training: the stateful task's streams, 4 of 8 tokens a batch
TRAIN = [*REGULARIZED, "--ddp-backend", "legacy_ddp", *ADAM, "--batch-size", "4", "--tokens-per-sample", "8"]


def parsed_model(data, *flags, arch="transformer_xl_lm"):
    return setup_model(data, arch, "--batch-size", "2", *flags, task="stateful_lm")


@pytest.fixture(scope="module", params=list(INPUT_FLAGS))
def model(request, lm_data):
    """A tiny eval-mode model of each input layer, with a memory longer than the test sequences."""
    _, task, model = parsed_model(lm_data, *TINY, *INPUT_FLAGS[request.param], "--txl-mem-len", "64")
    return model.eval(), len(task.target_dictionary)


# -- the memory, causality, incremental decoding -----------------------------------------------------------------


def test_segments_with_memory_equal_one_pass(model):
    """Fed in segments of 8 with the memory carried (stateful task), the log-probabilities are those of one pass
    over all 24 tokens; a reset starts from an empty memory again."""
    model, vocab = model
    tokens = lm.tokens_batch(vocab, length=24, bos=False)
    full = lm.log_probs(model, tokens)
    parts = [lm.log_probs(model, tokens[:, :8], reset_state=True)]
    parts += [lm.log_probs(model, tokens[:, s : s + 8], reset_state=False) for s in (8, 16)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    again = lm.log_probs(model, tokens[:, 16:], reset_state=True)
    torch.testing.assert_close(again, lm.log_probs(model, tokens[:, 16:]), rtol=1e-5, atol=1e-5)
    assert (again - full[:, 16:]).abs().max() > 1e-6  # without the memory the outputs differ


def test_memory_keeps_mem_len_states_and_no_gradient(lm_data):
    _, task, model = parsed_model(lm_data, *TINY, "--txl-mem-len", "5")
    tokens = lm.tokens_batch(len(task.target_dictionary), length=8, bos=False)
    model.train()
    model(tokens, reset_state=True)
    memory = model.decoder.memory.kept_state(True)["memory"]
    assert len(memory) == 2 and all(m.shape == (5, 3, 16) and not m.requires_grad for m in memory)
    # the memory is the last 5 inputs of each layer: layer 0's input is the embedding of the last 5 tokens
    model.eval()
    model(tokens, reset_state=True)
    with torch.no_grad():
        embedded = model.decoder.embed_tokens(tokens[:, 3:]).transpose(0, 1)
    torch.testing.assert_close(model.decoder.memory.kept_state(False)["memory"][0], embedded)
    assert [key for key in model.state_dict() if "memory" in key] == ["decoder.memory._extra_state"]


def test_changing_a_token_never_changes_an_earlier_output(model):
    model, vocab = model
    tokens = lm.tokens_batch(vocab, batch=2, length=16, bos=False)
    base = lm.log_probs(model, tokens)
    for t in (0, 7, 15):
        changed = tokens.clone()
        changed[:, t] = 4 + (changed[:, t] - 3) % (vocab - 4)
        out = lm.log_probs(model, changed)
        assert torch.equal(out[:, :t], base[:, :t])
        assert (out[:, t] - base[:, t]).abs().max() > 1e-6


def test_incremental_decoding_and_reordering_equal_the_full_pass(model):
    model, vocab = model
    lm.check_incremental_decoding(model, lm.tokens_batch(vocab, length=12, bos=False), first=3, split=6)


def test_input_layers_and_tying(lm_data):
    """standard: a V x d table, no projection; projective: the head cluster's projection is the input's; define:
    a DeFINE unit and four projections of its own. The softmax table is the input table in every case."""
    from define_fairseq.modules import DeFINEEmbedding

    for kind, flags in INPUT_FLAGS.items():
        _, task, model = parsed_model(lm_data, *TINY, *flags)
        decoder, vocab = model.decoder, len(task.target_dictionary)
        softmax = decoder.adaptive_softmax
        assert softmax.table is decoder.embed_tokens.weight
        assert softmax.cutoff == [20, 40, vocab]
        projections = [p for p in softmax.projections]
        if kind == "standard":
            assert decoder.embed_tokens.weight.shape == (vocab, 16)
            assert all(p is None for p in projections)
        elif kind == "projective":
            assert decoder.embed_tokens.weight.shape == (vocab, 8)
            assert projections[0] is decoder.embed_tokens.projection
            assert len({id(p) for p in projections}) == 3
        else:
            assert isinstance(decoder.embed_tokens, DeFINEEmbedding)
            assert len({id(p) for p in projections}) == 3 and all(p.shape == (16, 8) for p in projections)
        n = decoder.embed_tokens.weight.shape[1]
        counts = parameter_breakdown(model)
        io = vocab * n + vocab + 2 * n + 2 + (0 if kind == "standard" else 3 * 16 * n)
        assert counts["input/output"] == io, (
            kind
        )  # table, bias, 2 clusters, and 3 n x d projections (not 4: 3 clusters)


# -- the paper's parameter counts (Table 2) --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wt103_dictionary(tmp_path_factory):
    directory = tmp_path_factory.mktemp("wt103-dict")
    write_dictionaries(str(directory), WT103_VOCAB)
    return directory


@pytest.mark.parametrize(
    "arch,context,io",
    [
        ("transformer_xl_wt103", 41.07, 110.04),
        ("transformer_xl_wt103_d384", 36.25, 103.08),
        ("transformer_xl_projective_wt103_n256", 36.25, 69.20),
        ("transformer_xl_projective_wt103_n128", 36.25, 34.73),
        ("transformer_xl_projective_wt103_n64", 36.25, 17.50),
        ("transformer_xl_define_wt103_n384", 36.25, 103.08),
        ("transformer_xl_define_wt103_n256", 36.25, 69.20),
        ("transformer_xl_define_wt103_n128", 36.25, 34.73),
        ("transformer_xl_define_wt103_n64", 36.25, 17.50),
    ],
)
def test_parameter_counts_match_table_2(wt103_dictionary, arch, context, io):
    with torch.device("meta"):  # counts only: no memory, no initialisation
        _, _, model = parsed_model(wt103_dictionary, arch=arch)
    counts = parameter_breakdown(model)
    assert round(counts["context"] / 1e6, 2) == context
    assert round(counts["input/output"] / 1e6, 2) == io
    if "define" in arch:
        # ours: N = 3, k = 4096, m = 384 (the paper prints 1.92M for every n, which its text does not give)
        defines = [m for m in model.modules() if type(m).__name__ == "DeFINE"]
        assert len(defines) == 1 and counts["DeFINE"] == sum(p.numel() for p in defines[0].parameters()) > 0
    else:
        assert counts["DeFINE"] == 0


# -- the fairseq programs ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(lm_data, tmp_path_factory):
    flags = (*TINY, "--input-layer", "define", "--txl-mem-len", "8", *TRAIN)
    return lm.trained_checkpoint(
        lm_data, tmp_path_factory.mktemp("txl"), "transformer_xl_lm", *flags, task="stateful_lm", updates=6
    )


@pytest.mark.parametrize("mem_len,clamp_len,same_length", [(8, -1, False), (20, 5, True)])
def test_eval_lm_carries_the_memory_through_the_split(lm_data, checkpoint, mem_len, clamp_len, same_length):
    """fairseq-eval-lm --task stateful_lm with one stream equals scoring the split segment by segment in process,
    the memory carried, with the evaluation settings given by --model-overrides (as Transformer-XL evaluates)."""
    overrides = {"txl_mem_len": mem_len, "txl_clamp_len": clamp_len, "txl_same_length": same_length}
    loss, _ = lm.eval_lm(
        lm_data,
        checkpoint,
        "--task",
        "stateful_lm",
        "--batch-size",
        "1",
        "--tokens-per-sample",
        "6",
        "--model-overrides",
        str(overrides),
    )
    model, task = lm.load(checkpoint, **overrides)
    assert (model.decoder.stack.mem_len, model.decoder.stack.clamp_len) == (mem_len, clamp_len)
    expected = lm.split_nll_bits(model, lm_data, task.target_dictionary, 6, carry=True)
    assert loss == pytest.approx(expected, abs=2e-4)


@needs_fairseq_eos_blocks
def test_fairseq_generate_continues_a_prefix(lm_data, checkpoint):
    lm.check_generate_continues_a_prefix(lm_data, checkpoint, "--beam", "3")


def test_checkpoint_round_trip_and_folding(lm_data, checkpoint, tmp_path):
    from define_fairseq.modules import FoldedDeFINEEmbedding
    from define_fairseq.tools.fold_define import fold_checkpoint

    model, task = lm.load(checkpoint)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)  # plain containers: no unsafe load
    assert type(state["cfg"]) is dict and state["cfg"]["model"]["_name"] == "transformer_xl_lm"
    tokens = lm.tokens_batch(len(task.target_dictionary), length=10, bos=False)
    before = lm.log_probs(model, tokens)
    fresh = parsed_model(lm_data, *TINY, "--input-layer", "define", "--txl-mem-len", "8")[2].eval()
    assert not torch.allclose(lm.log_probs(fresh, tokens), before)  # the weights are the trained ones
    fresh.load_state_dict(state["model"])
    torch.testing.assert_close(lm.log_probs(fresh, tokens), before, rtol=0, atol=0)
    # folded: the DeFINE unit replaced by its V x 16 table, the same scores, and eval-lm runs on it unchanged
    folded_path = tmp_path / "folded.pt"
    fold_checkpoint(str(checkpoint), str(folded_path))
    folded, _ = lm.load(folded_path)
    assert isinstance(folded.decoder.embed_tokens, FoldedDeFINEEmbedding)
    assert folded.decoder.adaptive_softmax.table is folded.decoder.embed_tokens.weight
    torch.testing.assert_close(lm.log_probs(folded, tokens), before, rtol=1e-5, atol=1e-5)
    flags = ("--task", "stateful_lm", "--batch-size", "1", "--tokens-per-sample", "6")
    assert lm.eval_lm(lm_data, folded_path, *flags)[0] == pytest.approx(
        lm.eval_lm(lm_data, checkpoint, *flags)[0], abs=1e-4
    )


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--txl-mem-len", "-1"], "--txl-mem-len=-1"),
        (["--txl-mem-len", "0", "--txl-same-length"], "--txl-same-length needs a memory"),
        (["--txl-clamp-len", "-2"], "--txl-clamp-len=-2"),
        (["--decoder-attention-heads", "0"], "--decoder-attention-heads=0"),
        (["--txl-head-dim", "0"], "--txl-head-dim=0"),
        (["--decoder-embed-dim", "15"], "--decoder-embed-dim=15 must be even"),
        (["--adaptive-softmax-cutoff", "20,400"], "--adaptive-softmax-cutoff"),
        (["--input-layer", "projective", "--define-n", "16"], "nothing to project"),
        (["--input-layer", "define", "--define-depth", "0"], "--input-layer define needs --define-depth"),
        (["--dropout", "1.0"], "--dropout"),
    ],
)
def test_impossible_configs_fail_clearly(lm_data, flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parsed_model(lm_data, *TINY, *flags)


ARCHS = (
    ["transformer_xl_wt103", "transformer_xl_wt103_d384"]
    + [f"transformer_xl_projective_wt103_n{n}" for n in (64, 128, 256)]
    + [f"transformer_xl_define_wt103_n{n}" for n in (64, 128, 256, 384)]
)


def input_layer_of(arch: str) -> str:
    return "define" if "define" in arch else "projective" if "projective" in arch else "table"


@pytest.mark.parametrize("arch", ARCHS)
def test_every_arch_keeps_its_input_layer_under_the_tiny_sizes(lm_data, arch):
    cfg, _, _ = setup_model(lm_data, arch, *TINY, *TRAIN, task="stateful_lm")
    assert cfg.model._name == arch and cfg.model.input_layer == input_layer_of(arch)


# one arch per input layer in `make test`; the others, which differ from it in defaults only, in `make test-all`
ONE_PER_INPUT_LAYER = ("transformer_xl_wt103", "transformer_xl_projective_wt103_n64", "transformer_xl_define_wt103_n64")


@pytest.mark.parametrize(
    "arch", [arch if arch in ONE_PER_INPUT_LAYER else pytest.param(arch, marks=pytest.mark.slow) for arch in ARCHS]
)
def test_every_arch_trains_through_fairseq_train(lm_data, tmp_path, arch):
    """Each registered arch by name (its input layer kept), sizes overridden to fit the toy corpus."""
    checkpoint = lm.trained_checkpoint(lm_data, tmp_path, arch, *TINY, *TRAIN, task="stateful_lm", updates=2)
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert state["cfg"]["model"]["_name"] == arch
    assert state["cfg"]["model"]["input_layer"] == input_layer_of(arch)


# -- the recipe: recipes/wikitext-103/train-transformer-xl.sh and eval.sh ------------------------------------------

RECIPE = define_fairseq.__file__.rsplit("/define_fairseq/", 1)[0] + "/recipes/wikitext-103"


def run_recipe(script, *args):
    import os
    import subprocess

    from script_programs import script_path

    env = {**os.environ, "PATH": script_path(), "OMP_NUM_THREADS": "1"}
    env.pop("DATA_DIR", None)
    env.pop("SAVE_ROOT", None)
    return subprocess.run(
        ["bash", f"{RECIPE}/{script}", *map(str, args)], env=env, capture_output=True, text=True, timeout=600
    )


def test_recipe_commands_have_transformer_xls_settings():
    from fairseq import options

    for gpus, streams in ((1, 60), (4, 15)):
        proc = run_recipe(
            "train-transformer-xl.sh", "-n", "-g", gpus, "-d", "data", "-s", "ck", "transformer_xl_define_wt103_n128"
        )
        assert proc.returncode == 0, proc.stderr
        args = options.parse_args_and_arch(options.get_training_parser(), training_arguments(proc.stdout))
        assert (args.arch, args.task, args.tokens_per_sample, args.txl_mem_len) == (
            "transformer_xl_define_wt103_n128",
            "stateful_lm",
            150,
            150,
        )
        assert args.batch_size * args.distributed_world_size == 60 and args.batch_size == streams
        assert (args.optimizer, args.lr, args.lr_scheduler, args.min_lr) == ("adam", [0.00025], "cosine", 0.0)
        assert (args.max_update, args.warmup_updates, args.clip_norm) == (200000, 0, 0.25)
        assert (args.dropout, args.attention_dropout, args.criterion) == (0.1, 0.0, "lm_regularized_loss")
        assert args.save_dir == "ck/transformer_xl_define_wt103_n128"
    proc = run_recipe("train-transformer-xl.sh", "-n", "-g", 7, "transformer_xl_wt103")
    assert proc.returncode != 0 and "-g 7 does not divide the 60 streams" in proc.stderr
    proc = run_recipe("train-transformer-xl.sh", "-n", "-g", 1, "transformer_xl")
    assert proc.returncode != 0 and "unknown CONFIG 'transformer_xl'" in proc.stderr


@pytest.mark.slow
def test_recipe_trains_and_evaluates_with_the_evaluation_settings(lm_data, tmp_path):
    """train-transformer-xl.sh (sizes shrunk, CPU, 4 updates) then eval.sh, which scores valid and test with
    memory 640, clamp_len 400 and same_length: the perplexities it reports are fairseq-eval-lm's with those
    overrides."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "data-bin").symlink_to(lm_data)
    config = "transformer_xl_projective_wt103_n64"
    proc = run_recipe(
        "train-transformer-xl.sh",
        "-g",
        1,
        "-d",
        data_dir,
        "-s",
        tmp_path / "ck",
        config,
        "--cpu",
        *TINY,
        "--batch-size",
        "4",
        "--batch-size-valid",
        "2",
        "--tokens-per-sample",
        "8",
        "--max-update",
        "4",
        "--num-workers",
        "0",
        "--data-buffer-size",
        "0",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checkpoint = tmp_path / "ck" / config / "checkpoint_best.pt"
    proc = run_recipe("eval.sh", "-d", data_dir, "-s", tmp_path / "ck", config, "--cpu", "--num-workers", "0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = (tmp_path / "ck" / config / "checkpoint_best.eval.txt").read_text().splitlines()
    assert "memory 640, clamp_len 400, same_length" in results[1]
    test_ppl = float(re.search(r"^test +perplexity ([\d.]+)", "\n".join(results), re.M).group(1))
    overrides = "{'txl_mem_len': 640, 'txl_clamp_len': 400, 'txl_same_length': True}"
    loss, _ = lm.eval_lm(
        lm_data,
        checkpoint,
        "--task",
        "stateful_lm",
        "--tokens-per-sample",
        "64",
        "--batch-size",
        "10",
        "--model-overrides",
        overrides,
    )
    assert test_ppl == pytest.approx(2**loss, rel=2e-3)


def test_validation_between_training_batches_keeps_the_training_memory(lm_data):
    """Training and evaluation keep separate memories: a validation pass (eval mode, its own reset) between two
    training batches leaves the training stream's memory as it was."""
    _, task, model = parsed_model(lm_data, *TINY, "--txl-mem-len", "6")
    tokens = lm.tokens_batch(len(task.target_dictionary), length=8, bos=False)
    model.train()
    model(tokens, reset_state=True)
    kept = [m.clone() for m in model.decoder.memory.kept_state(True)["memory"]]
    model.eval()
    with torch.no_grad():
        model(tokens.flip(1), reset_state=True)  # a validation pass over other text
        model(tokens, reset_state=False)
    assert model.decoder.memory.kept_state(False) is not None
    for before, after in zip(kept, model.decoder.memory.kept_state(True)["memory"]):
        assert torch.equal(before, after)
    model.train()
    torch.manual_seed(0)
    continued = model(tokens, reset_state=False)[0]
    # the next training batch starts from that memory: the same as if no validation had happened
    model.decoder.memory.clear()
    model(tokens, reset_state=True)
    torch.manual_seed(0)
    torch.testing.assert_close(model(tokens, reset_state=False)[0], continued, rtol=0, atol=0)
