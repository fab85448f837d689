"""A stack of LSTM layers of individual sizes, AWD-LSTM style (Merity et al., 2018).

Each layer is one fused ``nn.LSTM`` call over the whole sequence (cuDNN on GPU; no Python loop over time
steps). Optional regularisation: weight drop (DropConnect) on each layer's hidden-to-hidden matrix, and
locked dropout on the outputs passed from one layer to the next. The last layer's output is returned as it
is (any output dropout is the caller's).
"""

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from define_fairseq.modules.awd_lstm.locked_dropout import locked_dropout
from define_fairseq.modules.awd_lstm.weight_drop import WeightDropLSTM
from define_fairseq.modules.checks import check_probability

LSTMState = Tuple[torch.Tensor, torch.Tensor]


class LSTMStack(nn.Module):
    """``len(layer_sizes)`` LSTM layers: ``input_size -> layer_sizes[0] -> ... -> layer_sizes[-1]``.

    Layer ``l`` is ``layers[l]``, a :class:`WeightDropLSTM` (a single-layer batch-first ``nn.LSTM`` in
    ``layers[l].lstm``, PyTorch's parameters, two bias vectors).

    Args:
        input_size: features of the input (the embedding width m).
        layer_sizes: hidden size of every layer; the last one is the output width.
        weight_drop: DropConnect probability on every layer's hidden-to-hidden matrix (training only; one
            mask per forward call).
        hidden_dropout: locked dropout probability on the output of every layer but the last (training only;
            one mask per sequence, shared over time).

    Shapes (batch first):
        ``x [B, T, input_size]``; ``state``: None (zeros) or a list with one ``(h [B, H_l], c [B, H_l])`` per
        layer -> ``(out [B, T, layer_sizes[-1]], new_state)``, ``new_state`` in the same per-layer form (the
        state after the last time step).
    """

    def __init__(
        self, input_size: int, layer_sizes: Sequence[int], weight_drop: float = 0.0, hidden_dropout: float = 0.0
    ):
        super().__init__()
        layer_sizes = [int(s) for s in layer_sizes]
        if not layer_sizes or input_size < 1 or any(s < 1 for s in layer_sizes):
            raise ValueError(
                f"LSTMStack needs a positive input size and at least one positive layer size, got "
                f"input_size={input_size}, layer_sizes={layer_sizes}"
            )
        check_probability(hidden_dropout, "hidden_dropout")
        self.input_size = input_size
        self.layer_sizes = layer_sizes
        self.output_size = layer_sizes[-1]
        self.hidden_dropout = hidden_dropout
        sizes = [input_size] + layer_sizes
        self.layers = nn.ModuleList(
            WeightDropLSTM(sizes[i], sizes[i + 1], weight_drop=weight_drop) for i in range(len(layer_sizes))
        )

    def zero_state(self, batch_size: int, like: torch.Tensor) -> List[LSTMState]:
        """Zero ``(h, c)`` for every layer, with the dtype and device of ``like``."""
        return [(like.new_zeros(batch_size, size), like.new_zeros(batch_size, size)) for size in self.layer_sizes]

    def forward(self, x: torch.Tensor, state: Optional[List[LSTMState]] = None):
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(f"LSTMStack expects input [B, T, {self.input_size}], got {list(x.shape)}")
        if state is not None and len(state) != len(self.layers):
            raise ValueError(f"LSTMStack has {len(self.layers)} layers but got a state for {len(state)}")
        new_state = []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            layer_state = None if state is None else (state[i][0].unsqueeze(0), state[i][1].unsqueeze(0))
            x, (h, c) = layer(x, layer_state)
            new_state.append((h.squeeze(0), c.squeeze(0)))
            if i != last:
                x = locked_dropout(x, self.hidden_dropout, self.training)
        return x, new_state

    def extra_repr(self) -> str:
        return f"input_size={self.input_size}, layer_sizes={self.layer_sizes}, hidden_dropout={self.hidden_dropout}"
