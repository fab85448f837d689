"""One layer of the Mogrifier LSTM (Melis, Kocisky & Blunsom, "Mogrifier LSTM", ICLR 2020), as the paper and its
official code (DeepMind's ``lamb``, ``TiedLSTMCell``) define it: :class:`MogrifierLSTMLayer`, the affine map of one
of its rounds (:class:`MogrifierRound`) and the dropout masks of one call of the stack
(:class:`MogrifierDropoutMasks`); the stack itself is :class:`~define_fairseq.modules.mogrifier.lstm.MogrifierLSTM`.

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

A layer runs a hand-written recurrence and backward (``recurrence.py``; on CUDA with rounds, its rounds
and cell as Triton kernels, ``fused.py``: :attr:`MogrifierLSTMLayer.kernels`), or ``nn.LSTM``'s fused
kernel when it is an uncapped LSTM without state mask. :meth:`MogrifierLSTMLayer.reference_step` is a literal,
readable per-step implementation (plain autograd) kept for the tests.
"""

from typing import List, NamedTuple, Optional, Tuple, Type

import torch
import torch.nn as nn
import torch.nn.functional as F

from define_fairseq.modules.checked_path import CheckedPath, eager_only
from define_fairseq.modules.mogrifier.recurrence import FUSED_DTYPES, LayerRecurrence, MogrifierLayerFunction
from define_fairseq.modules.mogrifier.threads import Workspace
from define_fairseq.modules.variance_scaling import variance_scaling_

LSTMState = Tuple[torch.Tensor, torch.Tensor]
KERNELS = ("auto", "triton", "torch")  # MogrifierLSTMLayer.kernels


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

    ``kernels`` (an attribute, not saved; ``--mogrifier-kernels``): ``"auto"`` runs the fast path's per-step work
    as Triton kernels on CUDA tensors of float32, bfloat16 or float16 (the parameters' dtype) when the layer has
    rounds, each call signature checked against the torch recurrence on its first call (a failure or a difference
    warns and runs torch from then on), in torch otherwise; ``"triton"`` always, unchecked (on a CPU only under
    Triton's interpreter, for tests); ``"torch"`` never. ``DEFINE_FAIRSEQ_EAGER=1`` runs torch whatever it says.
    """

    kernels: str = "auto"
    fused_devices = ("cuda",)  # where "auto" takes the Triton kernels (a test adds the CPU, with a stand-in)

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
        self.kernel_check = CheckedPath(
            "the Mogrifier LSTM's Triton kernels",
            "--mogrifier-kernels torch (MogrifierLSTMLayer.kernels = 'torch')",
            "compiling the Mogrifier's Triton kernels, once per width and dtype",
        )
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
        kind = self.recurrence_kind(x)
        inputs = [x, h0, c0, state_mask]
        if kind is LayerRecurrence or self.kernels == "triton":
            return self._recur(kind, *inputs)
        key = (tuple(x.shape), x.dtype, x.device, None if state_mask is None else state_mask.dim(),
               torch.is_grad_enabled(), tuple(t.requires_grad for t in (x, h0, c0)))  # fmt: skip
        parameters = [self.weight_ih, self.weight_hh, self.bias] + params
        fast, eager = (lambda *a: self._recur(kind, *a)), (lambda *a: self._recur(LayerRecurrence, *a))
        return self.kernel_check(key, fast, eager, inputs, parameters)

    def _recur(self, kind: Type[LayerRecurrence], x, h0, c0, state_mask):
        """The fast path's recurrence ``kind`` over the window (one autograd Function with its own backward)."""
        params = self.round_parameters()
        tensors = [x, h0, c0, self.weight_ih, self.weight_hh, self.bias] + params
        inputs = (x, h0, c0, state_mask, self.weight_ih, self.weight_hh, self.bias, self.cap_input_gate, self.rank)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            y, c = MogrifierLayerFunction.apply(*inputs, self.workspace, kind, *params)
        else:
            y, c = kind(*inputs, params, save=False, workspace=self.workspace).forward()
        return y, (y[-1], c)

    def recurrence_kind(self, x: torch.Tensor) -> Type[LayerRecurrence]:
        """The recurrence that runs ``x`` (see ``kernels``): :class:`LayerRecurrence` or the Triton kernels'."""
        if self.kernels not in KERNELS:
            raise ValueError(f"MogrifierLSTMLayer.kernels={self.kernels!r}: give one of {', '.join(KERNELS)}")
        if eager_only():
            return LayerRecurrence
        fused = self.kernels == "triton" or (
            self.kernels == "auto"
            and self.kernel_check.on
            and x.device.type in self.fused_devices
            and self.rounds > 0
            and x.dtype in FUSED_DTYPES
            and x.dtype == self.weight_ih.dtype  # the kernels multiply operands of one dtype
        )
        return self.fused_recurrence() if fused else LayerRecurrence

    @staticmethod
    def fused_recurrence() -> Type[LayerRecurrence]:
        """The Triton kernels' recurrence (imports Triton: only where its kernels run; a test replaces it)."""
        from define_fairseq.modules.mogrifier.fused import FusedRecurrence

        return FusedRecurrence

    def lstm_weights(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(weight_ih, weight_hh, bias_ih, bias_hh)`` in ``nn.LSTM`` layout (``bias_hh`` zero: one bias here)."""
        return self.weight_ih, self.weight_hh, self.bias, torch.zeros_like(self.bias)

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, rounds={self.rounds}, "
            f"rank={self.rank}, cap_input_gate={self.cap_input_gate}"
        )
