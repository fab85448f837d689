"""Folding, for every model that can hold a DeFINE input: trained for a few updates with fairseq-train, folded with
``define_fairseq.tools.fold_define``, then scored by the stock program (fairseq-eval-lm, or fairseq-generate for
the translation models) with the same command as the unfolded checkpoint: the scores are the same.

In eval mode without autograd a DeFINE embedding already looks its rows up in the ``V x m`` table that folding
stores, so the two checkpoints do the same arithmetic and their printed scores agree exactly.
"""

import pytest
import torch
from arch_cases import CASES, LM, case_argv, family
from conftest import RUN_FLAGS, run_cli, run_module
from lm_helpers import eval_lm, generate

import define_fairseq  # noqa: F401  (registers the models)

DEFINE_INPUT = ["--input-layer", "define"]
# the families whose input is a choice, and the flags that choose DeFINE in their case
CHOICE = {
    "gcnn_lm": [*DEFINE_INPUT, "--define-n", "8", "--define-k", "32"],
    "mogrifier_lstm_lm": [*DEFINE_INPUT, "--define-n", "8", "--define-k", "32"],
    "transformer_c2s": ["--decoder-input-layer", "define"],
}
# arch -> the flags beyond its arch_cases case: every arch whose input is DeFINE by default (the adaptive maps of
# lstm_lm_define_wt103_* and transformer_lm_define_wiki103 among them), and an arch of each family above
REPRESENTATIVE = {
    "gcnn_lm": "gcnn_lm_14",
    "mogrifier_lstm_lm": "mogrifier_lstm_lm_ptb",
    "transformer_c2s": "transformer_c2s",
}
FOLD_CASES = {
    **{arch: [] for arch in CASES if "define" in arch},
    **{arch: CHOICE[name] for name, arch in REPRESENTATIVE.items()},
}
FOLD_CASES["transformer_define"] = ["--share-all-embeddings"]
# in `make test-slow`: the archs whose case differs from another's only in defaults that fold alike (the tiny flags
# set their widths and DeFINE sizes), and the translation archs, whose folding test_transformer_define checks
DEFAULTS_ONLY = {
    *[f"transformer_xl_define_wt103_n{n}" for n in (128, 256, 384)],  # as _n64
    "transformer_define_wmt_en_de_big",  # as transformer_define_iwslt_de_en
    "lstm_lm_define_wt103_n11",  # as _n7, with a deeper unit
    "transformer_define",  # shared embeddings: test_transformer_define folds its iwslt_de_en checkpoint of them
    "transformer_define_iwslt_de_en",  # test_transformer_define folds its checkpoints and generates from them
}


def families_with_a_define_input():
    """The plugin's registered models whose config has ``--define-folded`` (every model that can hold a DeFINE
    unit)."""
    from fairseq.models import MODEL_DATACLASS_REGISTRY

    return {
        name
        for name, config in MODEL_DATACLASS_REGISTRY.items()
        if config.__module__.startswith("define_fairseq.") and "define_folded" in config.__dataclass_fields__
    }


def test_every_family_with_a_define_input_has_a_folding_case():
    assert {family(arch) for arch in FOLD_CASES} == families_with_a_define_input()


def scores(data, checkpoint, task: str):
    """What the stock program prints for the test split: fairseq-eval-lm's loss and perplexity, or fairseq-generate's
    hypotheses with their scores."""
    if task == LM:
        return eval_lm(data, checkpoint, "--tokens-per-sample", "32", "--max-tokens", "256")
    lines = generate(data, checkpoint, "--task", task)
    assert len(lines) == 40, lines  # an H and a P line for each of the 20 test sentences
    return lines


@pytest.mark.parametrize(
    "arch", [pytest.param(a, marks=pytest.mark.slow) if a in DEFAULTS_ONLY else a for a in sorted(FOLD_CASES)]
)
def test_a_folded_checkpoint_scores_as_the_unfolded_one(arch, lm_data, translation_data, tmp_path):
    flags = FOLD_CASES[arch]
    task = CASES[arch][0]
    data = lm_data if task == LM else translation_data
    run_cli(
        "fairseq-train",
        *case_argv(data, arch, *flags),
        "--max-tokens",
        "256" if task == LM else "400",
        "--optimizer",
        "adam",
        "--lr",
        "0.005",
        "--max-update",
        "3",
        *RUN_FLAGS,
        "--save-dir",
        tmp_path,
        "--no-save-optimizer-state",
        "--no-epoch-checkpoints",
        "--disable-validation",
    )
    checkpoint, folded = tmp_path / "checkpoint_last.pt", tmp_path / "folded.pt"
    run_module("define_fairseq.tools.fold_define", checkpoint, folded)
    state = torch.load(folded, map_location="cpu", weights_only=False)
    assert state["cfg"]["model"]["define_folded"] is True
    assert not any(".define." in key for key in state["model"]), "a DeFINE unit was left in the folded checkpoint"
    assert any(key.endswith("embed_tokens.folded") for key in state["model"])
    assert scores(data, folded, task) == scores(data, checkpoint, task)
