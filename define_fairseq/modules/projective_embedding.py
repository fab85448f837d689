"""Transformer-XL's input embedding with one table width (``div_val = 1``): a ``V x n`` table, one projection
``n -> d`` when ``n != d``, and the scale ``sqrt(d)``."""

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from define_fairseq.modules.checks import check_positive


class ProjectiveEmbedding(nn.Module):
    """``tokens -> sqrt(d) * table[tokens] @ projection.T`` (no projection when ``n == d``).

    Initialisation is Transformer-XL's: table N(0, 0.02) (its ``init_std``), projection N(0, 0.01) (its
    ``proj_init_std``). The padding row is NOT zeroed (Transformer-XL has no padding); ``padding_idx`` is only
    stored, as fairseq expects of ``embed_tokens``.

    Attributes: ``weight`` the table ``[V, n]`` (what an output layer ties to), ``projection`` ``[d, n]`` or
    ``None``, ``scale = sqrt(d)``, ``embedding_dim = d`` (what the decoder sees), ``table_dim = n``,
    ``num_embeddings = V``, ``padding_idx``. ``projection`` has the layout of
    :class:`ProjectedAdaptiveSoftmax`'s projections ``[input_dim, n]``, so the softmax's head can tie to it.

    Args:
        num_embeddings: V.
        table_dim: n, the table width.
        embedding_dim: d, the model width.
        padding_idx: stored only.

    Shapes: ``tokens [...]`` (long) -> ``[..., d]``.
    """

    def __init__(self, num_embeddings: int, table_dim: int, embedding_dim: int, padding_idx: Optional[int] = None):
        super().__init__()
        for name, value in (
            ("num_embeddings", num_embeddings),
            ("table_dim", table_dim),
            ("embedding_dim", embedding_dim),
        ):
            check_positive(value, name)
        if padding_idx is not None and not 0 <= padding_idx < num_embeddings:
            raise ValueError(f"padding_idx {padding_idx} is outside the vocabulary of {num_embeddings} words")
        self.num_embeddings = num_embeddings
        self.table_dim = table_dim
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        self.scale = math.sqrt(embedding_dim)
        self.weight = nn.Parameter(torch.empty(num_embeddings, table_dim))
        if table_dim != embedding_dim:
            self.projection = nn.Parameter(torch.empty(embedding_dim, table_dim))
        else:
            self.register_parameter("projection", None)
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.weight, 0.0, 0.02)
        if self.projection is not None:
            nn.init.normal_(self.projection, 0.0, 0.01)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        embedded = F.embedding(tokens, self.weight)
        if self.projection is not None:
            embedded = F.linear(embedded, self.projection)
        return embedded * self.scale
