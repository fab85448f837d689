import pytest
import torch
import torch.nn as nn

from define_fairseq.modules import GroupLinear


def reference_group_linear(x, weight, bias, groups):
    """Literal definition: group j maps input chunk j with its own matrix to output chunk j."""
    chunks = x.chunk(groups, dim=-1)
    out = torch.cat([chunks[j] @ weight[j] for j in range(groups)], dim=-1)
    return out if bias is None else out + bias


@pytest.mark.parametrize("groups,bias", [(1, True), (2, True), (4, False), (8, True)])
def test_matches_per_group_reference(groups, bias):
    torch.manual_seed(0)
    layer = GroupLinear(32, 48, groups, bias=bias)
    x = torch.randn(3, 5, 32, requires_grad=True)
    y = layer(x)
    assert y.shape == (3, 5, 48)
    expected = reference_group_linear(x, layer.weight, layer.bias, groups)
    torch.testing.assert_close(y, expected)
    # gradients as well
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, layer.weight], g)
    expected_grads = torch.autograd.grad(expected, [x, layer.weight], g)
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b)


def test_one_group_equals_nn_linear():
    torch.manual_seed(0)
    layer = GroupLinear(16, 24, 1)
    dense = nn.Linear(16, 24)
    with torch.no_grad():
        dense.weight.copy_(layer.weight[0].t())
        dense.bias.copy_(layer.bias)
    x = torch.randn(7, 16)
    # The same products, but the GEMM reads the weight in the other layout: the BLAS may take another kernel and
    # another summation order (the last bit differs under MKL_CBWR=COMPATIBLE), so float32 tolerances.
    torch.testing.assert_close(layer(x), dense(x))


def test_parameter_count():
    layer = GroupLinear(64, 128, 4)
    assert sum(p.numel() for p in layer.parameters()) == 64 * 128 // 4 + 128
    assert layer.weight.shape == (4, 16, 32)


@pytest.mark.parametrize("in_f,out_f,groups", [(30, 32, 4), (32, 30, 4), (32, 32, 0)])
def test_bad_shapes_raise(in_f, out_f, groups):
    with pytest.raises(ValueError, match="groups"):
        GroupLinear(in_f, out_f, groups)


@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck_float64(bias):
    torch.manual_seed(0)
    layer = GroupLinear(8, 12, 4, bias=bias).double()
    x = torch.randn(3, 2, 8, dtype=torch.float64, requires_grad=True)
    params = [x, layer.weight] + ([layer.bias] if bias else [])
    assert torch.autograd.gradcheck(lambda *_: layer(x), params)
    assert torch.autograd.gradgradcheck(lambda *_: layer(x), params)


def test_bfloat16_autocast_matches_reference():
    torch.manual_seed(0)
    layer = GroupLinear(32, 64, 4)
    x = torch.randn(5, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    torch.testing.assert_close(y.float(), reference_group_linear(x, layer.weight, layer.bias, 4), rtol=3e-2, atol=3e-2)
