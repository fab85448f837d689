"""MogrifierLSTM.cuda_graphs (mogrifier_graphs.py): on the CPU, its bookkeeping with the capture replaced by the eager
window (the same function: outputs, carried state and gradients equal to the eager path's; one graph per call
signature, at most MAX_GRAPHS, then the eager path with a warning; stale graphs dropped when the parameters move;
no workspace while capturing); on a CUDA device (marked ``cuda``), the captured graphs against the eager path."""

import warnings

import pytest
import torch
from cuda_device import CUDA_TESTS, DEVICE, fp32_arithmetic
from mogrifier_reference import randomize
from static_graphs import static_buffer_capture

from define_fairseq.modules.mogrifier import graphs as mogrifier_graphs
from define_fairseq.modules.mogrifier.lstm import MogrifierLSTM

B, T, C, H = 3, 5, 6, 7


def model(dropout=0.0, seed=0):
    torch.manual_seed(seed)
    lstm = MogrifierLSTM(C, H, num_layers=2, rounds=3, rank=2, input_dropout=dropout, state_dropout=dropout)
    return randomize(lstm, std=0.3, seed=seed).float()


def window_and_grads(lstm, x, state, seed=4):
    """``(output, new_state, [dx, *d_parameters])`` of a random functional of the output and the state."""
    torch.manual_seed(seed)
    x = x.detach().requires_grad_(True)
    out, new_state = lstm(x, state)
    flat = [t for pair in new_state for t in pair]
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(t.shape, generator=g).to(t) for t in [out] + flat]
    grads = torch.autograd.grad([out] + flat, [x] + list(lstm.parameters()), weights)
    return out, flat, grads


@pytest.fixture
def eager_captures(monkeypatch):
    """The captures replaced by the window itself (what a graph replays), and every CPU call graphed; records the
    workspaces the layers had while capturing."""
    seen = []

    def capture(window, sample):
        seen.append([layer.workspace for layer in window.lstm.layers])
        return window

    monkeypatch.setattr(mogrifier_graphs.WindowGraphs, "capture_training", staticmethod(capture))
    monkeypatch.setattr(mogrifier_graphs.WindowGraphs, "capture_inference", staticmethod(capture))
    monkeypatch.setattr(mogrifier_graphs.WindowGraphs, "usable", lambda self, x, masks: masks is None)
    return seen


def test_graph_bookkeeping_computes_the_eager_function(eager_captures):
    """Three windows carrying the (detached) state, in training with dropout: the same outputs, states and gradients
    as the eager path from the same seeds, one capture for the three, without workspaces while capturing."""
    eager, graphed = model(0.3), model(0.3)
    graphed.cuda_graphs = True
    x = torch.randn(B, T, C)
    state_e = state_g = None
    for window in range(3):
        e = window_and_grads(eager.train(), x + window, state_e, seed=window)
        g = window_and_grads(graphed.train(), x + window, state_g, seed=window)
        for a, b in zip([e[0], *e[1], *e[2]], [g[0], *g[1], *g[2]]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        state_e = [(e[1][i].detach(), e[1][i + 1].detach()) for i in range(0, 4, 2)]
        state_g = [(g[1][i].detach(), g[1][i + 1].detach()) for i in range(0, 4, 2)]
    # one signature: the first window's zero state (state None) and the carried state require no grad
    assert len(graphed.graphs.graphs) == 1
    assert eager_captures == [[None, None]]
    assert all(layer.workspace is not None for layer in graphed.layers)
    with torch.no_grad():  # evaluation: a signature of its own
        torch.testing.assert_close(graphed.eval()(x)[0], eager.eval()(x)[0], rtol=0, atol=0)
    assert len(graphed.graphs.graphs) == 2


def test_new_shapes_beyond_the_limit_run_eagerly_with_a_warning(eager_captures, monkeypatch):
    monkeypatch.setattr(mogrifier_graphs, "MAX_GRAPHS", 2)
    lstm = model().eval()
    lstm.cuda_graphs = True
    with torch.no_grad():
        for steps in (T, T - 1):
            lstm(torch.randn(B, steps, C))
        assert len(eager_captures) == 2
        with pytest.warns(UserWarning, match=r"2 window shapes are captured.*input \[3, 3, 6\] \(eval\)"):
            out, _ = lstm(torch.randn(B, T - 2, C))
        assert out.shape == (B, T - 2, H) and len(eager_captures) == 2
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warned once
            lstm(torch.randn(B, T - 3, C))
        lstm.double()  # the parameters moved: the graphs read stale storage and are dropped
        lstm(torch.randn(B, T, C, dtype=torch.float64))
    assert len(lstm.graphs.graphs) == 1 and len(eager_captures) == 3


def accumulated(lstm, windows, device="cpu", seed=0):
    """What ``--update-freq windows`` does with the stack: one backward per window, the state carried (detached) from
    one window to the next, gradients summed into ``.grad`` from None; returns the outputs, states and ``.grad``s."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    dtype = next(lstm.parameters()).dtype
    state, results = None, []
    for _ in range(windows):
        x = torch.randn(B, T, C, generator=g, dtype=dtype).to(device).requires_grad_(True)
        out, state = lstm(x, state)
        flat = [t for pair in state for t in pair]
        loss = sum((t * torch.randn(t.shape, generator=g, dtype=dtype).to(device)).sum() for t in [out] + flat)
        loss.backward()
        results += [t.detach() for t in [out] + flat]
        state = [(h.detach(), c.detach()) for h, c in state]
    return results + [p.grad for p in lstm.parameters()]


@pytest.fixture
def static_buffers(monkeypatch):
    """The training capture replaced by a stand-in that hands out static output and gradient buffers, as CUDA graphs
    do (tests/helpers/static_graphs.py), and every CPU call graphed."""
    monkeypatch.setattr(mogrifier_graphs.WindowGraphs, "capture_training", staticmethod(static_buffer_capture))
    monkeypatch.setattr(mogrifier_graphs.WindowGraphs, "usable", lambda self, x, masks: masks is None)


@pytest.mark.parametrize("windows", [2, 3])
def test_accumulation_over_windows_equals_the_eager_path(static_buffers, windows):
    """``--update-freq 2`` and 3 through static buffers, with dropout, float64: every parameter's ``.grad`` is the
    eager path's sum over the windows to 1e-12 (both compute the same sums; only the copies differ)."""
    graphed = model(0.3).double()
    graphed.cuda_graphs = True
    got, want = accumulated(graphed, windows), accumulated(model(0.3).double(), windows)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_accumulation_through_the_buffers_themselves_is_wrong(static_buffers, monkeypatch):
    """The stand-in reproduces pytorch/pytorch#181723: without ``own_gradients`` a parameter keeps a view of the
    static buffer as its ``.grad`` and the second window's replay overwrites it: ``2 g_2`` instead of ``g_1 + g_2``."""
    monkeypatch.setattr(mogrifier_graphs, "own_gradients", lambda node: None)
    graphed = model().double()
    graphed.cuda_graphs = True
    n = len(list(graphed.parameters()))
    got = accumulated(graphed, 2)[-n:]
    both, first = accumulated(model().double(), 2)[-n:], accumulated(model().double(), 1)[-n:]
    for a, g12, g1 in zip(got, both, first):
        torch.testing.assert_close(a, 2 * (g12 - g1), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(got[0], both[0])


cuda_mark, skip_without_cuda = CUDA_TESTS


@cuda_mark
@skip_without_cuda
@pytest.mark.parametrize("windows", [2, 3])
def test_cuda_graphs_accumulation_equals_the_eager_path(windows):
    """On the device, real CUDA graphs: ``.grad`` summed over 2 and 3 windows (state carried, no dropout) equals the
    eager path's to float32 rounding of the same kernels (1e-6), not twice the last window's."""
    with fp32_arithmetic():
        graphed = model().to(DEVICE)
        graphed.cuda_graphs = True
        got, want = accumulated(graphed, windows, DEVICE), accumulated(model().to(DEVICE), windows, DEVICE)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@cuda_mark
@skip_without_cuda
def test_cuda_graphs_match_the_eager_path():
    """On the device: training windows carrying the state (no dropout) and evaluation, graphs against eager (the
    same kernels in the same order: equal to float32 rounding of the copies, i.e. exactly); with dropout, a new
    mask at every replay; a shorter last window captured anew and equal to eager. ``=cpu``: the eager path twice."""
    with fp32_arithmetic():
        eager, graphed = model().to(DEVICE), model().to(DEVICE)
        graphed.cuda_graphs = True
        x = torch.randn(B, T, C, device=DEVICE)
        state_e = state_g = None
        for window in range(3):
            e = window_and_grads(eager.train(), x + window, state_e)
            g = window_and_grads(graphed.train(), x + window, state_g)
            for a, b in zip([e[0], *e[1], *e[2]], [g[0], *g[1], *g[2]]):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
            state_e = [(e[1][i].detach(), e[1][i + 1].detach()) for i in range(0, 4, 2)]
            state_g = [(g[1][i].detach(), g[1][i + 1].detach()) for i in range(0, 4, 2)]
        assert len(graphed.graphs.graphs) == (1 if DEVICE.type == "cuda" else 0)
        with torch.no_grad():
            for steps in (T, T - 2):
                xs = x[:, :steps]
                torch.testing.assert_close(graphed.eval()(xs)[0], eager.eval()(xs)[0], rtol=1e-6, atol=1e-6)
        assert len(graphed.graphs.graphs) == (3 if DEVICE.type == "cuda" else 0)  # and two in evaluation
        dropped = model(dropout=0.5).to(DEVICE).train()
        dropped.cuda_graphs = True
        with torch.no_grad():
            first, second = dropped(x)[0], dropped(x)[0]
        assert not torch.equal(first, second)  # the masks are drawn anew at every replay
