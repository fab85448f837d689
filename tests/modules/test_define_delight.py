"""``--define-variant delight``: the authors' DeFINE unit (sacmehta/delight, ``DExTraUnit`` with ``--define-iclr``),
checked against a re-computation written from its description and against the parameter counts it gives."""

import math
import re

import pytest
import torch
from conftest import USER_DIR, run_module

from define_fairseq.modules.define.delight import DelightDeFINE, delight_groups, delight_layer_sizes


@pytest.mark.parametrize(
    "depth,g_max,groups",
    [
        (3, 4, [4, 2, 1]),
        (2, 4, [2, 1]),
        (7, 4, [1, 4, 2, 1, 4, 2, 1]),
        (11, 4, [2, 1, 4, 2, 1, 4, 2, 1, 4, 2, 1]),
        (4, 8, [8, 4, 2, 1]),
        (3, 1, [1, 1, 1]),
    ],
)
def test_group_schedule_doubles_up_to_the_maximum_and_wraps_from_the_last_layer(depth, g_max, groups):
    assert delight_groups(depth, g_max) == groups


def test_wmt_layout():
    # n=128, k=1024, N=3, m=512: the table goes to m/2 = 256; widths floor(linspace(256, 1024, 3))[1:] = 640, 1024,
    # then the reduce to m; every later layer also receives the 256 projected features.
    assert delight_layer_sizes(128, 1024, 512, 3, 4) == [(256, 640, 4), (896, 1024, 2), (1280, 512, 1)]


def test_widths_round_up_to_multiples_of_eight_and_of_both_layers_groups():
    # linspace(16, 100, 4) = 16, 44, 72, 100: 44 -> 48 (8), 72 -> 72, 100 -> 104 (8); the reduce layer gives m
    assert [o for _, o, _ in delight_layer_sizes(8, 100, 32, 4, 4)] == [48, 72, 104, 32]


def closed_form(n, k, m, depth, g_max):
    """Input dense n -> m/2 with bias and LayerNorm, group layers (weights in*out/g, bias out, per-group LayerNorm
    2 out/g), output dense (m/2 + m) -> m with bias and LayerNorm."""
    half = m // 2
    total = n * half + half + 2 * half + (half + m) * m + m + 2 * m
    for i, o, g in delight_layer_sizes(n, k, m, depth, g_max):
        total += i * o // g + o + 2 * o // g
    return total


@pytest.mark.parametrize(
    "n,k,m,depth,g_max,expected",
    [
        (128, 1024, 512, 3, 4, 1_587_904),  # the WMT14 setting of the paper
        (16, 64, 32, 3, 4, 6_732),
        (256, 1024, 256, 3, 4, 809_696),  # Table 1a R3
        (384, 1024, 384, 7, 4, 2_466_104),  # R4
        (512, 1024, 512, 11, 4, 4_667_360),  # R5
    ],
)
def test_parameter_count(n, k, m, depth, g_max, expected):
    unit = DelightDeFINE(n, k, m, depth=depth, max_groups=g_max)
    assert sum(p.numel() for p in unit.parameters()) == closed_form(n, k, m, depth, g_max) == expected


def literal_delight(unit, e):
    """The authors' unit from its description, feature by feature: dense layers, group layers as separate matrix
    products per group, LayerNorm per group with the shared affine, swish, the input-first mixing."""

    def layer_norm(v, weight, bias):
        mu = v.mean(-1, keepdim=True)
        var = ((v - mu) ** 2).mean(-1, keepdim=True)
        return (v - mu) / torch.sqrt(var + 1e-5) * weight + bias

    def swish(v):
        return v * torch.sigmoid(v)

    def dense(v, block):
        return swish(layer_norm(v @ block.linear.weight.t() + block.linear.bias, block.norm.weight, block.norm.bias))

    x = dense(e, unit.input_layer)
    h = x
    for index, (layer, norm) in enumerate(zip(unit.layers, unit.norms)):
        g = layer.groups
        if index > 0:
            pieces = []
            for a, b in zip(x.chunk(g, -1), h.chunk(g, -1)):
                pieces += [a, b]
            h = torch.cat(pieces, -1)
        outs = [part @ layer.weight[j] for j, part in enumerate(h.chunk(g, -1))]
        h = torch.cat(outs, -1) + layer.bias
        h = torch.cat([swish(layer_norm(part, norm.weight, norm.bias)) for part in h.chunk(g, -1)], -1)
    return dense(torch.cat([x, h], -1), unit.output_layer)


@pytest.mark.parametrize("n,k,m,depth,g_max", [(16, 64, 32, 3, 4), (24, 96, 48, 7, 4), (32, 64, 64, 2, 2)])
def test_forward_matches_literal_recomputation(n, k, m, depth, g_max):
    torch.manual_seed(0)
    unit = DelightDeFINE(n, k, m, depth=depth, max_groups=g_max).double()
    with torch.no_grad():  # biases and norm affines away from their initial 0 and 1, so that they count
        for name, p in unit.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.3)
    e = torch.randn(3, 5, n, dtype=torch.float64)
    torch.testing.assert_close(unit(e), literal_delight(unit, e), rtol=1e-12, atol=1e-12)


def test_initialisation_is_xavier_over_the_authors_tensors():
    unit = DelightDeFINE(128, 1024, 512, depth=3, max_groups=4)
    grouped = unit.layers[0]  # [4, 64, 160]: Xavier's fans over the 3-D tensor are 64 * 160 and 4 * 160
    assert grouped.weight.abs().max() <= math.sqrt(6 / (64 * 160 + 4 * 160))
    assert grouped.weight.abs().max() > 0.9 * math.sqrt(6 / (64 * 160 + 4 * 160))
    dense = unit.layers[2]  # one group: an [out, in] = [512, 1280] matrix
    assert dense.weight.abs().max() <= math.sqrt(6 / (1280 + 512))
    assert dense.weight.abs().max() > 0.9 * math.sqrt(6 / (1280 + 512))
    assert all(float(layer.bias.abs().max()) == 0.0 for layer in unit.layers)


def test_activation_and_norm_options():
    e = torch.randn(4, 16)
    plain = DelightDeFINE(16, 64, 32, activation="none", norm="none")
    assert all(isinstance(norm, torch.nn.Identity) for norm in plain.norms)
    relu = DelightDeFINE(16, 64, 32, activation="relu")
    assert bool((relu(e) >= 0).all()) and bool((plain(e) < 0).any())


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(n=16, k=64, m=31), "m=31: the authors' unit projects the table to m/2: the width m must be even"),
        (dict(n=16, k=64, m=32, depth=1), "depth=1: "),
        (dict(n=16, k=64, m=32, max_groups=3), "max_groups=3: "),
        (dict(n=16, k=64, m=36, max_groups=4), "m=36: the authors' unit works at m/2 = 18"),
        (dict(n=16, k=64, m=32, norm="layer"), "norm='layer': "),
        (dict(n=16, k=64, m=32, activation="mish"), "activation='mish': "),
    ],
)
def test_impossible_configs_raise_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        DelightDeFINE(**kwargs)
    assert "--" not in str(error.value)


@pytest.mark.parametrize(
    "arch,expected",
    [("lstm_lm_define_wt103_n3", "0.81"), ("lstm_lm_define_wt103_n7", "2.47"), ("lstm_lm_define_wt103_n11", "4.67")],
)
def test_params_tool_reports_the_table_1a_counts(arch, expected):
    out = run_module(
        "define_fairseq.tools.params",
        "--vocab-size",
        "267735",
        "--user-dir",
        USER_DIR,
        "--task",
        "language_modeling",
        "--arch",
        arch,
        "--define-variant",
        "delight",
    ).stdout
    assert f"DeFINE {expected}M" in " ".join(out.split())
