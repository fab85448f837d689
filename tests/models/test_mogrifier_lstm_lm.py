"""mogrifier_lstm_lm: the fairseq programs, tying, temperature, mixture of softmaxes, carried and
dropped state, L2 penalty, incremental decoding, checkpoints and errors (the parameter budgets:
test_mogrifier_lstm_lm_budgets.py)."""

import math
import re
from argparse import Namespace

import lm_helpers as lm
import pytest
import torch
from arch_cases import MOGRIFIER, MOGRIFIER_LSTM, NO_DROPOUT
from conftest import ADAM, setup_model

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)
from define_fairseq.models.mogrifier_lstm_lm import MogrifierLSTMLMModel
from define_fairseq.modules import DeFINEEmbedding
from define_fairseq.modules.tied_output import TiedOutput

# Each arch on tiny dims (the arch's structure: rounds, mixture, projection, dropouts, kept).
TINY = {
    "mogrifier_lstm_lm_ptb": ["--mogrifier-hidden-size", "16", "--mogrifier-rank", "4"],
    "mogrifier_lstm_lm_baseline_ptb": ["--mogrifier-hidden-size", "16"],
    "mogrifier_lstm_lm_wt2": MOGRIFIER,
    "mogrifier_lstm_lm_baseline_wt2": MOGRIFIER_LSTM,
}
LAMB_OPTIMIZER = ["--adam-betas", "(0, 0.999)", "--clip-norm", "10"]
# In-process cases: one softmax without / with a projection, the mixture, a DeFINE input.
CASES = {
    "one softmax, e = H": ("mogrifier_lstm_lm_ptb", TINY["mogrifier_lstm_lm_ptb"]),
    "one softmax, projection H -> e": ("mogrifier_lstm_lm_ptb", TINY["mogrifier_lstm_lm_wt2"]),
    "mixture of 2 softmaxes": ("mogrifier_lstm_lm_wt2", TINY["mogrifier_lstm_lm_wt2"]),
    "DeFINE input": (
        "mogrifier_lstm_lm_ptb",
        TINY["mogrifier_lstm_lm_ptb"]
        + ["--input-layer", "define", "--define-depth", "2", "--define-n", "8", "--define-k", "16"]
        + ["--mogrifier-embed-dim", "12"],
    ),
}


def stream_inputs(stream, eos):
    """The inputs of one pass over ``stream`` (its tokens shifted right, EOS first)."""
    return torch.cat([stream.new_tensor([eos]), stream[:-1]])


def reference_log_probs(model, tokens, temperature=1.0):
    """log P(next token) ``[B, T, V]`` recomputed from the stack's output with plain tensor operations, in
    probability space for a mixture; the output matrix is read from the embedding (the tied table)."""
    decoder = model.decoder
    head = decoder.output_projection
    table = decoder.embed_tokens.weight
    with torch.no_grad():
        features = model(tokens, features_only=True)[0]
        if head.components == 1:
            x = features if head.projection is None else features @ head.projection.weight.t()
            return torch.log_softmax((x @ table.t() + head.bias) / temperature, dim=-1)
        k, e = head.components, table.shape[1]
        p = torch.tanh(features @ head.projection.weight.t() + head.projection.bias).view(*features.shape[:-1], k, e)
        component_probs = torch.softmax((p @ table.t() + head.bias) / temperature, dim=-1)
        prior = torch.softmax(features @ head.prior.weight.t(), dim=-1)
        return (prior.unsqueeze(-1) * component_probs).sum(-2).log()


def reference_nll_base2(model, inputs, targets, temperature=1.0):
    """Mean NLL (base 2) of ``targets [B, T]`` with :func:`reference_log_probs`."""
    lprobs = reference_log_probs(model, inputs, temperature)
    return -lprobs.gather(-1, targets.unsqueeze(-1)).mean().item() / math.log(2)


# -- the fairseq programs ----------------------------------------------------------------------------------------

TEMPERATURE = 1.3

# Each arch is trained once with fairseq-train and scored with fairseq-eval-lm under the other task or the same one:
# arch -> (training task, evaluation tasks)
CLI_RUNS = {
    "mogrifier_lstm_lm_ptb": ("stateful_lm", ["stateful_lm", "temperature"]),
    "mogrifier_lstm_lm_wt2": ("stateful_lm", ["language_modeling"]),
    "mogrifier_lstm_lm_baseline_ptb": ("language_modeling", ["language_modeling"]),
    "mogrifier_lstm_lm_baseline_wt2": ("language_modeling", ["stateful_lm"]),
}


@pytest.mark.parametrize("arch", list(CLI_RUNS))
def test_fairseq_train_and_eval_lm(lm_data, tmp_path, arch):
    """fairseq-train (stateful_lm: lamb's loss, with the L2 term through lm_regularized_loss per stream; or
    language_modeling), then fairseq-eval-lm equals a plain recomputation: one pass over the split with state
    carried (stateful_lm, one stream), blocks from zeros (language_modeling), or one pass with the temperature given
    by --model-overrides."""
    train_task, eval_tasks = CLI_RUNS[arch]
    if train_task == "stateful_lm":
        flags = [
            "--criterion",
            "lm_regularized_loss",
            "--sentence-avg",
            "--mogrifier-l2-penalty",
            "1e-4",
            "--batch-size",
            "4",
            "--tokens-per-sample",
            "8",
        ]
        updates = 4
    else:
        flags, updates = ["--tokens-per-sample", "16", "--max-tokens", "256"], 3
    flags = (*TINY[arch], *ADAM, *LAMB_OPTIMIZER, *flags)
    checkpoint = lm.trained_checkpoint(lm_data, tmp_path, arch, *flags, task=train_task, updates=updates)
    model, task = lm.load(checkpoint)
    stream = lm.split_stream(lm_data, task.target_dictionary)
    inputs = stream_inputs(stream, task.target_dictionary.eos())
    stateful = ["--task", "stateful_lm", "--batch-size", "1", "--tokens-per-sample", "8"]
    for eval_task in eval_tasks:
        if eval_task == "language_modeling":
            loss, ppl = lm.eval_lm(lm_data, checkpoint, "--tokens-per-sample", "16", "--max-tokens", "256")
            # blocks of 16 tokens, each from zeros
            assert loss == pytest.approx(lm.split_nll_bits(model, lm_data, task.target_dictionary, 16), abs=2e-4)
        elif eval_task == "stateful_lm":
            loss, ppl = lm.eval_lm(lm_data, checkpoint, *stateful)
            assert loss == pytest.approx(reference_nll_base2(model, inputs[None], stream[None]), abs=2e-4)
        else:
            loss, ppl = lm.eval_lm(
                lm_data,
                checkpoint,
                *stateful,
                "--model-overrides",
                f"{{'mogrifier_softmax_temperature': {TEMPERATURE}}}",
            )
            expected = reference_nll_base2(model, inputs[None], stream[None], TEMPERATURE)
            assert loss == pytest.approx(expected, abs=2e-4)
            assert abs(expected - reference_nll_base2(model, inputs[None], stream[None])) > 1e-3
        assert ppl == pytest.approx(2**loss, rel=1e-3)


# -- in-process: tying, temperature, mixture, state, penalty, decoding, checkpoints ------------------------------


@pytest.mark.parametrize("case", CASES)
def test_output_is_tied_to_the_input_table(lm_data, case):
    arch, flags = CASES[case]
    _, task, model = setup_model(lm_data, arch, *flags)
    decoder = model.decoder
    head = decoder.output_projection
    assert head.weight is decoder.embed_tokens.weight
    assert sum(p is head.weight for p in model.parameters()) == 1  # counted once
    if case == "DeFINE input":
        embed = decoder.embed_tokens
        assert isinstance(embed, DeFINEEmbedding) and embed.weight.shape == (len(task.target_dictionary), 8)
        assert embed.embedding_dim == decoder.lstm.input_size == 12
        assert head.projection.weight.shape == (8, 16) and head.projection.bias is None
    elif case == "one softmax, projection H -> e":
        assert head.projection.weight.shape == (8, 16) and head.projection.bias is None
    # a gradient reaches the shared table from the input and from the output side
    tokens = lm.tokens_batch(len(task.target_dictionary))
    model.train()
    model(tokens)[0].sum().backward()
    assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("case", ["one softmax, projection H -> e", "mixture of 2 softmaxes"])
def test_temperature_divides_the_logits_in_eval_mode_only(lm_data, case):
    arch, flags = CASES[case]
    _, task, model = setup_model(lm_data, arch, *flags, *NO_DROPOUT["mogrifier_lstm_lm"])
    tokens = lm.tokens_batch(len(task.target_dictionary))
    model.eval()
    plain = lm.log_probs(model, tokens)
    torch.testing.assert_close(plain, reference_log_probs(model, tokens), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plain.exp().sum(-1), torch.ones(plain.shape[:-1]))  # a distribution
    model.decoder.softmax_temperature = TEMPERATURE
    tempered = lm.log_probs(model, tokens)
    torch.testing.assert_close(tempered, reference_log_probs(model, tokens, TEMPERATURE), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(tempered, plain, atol=1e-3)
    model.train()  # no dropout anywhere: training mode computes the same function, without the temperature
    with torch.no_grad():
        trained = model.get_normalized_probs(model(tokens), log_probs=True)
    torch.testing.assert_close(trained, plain, rtol=1e-5, atol=1e-5)


def test_mixture_of_softmaxes_is_a_distribution_that_one_softmax_cannot_give(lm_data):
    arch, flags = CASES["mixture of 2 softmaxes"]
    _, task, model = setup_model(lm_data, arch, *flags)
    tokens = lm.tokens_batch(len(task.target_dictionary))
    model.eval()
    lprobs = lm.log_probs(model, tokens)
    torch.testing.assert_close(lprobs.exp().sum(-1), torch.ones(lprobs.shape[:-1]))
    head = model.decoder.output_projection
    assert head.prior.weight.shape == (2, 16) and head.prior.bias is None
    assert head.projection.weight.shape == (2 * 8, 16) and head.projection.bias is not None
    with torch.no_grad():  # both components take part: the prior is not one-hot and the mixture is not either one
        prior = torch.softmax(head.prior(model(tokens, features_only=True)[0]), -1)
    assert prior.min() > 0.01


@pytest.mark.parametrize("shared", [False, True], ids=["mask-per-step", "shared-mask"])
def test_projection_dropout_draws_a_mask_per_step_or_one_per_sequence(shared):
    """With an identity table (V = e) and a zero bias the logits are the dropped projection itself: the features
    it zeroes change from step to step, or with a shared mask (--mogrifier-shared-mask-dropout) stay the same."""
    torch.manual_seed(0)
    head = TiedOutput(torch.nn.Parameter(torch.eye(8)), 16, dropout=0.5, shared_mask=shared).train()
    zeros = head(torch.randn(3, 6, 16)) == 0
    assert zeros.any() and (~zeros).any()
    assert all(torch.equal(zeros[:, t], zeros[:, 0]) for t in range(6)) == shared


def test_dropout_mask_flags_reach_the_stack_and_the_output_layer(lm_data):
    for arch, flags, shared, per_step in [
        ("mogrifier_lstm_lm_ptb", ["--mogrifier-state-dropout-mask", "step"], False, True),
        ("mogrifier_lstm_lm_wt2", ["--mogrifier-state-dropout-mask", "window"], False, False),
        ("mogrifier_lstm_lm_baseline_wt2", ["--mogrifier-shared-mask-dropout"], True, True),
    ]:
        _, _, model = setup_model(lm_data, arch, *TINY[arch], *flags)
        lstm = model.decoder.lstm
        assert (lstm.shared_mask_dropout, lstm.state_dropout_per_step) == (shared, per_step), arch
        assert model.decoder.output_projection.shared_mask == shared


def build(task, **overrides):
    """``mogrifier_lstm_lm`` from its dataclass defaults, tiny dims and ``overrides`` (field names)."""
    tiny = dict(mogrifier_hidden_size=16, mogrifier_rank=4, mogrifier_rounds=5)
    return MogrifierLSTMLMModel.build_model(Namespace(**{**tiny, **overrides}), task)


@pytest.fixture(scope="module")
def lm_task(lm_data):
    return setup_model(lm_data, "mogrifier_lstm_lm", *TINY["mogrifier_lstm_lm_ptb"])[1]


def test_drop_state_probability_resets_streams_reproducibly(lm_task):
    """Training: each stream continues from its carried state or restarts from zeros (probability p), as drawn from
    torch's generator (which fairseq seeds with --seed and the update number); evaluation never drops."""
    model = build(lm_task, mogrifier_drop_state_probability=0.5)
    tokens = lm.tokens_batch(len(lm_task.target_dictionary), batch=64, length=6, seed=3)
    head, rest = tokens[:, :3], tokens[:, 3:]
    model.eval()
    continued = lm.log_probs(model, tokens)[:, 3:]
    from_zeros = lm.log_probs(model, rest)
    assert ((continued - from_zeros).abs().amax(dim=(1, 2)) > 1e-4).all()  # the two are told apart in every row

    def restarted_rows(seed):
        model.train()
        model.decoder.carried_state.clear()
        with torch.no_grad():
            model(head, reset_state=True)
            torch.manual_seed(seed)
            out = torch.log_softmax(model(rest, reset_state=False)[0], -1)
        restarted = torch.isclose(out, from_zeros, rtol=1e-4, atol=1e-5).all(-1).all(-1)
        kept = torch.isclose(out, continued, rtol=1e-4, atol=1e-5).all(-1).all(-1)
        assert (restarted ^ kept).all()  # every row is exactly one of the two
        return restarted

    first = restarted_rows(11)
    assert torch.equal(first, restarted_rows(11)) and not torch.equal(first, restarted_rows(12))
    assert 10 <= int(first.sum()) <= 54  # about half of 64
    model.eval()  # evaluation keeps every stream's state
    with torch.no_grad():
        model(head, reset_state=True)
        out = model.get_normalized_probs(model(rest, reset_state=False), log_probs=True)
    torch.testing.assert_close(out, continued, rtol=1e-5, atol=1e-5)


def test_carried_state(lm_task):
    model = build(lm_task)
    tokens = lm.tokens_batch(len(lm_task.target_dictionary), length=12)
    model.eval()
    full = lm.log_probs(model, tokens)
    with torch.no_grad():
        windows = [
            model.get_normalized_probs(model(part, reset_state=first), log_probs=True)
            for part, first in ((tokens[:, :5], True), (tokens[:, 5:9], False), (tokens[:, 9:], False))
        ]
        torch.testing.assert_close(torch.cat(windows, 1), full, rtol=1e-5, atol=1e-5)
        restarted = model.get_normalized_probs(model(tokens[:, 5:], reset_state=True), log_probs=True)
    torch.testing.assert_close(restarted, lm.log_probs(model, tokens[:, 5:]), rtol=1e-5, atol=1e-5)
    kept = model.decoder.carried_state.kept_state(False)
    assert len(kept) == 2 and all(not h.requires_grad and not c.requires_grad for h, c in kept)
    assert [key for key in model.state_dict() if "carried" in key] == ["decoder.carried_state._extra_state"]


def test_l2_penalty_is_lambs_term_in_training_only(lm_task):
    model = build(lm_task, mogrifier_l2_penalty=0.01)
    tokens = lm.tokens_batch(len(lm_task.target_dictionary))
    model.train()
    _, extra = model(tokens)
    parameters = list(model.parameters())
    expected = 0.5 * 0.01 * sum(float((p.double() ** 2).sum()) for p in parameters)
    assert extra["regularization"].item() == pytest.approx(expected, rel=1e-5)
    extra["regularization"].backward()  # its gradient is l * theta, the tied table counted once
    for p in parameters:
        torch.testing.assert_close(p.grad, 0.01 * p.detach(), rtol=1e-5, atol=1e-7)
    model.eval()
    assert "regularization" not in model(tokens)[1]
    assert "regularization" not in build(lm_task).train()(tokens)[1]


@pytest.mark.parametrize("case", CASES)
def test_incremental_decoding_and_reordering_equal_the_full_pass(lm_data, case):
    arch, flags = CASES[case]
    _, task, model = setup_model(lm_data, arch, *flags, "--mogrifier-softmax-temperature", "1.2")
    lm.check_incremental_decoding(model, lm.tokens_batch(len(task.target_dictionary)))


def test_beam_search_scores_equal_the_full_pass(lm_data):
    arch, flags = CASES["mixture of 2 softmaxes"]
    _, task, model = setup_model(lm_data, arch, *flags)
    lm.check_beam_search_scores(model, task.target_dictionary, max_len_b=6)


@pytest.mark.parametrize("case", ["mixture of 2 softmaxes", "DeFINE input"])
def test_checkpoint_round_trip(lm_data, tmp_path, case):
    from fairseq import checkpoint_utils

    arch, flags = CASES[case]
    cfg, task, model = setup_model(lm_data, arch, *flags, "--save-dir", str(tmp_path), "--no-save-optimizer-state")
    path = str(tmp_path / "roundtrip.pt")
    loaded, tokens = lm.saved_and_loaded(cfg, task, model, path)
    before = lm.log_probs(model.eval(), tokens)
    assert loaded.decoder.output_projection.weight is loaded.decoder.embed_tokens.weight
    _, _, fresh = setup_model(lm_data, arch, *flags, "--seed", "7")
    assert not torch.allclose(lm.log_probs(fresh.eval(), tokens), before)  # the comparison can fail
    (overridden,), _ = checkpoint_utils.load_model_ensemble(
        [path], arg_overrides={"mogrifier_softmax_temperature": TEMPERATURE}
    )
    assert overridden.decoder.softmax_temperature == TEMPERATURE
    torch.testing.assert_close(
        lm.log_probs(overridden.eval(), tokens), reference_log_probs(loaded, tokens, TEMPERATURE), rtol=1e-5, atol=1e-5
    )
    if case == "DeFINE input":  # define_fairseq.tools.fold_define: the DeFINE unit folded into a V x e table
        from define_fairseq.modules import FoldedDeFINEEmbedding
        from define_fairseq.tools.fold_define import fold_checkpoint

        fold_checkpoint(path, str(tmp_path / "folded.pt"))
        (folded,), _ = checkpoint_utils.load_model_ensemble([str(tmp_path / "folded.pt")])
        assert isinstance(folded.decoder.embed_tokens, FoldedDeFINEEmbedding)
        assert folded.decoder.output_projection.weight is folded.decoder.embed_tokens.weight
        torch.testing.assert_close(lm.log_probs(folded.eval(), tokens), before, rtol=1e-5, atol=1e-5)


# -- errors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(mogrifier_layers=0), "--mogrifier-layers=0 must be at least 1"),
        (dict(mogrifier_hidden_size=0), "--mogrifier-hidden-size=0 must be at least 1"),
        (dict(mogrifier_embed_dim=0), "--mogrifier-embed-dim=0 must be at least 1"),
        (dict(mogrifier_rounds=-1), "--mogrifier-rounds=-1 must be >= 0"),
        (dict(mogrifier_rank=-2), "--mogrifier-rank=-2: give 0 (full rank) or a rank below"),
        (
            dict(mogrifier_embed_dim=8, mogrifier_rank=8),
            "--mogrifier-rank=8: give 0 (full rank) or a rank below "
            "min(--mogrifier-embed-dim, --mogrifier-hidden-size) = 8",
        ),
        (dict(mogrifier_input_dropout=1.0), "--mogrifier-input-dropout=1.0: a dropout probability must be in [0, 1)"),
        (dict(mogrifier_inter_layer_dropout=-0.1), "--mogrifier-inter-layer-dropout=-0.1"),
        (dict(mogrifier_state_dropout=1.5), "--mogrifier-state-dropout=1.5"),
        (dict(mogrifier_output_dropout=1.0), "--mogrifier-output-dropout=1.0"),
        (dict(mogrifier_projection_dropout=1.0), "--mogrifier-projection-dropout=1.0"),
        (dict(mogrifier_drop_state_probability=1.0), "--mogrifier-drop-state-probability=1.0"),
        (dict(mogrifier_softmax_temperature=0.0), "--mogrifier-softmax-temperature=0.0 must be a positive number"),
        (dict(mogrifier_softmax_temperature=-1.0), "--mogrifier-softmax-temperature=-1.0"),
        (dict(mogrifier_mos_components=0), "--mogrifier-mos-components=0 must be at least 1"),
        (dict(mogrifier_state_dropout_mask="time"), "--mogrifier-state-dropout-mask=time: give window"),
        (dict(mogrifier_l2_penalty=-1e-4), "--mogrifier-l2-penalty=-0.0001 must be >= 0"),
        (dict(input_layer="define", define_depth=1), "--define-depth=1: DeFINE needs at least 2 layers"),
        (dict(define_folded=True), "--define-folded needs a DeFINE unit (--input-layer define)"),
    ],
)
def test_bad_settings_raise_clear_errors(lm_task, overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build(lm_task, **overrides)


def test_errors_reach_the_command_line(lm_data):
    with pytest.raises(ValueError, match=re.escape("--mogrifier-mos-components=0")):
        setup_model(lm_data, "mogrifier_lstm_lm_wt2", *TINY["mogrifier_lstm_lm_wt2"], "--mogrifier-mos-components", "0")
