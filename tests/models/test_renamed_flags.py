"""Flags renamed before the first release. A configuration written with an old name (a checkpoint's) is read as
before where its old value means the new field's default, and refused naming the new flag where it does not: its
value is never passed over."""

import re

import pytest
from arch_cases import CASES, MT_C2S
from conftest import USER_DIR
from omegaconf import DictConfig, OmegaConf

import define_fairseq  # noqa: F401  (registers the models)
from define_fairseq.tools.params import setup_from_train_args

# arch, new field, old field, an old value that means the new default, one that does not, and what it now is
RENAMED = [
    ("transformer_xl_lm", "input_layer", "txl_input", "standard", "projective", "projective"),
    ("gcnn_lm", "input_layer", "gcnn_define_input", False, True, "define"),
    ("mogrifier_lstm_lm", "input_layer", "define_depth", 0, 2, "define"),
    ("awd_lstm_lm", "input_layer", "define_depth", 0, 7, "define"),
    ("lstm_lm_define", "input_layer", "define_depth", 3, 0, "table"),
    ("awd_lstm_lm", "awd_untie_output", "define_untie_output", False, True, "True"),
    ("transformer_c2s", "decoder_input_layer", "c2s_decoder", False, True, "char2subword"),
    ("transformer_c2s", "decoder_input_layer", "c2s_define_decoder", False, True, "define"),
]


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def old_configuration(cfg, new: str, old: str, value):
    """``cfg`` as a checkpoint written before the rename holds it: the old field, not the new one."""
    if isinstance(cfg, DictConfig):
        OmegaConf.set_struct(cfg, False)
        cfg.pop(new)
    else:
        delattr(cfg, new)
    setattr(cfg, old, value)
    return cfg


@pytest.mark.parametrize("arch, new, old, same, other, meant", RENAMED)
def test_an_old_name_is_read_as_before_or_refused_with_the_new_one(
    lm_data, translation_data, arch, new, old, same, other, meant
):
    task_name, flags = CASES[arch]
    data = translation_data if task_name == MT_C2S else lm_data
    argv = [str(data), "--user-dir", USER_DIR, "--task", task_name, "--arch", arch, *flags, "--cpu"]
    cfg, task, model = setup_from_train_args(argv)
    model_class = type(model)

    rebuilt = model_class.build_model(old_configuration(cfg.model, new, old, same), task)
    assert parameter_count(rebuilt) == parameter_count(model)

    setattr(cfg.model, old, other)
    flag = "--" + new.replace("_", "-")
    with pytest.raises(ValueError, match=re.escape(f"which is now {flag} {meant}")):
        model_class.build_model(cfg.model, task)
