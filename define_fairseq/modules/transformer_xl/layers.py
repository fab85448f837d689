"""Transformer-XL (Dai et al., 2019) as plain ``torch.nn`` modules: the position-wise feed-forward, the layer and
the stack with segment memory. The relative attention is in :mod:`define_fairseq.modules.transformer_xl.attention`.

Each layer attends over the concatenation of a *memory* (the layer's inputs for the previous ``M`` positions,
carried over from earlier segments without gradient) and the current segment of ``T`` positions, so there are
``K = M + T`` keys. Positions enter only through the attention score, as a function of the distance between
query and key (:class:`RelativeMultiheadAttention`).

Layouts: the stack takes and returns batch-first ``[B, T, d]``; inside, everything is time-first ``[T, B, d]``
and memories are ``[M, B, d]``. Masks are ``[T, K]`` bools, ``True`` where a query may NOT attend.
"""

from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from define_fairseq.modules.checks import check_positive, check_probability
from define_fairseq.modules.transformer_xl.attention import RelativeMultiheadAttention


class PositionwiseFeedForward(nn.Module):
    """``Linear(d, d_inner) -> ReLU -> dropout -> Linear(d_inner, d) -> dropout`` with a residual and a
    LayerNorm: post-norm ``LayerNorm(x + ff(x))`` or pre-norm ``x + ff(LayerNorm(x))``.

    Shapes: ``x [T, B, d] -> [T, B, d]``.
    """

    def __init__(self, d_model: int, d_inner: int, dropout: float = 0.0, pre_norm: bool = False):
        super().__init__()
        check_positive(d_model, "d_model")
        check_positive(d_inner, "d_inner")
        check_probability(dropout, "dropout")
        self.pre_norm = pre_norm
        self.fc1 = nn.Linear(d_model, d_inner)
        self.fc2 = nn.Linear(d_inner, d_model)
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp = self.layer_norm(x) if self.pre_norm else x
        y = self.dropout(self.fc2(self.dropout(F.relu(self.fc1(inp)))))
        if self.pre_norm:
            return x + y
        return self.layer_norm(x + y)


class TransformerXLLayer(nn.Module):
    """One Transformer-XL layer: :class:`RelativeMultiheadAttention` (``attention``) then
    :class:`PositionwiseFeedForward` (``feed_forward``).

    Shapes: ``x [T, B, d]``, ``memory [M, B, d]`` or ``None``, ``pos [K, d]``, ``mask [T, K]`` -> ``[T, B, d]``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int,
        d_inner: int,
        dropout: float,
        attention_dropout: float,
        pre_norm: bool,
    ):
        super().__init__()
        self.attention = RelativeMultiheadAttention(
            d_model, num_heads, head_dim, dropout=dropout, attention_dropout=attention_dropout, pre_norm=pre_norm
        )
        self.feed_forward = PositionwiseFeedForward(d_model, d_inner, dropout=dropout, pre_norm=pre_norm)

    def forward(
        self,
        x: torch.Tensor,
        pos: torch.Tensor,
        r_w_bias: torch.Tensor,
        r_r_bias: torch.Tensor,
        mask: torch.Tensor,
        memory: Optional[torch.Tensor] = None,
        memory_kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
        return_kv: bool = False,
    ):
        """``[T, B, d]``, or with ``return_kv`` ``([T, B, d], (keys, values))`` (see the attention)."""
        if not return_kv:
            return self.feed_forward(self.attention(x, pos, r_w_bias, r_r_bias, mask, memory, memory_kv))
        out, keys_values = self.attention(x, pos, r_w_bias, r_r_bias, mask, memory, memory_kv, return_kv=True)
        return self.feed_forward(out), keys_values


class TransformerXLStack(nn.Module):
    """A stack of :class:`TransformerXLLayer` with segment-level recurrence (memory).

    Owns ``layers``, the ``r_w_bias`` / ``r_r_bias`` Parameters ``[H, dh]`` shared by all layers, and with
    ``pre_norm`` a ``final_norm`` LayerNorm applied to the output. ``mem_len``, ``clamp_len`` and
    ``same_length`` are plain attributes and may be changed after construction (e.g. evaluation with mem_len
    640, clamp_len 400, same_length True):

    - ``mem_len``: how many past layer inputs :meth:`forward` returns as the next memory (unless ``keep`` is
      given), and the window of the ``same_length`` mask.
    - ``clamp_len``: relative distances larger than ``clamp_len`` use the encoding of ``clamp_len``; ``-1``
      (and ``0``, as in the original, which clamps only when ``clamp_len > 0``) means no clamping. Values
      below -1 are refused.
    - ``same_length``: every query sees the same number of keys (``mem_len``) instead of all earlier ones.
    - ``clone_memory``: return the new memory (and keys and values) as copies of their own rather than views of the
      layers' outputs, for layers compiled as CUDA graphs, whose next replay overwrites its outputs' buffers.
    - ``mark_cudagraph_steps``: tells the model that owns the stack to start each of its forwards with
      ``torch.compiler.cudagraph_mark_step_begin()`` (before its input layer, whose output the stack reads), so that
      CUDA-graph trees take every call for a new step.

    Args:
        num_layers, d_model, num_heads, head_dim, d_inner: sizes; ``d_model`` must be even (sinusoids).
        dropout: on the input, the position encodings, inside every layer and on the output.
        attention_dropout: on the attention probabilities.
        pre_norm: pre-norm layers plus ``final_norm``.
        mem_len, clamp_len, same_length: see above.

    Shapes: ``x [B, T, d]``, ``memory`` a list of ``num_layers`` tensors ``[M, B, d]`` (or ``None``) ->
    ``(output [B, T, d], new_memory)`` with ``new_memory`` a list of ``num_layers`` detached ``[n, B, d]``.
    """

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        head_dim: int,
        d_inner: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        pre_norm: bool = False,
        mem_len: int = 150,
        clamp_len: int = -1,
        same_length: bool = False,
    ):
        super().__init__()
        check_positive(num_layers, "num_layers")
        check_positive(d_model, "d_model")
        check_positive(num_heads, "num_heads")
        check_positive(head_dim, "head_dim")
        check_positive(d_inner, "d_inner")
        check_probability(dropout, "dropout")
        check_probability(attention_dropout, "attention_dropout")
        if d_model % 2:
            raise ValueError(f"d_model must be even for the sin/cos halves of the position encoding, got {d_model}")
        if int(mem_len) < 0:
            raise ValueError(f"mem_len must be >= 0, got {mem_len}")
        if int(clamp_len) < -1:
            raise ValueError(f"clamp_len must be -1 (no clamping) or >= 0, got {clamp_len}")
        self.num_layers = num_layers
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.pre_norm = pre_norm
        self.mem_len = mem_len
        self.clamp_len = clamp_len
        self.same_length = same_length
        self.clone_memory = False
        self.mark_cudagraph_steps = False
        self.layers = nn.ModuleList(
            TransformerXLLayer(d_model, num_heads, head_dim, d_inner, dropout, attention_dropout, pre_norm)
            for _ in range(num_layers)
        )
        self.r_w_bias = nn.Parameter(torch.empty(num_heads, head_dim))
        self.r_r_bias = nn.Parameter(torch.empty(num_heads, head_dim))
        self.final_norm = nn.LayerNorm(d_model) if pre_norm else None
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self):
        """The original's init: Linear weights N(0, 0.02) and biases 0, LayerNorm weights N(1, 0.02) and
        biases 0, ``r_w_bias`` / ``r_r_bias`` N(0, 0.02)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.normal_(module.weight, 1.0, 0.02)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.r_w_bias, 0.0, 0.02)
        nn.init.normal_(self.r_r_bias, 0.0, 0.02)

    def relative_positions(self, klen: int, device=None, dtype=None) -> torch.Tensor:
        """``[K, d]`` sinusoids ``cat(sin(p * inv_freq), cos(p * inv_freq))`` of the distances
        ``p = [K-1, ..., 0]`` (clamped to ``clamp_len`` when ``clamp_len > 0``), with
        ``inv_freq = 1 / 10000^(arange(0, d, 2) / d)``. Computed in float32 (float64 when ``dtype`` is float64),
        then cast to ``dtype`` (default float32)."""
        work = torch.float64 if dtype == torch.float64 else torch.float32
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.d_model, 2, device=device, dtype=work) / self.d_model))
        distances = torch.arange(klen - 1, -1, -1, device=device, dtype=work)
        if self.clamp_len > 0:
            distances = distances.clamp(max=self.clamp_len)
        angles = torch.outer(distances, inv_freq)
        pos = torch.cat([angles.sin(), angles.cos()], dim=-1)
        return pos if dtype is None else pos.to(dtype)

    def attention_mask(self, qlen: int, mlen: int, device=None) -> torch.Tensor:
        """``[T, K]`` bool mask (``True`` = may not attend) for ``T = qlen`` queries after ``M = mlen`` memory
        positions: causal (query ``i`` sees keys ``j <= M + i``) and, with ``same_length``, the original's
        window: ``mask_len = K - mem_len``, ``shift = T - mask_len if mask_len > 0 else T``, also masking
        ``j <= i - shift``."""
        klen = mlen + qlen
        ones = torch.ones(qlen, klen, dtype=torch.bool, device=device)
        mask = torch.triu(ones, diagonal=1 + mlen)
        if self.same_length:
            if self.mem_len <= 0:
                raise ValueError("same_length needs mem_len >= 1: with mem_len 0 its window masks every key")
            mask_len = klen - self.mem_len
            shift = qlen - mask_len if mask_len > 0 else qlen
            mask = mask | torch.tril(ones, diagonal=-shift)
        return mask

    def forward(
        self,
        x: torch.Tensor,
        memory: Optional[List[torch.Tensor]] = None,
        keep: Optional[int] = None,
        memory_kv: Optional[List[Tuple[torch.Tensor, torch.Tensor]]] = None,
        return_kv: bool = False,
    ):
        """Run the segment ``x [B, T, d]`` after ``memory`` (``num_layers`` tensors ``[M, B, d]``, or ``None``).

        Returns ``(output [B, T, d], new_memory)``: for each layer ``cat(memory[i], input of layer i)[-n:]``,
        detached, with ``n = keep`` if given else ``mem_len`` (``n = 0`` gives ``[0, B, d]`` tensors).

        Key/value cache, for evaluation: with ``return_kv`` a third element ``new_memory_kv`` holds, for each
        layer, the keys and values ``([n, B, H*dh], [n, B, H*dh])`` of the new memory; given back as
        ``memory_kv`` with that memory, they are not computed again from it. The original recomputes them from
        the memory every segment, which is most of the evaluation cost with a long memory (640 states for 64
        queries); the result is the same as long as the weights do not change in between. Every tensor returned
        is detached.
        """
        if x.dim() != 3 or x.size(-1) != self.d_model:
            raise ValueError(f"x must be [B, T, d_model={self.d_model}], got {list(x.shape)}")
        batch, qlen, _ = x.shape
        keep = self.mem_len if keep is None else int(keep)
        if keep < 0:
            raise ValueError(f"keep must be >= 0, got {keep}")
        mlen = 0
        if memory is not None:
            if len(memory) != self.num_layers:
                raise ValueError(f"memory must hold one tensor per layer ({self.num_layers}), got {len(memory)}")
            mlen = memory[0].size(0) if memory[0].dim() == 3 else -1
            for i, mem in enumerate(memory):
                if mem.dim() != 3 or mem.size(0) != mlen or mem.shape[1:] != (batch, self.d_model):
                    raise ValueError(
                        f"memory[{i}] must be [M, B, d] = [{max(mlen, 0)}, {batch}, {self.d_model}] "
                        f"(the same M for every layer), got {list(mem.shape)}"
                    )
        if memory_kv is not None and (memory is None or len(memory_kv) != self.num_layers):
            raise ValueError("memory_kv needs the memory it was computed from, and one (keys, values) pair per layer")
        carry = torch.Tensor.clone if self.clone_memory else torch.Tensor.detach
        klen = mlen + qlen
        mask = self.attention_mask(qlen, mlen, device=x.device)
        pos = self.dropout(self.relative_positions(klen, device=x.device, dtype=x.dtype))
        # time-first and contiguous, so that every layer (and the memory carried) sees one memory layout: a compiled
        # layer guards on its inputs' strides
        h = self.dropout(x.transpose(0, 1).contiguous())
        new_memory, new_memory_kv = [], []
        for i, layer in enumerate(self.layers):
            mem = memory[i] if memory is not None else None
            start = max(mlen, 0) + qlen - min(keep, max(mlen, 0) + qlen)  # the first of the positions kept
            with torch.no_grad():
                full = h if mem is None or mlen == 0 else torch.cat([mem, h], dim=0)
                new_memory.append(carry(full[start:].detach()))
            kv = memory_kv[i] if memory_kv is not None else None
            if return_kv:
                h, (keys, values) = layer(h, pos, self.r_w_bias, self.r_r_bias, mask, mem, kv, return_kv=True)
                # contiguous: keys without a memory are a view into the layer's joint projection, whose strides a
                # compiled layer would otherwise see change from the first segment to the next (a clone of such a
                # view is already contiguous, so they are copied once at most)
                keys, values = carry(keys[start:].detach()), carry(values[start:].detach())
                new_memory_kv.append((keys.contiguous(), values.contiguous()))
            else:
                h = layer(h, pos, self.r_w_bias, self.r_r_bias, mask, mem, kv)
        if self.final_norm is not None:
            h = self.final_norm(h)
        h = self.dropout(h)
        if return_kv:
            return h.transpose(0, 1), new_memory, new_memory_kv
        return h.transpose(0, 1), new_memory
