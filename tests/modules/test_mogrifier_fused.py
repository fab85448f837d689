"""The fast path with its rounds and cell fused into Triton kernels (mogrifier_fused.py), under Triton's CPU
interpreter: a layer's window in float32 against the reference path in float64 (the output, the carried state and
the gradients of the input, the initial state and every weight), in training and in inference, with every buffer
filled with NaN before the kernels write it and sizes that leave the last program of each kernel partly masked."""

import pytest
import torch
from cuda_device import assert_close_at_scale
from triton_interpreter import import_interpreted

from define_fairseq.modules.mogrifier.layer import MogrifierLSTMLayer
from define_fairseq.modules.mogrifier.lstm import MogrifierLSTM
from define_fairseq.modules.mogrifier.recurrence import LayerRecurrence

pytest.importorskip("triton", reason="Triton is not installed: pip install -r requirements-dev.txt")
mt, mf = import_interpreted()

# float32 against float64: each value a few dozen float32 roundings (6e-8) deep through products of up to 37 terms
# and 4 steps back, and tanh within 2e-7: within 1e-5 of each tensor's largest element
REL = 1e-5
T, B, M, N = 4, 19, 20, 37  # 19 rows: two programs of 16, the second partly masked


pytestmark = pytest.mark.usefixtures("kernels_interpreted")


@pytest.fixture(autouse=True)
def poisoned_small_blocks(monkeypatch):
    """Every buffer of a run starts as NaN (an element read before a kernel writes it fails the test), and programs
    span 16 columns, so that 20 and 37 columns end in a partly masked program."""
    new = LayerRecurrence.new

    def poisoned(self, *shape):
        return new(self, *shape).fill_(float("nan"))

    monkeypatch.setattr(LayerRecurrence, "new", poisoned)
    monkeypatch.setattr(mf, "BLOCK_COLS", 16)


def float64_layer(rounds, rank, cap, seed=0):
    torch.manual_seed(seed)
    layer = MogrifierLSTMLayer(M, N, rounds=rounds, rank=rank, cap_input_gate=cap).double()
    with torch.no_grad():
        for p in layer.parameters():  # biases and maps non-zero, so that every term is exercised
            p.copy_(torch.randn(p.shape, dtype=torch.float64) * 0.3)
    return layer


def inputs(mask_kind, seed=1):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    x, h0, c0 = randn(T, B, M), randn(B, N), randn(B, N)
    shape = {"none": None, "window": (B, N), "step": (T, B, N)}[mask_kind]
    mask = None if shape is None else (torch.rand(*shape, generator=g, dtype=torch.float64) > 0.3).double() / 0.7
    return x, h0, c0, mask, randn(T, B, N), randn(B, N)


def run(layer, x, h0, c0, mask, dy, dc, **path):
    """``[y, h_T, c_T, dx, dh0, dc0, *d_parameters]`` of ``<dy, y> + <dc, c_T>``."""
    dtype = layer.weight_ih.dtype
    leaves = [t.to(dtype).requires_grad_(True) for t in (x, h0, c0)]
    y, (h, c) = layer(*leaves, None if mask is None else mask.to(dtype), **path)
    grads = torch.autograd.grad([y, c], leaves + list(layer.parameters()), [dy.to(dtype), dc.to(dtype)])
    return [y, h, c, *grads]


# make test: the PTB arch's form and the one-round cases; the other forms (5 to 10 s each, interpreted) slow
CASES = [
    (5, 2, True, "step"),  # the PTB arch's form: low rank, capped, a state mask per step
    pytest.param(5, 3, False, "window", marks=pytest.mark.slow),
    pytest.param(4, 0, True, "none", marks=pytest.mark.slow),
    pytest.param(2, 0, False, "step", marks=pytest.mark.slow),
    (1, 3, True, "none"),  # one round: h_up is h_{t-1} itself
    (1, 0, False, "window"),  # one round with a mask: h_up is the masked state
]


@pytest.mark.parametrize("rounds, rank, cap, mask_kind", CASES)
def test_fused_window_matches_the_float64_reference_path(rounds, rank, cap, mask_kind):
    """T = 4 steps of B = 19, m = 20, n = 37: y, (h_T, c_T) and the gradients of x, h0, c0 and every parameter;
    then the inference loop (no grad: one row of buffers reused by every step) for y and the state."""
    layer = float64_layer(rounds, rank, cap)
    data = inputs(mask_kind)
    expected = run(layer, *data, reference=True)
    layer.float().kernels = "triton"
    assert layer.recurrence_kind(data[0].float()) is mf.FusedRecurrence
    got = run(layer, *data)
    names = ["y", "h_T", "c_T", "dx", "dh0", "dc0"] + [f"d {name}" for name, _ in layer.named_parameters()]
    assert len(got) == len(expected) == len(names)
    for a, b, name in zip(got, expected, names):
        assert_close_at_scale(a, b, name, REL)
    x, h0, c0, mask = data[:4]
    with torch.no_grad():
        y, (h, c) = layer(x.float(), h0.float(), c0.float(), None if mask is None else mask.float())
    for a, b, name in zip((y, h, c), expected, names):
        assert_close_at_scale(a, b, f"inference {name}", REL)


def test_bfloat16_no_further_from_float64_than_the_torch_fast_path():
    """In bfloat16 the kernels compute in float32 and store bfloat16 where the torch fast path stores it: the
    output's mean error against float64 stays within 2x the fast path's, because Triton's interpreter rounds to
    bfloat16 by truncation (a mean error of half a unit in the last place, against a quarter when rounding to
    nearest, as the compiled kernels and torch do; the CUDA test holds those to 1.5x)."""
    layer = float64_layer(5, 3, True)
    data = inputs("step")
    expected = run(layer, *data, reference=True)[0]
    layer.to(torch.bfloat16)
    fast = run(layer, *data)[0]
    layer.kernels = "triton"
    fused = run(layer, *data)[0]
    error, fast_error = (fused.double() - expected).abs().mean(), (fast.double() - expected).abs().mean()
    assert error < 2.0 * fast_error, (error.item(), fast_error.item())


def test_the_kernels_run_where_the_setting_says():
    """``kernels``: auto keeps CPU tensors (and float64, and rounds = 0) on the torch fast path; triton takes the
    kernels; anything else, or float64 through the kernels, raises naming the fix."""
    layer = MogrifierLSTMLayer(M, N, rounds=2)
    x = torch.zeros(T, B, M)
    assert layer.recurrence_kind(x) is LayerRecurrence
    layer.kernels = "triton"
    assert layer.recurrence_kind(x) is mf.FusedRecurrence
    with pytest.raises(ValueError, match="float64 runs the fast path in torch"):
        layer.double()(x.double(), torch.zeros(B, N).double(), torch.zeros(B, N).double())
    layer.kernels = "cuda"
    with pytest.raises(ValueError, match="kernels='cuda': give one of auto, triton, torch"):
        layer.recurrence_kind(x)


def test_launches_per_time_step_and_layer(monkeypatch):
    """Forward and backward of 2 layers (r = 5, rank 2, input and state dropout) at T = 2 and T = 4, counted as
    benchmarks/launch_count.py counts (aten operations that launch a kernel, and Triton launches), per time step and
    layer (the difference over the two extra steps): at most 14 through the fused kernels (the goal: at most 27); the
    torch fast path, which the CPU runs, at most 75, what it was."""
    from benchmarks.launch_count import count_step

    monkeypatch.setattr(mf, "BLOCK_COLS", 64)  # the launches do not depend on the block sizes: fewer programs

    def per_step(kernels):
        counts = []
        for steps in (2, 4):
            torch.manual_seed(0)
            lstm = MogrifierLSTM(M, N, num_layers=2, rounds=5, rank=2, state_dropout=0.3, input_dropout=0.3)
            for layer in lstm.layers:
                layer.kernels = kernels
            x = torch.randn(3, steps, M, requires_grad=True)
            counts.append(count_step(lambda: lstm(x)[0].sum().backward(), warmup=0).launches)
        return (counts[1] - counts[0]) / (2 * 2)

    assert per_step("triton") <= 14
    assert per_step("torch") <= 75
