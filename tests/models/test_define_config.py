"""The models build DeFINE through one function, which maps the unit's argument names to the flags that set them."""

import re
from argparse import Namespace

import pytest

from define_fairseq.models.define_config import DEFINE_FLAGS
from define_fairseq.models.input_layer import build_define_embedding

DEFAULTS = dict(
    define_n=16,
    define_k=64,
    define_depth=3,
    define_max_groups=4,
    define_variant="define",
    define_activation=None,
    define_norm=None,
    define_dropout=0.0,
    define_init="unit",
    define_map_dropout=0.0,
    define_output_norm="none",
)


def build(m=32, options=None, **overrides):
    return build_define_embedding(
        Namespace(**{**DEFAULTS, **overrides}), 50, 1, m, "--decoder-embed-dim", **(options or {})
    )


def test_the_defaults_build():
    assert build().embedding_dim == 32


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(define_n=62),
            "--define-n=62: is not divisible by the 4 groups of the first layer (--define-max-groups=4)",
        ),
        (dict(define_n=128), "--define-n=128: is larger than the expansion width --define-k=64"),
        (dict(define_k=63), "--define-k=63: is not divisible by the 2 groups"),
        (dict(define_depth=1), "--define-depth=1: DeFINE needs at least 2 layers"),
        (dict(define_max_groups=3), "--define-max-groups=3: must be a power of two"),
        (dict(define_variant="shuffle"), "--define-variant='shuffle': unknown"),
        (dict(define_activation="mish"), "--define-activation='mish': unknown"),
        (dict(define_norm="batch"), "--define-norm='batch': unknown"),
        (dict(define_init="xavier"), "--define-init='xavier': unknown"),
        (dict(define_dropout=1.0), "--define-dropout=1.0: a dropout probability"),
        (dict(define_map_dropout=-0.5), "--define-map-dropout=-0.5: a dropout probability"),
        (dict(define_variant="delight", define_norm="layer"), "--define-norm='layer': the authors' unit normalises"),
        (dict(define_output_norm="group"), "--define-output-norm='group': unknown; choose one of none, layer"),
        (
            dict(define_variant="delight", define_output_norm="layer"),
            "--define-output-norm='layer': the authors' unit (--define-variant='delight') normalises its output "
            "already; leave it at 'none'",
        ),
    ],
)
def test_errors_name_the_flag(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build(**overrides)


def test_the_width_is_named_by_the_models_flag():
    with pytest.raises(ValueError, match=re.escape("--decoder-embed-dim=31: the authors' unit projects")):
        build(m=31, define_variant="delight")


def test_the_adaptive_maps_factor_is_named_by_its_flag():
    with pytest.raises(ValueError, match=re.escape("--adaptive-input-factor=4: band 2 would have")):
        build(options=dict(adaptive_cutoff=[10, 20], adaptive_factor=4), define_n=8)


def test_every_argument_of_the_unit_has_a_flag():
    assert set(DEFINE_FLAGS) >= {
        "n",
        "k",
        "depth",
        "max_groups",
        "variant",
        "activation",
        "norm",
        "dropout",
        "init",
        "map_dropout",
        "output_norm",
    }


def test_a_parameter_named_in_the_requirement_is_shown_by_its_flag_too():
    with pytest.raises(ValueError) as error:
        build(define_n=128)
    assert "--define-k=64" in str(error.value) and " k=" not in str(error.value)
