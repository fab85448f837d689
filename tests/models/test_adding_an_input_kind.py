"""Every family offers every input kind, and an input kind added at the seam (``models/input_layer.py``'s
``INPUT_KINDS``) is built by every family, as ``docs/development.md`` ("Adding an input kind") says: here a
throwaway kind, a ``V x d`` table whose output is multiplied by a fixed scale."""

from argparse import Namespace

import pytest
import torch
import torch.nn as nn
from arch_cases import CASES, LM, case_argv
from omegaconf import OmegaConf

import define_fairseq  # noqa: F401  (registers the models)
from define_fairseq.models.input_layer import INPUT_KINDS, InputKind, InputLayerSpec, embedding_table
from define_fairseq.tools.params import setup_from_train_args

SCALE = 3.0


class ScaledEmbedding(nn.Module):
    """``SCALE * table[tokens]``. Shapes: ``tokens [...]`` -> ``[..., d]``."""

    def __init__(self, table: nn.Embedding):
        super().__init__()
        self.table = table
        self.embedding_dim, self.padding_idx = table.embedding_dim, table.padding_idx

    @property
    def weight(self) -> nn.Parameter:
        return self.table.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return SCALE * self.table(tokens)


def build_scaled(spec: InputLayerSpec) -> nn.Module:
    return ScaledEmbedding(embedding_table(spec.vocab, spec.width, spec.padding_idx, spec.table_init))


# family (its base arch) -> the field that chooses its input kind
FAMILIES = {
    "awd_lstm_lm": "input_layer",
    "lstm_lm_define": "input_layer",
    "gcnn_lm": "input_layer",
    "mogrifier_lstm_lm": "input_layer",
    "transformer_xl_lm": "input_layer",
    "transformer_lm_define": "input_layer",
    "transformer_define": "input_layer",
    "transformer_c2s": "decoder_input_layer",
}


@pytest.fixture
def scaled_kind(monkeypatch):
    monkeypatch.setitem(INPUT_KINDS, "scaled", InputKind(build_scaled, mapped=False, adaptive=False))


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_every_family_builds_a_kind_added_at_the_seam(arch, scaled_kind, lm_data, translation_data):
    from fairseq.models import ARCH_MODEL_REGISTRY

    data = lm_data if CASES[arch][0] == LM else translation_data
    cfg, task, _ = setup_from_train_args(case_argv(data, arch, "--cpu"))
    # a namespace: the configuration's choice type knows only the kinds of the parser
    args = Namespace(**OmegaConf.to_container(cfg.model, resolve=True, enum_to_str=True))
    setattr(args, FAMILIES[arch], "scaled")
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task).eval()
    scaled = [module for module in model.modules() if isinstance(module, ScaledEmbedding)]
    assert len(scaled) == (2 if arch == "transformer_define" else 1)  # the translation model's encoder too
    tokens = torch.tensor([[4, 5, 6]])
    assert torch.equal(scaled[0](tokens), SCALE * scaled[0].table(tokens))


@pytest.mark.parametrize("kind", ["table", "projective", "define"])
@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_every_family_offers_every_kind(arch, kind, lm_data, translation_data):
    data = lm_data if CASES[arch][0] == LM else translation_data
    flag = "--" + FAMILIES[arch].replace("_", "-")
    cfg, _, model = setup_from_train_args(case_argv(data, arch, flag, kind, "--cpu"))
    assert getattr(cfg.model, FAMILIES[arch]) == kind
    # Transformer-XL's table is a projective embedding without a projection (scaled by sqrt(d))
    expected = {"table": {"Embedding", "ProjectiveEmbedding"}, "projective": {"ProjectiveEmbedding"}}
    assert type(model.decoder.embed_tokens).__name__ in expected.get(kind, {"DeFINEEmbedding"})
