"""The fairseq-hydra-train configs of the papers' settings (``define_fairseq/config/<recipe>/<CONFIG>.yaml``) are the
recipes' runs, and they train.

Each config is compared with fairseq's own parse of its recipe's command (``train.sh -n CONFIG``, on one GPU where
the script asks how many): every model key with what the arch function gives under the recipe's flags, every other
key with the recipe's value, and every flag of the command must have its key in the config. Then (slow)
fairseq-hydra-train trains each config for two updates at tiny sizes, and its checkpoint must hold the model that
fairseq-train builds from the recipe's command at those sizes.
"""

import re
from argparse import Namespace
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest
import torch
from arch_cases import GCNN_TINY, LM_ADAPTIVE, LSTM, MOGRIFIER, MOGRIFIER_LSTM, TRANSLATION, TXL_TINY
from conftest import REPO, USER_DIR, run_cli, training_arguments
from omegaconf import OmegaConf
from recipe_runs import ok, run_recipe

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)
from define_fairseq.tools.params import setup_from_train_args

CONFIG_DIR = REPO / "define_fairseq" / "config"


@dataclass(frozen=True)
class Setting:
    """How a config's recipe is run, and its tiny sizes."""

    script: str  # the recipe's training script, in the recipe's folder
    tiny: tuple  # tiny model flags of tests/helpers/arch_cases.py (fairseq-train's), given to both programs
    sizes: tuple  # Hydra overrides of the task and batch for the tiny corpus
    data: str = "lm_data"  # the conftest fixture of that corpus


# 4 streams of 16 tokens: the stateful_lm runs
STREAMS = ("dataset.batch_size=4", "dataset.batch_size_valid=4", "task.tokens_per_sample=16")
TXL = (*TXL_TINY, "--txl-mem-len", "8")
# the LSTM archs take m from n when m is not given; the configs give m = 256, so the tiny n comes with its m
LSTM_TINY = (*LSTM, *LM_ADAPTIVE, "--decoder-embed-dim", "16")

SETTINGS = {
    "wmt14-en-de/transformer_define": Setting(
        "train.sh", tuple(TRANSLATION), ("dataset.max_tokens=400",), "translation_data"
    ),
    "wikitext-103/transformer_xl_define_wt103_n128": Setting("train-transformer-xl.sh", TXL, STREAMS),
    "wikitext-103/transformer_xl_projective_wt103_n128": Setting("train-transformer-xl.sh", TXL, STREAMS),
    "wikitext-103/transformer_xl_wt103_d384": Setting("train-transformer-xl.sh", TXL, STREAMS),
    "wikitext-103/lstm_lm_adaptive_wt103": Setting("train.sh", LSTM_TINY, STREAMS),  # Table 1a R2
    "wikitext-103/lstm_lm_define_wt103_n3": Setting("train.sh", LSTM_TINY, STREAMS),  # Table 1a R3
    "ptb/mogrifier_lstm_lm_ptb": Setting("train.sh", tuple(MOGRIFIER), STREAMS),
    "ptb/mogrifier_lstm_lm_baseline_ptb": Setting("train.sh", tuple(MOGRIFIER_LSTM), STREAMS),
    "wikitext-103/gcnn_lm_14": Setting(
        "train.sh",
        (*GCNN_TINY, "--adaptive-softmax-cutoff", "20,40"),
        ("task.tokens_per_sample=32", "dataset.max_tokens=256"),
    ),
}
NAMES = sorted(SETTINGS)

# the flags whose value is the name of a config group's choice
NAMED = {"arch": "model", **{group: group for group in ("task", "criterion", "optimizer", "lr_scheduler")}}
ABSENT = object()


def config(name):
    """The config file ``name`` (``<recipe>/<CONFIG>``) as plain dicts and lists."""
    return OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / f"{name}.yaml"))


@lru_cache(maxsize=None)
def recipe_run(name):
    """``(argv, cfg)``: the fairseq-train arguments that the config's recipe runs, and fairseq's config of them as
    plain dicts (fairseq-train's parser, the arch function, then the conversion to its dataclasses)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    recipe, arch = name.split("/")
    script = f"{recipe}/{SETTINGS[name].script}"
    gpus = ["-g", "1"] if "[-g GPUS]" in (REPO / "recipes" / script).read_text() else []
    argv = training_arguments(ok(run_recipe(script, "-n", *gpus, arch)).stdout)
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    return tuple(argv), OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True)


def config_keys(flag, cfg):
    """The ``(group, key)`` places of fairseq's config that the command-line ``flag`` sets."""
    dest = flag[2:].replace("-", "_")
    if dest in NAMED:
        return [(NAMED[dest], "_name")]
    return [(group, dest) for group, values in cfg.items() if isinstance(values, dict) and dest in values]


def hydra_overrides(flags):
    """fairseq-train's model flags (``--decoder-layers 2``) as Hydra overrides (``++model.decoder_layers=2``: ``++``
    sets a key whether the config names it or not). Anything but a number is quoted: Hydra reads ``20,40`` as a
    sweep and brackets as a list."""
    return [
        f"++model.{flag[2:].replace('-', '_')}={value if re.fullmatch(r'[0-9.]+', value) else repr(value)}"
        for flag, value in zip(flags[::2], flags[1::2])
    ]


def shapes(state_dict):
    """Each entry's shape; the carried state that the recurrent models keep among their entries (what the last
    batch left) is a dict, named alone."""
    return {key: tuple(value.shape) if torch.is_tensor(value) else "state" for key, value in state_dict.items()}


def test_every_config_file_has_a_setting():
    files = sorted(str(path.relative_to(CONFIG_DIR).with_suffix("")) for path in CONFIG_DIR.glob("**/*.yaml"))
    assert files == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_the_model_keys_are_the_archs_under_the_recipes_flags(name):
    _, recipe = recipe_run(name)
    model = config(name)["model"]
    assert model["_name"] == name.split("/")[1]
    differ = {
        key: (value, recipe["model"].get(key, "(no such key)"))
        for key, value in model.items()
        if recipe["model"].get(key, ABSENT) != value
    }
    assert not differ, f"the config's model values (left) are not the arch's under the recipe's flags: {differ}"


@pytest.mark.parametrize("name", NAMES)
def test_the_config_writes_out_every_model_value_that_the_arch_or_the_recipe_sets(name):
    """fairseq-train's main fills cfg.model with the model's dataclass defaults (add_defaults, once --user-dir is
    imported) before the arch function runs, and the arch then keeps every value that is set: under Hydra, a value of
    the arch left out of the config would be the model's default instead."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY

    arch = name.split("/")[1]
    set_by_arch = Namespace()
    if ARCH_MODEL_NAME_REGISTRY[arch] != arch:  # a model's own name builds its dataclass defaults, no arch function
        ARCH_CONFIG_REGISTRY[arch](set_by_arch)
    argv, recipe = recipe_run(name)
    set_by_recipe = {key for arg in argv if arg.startswith("--") for group, key in config_keys(arg, recipe)}
    set_by_recipe &= set(recipe["model"])
    missing = (set(vars(set_by_arch)) | set_by_recipe) - set(config(name)["model"])
    assert not missing, f"the config leaves out the model values {sorted(missing)}"


@pytest.mark.parametrize("name", NAMES)
def test_every_other_value_is_the_recipes(name):
    _, recipe = recipe_run(name)
    differ = {}
    for group, values in config(name).items():
        if group in ("hydra", "model"):
            continue
        for key, value in values.items():
            theirs = recipe[group].get(key, ABSENT)
            if (group, key) == ("common", "user_dir"):  # relative to the repository's root, as README's commands
                value, theirs = (REPO / value).resolve(), Path(theirs).resolve()
            if value != theirs:
                differ[f"{group}.{key}"] = (value, theirs)
    assert not differ, f"the config's values (left) are not the recipe's (right): {differ}"


@pytest.mark.parametrize("name", NAMES)
def test_every_flag_of_the_recipe_is_in_the_config(name):
    argv, recipe = recipe_run(name)
    values = config(name)
    missing = [
        arg
        for arg in argv
        if arg.startswith("--") and not any(key in values.get(group, {}) for group, key in config_keys(arg, recipe))
    ]
    assert not missing, f"the config does not set the recipe's {missing}"


# The tiny runs: the CPU, one process, two updates, checkpoints into the working directory's ck/ (a relative path:
# the configs keep Hydra in the directory the command runs in, as the recipes write relative to it).
RUN = (
    "common.cpu=true",
    "common.fp16=false",
    "common.log_interval=1",
    "dataset.num_workers=0",
    "dataset.data_buffer_size=0",
    "optimization.max_update=2",
    "checkpoint.save_dir=ck",
)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_the_config_trains_the_recipes_model_with_fairseq_hydra_train(name, request, tmp_path):
    setting, (recipe, arch) = SETTINGS[name], name.split("/")
    data = request.getfixturevalue(setting.data)
    overrides = [f"task.data={data}", f"common.user_dir={USER_DIR}", *RUN, *setting.sizes]
    overrides += hydra_overrides(setting.tiny)
    run_cli("fairseq-hydra-train", "--config-dir", CONFIG_DIR / recipe, "--config-name", arch, *overrides, cwd=tmp_path)
    state = torch.load(tmp_path / "ck" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["cfg"]["model"]["_name"] == arch and state["cfg"]["task"]["data"] == str(data)
    assert state["optimizer_history"][-1]["num_updates"] == 2
    for group in ("task", "criterion", "optimizer", "lr_scheduler"):
        assert state["cfg"][group]["_name"] == config(name)[group]["_name"]
    # the same tiny flags on the recipe's own command: the model fairseq-train would have trained
    argv, _ = recipe_run(name)
    _, _, expected = setup_from_train_args([str(data), *argv[1:], "--cpu", *setting.tiny])
    assert shapes(state["model"]) == shapes(expected.state_dict())
