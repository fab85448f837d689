"""The DeFINE unit as the authors' code builds it (``DExTraUnit`` in the paper's configuration, sacmehta/delight).

It keeps the paper's group transforms and split-and-mix (:func:`split_and_mix`) and adds, around them, what the
paper's text does not describe (docs/define.md)::

    x = act(LN(W_in e + b))                       dense n -> m/2: the input of the stack and the skip source
    h = act(LN_g(GLT_1(x)))                        every layer: bias, LayerNorm per group, activation, dropout
    h = act(LN_g(GLT_l(mix(x, h, g_l))))           l = 2..N; GLT_N reduces to m with one group
    out = act(LN(W_out [x; h] + b))                dense (m/2 + m) -> m

Groups: powers of two that double up to ``max_groups`` and wrap around, read from the last layer backwards
(N=3, g_max=4: 4, 2, 1; N=7: 1, 4, 2, 1, 4, 2, 1). Widths: ``floor(linspace(m/2, k, N))[1:N-1]``, each rounded up
to a multiple of max(its groups, the next layer's groups, 8). The per-group LayerNorm normalises each group's
``out/g`` features with one affine of ``out/g`` shared by the groups. Weights are Xavier-uniform over the tensors
as the authors lay them out (``[g, in/g, out/g]`` for a group layer, ``[out, in]`` for a dense one), biases zero.
"""

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from define_fairseq.modules.checks import ParameterError, check_choice, check_probability
from define_fairseq.modules.define.group_linear import GroupLinear
from define_fairseq.modules.define.unit import ACTIVATIONS, split_and_mix

MIN_GROUP_WIDTH = 8  # the authors round every expansion width to a multiple of 8 (for tensor cores)


def delight_groups(depth: int, max_groups: int):
    """The authors' group schedule: 1, 2, 4, ... up to ``max_groups``, wrapping to 1, reversed."""
    groups, exponent = [], 0
    for _ in range(depth):
        g = 2**exponent
        if g <= max_groups:
            exponent += 1
        else:
            g, exponent = 1, 1
        groups.append(g)
    return groups[::-1]


def delight_layer_sizes(n: int, k: int, m: int, depth: int, max_groups: int):
    """``[(in_features, out_features, groups), ...]`` of the ``depth`` group layers (the input and output dense
    layers not included). Raises a :class:`ParameterError` naming the argument when the sizes cannot work."""
    if depth < 2:
        raise ParameterError("depth", depth, "the authors' unit needs at least 2 layers")
    if m % 2 or m < 2:
        raise ParameterError("m", m, "the authors' unit projects the table to m/2: the width m must be even")
    if max_groups < 1 or max_groups & (max_groups - 1):
        raise ParameterError("max_groups", max_groups, "must be a power of two (1, 2, 4, 8, ...)")
    half = m // 2
    groups = delight_groups(depth, max_groups)
    for name, value in (("n", n), ("k", k)):
        if value < 1:
            raise ParameterError(name, value, "must be positive")
    if half % max(groups) != 0:
        raise ParameterError(
            "m",
            m,
            f"the authors' unit works at m/2 = {half}, which is not divisible by the "
            f"{max(groups)} groups of its layers; use a multiple of {2 * max(groups)}",
        )
    grid = np.linspace(half, k, depth).astype(np.int64).tolist()[1:]
    sizes, width_in = [], half
    for layer in range(depth):
        if layer < depth - 1:
            multiple = max(groups[layer], groups[layer + 1], MIN_GROUP_WIDTH)
            width_out = int(math.ceil(grid[layer] / multiple)) * multiple
        else:
            width_out = m
        sizes.append((width_in, width_out, groups[layer]))
        width_in = half + width_out
    return sizes


class _Dense(nn.Module):
    """``act(LN(W x + b))``, then dropout: the authors' dense layer with its normalisation and activation."""

    def __init__(self, in_features: int, out_features: int, norm: bool, activation: str, dropout: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features) if norm else nn.Identity()
        self.activation = ACTIVATIONS[activation]
        self.dropout = dropout
        nn.init.xavier_uniform_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x):
        x = self.norm(self.linear(x))
        if self.activation is not None:
            x = self.activation(x)
        return F.dropout(x, self.dropout, self.training)


class DelightDeFINE(nn.Module):
    """The authors' DeFINE unit (see the module docstring).

    Args:
        n: input size (the map layer's output).
        k: largest width of the group layers.
        m: output size (the context model's input); must be even.
        depth: N, the number of group layers including the reduce layer (>= 2).
        max_groups: g_max (a power of two).
        activation: one of ``ACTIVATIONS``, after every layer (the authors' models use ``swish``).
        norm: ``group`` (LayerNorm per group, the authors') or ``none``.
        dropout: dropout after every layer.

    Shapes: ``[..., n] -> [..., m]``.
    """

    variant = "delight"

    def __init__(
        self,
        n: int,
        k: int,
        m: int,
        depth: int = 3,
        max_groups: int = 4,
        activation: str = "swish",
        norm: str = "group",
        dropout: float = 0.0,
    ):
        super().__init__()
        check_choice(activation, ACTIVATIONS, "activation")
        if norm not in ("group", "none"):
            raise ParameterError(
                "norm", repr(norm), "the authors' unit normalises per group ('group') or not at all ('none')"
            )
        check_probability(dropout, "dropout")
        self.sizes = delight_layer_sizes(n, k, m, depth, max_groups)
        self.n, self.k, self.m = n, k, m
        self.activation = activation
        self.dropout = dropout
        half = m // 2
        self.input_layer = _Dense(n, half, norm == "group", activation, dropout)
        self.layers = nn.ModuleList(GroupLinear(i, o, g) for i, o, g in self.sizes)
        self.norms = nn.ModuleList(nn.LayerNorm(o // g) if norm == "group" else nn.Identity() for _, o, g in self.sizes)
        self.output_layer = _Dense(half + m, m, norm == "group", activation, dropout)
        for layer in self.layers:
            # The authors' Xavier init is over their tensors: [g, in/g, out/g], or [out, in] for one group.
            weight = layer.weight if layer.groups > 1 else layer.weight.view(layer.in_features, -1).t()
            nn.init.xavier_uniform_(weight)
            nn.init.zeros_(layer.bias)

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        act = ACTIVATIONS[self.activation]
        x = self.input_layer(e)
        h = x
        for index, (layer, norm) in enumerate(zip(self.layers, self.norms)):
            if index > 0:
                h = split_and_mix(x, h, layer.groups)
            h = layer(h)
            h = norm(h.unflatten(-1, (layer.groups, -1))).flatten(-2)
            if act is not None:
                h = act(h)
            h = F.dropout(h, self.dropout, self.training)
        return self.output_layer(torch.cat([x, h], dim=-1))

    def extra_repr(self) -> str:
        return f"n={self.n}, k={self.k}, m={self.m}, variant=delight, activation={self.activation}"
