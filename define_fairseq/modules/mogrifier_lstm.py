"""Mogrifier LSTM (Melis, Kocisky & Blunsom, "Mogrifier LSTM", ICLR 2020), as the paper and its official code
(DeepMind's ``lamb``, ``TiledLSTMCell``) define it.

One step of one layer, input size m, hidden size n, ``r`` rounds::

    x^{-1} = x_t (after input / inter-layer dropout),  h^0 = h_{t-1} (after state dropout)
    x^i = 2 sigmoid(Q^i h^{i-1} + q^i) * x^{i-2}     for odd  i in 1..r   (Q^i: n -> m)
    h^i = 2 sigmoid(R^i x^{i-1} + p^i) * h^{i-2}     for even i in 1..r   (R^i: m -> n)
    x_up, h_up = the highest-indexed x^i and h^i
    i, f, j, o = sigma, sigma, tanh, sigma of  W [x_up; h_up] + b     (one fused GEMM, nn.LSTM's gate order)
    c_t = f * c_{t-1} + min(1 - f, i) * j       (``cap_input_gate``; plain ``i * j`` without it)
    h_t = o * tanh(c_t)

Round 1 gates x (conditioned on h), round 2 gates h (conditioned on the latest x), and so on (zigzag); every
round has its own Q^i / R^i and bias, per layer. ``rank > 0`` factorises each map as ``left @ right``
(``[out, k] @ [k, in]``) plus a bias. The mogrified ``h_up`` only feeds this step's gates: the returned and carried
state is the ordinary LSTM ``(h_t, c_t)``; ``c`` is never gated.

Initialisation as in the official code: its truncated normal (``variance_scaling_``: std ``sqrt(1.3 / fan_in)``, cut
at two of those) for the LSTM weights per input tile (fan_in m for the x part, n for the h part), each gate's bias
(a vector of n: fan_in n; the forget gate's centred on ``forget_bias``) and full-rank Q/R (fan_in their input
size); low-rank factors truncated normal with std ``(1 / (fan_in * k)) ** 0.25``; round biases zero.

Dropout (training mode) on layer 1's input, the input of layers >= 2, ``h_{t-1}`` (before the rounds) and the
output. As in the official code's configs (``shared_mask_dropout=False``), the input, inter-layer and output masks
are new at every time step, and each layer's state mask is shared by the steps of a call (its static unrolling,
PTB configs) or, with ``state_dropout_per_step``, new at every step (its ``dynamic_rnn`` loop, WikiText-2
configs). ``shared_mask_dropout=True`` shares the other masks over the steps too (variational dropout).
``sum_layer_outputs`` returns the sum of all layers' outputs (the official code's skip connection).

Each layer runs a hand-written recurrence and backward (``mogrifier_recurrence.py``), or ``nn.LSTM``'s fused
kernel when it is an uncapped LSTM without state mask. :meth:`MogrifierLSTM.reference_forward` is a literal,
readable per-step implementation (plain autograd) kept for the tests.
"""

from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .checks import ParameterError, check_probability
from .mogrifier_recurrence import LayerRecurrence, MogrifierLayerFunction, Workspace
from .variance_scaling import variance_scaling_

LSTMState = Tuple[torch.Tensor, torch.Tensor]


class MogrifierRound(nn.Module):
    """The affine map of one mogrifier round, ``Q v + bias``. Shapes: ``v [B, in_features] -> [B, out_features]``.

    ``rank == 0``: ``Q`` is ``weight [out, in]``, ``in * out + out`` parameters. ``rank = k > 0``:
    ``Q = left [out, k] @ right [k, in]``, ``k * (in + out) + out`` parameters.
    """

    def __init__(self, in_features: int, out_features: int, rank: int = 0):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.rank = rank
        if rank == 0:
            self.weight = nn.Parameter(torch.empty(out_features, in_features))
            self.register_parameter("left", None)
            self.register_parameter("right", None)
        else:
            self.register_parameter("weight", None)
            self.left = nn.Parameter(torch.empty(out_features, rank))
            self.right = nn.Parameter(torch.empty(rank, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.rank == 0:
            variance_scaling_(self.weight, self.in_features)
        else:  # the official code's low-rank initialiser, so that Q's variance is about 1 / fan_in
            std = (1.0 / (self.in_features * self.rank)) ** 0.25
            for factor in (self.left, self.right):
                nn.init.trunc_normal_(factor, mean=0.0, std=std, a=-2.0 * std, b=2.0 * std)
        nn.init.zeros_(self.bias)

    def matrix(self) -> torch.Tensor:
        """``Q`` as one ``[out, in]`` matrix."""
        return self.weight if self.rank == 0 else self.left @ self.right

    def flat_parameters(self) -> Tuple[torch.Tensor, ...]:
        """``(weight, bias)`` (full rank) or ``(left, right, bias)`` (low rank)."""
        return (self.weight, self.bias) if self.rank == 0 else (self.left, self.right, self.bias)

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        if self.rank == 0:
            return F.linear(v, self.weight, self.bias)
        return F.linear(F.linear(v, self.right), self.left, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"


class MogrifierDropoutMasks(NamedTuple):
    """The dropout masks of one forward call (``None`` = no dropout there), already scaled by ``1/(1-p)``; each
    ``[B, size]`` (shared by every time step) or ``[T, B, size]`` (time major: one per step).

    ``inputs[l]`` (size: layer ``l``'s input) multiplies layer ``l``'s input (input dropout for layer 0,
    inter-layer dropout above); ``states[l]`` (size H) multiplies ``h_{t-1}`` of layer ``l`` before the rounds;
    ``output`` (size H) multiplies the returned output.
    """

    inputs: List[Optional[torch.Tensor]]
    states: List[Optional[torch.Tensor]]
    output: Optional[torch.Tensor]


class MogrifierLSTMLayer(nn.Module):
    """One Mogrifier LSTM layer: ``input_size`` m -> ``hidden_size`` n with ``rounds`` mogrifier rounds. Shapes: see
    :meth:`forward` (time major).

    Parameters: ``weight_ih [4n, m]``, ``weight_hh [4n, n]``, ``bias [4n]`` (gate order i, f, j, o, as
    ``nn.LSTM``; one bias vector, as the official code), and ``mogrifier[i]`` (:class:`MogrifierRound`) for
    round ``i + 1``: ``n -> m`` for odd rounds (they gate x), ``m -> n`` for even rounds (they gate h).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        rounds: int = 5,
        rank: int = 0,
        cap_input_gate: bool = True,
        forget_bias: float = 1.0,
    ):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.rounds = rounds
        self.rank = rank
        self.cap_input_gate = cap_input_gate
        self.forget_bias = forget_bias
        n = hidden_size
        self.weight_ih = nn.Parameter(torch.empty(4 * n, input_size))
        self.weight_hh = nn.Parameter(torch.empty(4 * n, n))
        self.bias = nn.Parameter(torch.empty(4 * n))
        self.workspace = Workspace()  # the fast path's buffers, reused from call to call
        self.mogrifier = nn.ModuleList(
            MogrifierRound(n, input_size, rank) if i % 2 == 0 else MogrifierRound(input_size, n, rank)
            for i in range(rounds)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        n = self.hidden_size
        variance_scaling_(self.weight_ih, self.input_size)
        variance_scaling_(self.weight_hh, n)
        variance_scaling_(self.bias, n)  # the official code's four gate biases: vectors of n, fan_in n
        with torch.no_grad():
            self.bias[n : 2 * n] += self.forget_bias
        for mog in self.mogrifier:
            mog.reset_parameters()

    @property
    def uses_fused_lstm(self) -> bool:
        """Whether this layer is a plain LSTM that ``torch.lstm`` (``nn.LSTM``'s kernel) can run."""
        return self.rounds == 0 and not self.cap_input_gate

    def round_parameters(self) -> List[torch.Tensor]:
        return [p for mog in self.mogrifier for p in mog.flat_parameters()]

    def mogrify(self, x: torch.Tensor, h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The rounds of one step, literally: ``x [B, m], h [B, n] -> (x_up, h_up)``."""
        for i, mog in enumerate(self.mogrifier):
            if i % 2 == 0:  # rounds 1, 3, 5, ...: gate x with the latest h
                x = 2.0 * torch.sigmoid(mog(h)) * x
            else:  # rounds 2, 4, 6, ...: gate h with the latest x
                h = 2.0 * torch.sigmoid(mog(x)) * h
        return x, h

    def reference_step(
        self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, state_mask: Optional[torch.Tensor] = None
    ) -> LSTMState:
        """One time step, readable: ``x [B, m]`` (dropped), ``h, c [B, n]`` -> new ``(h, c)``."""
        if state_mask is not None:
            h = h * state_mask
        x_up, h_up = self.mogrify(x, h)
        gates = F.linear(torch.cat([x_up, h_up], 1), torch.cat([self.weight_ih, self.weight_hh], 1), self.bias)
        i, f, j, o = gates.chunk(4, 1)
        i, f, j, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(j), torch.sigmoid(o)
        if self.cap_input_gate:
            i = torch.minimum(i, 1.0 - f)
        c = f * c + i * j
        return o * torch.tanh(c), c

    def forward(
        self,
        x: torch.Tensor,
        h0: torch.Tensor,
        c0: torch.Tensor,
        state_mask: Optional[torch.Tensor] = None,
        reference: bool = False,
    ):
        """``x [T, B, m]`` (time major, dropout applied), ``h0, c0 [B, n]``, ``state_mask`` None, ``[B, n]`` (every
        step) or ``[T, B, n]`` (one per step) -> ``(y [T, B, n], (h_T, c_T))``."""
        per_step = state_mask is not None and state_mask.dim() == 3
        if state_mask is not None and state_mask.shape != ((x.shape[0],) if per_step else ()) + h0.shape:
            raise ValueError(
                f"MogrifierLSTMLayer: the state mask must be [B, n] = {list(h0.shape)} or [T, B, n], "
                f"T = {x.shape[0]}; got {list(state_mask.shape)}"
            )
        if reference:
            h, c = h0, c0
            outputs = []
            for t in range(x.shape[0]):
                h, c = self.reference_step(x[t], h, c, state_mask[t] if per_step else state_mask)
                outputs.append(h)
            return torch.stack(outputs), (h, c)
        if self.uses_fused_lstm and state_mask is None:
            zero = torch.zeros_like(self.bias)
            # With no dropout, the train flag only makes cuDNN keep what its backward reads: needed for gradients in
            # eval mode too (cuDNN refuses a backward through an eval-mode call).
            y, h, c = torch.lstm(
                x,
                (h0.unsqueeze(0), c0.unsqueeze(0)),
                [self.weight_ih, self.weight_hh, self.bias, zero],
                True,
                1,
                0.0,
                self.training or torch.is_grad_enabled(),
                False,
                False,
            )
            return y, (h.squeeze(0), c.squeeze(0))
        params = self.round_parameters()
        tensors = [x, h0, c0, self.weight_ih, self.weight_hh, self.bias] + params
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            y, c = MogrifierLayerFunction.apply(
                x,
                h0,
                c0,
                state_mask,
                self.weight_ih,
                self.weight_hh,
                self.bias,
                self.cap_input_gate,
                self.rank,
                self.workspace,
                *params,
            )
        else:
            y, c = LayerRecurrence(
                x,
                h0,
                c0,
                state_mask,
                self.weight_ih,
                self.weight_hh,
                self.bias,
                self.cap_input_gate,
                self.rank,
                params,
                save=False,
                workspace=self.workspace,
            ).forward()
        return y, (y[-1], c)

    def lstm_weights(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(weight_ih, weight_hh, bias_ih, bias_hh)`` in ``nn.LSTM`` layout (``bias_hh`` zero: one bias here)."""
        return self.weight_ih, self.weight_hh, self.bias, torch.zeros_like(self.bias)

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, rounds={self.rounds}, "
            f"rank={self.rank}, cap_input_gate={self.cap_input_gate}"
        )


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
    """

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
        return self._run(x, state, masks, reference=False)

    def reference_forward(
        self, x: torch.Tensor, state: Optional[List[LSTMState]] = None, masks: Optional[MogrifierDropoutMasks] = None
    ):
        """Same as :meth:`forward`, computed step by step and round by round with plain autograd operations."""
        return self._run(x, state, masks, reference=True)

    def _run(self, x, state, masks, reference: bool):
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(f"MogrifierLSTM expects input [B, T, {self.input_size}], got {list(x.shape)}")
        if state is not None and len(state) != self.num_layers:
            raise ValueError(f"MogrifierLSTM has {self.num_layers} layers but got a state for {len(state)}")
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
