"""Every language-model family of the plugin's own decoders (``lstm_lm_define``, ``awd_lstm_lm``,
``mogrifier_lstm_lm``, ``gcnn_lm``, ``transformer_xl_lm``) is configured before it is built: ``build_model`` resolves
every flag (read, parsed, checked) into a frozen spec, then builds the decoder from the spec alone
(:class:`~define_fairseq.models.input_layer.InputLayerLanguageModel`). So a bad flag raises, naming the flag, before
any module exists, and the built model is what its spec says."""

import dataclasses
import re
from argparse import Namespace

import pytest
import torch
from arch_cases import CASES, GCNN_TINY, LSTM, TXL_TINY
from conftest import setup_model
from fairseq.models import MODEL_REGISTRY
from fairseq.modules.adaptive_softmax import TiedHeadModule, TiedLinear

import define_fairseq  # noqa: F401  (registers the models)
from define_fairseq.models.adaptive_softmax import AdaptiveSoftmaxSpec

# family -> its sizes shrunk, as configuration fields (the rest: the family's defaults)
TINY = {
    "lstm_lm_define": dict(define_n=16, define_k=32, decoder_hidden_size=24, decoder_layers=2, decoder_embed_dim=24),
    "awd_lstm_lm": dict(decoder_embed_dim=24, decoder_hidden_size=32),
    "mogrifier_lstm_lm": dict(mogrifier_hidden_size=16, mogrifier_rank=4),
    "gcnn_lm": dict(decoder_embed_dim=16, gcnn_layers="[(16, 3)] * 2"),
    "transformer_xl_lm": dict(
        decoder_layers=2,
        decoder_embed_dim=16,
        decoder_attention_heads=2,
        txl_head_dim=6,
        decoder_ffn_embed_dim=24,
        adaptive_softmax_cutoff="20,40",
    ),
}
ADAPTIVE = dict(adaptive_input=True, adaptive_input_cutoff="10,30", adaptive_softmax_cutoff="10,30")

# (family, a bad setting, the start of its error): each flag a module would also check, and each combination
BAD = [
    ("lstm_lm_define", dict(dropout=1.5), "--dropout=1.5: a dropout probability must be in [0, 1)"),
    ("lstm_lm_define", dict(awd_output_dropout=1.0), "--awd-output-dropout=1.0"),
    ("lstm_lm_define", dict(awd_weight_drop=-0.1), "--awd-weight-drop=-0.1"),
    ("lstm_lm_define", dict(awd_embed_dropout=1.0), "--awd-embed-dropout=1.0"),
    ("lstm_lm_define", dict(awd_ar_alpha=-1.0), "--awd-ar-alpha=-1.0 must be >= 0"),
    ("lstm_lm_define", dict(decoder_output_dim=0), "--decoder-output-dim=0 must be at least 1"),
    ("lstm_lm_define", dict(adaptive_softmax_cutoff="10,100"), "--adaptive-softmax-cutoff 10,100: the last cutoff"),
    ("lstm_lm_define", dict(adaptive_softmax_cutoff="ten"), "--adaptive-softmax-cutoff 'ten'"),
    ("lstm_lm_define", dict(adaptive_softmax_dropout=1.0), "--adaptive-softmax-dropout=1.0"),
    (
        "lstm_lm_define",
        dict(adaptive_input=True, adaptive_input_cutoff="10,30", share_decoder_input_output_embed=True),
        "--share-decoder-input-output-embed: a full softmax cannot be tied to an adaptive input",
    ),
    ("lstm_lm_define", dict(**ADAPTIVE, tie_adaptive_weights=True, adaptive_softmax_factor=2), "--tie-adaptive"),
    ("lstm_lm_define", dict(input_layer="define", define_depth=0), "--input-layer define needs --define-depth"),
    ("awd_lstm_lm", dict(awd_hidden_dropout=-0.5), "--awd-hidden-dropout=-0.5"),
    ("awd_lstm_lm", dict(awd_tar_beta=float("nan")), "--awd-tar-beta=nan must be >= 0"),
    ("awd_lstm_lm", dict(decoder_hidden_size=0), "--decoder-hidden-size=0 must be at least 1"),
    ("mogrifier_lstm_lm", dict(mogrifier_state_dropout=1.5), "--mogrifier-state-dropout=1.5"),
    ("mogrifier_lstm_lm", dict(mogrifier_projection_dropout=1.0), "--mogrifier-projection-dropout=1.0"),
    ("mogrifier_lstm_lm", dict(mogrifier_output_dropout=1.0), "--mogrifier-output-dropout=1.0"),
    ("mogrifier_lstm_lm", dict(mogrifier_drop_state_probability=1.0), "--mogrifier-drop-state-probability=1.0"),
    ("mogrifier_lstm_lm", dict(mogrifier_rank=16), "--mogrifier-rank=16: give 0 (full rank)"),
    ("mogrifier_lstm_lm", dict(mogrifier_mos_components=0), "--mogrifier-mos-components=0 must be at least 1"),
    ("gcnn_lm", dict(dropout=1.0), "--dropout=1.0"),
    ("gcnn_lm", dict(gcnn_layers="[(16, 0)]"), "--gcnn-layers '[(16, 0)]': block 0 has kernel width 0"),
    ("gcnn_lm", dict(gcnn_activation="sigmoid"), "--gcnn-activation='sigmoid': unknown"),
    ("gcnn_lm", dict(adaptive_softmax_cutoff="20,400"), "--adaptive-softmax-cutoff 20,400"),
    (
        "gcnn_lm",
        dict(adaptive_softmax_cutoff="20,40", adaptive_softmax_factor=16),
        "--adaptive-softmax-cutoff 20,40: tail cluster 2 would have 16 // 16**2 = 0 dimensions",
    ),
    ("transformer_xl_lm", dict(attention_dropout=1.0), "--attention-dropout=1.0"),
    ("transformer_xl_lm", dict(adaptive_softmax_dropout=-0.1), "--adaptive-softmax-dropout=-0.1"),
    ("transformer_xl_lm", dict(decoder_ffn_embed_dim=0), "--decoder-ffn-embed-dim=0 must be at least 1"),
    ("transformer_xl_lm", dict(txl_mem_len=-1), "--txl-mem-len=-1 must be >= 0 (0: no memory)"),
] + [  # --torch-compile's flags, in every family
    (family, dict(torch_compile=True, define_token_path="unique"), "--torch-compile needs a DeFINE token path")
    for family in sorted(TINY)
]


class Built(Exception):
    """Raised by the first module constructed (see ``modules_refused``)."""


@pytest.fixture
def modules_refused(monkeypatch):
    """Every ``nn.Module`` constructed from here on raises :class:`Built` naming its class."""

    def refuse(self, *args, **kwargs):
        raise Built(type(self).__name__)

    monkeypatch.setattr(torch.nn.Module, "__init__", refuse)


@pytest.fixture(scope="module")
def lm_task(lm_data):
    return setup_model(lm_data, "lstm_lm_define", *LSTM)[1]


def configuration(family, **overrides):
    return Namespace(**{**TINY[family], **overrides})


@pytest.mark.parametrize("family,overrides,message", BAD)
def test_a_bad_flag_raises_naming_it_before_any_module_is_built(lm_task, modules_refused, family, overrides, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        MODEL_REGISTRY[family].build_model(configuration(family, **overrides), lm_task)


@pytest.mark.parametrize("family", sorted(TINY))
def test_the_spec_is_resolved_without_building_and_the_build_starts_after_it(lm_task, modules_refused, family):
    model = MODEL_REGISTRY[family]
    spec = model.resolve(model.resolved_config(configuration(family)), lm_task.target_dictionary)
    assert spec.input.vocab == len(lm_task.target_dictionary)  # resolved while no module can be built ...
    with pytest.raises(Built):  # ... and building is what comes next (the refusal works)
        model.build_model(configuration(family), lm_task)


def dataclasses_in(value):
    """``value`` and every dataclass inside it."""
    yield value
    for f in dataclasses.fields(value):
        inner = getattr(value, f.name)
        if dataclasses.is_dataclass(inner):
            yield from dataclasses_in(inner)


# settings that give a family's spec its nested specs (an adaptive input, a tied adaptive softmax)
NESTED = {"lstm_lm_define": dict(ADAPTIVE, tie_adaptive_weights=True), "gcnn_lm": dict(adaptive_softmax_cutoff="20,40")}


@pytest.mark.parametrize("family", sorted(TINY))
def test_the_spec_is_frozen(lm_task, family):
    model = MODEL_REGISTRY[family]
    args = model.resolved_config(configuration(family, **NESTED.get(family, {})))
    spec = model.resolve(args, lm_task.target_dictionary)
    parts = list(dataclasses_in(spec))
    assert len(parts) == (3 if family in NESTED else 2)  # the family's, the input layer's, the softmax's
    for part in parts:
        assert type(part).__dataclass_params__.frozen, type(part).__name__
        name = dataclasses.fields(part)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, name, getattr(part, name))
    # the family's own sequences are tuples, so that no part of them changes either (the input layer's spec is the
    # input layer's: tests/models/test_input_layer.py)
    own = [part for part in parts if part is not spec.input]
    assert not any(isinstance(getattr(part, f.name), (list, dict)) for part in own for f in dataclasses.fields(part))


# -- the built model is what its spec says ------------------------------------------------------------------------


def observed_adaptive_softmax(softmax):
    """The :class:`AdaptiveSoftmaxSpec` of a built fairseq ``AdaptiveSoftmax`` (None: none)."""
    if softmax is None:
        return None
    tied = isinstance(softmax.head, TiedHeadModule)
    tie_proj = tied and isinstance(softmax.tail[0][0], TiedLinear)
    dropout = softmax.dropout_module.p
    return AdaptiveSoftmaxSpec(tuple(softmax.cutoff), softmax.input_dim, softmax.factor, dropout, tied, tie_proj)


def the_one(values):
    """The value every one of ``values`` has (a setting of each layer that the spec gives once)."""
    values = set(values)
    assert len(values) == 1, values
    return values.pop()


def observed_recurrent(decoder):
    lstm, embed = decoder.lstm, decoder.embed_tokens
    output = decoder.output_projection
    return dict(
        layer_sizes=tuple(lstm.layer_sizes),
        weight_drop=the_one(layer.weight_drop for layer in lstm.layers),
        hidden_dropout=lstm.hidden_dropout,
        input_dropout=decoder.input_dropout,
        output_dropout=decoder.output_dropout,
        embed_dropout=decoder.embed_dropout,
        ar_alpha=decoder.ar_alpha,
        tar_beta=decoder.tar_beta,
        tie_full_softmax=output is not None and output.weight is embed.weight,
        adaptive_softmax=observed_adaptive_softmax(decoder.adaptive_softmax),
        projects_out=decoder.project_out_dim is not None,
    )


def observed_mogrifier(decoder):
    lstm, output = decoder.lstm, decoder.output_projection
    stack = ("hidden_size", "num_layers", "rounds", "rank", "cap_input_gate", "forget_bias", "input_dropout")
    stack += ("inter_layer_dropout", "state_dropout", "output_dropout", "sum_layer_outputs", "shared_mask_dropout")
    stack += ("state_dropout_per_step", "cuda_graphs")
    return dict(
        **{name: getattr(lstm, name) for name in stack},
        kernels=the_one(layer.kernels for layer in lstm.layers),
        mos_components=output.components,
        projection_dropout=output.dropout,
        softmax_temperature=decoder.softmax_temperature,
        drop_state_probability=decoder.drop_state_probability,
        l2_penalty=decoder.l2_penalty,
    )


def observed_gated_conv(decoder):
    blocks = decoder.convolutions.blocks
    layers = [layer for block in blocks for layer in block.layers]
    return dict(
        blocks=tuple(tuple((layer.out_dim, layer.kernel) for layer in block.layers) for block in blocks),
        activation=the_one(layer.activation for layer in layers),
        weight_norm=the_one(layer.conv.weight_norm for layer in layers),
        dropout=the_one([decoder.dropout] + [layer.dropout for layer in layers]),
        residual_scale=the_one(block.residual_scale for block in blocks),
        adaptive_softmax=observed_adaptive_softmax(decoder.adaptive_softmax),
    )


def observed_transformer_xl(decoder):
    stack, softmax = decoder.stack, decoder.adaptive_softmax
    layers = stack.layers
    return dict(
        num_layers=stack.num_layers,
        heads=stack.num_heads,
        head_dim=stack.head_dim,
        ffn_dim=the_one(layer.feed_forward.fc1.out_features for layer in layers),
        dropout=stack.dropout.p,
        attention_dropout=the_one(layer.attention.attention_dropout.p for layer in layers),
        pre_norm=stack.pre_norm,
        mem_len=stack.mem_len,
        clamp_len=stack.clamp_len,
        same_length=stack.same_length,
        cutoff=tuple(softmax.cutoff[:-1]),
        softmax_dropout=softmax.dropout.p,
    )


OBSERVED = {
    "lstm_lm_define": observed_recurrent,
    "awd_lstm_lm": observed_recurrent,
    "mogrifier_lstm_lm": observed_mogrifier,
    "gcnn_lm": observed_gated_conv,
    "transformer_xl_lm": observed_transformer_xl,
}

# (family, arch, flags): each family's structures (a tied full softmax with a projection, tied and untied adaptive
# softmaxes, a DeFINE input, a mixture of softmaxes, a full softmax), as fairseq-train builds them
BUILT = [
    ("lstm_lm_define", "lstm_lm_define", CASES["lstm_lm_define"][1]),
    ("lstm_lm_define", "lstm_lm_define_wt103_n3", CASES["lstm_lm_define_wt103_n3"][1] + ["--decoder-output-dim", "20"]),
    ("lstm_lm_define", "lstm_lm_define", LSTM + ["--decoder-embed-dim", "24", "--adaptive-softmax-cutoff", "10,30"]),
    ("awd_lstm_lm", "awd_lstm_lm_define", CASES["awd_lstm_lm_define"][1] + ["--awd-ar-alpha", "0.5"]),
    ("awd_lstm_lm", "awd_lstm_lm", CASES["awd_lstm_lm"][1] + ["--awd-untie-output"]),
    ("mogrifier_lstm_lm", "mogrifier_lstm_lm_wt2", CASES["mogrifier_lstm_lm_wt2"][1]),
    (
        "mogrifier_lstm_lm",
        "mogrifier_lstm_lm_ptb",
        CASES["mogrifier_lstm_lm_ptb"][1] + ["--mogrifier-kernels", "torch"],
    ),
    ("gcnn_lm", "gcnn_lm", CASES["gcnn_lm"][1]),
    ("gcnn_lm", "gcnn_lm", GCNN_TINY + ["--dropout", "0.2"]),
    ("transformer_xl_lm", "transformer_xl_define_wt103_n64", CASES["transformer_xl_define_wt103_n64"][1]),
    ("transformer_xl_lm", "transformer_xl_lm", TXL_TINY + ["--input-layer", "projective", "--txl-pre-norm"]),
]


@pytest.mark.parametrize("family,arch,flags", BUILT, ids=[f"{arch}-{i}" for i, (_, arch, _) in enumerate(BUILT)])
def test_the_built_model_is_what_its_spec_says(lm_data, monkeypatch, family, arch, flags):
    model_class = MODEL_REGISTRY[family]
    given = []
    build_decoder = model_class.build_decoder

    def recording(spec, dictionary):
        given.append(spec)
        return build_decoder(spec, dictionary)

    monkeypatch.setattr(model_class, "build_decoder", staticmethod(recording))
    cfg, task, model = setup_model(lm_data, arch, *flags)
    # the decoder was built from the spec of its configuration, and from nothing else
    (spec,) = given
    assert spec == model_class.resolve(model_class.resolved_config(cfg.model), task.target_dictionary)
    decoder = model.decoder
    observed = OBSERVED[family](decoder)
    assert observed == {name: getattr(spec, name) for name in observed}
    unobserved = {f.name for f in dataclasses.fields(spec)} - set(observed)
    assert unobserved == {"input"}  # every field but the input layer's own spec, observed below
    embed = decoder.embed_tokens
    assert embed.embedding_dim == spec.input.width
    if spec.input.adaptive_cutoff is None:
        assert tuple(embed.weight.shape) == (spec.input.vocab, spec.input.n)
    else:
        assert embed.weights_for_band(0)[0].shape == (spec.input.adaptive_cutoff[0], spec.input.n)
