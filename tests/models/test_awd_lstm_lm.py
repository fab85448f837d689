"""awd_lstm_lm and awd_lstm_lm_define: PTB parameter counts, AWD-LSTM regularisation, lm_regularized_loss (also with
an adaptive softmax), CLIs."""

import math
import re

import lm_helpers as lm
import pytest
import torch
from arch_cases import AWD as TINY_AWD, AWD_DEFINE as TINY_AWD_DEFINE, LM_ADAPTIVE as ADAPTIVE, LSTM as LSTM_TINY
from conftest import ADAM, setup_model
from test_lstm_lm import BATCHES, lstm_params

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)
from define_fairseq.criterions.lm_regularized_loss import LMRegularizedLoss
from define_fairseq.modules import DeFINEEmbedding
from define_fairseq.tools.params import parameter_breakdown

PTB_VOCAB = 10_000


@pytest.fixture(scope="module")
def ptb_dictionary_dir(tmp_path_factory):
    """A data directory holding only a dict.txt of 10,000 symbols (fairseq adds its 4 special ones)."""
    directory = tmp_path_factory.mktemp("ptb-dict")
    (directory / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(PTB_VOCAB - 4)))
    return directory


def test_awd_lstm_parameter_count(ptb_dictionary_dir):
    _, task, model = setup_model(ptb_dictionary_dir, "awd_lstm_lm")
    vocab = len(task.target_dictionary)
    assert vocab == PTB_VOCAB
    # tied 10K x 400 embedding and softmax (with its bias), LSTM 400 -> 1150 -> 1150 -> 400
    expected = vocab * 400 + vocab + lstm_params(400, 1150) + lstm_params(1150, 1150) + lstm_params(1150, 400)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert round(expected / 1e6, 2) == 24.22


def test_awd_lstm_define_parameter_count(ptb_dictionary_dir):
    _, task, model = setup_model(ptb_dictionary_dir, "awd_lstm_lm_define")
    vocab = len(task.target_dictionary)
    counts = parameter_breakdown(model)
    define = sum(p.numel() for p in model.decoder.embed_tokens.define.parameters())
    assert counts["DeFINE"] == define
    # tied 10K x 128 table and softmax (with its bias), LSTM 400 -> 1150 -> 1150 -> 128; plus the DeFINE unit
    lstm = lstm_params(400, 1150) + lstm_params(1150, 1150) + lstm_params(1150, 128)
    assert round(lstm / 1e6, 2) == 18.38
    assert counts["total"] - define == lstm + vocab * 128 + vocab
    assert round((counts["total"] - define) / 1e6, 2) == 19.67
    print(f"awd_lstm_lm_define: DeFINE {define / 1e6:.2f}M, total {counts['total'] / 1e6:.2f}M")


def test_arch_defaults(lm_data):
    _, _, model = setup_model(lm_data, "awd_lstm_lm")
    decoder = model.decoder
    assert isinstance(decoder.embed_tokens, torch.nn.Embedding) and decoder.embed_tokens.embedding_dim == 400
    assert decoder.lstm.layer_sizes == [1150, 1150, 400]
    assert [layer.weight_drop for layer in decoder.lstm.layers] == [0.5, 0.5, 0.5]
    assert (decoder.input_dropout, decoder.lstm.hidden_dropout, decoder.output_dropout) == (0.4, 0.25, 0.4)
    assert (decoder.embed_dropout, decoder.ar_alpha, decoder.tar_beta) == (0.1, 2.0, 1.0)
    assert decoder.output_projection.weight is decoder.embed_tokens.weight and decoder.project_out_dim is None

    _, _, model = setup_model(lm_data, "awd_lstm_lm_define")
    decoder = model.decoder
    embed = decoder.embed_tokens
    assert isinstance(embed, DeFINEEmbedding) and embed.weight.shape[1] == 128 and embed.embedding_dim == 400
    assert len(embed.define.layers) == 7
    assert decoder.lstm.layer_sizes == [1150, 1150, 128]
    assert decoder.output_projection.weight is embed.weight and decoder.project_out_dim is None
    assert [layer.weight_drop for layer in decoder.lstm.layers] == [0.5, 0.5, 0.5]

    _, _, untied = setup_model(lm_data, "awd_lstm_lm", *TINY_AWD, "--awd-untie-output")
    assert untied.decoder.output_projection.weight is not untied.decoder.embed_tokens.weight


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--input-layer", "define", "--define-depth", "0"], "--input-layer define needs --define-depth >= 1"),
        (["--awd-embed-dropout", "1.0"], "--awd-embed-dropout=1.0"),
        (["--awd-hidden-dropout", "-0.5"], "--awd-hidden-dropout=-0.5"),
    ],
)
def test_bad_configurations_raise_clear_errors(lm_data, flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        setup_model(lm_data, "awd_lstm_lm", *TINY_AWD, *flags)


@pytest.mark.parametrize("arch,flags", [("awd_lstm_lm", TINY_AWD), ("awd_lstm_lm_define", TINY_AWD_DEFINE)])
def test_regularization_equals_a_plain_recomputation(lm_data, arch, flags):
    """AR + TAR = alpha * mean(dropped^2) + beta * mean(diff(raw)^2) of the last layer, in training only."""
    _, task, model = setup_model(lm_data, arch, *flags, "--awd-ar-alpha", "1.5", "--awd-tar-beta", "0.7")
    decoder = model.decoder
    seen = {}
    decoder.lstm.register_forward_hook(lambda module, args, output: seen.__setitem__("raw", output[0]))
    tokens = lm.tokens_batch(len(task.target_dictionary), batch=4, length=11)
    model.train()
    dropped, extra = model(tokens, features_only=True)  # the tied dimension is the last layer's: no projection
    raw = seen["raw"]
    assert dropped.shape == raw.shape and not torch.allclose(dropped, raw)  # output dropout was applied
    expected = 1.5 * dropped.pow(2).mean() + 0.7 * (raw[:, 1:] - raw[:, :-1]).pow(2).mean()
    torch.testing.assert_close(extra["regularization"], expected)
    extra["regularization"].backward()  # it is differentiable w.r.t. the model
    assert decoder.lstm.layers[-1].lstm.weight_hh_l0.grad.abs().sum() > 0
    model.eval()
    assert "regularization" not in model(tokens)[1]


def test_awd_regularizers_are_active_in_training_only(lm_data):
    _, task, model = setup_model(lm_data, "awd_lstm_lm", *TINY_AWD)
    tokens = lm.tokens_batch(len(task.target_dictionary))
    model.eval()
    reference = lm.log_probs(model, tokens)
    torch.testing.assert_close(lm.log_probs(model, tokens), reference)
    model.train()
    decoder = model.decoder
    decoder.input_dropout = decoder.output_dropout = decoder.lstm.hidden_dropout = decoder.embed_dropout = 0.0
    for layer in decoder.lstm.layers:  # weight drop alone changes the output, and differently every call
        layer.weight_drop = 0.5
    first, second = (torch.log_softmax(model(tokens)[0], -1).detach() for _ in range(2))
    assert not torch.allclose(first, reference) and not torch.allclose(first, second)
    for layer in decoder.lstm.layers:
        layer.weight_drop = 0.0
    torch.testing.assert_close(torch.log_softmax(model(tokens)[0], -1).detach(), reference, rtol=1e-5, atol=1e-5)
    decoder.embed_dropout = 0.5  # embedding dropout alone
    assert not torch.allclose(torch.log_softmax(model(tokens)[0], -1).detach(), reference)


def test_lm_regularized_loss_adds_the_penalty_per_token(lm_data):
    cfg, task, model = setup_model(
        lm_data, "awd_lstm_lm_define", *TINY_AWD_DEFINE, "--criterion", "lm_regularized_loss"
    )
    criterion = task.build_criterion(cfg.criterion)
    assert isinstance(criterion, LMRegularizedLoss)
    dictionary = task.target_dictionary
    pad = dictionary.pad()
    tokens = lm.tokens_batch(len(dictionary), length=10)
    target = torch.roll(tokens, -1, dims=1)
    target[2, -4:] = pad
    ntokens = int(target.ne(pad).sum())
    sample = {
        "net_input": {"src_tokens": tokens, "src_lengths": torch.full((3,), 10)},
        "target": target,
        "ntokens": ntokens,
        "nsentences": 3,
    }
    model.train()
    torch.manual_seed(5)
    loss, sample_size, logging_output = criterion(model, sample)
    torch.manual_seed(5)  # the same dropout masks
    net_output = model(tokens)
    lprobs = torch.log_softmax(net_output[0], -1)
    nll = -lprobs.gather(-1, target.unsqueeze(-1))[..., 0][target.ne(pad)].sum()
    penalty = net_output[1]["regularization"]
    assert penalty > 0 and sample_size == ntokens
    torch.testing.assert_close(logging_output["nll_loss"], nll.detach())
    torch.testing.assert_close(loss, nll + penalty * ntokens)

    from fairseq.logging import metrics

    with metrics.aggregate() as aggregated:
        LMRegularizedLoss.reduce_metrics([logging_output])
    values = aggregated.get_smoothed_values()
    assert values["loss"] == pytest.approx(loss.item() / ntokens / math.log(2), abs=1e-3)
    assert values["nll_loss"] == pytest.approx(nll.item() / ntokens / math.log(2), abs=1e-3)
    assert values["ppl"] == pytest.approx(2 ** values["nll_loss"], rel=1e-2)  # from the NLL, without the penalty


def test_lm_regularized_loss_with_adaptive_softmax_counts_every_target(lm_data):
    cfg, task, model = setup_model(
        lm_data, "lstm_lm_define_wt103_n3", *LSTM_TINY, *ADAPTIVE, "--criterion", "lm_regularized_loss"
    )
    criterion = task.build_criterion(cfg.criterion)
    model.eval()
    dictionary = task.target_dictionary
    pad = dictionary.pad()
    tokens = lm.tokens_batch(len(dictionary), length=10)
    target = torch.roll(tokens, -1, dims=1)
    target[0, 0] = 10 + pad  # the tail word whose index inside its cluster equals the padding index
    target[1, -3:] = pad
    sample = {
        "net_input": {"src_tokens": tokens, "src_lengths": torch.full((3,), 10)},
        "target": target,
        "ntokens": int(target.ne(pad).sum()),
        "nsentences": 3,
    }
    with torch.no_grad():
        loss, sample_size, logging_output = criterion(model, sample)
        lprobs = model.get_normalized_probs(model(tokens), log_probs=True)  # the whole distribution
    keep = target.ne(pad)
    expected = -lprobs.gather(-1, target.unsqueeze(-1))[..., 0][keep].sum()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-4)
    assert sample_size == keep.sum() == logging_output["ntokens"]
    torch.testing.assert_close(logging_output["nll_loss"], expected, rtol=1e-5, atol=1e-4)


def test_generation_scores_equal_the_full_pass(lm_data):
    _, task, model = setup_model(lm_data, "awd_lstm_lm_define", *TINY_AWD_DEFINE)
    lm.check_beam_search_scores(model, task.target_dictionary, max_len_b=6, seed=2)


def test_train_and_eval_lm(lm_data, tmp_path):
    flags = (*TINY_AWD, "--criterion", "lm_regularized_loss", *ADAM, *BATCHES)
    checkpoint = lm.trained_checkpoint(lm_data, tmp_path, "awd_lstm_lm", *flags)
    loss, ppl = lm.eval_lm(lm_data, checkpoint, *BATCHES)
    assert math.isfinite(loss) and ppl == pytest.approx(2**loss, rel=1e-3)


def test_stateful_training_and_eval(lm_data, tmp_path):
    """AWD-LSTM's setting: --task stateful_lm (variable BPTT); eval-lm with one stream is one pass over the split."""
    flags = (*TINY_AWD_DEFINE, "--criterion", "lm_regularized_loss", *ADAM, "--variable-bptt")
    flags += ("--batch-size", "4", "--tokens-per-sample", "8")
    checkpoint = lm.trained_checkpoint(lm_data, tmp_path, "awd_lstm_lm_define", *flags, task="stateful_lm", updates=6)
    loss, _ = lm.eval_lm(lm_data, checkpoint, "--task", "stateful_lm", "--batch-size", "1", "--tokens-per-sample", "8")
    model, task = lm.load(checkpoint)
    assert loss == pytest.approx(lm.split_nll_bits(model, lm_data, task.target_dictionary), abs=2e-4)


# -- the AWD-LSTM flags were spelled --define-* before the first release -------------------------------------


def test_the_old_spellings_are_not_flags(lm_data):
    with pytest.raises(SystemExit):
        setup_model(lm_data, "awd_lstm_lm", *TINY_AWD, "--define-weight-drop", "0.3")
