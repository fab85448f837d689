"""Gated convolutional networks for language modelling (Dauphin et al., 2017), as plain ``torch.nn`` modules.

A layer is a causal convolution over time followed by a gate; for the gated linear unit (GLU)::

    h(X) = (X * W + b) ⊗ σ(X * V + c)          (* convolution over time, ⊗ element-wise product)

computed as one convolution with 2n output channels split into the value and the gate halves. The
convolution is causal: the input is padded with k - 1 zeros on the left, so position t sees inputs t-k+1 .. t
and never a later one. Every convolution is weight-normalised (Salimans & Kingma, 2016): ``W = g · v / ||v||``
with one ``g`` per output channel (value and gate channels separately).

Layers are grouped into pre-activation residual blocks, ``y = scale · (x + F(x))`` with nothing applied after
the sum: a block is either one layer or a bottleneck (e.g. 1×1 reduce, k×1, 1×1 expand). Where a block changes
the width, the skip goes through a weight-normalised 1×1 projection. ``scale`` is 1 in the paper (fairseq's
``fconv_lm`` uses √0.5).

Everything works in the batch-first layout ``[B, T, C]``. A k > 1 convolution is one matrix product over the
k stacked time steps (im2col), as fast on CPU as ``torch.conv_tbc`` and faster than ``conv1d`` for these
sizes (see ``benchmarks/gcnn_speed.py``); a 1×1 convolution is a plain linear layer. For token-by-token
decoding each layer keeps the last k - 1 inputs it has seen (its *history*); with the history a step costs one
matrix-vector product per layer, and the result equals the full pass exactly.
"""

import ast
import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from define_fairseq.modules.checks import check_probability
from define_fairseq.modules.parameter_cache import ParameterCache

ACTIVATIONS = ("glu", "gtu", "bilinear", "relu", "tanh", "linear")
GATED_ACTIVATIONS = ("glu", "gtu", "bilinear")  # these read 2n channels: value and gate

Block = List[Tuple[int, int]]  # [(width, kernel), ...]: the layers of one residual block


# -- the layer specification --------------------------------------------------------------------------------


def _literal(node: ast.AST, text: str, name: str):
    """Evaluate a Python literal of ints, tuples and lists with ``+`` and ``*`` (and nothing else)."""
    if isinstance(node, ast.Expression):
        return _literal(node.body, text, name)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e, text, name) for e in node.elts)
    if isinstance(node, ast.List):
        return [_literal(e, text, name) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _literal(node.left, text, name), _literal(node.right, text, name)
        try:
            return left + right if isinstance(node.op, ast.Add) else left * right
        except TypeError:
            pass
    raise ValueError(
        f"{name} {text!r}: only integers, (width, kernel) tuples, lists, + and * are allowed, e.g. "
        f'"[(850, 6)] * 3 + [[(128, 1), (128, 5), (512, 1)]]"'
    )


def parse_layer_spec(spec: Union[str, Sequence], name: str = "blocks") -> List[Block]:
    """The residual blocks described by ``spec``, checked.

    ``spec`` is a list (or its Python text, ``+`` and ``*`` allowed) whose elements are either a ``(width,
    kernel)`` tuple, a block of one layer, or a list of such tuples, a bottleneck block with one residual
    around it. The order (width, kernel) is that of fairseq's ``fconv_lm`` layer specs.

    Raises ``ValueError`` naming ``name`` for a malformed spec, a width or kernel below 1, or a bottleneck whose
    inner layers are wider than the block's output.
    """
    text = spec if isinstance(spec, str) else repr(spec)
    if isinstance(spec, str):
        try:
            spec = _literal(ast.parse(spec.strip(), mode="eval"), text, name)
        except SyntaxError:
            raise ValueError(
                f'{name} {text!r} is not a Python list of (width, kernel) tuples, e.g. "[(850, 6)] * 3 + [(1024, 4)]"'
            ) from None
    if not isinstance(spec, (list, tuple)) or len(spec) == 0:
        raise ValueError(f"{name} {text!r}: give a non-empty list of blocks")
    if isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(v, int) for v in spec):
        spec = [spec]  # a single (width, kernel) layer

    def layer(item, where: str) -> Tuple[int, int]:
        if not (isinstance(item, tuple) and len(item) == 2 and all(isinstance(v, int) for v in item)):
            raise ValueError(f"{name} {text!r}: {where} is {item!r}; a layer is a (width, kernel) tuple of integers")
        width, kernel = item
        if width < 1:
            raise ValueError(f"{name} {text!r}: {where} has width {width}; a layer needs at least 1 channel")
        if kernel < 1:
            raise ValueError(
                f"{name} {text!r}: {where} has kernel width {kernel}; a causal convolution needs a "
                f"kernel of at least 1 (1 = a position-wise layer)"
            )
        return width, kernel

    blocks: List[Block] = []
    for b, item in enumerate(spec):
        if isinstance(item, list):
            if not item:
                raise ValueError(f"{name} {text!r}: block {b} is empty")
            block = [layer(sub, f"layer {i} of block {b}") for i, sub in enumerate(item)]
            out = block[-1][0]
            for i, (width, _) in enumerate(block[:-1]):
                if width > out:
                    raise ValueError(
                        f"{name} {text!r}: bottleneck block {b} widens to {width} channels inside (layer {i}) but "
                        f"ends with {out}; the inner layers of a bottleneck must not be wider than its output"
                    )
        else:
            block = [layer(item, f"block {b}")]
        blocks.append(block)
    return blocks


def receptive_field(blocks: Sequence[Block]) -> int:
    """Tokens one output position sees, itself included: ``1 + sum(kernel - 1)`` over all layers."""
    return 1 + sum(kernel - 1 for block in blocks for _, kernel in block)


# -- layers ---------------------------------------------------------------------------------------------


class CausalConv1d(nn.Module):
    """A causal, weight-normalised convolution over time. Shapes: ``x [B, T, in_dim] -> [B, T, out_dim]``.

    The weight has the "linearised" layout ``[out_dim, kernel * in_dim]``: column block ``j`` multiplies the
    input ``kernel - 1 - j`` steps back. With ``weight_norm`` the parameters are ``weight_v`` (same layout)
    and ``weight_g [out_dim]``, and ``weight = weight_g · weight_v / ||weight_v||`` (norm per output channel);
    without, the parameter is ``weight`` itself. Under ``torch.no_grad`` the normalised weight is computed once
    and reused until ``weight_v`` or ``weight_g`` changes (:class:`ParameterCache`).

    ``init_gain``: ``weight_v`` is drawn from N(0, init_gain / (kernel · in_dim)) (He et al.'s initialisation,
    with the gain of the activation that follows); the bias starts at zero.
    """

    def __init__(self, in_dim: int, out_dim: int, kernel: int, weight_norm: bool = True, init_gain: float = 1.0):
        super().__init__()
        if kernel < 1 or in_dim < 1 or out_dim < 1:
            raise ValueError(f"CausalConv1d({in_dim}, {out_dim}, kernel={kernel}): sizes and kernel must be >= 1")
        self.in_dim, self.out_dim, self.kernel = in_dim, out_dim, kernel
        self.weight_norm = weight_norm
        v = torch.randn(out_dim, kernel * in_dim) * math.sqrt(init_gain / (kernel * in_dim))
        if weight_norm:
            self.weight_v = nn.Parameter(v)
            self.weight_g = nn.Parameter(v.norm(dim=1))
        else:
            self.weight = nn.Parameter(v)
        self.bias = nn.Parameter(torch.zeros(out_dim))
        self._weight = ParameterCache()  # the normalised weight, reused without autograd while v and g stay

    def normalized_weight(self) -> Tensor:
        """The effective weight ``[out_dim, kernel * in_dim]``."""
        if not self.weight_norm:
            return self.weight
        if torch.is_grad_enabled():
            self._weight.clear()
            return self._normalize()
        return self._weight.get((self.weight_v, self.weight_g), self._normalize)

    def _normalize(self) -> Tensor:
        # g · v / ||v|| per row, as one fused kernel with a fused backward (the op behind PyTorch's own weight
        # norm): half the time of the same formula written with norm, div and mul for GCNN-14's layers
        return torch._weight_norm(self.weight_v, self.weight_g.unsqueeze(1), 0)

    def forward(self, x: Tensor, history: Optional[Tensor] = None) -> Tensor:
        """``x [B, T, in_dim]``; ``history [B, kernel - 1, in_dim]``: the inputs just before ``x`` (None: the
        sequence starts with ``x``, i.e. zeros). Returns ``[B, T, out_dim]``."""
        if self.kernel == 1:
            return F.linear(x, self.normalized_weight(), self.bias)
        if history is None:
            return self.over_window(F.pad(x, (0, 0, self.kernel - 1, 0)))
        return self.over_window(torch.cat([history, x], dim=1))

    def over_window(self, window: Tensor) -> Tensor:
        """The outputs whose whole receptive field lies in ``window [B, T + kernel - 1, in_dim]``: ``[B, T,
        out_dim]`` (no padding)."""
        k, weight = self.kernel, self.normalized_weight()
        B, T = window.size(0), window.size(1) - k + 1
        if T == 1:  # one decoding step: a matrix-vector product per sequence
            return F.linear(window.reshape(B, 1, k * self.in_dim), weight, self.bias)
        columns = window.unfold(1, k, 1).transpose(2, 3).reshape(B, T, k * self.in_dim)  # [B, T, k * in]
        return F.linear(columns, weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_dim}, {self.out_dim}, kernel={self.kernel}, weight_norm={self.weight_norm}"


def gate(y: Tensor, activation: str) -> Tensor:
    """The non-linearity of a layer: for the gated ones ``y [..., 2n]`` splits into value ``a`` and gate ``b``
    (glu: ``a ⊗ σ(b)``, gtu: ``tanh(a) ⊗ σ(b)``, bilinear: ``a ⊗ b``); relu, tanh and linear act on
    ``y [..., n]``."""
    if activation == "glu":
        return F.glu(y, dim=-1)
    if activation == "gtu":
        a, b = y.chunk(2, dim=-1)
        return torch.tanh(a) * torch.sigmoid(b)
    if activation == "bilinear":
        a, b = y.chunk(2, dim=-1)
        return a * b
    if activation == "relu":
        return F.relu(y)
    if activation == "tanh":
        return torch.tanh(y)
    if activation == "linear":
        return y
    raise ValueError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")


class GatedConvLayer(nn.Module):
    """Dropout, a causal convolution and its gate. Shapes: ``x [B, T, in_dim] -> [B, T, out_dim]``."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        kernel: int,
        activation: str = "glu",
        weight_norm: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        gated = activation in GATED_ACTIVATIONS
        gain = {"glu": 4.0, "gtu": 4.0, "bilinear": 1.0, "relu": 2.0}.get(activation, 1.0)
        self.conv = CausalConv1d(in_dim, 2 * out_dim if gated else out_dim, kernel, weight_norm, init_gain=gain)
        self.activation = activation
        self.dropout = dropout
        self.in_dim, self.out_dim, self.kernel = in_dim, out_dim, kernel

    def forward(self, x: Tensor, history: Optional[Tensor] = None) -> Tensor:
        """``history [B, kernel - 1, in_dim]`` as :meth:`CausalConv1d.forward` (incremental decoding, where
        dropout is off)."""
        x = F.dropout(x, self.dropout, self.training)
        return gate(self.conv(x, history), self.activation)

    def step(self, x: Tensor, history: Tensor) -> Tuple[Tensor, Tensor]:
        """Incremental decoding: ``(output [B, T, out_dim], history after x [B, kernel - 1, in_dim])`` for the new
        inputs ``x [B, T, in_dim]`` following ``history [B, kernel - 1, in_dim]`` (dropout off)."""
        if self.kernel == 1:
            return gate(self.conv(x), self.activation), history
        window = torch.cat([history, x], dim=1)
        return gate(self.conv.over_window(window), self.activation), window[:, -(self.kernel - 1) :]


class GatedConvBlock(nn.Module):
    """A pre-activation residual block: ``scale · (skip(x) + layers(x))``, ``skip`` the identity or, where the
    width changes, a weight-normalised 1×1 projection. Shapes: ``x [B, T, in_dim] -> [B, T, out_dim]``.

    ``branch_init_scale`` multiplies the initial output of ``layers`` (the value weights of the last layer)."""

    def __init__(
        self,
        in_dim: int,
        layers: Block,
        activation: str = "glu",
        weight_norm: bool = True,
        dropout: float = 0.0,
        residual_scale: float = 1.0,
        branch_init_scale: float = 1.0,
    ):
        super().__init__()
        self.layers = nn.ModuleList()
        width = in_dim
        for out, kernel in layers:
            self.layers.append(GatedConvLayer(width, out, kernel, activation, weight_norm, dropout))
            width = out
        if branch_init_scale != 1.0:  # scale the block's output at initialisation: the value half of a gated layer
            last = self.layers[-1].conv
            rows = slice(0, width)
            with torch.no_grad():
                (last.weight_g if weight_norm else last.weight)[rows] *= branch_init_scale
        self.in_dim, self.out_dim = in_dim, width
        self.projection = CausalConv1d(in_dim, width, 1, weight_norm) if width != in_dim else None
        self.residual_scale = residual_scale

    def forward(self, x: Tensor, histories: Optional[List[Tensor]] = None) -> Tuple[Tensor, Optional[List[Tensor]]]:
        """``histories``: one ``[B, kernel - 1, width]`` per layer (incremental decoding) or None (full pass).
        Returns the output and the histories after ``x`` (None in a full pass)."""
        skip = x if self.projection is None else self.projection(x)
        updated = None if histories is None else []
        for i, layer in enumerate(self.layers):
            if histories is not None:
                x, history = layer.step(x, histories[i])
                updated.append(history)
            else:
                x = layer(x)
        x = x + skip
        if self.residual_scale != 1.0:
            x = x * self.residual_scale
        return x, updated


class GatedConvStack(nn.Module):
    """The residual blocks of a gated convolutional LM. Shapes: ``x [B, T, input_dim] -> [B, T, output_dim]``.

    ``blocks`` is a list from :func:`parse_layer_spec` (it is parsed here when given as text).

    Initialisation: each of the L blocks starts with its residual branch scaled by 1/√L (unless
    ``residual_scale`` is not 1: fairseq's √0.5 scaling keeps the variance by itself). Identity skips add
    the branches' variance up, so with unscaled branches the output of GCNN-14 would start about 500 times larger
    than its input, and that of GCNN-14B about 50,000 times (sigmoid gates then saturate into denormal
    numbers, which also makes every step several times slower on CPU). With 1/√L the stack's output starts within
    a factor of two of its input for every arch; weight normalisation's ``g`` learns the scale from there.
    ``forward(x, state=None)``: with ``state=None`` a full pass where every sequence starts at ``x[:, 0]``;
    for incremental decoding pass the list of per-layer histories from :meth:`initial_state` (or from the
    previous call); the updated list is returned with the output.
    """

    def __init__(
        self,
        input_dim: int,
        blocks: Union[str, Sequence],
        activation: str = "glu",
        weight_norm: bool = True,
        dropout: float = 0.0,
        residual_scale: float = 1.0,
    ):
        super().__init__()
        check_probability(dropout, "dropout")
        blocks = parse_layer_spec(blocks)
        self.blocks = nn.ModuleList()
        width = input_dim
        branch_init_scale = len(blocks) ** -0.5 if residual_scale == 1.0 else 1.0
        for spec in blocks:
            block = GatedConvBlock(width, spec, activation, weight_norm, dropout, residual_scale, branch_init_scale)
            self.blocks.append(block)
            width = block.out_dim
        self.input_dim, self.output_dim = input_dim, width
        self.receptive_field = receptive_field(blocks)

    def layers(self) -> List[GatedConvLayer]:
        return [layer for block in self.blocks for layer in block.layers]

    def initial_state(self, batch_size: int, like: Tensor) -> List[Tensor]:
        """Zero histories (the start of a sequence): ``[batch_size, kernel - 1, in_dim]`` per layer."""
        return [like.new_zeros(batch_size, layer.kernel - 1, layer.in_dim) for layer in self.layers()]

    def forward(self, x: Tensor, state: Optional[List[Tensor]] = None) -> Tuple[Tensor, Optional[List[Tensor]]]:
        updated = None if state is None else []
        start = 0
        for block in self.blocks:
            count = len(block.layers)
            histories = None if state is None else state[start : start + count]
            x, new = block(x, histories)
            if updated is not None:
                updated.extend(new)
            start += count
        return x, updated
