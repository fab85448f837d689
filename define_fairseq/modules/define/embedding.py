"""Token embeddings through DeFINE: a ``V x n`` table, then the DeFINE unit up to ``m``."""

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from define_fairseq.modules.adaptive_input import AdaptiveInput
from define_fairseq.modules.checks import ParameterError, check_probability
from define_fairseq.modules.define.delight import DelightDeFINE
from define_fairseq.modules.define.unit import DeFINE
from define_fairseq.modules.parameter_cache import ParameterCache

TOKEN_PATHS = ("unique", "table", "positions", "auto")
"""Where the unit runs in a forward with autograd. ``unique``: once per distinct token of the batch, the results
indexed back to the positions (``torch.unique``: fewest rows, but the host waits for the device to count them).
``table``: on all ``V`` rows of the map, then rows gathered per position: static shapes, no host synchronisation,
so it suits CUDA graphs and ``torch.compile(fullgraph=True)``; more rows than a batch has tokens when ``V`` is
large. ``positions``: on every position (what dropout in the unit or the map needs anyway). ``auto``: of the two
paths with static shapes, the one with fewer rows for this call: ``table`` when ``V`` is smaller than the number of
token positions, else ``positions`` (ties go to ``positions``, which has no gather); the choice depends on shapes
alone, so a compiled graph guards on it and recompiles only when a batch crosses ``V``. Without a choice
(``token_path=None``) the path is the device's: ``auto`` on CUDA, where the host must not wait for the device,
``unique`` elsewhere, where it computes the fewest rows."""


class MappedEmbedding(nn.Module):
    """What :class:`DeFINEEmbedding` and its folded form share: the map of width ``n`` (a ``V x n`` table, or an
    :class:`AdaptiveInput` of base width ``n``) and the weights an output layer ties to. Subclasses set
    ``num_embeddings`` and ``padding_idx`` before :meth:`_build_map`."""

    def _build_map(self, n: int, adaptive_cutoff=None, adaptive_factor: float = 4) -> None:
        self.n = n
        if adaptive_cutoff:
            self.adaptive = AdaptiveInput(
                self.num_embeddings, self.padding_idx, n, adaptive_cutoff, adaptive_factor, output_dim=n
            )
            self.table = None
        else:
            self.adaptive = None
            self.table = nn.Embedding(self.num_embeddings, n, padding_idx=self.padding_idx)
            nn.init.normal_(self.table.weight, mean=0.0, std=n**-0.5)
            if self.padding_idx is not None:
                nn.init.zeros_(self.table.weight[self.padding_idx])

    @property
    def map(self) -> nn.Module:
        """The map layer: the ``V x n`` table or the adaptive input."""
        return self.table if self.adaptive is None else self.adaptive

    @property
    def weight(self) -> nn.Parameter:
        """The ``V x n`` map table (what a full-softmax output layer ties to)."""
        if self.adaptive is not None:
            raise AttributeError(
                f"this {type(self).__name__} maps through an adaptive input and has no single V x n "
                "table; tie an adaptive softmax to it with weights_for_band()"
            )
        return self.table.weight

    def weights_for_band(self, band: int):
        """``(table [size_i, n_i], projection [n, n_i] or None)`` of the adaptive map's band ``band``."""
        if self.adaptive is None:
            raise AttributeError(
                f"this {type(self).__name__} maps through a plain table; weights_for_band() needs "
                "adaptive_cutoff (an adaptive input map)"
            )
        return self.adaptive.weights_for_band(band)


class DeFINEEmbedding(MappedEmbedding):
    """Drop-in ``embed_tokens``: ``tokens -> DeFINE(sqrt(n) * map(tokens))``.

    The map is a ``V x n`` table, or with ``adaptive_cutoff`` an :class:`AdaptiveInput` of base width ``n``
    projecting every band to ``n`` (the DeFINE paper's LSTM language models). It exposes ``embedding_dim``
    (= m) and ``padding_idx``, and for the output layer to tie to: ``weight`` (the ``V x n`` table) with the
    table map, ``weights_for_band(i)`` (fairseq's ``AdaptiveSoftmax`` API) with the adaptive map.

    DeFINE depends only on the token, so with autograd the unit need not run on every position; ``token_path``
    says where it runs (see :data:`TOKEN_PATHS`). Whatever the path, when the unit or the map has dropout while
    training it runs on every position, since each position must draw its own mask. In eval mode without autograd
    (validation, generation) the whole ``V x m`` table is computed once and rows are looked up, exactly as the
    folded model does, until a parameter changes (:class:`ParameterCache`); ``train()`` drops it.

    Args:
        num_embeddings: vocabulary size V.
        n, k, m, depth, max_groups, variant, activation, norm, dropout, init, output_norm: see :class:`DeFINE`;
            ``variant="delight"`` builds :class:`DelightDeFINE` (whose output is normalised already, so it takes no
            ``output_norm``). ``activation`` and ``norm`` default to the variant's (``gelu`` and ``group``;
            ``swish`` for ``delight``).
        padding_idx: row of the table kept at zero.
        map_dropout: dropout on the scaled map output, before the unit, with one mask per sequence (the first
            dimension of ``tokens``) and feature, shared by its positions: the authors' ``delight_emb_dropout``.
        token_path: one of :data:`TOKEN_PATHS`, or ``None`` (the default) for the device's path (see
            :data:`TOKEN_PATHS`); an attribute, may be changed at any time (``unique_tokens``, the former switch,
            reads and sets it: ``True`` is ``"unique"``, ``False`` is ``"positions"``).
        adaptive_cutoff, adaptive_factor: make the map an :class:`AdaptiveInput` with these band boundaries.

    Shapes: ``tokens [...]`` (long) -> ``[..., m]``.
    """

    def __init__(
        self,
        num_embeddings: int,
        n: int,
        k: int,
        m: int,
        padding_idx=None,
        depth: int = 3,
        max_groups: int = 4,
        variant: str = "define",
        activation=None,
        norm=None,
        dropout: float = 0.0,
        adaptive_cutoff=None,
        adaptive_factor: float = 4,
        init: str = "unit",
        map_dropout: float = 0.0,
        token_path: Optional[str] = None,
        output_norm: str = "none",
    ):
        super().__init__()
        check_probability(map_dropout, "map_dropout")
        if token_path is not None and token_path not in TOKEN_PATHS:
            raise ValueError(f"token_path={token_path!r}: unknown; choose one of {', '.join(TOKEN_PATHS)}")
        self.token_path = token_path
        self.map_dropout = map_dropout
        self.num_embeddings = num_embeddings
        self.padding_idx = padding_idx
        self.embedding_dim = m
        self._build_map(n, adaptive_cutoff, adaptive_factor)
        self.embed_scale = math.sqrt(n)
        options = dict(depth=depth, max_groups=max_groups, dropout=dropout, norm=norm or "group")
        if variant == "delight":
            if output_norm != "none":
                raise ParameterError(
                    "output_norm",
                    repr(output_norm),
                    "the authors' unit ({variant}) normalises its output already; leave it at 'none'",
                    related={"variant": repr(variant)},
                )
            self.define = DelightDeFINE(n, k, m, activation=activation or "swish", **options)
        else:
            self.define = DeFINE(
                n, k, m, variant=variant, activation=activation or "gelu", init=init, output_norm=output_norm, **options
            )
        self._eval_table = ParameterCache()

    @property
    def unique_tokens(self) -> bool:
        """``token_path == "unique"``; setting it picks ``"unique"`` (``True``) or ``"positions"`` (``False``)."""
        return self.chosen_token_path == "unique"

    @unique_tokens.setter
    def unique_tokens(self, value: bool) -> None:
        self.token_path = "unique" if value else "positions"

    @property
    def chosen_token_path(self) -> str:
        """``token_path``, or where it is ``None`` the device's: ``"auto"`` on CUDA, ``"unique"`` elsewhere."""
        if self.token_path is not None:
            return self.token_path
        return "auto" if self.define_device().type == "cuda" else "unique"

    @property
    def active_token_path(self) -> str:
        """The path a forward with autograd takes: :attr:`chosen_token_path`, or ``"positions"`` while training with
        dropout in the unit or the map (each position must then draw its own mask)."""
        if self.training and (self.define.dropout > 0 or self.map_dropout > 0):
            return "positions"
        return self.chosen_token_path

    @property
    def runs_per_distinct_token(self) -> bool:
        """Whether a forward with autograd runs the unit once per distinct token of the batch."""
        return self.active_token_path == "unique"

    def path_for(self, tokens: torch.Tensor) -> str:
        """The path a forward with autograd takes for ``tokens``: :attr:`active_token_path`, with ``"auto"``
        resolved by the shape of ``tokens`` (see :data:`TOKEN_PATHS`)."""
        path = self.active_token_path
        if path == "auto":
            return "table" if self.num_embeddings < tokens.numel() else "positions"
        return path

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self.training and not torch.is_grad_enabled():
            return self.looked_up(tokens)
        path = self.path_for(tokens)
        if path == "table":
            return F.embedding(tokens, self.define(self.map_all_rows() * self.embed_scale))
        if path == "unique":
            distinct, index = torch.unique(tokens, return_inverse=True)
            # a lookup rather than indexing: its backward is one operation (indexing's zero-fills, then scatters)
            return F.embedding(index, self.define(self.map(distinct) * self.embed_scale))
        mapped = self.map(tokens) * self.embed_scale
        if self.training and self.map_dropout > 0:
            shape = tokens.shape[:1] + (1,) * (tokens.dim() - 1) + mapped.shape[-1:]
            mapped = mapped * mapped.new_empty(shape).bernoulli_(1 - self.map_dropout).div_(1 - self.map_dropout)
        return self.define(mapped)

    def looked_up(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens``' rows of the cached ``V x m`` table (eval mode without autograd). Kept out of compiled graphs
        (:meth:`keep_lookup_eager`): the cache is Python bookkeeping, whose state a graph would guard on and
        recompile for.

        Shapes: ``tokens [...]`` (long) -> ``[..., m]``."""
        return F.embedding(tokens, self._eval_table.get(self.parameters(), self.folded_table))

    @classmethod
    def keep_lookup_eager(cls) -> None:
        """Makes ``torch.compile`` run :meth:`looked_up` eagerly; called before compiling, not at import, because
        ``torch.compiler.disable`` imports ``torch._dynamo`` (a second of every fairseq command's start)."""
        if not getattr(cls.looked_up, "_keeps_eager", False):
            cls.looked_up = torch.compiler.disable(cls.looked_up)
            cls.looked_up._keeps_eager = True

    def map_all_rows(self) -> torch.Tensor:
        """``[V, n]``: the map of every token id, through the map module (so the padding row gets no gradient)."""
        return self.map(torch.arange(self.num_embeddings, device=self.define_device()))

    def train(self, mode: bool = True):
        if mode:
            self._eval_table.clear()
        return super().train(mode)

    @torch.no_grad()
    def folded_table(self) -> torch.Tensor:
        """The ``V x m`` table of every token's DeFINE output, computed in eval mode."""
        was_training = self.training
        self.eval()
        table = self.define(self.map_all_rows() * self.embed_scale)
        self.train(was_training)
        return table

    def define_device(self) -> torch.device:
        return next(self.parameters()).device

    def fold(self) -> "FoldedDeFINEEmbedding":
        """An inference-only copy whose DeFINE unit is replaced by :meth:`folded_table`; it shares this
        module's map (the ``V x n`` table or the adaptive input), so a tied output layer stays tied."""
        folded = FoldedDeFINEEmbedding(self.num_embeddings, self.n, self.embedding_dim, padding_idx=self.padding_idx)
        folded.table, folded.adaptive = self.table, self.adaptive
        with torch.no_grad():  # on this module's device and in its dtype
            folded.folded = nn.Parameter(self.folded_table())
        return folded


class FoldedDeFINEEmbedding(MappedEmbedding):
    """A folded :class:`DeFINEEmbedding` for inference: the DeFINE unit replaced by its ``V x m`` table.

    It keeps the map (``weight``, the ``V x n`` table, or with ``adaptive_cutoff`` the adaptive input and its
    ``weights_for_band``), so a tied output layer keeps working.

    Shapes: ``tokens [...]`` (long) -> ``[..., m]``.
    """

    def __init__(
        self, num_embeddings: int, n: int, m: int, padding_idx=None, adaptive_cutoff=None, adaptive_factor: float = 4
    ):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.padding_idx = padding_idx
        self.embedding_dim = m
        self._build_map(n, adaptive_cutoff, adaptive_factor)
        self.folded = nn.Parameter(torch.zeros(num_embeddings, m))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.folded)
