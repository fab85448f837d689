"""The Mogrifier LSTM stack (Melis, Kocisky & Blunsom, "Mogrifier LSTM", ICLR 2020), as the paper and its official
code (DeepMind's ``lamb``) define it: :class:`MogrifierLSTM`, ``num_layers`` layers
(:class:`~define_fairseq.modules.mogrifier.layer.MogrifierLSTMLayer`, whose module docstring gives the equations and
the initialisation) with the official code's dropout and its optional sum of the layers' outputs.

Dropout (training mode) on layer 1's input, the input of layers >= 2, ``h_{t-1}`` (before the rounds) and the
output. As in the official code's configs (``shared_mask_dropout=False``), the input, inter-layer and output masks
are new at every time step, and each layer's state mask is shared by the steps of a call (its static unrolling,
PTB configs) or, with ``state_dropout_per_step``, new at every step (its ``dynamic_rnn`` loop, WikiText-2
configs). ``shared_mask_dropout=True`` shares the other masks over the steps too (variational dropout).
``sum_layer_outputs`` returns the sum of all layers' outputs (the official code's skip connection).

:meth:`MogrifierLSTM.reference_forward` is a literal, readable per-step implementation (plain autograd) kept for
the tests. ``MogrifierLSTM.cuda_graphs`` (off by default; ``mogrifier_lstm_lm`` turns it on) runs each BPTT window
on CUDA as CUDA graphs (``graphs.py``).
"""

from typing import List, Optional

import torch
import torch.nn as nn

from define_fairseq.modules.checked_path import CheckedPath
from define_fairseq.modules.checks import ParameterError, check_probability
from define_fairseq.modules.mogrifier.graphs import WindowGraphs
from define_fairseq.modules.mogrifier.layer import LSTMState, MogrifierDropoutMasks, MogrifierLSTMLayer


class MogrifierLSTM(nn.Module):
    """A stack of ``num_layers`` :class:`MogrifierLSTMLayer` (layer 1: ``input_size -> hidden_size``, the others
    ``hidden_size -> hidden_size``), with dropout and optional summed layer outputs.

    Args:
        input_size: features of the input (m of layer 1).
        hidden_size: state size n of every layer.
        num_layers: number of layers.
        rounds: mogrifier rounds r per step (0 = an LSTM).
        rank: 0 = full-rank Q/R; ``0 < rank < min(input_size, hidden_size)`` = low-rank factors.
        cap_input_gate: ``c = f c + min(1 - f, i) j`` (the official code's default) instead of ``f c + i j``.
        forget_bias: initial value of the forget-gate bias.
        input_dropout, inter_layer_dropout, state_dropout, output_dropout: dropout probabilities (module docstring).
        sum_layer_outputs: return the sum of all layers' outputs instead of the top layer's.
        shared_mask_dropout: one input, inter-layer and output mask per call, shared by its time steps, instead
            of a new one at every step.
        state_dropout_per_step: a new state mask at every time step instead of one per call.

    Shapes (batch first): ``x [B, T, input_size]``, ``state`` None (zeros) or a list of ``(h [B, H], c [B, H])``
    per layer -> ``(output [B, T, H], new_state)`` with ``new_state`` in the same per-layer form.

    :meth:`load_lstm_weights` / :meth:`to_lstm` copy the LSTM weights from / to an ``nn.LSTM``.

    ``cuda_graphs`` (an attribute, not saved; default off): a CUDA input with the masks drawn inside runs as CUDA
    graphs, one per call signature (:class:`~define_fairseq.modules.mogrifier.graphs.WindowGraphs`), each checked
    against the eager path on its first call (:class:`~define_fairseq.modules.checked_path.CheckedPath`: on a
    failure or a difference the stack warns and runs eagerly from then on).
    """

    cuda_graphs: bool = False

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        rounds: int = 5,
        rank: int = 0,
        cap_input_gate: bool = True,
        forget_bias: float = 1.0,
        input_dropout: float = 0.0,
        inter_layer_dropout: float = 0.0,
        state_dropout: float = 0.0,
        output_dropout: float = 0.0,
        sum_layer_outputs: bool = False,
        shared_mask_dropout: bool = False,
        state_dropout_per_step: bool = False,
    ):
        super().__init__()
        for name, value, least, note in (
            ("input_size", input_size, 1, None),
            ("hidden_size", hidden_size, 1, None),
            ("num_layers", num_layers, 1, None),
            ("rounds", rounds, 0, "0: a plain LSTM"),
            ("rank", rank, 0, "0: full rank"),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ParameterError(name, repr(value), f"must be an integer >= {least}", note)
        smallest = min(input_size, hidden_size)
        if rounds > 0 and rank >= smallest:
            raise ParameterError(
                "rank", rank, f"give 0 (full rank) or a rank below min(input_size, hidden_size) = {smallest}"
            )
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.rounds = rounds
        self.rank = rank
        self.cap_input_gate = bool(cap_input_gate)
        self.forget_bias = float(forget_bias)
        for name, p in (
            ("input_dropout", input_dropout),
            ("inter_layer_dropout", inter_layer_dropout),
            ("state_dropout", state_dropout),
            ("output_dropout", output_dropout),
        ):
            setattr(self, name, check_probability(p, name))
        self.sum_layer_outputs = bool(sum_layer_outputs)
        self.shared_mask_dropout = bool(shared_mask_dropout)
        self.state_dropout_per_step = bool(state_dropout_per_step)
        self.graphs = WindowGraphs()
        self.graph_check = CheckedPath(
            "the Mogrifier LSTM's CUDA graphs",
            "--mogrifier-no-cuda-graphs (MogrifierLSTM.cuda_graphs = False)",
            "capturing the Mogrifier's windows as CUDA graphs, once per shape (the first step waits for the capture "
            "and for the compilation of the Triton kernels)",
        )
        self.layers = nn.ModuleList(
            MogrifierLSTMLayer(
                input_size if i == 0 else hidden_size, hidden_size, rounds, rank, self.cap_input_gate, self.forget_bias
            )
            for i in range(num_layers)
        )

    @property
    def output_size(self) -> int:
        return self.hidden_size

    def zero_state(self, batch_size: int, like: torch.Tensor) -> List[LSTMState]:
        """Zero ``(h, c)`` for every layer, with the dtype and device of ``like``."""
        return [
            (like.new_zeros(batch_size, self.hidden_size), like.new_zeros(batch_size, self.hidden_size))
            for _ in range(self.num_layers)
        ]

    def sample_dropout_masks(self, batch_size: int, steps: int, like: torch.Tensor) -> MogrifierDropoutMasks:
        """Draw the masks of one forward call over ``steps`` time steps (what ``forward`` does in training mode):
        ``[T, B, size]`` where a mask is drawn per step, ``[B, size]`` where it is shared by the steps."""

        def mask(p: float, size: int, per_step: bool) -> Optional[torch.Tensor]:
            if p == 0.0:
                return None
            shape = (steps, batch_size, size) if per_step else (batch_size, size)
            return like.new_empty(shape).bernoulli_(1.0 - p).div_(1.0 - p)

        per_step = not self.shared_mask_dropout
        inputs = [
            mask(self.input_dropout if i == 0 else self.inter_layer_dropout, layer.input_size, per_step)
            for i, layer in enumerate(self.layers)
        ]
        states = [mask(self.state_dropout, self.hidden_size, self.state_dropout_per_step) for _ in self.layers]
        return MogrifierDropoutMasks(inputs, states, mask(self.output_dropout, self.hidden_size, per_step))

    def no_dropout_masks(self) -> MogrifierDropoutMasks:
        return MogrifierDropoutMasks([None] * self.num_layers, [None] * self.num_layers, None)

    def forward(
        self, x: torch.Tensor, state: Optional[List[LSTMState]] = None, masks: Optional[MogrifierDropoutMasks] = None
    ):
        """``x [B, T, input_size]`` -> ``(output [B, T, H], new_state)``. ``masks`` (optional) overrides the
        dropout masks, in any mode; by default they are drawn in training mode and absent in eval mode."""
        if self.cuda_graphs and self.graph_check.on and self.graphs.usable(x, masks):
            self._check(x, state)
            if x.shape[1] > 0:
                flat = [t for pair in (self.zero_state(x.shape[0], x) if state is None else state) for t in pair]
                key = self.graphs.signature(self, x, flat)
                return self.graph_check(key, self._graphed, self._eager, [x, *flat], self.parameters())
        return self._run(x, state, masks, reference=False)

    def _graphed(self, x, *flat):
        """The window through its CUDA graph (the eager path where no more graphs may be captured)."""
        state = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        return self.graphs.run(self, x, state) or self._run(x, state, None, reference=False)

    def _eager(self, x, *flat):
        return self._run(x, [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)], None, reference=False)

    def reference_forward(
        self, x: torch.Tensor, state: Optional[List[LSTMState]] = None, masks: Optional[MogrifierDropoutMasks] = None
    ):
        """Same as :meth:`forward`, computed step by step and round by round with plain autograd operations."""
        return self._run(x, state, masks, reference=True)

    def _check(self, x, state) -> None:
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(f"MogrifierLSTM expects input [B, T, {self.input_size}], got {list(x.shape)}")
        if state is not None and len(state) != self.num_layers:
            raise ValueError(f"MogrifierLSTM has {self.num_layers} layers but got a state for {len(state)}")

    def _run(self, x, state, masks, reference: bool):
        self._check(x, state)
        batch = x.shape[0]
        if masks is None:
            masks = self.sample_dropout_masks(batch, x.shape[1], x) if self.training else self.no_dropout_masks()
        if state is None:
            state = self.zero_state(batch, x)
        if x.shape[1] == 0:
            return x.new_zeros(batch, 0, self.hidden_size), list(state)
        inp = x.transpose(0, 1)  # [T, B, C]: every time step a contiguous [B, C] block
        if not inp.is_contiguous():
            inp = inp.contiguous()
        new_state: List[LSTMState] = []
        total = None
        for i, layer in enumerate(self.layers):
            if masks.inputs[i] is not None:
                inp = inp * masks.inputs[i]  # [B, C] broadcasts over the time steps
            h0, c0 = state[i]
            y, layer_state = layer(inp, h0, c0, masks.states[i], reference=reference)
            new_state.append(layer_state)
            if self.sum_layer_outputs:
                total = y if total is None else total + y
            inp = y
        out = total if self.sum_layer_outputs else inp
        if masks.output is not None:
            out = out * masks.output
        return out.transpose(0, 1).contiguous(), new_state

    def release_workspace(self) -> None:
        """Free the buffers the fast path keeps from one call to the next (a few hundred MB per layer at the
        paper's sizes while training); they are allocated again by the next call."""
        for layer in self.layers:
            layer.workspace.clear()

    # -- nn.LSTM interoperability ----------------------------------------------------------------------------

    def load_lstm_weights(self, lstm: nn.LSTM) -> None:
        """Copy the weights of an ``nn.LSTM`` of the same sizes (``bias_ih + bias_hh`` into the single bias);
        the mogrifier rounds, if any, are left as they are."""
        sizes = (self.input_size, self.hidden_size, self.num_layers)
        if (lstm.input_size, lstm.hidden_size, lstm.num_layers) != sizes or lstm.bidirectional or lstm.proj_size:
            raise ValueError(
                f"load_lstm_weights needs a unidirectional nn.LSTM({self.input_size}, "
                f"{self.hidden_size}, num_layers={self.num_layers}) without projection, got {lstm}"
            )
        with torch.no_grad():
            for k, layer in enumerate(self.layers):
                layer.weight_ih.copy_(getattr(lstm, f"weight_ih_l{k}"))
                layer.weight_hh.copy_(getattr(lstm, f"weight_hh_l{k}"))
                if lstm.bias:
                    layer.bias.copy_(getattr(lstm, f"bias_ih_l{k}") + getattr(lstm, f"bias_hh_l{k}"))
                else:
                    layer.bias.zero_()

    def to_lstm(self) -> nn.LSTM:
        """An ``nn.LSTM`` (batch first) with this module's LSTM weights (``bias_hh`` zero); it computes the same
        function when ``rounds == 0`` and ``cap_input_gate`` is off (without dropout)."""
        first = self.layers[0].weight_ih
        lstm = nn.LSTM(self.input_size, self.hidden_size, self.num_layers, batch_first=True).to(first)
        with torch.no_grad():
            for k, layer in enumerate(self.layers):
                for name, value in zip(("weight_ih", "weight_hh", "bias_ih", "bias_hh"), layer.lstm_weights()):
                    getattr(lstm, f"{name}_l{k}").copy_(value)
        return lstm

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, num_layers={self.num_layers}, "
            f"rounds={self.rounds}, rank={self.rank}, cap_input_gate={self.cap_input_gate}, "
            f"input_dropout={self.input_dropout}, inter_layer_dropout={self.inter_layer_dropout}, "
            f"state_dropout={self.state_dropout}, output_dropout={self.output_dropout}, "
            f"sum_layer_outputs={self.sum_layer_outputs}, shared_mask_dropout={self.shared_mask_dropout}, "
            f"state_dropout_per_step={self.state_dropout_per_step}"
        )
