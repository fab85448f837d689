"""The fast path of a Mogrifier LSTM layer (``recurrence.py``) with every round and the cell fused into
Triton kernels: :class:`FusedRecurrence`, the recurrence over a BPTT window inside the fast path's one autograd
Function (:class:`~define_fairseq.modules.mogrifier.recurrence.MogrifierLayerFunction`), its weight gradients one
GEMM each over the window, as the fast path computes them.

Per time step and layer:

* forward: one kernel per round (its map ``Q cond``, low rank or full, then ``2 sigmoid(a) * v``, computed as
  ``v + v tanh(a / 2)``; every program recomputes the thin ``u = right cond`` of its rows instead of reading it
  back), the gates' GEMM over ``[x_up; h_up; 1]`` in torch, and one cell kernel, which also writes ``h_t`` times
  the next step's state mask where the next step's rounds read it;
* backward: one cell kernel (it adds the gradient from the next step, masked, to ``dy_t``), the GEMM of ``dz``,
  and one kernel per round (its element-wise gradient, recomputed by every program for its rows, and the product
  of it back to the conditioning value).

Kernels compute in float32 and store in the buffers' dtype, where the torch fast path rounds; their products take
float32 in IEEE float32, bfloat16 and float16 on the tensor cores with float32 sums (as cuBLAS); float64 runs the
fast path in torch. A rank wider than the widest block of it that fits the device's shared memory is taken in
chunks (:func:`rank_block`): every rank launches. Triton decides at import whether the kernels are compiled (CUDA
tensors) or interpreted (``TRITON_INTERPRET=1`` set before the import: CPU tensors, for tests).
"""

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError as error:  # a CUDA build of torch brings Triton; the layers import this module on CUDA only
    raise ImportError(
        "define_fairseq.modules.mogrifier.fused needs Triton for the Mogrifier's CUDA kernels: pip install "
        "triton, or run the layers' fast path in torch (MogrifierLSTMLayer.kernels = 'torch')"
    ) from error

from define_fairseq.modules.mogrifier import triton_step as mt
from define_fairseq.modules.mogrifier.recurrence import FUSED_DTYPES, LayerRecurrence
from define_fairseq.modules.mogrifier.threads import Threads

BLOCK_ROWS = 16  # rows (batch) per program; tl.dot needs at least 16 in every dimension
BLOCK_COLS = 64  # output columns per program, and the width of every inner-dimension chunk
# KB of shared memory a block may opt in to, by compute capability, where torch cannot say (above: OutOfResources)
SHARED_KB = {(7, 0): 96, (7, 5): 64, (8, 0): 163, (8, 6): 99, (8, 7): 163, (8, 9): 99, (9, 0): 227, (10, 0): 227}


@triton.jit
def _dot(a, b, F32: tl.constexpr):
    # float32 in IEEE float32; bfloat16 and float16 on the tensor cores with float32 sums, as cuBLAS multiplies
    # them (the interpreter, whose bfloat16 products are wrong, takes the float32 branch: the same exact products)
    if F32:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def _forward_chunk(
    cond_ptr, cond_stride, right_ptr, left_ptr, u_ptr, u_stride, rows, row_ok, cols, col_ok, k0, IN: tl.constexpr,
    K: tl.constexpr, F32: tl.constexpr, BB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    # columns k0 .. k0 + BK of u = cond @ right^T [BB, K] (stored, rounded as the weight gradient reads it, by the
    # first column of programs) and their part of a = u @ left^T
    ks = k0 + tl.arange(0, BK)
    u = tl.full((BB, BK), 0.0, tl.float32)
    for start in range(0, IN, BN):
        i = start + tl.arange(0, BN)
        c = tl.load(cond_ptr + rows[:, None] * cond_stride + i[None, :], (row_ok[:, None]) & (i[None, :] < IN), 0.0)
        r = tl.load(right_ptr + ks[None, :] * IN + i[:, None], (i[:, None] < IN) & (ks[None, :] < K), 0.0)
        u += _dot(c, r, F32)
    u = u.to(u_ptr.dtype.element_ty)
    if tl.program_id(1) == 0:
        tl.store(u_ptr + rows[:, None] * u_stride + ks[None, :], u, row_ok[:, None] & (ks[None, :] < K))
    left = tl.load(left_ptr + cols[None, :] * K + ks[:, None], (ks[:, None] < K) & col_ok[None, :], 0.0)
    return _dot(u, left, F32)


@triton.jit
def _round_forward_kernel(
    cond_ptr, cond_stride, right_ptr, left_ptr, bias_ptr, v_ptr, v_stride, out_ptr, out_stride, th_ptr, u_ptr,
    u_stride, B, IN: tl.constexpr, OUT: tl.constexpr, K: tl.constexpr, LOW_RANK: tl.constexpr, F32: tl.constexpr,
    BB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    # IN, OUT and K are a model's fixed widths and rank, compile-time constants: one compilation per model, and the
    # interpreter (TRITON_INTERPRET=1) cannot take a runtime integer as a loop bound under numpy 2.4 or newer
    rows = tl.program_id(0) * BB + tl.arange(0, BB)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    row_ok, col_ok = rows < B, cols < OUT
    if LOW_RANK:  # u = cond @ right^T [BB, K], then a = u @ left^T, over the rank in chunks of BK
        args = (cond_ptr, cond_stride, right_ptr, left_ptr, u_ptr, u_stride, rows, row_ok, cols, col_ok)
        a = _forward_chunk(*args, 0, IN, K, F32, BB, BN, BK)
        for k0 in range(BK, K, BK):  # none unless the rank is wider than the block that fits in shared memory
            a += _forward_chunk(*args, k0, IN, K, F32, BB, BN, BK)
    else:  # a = cond @ weight^T, weight [OUT, IN] at left_ptr
        a = tl.full((BB, BN), 0.0, tl.float32)
        for start in range(0, IN, BN):
            i = start + tl.arange(0, BN)
            c = tl.load(cond_ptr + rows[:, None] * cond_stride + i[None, :], (row_ok[:, None]) & (i[None, :] < IN), 0.0)
            w = tl.load(left_ptr + cols[None, :] * IN + i[:, None], (i[:, None] < IN) & col_ok[None, :], 0.0)
            a += _dot(c, w, F32)
    ok = row_ok[:, None] & col_ok[None, :]
    a += tl.load(bias_ptr + cols, col_ok, 0.0).to(tl.float32)[None, :]
    th = mt._tanh(0.5 * a)
    v = tl.load(v_ptr + rows[:, None] * v_stride + cols[None, :], ok, 0.0).to(tl.float32)
    tl.store(th_ptr + rows[:, None] * OUT + cols[None, :], th, ok)
    tl.store(out_ptr + rows[:, None] * out_stride + cols[None, :], v + v * th, ok)


@triton.jit
def _dhalf(
    d_ptr, d_stride, th_ptr, v_ptr, v_stride, dhalf_ptr, d_old_ptr, d_old_stride, rows, row_ok, o, first,
    OUT: tl.constexpr, STORE: tl.constexpr,
):  # fmt: skip
    # d(a / 2) = d_out v (1 - th^2) of the columns o (with STORE the first column of programs also stores it and
    # d_v = d_out (1 + th) into d_old, never into d itself, which the others read)
    ok = row_ok[:, None] & (o[None, :] < OUT)
    d = tl.load(d_ptr + rows[:, None] * d_stride + o[None, :], ok, 0.0).to(tl.float32)
    th = tl.load(th_ptr + rows[:, None] * OUT + o[None, :], ok, 0.0).to(tl.float32)
    v = tl.load(v_ptr + rows[:, None] * v_stride + o[None, :], ok, 0.0).to(tl.float32)
    dh = (d * v * (1.0 - th * th)).to(dhalf_ptr.dtype.element_ty)  # rounded as the stored d(a / 2)
    if STORE:
        tl.store(dhalf_ptr + rows[:, None] * OUT + o[None, :], dh, ok & first)
        tl.store(d_old_ptr + rows[:, None] * d_old_stride + o[None, :], d + d * th, ok & first)
    return dh


@triton.jit
def _backward_chunk(
    dargs, left_ptr, right_ptr, low_ptr, low_stride, rows, row_ok, cols, col_ok, first, k0, IN: tl.constexpr,
    OUT: tl.constexpr, K: tl.constexpr, F32: tl.constexpr, BB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    STORE: tl.constexpr,
):  # fmt: skip
    # columns k0 .. k0 + BK of low = d(a / 2) @ left (stored for right's gradient) and their part of low @ right
    ks = k0 + tl.arange(0, BK)
    low = tl.full((BB, BK), 0.0, tl.float32)
    for start in range(0, OUT, BN):
        o = start + tl.arange(0, BN)
        dh = _dhalf(*dargs, rows, row_ok, o, first, OUT, STORE)
        left = tl.load(left_ptr + o[:, None] * K + ks[None, :], (o[:, None] < OUT) & (ks[None, :] < K), 0.0)
        low += _dot(dh, left, F32)
    low = low.to(low_ptr.dtype.element_ty)
    tl.store(low_ptr + rows[:, None] * low_stride + ks[None, :], low, row_ok[:, None] & (ks[None, :] < K) & first)
    right = tl.load(right_ptr + ks[:, None] * IN + cols[None, :], (ks[:, None] < K) & col_ok[None, :], 0.0)
    return _dot(low, right, F32)


@triton.jit
def _round_backward_kernel(
    d_ptr, d_stride, th_ptr, v_ptr, v_stride, dhalf_ptr, d_old_ptr, d_old_stride, left_ptr, right_ptr, low_ptr,
    low_stride, dcond_ptr, dcond_stride, B, IN: tl.constexpr, OUT: tl.constexpr, K: tl.constexpr,
    LOW_RANK: tl.constexpr, F32: tl.constexpr, BB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    # Each program: its rows' d(a / 2) (_dhalf), then its block of d_cond += d(a / 2) Q / 2 (Q: left @ right or weight)
    rows = tl.program_id(0) * BB + tl.arange(0, BB)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)  # columns of cond
    row_ok, col_ok = rows < B, cols < IN
    first = tl.program_id(1) == 0
    dargs = (d_ptr, d_stride, th_ptr, v_ptr, v_stride, dhalf_ptr, d_old_ptr, d_old_stride)
    if LOW_RANK:
        args = (dargs, left_ptr, right_ptr, low_ptr, low_stride, rows, row_ok, cols, col_ok, first)
        acc = _backward_chunk(*args, 0, IN, OUT, K, F32, BB, BN, BK, True)
        for k0 in range(BK, K, BK):  # none unless the rank is wider than the block (d(a / 2) recomputed for each)
            acc += _backward_chunk(*args, k0, IN, OUT, K, F32, BB, BN, BK, False)
    else:
        acc = tl.full((BB, BN), 0.0, tl.float32)
        for start in range(0, OUT, BN):
            o = start + tl.arange(0, BN)
            dh = _dhalf(*dargs, rows, row_ok, o, first, OUT, True)
            w = tl.load(left_ptr + o[:, None] * IN + cols[None, :], (o[:, None] < OUT) & col_ok[None, :], 0.0)
            acc += _dot(dh, w, F32)
    ok = row_ok[:, None] & col_ok[None, :]
    target = dcond_ptr + rows[:, None] * dcond_stride + cols[None, :]
    tl.store(target, tl.load(target, ok, 0.0).to(tl.float32) + 0.5 * acc, ok)


@triton.jit
def _gates(g_ptr, offs, mask, n):
    # the activated gates i, f, j, o of the elements offs of [B, n] (gate k at column k n + col of g [B, 4n])
    row = offs // n
    col = offs - row * n
    g = g_ptr + row * 4 * n + col
    i = mt._sigmoid(tl.load(g, mask=mask).to(tl.float32))
    f = mt._sigmoid(tl.load(g + n, mask=mask).to(tl.float32))
    j = mt._tanh(tl.load(g + 2 * n, mask=mask).to(tl.float32))
    o = mt._sigmoid(tl.load(g + 3 * n, mask=mask).to(tl.float32))
    return i, f, j, o, row * 4 * n + col


@triton.jit
def _cell_forward_kernel(
    g_ptr, c_prev_ptr, c_ptr, h_ptr, next_ptr, next_stride, mask_ptr, numel, n, NEXT: tl.constexpr,
    MASK: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # NEXT: h_t also written where the next step's rounds read it (times the next step's state mask with MASK)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    i, f, j, o, _ = _gates(g_ptr, offs, mask, n)
    if CAP:
        i = tl.minimum(i, 1.0 - f)
    c = f * tl.load(c_prev_ptr + offs, mask=mask).to(tl.float32) + i * j
    c = c.to(c_ptr.dtype.element_ty)  # h from the cell as stored, as the torch fast path computes it
    tl.store(c_ptr + offs, c, mask=mask)
    h = (o * mt._tanh(c.to(tl.float32))).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + offs, h, mask=mask)
    if NEXT:
        h = h.to(tl.float32)
        if MASK:
            h = h * tl.load(mask_ptr + offs, mask=mask).to(tl.float32)
        row = offs // n
        tl.store(next_ptr + row * next_stride + offs - row * n, h, mask=mask)


@triton.jit
def _cell_backward_kernel(
    dy_ptr, next_ptr, next_stride, mask_ptr, dc_ptr, g_ptr, c_prev_ptr, c_ptr, dg_ptr, numel, n,
    NEXT: tl.constexpr, MASK: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # dh = dy_t + (the next step's gradient of its h^0) * (its state mask); dc is updated in place to dc_{t-1}
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    i, f, j, o, gate = _gates(g_ptr, offs, mask, n)
    dh = tl.load(dy_ptr + offs, mask=mask).to(tl.float32)
    if NEXT:
        row = offs // n
        d_next = tl.load(next_ptr + row * next_stride + offs - row * n, mask=mask).to(tl.float32)
        if MASK:
            d_next = d_next * tl.load(mask_ptr + offs, mask=mask).to(tl.float32)
        dh += d_next
    c_prev = tl.load(c_prev_ptr + offs, mask=mask).to(tl.float32)
    tanh_c = mt._tanh(tl.load(c_ptr + offs, mask=mask).to(tl.float32))
    i_used = i
    if CAP:
        i_used = tl.minimum(i, 1.0 - f)
    dc = tl.load(dc_ptr + offs, mask=mask).to(tl.float32)
    mt._store_gate_gradients(dg_ptr, dc_ptr, offs, mask, gate, n, i, f, j, o, i_used, c_prev, tanh_c, dh, dc, CAP)


@functools.lru_cache(maxsize=None)
def shared_memory_limit(device: torch.device) -> int:
    """The bytes of shared memory one block of a kernel may use on ``device``: sm_90's for the interpreter, 48 KB
    (what every CUDA device gives) for a device that neither torch nor ``SHARED_KB`` knows."""
    if device.type != "cuda":
        return SHARED_KB[(9, 0)] << 10
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", 0) or SHARED_KB.get((props.major, props.minor), 48) << 10


def round_shared_memory(backward: bool, element_size: int, block_k: int) -> int:
    """At most the bytes of shared memory Triton 3.6 gives a low-rank round kernel with rank chunks ``block_k`` wide
    (sm_80, sm_90, any widths, 4 warps, 3 stages; test_mogrifier_fused_compile.py checks it): the ``[BB, BK]`` and
    ``[BK, BN]`` tiles of the product over the rank, and the tiles that the loop over the widths loads."""
    bb, bn = BLOCK_ROWS, BLOCK_COLS
    tiles = element_size * block_k * (bb + bn)
    if element_size == 4:  # IEEE float32 products: every operand through shared memory, no loads in flight
        return tiles + 4 * (block_k * bn + (6 if backward else 2) * bb * bn)
    # 16 bits: the loop's loads (with the backward's three [BB, BN]) in flight in two buffers (cp.async, 3 stages)
    return max(tiles, 2 * element_size * (block_k * bn + (3 if backward else 1) * bb * bn))


def rank_block(rank: int, dtype: torch.dtype, limit: int, backward: bool) -> int:
    """``BK``, the width of a round kernel's chunks of the rank: its next power of two (one chunk, the kernel as
    before) where the kernel then fits ``limit`` bytes of shared memory, else the widest power of two that fits
    (the same products; the sum over the rank in chunks rounds differently), at least 16 (which fits any device)."""
    block = max(16, triton.next_power_of_2(max(rank, 1)))
    while block > 16 and round_shared_memory(backward, torch.finfo(dtype).bits // 8, block) > limit:
        block //= 2
    return block


def check_inputs(x: torch.Tensor) -> None:
    """Raises unless the kernels can take ``x``'s dtype and device."""
    if x.dtype not in FUSED_DTYPES:
        raise ValueError(
            f"mogrifier.fused: the kernels take float32, bfloat16 or float16; got {x.dtype} (float64 runs the "
            f"fast path in torch: MogrifierLSTMLayer.kernels = 'torch')"
        )
    if x.device.type != "cuda" and not mt.INTERPRETED:
        raise ValueError(
            f"mogrifier.fused: the compiled kernels take CUDA tensors; got one on {x.device}. On a CPU, set "
            f"TRITON_INTERPRET=1 before importing define_fairseq.modules.mogrifier.fused (the interpreter)"
        )


class FusedRecurrence(LayerRecurrence):
    """:class:`LayerRecurrence` (its buffers, its window-wide weight gradients) with the per-step work in the
    kernels above; the same arguments, for ``rounds >= 1``. Shapes: as :class:`LayerRecurrence`."""

    saves_activations = False  # the kernels keep pre-activations and recompute the gates from them

    def __init__(self, x, h0, c0, state_mask, *args, **kwargs):
        check_inputs(x)
        mask = None if state_mask is None else state_mask.contiguous()
        super().__init__(x.contiguous(), h0.contiguous(), c0.contiguous(), mask, *args, **kwargs)
        if self.r == 0:
            raise ValueError("FusedRecurrence runs layers with rounds >= 1 (rounds = 0 is an LSTM: the fast path)")
        self.params = [tuple(p.contiguous() for p in params) for params in self.rounds]
        limit = shared_memory_limit(x.device)  # blocks as wide as fit: every rank launches on every device
        self.block_k = [rank_block(self.rank, x.dtype, limit, backward) for backward in (False, True)]
        self.f32 = x.dtype == torch.float32 or mt.INTERPRETED  # products in float32 (see _dot)

    def _grid(self, width: int):
        return (triton.cdiv(self.B, BLOCK_ROWS), triton.cdiv(width, BLOCK_COLS))

    def _forward_step(self, t: int, s: int, h, c, threads: Threads):
        n, rank = self.n, self.rank
        masked = self.state_mask is not None
        # h^0 where the rounds read it: the last step's cell kernel wrote it there, except at the first step
        target = self.masked_h if masked else self.z_h if self.r == 1 else None
        if target is None:
            hv = h
        elif t > 0:
            hv = target[s]
        else:
            hv = torch.mul(h, self.mask(0), out=target[s]) if masked else target[s].copy_(h)
        xv = self.x[t]
        for i, params in enumerate(self.params):
            gated, cond = (xv, hv) if i % 2 == 0 else (hv, xv)
            out, th = self.plan[i][2][s], self.tanhs[i][s]
            u = self.lowrank[i][s] if rank else th  # th: an unused pointer at full rank
            left, right = (params[0], params[1]) if rank else (params[0], params[0])
            width, inner = gated.shape[1], cond.shape[1]
            _round_forward_kernel[self._grid(width)](
                cond, cond.stride(0), right, left, params[-1], gated, gated.stride(0), out, out.stride(0), th, u,
                u.stride(0), self.B, inner, width, rank, LOW_RANK=rank > 0, F32=self.f32, BB=BLOCK_ROWS,
                BN=BLOCK_COLS, BK=self.block_k[0],
            )  # fmt: skip
            if i % 2 == 0:
                xv = out
            else:
                hv = out
        g = torch.mm(self.z[s], self.weight_t, out=self.gates[s])
        c_new, h_new = self.cells[s], self.y[t]
        numel = self.B * n
        grid = (triton.cdiv(numel, mt.BLOCK_SIZE),)
        following = t + 1 < self.T and target is not None
        next_h = target[s + 1 if self.save else 0] if following else h_new  # h_new: a pointer not written
        next_mask = self.mask(t + 1) if following and masked else h_new
        _cell_forward_kernel[grid](
            g, c, c_new, h_new, next_h, next_h.stride(0), next_mask, numel, n, NEXT=following, MASK=masked,
            CAP=self.cap, BLOCK=mt.BLOCK_SIZE,
        )  # fmt: skip
        return h_new, c_new

    def backward(self, dy, dc_last, need):
        B, m, n = self.B, self.m, self.n
        self.dz = self.new(self.T, B, m + n)
        # the chains' gradients after a round go to the other of two buffers: the kernel reads the one before
        self.spare = {True: (self.new(B, m), self.new(B, m)), False: (self.new(B, n), self.new(B, n))}
        self.d_state = None  # the gradient of h^0 (the masked h_{t-1}) of the step done last
        dc_last = None if dc_last is None else dc_last.contiguous()
        result = super().backward(dy.contiguous(), dc_last, need)
        dh0 = self.d_state.clone() if self.state_mask is None else self.d_state * self.mask(0)  # not a workspace buffer
        return (result[0], dh0, *result[2:])

    def _backward_step(self, t: int, dy_t, dh_next, dc, threads: Threads):
        m, n, rank, B = self.m, self.n, self.rank, self.B
        c_prev = self.cells[t - 1] if t > 0 else self.c0
        following = self.d_state if t + 1 < self.T else dy_t  # dy_t: a pointer the kernel does not read
        mask = self.mask(t + 1) if self.state_mask is not None and t + 1 < self.T else dy_t
        dg = self.dgates[t]
        numel = B * n
        _cell_backward_kernel[(triton.cdiv(numel, mt.BLOCK_SIZE),)](
            dy_t, following, following.stride(0), mask, dc, self.gates[t], c_prev, self.cells[t], dg, numel, n,
            NEXT=t + 1 < self.T, MASK=self.state_mask is not None, CAP=self.cap, BLOCK=mt.BLOCK_SIZE,
        )  # fmt: skip
        dz = torch.mm(dg, self.d_weight, out=self.dz[t])
        chains = {True: dz[:, :m], False: dz[:, m:]}  # the gradient of the latest x and of the latest h
        for i in range(self.r - 1, -1, -1):
            is_x = i % 2 == 0
            params = self.params[i]
            gated = self._value(self.plan[i][0], is_x, t)
            d_new, d_cond = chains[is_x], chains[not is_x]
            spare = self.spare[is_x]
            d_old = self.dx[t] if i == 0 else spare[1] if d_new is spare[0] else spare[0]
            width, inner = d_new.shape[1], d_cond.shape[1]
            left, right = (params[0], params[1]) if rank else (params[0], params[0])
            dhalf = self.dhalf[i][t]
            low = self.dlow[i][t] if rank else dhalf  # dhalf: a pointer the kernel does not read at full rank
            _round_backward_kernel[self._grid(inner)](
                d_new, d_new.stride(0), self.tanhs[i][t], gated, gated.stride(0), dhalf, d_old, d_old.stride(0), left,
                right, low, low.stride(0), d_cond, d_cond.stride(0), B, inner, width, rank, LOW_RANK=rank > 0,
                F32=self.f32, BB=BLOCK_ROWS, BN=BLOCK_COLS, BK=self.block_k[1],
            )  # fmt: skip
            chains[is_x] = d_old
        self.d_state = chains[False]
        return None, dc


def fused_mogrifier_layer(layer, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, state_mask=None):
    """``layer.forward(x, h0, c0, state_mask)`` (a :class:`MogrifierLSTMLayer` with rounds) through these kernels
    whatever the device, as ``triton_step.triton_mogrifier_layer`` is called. Shapes: ``x [T, B, m]``,
    ``h0, c0 [B, n]``, ``state_mask`` None, ``[B, n]`` or ``[T, B, n]`` -> ``(y [T, B, n], (h_T, c_T))``."""
    kernels = layer.kernels
    layer.kernels = "triton"
    try:
        return layer(x, h0, c0, state_mask)
    finally:
        layer.kernels = kernels
