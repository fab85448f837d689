"""The output layer of the Mogrifier LSTM language model: scores tied to the embedding table, with one softmax or
lamb's mixture of softmaxes (Melis et al., 2020; Yang et al., 2018)."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from define_fairseq.modules.awd_lstm.locked_dropout import locked_dropout
from define_fairseq.modules.checks import check_probability
from define_fairseq.modules.variance_scaling import variance_scaling_


class TiedOutput(nn.Module):
    """Scores over the vocabulary from the stack's output, tied to the ``V x e`` embedding table ``table``.

    ``components == 1``: ``[projection H -> e (no bias) when H != e] -> dropout -> x table^T + bias``: logits.
    The dropout draws a new mask at every position, or with ``shared_mask`` one per sequence (``x [B, T, H]``).
    ``components == K > 1`` (lamb's mixture of softmaxes): ``p = tanh(projection(x))`` split into K vectors of
    ``e``, ``prior = log_softmax(prior(x))``; the result is ``log sum_k exp(prior_k + log_softmax(logits_k / T))``
    with ``logits_k = dropout(p_k) table^T + bias``: log-probabilities.

    Shapes: ``x [..., H]`` -> ``[..., V]``.
    """

    def __init__(
        self,
        table: nn.Parameter,
        hidden_size: int,
        components: int = 1,
        dropout: float = 0.0,
        shared_mask: bool = False,
    ):
        super().__init__()
        vocab, width = table.shape
        check_probability(dropout, "dropout")
        self.components = components
        self.dropout = dropout
        self.shared_mask = shared_mask
        self.width = width
        self.weight = table  # tied: the embedding's parameter, registered here too
        self.bias = nn.Parameter(torch.zeros(vocab))
        self.prior = None
        if components == 1:
            self.projection = nn.Linear(hidden_size, width, bias=False) if hidden_size != width else None
            if self.projection is not None:
                nn.init.orthogonal_(self.projection.weight)  # lamb's init of its output projection
        else:
            self.projection = nn.Linear(hidden_size, components * width, bias=True)
            self.prior = nn.Linear(hidden_size, components, bias=False)
            variance_scaling_(self.projection.weight, hidden_size)
            nn.init.zeros_(self.projection.bias)
            variance_scaling_(self.prior.weight, hidden_size)

    def forward(self, x: Tensor, temperature: float = 1.0) -> Tensor:
        if self.components == 1:
            if self.projection is not None:
                x = self._dropout(self.projection(x))
            return F.linear(x, self.weight, self.bias)
        components = self._dropout(torch.tanh(self.projection(x))).unflatten(-1, (self.components, self.width))
        logits = F.linear(components, self.weight, self.bias)  # [..., K, V]
        if temperature != 1.0:
            logits = logits / temperature
        log_prior = torch.log_softmax(self.prior(x).float(), dim=-1)  # [..., K]
        return torch.logsumexp(torch.log_softmax(logits.float(), dim=-1) + log_prior.unsqueeze(-1), dim=-2)

    def _dropout(self, x: Tensor) -> Tensor:
        if self.shared_mask:
            return locked_dropout(x, self.dropout, self.training)
        return F.dropout(x, self.dropout, self.training)

    def extra_repr(self) -> str:
        return (
            f"components={self.components}, width={self.width}, dropout={self.dropout}, shared_mask={self.shared_mask}"
        )
