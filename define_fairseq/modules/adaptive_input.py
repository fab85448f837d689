"""Adaptive input embeddings (Baevski & Auli, 2019) in the form the DeFINE paper's parameter counts imply."""

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from define_fairseq.modules.checks import ParameterError, check_cutoff


def rows_by_group(group: torch.Tensor, groups: int) -> Tuple[torch.Tensor, List[int]]:
    """The rows sorted by their group, each group's rows in increasing order (a stable sort), and where each group
    ends in that order: one wait for the host to learn every group's size, instead of one or more per group.

    Shapes: ``group [N]`` (long, values in ``[0, groups)``) -> ``(order [N], ends)``, ``ends`` a list of ``groups``
    ints: group ``g``'s rows are ``order[ends[g - 1]:ends[g]]`` (from 0 for ``g = 0``)."""
    sorted_groups, order = torch.sort(group, stable=True)
    ends = torch.searchsorted(sorted_groups, torch.arange(1, groups + 1, device=group.device))
    return order, ends.tolist()


class AdaptiveInput(nn.Module):
    """Token embeddings whose width shrinks with frequency: band ``i`` (tokens ``cutoff[i-1] <= t < cutoff[i]``,
    sorted by frequency as fairseq dictionaries are) has ``dim // factor**i`` dimensions and a bias-free
    projection to ``output_dim``.

    Band 0 has no projection when ``dim == output_dim``. That differs from ``fairseq.modules.AdaptiveInput``
    (which projects every band) and is what reproduces the DeFINE paper's shared input/output counts (9.25M at
    d=256 for WikiText-103). ``weights_for_band(i)`` returns ``(table, projection)`` in the layout fairseq's
    ``AdaptiveSoftmax(..., adaptive_inputs=this, tie_proj=True)`` ties to: ``table [size_i, dim_i]`` and
    ``projection [output_dim, dim_i]`` (``None`` for an unprojected band 0).

    No embedding scale is applied. Shapes: ``tokens [...]`` (long) -> ``[..., output_dim]``.
    """

    def __init__(
        self,
        num_embeddings: int,
        padding_idx: Optional[int],
        dim: int,
        cutoff: Sequence[int],
        factor: float = 4,
        output_dim: Optional[int] = None,
    ):
        super().__init__()
        output_dim = dim if output_dim is None else output_dim
        self.cutoff = check_cutoff(cutoff, num_embeddings)
        self.num_embeddings = num_embeddings
        self.padding_idx = padding_idx
        self.embedding_dim = output_dim
        self.factor = factor
        self.tables = nn.ModuleList()
        self.projections = nn.ModuleList()
        start = 0
        for band, end in enumerate(self.cutoff):
            band_dim = int(dim // (factor**band))
            if band_dim < 1:
                raise ParameterError(
                    "factor",
                    factor,
                    f"band {band} would have {dim} // {factor}**{band} = 0 "
                    f"dimensions; use fewer cutoffs or a smaller factor",
                )
            pad = padding_idx if band == 0 and padding_idx is not None and padding_idx < end else None
            table = nn.Embedding(end - start, band_dim, padding_idx=pad)
            nn.init.normal_(table.weight, mean=0.0, std=band_dim**-0.5)
            self.tables.append(table)
            if band == 0 and band_dim == output_dim:
                self.projections.append(nn.Identity())
            else:
                projection = nn.Linear(band_dim, output_dim, bias=False)
                nn.init.xavier_uniform_(projection.weight)
                self.projections.append(projection)
            start = end
            if pad is not None:
                with torch.no_grad():
                    table.weight[pad].zero_()
        # the first token of each band after the first, on the module's device (not saved: it follows from cutoff)
        self.register_buffer("band_starts", torch.tensor(self.cutoff[:-1], dtype=torch.long), persistent=False)

    def weights_for_band(self, band: int) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        projection = self.projections[band]
        return self.tables[band].weight, (None if isinstance(projection, nn.Identity) else projection.weight)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if len(self.cutoff) == 1:
            return self.projections[0](self.tables[0](tokens)).to(self.tables[0].weight.dtype)
        flat = tokens.reshape(-1)
        order, bounds = rows_by_group(torch.bucketize(flat, self.band_starts, right=True), len(self.cutoff))
        if bounds[0] == flat.numel() and isinstance(self.projections[0], nn.Identity):
            return self.tables[0](tokens)
        out = tokens.new_zeros((flat.numel(), self.embedding_dim), dtype=self.tables[0].weight.dtype)
        start, first = 0, 0
        for band, end in enumerate(self.cutoff):
            if bounds[band] > first:
                rows = order[first : bounds[band]]
                vectors = self.projections[band](self.tables[band](flat[rows] - start)).to(out.dtype)
                out.index_put_((rows,), vectors)
            start, first = end, bounds[band]
        return out.view(tokens.shape + (self.embedding_dim,))
