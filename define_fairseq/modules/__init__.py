"""Plain ``torch.nn`` modules; nothing here imports fairseq."""

from .define import DeFINE, GroupLayerNorm, define_layer_sizes, split_and_mix
from .define_embedding import DeFINEEmbedding, FoldedDeFINEEmbedding
from .group_linear import GroupLinear

__all__ = [
    "DeFINE",
    "DeFINEEmbedding",
    "FoldedDeFINEEmbedding",
    "GroupLayerNorm",
    "GroupLinear",
    "define_layer_sizes",
    "split_and_mix",
]
