"""models/input_config.py: the input-layer options, declared once, resolve to a value in every registered arch."""

from dataclasses import fields

import pytest
from arch_cases import CASES, LM, registered_archs
from conftest import USER_DIR

import define_fairseq  # noqa: F401  (registers the models)
from define_fairseq.models.input_config import AdaptiveInputConfig, InputLayerConfig

# fields whose None is a documented value: the unit's variant chooses (activation, norm), the device (token path);
# no bands (the adaptive input's cutoff, read only under --adaptive-input)
NONE_IS_A_VALUE = {"define_activation", "define_norm", "define_token_path", "adaptive_input_cutoff"}
# family -> (kind, n, depth) of its base arch, each set in one place (input_config or the family's base arch)
BASES = {
    "awd_lstm_lm": ("table", 128, 7),
    "lstm_lm_define": ("define", 256, 3),
    "gcnn_lm": ("table", 128, 3),
    "mogrifier_lstm_lm": ("table", 128, 3),
    "transformer_xl_lm": ("table", 128, 3),
    "transformer_define": ("define", 128, 3),
    "transformer_lm_define": ("define", 128, 3),
    "transformer_c2s": (None, 128, 3),  # its decoder's kind is --decoder-input-layer, a field of its own
}


def resolved(arch: str, data):
    """The configuration ``arch``'s model builds from, as fairseq-train reads the flags (none but the arch's)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.models import ARCH_MODEL_REGISTRY

    task = CASES[arch][0]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(data), "--user-dir", USER_DIR, "--task", task, "--arch", arch])
    cfg = convert_namespace_to_omegaconf(args).model
    return ARCH_MODEL_REGISTRY[arch].resolved_config(cfg)


@pytest.mark.parametrize("arch", sorted(registered_archs()))
def test_every_input_layer_field_resolves_to_a_value(arch, lm_data, translation_data):
    args = resolved(arch, lm_data if CASES[arch][0] == LM else translation_data)
    names = {f.name for f in (*fields(InputLayerConfig), *fields(AdaptiveInputConfig))} - NONE_IS_A_VALUE
    unset = sorted(name for name in names if hasattr(args, name) and getattr(args, name) is None)
    assert not unset, f"{arch} leaves {unset} unset"
    assert args.define_n >= 1 and args.define_depth >= 1


@pytest.mark.parametrize("family", sorted(BASES))
def test_each_family_base_arch_has_its_input_layer(family, lm_data, translation_data):
    args = resolved(family, lm_data if CASES[family][0] == LM else translation_data)
    kind, n, depth = BASES[family]
    assert (getattr(args, "input_layer", None), args.define_n, args.define_depth) == (kind, n, depth)


def test_a_named_arch_changes_only_its_delta(lm_data):
    args = resolved("lstm_lm_define_wt103_n7", lm_data)
    assert (args.input_layer, args.define_n, args.define_depth, args.define_k) == ("define", 384, 7, 1024)
    args = resolved("transformer_xl_define_wt103_n64", lm_data)
    assert (args.input_layer, args.define_n, args.define_depth, args.define_k) == ("define", 64, 3, 4096)


def test_a_value_given_on_the_command_line_wins_over_the_family_default(lm_data):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.models import ARCH_MODEL_REGISTRY

    argv = [str(lm_data), "--user-dir", USER_DIR, "--task", LM, "--arch", "lstm_lm_define", "--define-n", "64"]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args).model
    resolved_args = ARCH_MODEL_REGISTRY["lstm_lm_define"].resolved_config(cfg)
    assert (resolved_args.define_n, resolved_args.input_layer) == (64, "define")
    assert cfg.define_n == 64 and cfg.define_depth == 3  # the model's configuration keeps what it was built with
