"""gcnn_lm: the layer spec, causal gated convolutions against a plain re-computation, incremental decoding,
parameter counts, the fairseq programs and clear errors."""

import re

import lm_helpers as lm
import pytest
import torch
from arch_cases import GCNN, GCNN_TINY as TINY
from conftest import fairseq_train, needs_fairseq_eos_blocks, setup_model

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)
from define_fairseq.models import gcnn_lm
from define_fairseq.modules.gated_conv import (
    ACTIVATIONS,
    CausalConv1d,
    GatedConvLayer,
    GatedConvStack,
    parse_layer_spec,
    receptive_field,
)
from define_fairseq.tools.params import parameter_breakdown

WT103_VOCAB = 267_735
# the gated convolutional LM's training: Nesterov's momentum with the gradient clipped; 256 tokens per batch
NAG = ["--optimizer", "nag", "--lr", "0.5", "--clip-norm", "0.1", "--tokens-per-sample", "32", "--max-tokens", "256"]


# -- the layer specification -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,blocks,convs,field",
    [
        (gcnn_lm.GCNN_8, 8, 8, 25),
        (gcnn_lm.GCNN_14, 14, 14, 47),
        (gcnn_lm.GCNN_13, 13, 13, 40),
        (gcnn_lm.GCNN_8B, 8, 22, 25),
        (gcnn_lm.GCNN_14B, 14, 40, 57),
    ],
)
def test_arch_tables_give_the_papers_depths_and_receptive_fields(spec, blocks, convs, field):
    parsed = parse_layer_spec(spec)
    assert len(parsed) == blocks and sum(len(b) for b in parsed) == convs
    assert receptive_field(parsed) == field


def test_spec_forms():
    assert parse_layer_spec("[(8, 3)] * 2 + [[(4, 1), (4, 3), (8, 1)]]") == [
        [(8, 3)],
        [(8, 3)],
        [(4, 1), (4, 3), (8, 1)],
    ]
    assert parse_layer_spec([(8, 3), [(4, 1), (8, 1)]]) == [[(8, 3)], [(4, 1), (8, 1)]]
    assert parse_layer_spec("(8, 2)") == [[(8, 2)]]


@pytest.mark.parametrize(
    "spec,message",
    [
        ("[(8, 0)]", "kernel width 0"),
        ("[(0, 3)]", "width 0"),
        ("[[(16, 1), (16, 3), (8, 1)]]", "bottleneck block 0 widens to 16"),
        ("[(8, 3, 1)]", "a layer is a (width, kernel) tuple"),
        ("[(8, 3)] * 2 + __import__('os')", "only integers"),
        ("[(8, 3)", "is not a Python list"),
        ("[]", "non-empty list"),
        ("[[]]", "block 0 is empty"),
    ],
)
def test_impossible_specs_raise_naming_the_argument(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        parse_layer_spec(spec)
    assert str(error.value).startswith("blocks ")


# -- numerics against a plain re-computation ---------------------------------------------------------------------


def reference_conv(x, v, g, bias, kernel):
    """y[t] = bias + sum_j W_j x[t - (kernel - 1) + j], zeros before the start; W = g v / ||v|| per output row."""
    weight = torch.stack([g[o] * v[o] / v[o].norm() for o in range(v.shape[0])])
    B, T, C = x.shape
    out = []
    for t in range(T):
        acc = bias.clone().expand(B, -1)
        for j in range(kernel):
            s = t - (kernel - 1) + j
            if s >= 0:
                acc = acc + x[:, s] @ weight[:, j * C : (j + 1) * C].T
        out.append(acc)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("kernel", [1, 4])
def test_weight_normalised_causal_conv_equals_the_plain_formula(kernel):
    torch.manual_seed(0)
    conv = CausalConv1d(5, 6, kernel)
    with torch.no_grad():
        conv.weight_g.mul_(torch.rand(6) + 0.5)  # g no longer equals ||v||
        conv.bias.normal_()
    x = torch.randn(2, 7, 5, requires_grad=True)
    y = conv(x)
    expected = reference_conv(x, conv.weight_v, conv.weight_g, conv.bias, kernel)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, conv.weight_v, conv.weight_g), grad)
    want = torch.autograd.grad(expected, (x, conv.weight_v, conv.weight_g), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gates_equal_the_papers_formulas(activation):
    torch.manual_seed(1)
    layer = GatedConvLayer(4, 3, 2, activation=activation)
    conv = layer.conv
    with torch.no_grad():
        conv.bias.normal_()
    x = torch.randn(2, 5, 4)
    y = reference_conv(x, conv.weight_v, conv.weight_g, conv.bias, 2)
    if activation in ("glu", "gtu", "bilinear"):
        a, b = y[..., :3], y[..., 3:]  # value (X*W + b), gate (X*V + c)
        expected = {"glu": a * torch.sigmoid(b), "gtu": torch.tanh(a) * torch.sigmoid(b), "bilinear": a * b}
    else:
        expected = {"relu": y.clamp(min=0), "tanh": torch.tanh(y), "linear": y}
    torch.testing.assert_close(layer(x), expected[activation], rtol=1e-5, atol=1e-6)


def test_blocks_add_the_input_and_project_where_the_width_changes():
    torch.manual_seed(2)
    stack = GatedConvStack(6, "[(6, 3)] + [[(4, 1), (4, 2), (10, 1)]]", residual_scale=0.5)
    x = torch.randn(2, 5, 6)
    first, second = stack.blocks
    h = 0.5 * (x + first.layers[0](x))
    inner = second.layers[2](second.layers[1](second.layers[0](h)))
    proj = second.projection
    assert first.projection is None and proj.kernel == 1
    expected = 0.5 * (inner + reference_conv(h, proj.weight_v, proj.weight_g, proj.bias, 1))
    torch.testing.assert_close(stack(x)[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec,embed", [(gcnn_lm.GCNN_14, 280), (gcnn_lm.GCNN_14B, 128)])
def test_deep_stacks_start_at_the_scale_of_their_input(spec, embed):
    """Identity skips add the residual branches' variance up; each branch starts scaled by 1/sqrt(blocks), so the
    output of the deepest tables stays within a small factor of the input (unscaled: x500 and x50,000)."""
    torch.manual_seed(4)
    stack = GatedConvStack(embed, spec)
    x = 0.1 * torch.randn(1, 24, embed)
    with torch.no_grad():
        y, _ = stack(x)
    assert 0.5 < (y.std() / x.std()).item() < 4.0


def test_inference_reuses_the_normalised_weight_until_a_parameter_changes():
    torch.manual_seed(3)
    conv = CausalConv1d(4, 4, 3).eval()
    x = torch.randn(1, 6, 4)
    with torch.no_grad():
        before = conv(x)
        assert conv._weight.value is not None
        conv.weight_g.mul_(2.0)  # e.g. an optimizer step in between
        after = conv(x)
        torch.testing.assert_close(after - conv.bias, 2 * (before - conv.bias))
        conv.load_state_dict({k: torch.randn_like(v) for k, v in conv.state_dict().items()})
        expected = reference_conv(x, conv.weight_v, conv.weight_g, conv.bias, 3)
        torch.testing.assert_close(conv(x), expected, rtol=1e-5, atol=1e-5)


def test_without_weight_norm_the_weight_is_the_parameter():
    conv = CausalConv1d(3, 2, 2, weight_norm=False)
    assert {name for name, _ in conv.named_parameters()} == {"weight", "bias"}
    x = torch.randn(1, 4, 3)
    expected = reference_conv(x, conv.weight, conv.weight.norm(dim=1), conv.bias, 2)
    torch.testing.assert_close(conv(x), expected, rtol=1e-5, atol=1e-6)


# -- the model: causality, incremental decoding, beam search -----------------------------------------------------

CASES = {
    "full softmax": TINY,
    "adaptive softmax, bottleneck": TINY + ["--adaptive-softmax-cutoff", "20,40"],
    "DeFINE input, gtu": TINY
    + [
        "--input-layer",
        "define",
        "--define-n",
        "8",
        "--define-k",
        "32",
        "--define-depth",
        "2",
        "--gcnn-activation",
        "gtu",
        "--gcnn-residual-scale",
        "0.7071",
    ],
}


@pytest.fixture(scope="module", params=list(CASES))
def case_model(request, lm_data):
    """Each case's model in eval mode, built once for the tests that only run it, and its vocabulary size."""
    _, task, model = setup_model(lm_data, "gcnn_lm", *CASES[request.param])
    return model.eval(), len(task.target_dictionary)


def test_changing_a_token_never_changes_an_earlier_output(case_model):
    model, vocab = case_model
    tokens = lm.tokens_batch(vocab, batch=2, length=14)
    base = lm.log_probs(model, tokens)
    field = model.decoder.convolutions.receptive_field
    for t in (1, 6, 13):
        changed = tokens.clone()
        changed[:, t] = 4 + (changed[:, t] - 3) % (vocab - 4)
        out = lm.log_probs(model, changed)
        assert torch.equal(out[:, :t], base[:, :t])
        assert (out[:, t] - base[:, t]).abs().max() > 1e-4  # the output at t reads token t ...
        if t + field < tokens.shape[1]:
            assert torch.equal(out[:, t + field :], base[:, t + field :])  # ... and nothing beyond its field does


def test_incremental_decoding_and_reordering_equal_the_full_pass(case_model):
    model, vocab = case_model
    lm.check_incremental_decoding(model, lm.tokens_batch(vocab, length=12), first=3, split=6)


def test_beam_search_scores_equal_the_full_pass(lm_data):
    _, task, model = setup_model(lm_data, "gcnn_lm", *CASES["adaptive softmax, bottleneck"])
    lm.check_beam_search_scores(model, task.target_dictionary)


# -- parameter counts and the arch defaults ----------------------------------------------------------------------


def gated_conv_params(in_dim, width, kernel, gated=True):
    out = 2 * width if gated else width
    return out * kernel * in_dim + 2 * out  # weight_v, then weight_g and the bias


def body_params(embed, spec):
    total, width = 0, embed
    for block in parse_layer_spec(spec):
        block_in = width
        for out, kernel in block:
            total += gated_conv_params(width, out, kernel)
            width = out
        if width != block_in:
            total += width * block_in + 2 * width  # the weight-normalised 1x1 projection of the skip
    return total


@pytest.fixture(scope="module")
def big_dictionary_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("wt103-dict")
    (directory / "dict.txt").write_text("".join(f"w{i} 1\n" for i in range(WT103_VOCAB - 4)))
    return directory


@pytest.mark.parametrize(
    "arch,embed,spec,cutoff",
    [
        ("gcnn_lm_8", 280, gcnn_lm.GCNN_8, [10000, 20000, 200000]),
        ("gcnn_lm_14", 280, gcnn_lm.GCNN_14, [10000, 20000, 200000]),
        ("gcnn_lm_13", 128, gcnn_lm.GCNN_13, [10000, 50000, 200000]),
        ("gcnn_lm_8b", 128, gcnn_lm.GCNN_8B, [10000, 50000, 200000]),
        ("gcnn_lm_14b", 128, gcnn_lm.GCNN_14B, [10000, 50000, 200000]),
    ],
)
def test_arch_parameter_counts(big_dictionary_dir, arch, embed, spec, cutoff):
    with torch.device("meta"):
        _, task, model = setup_model(big_dictionary_dir, arch)
    decoder = model.decoder
    vocab = len(task.target_dictionary)
    assert decoder.embed_tokens.weight.shape == (vocab, embed)
    assert decoder.adaptive_softmax.cutoff == cutoff + [vocab]
    assert decoder.dropout == 0.0
    counts = parameter_breakdown(model)
    assert counts["context"] == body_params(embed, spec) == sum(p.numel() for p in decoder.convolutions.parameters())
    print(f"{arch}: body {counts['context'] / 1e6:.2f}M, input/output {counts['input/output'] / 1e6:.2f}M")


def test_gcnn_lm_14_has_fairseqs_wikitext103_layers_with_the_first_reading_the_lookup(big_dictionary_dir):
    """fconv_lm_dauphin_wikitext103 has the same layer table, but projects the lookup (e = 280) to 850 with fc1
    before the first convolution; ours convolves the lookup itself, and the first block's skip has the
    projection instead (the size of fc1)."""
    with torch.device("meta"):
        _, _, ours = setup_model(big_dictionary_dir, "gcnn_lm_14")
        _, _, theirs = setup_model(
            big_dictionary_dir,
            "fconv_lm_dauphin_wikitext103",
            "--criterion",
            "adaptive_loss",
            "--adaptive-softmax-cutoff",
            "10000,20000,200000",
        )
    layers = ours.decoder.convolutions.layers()
    assert len(layers) == len(theirs.decoder.convolutions) == 14
    for i, (layer, conv) in enumerate(zip(layers, theirs.decoder.convolutions)):
        kernel, in_dim, out_dim = conv.weight_v.shape  # fairseq's ConvTBC layout
        assert (layer.kernel, 2 * layer.out_dim) == (kernel, out_dim)
        assert layer.in_dim == (280 if i == 0 else in_dim)
    assert in_dim == 1024 and theirs.decoder.convolutions[0].weight_v.shape[1] == 850
    fc1 = sum(p.numel() for p in theirs.decoder.fc1.parameters())
    assert sum(p.numel() for p in ours.decoder.convolutions.blocks[0].projection.parameters()) == fc1


# -- the fairseq programs ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(lm_data, tmp_path_factory):
    return lm.trained_checkpoint(lm_data, tmp_path_factory.mktemp("gcnn"), "gcnn_lm", *GCNN, *NAG, updates=4)


def test_eval_lm_equals_scoring_each_block_in_process(lm_data, checkpoint):
    """fairseq-eval-lm's blocks of 32 tokens, each from a zero-padded start."""
    loss, _ = lm.eval_lm(lm_data, checkpoint, "--tokens-per-sample", "32", "--max-tokens", "256")
    model, task = lm.load(checkpoint)
    assert loss == pytest.approx(lm.split_nll_bits(model, lm_data, task.target_dictionary, 32), abs=2e-4)


@needs_fairseq_eos_blocks
def test_fairseq_generate_continues_a_prefix(lm_data, checkpoint):
    lm.check_generate_continues_a_prefix(lm_data, checkpoint, "--beam", "3")


def test_checkpoint_round_trip(lm_data, checkpoint, tmp_path):
    from fairseq import checkpoint_utils

    model, task = lm.load(checkpoint)
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert state["cfg"]["model"]["_name"] == "gcnn_lm"
    tokens = lm.tokens_batch(len(task.target_dictionary), length=12)
    before = lm.log_probs(model, tokens)
    path = tmp_path / "again.pt"
    checkpoint_utils.torch_persistent_save(state, str(path))  # what fairseq-train writes, re-read from disk
    again, _ = lm.load(path)
    torch.testing.assert_close(lm.log_probs(again, tokens), before, rtol=0, atol=0)
    fresh = setup_model(lm_data, "gcnn_lm", *TINY, "--adaptive-softmax-cutoff", "20,40")[2].eval()
    assert not torch.allclose(lm.log_probs(fresh, tokens), before)  # the weights are the trained ones
    fresh.load_state_dict(state["model"])
    torch.testing.assert_close(lm.log_probs(fresh, tokens), before, rtol=0, atol=0)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--gcnn-layers", "[(16, 0)]"], "kernel width 0"),
        (["--gcnn-layers", "[[(32, 1), (32, 3), (16, 1)]]"], "inner layers of a bottleneck"),
        (["--adaptive-softmax-cutoff", "20,400"], "--adaptive-softmax-cutoff"),
        (["--dropout", "1.0"], "--dropout"),
        (["--gcnn-residual-scale", "0"], "--gcnn-residual-scale"),
        (["--input-layer", "define", "--define-depth", "0"], "--input-layer define needs --define-depth"),
    ],
)
def test_impossible_configs_fail_clearly(lm_data, flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        setup_model(lm_data, "gcnn_lm", "--decoder-embed-dim", "16", *flags)


def test_fairseq_train_reports_a_bad_spec_by_its_flag(lm_data, tmp_path):
    flags = ("--gcnn-layers", "[(16, 0)]", *NAG, "--max-update", "1")
    proc = fairseq_train(lm_data, tmp_path, "gcnn_lm_8", *flags, task="language_modeling", check=False)
    assert proc.returncode != 0
    assert "--gcnn-layers" in proc.stderr and "kernel width 0" in proc.stderr


@pytest.mark.parametrize("arch", ["gcnn_lm_8", "gcnn_lm_14", "gcnn_lm_13", "gcnn_lm_8b", "gcnn_lm_14b"])
def test_every_arch_trains_through_fairseq_train(lm_data, tmp_path, arch):
    """Each registered arch by name, its sizes overridden to fit the toy corpus."""
    checkpoint = lm.trained_checkpoint(lm_data, tmp_path, arch, *GCNN, *NAG, updates=2)
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert state["cfg"]["model"]["_name"] == arch  # fairseq records the arch name there
