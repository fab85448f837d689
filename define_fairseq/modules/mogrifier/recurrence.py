"""The fast path of one :class:`~define_fairseq.modules.mogrifier.layer.MogrifierLSTMLayer`: its recurrence over a
whole sequence as one ``torch.autograd.Function`` with a backward through time written by hand, because autograd
through any per-step loop records ``T`` small weight GEMMs and ``T`` accumulations of a ``4n x (m + n)`` matrix
(and a fused ``nn.LSTM`` cannot run it: ``x_t`` is modulated by ``h_{t-1}``, so ``W_x x`` cannot be hoisted).

* Forward: a loop over time without recording a graph; per step one GEMM per round (two for low rank), one GEMM
  over ``[x_up; h_up; 1]`` for the four gates (bias included) and a few element-wise kernels (a round computes
  ``2 sigmoid(a) * v`` as ``v + v * tanh(a / 2)``, the same function), every value the backward needs written
  into preallocated ``[T, B, *]`` buffers. With no rounds the input projection is one GEMM over the sequence.
* Backward: a reverse loop propagating only the activation gradients (ATen's fused ``sigmoid_backward`` /
  ``tanh_backward``); then every weight gradient is ONE GEMM over all ``T * B`` rows.
* The buffers are kept from call to call (:class:`Workspace`); on CPU under ``OMP_WAIT_POLICY=PASSIVE`` the small
  per-step work runs on one thread (:class:`Threads`); both are in ``threads.py``.

The state dropout mask is ``[B, n]`` (one per window) or ``[T, B, n]`` (one per step). The measurements behind
these choices are in ``benchmarks/results/mogrifier_speed.md``.
"""

from typing import List, Optional, Sequence, Tuple

import torch
from torch.autograd.function import once_differentiable

from define_fairseq.modules.mogrifier.threads import Threads, Workspace

# what the Triton kernels (fused.py) take: the layer picks them by it without importing Triton
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input  # (grad, sigmoid output, grad_input=out)
_tanh_backward = torch.ops.aten.tanh_backward.grad_input  # (grad, tanh output, grad_input=out)


def _split_rounds(round_params: Sequence[torch.Tensor], rank: int) -> List[Tuple[torch.Tensor, ...]]:
    per_round = 2 if rank == 0 else 3
    return [tuple(round_params[i : i + per_round]) for i in range(0, len(round_params), per_round)]


class LayerRecurrence:
    """The recurrence of one layer over ``x [T, B, m]`` (time major, input dropout applied): buffers, forward loop
    and backward loop. With ``save`` the buffers keep every step for the backward, else they have one row that
    every step reuses (inference). ``state_mask``: None, ``[B, n]`` or ``[T, B, n]``.

    Round ``i`` (0-based; odd rounds of the paper, 1, 3, ..., have even ``i``) reads its gated value and its
    conditioning value from the chains ``x^{-1} = x_t, x^1, x^3, ...`` and ``h^0, h^2, ...``; ``self.plan[i]`` holds
    ``(gated sequence, conditioning sequence, output sequence)``, each ``[steps, B, *]`` or None for ``x_t`` /
    ``h_{t-1}`` themselves. The last x and h of the chains are the two halves of ``z = [x_up; h_up; 1]``.
    """

    saves_activations = True  # keeps tanh(c_t) and the capped input gate for the backward

    def __init__(
        self,
        x,
        h0,
        c0,
        state_mask,
        weight_ih,
        weight_hh,
        bias,
        cap: bool,
        rank: int,
        round_params,
        save: bool,
        workspace: Optional[Workspace] = None,
    ):
        T, B, m = x.shape
        n = h0.shape[1]
        self.x, self.h0, self.c0, self.state_mask = x, h0, c0, state_mask
        self.mask_per_step = state_mask is not None and state_mask.dim() == 3
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
        self.tanh_c = new(steps, B, n) if self.saves_activations else None
        self.capped = new(steps, B, n) if cap and self.saves_activations else None  # min(i, 1 - f)
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
        z_x, self.z_h = self.z[:, :, :m], self.z[:, :, m : m + n]
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

    def mask(self, t: int) -> torch.Tensor:
        """The state mask of step ``t`` ``[B, n]``."""
        return self.state_mask[t] if self.mask_per_step else self.state_mask

    # -- forward ---------------------------------------------------------------------------------------------

    def forward(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Runs all steps; returns ``(y [T, B, n], c_T [B, n])``."""
        h, c = self.h0, self.c0
        with Threads(self.x.device) as threads:
            for t in range(self.T):
                h, c = self._forward_step(t, t if self.save else 0, h, c, threads)
        return self.y, c.clone()  # c is a workspace buffer

    def _forward_step(self, t: int, s: int, h, c, threads: Threads):
        n, r, rank = self.n, self.r, self.rank
        hv = h if self.state_mask is None else torch.mul(h, self.mask(t), out=self.masked_h[s])
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
        g[:, 2 * n : 3 * n].tanh_()
        g[:, 3 * n :].sigmoid_()
        ig, fg, jg, og = g[:, :n], g[:, n : 2 * n], g[:, 2 * n : 3 * n], g[:, 3 * n :]
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
        and ``dc_last [B, n]``; ``need`` is ``ctx.needs_input_grad`` of :class:`MogrifierLayerFunction`."""
        T, B, m, n, r, rank = self.T, self.B, self.m, self.n, self.r, self.rank
        self.dgates = self.new(*self.gates.shape)  # gradients of the gate pre-activations
        self.d_weight = self.weight_hh if r == 0 else self.weight[:, : m + n]  # dz = dgates @ d_weight
        self.dx = torch.empty_like(self.x) if r > 0 else None
        self.dhalf = [self.new(*th.shape) for th in self.tanhs]  # gradient of every round's a / 2
        self.dlow = [self.new(T, B, rank) for _ in self.lowrank]  # gradient of u, times 2
        dh_next = torch.zeros_like(self.h0)
        dc = dc_last.clone() if dc_last is not None else torch.zeros_like(self.c0)
        with Threads(self.x.device) as threads:
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
            d_weight_ih, d_weight_hh, d_bias = d_weight[:, :m], d_weight[:, m : m + n], d_weight[:, m + n]
        d_rounds = []
        for i, params in enumerate(self.rounds):  # d/da = d/d(a/2) / 2
            flat_dh2 = self.dhalf[i].view(T * B, -1)
            cond = self._rows(self.plan[i][1], i % 2 == 1)
            if rank == 0:
                d_rounds.append(torch.mm(flat_dh2.t(), cond).mul_(0.5))
                d_rounds.append(flat_dh2.sum(0).mul_(0.5))
            else:  # [d_left, d_bias] in one GEMM against [u; 1]
                d_left_bias = torch.mm(flat_dh2.t(), self.lowrank[i].view(T * B, rank + 1)).mul_(0.5)
                d_rounds += [
                    d_left_bias[:, :rank],
                    torch.mm(self.dlow[i].view(T * B, rank).t(), cond).mul_(0.5),
                    d_left_bias[:, rank],
                ]
        return (dx, dh_next, dc, d_weight_ih, d_weight_hh, d_bias, *d_rounds)

    def _backward_step(self, t: int, dy_t, dh_next, dc, threads: Threads):
        """Step ``t`` of the backward: fills ``dgates[t]`` (and the rounds' gradients), returns the gradients of
        ``h_{t-1}`` and ``c_{t-1}``."""
        n, m, r, rank = self.n, self.m, self.r, self.rank
        g = self.gates[t]
        ig, fg, jg, og = g[:, :n], g[:, n : 2 * n], g[:, 2 * n : 3 * n], g[:, 3 * n :]
        c_prev = self.cells[t - 1] if t > 0 else self.c0
        tc = self.tanh_c[t]
        dg = self.dgates[t]
        dh = torch.add(dy_t, dh_next)
        _sigmoid_backward(dh * tc, og, grad_input=dg[:, 3 * n :])
        dc.add_(torch.ops.aten.tanh_backward(dh * og, tc))
        d_input = dc * jg  # gradient of the (capped) input gate
        if self.cap:
            ic = self.capped[t]
            d_i = d_input * torch.eq(ic, ig)  # to i where it was below 1 - f, else to 1 - f
            d_f = torch.mul(dc, c_prev).sub_(d_input).add_(d_i)
            _tanh_backward(dc * ic, jg, grad_input=dg[:, 2 * n : 3 * n])
        else:
            d_i = d_input
            d_f = dc * c_prev
            _tanh_backward(dc * ig, jg, grad_input=dg[:, 2 * n : 3 * n])
        _sigmoid_backward(d_i, ig, grad_input=dg[:, :n])
        _sigmoid_backward(d_f, fg, grad_input=dg[:, n : 2 * n])
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
        return (dhv if self.state_mask is None else dhv * self.mask(t)), dc


class MogrifierLayerFunction(torch.autograd.Function):
    """One Mogrifier LSTM layer over a whole sequence, with a backward through time written by hand.

    Inputs: ``x [T, B, m]``, ``h0, c0 [B, n]``, ``state_mask`` None, ``[B, n]`` or ``[T, B, n]``,
    ``weight_ih [4n, m]``, ``weight_hh [4n, n]``, ``bias [4n]``, ``cap``, ``rank``, a :class:`Workspace` or None,
    the recurrence class (:class:`LayerRecurrence` or the Triton kernels' ``FusedRecurrence``), then every round's
    ``MogrifierRound.flat_parameters()``.
    Outputs: ``y [T, B, n]`` (the ``h_t`` of every step) and ``c_T [B, n]``.
    """

    @staticmethod
    def forward(ctx, x, h0, c0, state_mask, weight_ih, weight_hh, bias, cap, rank, workspace, kind, *round_params):
        run = kind(
            x, h0, c0, state_mask, weight_ih, weight_hh, bias, cap, rank, round_params, save=True, workspace=workspace
        )
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
        return (dx, dh0, dc0, None, grads[0], grads[1], grads[2], None, None, None, None, *grads[3:])
