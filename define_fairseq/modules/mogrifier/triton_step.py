"""An opt-in Triton implementation of one :class:`~define_fairseq.modules.mogrifier.layer.MogrifierLSTMLayer`
time step: the element-wise work in Triton kernels, every matrix product in torch (cuBLAS on a GPU).

* :func:`round_gate`: one mogrifier round's gate ``2 sigmoid(p + bias) * v``, given ``p = Q cond`` (the round's
  GEMM, without its bias), as one kernel forward and one backward.
* :func:`lstm_cell`: the gate nonlinearities and the cell update, given ``g = W [x_up; h_up]`` (without the bias),
  as one kernel forward (``h_t, c_t``) and one backward (``dg, dc_{t-1}``); with or without ``cap_input_gate``.
* :func:`triton_mogrifier_step`: one step composed of these and torch GEMMs, with autograd through it;
  :func:`triton_mogrifier_layer`: a layer's whole sequence as a loop over steps.

The layers never call this: it is a function the caller chooses. The backward kernels recompute the
nonlinearities from the pre-activations they saved rather than saving the activated gates as well.
Kernels compute in float32 (inputs float32, bfloat16 or float16). ``tanh`` is built from ``exp`` (libdevice has no
form in Triton's interpreter); it is within 2e-7 relative of ``torch.tanh``.

Triton decides at import whether its kernels are compiled (CUDA tensors) or interpreted (CPU tensors, slow: for
tests): ``TRITON_INTERPRET=1`` must be set before this module is imported to run it on a CPU.
"""

from typing import Optional, Sequence, Tuple

import torch
from torch.autograd.function import once_differentiable

try:
    import triton
    import triton.language as tl
except ImportError as error:  # the package's other modules never import this one
    raise ImportError(
        "define_fairseq.modules.mogrifier.triton_step needs Triton: pip install -r requirements-dev.txt (on a CPU, set "
        "TRITON_INTERPRET=1 before importing this module to run the kernels in Triton's interpreter)"
    ) from error

BLOCK_SIZE = 1024  # elements per program; the tests lower it so that sizes span several programs


@triton.jit
def _sigmoid(x):
    # tl.sigmoid's formula; its own definition is fixed as compiled or interpreted when triton is first imported
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _tanh(x):
    # Below |x| = 0.6, where 1 - 2 / (exp(2|x|) + 1) would lose digits to cancellation, tanh's odd Taylor series.
    x2 = x * x
    p = 5.90027440945586e-04 * x2 - 1.4558343870513183e-03
    p = p * x2 + 3.592128036572481e-03
    p = p * x2 - 8.863235529902197e-03
    p = p * x2 + 2.1869488536155203e-02
    p = p * x2 - 5.396825396825397e-02
    p = p * x2 + 1.3333333333333333e-01
    p = p * x2 - 3.333333333333333e-01
    p = p * x2 + 1.0
    a = tl.abs(x)
    large = 1.0 - 2.0 / (tl.exp(2.0 * tl.minimum(a, 20.0)) + 1.0)  # 1.0 in float32 from |x| = 9 on
    return tl.where(a < 0.6, x * p, tl.where(x < 0, -large, large))


INTERPRETED = not isinstance(_tanh, triton.runtime.JITFunction)  # how this import defined the kernels


@triton.jit
def _round_forward_kernel(p_ptr, bias_ptr, v_ptr, out_ptr, numel, width, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    col = offs % width
    a = tl.load(p_ptr + offs, mask=mask).to(tl.float32) + tl.load(bias_ptr + col, mask=mask).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, 2.0 * _sigmoid(a) * v, mask=mask)


@triton.jit
def _round_backward_kernel(d_out_ptr, p_ptr, bias_ptr, v_ptr, d_p_ptr, d_v_ptr, numel, width, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    col = offs % width
    a = tl.load(p_ptr + offs, mask=mask).to(tl.float32) + tl.load(bias_ptr + col, mask=mask).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask).to(tl.float32)
    d_out = tl.load(d_out_ptr + offs, mask=mask).to(tl.float32)
    s = _sigmoid(a)
    tl.store(d_v_ptr + offs, 2.0 * s * d_out, mask=mask)
    tl.store(d_p_ptr + offs, 2.0 * s * (1.0 - s) * v * d_out, mask=mask)


@triton.jit
def _load_gates(g_ptr, bias_ptr, offs, mask, n):
    # the activated gates i, f, j, o of the elements offs of [B, n] (gate k at column k n + col of g)
    row = offs // n
    col = offs - row * n
    g = g_ptr + row * 4 * n + col
    b = bias_ptr + col
    i = _sigmoid(tl.load(g, mask=mask).to(tl.float32) + tl.load(b, mask=mask).to(tl.float32))
    f = _sigmoid(tl.load(g + n, mask=mask).to(tl.float32) + tl.load(b + n, mask=mask).to(tl.float32))
    j = _tanh(tl.load(g + 2 * n, mask=mask).to(tl.float32) + tl.load(b + 2 * n, mask=mask).to(tl.float32))
    o = _sigmoid(tl.load(g + 3 * n, mask=mask).to(tl.float32) + tl.load(b + 3 * n, mask=mask).to(tl.float32))
    return i, f, j, o, row * 4 * n + col


@triton.jit
def _cell_forward_kernel(g_ptr, bias_ptr, c_prev_ptr, h_ptr, c_ptr, numel, n, CAP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    i, f, j, o, _ = _load_gates(g_ptr, bias_ptr, offs, mask, n)
    if CAP:
        i = tl.minimum(i, 1.0 - f)
    c = f * tl.load(c_prev_ptr + offs, mask=mask).to(tl.float32) + i * j
    tl.store(c_ptr + offs, c, mask=mask)
    tl.store(h_ptr + offs, o * _tanh(c), mask=mask)


@triton.jit
def _cell_backward_kernel(
    dh_ptr, dc_ptr, g_ptr, bias_ptr, c_prev_ptr, dg_ptr, dc_prev_ptr, numel, n, CAP: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    i, f, j, o, gate = _load_gates(g_ptr, bias_ptr, offs, mask, n)
    c_prev = tl.load(c_prev_ptr + offs, mask=mask).to(tl.float32)
    i_used = i
    if CAP:
        i_used = tl.minimum(i, 1.0 - f)
    tanh_c = _tanh(f * c_prev + i_used * j)
    dh = tl.load(dh_ptr + offs, mask=mask).to(tl.float32)
    dc = tl.load(dc_ptr + offs, mask=mask).to(tl.float32)
    _store_gate_gradients(dg_ptr, dc_prev_ptr, offs, mask, gate, n, i, f, j, o, i_used, c_prev, tanh_c, dh, dc, CAP)


@triton.jit
def _store_gate_gradients(dg_ptr, dc_prev_ptr, offs, mask, gate, n, i, f, j, o, i_used, c_prev, tanh_c, dh, dc,
                          CAP: tl.constexpr):  # fmt: skip
    """The LSTM cell's backward from ``dh`` and the carried ``dc``: the gradients of the four gate pre-activations
    (at ``gate`` in ``dg_ptr``) and ``dc_{t-1}`` (at ``offs`` in ``dc_prev_ptr``)."""
    dc += dh * o * (1.0 - tanh_c * tanh_c)
    d_i = dc * j
    d_f = dc * c_prev
    if CAP:  # min(i, 1 - f): the gradient goes to i where i < 1 - f, else to 1 - f
        below = i < 1.0 - f
        d_f = tl.where(below, d_f, d_f - d_i)
        d_i = tl.where(below, d_i, 0.0)
    tl.store(dg_ptr + gate, d_i * i * (1.0 - i), mask=mask)
    tl.store(dg_ptr + gate + n, d_f * f * (1.0 - f), mask=mask)
    tl.store(dg_ptr + gate + 2 * n, dc * i_used * (1.0 - j * j), mask=mask)
    tl.store(dg_ptr + gate + 3 * n, dh * tanh_c * o * (1.0 - o), mask=mask)
    tl.store(dc_prev_ptr + offs, dc * f, mask=mask)


def _new(like: torch.Tensor, *shape: int) -> torch.Tensor:
    """An uninitialised kernel output (the tests replace it by one filled with NaN)."""
    return like.new_empty(shape)


def _launch(kernel, numel: int, *args, **constants) -> None:
    if numel > 0:
        kernel[(triton.cdiv(numel, BLOCK_SIZE),)](*args, numel, **constants, BLOCK=BLOCK_SIZE)


def _check(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(
                f"mogrifier.triton_step: the kernels compute in float32 and take float32, bfloat16 or float16 tensors; "
                f"got {t.dtype} (run float64 through MogrifierLSTMLayer.forward)"
            )
        if t.device.type != "cuda" and not INTERPRETED:
            raise ValueError(
                f"mogrifier.triton_step: the compiled kernels take CUDA tensors; got one on {t.device}. On a CPU, set "
                f"TRITON_INTERPRET=1 before importing define_fairseq.modules.mogrifier.triton_step (the interpreter)"
            )


class RoundGate(torch.autograd.Function):
    """``2 sigmoid(p + bias) * v`` in one kernel each way. Shapes: ``p, v [B, w]``, ``bias [w]`` -> ``[B, w]``."""

    @staticmethod
    def forward(ctx, p, bias, v):
        _check(p, bias, v)
        p, v = p.contiguous(), v.contiguous()
        out = _new(v, *v.shape)
        _launch(_round_forward_kernel, v.numel(), p, bias, v, out, width=v.shape[1])
        ctx.save_for_backward(p, bias, v)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        p, bias, v = ctx.saved_tensors
        d_p, d_v = _new(p, *p.shape), _new(v, *v.shape)
        _launch(_round_backward_kernel, v.numel(), d_out.contiguous(), p, bias, v, d_p, d_v, width=v.shape[1])
        return d_p, d_p.sum(0) if ctx.needs_input_grad[1] else None, d_v


class LSTMCell(torch.autograd.Function):
    """The LSTM gates and cell update in one kernel each way. Shapes: ``g [B, 4n]`` (gate order i, f, j, o; no
    bias), ``bias [4n]``, ``c_prev [B, n]`` -> ``(h [B, n], c [B, n])``."""

    @staticmethod
    def forward(ctx, g, bias, c_prev, cap: bool):
        _check(g, bias, c_prev)
        g, c_prev = g.contiguous(), c_prev.contiguous()
        h, c = _new(c_prev, *c_prev.shape), _new(c_prev, *c_prev.shape)
        _launch(_cell_forward_kernel, c.numel(), g, bias, c_prev, h, c, n=c.shape[1], CAP=cap)
        ctx.save_for_backward(g, bias, c_prev)
        ctx.cap = cap
        return h, c

    @staticmethod
    @once_differentiable
    def backward(ctx, dh, dc):
        g, bias, c_prev = ctx.saved_tensors
        dh = torch.zeros_like(c_prev) if dh is None else dh.contiguous()
        dc = torch.zeros_like(c_prev) if dc is None else dc.contiguous()
        dg, dc_prev = _new(g, *g.shape), _new(c_prev, *c_prev.shape)
        n = c_prev.shape[1]
        _launch(_cell_backward_kernel, c_prev.numel(), dh, dc, g, bias, c_prev, dg, dc_prev, n=n, CAP=ctx.cap)
        return dg, dg.sum(0) if ctx.needs_input_grad[1] else None, dc_prev, None


def round_gate(p: torch.Tensor, bias: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One round's gate ``2 sigmoid(p + bias) * v`` (autograd through it). Shapes: ``p, v [B, w]``, ``bias [w]``."""
    return RoundGate.apply(p, bias, v)


def lstm_cell(g: torch.Tensor, bias: torch.Tensor, c_prev: torch.Tensor, cap: bool) -> Tuple[torch.Tensor, ...]:
    """``(h_t, c_t)`` from ``g = W [x_up; h_up]`` and ``c_{t-1}``, as ``reference_step`` after its GEMM (autograd
    through it). Shapes: ``g [B, 4n]``, ``bias [4n]``, ``c_prev [B, n]`` -> ``([B, n], [B, n])``."""
    return LSTMCell.apply(g, bias, c_prev, cap)


def triton_mogrifier_step(
    x: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    rounds: Sequence[Sequence[torch.Tensor]],
    cap_input_gate: bool = True,
    state_mask: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One step of a Mogrifier LSTM layer, the function of ``MogrifierLSTMLayer.reference_step``: GEMMs in torch,
    one Triton kernel per round and one for the cell (each way); autograd through it.

    ``weight``: ``[weight_ih, weight_hh]`` concatenated, ``[4n, m + n]`` (one GEMM, so that low precision rounds
    the gates' pre-activations once, as the other paths do); ``rounds``: each round's
    ``MogrifierRound.flat_parameters()``, ``(weight, bias)`` or ``(left, right, bias)``.
    Shapes: ``x [B, m]`` (dropout applied), ``h, c [B, n]``, ``state_mask`` None or ``[B, n]`` -> ``(h_t, c_t)``,
    each ``[B, n]``.
    """
    if state_mask is not None:
        h = h * state_mask
    for i, params in enumerate(rounds):
        cond = h if i % 2 == 0 else x  # odd rounds of the paper (even i) gate x with the latest h
        if len(params) == 2:
            p = torch.mm(cond, params[0].t())
        else:  # Q = left @ right: two thin GEMMs
            p = torch.mm(torch.mm(cond, params[1].t()), params[0].t())
        if i % 2 == 0:
            x = round_gate(p, params[-1], x)
        else:
            h = round_gate(p, params[-1], h)
    g = torch.mm(torch.cat([x, h], 1), weight.t())  # [B, 4n]
    return lstm_cell(g, bias, c, cap_input_gate)


def triton_mogrifier_layer(
    layer, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, state_mask: Optional[torch.Tensor] = None
):
    """``layer.forward(x, h0, c0, state_mask)`` (a :class:`MogrifierLSTMLayer`) as a loop of
    :func:`triton_mogrifier_step`. Shapes: ``x [T, B, m]``, ``h0, c0 [B, n]``, ``state_mask`` None, ``[B, n]`` or
    ``[T, B, n]`` -> ``(y [T, B, n], (h_T, c_T))``."""
    per_step = state_mask is not None and state_mask.dim() == 3
    if state_mask is not None and state_mask.shape != ((x.shape[0],) if per_step else ()) + h0.shape:
        raise ValueError(
            f"triton_mogrifier_layer: the state mask must be [B, n] = {list(h0.shape)} or [T, B, n], "
            f"T = {x.shape[0]}; got {list(state_mask.shape)}"
        )
    rounds = [mog.flat_parameters() for mog in layer.mogrifier]
    weight = torch.cat([layer.weight_ih, layer.weight_hh], 1)  # once per sequence; autograd splits its gradient
    h, c = h0, c0
    outputs = []
    for t in range(x.shape[0]):
        mask = state_mask[t] if per_step else state_mask
        h, c = triton_mogrifier_step(x[t], h, c, weight, layer.bias, rounds, layer.cap_input_gate, mask)
        outputs.append(h)
    return torch.stack(outputs), (h, c)
