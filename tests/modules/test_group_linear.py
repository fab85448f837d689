import pytest
import torch
import torch.nn as nn
from cuda_device import CUDA_TESTS, DEVICE, ON_CPU, assert_close_at_scale, fp32_arithmetic

from define_fairseq.modules import GroupLinear
from define_fairseq.modules.define import group_linear


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


@pytest.mark.parametrize("shape", [(32,), (1, 32), (1, 1, 32)])
def test_one_row_leaves_the_bias_alone(shape):
    """A single row: the output starts as a copy of the bias, never the bias itself (``expand(1, F)`` is already
    contiguous, and the product is added into the output in place)."""
    torch.manual_seed(0)
    layer = GroupLinear(32, 48, 4)
    bias = layer.bias.detach().clone()
    x = torch.randn(shape)
    y = layer(x)
    torch.testing.assert_close(layer.bias.detach(), bias, rtol=0, atol=0)
    torch.testing.assert_close(y, reference_group_linear(x, layer.weight, layer.bias, 4))


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


def count_fast_path_calls(monkeypatch):
    calls = []
    apply = group_linear._GroupLinearFunction.apply
    monkeypatch.setattr(group_linear._GroupLinearFunction, "apply", lambda *a: calls.append(1) or apply(*a))
    return calls


@pytest.mark.parametrize("bias", [True, False])
def test_bfloat16_autocast_takes_the_fast_path_and_matches_autocast_on_the_reference(bias, monkeypatch):
    """Under autocast the operands are cast to its dtype, as autocast casts those of ``bmm`` and ``baddbmm``: the
    reference formulation under autocast then does the same products in bfloat16. The two write their float32
    accumulations back in other layouts, so an output may round to the neighbouring bfloat16 value (2**-8 relative):
    bfloat16 tolerances; the float32 parameters get float32 gradients."""
    calls = count_fast_path_calls(monkeypatch)
    torch.manual_seed(0)
    layer = GroupLinear(32, 64, 4, bias=bias)
    x = torch.randn(6, 5, 32, requires_grad=True)
    params = [x, *layer.parameters()]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        expected = group_linear._group_linear_reference(x, layer.weight, layer.bias)
    assert calls == [1] and y.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(y, expected)
    g = torch.randn_like(y)
    grads = torch.autograd.grad(y, params, g)
    expected_grads = torch.autograd.grad(expected, params, g)
    for got, want in zip(grads, expected_grads):
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)
    # and the literal definition in float32, within bfloat16's rounding of the operands and the output
    literal = reference_group_linear(x, layer.weight, layer.bias, 4)
    torch.testing.assert_close(y.float(), literal, rtol=3e-2, atol=3e-2)


def test_half_precision_weights_take_the_fast_path(monkeypatch):
    """``model.half()`` (fairseq's ``--fp16``): parameters and input in float16, no autocast."""
    calls = count_fast_path_calls(monkeypatch)
    torch.manual_seed(0)
    layer = GroupLinear(32, 64, 4).half()
    x = torch.randn(6, 32).half().requires_grad_()
    y = layer(x)
    assert calls == [1] and y.dtype == torch.float16
    expected = group_linear._group_linear_reference(x, layer.weight, layer.bias)
    torch.testing.assert_close(y, expected)
    g = torch.randn_like(y)
    for got, want in zip(
        torch.autograd.grad(y, [x, layer.weight], g), torch.autograd.grad(expected, [x, layer.weight], g)
    ):
        torch.testing.assert_close(got, want)


FORMULATIONS = {
    "fused": group_linear._group_linear_fused,
    "plain": group_linear._group_linear_reference,
}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(7, 24), (3, 5, 24), (1, 24)])
def test_both_formulations_equal_the_per_group_loop_in_float64(shape, bias):
    """The custom function and the plain batched multiply are one computation: in float64 both agree with the
    literal per-group definition, forward and every gradient, to float64 rounding."""
    torch.manual_seed(0)
    layer = GroupLinear(24, 36, 3, bias=bias).double()
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    params = [x, *layer.parameters()]
    expected = reference_group_linear(x, layer.weight, layer.bias, 3)
    g = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, params, g)
    results = {}
    for name, formulation in FORMULATIONS.items():
        y = formulation(x, layer.weight, layer.bias)
        results[name] = (y, torch.autograd.grad(y, params, g))
        assert y.shape == expected.shape, name
        torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
        for got, want in zip(results[name][1], expected_grads):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for a, b in zip(results["fused"][1], results["plain"][1]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_cpu_takes_the_custom_function_and_the_module_equals_it(monkeypatch):
    """On a CPU, where the custom function measured faster (benchmarks/results/group_linear.md), the layer calls it."""
    calls = count_fast_path_calls(monkeypatch)
    torch.manual_seed(0)
    layer = GroupLinear(24, 36, 3).double()
    x = torch.randn(4, 24, dtype=torch.float64)
    y = layer(x)
    assert calls == [1]
    torch.testing.assert_close(y, group_linear._group_linear_reference(x, layer.weight, layer.bias), rtol=0, atol=0)


def test_the_state_dict_holds_the_weight_and_bias_alone_whatever_the_formulation():
    torch.manual_seed(0)
    layer = GroupLinear(24, 36, 3)
    state = layer.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == {"weight": (3, 8, 12), "bias": (36,)}
    x = torch.randn(5, 24)
    y = layer(x)
    other = GroupLinear(24, 36, 3)
    other.load_state_dict(state, strict=True)
    torch.testing.assert_close(other(x), y, rtol=0, atol=0)
    torch.testing.assert_close(group_linear._group_linear_reference(x, other.weight, other.bias), y)


@pytest.mark.parametrize("bias", [True, False])
def test_under_torch_compile_the_layer_equals_eager(bias):
    """``torch.compile`` (fullgraph: no graph break) traces the plain formulation; forward and gradients equal
    eager's to float32 rounding (another summation order in the products)."""
    torch.manual_seed(0)
    layer = GroupLinear(32, 48, 4, bias=bias)
    x = torch.randn(6, 32, requires_grad=True)
    params = [x, *layer.parameters()]
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    y, expected = compiled(x), layer(x)
    torch.testing.assert_close(y, expected)
    g = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, params, g), torch.autograd.grad(expected, params, g)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "autocast", [pytest.param(None, marks=CUDA_TESTS), pytest.param(torch.bfloat16, marks=CUDA_TESTS)]
)
def test_a_cuda_device_takes_the_plain_formulation(autocast, monkeypatch):
    """On a GPU the layer runs the plain batched multiply (faster there), never the custom function, and agrees with
    the float64 definition: in true float32, to float32 rounding; under bfloat16 autocast, to bfloat16's rounding of
    the operands and the result (2**-8 relative), measured against the largest magnitude of each tensor.
    ``DEFINE_FAIRSEQ_CUDA_TESTS=cpu`` checks the comparison on the CPU, where the custom function runs instead."""
    calls = count_fast_path_calls(monkeypatch)
    torch.manual_seed(0)
    layer = GroupLinear(64, 128, 4)
    x = torch.randn(33, 64, requires_grad=True)
    params = [x, *layer.parameters()]
    expected = reference_group_linear(x.double(), layer.weight.double(), layer.bias.double(), 4)
    g = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, params, g)
    on_device = GroupLinear(64, 128, 4).to(DEVICE)
    on_device.load_state_dict(layer.state_dict())
    x_device = x.detach().to(DEVICE).requires_grad_()
    with fp32_arithmetic(), torch.autocast(DEVICE.type, dtype=autocast or torch.bfloat16, enabled=bool(autocast)):
        y = on_device(x_device)
    assert calls == ([1] if ON_CPU else [])
    assert y.dtype == (autocast or torch.float32)
    rel = 2**-6 if autocast else 1e-5
    assert_close_at_scale(y, expected, "output", rel)
    with fp32_arithmetic():
        grads = torch.autograd.grad(y, [x_device, *on_device.parameters()], g.to(DEVICE, y.dtype))
    for name, got, want in zip(("input", "weight", "bias"), grads, expected_grads):
        assert got.dtype == torch.float32
        assert_close_at_scale(got, want, f"{name} gradient", rel)


@pytest.mark.parametrize("dtype", [pytest.param(d, marks=CUDA_TESTS) for d in ("bf16", "fp16")])
def test_the_benchmark_times_every_variant_by_cuda_graph_replay(dtype):
    """``benchmarks.group_linear`` on a GPU: each variant captured as a CUDA graph, forward and forward + backward,
    and the goal line (GroupLinear g=4 against dense in GPU time) carries a figure, PASS or FAIL."""
    if ON_CPU:
        pytest.skip("CUDA graphs need a CUDA device")
    from benchmarks import group_linear as benchmark

    result = benchmark.main(["--device", "cuda", "--dtype", dtype, "--quick", "--replays", "3"])
    assert not result.failed
    assert "## GPU time (CUDA-graph replay)" in result.text
    assert "| 1024 -> 2048, 4 groups | forward + backward |" in result.text
    goal = result.checks[-1]
    assert "GPU time" in goal.what and goal.target == 1.5 and goal.value > 0
    assert goal.line().startswith(("- PASS: ", "- FAIL: "))
