"""Dropout on weights rather than activations (AWD-LSTM, Merity et al., 2018).

* :class:`WeightDropLSTM`: DropConnect on the hidden-to-hidden matrix of one fused ``nn.LSTM`` layer; one mask
  per forward call, shared by every time step and sequence of the batch.
* :func:`embedding_dropout`: drops whole rows of a token -> vector table (every occurrence of a dropped word
  in the batch is zeroed), AWD-LSTM's ``dropoute``.

Both scale the kept values by ``1 / (1 - p)`` and are active in training only.
"""

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

from define_fairseq.modules.checks import check_probability

LSTMState = Tuple[torch.Tensor, torch.Tensor]


class WeightDropLSTM(nn.Module):
    """One single-layer, batch-first ``nn.LSTM`` whose ``weight_hh_l0`` goes through dropout in training.

    The layer is called with ``torch.func.functional_call`` and the dropped matrix in place of the raw one, so
    the whole sequence still runs as one fused LSTM call and the gradient reaches the raw parameter
    ``lstm.weight_hh_l0`` (through the mask). No module attribute is replaced.

    Args:
        input_size, hidden_size: as ``nn.LSTM``.
        weight_drop: dropout probability on the hidden-to-hidden weights.

    Shapes: ``x [B, T, input_size]``, ``state`` ``(h [1, B, hidden], c [1, B, hidden])`` or None (zeros)
    -> ``(out [B, T, hidden], (h [1, B, hidden], c [1, B, hidden]))``.
    """

    def __init__(self, input_size: int, hidden_size: int, weight_drop: float = 0.0):
        super().__init__()
        check_probability(weight_drop, "weight_drop")
        self.weight_drop = weight_drop
        self.lstm = nn.LSTM(input_size, hidden_size, batch_first=True)

    @property
    def input_size(self) -> int:
        return self.lstm.input_size

    @property
    def hidden_size(self) -> int:
        return self.lstm.hidden_size

    def forward(self, x: torch.Tensor, state: Optional[LSTMState] = None):
        if self.training and self.weight_drop > 0:
            dropped = F.dropout(self.lstm.weight_hh_l0, self.weight_drop, training=True)
            return functional_call(self.lstm, {"weight_hh_l0": dropped}, (x, state))
        return self.lstm(x, state)

    def extra_repr(self) -> str:
        return f"weight_drop={self.weight_drop}"


def embedding_dropout(
    embedded: torch.Tensor, tokens: torch.Tensor, num_embeddings: int, p: float, training: bool = True
) -> torch.Tensor:
    """Drop whole words: one Bernoulli draw per vocabulary entry, applied to every position holding that token.

    This equals dropping rows of the ``V x C`` table the vectors were looked up in (AWD-LSTM's
    ``embedded_dropout``), and works for any embedding module, a DeFINE unit included.

    Shapes: ``embedded [..., C]``, ``tokens [...]`` (long, values < ``num_embeddings``) -> ``[..., C]``.
    """
    check_probability(p, "embed_dropout")
    if not training or p == 0.0:
        return embedded
    keep = embedded.new_empty(num_embeddings).bernoulli_(1.0 - p).div_(1.0 - p)
    return embedded * keep[tokens].unsqueeze(-1)
