"""The Triton Mogrifier step (mogrifier_triton.py) under Triton's CPU interpreter: its kernels against the torch
formulas, one step against ``MogrifierLSTMLayer.reference_step`` and a sequence against the reference path
(outputs, state and every gradient, float32), with kernel outputs filled with NaN before the kernels write them
and sizes that leave the last program of a kernel partly masked."""

import pytest
import torch
from triton_interpreter import import_interpreted, interpreted

from define_fairseq.modules.mogrifier.layer import MogrifierLSTMLayer

triton = pytest.importorskip(
    "triton", reason="Triton is not installed: pip install -r requirements-dev.txt (these tests run its interpreter)"
)
import triton.language as tl  # noqa: E402

# float32 against float32: the same operations in another order and another tanh (within 2e-7), a few dozen
# roundings of 6e-8 deep; atol for the elements that are sums cancelling to near zero.
RTOL, ATOL = 1e-5, 1e-6


mt, _ = import_interpreted()
with interpreted():

    @triton.jit
    def tanh_kernel(x_ptr, y_ptr, numel, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, mt._tanh(tl.load(x_ptr + offs, mask=offs < numel)), mask=offs < numel)


pytestmark = pytest.mark.usefixtures("kernels_interpreted")


@pytest.fixture(autouse=True)
def poisoned_small_blocks(monkeypatch):
    """Every kernel output starts as NaN (an element a kernel does not write fails the test) and programs span 8
    elements, so the tests' sizes (not multiples of 8) end in a partly masked program."""
    monkeypatch.setattr(mt, "_new", lambda like, *shape: torch.full(shape, float("nan"), dtype=like.dtype))
    monkeypatch.setattr(mt, "BLOCK_SIZE", 8)


def randn(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).requires_grad_(True)


def test_tanh_within_2e7_relative():
    x = torch.cat([torch.linspace(-20, 20, 4001), torch.logspace(-8, 0, 801), -torch.logspace(-8, 0, 801)])
    x = torch.cat([x, torch.tensor([0.0, 0.6, -0.6, 0.59999996, 90.0, -90.0])])
    y = torch.full_like(x, float("nan"))
    mt._launch(tanh_kernel, x.numel(), x, y)
    expected = torch.tanh(x.double())
    error = ((y.double() - expected).abs() / expected.abs().clamp_min(1e-30)).max().item()
    assert error < 2e-7, error


def test_round_gate_kernels_match_torch():
    """Forward and backward of one round's gate, 3 x 7 (three programs of 8, the last partly masked)."""
    p, v, bias = randn(3, 7, seed=1, scale=2.0), randn(3, 7, seed=2), randn(7, seed=3)
    d_out = torch.randn(3, 7)
    got = mt.round_gate(p, bias, v)
    grads = torch.autograd.grad(got, (p, bias, v), d_out)
    expected = 2.0 * torch.sigmoid(p + bias) * v
    expected_grads = torch.autograd.grad(expected, (p, bias, v), d_out)
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("cap", [True, False], ids=["cap", "no-cap"])
def test_cell_kernels_match_torch(cap):
    """Forward (h, c) and backward (dg, dbias, dc_prev) of the cell, n = 7, B = 3, against reference_step's tail;
    also with only one of the two outputs used (the other's gradient is None)."""
    n = 7
    g, bias, c_prev = randn(3, 4 * n, seed=1, scale=2.0), randn(4 * n, seed=2), randn(3, n, seed=3)
    dh, dc = torch.randn(3, n), torch.randn(3, n)

    def reference(g, bias, c_prev):
        i, f, j, o = (g + bias).chunk(4, 1)
        i, f, j, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(j), torch.sigmoid(o)
        if cap:
            i = torch.minimum(i, 1.0 - f)
        c = f * c_prev + i * j
        return o * torch.tanh(c), c

    got, expected = mt.lstm_cell(g, bias, c_prev, cap), reference(g, bias, c_prev)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    for weights in ((dh, dc), (dh, None), (None, dc)):
        outputs = [(a, w) for a, w in zip(got, weights) if w is not None]
        grads = torch.autograd.grad([a for a, _ in outputs], (g, bias, c_prev), [w for _, w in outputs], True)
        ref_outputs = [a for a, w in zip(expected, weights) if w is not None]
        ref_grads = torch.autograd.grad(ref_outputs, (g, bias, c_prev), [w for _, w in outputs], True)
        for a, b in zip(grads, ref_grads):
            torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


def random_layer(m, n, rounds, rank, cap, seed=0):
    torch.manual_seed(seed)
    layer = MogrifierLSTMLayer(m, n, rounds=rounds, rank=rank, cap_input_gate=cap)
    with torch.no_grad():
        for p in layer.parameters():  # biases and Q/R non-zero, so that every term is exercised
            p.copy_(torch.randn(p.shape) * 0.5)
    return layer


def grads_of(outputs, inputs, layer, seed=5):
    """The gradients of ``inputs`` and of the layer's parameters of a random linear functional of ``outputs``."""
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o.shape, generator=g) for o in outputs]
    return torch.autograd.grad(outputs, list(inputs) + list(layer.parameters()), weights)


def assert_same_grads(got, expected, layer, input_names):
    names = list(input_names) + [name for name, _ in layer.named_parameters()]
    assert len(got) == len(expected) == len(names)
    for a, b, name in zip(got, expected, names):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda text: f"gradient of {name}: {text}")


@pytest.mark.parametrize("cap", [True, False], ids=["cap", "no-cap"])
@pytest.mark.parametrize("rank", [0, 2], ids=["full", "rank2"])
@pytest.mark.parametrize("rounds", [0, 1, 2, 5])
def test_step_matches_reference_step(rounds, rank, cap):
    """One step, m = 6, n = 5, B = 3, with a state mask: h_t, c_t and the gradients of x, h, c and every parameter
    against reference_step."""
    layer = random_layer(6, 5, rounds, rank, cap)
    x, h, c = randn(3, 6, seed=1), randn(3, 5, seed=2), randn(3, 5, seed=3)
    mask = (torch.rand(3, 5, generator=torch.Generator().manual_seed(4)) > 0.3).float() / 0.7
    rounds_params = [mog.flat_parameters() for mog in layer.mogrifier]
    weight = torch.cat([layer.weight_ih, layer.weight_hh], 1)
    got = mt.triton_mogrifier_step(x, h, c, weight, layer.bias, rounds_params, cap, state_mask=mask)
    expected = layer.reference_step(x, h, c, mask)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    inputs = [x, h, c]
    assert_same_grads(grads_of(got, inputs, layer), grads_of(expected, inputs, layer), layer, ["x", "h", "c"])


@pytest.mark.parametrize("rounds, rank", [(5, 2), (2, 0)], ids=["r5-rank2", "r2-full"])
def test_sequence_matches_reference_path(rounds, rank):
    """T = 4, B = 3, m = 6, n = 5, capped input gate, one state mask per step: y, (h_T, c_T) and every gradient
    against the layer's reference path (reference_step per step) and its fast path."""
    layer = random_layer(6, 5, rounds, rank, cap=True, seed=1)
    x, h0, c0 = randn(4, 3, 6, seed=1), randn(3, 5, seed=2), randn(3, 5, seed=3)
    mask = (torch.rand(4, 3, 5, generator=torch.Generator().manual_seed(4)) > 0.3).float() / 0.7
    y, (h, c) = mt.triton_mogrifier_layer(layer, x, h0, c0, mask)
    got = grads_of([y, c], [x, h0, c0], layer)
    for path in (dict(reference=True), dict()):
        y_ref, (h_ref, c_ref) = layer(x, h0, c0, mask, **path)
        torch.testing.assert_close(y, y_ref, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(h, h_ref, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(c, c_ref, rtol=RTOL, atol=ATOL)
        assert_same_grads(got, grads_of([y_ref, c_ref], [x, h0, c0], layer), layer, ["x", "h0", "c0"])


def test_errors_name_the_dtype_and_the_device_fix(monkeypatch):
    layer = random_layer(6, 5, 2, 0, True).double()
    x, h0 = torch.randn(2, 3, 6, dtype=torch.float64), torch.zeros(3, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match="float64"):
        mt.triton_mogrifier_layer(layer, x, h0, h0)
    with pytest.raises(ValueError, match=r"state mask must be \[B, n\]"):
        mt.triton_mogrifier_layer(layer.float(), x.float(), h0.float(), h0.float(), torch.ones(3, 4))
    monkeypatch.setattr(mt, "INTERPRETED", False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        mt.round_gate(torch.zeros(2, 3), torch.zeros(3), torch.zeros(2, 3))
