"""The DeFINE unit (Mehta et al., ICLR 2020): hierarchical group transform with the split-and-mix skip.

Choices where the paper is silent:

* ``depth`` (N) counts every transformation layer, and the last one is the reduce to ``m``: layers
  1..N-1 expand from ``n`` to ``k``, layer N reduces to ``m``. This is what Figs. 3, 5 and 8-11 show
  (N=3: two expansion layers with 4 and 2 groups, then the reduction layer) and what the authors' code does.
* Layer l uses ``g_l = max(g_max / 2**(l-1), 1)`` groups (Eq. 1), the reduce layer included.
* Expansion widths are ``linspace(n, k, N)[1:]``: they grow linearly and the last one is exactly ``k``;
  an intermediate width is rounded up to a multiple of its layer's groups.
* Every layer after the first receives ``e`` (the map output) mixed with the previous layer's output;
  the reduce layer too (Fig. 5c).
* Each expansion layer is followed by a per-group LayerNorm (groups stay independent), an activation
  (GELU) and dropout; the reduce layer is linear. All layers have a bias.
* ``output_norm="layer"`` (not the default) adds a LayerNorm over the reduce layer's output, as the authors' unit
  normalises its output layer: it holds the context model's input at unit scale, where the linear output may grow
  with training (into an LSTM, far enough to saturate its gates).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from define_fairseq.modules.checks import ParameterError, check_choice, check_probability
from define_fairseq.modules.define.group_linear import GroupLinear

VARIANTS = ("define", "define_concat", "hgt", "glt", "lt", "projective")
"""``define``: HGT + split-and-mix skip (the paper's DeFINE). ``define_concat``: HGT + plain concatenation of
the input and the previous output (Fig. 5d, "without mixer"). ``hgt``: HGT, no skip. ``glt``: every layer
uses ``max_groups`` groups, no skip. ``lt``: dense layers (one group), no skip. ``projective``: one bias-free
linear map ``n -> m`` (the plain factorisation, Transformer-XL's projective embedding; ``k`` and ``depth``
unused). The authors' unit is :class:`~define_fairseq.modules.define.delight.DelightDeFINE`."""

ACTIVATIONS = {
    "gelu": F.gelu,
    "relu": F.relu,
    "swish": F.silu,
    "tanh": torch.tanh,
    "none": None,
}
NORMS = ("group", "layer", "none")
OUTPUT_NORMS = ("none", "layer")
INITS = ("unit", "linear")
"""``unit``: ``nn.Linear``'s initialisation, then the last layer scaled so that the unit maps unit-variance inputs to
unit-variance outputs, the scale of the embedding it replaces. ``linear``: ``nn.Linear``'s alone (output variance
about 0.2)."""


def _is_power_of_two(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


class GroupLayerNorm(nn.Module):
    """LayerNorm over each of ``groups`` contiguous chunks, with a per-feature affine of size ``features``.

    Shapes: ``[..., features] -> [..., features]``.
    """

    def __init__(self, features: int, groups: int, eps: float = 1e-5):
        super().__init__()
        self.groups = groups
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # group_norm over [N, features] rows normalises each group of a row as LayerNorm does, and applies the
        # per-feature affine in the same kernel: one operation each way instead of a LayerNorm and an addcmul
        y = F.group_norm(x.reshape(-1, x.shape[-1]), self.groups, self.weight, self.bias, self.eps)
        return y.view(x.shape)


def split_and_mix(e: torch.Tensor, h: torch.Tensor, groups: int) -> torch.Tensor:
    """Interleave ``groups`` chunks of ``e`` and ``h``: ``[e_1; h_1; e_2; h_2; ...]``.

    Shapes: ``e [..., n]``, ``h [..., w]`` -> ``[..., n + w]``; group j of the next layer sees ``[e_j; h_j]``.
    """
    if groups == 1:
        return torch.cat([e, h], dim=-1)
    lead = e.shape[:-1]
    mixed = torch.cat([e.reshape(*lead, groups, -1), h.reshape(*lead, groups, -1)], dim=-1)
    return mixed.reshape(*lead, e.shape[-1] + h.shape[-1])


def define_layer_sizes(n: int, k: int, m: int, depth: int, max_groups: int, variant: str = "define"):
    """Return ``[(in_features, out_features, groups), ...]`` for the ``depth`` layers of a DeFINE unit.

    Raises a :class:`ParameterError` naming the argument when the dimensions cannot work.
    """
    check_choice(variant, VARIANTS, "variant")
    if variant == "projective":
        for name, value in (("n", n), ("m", m)):
            if value < 1:
                raise ParameterError(name, value, "must be positive")
        return [(n, m, 1)]
    if depth < 2:
        raise ParameterError(
            "depth", depth, "DeFINE needs at least 2 layers (N-1 expansion layers to k, then the reduce to m)"
        )
    if not _is_power_of_two(max_groups):
        raise ParameterError("max_groups", max_groups, "must be a power of two (1, 2, 4, 8, ...)")
    for name, value in (("n", n), ("k", k), ("m", m)):
        if value < 1:
            raise ParameterError(name, value, "must be positive")
    if n > k:
        raise ParameterError(
            "n", n, "is larger than the expansion width {k}; DeFINE expands n up to k", related=dict(k=k)
        )

    if variant == "lt":
        groups = [1] * depth
    elif variant == "glt":
        groups = [max_groups] * depth
    else:
        groups = [max(max_groups // 2**layer, 1) for layer in range(depth)]
    skip = variant in ("define", "define_concat")

    if n % groups[0] != 0:
        raise ParameterError(
            "n",
            n,
            f"is not divisible by the {groups[0]} groups of the first layer "
            f"({{max_groups}}); use a multiple of {groups[0]}",
            related=dict(max_groups=max_groups),
        )
    if k % groups[depth - 2] != 0:
        raise ParameterError(
            "k",
            k,
            f"is not divisible by the {groups[depth - 2]} groups of the layer that "
            f"produces it; use a multiple of {groups[depth - 2]}",
        )
    if m % groups[-1] != 0:
        raise ParameterError(
            "m", m, f"is not divisible by the {groups[-1]} groups of the reduce layer; use a multiple of {groups[-1]}"
        )

    widths = []
    for layer in range(1, depth):
        exact = n + (k - n) * layer / (depth - 1)
        g = groups[layer - 1]
        widths.append(k if layer == depth - 1 else int(math.ceil(exact / g)) * g)
    widths.append(m)

    sizes = []
    prev = None
    for layer in range(depth):
        if layer == 0:
            in_features = n
        else:
            in_features = n + prev if skip else prev
        sizes.append((in_features, widths[layer], groups[layer]))
        prev = widths[layer]
    return sizes


class DeFINE(nn.Module):
    """Hierarchical group transform from ``n`` up to ``k`` and down to ``m``, with the split-and-mix skip.

    Args:
        n: input size (the map layer's output).
        k: largest width, reached by the last expansion layer.
        m: output size (the context model's input).
        depth: N, the number of layers including the reduce layer (>= 2).
        max_groups: g_max, the groups of the first layer (a power of two).
        variant: one of ``VARIANTS``.
        activation: one of ``ACTIVATIONS``; after each expansion layer.
        norm: ``group`` (LayerNorm per group), ``layer`` (LayerNorm over the whole width) or ``none``.
        dropout: dropout after each expansion layer.
        init: one of ``INITS``.
        output_norm: one of ``OUTPUT_NORMS``: ``layer`` normalises the output (a LayerNorm over m, with its gain
            and bias), which gives it unit variance whatever the reduce layer's scale, so ``init="unit"`` leaves that
            layer at ``nn.Linear``'s; ``none`` leaves the reduce layer's output as it is.

    Shapes: ``[..., n] -> [..., m]``.
    """

    def __init__(
        self,
        n: int,
        k: int,
        m: int,
        depth: int = 3,
        max_groups: int = 4,
        variant: str = "define",
        activation: str = "gelu",
        norm: str = "group",
        dropout: float = 0.0,
        init: str = "unit",
        output_norm: str = "none",
    ):
        super().__init__()
        check_choice(activation, ACTIVATIONS, "activation")
        check_choice(norm, NORMS, "norm")
        check_choice(output_norm, OUTPUT_NORMS, "output_norm")
        check_probability(dropout, "dropout")
        check_choice(init, INITS, "init")
        self.sizes = define_layer_sizes(n, k, m, depth, max_groups, variant)
        self.n, self.k, self.m = n, k, m
        self.variant = variant
        self.activation = activation
        self.dropout = dropout
        bias = variant != "projective"
        self.layers = nn.ModuleList(GroupLinear(i, o, g, bias=bias) for i, o, g in self.sizes)
        self.norms = nn.ModuleList()
        for _, out_features, groups in self.sizes[:-1]:
            if norm == "group":
                self.norms.append(GroupLayerNorm(out_features, groups))
            elif norm == "layer":
                self.norms.append(nn.LayerNorm(out_features))
            else:
                self.norms.append(nn.Identity())
        # None rather than an Identity: the default unit's state dict and module tree stay as they were
        self.output_norm = nn.LayerNorm(m) if output_norm == "layer" else None
        if init == "unit":
            self.scale_to_unit_output()

    @torch.no_grad()
    def scale_to_unit_output(self, probes: int = 256) -> None:
        """Scale the last layer so that standard normal inputs give outputs of unit root mean square (measured on
        ``probes`` fixed random inputs, in eval mode)."""
        last = self.layers[-1]
        if last.weight.is_meta:  # shapes only (e.g. counting parameters): no values to scale
            return
        probe = torch.randn(probes, self.n, generator=torch.Generator().manual_seed(0), device="cpu")
        was_training = self.training
        self.eval()
        rms = self(probe.to(last.weight)).pow(2).mean().sqrt()
        self.train(was_training)
        last.weight.div_(rms)
        if last.bias is not None:
            last.bias.div_(rms)

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        act = ACTIVATIONS[self.activation]
        h = self.layers[0](e)
        for layer, norm in zip(self.layers[1:], self.norms):
            h = norm(h)
            if act is not None:
                h = act(h)
            if self.training and self.dropout > 0:  # a dropout of 0 would still be dispatched as an operation
                h = F.dropout(h, self.dropout, self.training)
            if self.variant == "define":
                h = split_and_mix(e, h, layer.groups)
            elif self.variant == "define_concat":
                h = torch.cat([e, h], dim=-1)
            h = layer(h)
        if self.output_norm is not None:
            h = self.output_norm(h)
        return h

    def extra_repr(self) -> str:
        text = f"n={self.n}, k={self.k}, m={self.m}, variant={self.variant}, activation={self.activation}"
        return text + (", output_norm=layer" if self.output_norm is not None else "")
