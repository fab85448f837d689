"""Transformer-XL's relative positional attention (Dai et al., 2019) as plain ``torch.nn``: :func:`rel_shift` and
:class:`RelativeMultiheadAttention`, the attention sub-layer of :mod:`define_fairseq.modules.transformer_xl.layers`.

Each query attends over the concatenation of a *memory* (the layer's inputs for the previous ``M`` positions,
carried over from earlier segments without gradient) and the current segment of ``T`` positions, so there are
``K = M + T`` keys. Positions enter only through the attention score, as a function of the distance between
query and key ("relative partial learnable" attention)::

    score(i, j) = (q_i + u) · k_j  +  (q_i + v) · r_{M+i-j}          (then / sqrt(head_dim))

with ``u = r_w_bias`` and ``v = r_r_bias`` shared by all layers, and ``r_d = r_net(sinusoid(d))``. The second
term is computed for all distances at once against ``r`` ordered by decreasing distance ``[K-1, ..., 0]`` and
then realigned per query by :func:`rel_shift`.

Layouts: time-first ``[T, B, d]``; memories are ``[M, B, d]``. Masks are ``[T, K]`` bools, ``True`` where a query
may NOT attend.
"""

import math
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from define_fairseq.modules.checks import check_positive, check_probability


def rel_shift(scores: torch.Tensor) -> torch.Tensor:
    """Realign position scores computed against distances ``[K-1, ..., 0]`` to key positions.

    ``scores [B, H, T, K]`` holds at ``[.., i, k]`` the score of query ``i`` against the encoding of distance
    ``K-1-k``. Returns ``[B, H, T, K]`` whose ``[.., i, j]`` is the score of query ``i`` against distance
    ``M + i - j`` (``M = K - T``), i.e. ``scores[.., i, j + T-1-i]``, for every ``j <= M + i``. Entries with
    ``j > M + i`` (future keys) hold unrelated values and must be masked.

    Done without a gather: prepend a zero column (``[.., T, K+1]``), read the buffer as ``[.., K+1, T]``, drop
    its first row and read the rest as ``[.., T, K]``; this shifts row ``i`` left by ``T-1-i``.
    """
    *lead, t, k = scores.shape
    padded = torch.cat([scores.new_zeros(*lead, t, 1), scores], dim=-1)
    padded = padded.view(*lead, k + 1, t)
    return padded[..., 1:, :].reshape(*lead, t, k)


class RelativeMultiheadAttention(nn.Module):
    """Transformer-XL's relative multi-head attention sub-layer, residual and LayerNorm included.

    Parameters (no biases): ``qkv`` ``d_model -> 3*H*dh``, ``r_net`` ``d_model -> H*dh`` (the position
    encodings' projection), ``out`` ``H*dh -> d_model``; plus ``layer_norm`` over ``d_model``. ``H*dh`` need not
    equal ``d_model``.

    Post-norm: ``LayerNorm(x + attn(x))``; pre-norm: ``x + attn(LayerNorm(.))`` where the LayerNorm is applied to
    ``cat(memory, x)`` before the key/value/query projections (as the original).

    Args:
        d_model: model width d.
        num_heads: H.
        head_dim: dh, the width of one head.
        dropout: dropout on the attention output (before the residual).
        attention_dropout: dropout on the attention probabilities.
        pre_norm: pre-norm instead of post-norm residual.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        pre_norm: bool = False,
    ):
        super().__init__()
        check_positive(d_model, "d_model")
        check_positive(num_heads, "num_heads")
        check_positive(head_dim, "head_dim")
        check_probability(dropout, "dropout")
        check_probability(attention_dropout, "attention_dropout")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.pre_norm = pre_norm
        self.scale = 1.0 / math.sqrt(head_dim)
        inner = num_heads * head_dim
        self.qkv = nn.Linear(d_model, 3 * inner, bias=False)
        self.r_net = nn.Linear(d_model, inner, bias=False)
        self.out = nn.Linear(inner, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.attention_dropout = nn.Dropout(attention_dropout)

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
        """Attend from ``x`` over ``cat(memory, x)``.

        Args:
            x: ``[T, B, d]`` the segment.
            pos: ``[K, d]`` sinusoidal encodings of the distances ``[K-1, ..., 0]``, ``K = M + T``.
            r_w_bias, r_r_bias: ``[H, dh]`` the content and position biases (u and v of the paper).
            mask: ``[T, K]`` bool, ``True`` where query ``i`` may not attend key ``j``.
            memory: ``[M, B, d]`` or ``None`` (M = 0).
            memory_kv: the keys and values ``([M, B, H*dh], [M, B, H*dh])`` of ``memory``, as an earlier call
                with ``return_kv`` gave them; they are then not computed again (valid while the weights have not
                changed: evaluation).
            return_kv: also return the keys and values of ``cat(memory, x)``.

        Returns ``[T, B, d]``, or with ``return_kv`` ``([T, B, d], (keys [K, B, H*dh], values [K, B, H*dh]))``.
        """
        t, b, _ = x.shape
        m = 0 if memory is None else memory.size(0)
        h, dh = self.num_heads, self.head_dim
        q, key, value = self.qkv(self.layer_norm(x) if self.pre_norm else x).chunk(3, dim=-1)
        if memory_kv is not None:
            if memory_kv[0].shape != (m, b, h * dh) or memory_kv[1].shape != (m, b, h * dh):
                raise ValueError(
                    f"memory_kv must be two [M, B, H*dh] = [{m}, {b}, {h * dh}] tensors, got "
                    f"{list(memory_kv[0].shape)} and {list(memory_kv[1].shape)}"
                )
            memory_key, memory_value = memory_kv
        elif m > 0:
            # The memory needs keys and values only (no queries, and no gradient of its own in training): it
            # goes through the key/value rows of the weight alone rather than cat(memory, x) through all of it.
            memory_key, memory_value = F.linear(
                self.layer_norm(memory) if self.pre_norm else memory, self.qkv.weight[h * dh :]
            ).chunk(2, dim=-1)
        if m > 0:
            key = torch.cat([memory_key, key], dim=0)
            value = torch.cat([memory_value, value], dim=0)
        k = key.size(0)
        if pos.shape != (k, self.d_model):
            raise ValueError(f"pos must be [K, d_model] = [{k}, {self.d_model}], got {list(pos.shape)}")
        if mask.shape != (t, k):
            raise ValueError(f"mask must be [T, K] = [{t}, {k}], got {list(mask.shape)}")
        keys_values = (key, value)
        q = q.reshape(t, b, h, dh)
        key = key.reshape(k, b, h, dh)
        value = value.reshape(k, b, h, dh)
        r = self.r_net(pos).view(k, h, dh)

        content = torch.einsum("ibhd,jbhd->bhij", q + r_w_bias, key)  # [B, H, T, K]
        position = rel_shift(torch.einsum("ibhd,jhd->bhij", q + r_r_bias, r))  # [B, H, T, K]
        scores = (content + position) * self.scale
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
        half = scores.dtype in (torch.float16, torch.bfloat16)  # normalise half precision in float32
        probs = F.softmax(scores, dim=-1, dtype=torch.float32 if half else None).to(scores.dtype)
        probs = self.attention_dropout(probs)
        attended = torch.einsum("bhij,jbhd->ibhd", probs, value).reshape(t, b, h * dh)
        attended = self.dropout(self.out(attended))
        out = x + attended if self.pre_norm else self.layer_norm(x + attended)
        return (out, keys_values) if return_kv else out
