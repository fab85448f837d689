"""Token embeddings through DeFINE: a ``V x n`` table, then the DeFINE unit up to ``m``."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .define import DeFINE


class DeFINEEmbedding(nn.Module):
    """Drop-in ``embed_tokens``: ``tokens -> DeFINE(sqrt(n) * table[tokens])``.

    It exposes ``embedding_dim`` (= m), ``padding_idx`` and ``weight`` (the ``V x n`` table) so fairseq's
    weight tying can share the table with an output layer working in ``n`` dimensions.

    DeFINE depends only on the token, so by default the unit runs once per distinct token of the batch and
    the results are indexed back to the positions (``unique_tokens``); this is skipped while training with
    dropout inside the unit, where each position must draw its own mask.

    Args:
        num_embeddings: vocabulary size V.
        n, k, m, depth, max_groups, variant, activation, norm, dropout: see :class:`DeFINE`.
        padding_idx: row of the table kept at zero.
        unique_tokens: run DeFINE on the batch's distinct tokens only.

    Shapes: ``tokens [...]`` (long) -> ``[..., m]``.
    """

    def __init__(self, num_embeddings: int, n: int, k: int, m: int, padding_idx=None, depth: int = 3,
                 max_groups: int = 4, variant: str = "define", activation: str = "gelu", norm: str = "group",
                 dropout: float = 0.0, unique_tokens: bool = True):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.padding_idx = padding_idx
        self.embedding_dim = m
        self.unique_tokens = unique_tokens
        self.table = nn.Embedding(num_embeddings, n, padding_idx=padding_idx)
        nn.init.normal_(self.table.weight, mean=0.0, std=n ** -0.5)
        if padding_idx is not None:
            nn.init.zeros_(self.table.weight[padding_idx])
        self.embed_scale = math.sqrt(n)
        self.define = DeFINE(n, k, m, depth=depth, max_groups=max_groups, variant=variant,
                             activation=activation, norm=norm, dropout=dropout)

    @property
    def weight(self) -> nn.Parameter:
        """The ``V x n`` map table (what an output layer ties to)."""
        return self.table.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.unique_tokens and not (self.training and self.define.dropout > 0):
            distinct, index = torch.unique(tokens, return_inverse=True)
            return self.define(self.table(distinct) * self.embed_scale)[index]
        return self.define(self.table(tokens) * self.embed_scale)

    @torch.no_grad()
    def folded_table(self) -> torch.Tensor:
        """The ``V x m`` table of every token's DeFINE output, computed in eval mode."""
        was_training = self.training
        self.eval()
        table = self.define(self.table.weight * self.embed_scale)
        self.train(was_training)
        return table


class FoldedDeFINEEmbedding(nn.Module):
    """A folded :class:`DeFINEEmbedding` for inference: the DeFINE unit replaced by its ``V x m`` table.

    ``weight`` is still the ``V x n`` map table, so a tied output layer keeps working.

    Shapes: ``tokens [...]`` (long) -> ``[..., m]``.
    """

    def __init__(self, num_embeddings: int, n: int, m: int, padding_idx=None):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.padding_idx = padding_idx
        self.embedding_dim = m
        self.table = nn.Embedding(num_embeddings, n, padding_idx=padding_idx)
        self.folded = nn.Parameter(torch.zeros(num_embeddings, m))

    @property
    def weight(self) -> nn.Parameter:
        return self.table.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.folded)
