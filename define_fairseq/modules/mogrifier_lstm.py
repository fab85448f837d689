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

Initialisation as in the official code: LSTM weights truncated normal with variance 1/fan_in per input tile
(fan_in m for the x part, n for the h part); full-rank Q/R the same (fan_in = their input size); low-rank
factors truncated normal (two standard deviations) with std ``(1 / (fan_in * k)) ** 0.25``, so that the product
has variance about 1/fan_in; all biases zero except the forget gate's, which starts at ``forget_bias``.

Dropout is variational: one mask per sequence, shared by all time steps, drawn at every ``forward`` in training
mode: ``input_dropout`` on layer 1's input, ``inter_layer_dropout`` on the input of layers >= 2, ``state_dropout``
on ``h_{t-1}`` (before the rounds, as for the input), ``output_dropout`` on the returned output.
``sum_layer_outputs`` returns the sum of all layers' outputs (the official code's skip connection) instead of
the top layer's. (The official code, with its ``shared_mask_dropout=False``, shares only the state mask over time
and draws new input, inter-layer and output masks at every step; this module shares all four.)

Speed. The recurrence cannot use a fused ``nn.LSTM``: ``x_t`` is modulated by ``h_{t-1}``, so ``W_x x`` cannot be
hoisted out of the time loop. Each layer runs as one ``torch.autograd.Function`` with a hand-written backward
through time (``_MogrifierLayerFunction``, ``_LayerRecurrence``):

* forward: a Python loop over time steps without autograd recording; per step one GEMM per round (two for low
  rank), one GEMM over ``[x_up; h_up; 1]`` for the four gates (bias included), and a handful of element-wise
  kernels, all writing into preallocated ``[T, B, *]`` buffers that the backward reads;
* backward: a reverse loop that only propagates the activation gradients (one GEMM with ``W`` per step plus one
  or two per round, ATen's fused ``sigmoid_backward`` / ``tanh_backward``); every weight gradient is then ONE GEMM
  over all ``T * B`` rows, instead of ``T`` small GEMMs plus ``T`` accumulations of a ``4n x (m + n)`` matrix,
  which is what autograd records for any per-step loop (eager, TorchScript or compiled);
* on CPU under ``OMP_WAIT_POLICY=PASSIVE`` (idle OpenMP threads sleep) the small per-step work (element-wise
  kernels, low-rank GEMMs) runs on one thread and the large GEMMs on all of torch's threads: at B x n = 64 x 1000
  an element-wise kernel computes for a few microseconds, and waking the sleeping threads costs ten times that
  (``_Threads``). Under OpenMP's default policy (idle threads spin for a while) waking them is cheap, and
  everything runs on all threads;
* the buffers are kept from one call to the next (``_Workspace``; ``MogrifierLSTM.release_workspace()`` frees
  them), which saves the page faults of touching a few hundred MB of fresh memory at every step;
* with ``rounds == 0`` (the capped LSTM baseline) the input projection is hoisted: one GEMM over the whole
  sequence in the forward and one for the input gradient in the backward;
* ``rounds == 0`` with ``cap_input_gate=False`` and no state dropout runs one fused ``nn.LSTM`` kernel per layer
  (``torch.lstm``, cuDNN on GPU) with this module's weights.

What was measured before choosing (``benchmarks/mogrifier_speed.py``; 1 layer, m = n = 1000, batch 64, BPTT 70,
r = 5, k = 84, forward + backward, float32, 2 threads, ``OMP_WAIT_POLICY=PASSIVE``, 2-core CPU; ms per call):
the same per-step computation written with ordinary autograd ops took 2612 eager and 2711 as a TorchScript
function (TorchScript's CPU fuser is off by default) against 1246 for the hand-written backward in the same run;
``torch.compile`` of the step function (autograd through it) was about 10 % faster than eager, after a 33 s
compilation on the first call. Along the way the hand-written backward went from 2074 (first version) to 1462
with fewer kernels per step (the 2 sigmoid(a) = 1 + tanh(a / 2) form, biases in the GEMMs, no recomputation) and
to 1268 with the small work on one thread; reusing the buffers saved a further 7 % in a paired measurement. A
fused ``nn.LSTM`` of the same size took 765-810. MKL's packed GEMM (the weight packed once per call) gave nothing
here. Later, with the wait policy unset (2 layers, paired, median of 6): the small work on one thread took
2258 ms a call against 2017 on all threads (1.12x slower), and under ``ACTIVE`` 2448 against 2138; under
``PASSIVE`` it was the other way round, 2514 against 3035. Hence the choice by policy. ``benchmarks/results/
mogrifier_speed.md`` holds the latest run (against ``nn.LSTM`` and the straightforward ``nn.Linear`` +
``nn.LSTMCell`` module).

:meth:`MogrifierLSTM.reference_forward` is a literal, readable per-step implementation (plain autograd) kept for
the tests.
"""

import math
import os
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

LSTMState = Tuple[torch.Tensor, torch.Tensor]

# The standard deviation of a standard normal truncated to [-2, 2]; dividing by it gives a truncated normal the
# intended variance (TensorFlow's variance-scaling initializer does the same).
_TRUNCATED_STD = 0.87962566103423978


def _variance_scaling_(weight: torch.Tensor, fan_in: int) -> torch.Tensor:
    """Truncated normal (two standard deviations) with variance ``1 / fan_in``."""
    std = math.sqrt(1.0 / fan_in) / _TRUNCATED_STD
    return nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-2.0 * std, b=2.0 * std)


def _low_rank_factor_(weight: torch.Tensor, fan_in: int, rank: int) -> torch.Tensor:
    """Truncated normal (two standard deviations) with std ``(1 / (fan_in * rank)) ** 0.25``."""
    std = (1.0 / (fan_in * rank)) ** 0.25
    return nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-2.0 * std, b=2.0 * std)


class MogrifierRound(nn.Module):
    """The affine map of one mogrifier round: ``v [B, in_features] -> Q v + bias [B, out_features]``.

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
            _variance_scaling_(self.weight, self.in_features)
        else:
            _low_rank_factor_(self.left, self.in_features, self.rank)
            _low_rank_factor_(self.right, self.in_features, self.rank)
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
    """Variational dropout masks of one forward call (``None`` = no dropout there); already scaled by ``1/(1-p)``.

    ``inputs[l] [B, input size of layer l]`` multiplies layer ``l``'s input at every step (input dropout for
    layer 0, inter-layer dropout above); ``states[l] [B, H]`` multiplies ``h_{t-1}`` of layer ``l`` at every step
    before the rounds; ``output [B, H]`` multiplies the returned output at every step.
    """

    inputs: List[Optional[torch.Tensor]]
    states: List[Optional[torch.Tensor]]
    output: Optional[torch.Tensor]


# ---------------------------------------------------------------------------------------------------------------
# The fast path of one layer: a loop over time without autograd recording, and a hand-written backward.
#
# Written for small CPUs, where at these sizes (B x n around 64 x 1000) an element-wise kernel computes for a few
# microseconds and its cost is in launching it:
# - the small per-step work (element-wise kernels, low-rank GEMMs) runs on one thread, the large GEMMs on all
#   of torch's threads (see _Threads);
# - few kernels per step: a round computes 2 sigmoid(a) * v as v + v * tanh(a / 2) (the same function), one
#   tanh and one addcmul besides its GEMMs; biases ride in the GEMMs as a column of ones ([x_up; h_up; 1] for the
#   gates, [u; 1] for a low-rank round, whose (left | bias) factor is scaled by 1/2 once per call); every value of
#   the x and h chains is written straight into a buffer that the backward reads (no recomputation, no copies);
#   the backward uses ATen's fused sigmoid_backward / tanh_backward kernels and in-place addmm_;
# - the weight gradients are one GEMM each over all T * B rows after the loop (bias included), instead of T
#   small GEMMs and T accumulations.

# Run the small per-step work on one thread (see _Threads) where waking OpenMP's threads is expensive: when they
# sleep as soon as they are idle (OMP_WAIT_POLICY=PASSIVE, read by the OpenMP runtime at start-up, as here).
# A module attribute so that benchmarks can compare.
SMALL_WORK_ON_ONE_THREAD = os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"

_sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input  # (grad, sigmoid output, grad_input=out)
_tanh_backward = torch.ops.aten.tanh_backward.grad_input  # (grad, tanh output, grad_input=out)


class _Threads:
    """Switches torch's CPU intra-op thread count between one thread, for the small per-step work, and the
    caller's setting, for the large GEMMs.

    On a 2-core machine under ``OMP_WAIT_POLICY=PASSIVE`` a multiply of two 64 x 1000 tensors took 72 us on two
    threads and 7.5 us on one, and ten of them between two GEMMs cost 3.2 ms on two threads against 0.08 ms on one
    (with the default policy the switch makes a training call 1.12x slower instead: see the module docstring);
    ``torch.set_num_threads`` itself costs about 0.1 us. Used as a context manager, it restores the caller's
    thread count on exit (also on error). Does nothing on GPU or with one thread.
    """

    def __init__(self, device: torch.device):
        self.count = torch.get_num_threads()
        self.enabled = SMALL_WORK_ON_ONE_THREAD and device.type == "cpu" and self.count > 1

    def small(self) -> None:
        if self.enabled:
            torch.set_num_threads(1)

    def large(self) -> None:
        if self.enabled:
            torch.set_num_threads(self.count)

    def __enter__(self):
        self.small()
        return self

    def __exit__(self, *exc):
        self.large()
        return False


class _Workspace:
    """Internal buffers of the fast path kept from one call to the next (one workspace per layer).

    A training step's buffers are a few hundred MB at the paper's sizes; allocated afresh at every call, the
    first write to every page is a page fault (about 140,000 per call of one layer at m = n = 1000, batch 64,
    BPTT 70), which cost about 7 % of the step on the 2-core machine (paired measurement). A run gives its
    buffers back when it is destroyed (after its backward, when autograd frees the graph; or after an inference
    forward), so a buffer is never reused while a graph that saved it is alive (``retain_graph`` included). Only
    the buffers of the latest run that ended are kept; ``clear()`` drops them. Never pickled or copied.
    """

    def __init__(self):
        self.free = {}

    def take(self, like: torch.Tensor, *shape: int) -> torch.Tensor:
        key = (shape, like.dtype, like.device)
        buffers = self.free.get(key)
        return buffers.pop() if buffers else like.new_empty(shape)

    def give(self, tensors: Sequence[torch.Tensor]) -> None:
        """Keep ``tensors`` (and nothing else) for the next run."""
        free = {}
        for t in tensors:
            free.setdefault((tuple(t.shape), t.dtype, t.device), []).append(t)
        self.free = free

    def clear(self) -> None:
        self.free = {}

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.free = {}

    def __deepcopy__(self, memo):
        return _Workspace()


def _split_rounds(round_params: Sequence[torch.Tensor], rank: int) -> List[Tuple[torch.Tensor, ...]]:
    per_round = 2 if rank == 0 else 3
    return [tuple(round_params[i:i + per_round]) for i in range(0, len(round_params), per_round)]


class _LayerRecurrence:
    """The recurrence of one layer over ``x [T, B, m]`` (time major, dropout already applied): buffers, forward
    loop and backward loop. With ``save`` the buffers keep every step for the backward, else they have one row
    that every step reuses (inference).

    Round ``i`` (0-based; odd rounds of the paper, 1, 3, ..., have even ``i``) reads its gated value and its
    conditioning value from the chains ``x^{-1} = x_t, x^1, x^3, ...`` and ``h^0, h^2, ...``; ``self.plan[i]`` holds
    ``(gated sequence, conditioning sequence, output sequence)``, each ``[steps, B, *]`` or None for ``x_t`` /
    ``h_{t-1}`` themselves. The last x and h of the chains are the two halves of ``z = [x_up; h_up; 1]``.
    """

    def __init__(self, x, h0, c0, state_mask, weight_ih, weight_hh, bias, cap: bool, rank: int, round_params,
                 save: bool, workspace: Optional[_Workspace] = None):
        T, B, m = x.shape
        n = h0.shape[1]
        self.x, self.h0, self.c0, self.state_mask = x, h0, c0, state_mask
        self.weight_ih, self.weight_hh = weight_ih, weight_hh
        self.cap, self.rank, self.save = cap, rank, save
        self.T, self.B, self.m, self.n = T, B, m, n
        self.rounds = rounds = _split_rounds(round_params, rank)
        r = self.r = len(rounds)
        steps = T if save else 1
        self.workspace = workspace
        self.owned: List[torch.Tensor] = []  # buffers from the workspace, given back when this run ends
        new = self.new
        self.y = x.new_empty(T, B, n)  # the output: never a workspace buffer
        self.cells = new(steps, B, n)
        self.tanh_c = new(steps, B, n)
        self.capped = new(steps, B, n) if cap else None  # min(i, 1 - f)
        self.tanhs = [new(steps, B, p[-1].shape[0]) for p in rounds]  # tanh(a_i / 2) of every round
        # low rank: u = right @ cond is stored as [u; 1], and a / 2 = (left | bias) / 2 @ [u; 1] is one GEMM
        self.lowrank = [new(steps, B, rank + 1) for _ in rounds] if rank > 0 else []
        for u in self.lowrank:
            u[:, :, rank].fill_(1.0)
        self.left_bias = [torch.cat([p[0], p[2].unsqueeze(1)], 1).mul_(0.5).t() for p in rounds] if rank else []
        self.masked_h = None  # h^0 = h_{t-1} * state mask, when there is a mask
        self.plan = []
        self.z = self.z_h = self.weight = self.hoisted = None
        if r == 0:
            # Nothing modulates x: its projection (and the bias) for all steps is one GEMM.
            self.hoisted = new(T, B, 4 * n)
            torch.addmm(bias, x.reshape(T * B, m), weight_ih.t(), out=self.hoisted.view(T * B, 4 * n))
            self.gates = self.hoisted if save else new(1, B, 4 * n)
            if state_mask is not None:
                self.masked_h = new(steps, B, n)
            self.weight_t = weight_hh.t()
            return
        self.gates = new(steps, B, 4 * n)
        self.z = new(steps, B, m + n + 1)
        self.z[:, :, m + n].fill_(1.0)
        self.weight = torch.cat([weight_ih, weight_hh, bias.unsqueeze(1)], 1, out=new(4 * n, m + n + 1))
        self.weight_t = self.weight.t()
        z_x, self.z_h = self.z[:, :, :m], self.z[:, :, m: m + n]
        if state_mask is not None:
            self.masked_h = self.z_h if r == 1 else new(steps, B, n)
        last_x = max(i for i in range(r) if i % 2 == 0)
        last_h = max((i for i in range(r) if i % 2 == 1), default=-1)
        xs, hs = [None], [self.masked_h]
        for i in range(r):
            if i % 2 == 0:  # gate x with the latest h
                out = z_x if i == last_x else new(steps, B, m)
                self.plan.append((xs[-1], hs[-1], out))
                xs.append(out)
            else:  # gate h with the latest x
                out = self.z_h if i == last_h else new(steps, B, n)
                self.plan.append((hs[-1], xs[-1], out))
                hs.append(out)

    def new(self, *shape: int) -> torch.Tensor:
        """An uninitialised buffer (from the workspace when there is one)."""
        buffer = self.workspace.take(self.x, *shape) if self.workspace is not None else self.x.new_empty(shape)
        self.owned.append(buffer)
        return buffer

    def __del__(self):  # no reference cycle holds a run: it ends when autograd frees the graph
        workspace = getattr(self, "workspace", None)
        if workspace is not None:
            workspace.give(self.owned)

    # -- forward ---------------------------------------------------------------------------------------------

    def forward(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Runs all steps; returns ``(y [T, B, n], c_T [B, n])``."""
        h, c = self.h0, self.c0
        with _Threads(self.x.device) as threads:
            for t in range(self.T):
                h, c = self._forward_step(t, t if self.save else 0, h, c, threads)
        return self.y, c.clone()  # c is a workspace buffer

    def _forward_step(self, t: int, s: int, h, c, threads: _Threads):
        n, r, rank = self.n, self.r, self.rank
        hv = h if self.state_mask is None else torch.mul(h, self.state_mask, out=self.masked_h[s])
        if r == 0:
            g = self.gates[s]
            threads.large()
            if self.save:
                g.addmm_(hv, self.weight_t)
            else:
                torch.addmm(self.hoisted[t], hv, self.weight_t, out=g)
            threads.small()
        else:
            if r == 1 and self.state_mask is None:
                self.z_h[s].copy_(h)  # h_up = h^0
            xv = self.x[t]
            for i, params in enumerate(self.rounds):
                gated, cond = (xv, hv) if i % 2 == 0 else (hv, xv)
                # a / 2 = (Q cond + bias) / 2;  2 sigmoid(a) * gated = gated + gated * tanh(a / 2)
                if rank == 0:  # a full-rank map is a large GEMM
                    threads.large()
                    half = torch.addmm(params[1], cond, params[0].t(), beta=0.5, alpha=0.5)
                    threads.small()
                else:
                    u = self.lowrank[i][s]
                    torch.mm(cond, params[1].t(), out=u[:, :rank])
                    half = torch.mm(u, self.left_bias[i])
                th = torch.tanh(half, out=self.tanhs[i][s])
                new = torch.addcmul(gated, gated, th, out=self.plan[i][2][s])
                if i % 2 == 0:
                    xv = new
                else:
                    hv = new
            threads.large()
            g = torch.mm(self.z[s], self.weight_t, out=self.gates[s])
            threads.small()
        g[:, : 2 * n].sigmoid_()
        g[:, 2 * n: 3 * n].tanh_()
        g[:, 3 * n:].sigmoid_()
        ig, fg, jg, og = g[:, :n], g[:, n: 2 * n], g[:, 2 * n: 3 * n], g[:, 3 * n:]
        if self.cap:
            ig = torch.minimum(ig, 1.0 - fg, out=self.capped[s])
        c = torch.mul(fg, c, out=self.cells[s]).addcmul_(ig, jg)
        h = torch.mul(og, torch.tanh(c, out=self.tanh_c[s]), out=self.y[t])
        return h, c

    # -- backward --------------------------------------------------------------------------------------------

    def _value(self, seq, is_x: bool, t: int) -> torch.Tensor:
        """A chain value at step ``t`` (``seq`` None: the input ``x_t`` or the state ``h_{t-1}``)."""
        if seq is not None:
            return seq[t]
        if is_x:
            return self.x[t]
        return self.y[t - 1] if t > 0 else self.h0

    def _rows(self, seq, is_x: bool) -> torch.Tensor:
        """A chain value at every step as a ``[T * B, *]`` matrix."""
        if seq is not None:
            return seq.reshape(self.T * self.B, -1)
        if is_x:
            return self.x.reshape(self.T * self.B, self.m)
        rows = self.new(self.T, self.B, self.n)
        return torch.cat([self.h0.unsqueeze(0), self.y[:-1]], out=rows).view(self.T * self.B, self.n)

    def backward(self, dy, dc_last, need: Sequence[bool]):
        """Gradients ``(dx, dh0, dc0, d_weight_ih, d_weight_hh, d_bias, *d_round_params)`` from ``dy [T, B, n]``
        and ``dc_last [B, n]``; ``need`` is ``ctx.needs_input_grad`` of :class:`_MogrifierLayerFunction`."""
        T, B, m, n, r, rank = self.T, self.B, self.m, self.n, self.r, self.rank
        self.dgates = self.new(*self.gates.shape)  # gradients of the gate pre-activations
        self.d_weight = self.weight_hh if r == 0 else self.weight[:, : m + n]  # dz = dgates @ d_weight
        self.dx = torch.empty_like(self.x) if r > 0 else None
        self.dhalf = [self.new(*th.shape) for th in self.tanhs]  # gradient of every round's a / 2
        self.dlow = [self.new(T, B, rank) for _ in self.lowrank]  # gradient of u, times 2
        dh_next = torch.zeros_like(self.h0)
        dc = dc_last.clone() if dc_last is not None else torch.zeros_like(self.c0)
        with _Threads(self.x.device) as threads:
            for t in range(T - 1, -1, -1):
                dh_next, dc = self._backward_step(t, dy[t], dh_next, dc, threads)

        flat_dg = self.dgates.view(T * B, 4 * n)
        if r == 0:
            dx = torch.mm(flat_dg, self.weight_ih).view(T, B, m) if need[0] else None
            d_weight_ih = torch.mm(flat_dg.t(), self.x.reshape(T * B, m)) if need[4] else None
            d_weight_hh = torch.mm(flat_dg.t(), self._rows(self.masked_h, False)) if need[5] else None
            d_bias = flat_dg.sum(0) if need[6] else None
        else:  # [dW_ih, dW_hh, d_bias] in one GEMM against [x_up; h_up; 1]
            dx = self.dx
            d_weight = torch.mm(flat_dg.t(), self.z.view(T * B, m + n + 1))
            d_weight_ih, d_weight_hh, d_bias = d_weight[:, :m], d_weight[:, m: m + n], d_weight[:, m + n]
        d_rounds = []
        for i, params in enumerate(self.rounds):  # d/da = d/d(a/2) / 2
            flat_dh2 = self.dhalf[i].view(T * B, -1)
            cond = self._rows(self.plan[i][1], i % 2 == 1)
            if rank == 0:
                d_rounds.append(torch.mm(flat_dh2.t(), cond).mul_(0.5))
                d_rounds.append(flat_dh2.sum(0).mul_(0.5))
            else:  # [d_left, d_bias] in one GEMM against [u; 1]
                d_left_bias = torch.mm(flat_dh2.t(), self.lowrank[i].view(T * B, rank + 1)).mul_(0.5)
                d_rounds += [d_left_bias[:, :rank], torch.mm(self.dlow[i].view(T * B, rank).t(), cond).mul_(0.5),
                             d_left_bias[:, rank]]
        return (dx, dh_next, dc, d_weight_ih, d_weight_hh, d_bias, *d_rounds)

    def _backward_step(self, t: int, dy_t, dh_next, dc, threads: _Threads):
        """Step ``t`` of the backward: fills ``dgates[t]`` (and the rounds' gradients), returns the gradients of
        ``h_{t-1}`` and ``c_{t-1}``."""
        n, m, r, rank = self.n, self.m, self.r, self.rank
        g = self.gates[t]
        ig, fg, jg, og = g[:, :n], g[:, n: 2 * n], g[:, 2 * n: 3 * n], g[:, 3 * n:]
        c_prev = self.cells[t - 1] if t > 0 else self.c0
        tc = self.tanh_c[t]
        dg = self.dgates[t]
        dh = torch.add(dy_t, dh_next)
        _sigmoid_backward(dh * tc, og, grad_input=dg[:, 3 * n:])
        dc.add_(torch.ops.aten.tanh_backward(dh * og, tc))
        d_input = dc * jg  # gradient of the (capped) input gate
        if self.cap:
            ic = self.capped[t]
            d_i = d_input * torch.eq(ic, ig)  # to i where it was below 1 - f, else to 1 - f
            d_f = torch.mul(dc, c_prev).sub_(d_input).add_(d_i)
            _tanh_backward(dc * ic, jg, grad_input=dg[:, 2 * n: 3 * n])
        else:
            d_i = d_input
            d_f = dc * c_prev
            _tanh_backward(dc * ig, jg, grad_input=dg[:, 2 * n: 3 * n])
        _sigmoid_backward(d_i, ig, grad_input=dg[:, :n])
        _sigmoid_backward(d_f, fg, grad_input=dg[:, n: 2 * n])
        dc = dc * fg
        threads.large()
        dz = torch.mm(dg, self.d_weight)
        threads.small()
        if r == 0:
            dhv = dz
        else:
            dxv, dhv = dz[:, :m], dz[:, m:]
            for i in range(r - 1, -1, -1):
                is_x = i % 2 == 0
                gated_seq, _, _ = self.plan[i]
                params = self.rounds[i]
                th = self.tanhs[i][t]
                d_new = dxv if is_x else dhv
                dh2 = _tanh_backward(d_new * self._value(gated_seq, is_x, t), th, grad_input=self.dhalf[i][t])
                if rank == 0:
                    left, right = dh2, params[0]
                else:
                    left, right = torch.mm(dh2, params[0], out=self.dlow[i][t]), params[1]
                d_old = torch.addcmul(d_new, d_new, th, out=self.dx[t] if i == 0 else None)
                if rank == 0:
                    threads.large()
                if is_x:  # its conditioning value is the latest h
                    dxv = d_old
                    dhv.addmm_(left, right, alpha=0.5)
                else:
                    dhv = d_old
                    dxv.addmm_(left, right, alpha=0.5)
                if rank == 0:
                    threads.small()
        return (dhv if self.state_mask is None else dhv * self.state_mask), dc


class _MogrifierLayerFunction(torch.autograd.Function):
    """One Mogrifier LSTM layer over a whole sequence, with a backward through time written by hand.

    Inputs: ``x [T, B, m]``, ``h0, c0 [B, n]``, ``state_mask [B, n]`` or None, ``weight_ih [4n, m]``,
    ``weight_hh [4n, n]``, ``bias [4n]``, ``cap``, ``rank``, a :class:`_Workspace` or None, then every round's
    ``MogrifierRound.flat_parameters()``.
    Outputs: ``y [T, B, n]`` (the ``h_t`` of every step) and ``c_T [B, n]``.
    """

    @staticmethod
    def forward(ctx, x, h0, c0, state_mask, weight_ih, weight_hh, bias, cap, rank, workspace, *round_params):
        run = _LayerRecurrence(x, h0, c0, state_mask, weight_ih, weight_hh, bias, cap, rank, round_params,
                               save=True, workspace=workspace)
        y, c_last = run.forward()
        run.y = None  # the output refers to this node: holding it would make a reference cycle
        ctx.run = run
        # saved for autograd's checks that nothing was modified in place before the backward
        ctx.save_for_backward(x, h0, c0, weight_ih, weight_hh, bias, y, *round_params)
        return y, c_last

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dc_last):
        saved = ctx.saved_tensors  # raises if an input or the output was modified in place since the forward
        run = ctx.run
        run.y = saved[6]
        try:
            dx, dh0, dc0, *grads = run.backward(dy, dc_last, ctx.needs_input_grad)
        finally:
            run.y = None
        return (dx, dh0, dc0, None, grads[0], grads[1], grads[2], None, None, None, *grads[3:])


# ---------------------------------------------------------------------------------------------------------------


class MogrifierLSTMLayer(nn.Module):
    """One Mogrifier LSTM layer: ``input_size`` m -> ``hidden_size`` n with ``rounds`` mogrifier rounds.

    Parameters: ``weight_ih [4n, m]``, ``weight_hh [4n, n]``, ``bias [4n]`` (gate order i, f, j, o, as
    ``nn.LSTM``; one bias vector, as the official code), and ``mogrifier[i]`` (:class:`MogrifierRound`) for
    round ``i + 1``: ``n -> m`` for odd rounds (they gate x), ``m -> n`` for even rounds (they gate h).
    """

    def __init__(self, input_size: int, hidden_size: int, rounds: int = 5, rank: int = 0,
                 cap_input_gate: bool = True, forget_bias: float = 1.0):
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
        self.workspace = _Workspace()  # the fast path's buffers, reused from call to call
        self.mogrifier = nn.ModuleList(
            MogrifierRound(n, input_size, rank) if i % 2 == 0 else MogrifierRound(input_size, n, rank)
            for i in range(rounds)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _variance_scaling_(self.weight_ih, self.input_size)
        _variance_scaling_(self.weight_hh, self.hidden_size)
        with torch.no_grad():
            self.bias.zero_()
            self.bias[self.hidden_size: 2 * self.hidden_size] = self.forget_bias
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

    def reference_step(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
                       state_mask: Optional[torch.Tensor] = None) -> LSTMState:
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

    def forward(self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor,
                state_mask: Optional[torch.Tensor] = None, reference: bool = False):
        """``x [T, B, m]`` (time major, dropout applied), ``h0, c0 [B, n]``, ``state_mask [B, n]`` or None
        -> ``(y [T, B, n], (h_T, c_T))``."""
        if reference:
            h, c = h0, c0
            outputs = []
            for t in range(x.shape[0]):
                h, c = self.reference_step(x[t], h, c, state_mask)
                outputs.append(h)
            return torch.stack(outputs), (h, c)
        if self.uses_fused_lstm and state_mask is None:
            zero = torch.zeros_like(self.bias)
            y, h, c = torch.lstm(x, (h0.unsqueeze(0), c0.unsqueeze(0)),
                                 [self.weight_ih, self.weight_hh, self.bias, zero],
                                 True, 1, 0.0, self.training, False, False)
            return y, (h.squeeze(0), c.squeeze(0))
        params = self.round_parameters()
        tensors = [x, h0, c0, self.weight_ih, self.weight_hh, self.bias] + params
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            y, c = _MogrifierLayerFunction.apply(x, h0, c0, state_mask, self.weight_ih, self.weight_hh, self.bias,
                                                 self.cap_input_gate, self.rank, self.workspace, *params)
        else:
            y, c = _LayerRecurrence(x, h0, c0, state_mask, self.weight_ih, self.weight_hh, self.bias,
                                    self.cap_input_gate, self.rank, params, save=False,
                                    workspace=self.workspace).forward()
        return y, (y[-1], c)

    def lstm_weights(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(weight_ih, weight_hh, bias_ih, bias_hh)`` in ``nn.LSTM`` layout (``bias_hh`` is zero: this layer has
        one bias vector)."""
        return self.weight_ih, self.weight_hh, self.bias, torch.zeros_like(self.bias)

    def extra_repr(self) -> str:
        return (f"input_size={self.input_size}, hidden_size={self.hidden_size}, rounds={self.rounds}, "
                f"rank={self.rank}, cap_input_gate={self.cap_input_gate}")


def _check_dropout(name: str, flag: str, p: float) -> float:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"MogrifierLSTM: {name} must be in [0, 1) (set by {flag}), got {p}")
    return float(p)


class MogrifierLSTM(nn.Module):
    """A stack of ``num_layers`` :class:`MogrifierLSTMLayer` (layer 1: ``input_size -> hidden_size``, the others
    ``hidden_size -> hidden_size``), with variational dropout and optional summed layer outputs.

    Args:
        input_size: features of the input (m of layer 1).
        hidden_size: state size n of every layer.
        num_layers: number of layers.
        rounds: mogrifier rounds r per step (0 = an LSTM).
        rank: 0 = full-rank Q/R; ``0 < rank < min(input_size, hidden_size)`` = low-rank factors.
        cap_input_gate: ``c = f c + min(1 - f, i) j`` (the official code's default) instead of ``f c + i j``.
        forget_bias: initial value of the forget-gate bias.
        input_dropout, inter_layer_dropout, state_dropout, output_dropout: variational dropout probabilities
            (one mask per sequence; see the module docstring).
        sum_layer_outputs: return the sum of all layers' outputs instead of the top layer's.

    Shapes (batch first): ``x [B, T, input_size]``, ``state`` None (zeros) or a list of ``(h [B, H], c [B, H])``
    per layer -> ``(output [B, T, H], new_state)`` with ``new_state`` in the same per-layer form.

    A layer with ``rounds == 0`` and ``cap_input_gate=False`` runs ``nn.LSTM``'s fused kernel when it has no state
    dropout mask; :meth:`load_lstm_weights` / :meth:`to_lstm` copy weights from / to an ``nn.LSTM``.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, rounds: int = 5, rank: int = 0,
                 cap_input_gate: bool = True, forget_bias: float = 1.0, input_dropout: float = 0.0,
                 inter_layer_dropout: float = 0.0, state_dropout: float = 0.0, output_dropout: float = 0.0,
                 sum_layer_outputs: bool = False):
        super().__init__()
        for name, flag, value in (("input_size", "--mogrifier-embed-dim (or the DeFINE output size)", input_size),
                                  ("hidden_size", "--mogrifier-hidden-size", hidden_size),
                                  ("num_layers", "--mogrifier-layers", num_layers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MogrifierLSTM: {name} must be an integer >= 1 (set by {flag}), got {value!r}")
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
            raise ValueError(f"MogrifierLSTM: rounds must be an integer >= 0 (set by --mogrifier-rounds; 0 = plain "
                             f"LSTM), got {rounds!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"MogrifierLSTM: rank must be an integer >= 0 (set by --mogrifier-rank; 0 = full "
                             f"rank), got {rank!r}")
        smallest = min(input_size, hidden_size)
        if rounds > 0 and rank >= smallest:
            raise ValueError(f"MogrifierLSTM: rank must be 0 (full rank) or below min(input_size, hidden_size) = "
                             f"{smallest} (set by --mogrifier-rank), got {rank}")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.rounds = rounds
        self.rank = rank
        self.cap_input_gate = bool(cap_input_gate)
        self.forget_bias = float(forget_bias)
        self.input_dropout = _check_dropout("input_dropout", "--mogrifier-input-dropout", input_dropout)
        self.inter_layer_dropout = _check_dropout("inter_layer_dropout", "--mogrifier-inter-layer-dropout",
                                                  inter_layer_dropout)
        self.state_dropout = _check_dropout("state_dropout", "--mogrifier-state-dropout", state_dropout)
        self.output_dropout = _check_dropout("output_dropout", "--mogrifier-output-dropout", output_dropout)
        self.sum_layer_outputs = bool(sum_layer_outputs)
        self.layers = nn.ModuleList(
            MogrifierLSTMLayer(input_size if i == 0 else hidden_size, hidden_size, rounds, rank,
                               self.cap_input_gate, self.forget_bias)
            for i in range(num_layers)
        )

    @property
    def output_size(self) -> int:
        return self.hidden_size

    def zero_state(self, batch_size: int, like: torch.Tensor) -> List[LSTMState]:
        """Zero ``(h, c)`` for every layer, with the dtype and device of ``like``."""
        return [(like.new_zeros(batch_size, self.hidden_size), like.new_zeros(batch_size, self.hidden_size))
                for _ in range(self.num_layers)]

    def sample_dropout_masks(self, batch_size: int, like: torch.Tensor) -> MogrifierDropoutMasks:
        """Draw the variational masks of one forward call (what ``forward`` does in training mode)."""

        def mask(p: float, size: int) -> Optional[torch.Tensor]:
            if p == 0.0:
                return None
            return like.new_empty(batch_size, size).bernoulli_(1.0 - p).div_(1.0 - p)

        inputs = [mask(self.input_dropout if i == 0 else self.inter_layer_dropout, layer.input_size)
                  for i, layer in enumerate(self.layers)]
        states = [mask(self.state_dropout, self.hidden_size) for _ in self.layers]
        return MogrifierDropoutMasks(inputs, states, mask(self.output_dropout, self.hidden_size))

    def no_dropout_masks(self) -> MogrifierDropoutMasks:
        return MogrifierDropoutMasks([None] * self.num_layers, [None] * self.num_layers, None)

    def _check(self, x: torch.Tensor, state: Optional[List[LSTMState]]) -> None:
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(f"MogrifierLSTM expects input [B, T, {self.input_size}], got {list(x.shape)}")
        if state is not None and len(state) != self.num_layers:
            raise ValueError(f"MogrifierLSTM has {self.num_layers} layers but got a state for {len(state)}")

    def forward(self, x: torch.Tensor, state: Optional[List[LSTMState]] = None,
                masks: Optional[MogrifierDropoutMasks] = None):
        """``x [B, T, input_size]`` -> ``(output [B, T, H], new_state)``. ``masks`` (optional) overrides the
        dropout masks, in any mode; by default they are drawn in training mode and absent in eval mode."""
        return self._run(x, state, masks, reference=False)

    def reference_forward(self, x: torch.Tensor, state: Optional[List[LSTMState]] = None,
                          masks: Optional[MogrifierDropoutMasks] = None):
        """Same as :meth:`forward`, computed step by step and round by round with plain autograd operations."""
        return self._run(x, state, masks, reference=True)

    def _run(self, x, state, masks, reference: bool):
        self._check(x, state)
        batch = x.shape[0]
        if masks is None:
            masks = self.sample_dropout_masks(batch, x) if self.training else self.no_dropout_masks()
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
                inp = inp * masks.inputs[i].unsqueeze(0)
            h0, c0 = state[i]
            y, layer_state = layer(inp, h0, c0, masks.states[i], reference=reference)
            new_state.append(layer_state)
            if self.sum_layer_outputs:
                total = y if total is None else total + y
            inp = y
        out = total if self.sum_layer_outputs else inp
        if masks.output is not None:
            out = out * masks.output.unsqueeze(0)
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
        if (lstm.input_size, lstm.hidden_size, lstm.num_layers) != (self.input_size, self.hidden_size,
                                                                     self.num_layers) \
                or lstm.bidirectional or getattr(lstm, "proj_size", 0):
            raise ValueError(f"load_lstm_weights needs a unidirectional nn.LSTM({self.input_size}, "
                             f"{self.hidden_size}, num_layers={self.num_layers}) without projection, got {lstm}")
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
        return (f"input_size={self.input_size}, hidden_size={self.hidden_size}, num_layers={self.num_layers}, "
                f"rounds={self.rounds}, rank={self.rank}, cap_input_gate={self.cap_input_gate}, "
                f"input_dropout={self.input_dropout}, inter_layer_dropout={self.inter_layer_dropout}, "
                f"state_dropout={self.state_dropout}, output_dropout={self.output_dropout}, "
                f"sum_layer_outputs={self.sum_layer_outputs}")
