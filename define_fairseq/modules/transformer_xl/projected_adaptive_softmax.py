"""Transformer-XL's projected adaptive log-softmax with one embedding width for all clusters (``div_val = 1``).

The vocabulary (sorted by frequency) is cut into clusters ``[0, c0), [c0, c1), ..., [c_{C-2}, V)``. The head
scores the words of cluster 0 plus one entry per tail cluster ("the word is in cluster c"); a tail word's
log-probability is its cluster entry's head log-probability plus its log-probability within the cluster.
Every cluster scores ``p_c = h @ P_c`` (``P_c [input_dim, n]``, or the identity when ``n == input_dim``)
against its rows of the shared ``V x n`` table (which may be tied to the input embedding) plus a bias.

:meth:`ProjectedAdaptiveSoftmax.forward` has the interface of ``fairseq.modules.AdaptiveSoftmax`` that
fairseq's ``adaptive_loss`` criterion calls, and :meth:`get_log_prob` that of its ``get_log_prob``. Note that
``adaptive_loss`` passes ``ignore_index = padding_idx`` for every cluster, so (as with fairseq's own
``AdaptiveSoftmax``) a tail word whose index within its cluster equals ``padding_idx`` is left out of the loss.
"""

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from define_fairseq.modules.adaptive_input import rows_by_group
from define_fairseq.modules.checks import check_cutoff, check_positive, check_probability


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 when it is half precision (float16, bfloat16), else unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


_CACHE_BYTES_PER_THREAD = 1 << 20  # rows of at most this size per thread stay in a core's cache (L2)


def _rows_per_chunk(block: torch.Tensor) -> int:
    """How many rows of ``block [N, width]`` to normalise at a time: about 1 MiB per intra-op thread, and at
    least one row per thread (the log-softmax runs its rows in parallel)."""
    threads = max(1, torch.get_num_threads())
    row_bytes = block.size(1) * block.element_size()
    return threads * max(1, _CACHE_BYTES_PER_THREAD // max(1, row_bytes))


class ProjectedAdaptiveSoftmax(nn.Module):
    """Projected adaptive softmax over ``V`` words for inputs of width ``input_dim``.

    Parameters: ``table [V, n]`` (a given ``nn.Parameter`` is used as is, i.e. tied; else owned, N(0, 0.02)),
    ``bias [V]`` (zeros), ``cluster_weight [C-1, n]`` (N(0, 0.02)) and ``cluster_bias [C-1]`` (zeros), and per
    cluster ``c`` a projection ``projections[c] [input_dim, n]`` or ``None`` (identity).

    ``projections`` argument: ``None`` gives every cluster an own projection (N(0, 0.01), Transformer-XL's
    ``proj_init_std``) when ``n != input_dim`` and none at all when ``n == input_dim``. A list has one entry per
    cluster: an ``nn.Parameter [input_dim, n]`` to tie to (used as is), or ``None`` for the default above (own
    projection when ``n != input_dim``, identity when ``n == input_dim``). Projections are registered as
    parameters ``projection_0 ...`` so a Parameter shared with another module (or between clusters) appears once
    in ``parameters()``; ``projections`` is the list of them.

    Args:
        vocab_size: V.
        embed_dim: n, the table width.
        input_dim: width of the decoder output.
        cutoff: increasing cluster boundaries below V (V itself may be given last); ``self.cutoff`` ends with V.
        table: optional ``nn.Parameter [V, n]`` to tie to.
        projections: see above.
        dropout: on the input, while training.
        static_shapes: :meth:`forward` scores every row against every tail cluster and marks the rows of other
            clusters with ``ignore_index`` in that cluster's targets, instead of selecting each cluster's rows
            (whose counts the host must wait for, once a call for all clusters). The loss is the same; the work is
            that of a full softmax, but every shape is static (CUDA graphs, ``torch.compile(fullgraph=True)``).
        ignore_index: the target ``static_shapes`` gives the rows outside a cluster: ``cross_entropy``'s default
            (-100), as this package's ``lm_regularized_loss`` calls it; fairseq's ``adaptive_loss`` needs the
            dictionary's padding index.

    Shapes: ``forward``: ``input [..., input_dim]``, ``target [...]`` -> per-cluster ``[N_c, size_c]`` logits and
    ``[N_c]`` targets; ``get_log_prob``: ``input [..., input_dim]`` -> ``[..., V]``.
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        input_dim: int,
        cutoff: Sequence[int],
        table: Optional[nn.Parameter] = None,
        projections: Optional[Sequence[Optional[nn.Parameter]]] = None,
        dropout: float = 0.0,
        static_shapes: bool = False,
        ignore_index: int = -100,
    ):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("embed_dim", embed_dim), ("input_dim", input_dim)):
            check_positive(value, name)
        check_probability(dropout, "dropout")
        self.vocab_size = vocab_size
        self.embed_dim = embed_dim
        self.input_dim = input_dim
        self.static_shapes = static_shapes
        self.ignore_index = ignore_index
        self.cutoff = check_cutoff(cutoff, vocab_size)
        self.cluster_sizes = [hi - lo for lo, hi in zip([0] + self.cutoff[:-1], self.cutoff)]
        clusters = len(self.cutoff)
        self.num_clusters = clusters

        if table is None:
            self.table = nn.Parameter(torch.empty(vocab_size, embed_dim))
            nn.init.normal_(self.table, 0.0, 0.02)
        else:
            if not isinstance(table, nn.Parameter):
                raise ValueError("table must be an nn.Parameter (it is tied, not copied)")
            if table.shape != (vocab_size, embed_dim):
                raise ValueError(
                    f"table must be [vocab_size, embed_dim] = [{vocab_size}, {embed_dim}], got {list(table.shape)}"
                )
            self.table = table
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.cluster_weight = nn.Parameter(torch.empty(clusters - 1, embed_dim))
        nn.init.normal_(self.cluster_weight, 0.0, 0.02)
        self.cluster_bias = nn.Parameter(torch.zeros(clusters - 1))

        if projections is None:
            projections = [None] * clusters
        projections = list(projections)
        if len(projections) != clusters:
            raise ValueError(
                f"projections must have one entry per cluster ({clusters} for cutoff "
                f"{self.cutoff}), got {len(projections)}"
            )
        for c, proj in enumerate(projections):
            if proj is None:
                if embed_dim != input_dim:
                    proj = nn.Parameter(torch.empty(input_dim, embed_dim))
                    nn.init.normal_(proj, 0.0, 0.01)
            else:
                if not isinstance(proj, nn.Parameter):
                    raise ValueError(f"projections[{c}] must be None or an nn.Parameter (tied, not copied)")
                if proj.shape != (input_dim, embed_dim):
                    raise ValueError(
                        f"projections[{c}] must be [input_dim, embed_dim] = [{input_dim}, {embed_dim}], "
                        f"got {list(proj.shape)}"
                    )
            self.register_parameter(f"projection_{c}", proj)
        self.dropout = nn.Dropout(dropout)
        # the first word of each tail cluster, on the module's device (not saved: it follows from the cutoff)
        self.register_buffer("tail_starts", torch.tensor(self.cutoff[:-1], dtype=torch.long), persistent=False)

    @property
    def projections(self) -> List[Optional[nn.Parameter]]:
        """One entry per cluster: ``[input_dim, n]`` Parameter, or ``None`` for the identity."""
        return [getattr(self, f"projection_{c}") for c in range(self.num_clusters)]

    def _cluster_words(self) -> Tuple[Tuple[torch.Tensor, ...], Tuple[torch.Tensor, ...]]:
        """The table and the bias split into one view per cluster: ``([size_c, n], ...)``, ``([size_c], ...)``.

        One split for all clusters rather than a slice per cluster, so that backward writes the table's gradient
        once (the split's gradient is the clusters' gradients put side by side) instead of a zero-filled
        ``[V, n]`` tensor per cluster summed one after the other.
        """
        return self.table.split(self.cluster_sizes), self.bias.split(self.cluster_sizes)

    def _cluster_logits(self, h: torch.Tensor, c: int, table: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``[N, size_c]`` logits of the words of cluster ``c`` (``table [size_c, n]``, ``bias [size_c]``) for
        ``h [N, input_dim]``."""
        proj = getattr(self, f"projection_{c}")
        p = h if proj is None else h @ proj
        return F.linear(p, table, bias)

    def _head_logits(self, h: torch.Tensor, table: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``[N, c0 + C - 1]``: cluster 0's words (``table [c0, n]``, ``bias [c0]``), then one entry per tail
        cluster."""
        proj = self.projection_0
        p = h if proj is None else h @ proj
        weight = torch.cat([table, self.cluster_weight], dim=0)
        bias = torch.cat([bias, self.cluster_bias], dim=0)
        return F.linear(p, weight, bias)

    def forward(
        self, input: torch.Tensor, target: torch.Tensor
    ) -> Tuple[List[Optional[torch.Tensor]], List[Optional[torch.Tensor]]]:
        """Logits and targets per cluster, for ``cross_entropy`` (fairseq's ``adaptive_loss``).

        Args:
            input: ``[..., input_dim]``.
            target: ``[...]`` word ids.

        Returns ``(logits, targets)``, flattened to N rows: ``logits[0] [N, c0 + C - 1]`` and ``targets[0] [N]``
        (the word for head words, ``c0 + c - 1`` for a word of tail cluster ``c``); for ``c >= 1``
        ``logits[c] [N_c, size_c]`` and ``targets[c] [N_c]`` (the word minus the cluster's start) for the rows
        whose target is in cluster ``c``, or ``None`` / ``None`` when there are none. With ``static_shapes``,
        ``logits[c] [N, size_c]`` and ``targets[c] [N]`` for every cluster, ``ignore_index`` where a row's target is
        in another cluster.
        """
        h = self.dropout(input.reshape(-1, input.size(-1)))
        target = target.reshape(-1)
        if h.size(0) != target.size(0):
            raise ValueError(f"input has {h.size(0)} rows but target has {target.size(0)}")
        c0 = self.cutoff[0]
        tables, biases = self._cluster_words()
        logits: List[Optional[torch.Tensor]] = [self._head_logits(h, tables[0], biases[0])]
        if self.num_clusters == 1:
            return logits, [target.clone()]
        cluster = torch.bucketize(target, self.tail_starts, right=True)  # [N]: the cluster of each row's word
        head_target = torch.where(cluster > 0, cluster + (c0 - 1), target)
        targets: List[Optional[torch.Tensor]] = [head_target]
        if self.static_shapes:
            for c in range(1, self.num_clusters):
                logits.append(self._cluster_logits(h, c, tables[c], biases[c]))
                targets.append(torch.where(cluster == c, target - self.cutoff[c - 1], self.ignore_index))
            return logits, targets
        order, bounds = rows_by_group(cluster, self.num_clusters)
        for c in range(1, self.num_clusters):
            rows = order[bounds[c - 1] : bounds[c]]
            if rows.numel() == 0:
                logits.append(None)
                targets.append(None)
                continue
            logits.append(self._cluster_logits(h[rows], c, tables[c], biases[c]))
            targets.append(target[rows] - self.cutoff[c - 1])
        return logits, targets

    def get_log_prob(self, input: torch.Tensor, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Full log-probabilities ``[..., V]`` for ``input [..., input_dim]`` (e.g. ``[B, T, input_dim]``).

        ``target`` is accepted for fairseq's interface and ignored. The result is float32 for half-precision input
        (float16, bfloat16), as fairseq's own log-softmax returns it: rounding log-probabilities of about -10 to
        half precision would cost several thousandths of a nat per token. Other input keeps its dtype.
        """
        shape = input.shape[:-1]
        h = self.dropout(input.reshape(-1, input.size(-1)))
        c0 = self.cutoff[0]
        tables, biases = self._cluster_words()
        head = F.log_softmax(_at_least_float32(self._head_logits(h, tables[0], biases[0])), dim=-1)
        out = head.new_empty(h.size(0), self.vocab_size)
        out[:, :c0] = head[:, :c0]
        with_grad = torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in self.parameters()))
        for c in range(1, self.num_clusters):
            lo, hi = self.cutoff[c - 1], self.cutoff[c]
            prior = head[:, c0 + c - 1 : c0 + c]  # log p(cluster c)
            block = out[:, lo:hi]
            proj = getattr(self, f"projection_{c}")
            p = h if proj is None else h @ proj
            if with_grad or p.dtype != out.dtype:
                block.copy_(F.log_softmax(_at_least_float32(F.linear(p, tables[c], biases[c])), dim=-1) + prior)
            else:
                # Without autograd, each cluster is computed inside its block of the [N, V] result: no temporary
                # of the block's size (at V = 267,735 these passes over memory are most of the cost).
                torch.addmm(biases[c], p, tables[c].t(), out=block)
                # Then log_softmax(x) + prior = x - (logsumexp(x) - prior), a few rows at a time, few enough
                # that they stay in the cores' caches from one pass to the next: the block crosses main memory
                # three times (written, read, written back). A log_softmax on the strided block would copy it
                # to a contiguous buffer and back, and the prior would take another pass.
                step = _rows_per_chunk(block)
                for start in range(0, block.size(0), step):
                    rows = block[start : start + step]
                    shift = torch.logsumexp(rows, dim=-1, keepdim=True).sub_(prior[start : start + step])
                    rows.sub_(shift)
        return out.view(*shape, self.vocab_size)
