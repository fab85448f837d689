"""models/input_layer.py: every family's input layer, its flags resolved once, then built, and tied to an output."""

from argparse import Namespace

import pytest
import torch
import torch.nn as nn
from fairseq.data import Dictionary
from test_define_config import DEFAULTS

from define_fairseq.models.input_layer import InputLayer, build_input_layer, resolve_input_layer, tie_output
from define_fairseq.modules import AdaptiveInput, DeFINEEmbedding, FoldedDeFINEEmbedding, ProjectiveEmbedding


def dictionary(words: int = 40) -> Dictionary:
    d = Dictionary()
    for i in range(words):
        d.add_symbol(f"w{i}")
    return d


def config(**overrides) -> Namespace:
    """The DeFINE flags of test_define_config's unit (n = 16 there: 8 here), and the input-layer flags."""
    values = dict(
        DEFAULTS,
        define_n=8,
        define_k=32,
        input_layer="table",
        define_folded=False,
        adaptive_input=False,
        adaptive_input_cutoff=None,
        adaptive_input_factor=4,
    )
    values.update(overrides)
    return Namespace(**values)


def build(cfg: Namespace, d: Dictionary, width: int = 16, **options) -> InputLayer:
    return build_input_layer(resolve_input_layer(cfg, d, width, "--width", **options))


def test_each_kind_builds_its_module_and_says_what_an_output_ties_to():
    d = dictionary()
    embed, _, tied, cutoff = build(config(), d)
    assert type(embed) is nn.Embedding and embed.weight.shape == (len(d), 16) and tied == 16 and cutoff is None
    assert torch.equal(embed.weight[d.pad()], torch.zeros(16))
    embed, _, tied, _ = build(config(input_layer="projective"), d)
    assert isinstance(embed, ProjectiveEmbedding) and embed.weight.shape == (len(d), 8) and tied == 8
    embed, _, tied, _ = build(config(input_layer="define"), d)
    assert isinstance(embed, DeFINEEmbedding) and embed.weight.shape == (len(d), 8) and tied == 8
    assert embed.embedding_dim == 16
    embed, _, _, _ = build(config(input_layer="define", define_folded=True), d)
    assert isinstance(embed, FoldedDeFINEEmbedding) and embed.folded.shape == (len(d), 16)


def test_the_family_initialises_its_table():
    embed = build(config(), dictionary(), table_init=lambda w: nn.init.constant_(w, 0.5))
    assert embed.embed.weight[5].eq(0.5).all()
    scaled = build(config(), dictionary(), scaled_table=True).embed
    assert isinstance(scaled, ProjectiveEmbedding) and scaled.projection is None


def test_an_adaptive_map_under_a_table_or_a_define_unit_and_folded():
    d = dictionary(40)  # 44 symbols with fairseq's 4 specials
    adaptive = dict(adaptive_input=True, adaptive_input_cutoff="10,20", adaptive_input_factor=2)
    embed, _, tied, cutoff = build(config(**adaptive), d, adaptive_map=True)
    assert isinstance(embed, AdaptiveInput) and tied == 16 and cutoff == [10, 20, len(d)]
    unit, _, _, _ = build(config(input_layer="define", **adaptive), d, adaptive_map=True)
    assert isinstance(unit.adaptive, AdaptiveInput) and unit.table is None
    folded = unit.fold()
    assert folded.adaptive is unit.adaptive  # a tied adaptive softmax stays tied
    assert folded.weights_for_band(1)[0] is unit.weights_for_band(1)[0]
    tokens = torch.randint(0, len(d), (3, 7), generator=torch.Generator().manual_seed(0))
    unit.eval()
    with torch.enable_grad():  # the DeFINE unit itself, not the eval-mode table
        reference = unit(tokens).detach()
    torch.testing.assert_close(folded(tokens), reference, rtol=1e-6, atol=1e-6)
    built, _, _, _ = build(config(input_layer="define", define_folded=True, **adaptive), d, adaptive_map=True)
    assert built.state_dict().keys() == folded.state_dict().keys()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(input_layer="bag"), "--input-layer bag: choose one of table, projective, define"),
        (
            dict(define_folded=True),
            "--define-folded needs a DeFINE unit (--input-layer define), not --input-layer table",
        ),
        (dict(input_layer="define", define_depth=0), "--input-layer define needs --define-depth >= 1 (got 0)"),
        (dict(input_layer="define", define_n=0), "--define-n=0 must be at least 1"),
        (dict(input_layer="projective", define_n=16), "--input-layer projective with --define-n 16 = --width"),
        (dict(adaptive_input=True), "--adaptive-input needs --adaptive-input-cutoff"),
        (
            dict(input_layer="projective", adaptive_input=True, adaptive_input_cutoff="10,20"),
            "--adaptive-input needs --input-layer table or define, not projective",
        ),
    ],
)
def test_impossible_settings_name_the_flags(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(config(**overrides), dictionary(), adaptive_map=True)


def test_only_a_family_with_an_adaptive_map_reads_the_adaptive_flags():
    # fairseq's translation Transformers carry --adaptive-input without a cutoff flag: nothing to build from it
    embed = build(config(adaptive_input=True), dictionary()).embed
    assert type(embed) is nn.Embedding
    # a cutoff without --adaptive-input (what fairseq's wiki103 arch leaves under Hydra) builds the plain map
    embed = build(config(adaptive_input_cutoff="10,20"), dictionary(), adaptive_map=True)
    assert type(embed.embed) is nn.Embedding


def test_a_family_that_names_its_kind_otherwise_is_named_by_its_flag():
    with pytest.raises(ValueError, match="--decoder-input-layer define needs --define-depth"):
        build(config(define_depth=0), dictionary(), kind="define", kind_flag="--decoder-input-layer")


def test_an_output_layer_ties_to_the_table_and_nothing_else():
    d = dictionary()
    layer = build(config(input_layer="define"), d)
    output = tie_output(layer, nn.Linear(8, len(d)), "--tie")
    assert output.weight is layer.embed.weight and layer.weight is layer.embed.weight
    with pytest.raises(ValueError, match=r"--tie: the output layer is \[44, 16\], the input layer's table \[44, 8\]"):
        tie_output(layer, nn.Linear(16, len(d)), "--tie")
    adaptive = build(config(adaptive_input=True, adaptive_input_cutoff="10,20"), d, adaptive_map=True)
    assert adaptive.weight is None
    with pytest.raises(ValueError, match="--tie: a full softmax cannot be tied to an adaptive input"):
        tie_output(adaptive, nn.Linear(16, len(d)), "--tie")


def test_the_spec_is_plain_values_read_once():
    cfg = config(input_layer="define")
    spec = resolve_input_layer(cfg, dictionary(), 16, "--width")
    cfg.define_n = 1000  # building reads the spec, never the configuration again
    layer = build_input_layer(spec)
    assert spec.n == layer.tied_width == 8 and layer.embed.weight.shape[1] == 8
    with pytest.raises(AttributeError):
        spec.n = 4  # frozen
