"""The losses and metrics of :mod:`define_fairseq.tools.distill_c2s`.

The paper's unweighted four-term approximation loss of a predicted vector ``ê = f(chars)`` against the table's
vector ``e`` (averaged over a batch; the table E stays frozen)::

    L = L_cos + L_2 + L_nbr + L_ce
    L_cos = 1 - cos(e, ê)
    L_2   = ||e - ê||_2                                   (the Euclidean distance itself, not squared)
    L_nbr = 1/k sum_j (dis(e, n_j) - dis(ê, n_j))^2      dis = 1 - cos; n_1..n_k: the k nearest entries of e
                                                          in E by cosine, itself excluded, found once
    L_ce  = cross-entropy of softmax(ê E^T) against the entry's own id (all V rows of E)

The metrics: top-1 accuracy (the row of E nearest to ê by cosine is the entry's own) and neighbour precision@k
(the share of e's k nearest entries found among ê's k nearest, the entry itself excluded from both).
"""

from typing import Dict

import torch
import torch.nn.functional as F
from torch import Tensor

LOSS_TERMS = ("cos", "l2", "nbr", "ce")


def approximation_losses(
    pred: Tensor, target: Tensor, neighbours: Tensor, table: Tensor, labels: Tensor
) -> Dict[str, Tensor]:
    """The four terms of the approximation loss, each averaged over the batch.

    Args:
        pred: ``[N, d]`` the predicted vectors ê.
        target: ``[N, d]`` the table's vectors e.
        neighbours: ``[N, k, d]`` the vectors of the k nearest entries of each e.
        table: ``[V, d]`` the (frozen) table, the output layer of ``L_ce``.
        labels: ``[N]`` each entry's id in ``table``.
    Returns:
        ``{"cos", "l2", "nbr", "ce"}``: scalar tensors.
    """
    cos = 1.0 - F.cosine_similarity(pred, target, dim=-1)
    l2 = (target - pred).norm(dim=-1)
    dis_true = 1.0 - F.cosine_similarity(target.unsqueeze(1), neighbours, dim=-1)
    dis_pred = 1.0 - F.cosine_similarity(pred.unsqueeze(1), neighbours, dim=-1)
    nbr = (dis_true - dis_pred).pow(2).mean(dim=1)
    ce = F.cross_entropy(pred @ table.t(), labels)
    return {"cos": cos.mean(), "l2": l2.mean(), "nbr": nbr.mean(), "ce": ce}


def nearest_neighbours(table: Tensor, k: int, chunk: int = 1024) -> Tensor:
    """``[R, k]``: for each row of ``table [R, d]``, the k other rows with the highest cosine similarity."""
    unit = F.normalize(table.float(), dim=-1)
    out = []
    for start in range(0, unit.size(0), chunk):
        sim = unit[start : start + chunk] @ unit.t()
        rows = torch.arange(start, start + sim.size(0), device=sim.device)
        sim[torch.arange(sim.size(0), device=sim.device), rows] = float("-inf")
        out.append(sim.topk(k, dim=1).indices)
    return torch.cat(out)


def approximation_metrics(pred: Tensor, table: Tensor, neighbours: Tensor, chunk: int = 1024) -> Dict[str, float]:
    """Top-1 accuracy and neighbour precision@k of ``pred [R, d]`` against ``table [R, d]`` (row i of both is
    entry i; ``neighbours [R, k]``: the true k nearest rows of each entry, itself excluded)."""
    k = neighbours.size(1)
    unit_pred, unit_table = F.normalize(pred.float(), dim=-1), F.normalize(table.float(), dim=-1)
    hits, shared = 0, 0
    for start in range(0, pred.size(0), chunk):
        sim = unit_pred[start : start + chunk] @ unit_table.t()
        n = sim.size(0)
        rows = torch.arange(start, start + n, device=sim.device)
        hits += int(sim.argmax(dim=1).eq(rows).sum())
        sim[torch.arange(n, device=sim.device), rows] = float("-inf")
        found = sim.topk(k, dim=1).indices
        shared += int((found.unsqueeze(2) == neighbours[start : start + n].unsqueeze(1)).any(dim=2).sum())
    return {"accuracy": hits / pred.size(0), "precision": shared / (pred.size(0) * k)}
