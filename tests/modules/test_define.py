import math
import re

import pytest
import torch
import torch.nn.functional as F

from define_fairseq.modules import DeFINE
from define_fairseq.modules.define.unit import VARIANTS

torch.manual_seed(0)


def paper_widths(n, k, depth, groups):
    """Expansion widths spaced linearly from n to k (last exactly k), rounded up to the layer's groups."""
    widths = []
    for layer in range(1, depth):
        exact = n + (k - n) * layer / (depth - 1)
        widths.append(k if layer == depth - 1 else math.ceil(exact / groups[layer - 1]) * groups[layer - 1])
    return widths


def closed_form_params(n, k, m, depth, g_max, variant):
    """sum_l n^l k^l / g^l (weights) + k^l (biases) + 2 k^l (norm affine, expansion layers only); ``n m`` for
    the projective map."""
    if variant == "projective":
        return n * m
    if variant == "lt":
        groups = [1] * depth
    elif variant == "glt":
        groups = [g_max] * depth
    else:
        groups = [max(g_max // 2 ** (l - 1), 1) for l in range(1, depth + 1)]  # Eq. (1), l = 1..N
    outs = paper_widths(n, k, depth, groups) + [m]
    skip = variant in ("define", "define_concat")
    total = 0
    for l in range(depth):
        inp = n if l == 0 else (n + outs[l - 1] if skip else outs[l - 1])
        total += inp * outs[l] // groups[l] + outs[l]
        if l < depth - 1:
            total += 2 * outs[l]
    return total


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "n,k,m,depth,g_max",
    [(128, 1024, 512, 3, 4), (256, 1024, 256, 3, 4), (128, 1024, 400, 7, 4), (64, 512, 256, 4, 8), (32, 64, 48, 2, 2)],
)
def test_parameter_count_matches_formula(variant, n, k, m, depth, g_max):
    unit = DeFINE(n, k, m, depth=depth, max_groups=g_max, variant=variant)
    assert sum(p.numel() for p in unit.parameters()) == closed_form_params(n, k, m, depth, g_max, variant)


def test_paper_base_layout():
    # WMT14 setting n=128, k=1024, m=512, N=3, g_max=4: groups 4, 2, 1 (Eq. 1), widths 576, 1024, then m.
    unit = DeFINE(128, 1024, 512, depth=3, max_groups=4)
    assert [(l.in_features, l.out_features, l.groups) for l in unit.layers] == [
        (128, 576, 4),
        (128 + 576, 1024, 2),
        (128 + 1024, 512, 1),
    ]


def literal_define(unit, e):
    """Re-computation of the DeFINE unit from the paper's description, group by group, with explicit loops."""

    def group_transform(x, layer):
        g = layer.groups
        xs = x.chunk(g, dim=-1)
        ys = [xs[j] @ layer.weight[j] for j in range(g)]
        return torch.cat(ys, dim=-1) + layer.bias

    def group_norm(h, norm, g):
        parts = []
        for j, part in enumerate(h.chunk(g, dim=-1)):
            mu = part.mean(-1, keepdim=True)
            var = part.var(-1, unbiased=False, keepdim=True)
            parts.append((part - mu) / torch.sqrt(var + 1e-5))
        return torch.cat(parts, dim=-1) * norm.weight + norm.bias

    h = group_transform(e, unit.layers[0])
    for l in range(1, len(unit.layers)):
        h = F.gelu(group_norm(h, unit.norms[l - 1], unit.layers[l - 1].groups))
        g = unit.layers[l].groups
        mixed = []
        for a, b in zip(e.chunk(g, dim=-1), h.chunk(g, dim=-1)):  # [e_1; h_1; e_2; h_2; ...]
            mixed += [a, b]
        h = group_transform(torch.cat(mixed, dim=-1), unit.layers[l])
    return h


@pytest.mark.parametrize("depth,g_max", [(3, 4), (4, 8), (2, 2)])
def test_forward_matches_literal_recomputation(depth, g_max):
    unit = DeFINE(32, 128, 48, depth=depth, max_groups=g_max)
    with torch.no_grad():  # non-trivial norm affine
        for norm in unit.norms:
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    e = torch.randn(2, 5, 32)
    torch.testing.assert_close(unit(e), literal_define(unit, e), rtol=1e-5, atol=1e-5)


def changed_groups(unit, e, chunk, chunks):
    """Which output groups of layer 2 change when input chunk ``chunk`` (of ``chunks``) is perturbed."""
    outputs = []
    hook = unit.layers[1].register_forward_hook(lambda mod, inp, out: outputs.append(out))
    perturbed = e.clone()
    width = e.shape[-1] // chunks
    perturbed[..., chunk * width : (chunk + 1) * width] += 1.0
    with torch.no_grad():
        unit(e)
        unit(perturbed)
    hook.remove()
    g = unit.layers[1].groups
    diff = (outputs[0] - outputs[1]).abs().reshape(-1, g, outputs[0].shape[-1] // g).amax(dim=(0, 2))
    return [j for j in range(g) if diff[j] > 1e-6]


def test_mixer_routes_each_input_chunk_to_its_group():
    # Layer 2 has 2 groups: group j must see only chunk j of the input e (and layer 1's groups built from it).
    unit = DeFINE(32, 128, 48, depth=3, max_groups=4, variant="define")
    e = torch.randn(4, 32)
    assert changed_groups(unit, e, 0, 2) == [0]
    assert changed_groups(unit, e, 1, 2) == [1]


def test_plain_concat_does_not_route_by_group():
    # Without the mixer, layer 2's first group holds all of e and the second sees layer-1 features built
    # from e's first half too, so perturbing that half changes both groups.
    unit = DeFINE(32, 128, 48, depth=3, max_groups=4, variant="define_concat")
    e = torch.randn(4, 32)
    assert changed_groups(unit, e, 0, 2) == [0, 1]


def test_projective_variant_is_one_bias_free_linear_map():
    unit = DeFINE(32, 128, 48, depth=3, variant="projective")
    assert [(l.in_features, l.out_features, l.groups, l.bias) for l in unit.layers] == [(32, 48, 1, None)]
    e = torch.randn(2, 5, 32)
    torch.testing.assert_close(unit(e), e @ unit.layers[0].weight[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(n=64, k=1021, m=512, depth=3, max_groups=4), "k=1021: is not divisible by the 2 groups"),
        (dict(n=64, k=1024, m=511, depth=2, max_groups=4), "m=511: is not divisible by the 2 groups"),
        (dict(n=62, k=1024, m=512, depth=3, max_groups=4), "n=62: is not divisible by the 4 groups"),
        (dict(n=64, k=1024, m=512, depth=3, max_groups=3), "max_groups=3: must be a power of two"),
        (dict(n=2048, k=1024, m=512, depth=3, max_groups=4), "n=2048: is larger than the expansion width k=1024"),
        (dict(n=64, k=1024, m=512, depth=1, max_groups=4), "depth=1: DeFINE needs at least 2 layers"),
        (dict(n=64, k=1024, m=512, depth=3, max_groups=4, variant="shuffle"), "variant='shuffle': unknown"),
        (dict(n=64, k=1024, m=512, depth=3, max_groups=4, activation="mish"), "activation='mish': unknown"),
        (dict(n=64, k=1024, m=512, norm="batch"), "norm='batch': unknown"),
        (dict(n=64, k=1024, m=512, init="xavier"), "init='xavier': unknown"),
        (dict(n=64, k=1024, m=512, dropout=1.0), "dropout=1.0: a dropout probability"),
    ],
)
def test_impossible_configs_raise_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        DeFINE(**kwargs)
    assert "--" not in str(error.value)  # the module knows its arguments; models name their flags


@pytest.mark.parametrize("variant", ["define", "hgt", "lt", "projective"])
def test_unit_init_gives_outputs_of_unit_scale_for_unit_inputs(variant):
    torch.manual_seed(0)
    unit = DeFINE(64, 256, 128, variant=variant).eval()
    after_unit = torch.rand(3)
    torch.manual_seed(0)
    linear = DeFINE(64, 256, 128, variant=variant, init="linear").eval()
    assert torch.equal(torch.rand(3), after_unit)  # the probe leaves the global random stream alone
    e = torch.randn(4000, 64)  # 512,000 outputs: the root mean square is known to well under 5% either way
    with torch.no_grad():
        assert 0.95 < unit(e).pow(2).mean().sqrt() < 1.05
        assert 0.2 < linear(e).pow(2).mean().sqrt() < 0.7
    # only the last layer differs, by one factor
    for a, b in zip(unit.layers[:-1], linear.layers[:-1]):
        assert torch.equal(a.weight, b.weight)
    ratio = unit.layers[-1].weight / linear.layers[-1].weight
    torch.testing.assert_close(ratio, ratio.flatten()[0].expand_as(ratio))


# -- the output norm ---------------------------------------------------------------------------------------------


def test_by_default_the_output_is_the_reduce_layers_and_the_unit_has_no_output_norm():
    unit = DeFINE(16, 64, 24)
    assert unit.output_norm is None
    assert not [key for key in unit.state_dict() if key.startswith("output_norm")]


def test_the_output_norm_is_a_layer_norm_of_the_reduce_layers_output():
    torch.manual_seed(3)
    plain = DeFINE(16, 64, 24)
    normed = DeFINE(16, 64, 24, output_norm="layer")
    normed.load_state_dict(plain.state_dict(), strict=False)  # the same unit, plus its output norm
    with torch.no_grad():  # a gain and a bias that are not the identity's
        normed.output_norm.weight.uniform_(0.5, 1.5)
        normed.output_norm.bias.uniform_(-0.5, 0.5)
    e = torch.randn(5, 7, 16, dtype=torch.float64)
    plain, normed = plain.double(), normed.double()
    norm = normed.output_norm
    expected = F.layer_norm(plain(e), (24,), norm.weight, norm.bias, norm.eps)
    torch.testing.assert_close(normed(e), expected, rtol=1e-12, atol=1e-12)
    assert sum(p.numel() for p in normed.parameters()) == sum(p.numel() for p in plain.parameters()) + 2 * 24


def test_the_output_norm_holds_the_output_at_unit_scale_whatever_the_input_scale():
    # the unit's gain and bias start as the identity's: every position has mean 0 and variance v / (v + eps)
    torch.manual_seed(4)
    unit = DeFINE(16, 64, 24, output_norm="layer").double()
    for scale in (1e-2, 1.0, 1e3):
        y = unit(scale * torch.randn(50, 16, dtype=torch.float64))
        torch.testing.assert_close(y.mean(-1), torch.zeros(50, dtype=torch.float64), rtol=0, atol=1e-12)
        assert y.var(-1, unbiased=False).sub(1).abs().max() < 1e-3  # eps 1e-5 against a variance far above it


def test_an_unknown_output_norm_is_refused():
    with pytest.raises(ValueError, match=re.escape("output_norm='batch': unknown")):
        DeFINE(16, 64, 24, output_norm="batch")
