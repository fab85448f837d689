"""lstm_lm_define: the paper's parameter counts, the fairseq programs, generation, carried state and errors."""

import logging
import re
from argparse import Namespace

import lm_helpers as lm
import pytest
import torch
from arch_cases import CASES, LM_ADAPTIVE as ADAPTIVE, LSTM as TINY
from conftest import ADAM, needs_fairseq_eos_blocks, setup_model

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)
from define_fairseq.models.lstm_lm_define import LSTMLMDefineModel, RecurrentLMDecoder
from define_fairseq.modules import DeFINEEmbedding
from define_fairseq.modules.adaptive_input import AdaptiveInput
from define_fairseq.modules.awd_lstm.lstm_stack import LSTMStack
from define_fairseq.tools.params import parameter_breakdown

WT103_VOCAB = 267_735
# the language-model batches of the fairseq programs' runs: 32 tokens per sample, 256 per batch
BATCHES = ["--tokens-per-sample", "32", "--max-tokens", "256"]


def lstm_params(inputs: int, hidden: int) -> int:
    """PyTorch's single-layer LSTM: four gates, input and recurrent matrices, two bias vectors."""
    return 4 * hidden * (inputs + hidden) + 8 * hidden


def adaptive_io_params(vocab: int, d: int, cutoff=(20000, 40000, 200000), factor: int = 4) -> int:
    """Adaptive input (band 0 unprojected) shared with the adaptive softmax, which adds its 3-cluster head."""
    bounds = [0, *cutoff, vocab]
    total = 0
    for band in range(len(bounds) - 1):
        dim = d // factor**band
        total += (bounds[band + 1] - bounds[band]) * dim + (dim * d if band else 0)
    return total + len(cutoff) * d


# -- parameter counts at the WikiText-103 vocabulary ------------------------------------------------------------


@pytest.fixture(scope="module")
def wt103_dictionary_dir(tmp_path_factory):
    """A data directory holding only a dict.txt of 267,735 symbols (fairseq adds its 4 special ones)."""
    directory = tmp_path_factory.mktemp("wt103-dict")
    (directory / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(WT103_VOCAB - 4)))
    return directory


def check_structure(arch, decoder):
    if arch == "lstm_lm_standard_wt103":
        assert isinstance(decoder.embed_tokens, torch.nn.Embedding)
        assert decoder.output_projection.weight is decoder.embed_tokens.weight
        assert decoder.output_projection.bias is not None and decoder.project_out_dim is None
        assert decoder.lstm.layer_sizes == [1024, 1024, 1024, 256]
        assert decoder.input_dropout == decoder.output_dropout == decoder.lstm.hidden_dropout == 0.1
        return
    embed = decoder.embed_tokens
    cutoff = [20000, 40000, 200000, WT103_VOCAB]
    if arch == "lstm_lm_adaptive_wt103":
        assert isinstance(embed, AdaptiveInput) and embed.cutoff == cutoff
    else:
        depth = {"lstm_lm_define_wt103_n3": 3, "lstm_lm_define_wt103_n7": 7, "lstm_lm_define_wt103_n11": 11}[arch]
        assert isinstance(embed, DeFINEEmbedding) and isinstance(embed.map, AdaptiveInput)
        assert embed.map.cutoff == cutoff and len(embed.define.layers) == depth
    softmax = decoder.adaptive_softmax
    assert softmax.cutoff == cutoff and decoder.project_out_dim is None
    assert softmax.head.word_proj.weight is embed.weights_for_band(0)[0]  # tied to the adaptive input ...
    for band, tail in enumerate(softmax.tail, start=1):
        table, projection = embed.weights_for_band(band)
        assert tail[0].weight is projection and tail[2].weight is table  # ... projections included


@pytest.mark.parametrize(
    "arch,m,io",
    [
        ("lstm_lm_standard_wt103", 256, 68.81),
        ("lstm_lm_adaptive_wt103", 256, 9.25),
        ("lstm_lm_define_wt103_n3", 256, 9.25),
        ("lstm_lm_define_wt103_n7", 384, 13.90),
        ("lstm_lm_define_wt103_n11", 512, 18.55),
    ],
)
def test_paper_parameter_counts(wt103_dictionary_dir, arch, m, io):
    paper_context = {256: 23.36, 384: 24.73, 512: 26.24}[m]
    with torch.device("meta"):  # counts only: no memory, no initialisation
        _, task, model = setup_model(wt103_dictionary_dir, arch)
    vocab = len(task.target_dictionary)
    assert vocab == WT103_VOCAB
    counts = parameter_breakdown(model)
    context = lstm_params(m, 1024) + 2 * lstm_params(1024, 1024) + lstm_params(1024, m)
    assert counts["context"] == context == sum(p.numel() for p in model.decoder.lstm.parameters())
    assert round(counts["context"] / 1e6, 2) == paper_context
    expected_io = vocab * m + vocab if arch == "lstm_lm_standard_wt103" else adaptive_io_params(vocab, m)
    assert counts["input/output"] == expected_io
    assert round(counts["input/output"] / 1e6, 2) == io
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    assert counts["total"] == counts["DeFINE"] + counts["context"] + counts["input/output"]
    assert (counts["DeFINE"] > 0) == ("define" in arch)
    check_structure(arch, model.decoder)
    print(
        f"{arch}: DeFINE {counts['DeFINE'] / 1e6:.2f}M, context {counts['context'] / 1e6:.2f}M, "
        f"I/O {counts['input/output'] / 1e6:.2f}M, total {counts['total'] / 1e6:.2f}M"
    )


# -- the fairseq programs ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(lm_data, tmp_path_factory):
    """``trained(arch)``: a checkpoint of ``arch`` (tiny dims) from fairseq-train, trained once per module."""
    checkpoints = {}

    def get(arch):
        if arch not in checkpoints:
            save_dir = tmp_path_factory.mktemp(arch)
            checkpoints[arch] = lm.trained_checkpoint(lm_data, save_dir, arch, *CASES[arch][1], *ADAM, *BATCHES)
        return checkpoints[arch]

    return get


# lstm_lm_define_wt103_n3 trains in test_stateful_training_and_eval; n7 and n11, n3 with a deeper unit, in
# `make test-all`
@pytest.mark.parametrize(
    "arch",
    [
        "lstm_lm_define",
        "lstm_lm_standard_wt103",
        "lstm_lm_adaptive_wt103",
        pytest.param("lstm_lm_define_wt103_n7", marks=pytest.mark.slow),
        pytest.param("lstm_lm_define_wt103_n11", marks=pytest.mark.slow),
    ],
)
def test_train_and_eval_lm(lm_data, trained, arch):
    checkpoint = trained(arch)
    loss, ppl = lm.eval_lm(lm_data, checkpoint, *BATCHES)
    assert ppl == pytest.approx(2**loss, rel=1e-3)
    if arch in ("lstm_lm_define", "lstm_lm_adaptive_wt103"):
        # eval-lm scores blocks of 32 tokens of the stream, each block from a zero state
        model, task = lm.load(checkpoint)
        assert loss == pytest.approx(lm.split_nll_bits(model, lm_data, task.target_dictionary, 32), abs=2e-4)


def test_stateful_training_and_eval(lm_data, tmp_path):
    """--task stateful_lm: state carried across batches; eval-lm with one stream equals one pass over the split."""
    arch = "lstm_lm_define_wt103_n3"
    flags = (*CASES[arch][1], *ADAM, "--batch-size", "4", "--tokens-per-sample", "8")
    checkpoint = lm.trained_checkpoint(lm_data, tmp_path, arch, *flags, task="stateful_lm", updates=6)
    loss, _ = lm.eval_lm(lm_data, checkpoint, "--task", "stateful_lm", "--batch-size", "1", "--tokens-per-sample", "8")
    model, task = lm.load(checkpoint)
    assert loss == pytest.approx(lm.split_nll_bits(model, lm_data, task.target_dictionary), abs=2e-4)


@needs_fairseq_eos_blocks
def test_fairseq_generate_samples_after_a_prefix(lm_data, trained):
    lm.check_generate_continues_a_prefix(
        lm_data, trained("lstm_lm_define"), "--sampling", "--sampling-topk", "5", "--beam", "2", "--seed", "3"
    )


def test_folded_checkpoint_scores_identically(lm_data, trained, tmp_path):
    """define_fairseq.tools.fold_define on an lstm_lm_define checkpoint (DeFINE on a V x n table)."""
    from define_fairseq.modules import FoldedDeFINEEmbedding
    from define_fairseq.tools.fold_define import fold_checkpoint

    checkpoint = trained("lstm_lm_define")
    folded = tmp_path / "folded.pt"
    fold_checkpoint(str(checkpoint), str(folded))
    original, task = lm.load(checkpoint)
    model, _ = lm.load(folded)
    assert isinstance(model.decoder.embed_tokens, FoldedDeFINEEmbedding)
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight
    tokens = lm.tokens_batch(len(task.target_dictionary))
    torch.testing.assert_close(lm.log_probs(model, tokens), lm.log_probs(original, tokens), rtol=1e-5, atol=1e-5)


# -- in-process: incremental decoding, beam search, round trip, carried state -------------------------------------

IN_PROCESS = {
    "tied full softmax with a projection": ("lstm_lm_define", CASES["lstm_lm_define"][1]),
    "adaptive + DeFINE": ("lstm_lm_define_wt103_n3", TINY + ADAPTIVE + ["--decoder-output-dim", "20"]),
    "untied adaptive softmax": (
        "lstm_lm_define",
        TINY + ["--decoder-embed-dim", "24", "--adaptive-softmax-cutoff", "10,30"],
    ),
}


@pytest.fixture(scope="module", params=list(IN_PROCESS))
def case_model(request, lm_data):
    """Each in-process case's model, built once for the tests that only run it (in eval mode), and its task."""
    arch, flags = IN_PROCESS[request.param]
    _, task, model = setup_model(lm_data, arch, *flags)
    return model, task


def test_incremental_decoding_and_reordering_equal_the_full_pass(case_model):
    model, task = case_model
    lm.check_incremental_decoding(model, lm.tokens_batch(len(task.target_dictionary)))


def test_beam_search_scores_equal_the_full_pass(case_model):
    model, task = case_model
    lm.check_beam_search_scores(model, task.target_dictionary)


@pytest.mark.parametrize("case", ["tied full softmax with a projection", "adaptive + DeFINE"])
def test_checkpoint_round_trip(lm_data, tmp_path, case):
    arch, flags = IN_PROCESS[case]
    cfg, task, model = setup_model(lm_data, arch, *flags, "--save-dir", str(tmp_path), "--no-save-optimizer-state")
    loaded, tokens = lm.saved_and_loaded(cfg, task, model, tmp_path / "roundtrip.pt")
    before = lm.log_probs(model.eval(), tokens)
    _, _, fresh = setup_model(lm_data, arch, *flags, "--seed", "7")
    assert not torch.allclose(lm.log_probs(fresh.eval(), tokens), before)  # the comparison can fail
    if loaded.decoder.adaptive_softmax is not None:
        assert (
            loaded.decoder.adaptive_softmax.head.word_proj.weight is loaded.decoder.embed_tokens.weights_for_band(0)[0]
        )
    else:
        assert loaded.decoder.output_projection.weight is loaded.decoder.embed_tokens.weight


def test_carried_state(lm_data, caplog):
    _, task, model = setup_model(lm_data, "lstm_lm_define", *CASES["lstm_lm_define"][1])
    decoder = model.decoder
    tokens = lm.tokens_batch(len(task.target_dictionary), length=12)
    model.eval()
    full = lm.log_probs(model, tokens)
    with torch.no_grad():
        first = model(tokens[:, :5], reset_state=True)
        second = model(tokens[:, 5:], reset_state=False)
        windows = torch.cat([model.get_normalized_probs(o, log_probs=True) for o in (first, second)], dim=1)
    torch.testing.assert_close(windows, full, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # reset_state=True starts from zeros again
        torch.testing.assert_close(
            model.get_normalized_probs(model(tokens[:, 5:], reset_state=True), True),
            lm.log_probs(model, tokens[:, 5:]),
            rtol=1e-5,
            atol=1e-5,
        )
    kept = decoder.carried_state.kept_state(False)
    assert all(not h.requires_grad and not c.requires_grad for h, c in kept)

    # None keeps nothing; training keeps its own state; a missing or mismatched state means zeros, warned once
    decoder.carried_state.clear()
    model(tokens, reset_state=None)
    assert not decoder.carried_state.has_state(False)
    model.train()
    decoder.lstm.hidden_dropout = decoder.input_dropout = decoder.output_dropout = 0.0
    with caplog.at_level(logging.WARNING):
        out = model(tokens[:, 5:], reset_state=False)[0]
        model(tokens[:2], reset_state=False)
    assert len([r for r in caplog.records if "starting from zeros" in r.getMessage()]) == 1
    torch.testing.assert_close(
        torch.log_softmax(out.detach(), -1), lm.log_probs(model.eval(), tokens[:, 5:]), rtol=1e-5, atol=1e-5
    )
    assert decoder.carried_state.has_state(True) and not decoder.carried_state.has_state(False)
    assert [key for key in model.state_dict() if "carried" in key] == ["decoder.carried_state._extra_state"]


# -- errors ---------------------------------------------------------------------------------------------------


def build_lstm_lm(task, **overrides):
    """``lstm_lm_define`` built from its dataclass defaults, the tiny dims and ``overrides`` (field names)."""
    tiny = dict(define_n=16, define_k=32, decoder_hidden_size=24, decoder_layers=2, decoder_embed_dim=24)
    return LSTMLMDefineModel.build_model(Namespace(**{**tiny, **overrides}), task)


@pytest.fixture(scope="module")
def lm_task(lm_data):
    return setup_model(lm_data, "lstm_lm_define", *TINY)[1]


ADAPTIVE_BOTH = dict(adaptive_input=True, adaptive_input_cutoff="10,30", adaptive_softmax_cutoff="10,30")


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            dict(adaptive_softmax_cutoff="30,10"),
            "--adaptive-softmax-cutoff 30,10: the cutoffs must be positive and increasing",
        ),
        (dict(adaptive_softmax_cutoff="10,100"), "--adaptive-softmax-cutoff 10,100: the last cutoff must be below"),
        (dict(adaptive_softmax_cutoff="ten"), "--adaptive-softmax-cutoff 'ten': give comma separated integers"),
        (dict(adaptive_input=True, adaptive_input_cutoff="10,80"), "--adaptive-input-cutoff 10,80"),
        (dict(adaptive_input=True), "--adaptive-input needs --adaptive-input-cutoff"),
        (dict(adaptive_input_cutoff="10"), "without --adaptive-input"),
        (dict(input_layer="define", define_depth=0), "--input-layer define needs --define-depth >= 1 (got 0)"),
        (
            dict(adaptive_input=True, adaptive_input_cutoff="10,30", share_decoder_input_output_embed=True),
            "cannot be tied to an adaptive input",
        ),
        (dict(**ADAPTIVE_BOTH, share_decoder_input_output_embed=True), "use --tie-adaptive-weights"),
        (
            dict(adaptive_softmax_cutoff="10,30", tie_adaptive_weights=True),
            "--tie-adaptive-weights needs --adaptive-input",
        ),
        (
            dict(**{**ADAPTIVE_BOTH, "adaptive_softmax_cutoff": "10,40"}, tie_adaptive_weights=True),
            "--adaptive-softmax-cutoff 10,40 differs from --adaptive-input-cutoff 10,30",
        ),
        (dict(**ADAPTIVE_BOTH, tie_adaptive_weights=True, adaptive_softmax_factor=2), "--adaptive-softmax-factor"),
        (dict(tie_adaptive_weights=True), "needs an adaptive softmax"),
        (dict(tie_adaptive_proj=True), "--tie-adaptive-proj needs --tie-adaptive-weights"),
        (dict(dropout=1.5), "--dropout=1.5: a dropout probability must be in [0, 1)"),
        (dict(awd_weight_drop=-0.1), "--awd-weight-drop=-0.1"),
        (dict(decoder_layers=0), "--decoder-layers=0 must be at least 1"),
    ],
)
def test_bad_configurations_raise_clear_errors(lm_task, overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build_lstm_lm(lm_task, **overrides)


def test_errors_reach_the_command_line(lm_data):
    with pytest.raises(ValueError, match=re.escape("--adaptive-softmax-cutoff 30,10")):
        setup_model(
            lm_data,
            "lstm_lm_adaptive_wt103",
            *TINY,
            "--adaptive-input-cutoff",
            "10,30",
            "--adaptive-softmax-cutoff",
            "30,10",
        )


def test_embedding_width_must_match_the_lstm_input(lm_task):
    dictionary = lm_task.target_dictionary
    embed = DeFINEEmbedding(len(dictionary), n=16, k=32, m=24, padding_idx=dictionary.pad())
    with pytest.raises(ValueError, match="DeFINE output width m"):
        RecurrentLMDecoder(
            dictionary, embed, LSTMStack(16, [16]), output_projection=torch.nn.Linear(16, len(dictionary))
        )


def test_the_define_output_norm_flag_reaches_the_unit(lm_data):
    flags = CASES["lstm_lm_define_wt103_n3"][1]
    plain = setup_model(lm_data, "lstm_lm_define_wt103_n3", *flags)[2].decoder.embed_tokens.define
    normed = setup_model(lm_data, "lstm_lm_define_wt103_n3", *flags, "--define-output-norm", "layer")[2]
    normed = normed.decoder.embed_tokens.define
    assert plain.output_norm is None
    assert isinstance(normed.output_norm, torch.nn.LayerNorm) and normed.output_norm.normalized_shape == (16,)
