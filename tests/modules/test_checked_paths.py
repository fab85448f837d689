"""Every accelerated path checks itself against its eager path on first use (``modules/checked_path.py``): the
Mogrifier's CUDA graphs and Triton kernels and the ``--torch-compile`` regions. On the CPU each is replaced by a
stand-in that raises, one that returns wrong numbers and one that computes the eager function: the first two warn
once, naming the path, what went wrong and the switch, and the caller gets the eager path's numbers; the third
stays accelerated. ``DEFINE_FAIRSEQ_EAGER=1`` turns every path off."""

import types

import pytest
import torch
from mogrifier_reference import randomize
from static_graphs import static_buffer_capture

from define_fairseq.models.compile import compile_static_parts
from define_fairseq.modules import DeFINEEmbedding
from define_fairseq.modules.checked_path import EAGER_VARIABLE, CheckedPath, PathFallback, tolerance
from define_fairseq.modules.mogrifier import graphs as mogrifier_graphs
from define_fairseq.modules.mogrifier.layer import MogrifierLSTMLayer
from define_fairseq.modules.mogrifier.lstm import MogrifierLSTM
from define_fairseq.modules.mogrifier.recurrence import LayerRecurrence

B, T, C, H = 3, 5, 6, 7


def stack(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    lstm = MogrifierLSTM(C, H, num_layers=2, rounds=3, rank=2, input_dropout=0.2, state_dropout=0.2)
    return randomize(lstm, std=0.3, seed=seed).to(dtype).train()


def window_results(lstm, windows=2, seed=0):
    """The outputs, final states and accumulated parameter gradients of ``windows`` windows, state carried."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    state, results = None, []
    for _ in range(windows):
        x = torch.randn(B, T, C, generator=g, dtype=torch.float64).requires_grad_(True)
        out, state = lstm(x, state)
        (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum().backward()
        results += [out.detach(), *[t.detach() for pair in state for t in pair]]
        state = [(h.detach(), c.detach()) for h, c in state]
    return results + [p.grad.clone() for p in lstm.parameters()]


def assert_equal_lists(got, want, tol=0.0):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# -- the check itself --------------------------------------------------------------------------------------------


def test_the_tolerance_is_half_the_digits_of_the_dtype():
    assert tolerance(torch.float32) == pytest.approx(2.0**-11.5)
    assert tolerance(torch.bfloat16) == pytest.approx(2.0**-3.5)
    assert tolerance(torch.float64) < 1e-7


def test_a_correct_path_runs_alone_after_its_first_call():
    calls = []
    path = CheckedPath("the doubled path", "--no-double", "checking")

    def fast(x):
        calls.append("fast")
        return x * 2

    def eager(x):
        calls.append("eager")
        return x + x

    x = torch.randn(4, requires_grad=True)
    for _ in range(3):
        torch.testing.assert_close(path("shape 4", fast, eager, [x]), 2 * x)
    assert calls == ["fast", "eager", "fast", "fast", "fast"] and path.problem is None


def test_a_wrong_gradient_is_caught_though_the_outputs_agree():
    class WrongBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 4  # twice the true gradient: what the graphs' accumulation bug looked like

    path = CheckedPath("the path", "--switch", "checking")
    x = torch.randn(5, requires_grad=True)
    with pytest.warns(PathFallback, match=r"the path failed its check .*largest difference 1, beyond .*--switch"):
        out = path("k", WrongBackward.apply, lambda t: t * 2, [x])
    (grad,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(grad, torch.full_like(x, 2.0))  # the eager path's


# -- the Mogrifier's CUDA graphs ---------------------------------------------------------------------------------


@pytest.fixture
def graphed(monkeypatch):
    """CPU calls graphed, through ``capture`` (set by the test)."""
    monkeypatch.setattr(mogrifier_graphs.WindowGraphs, "usable", lambda self, x, masks: masks is None)

    def use(capture):
        monkeypatch.setattr(mogrifier_graphs.WindowGraphs, "capture_training", staticmethod(capture))
        lstm = stack()
        lstm.cuda_graphs = True
        return lstm

    return use


def test_a_capture_that_raises_falls_back_with_one_warning(graphed):
    def capture(window, sample):
        raise RuntimeError("operation not permitted when stream is capturing")

    lstm = graphed(capture)
    with pytest.warns(PathFallback) as record:
        got = window_results(lstm, windows=3)
    assert len(record) == 1
    message = str(record[0].message)
    assert "the Mogrifier LSTM's CUDA graphs failed" in message and "RuntimeError: operation not permitted" in message
    assert "--mogrifier-no-cuda-graphs" in message and EAGER_VARIABLE in message
    assert_equal_lists(got, window_results(stack(), windows=3))


def test_graphs_that_compute_other_numbers_fall_back(graphed):
    def capture(window, sample):
        replay = static_buffer_capture(window, sample)
        return lambda *args: tuple(t * 1.001 for t in replay(*args))

    lstm = graphed(capture)
    with pytest.warns(PathFallback, match=r"largest difference 0\.001"):
        got = window_results(lstm)
    assert_equal_lists(got, window_results(stack()))
    assert lstm.graph_check.problem is not None


def test_correct_graphs_stay_on_and_replay_once_a_window(graphed):
    replays = []

    def capture(window, sample):
        replay = static_buffer_capture(window, sample)
        return lambda *args: replays.append(1) or replay(*args)

    lstm = graphed(capture)
    got = window_results(lstm, windows=3)
    assert lstm.graph_check.problem is None and len(lstm.graph_check.checked) == 1
    assert len(replays) == 1 + 3  # the check's replay, then one per window
    assert_equal_lists(got, window_results(stack(), windows=3), tol=1e-12)


def test_the_environment_variable_runs_the_stack_eagerly(graphed, monkeypatch):
    monkeypatch.setenv(EAGER_VARIABLE, "1")
    captures = []
    lstm = graphed(lambda window, sample: captures.append(1) or static_buffer_capture(window, sample))
    window_results(lstm)
    assert captures == []


# -- the Mogrifier's Triton kernels --------------------------------------------------------------------------------


class Raising(LayerRecurrence):
    def forward(self):
        raise RuntimeError("out of resource: shared memory, Required: 319488, Hardware limit: 232448")


class Wrong(LayerRecurrence):
    def forward(self):
        y, c = super().forward()
        return y, c * 1.01


class Same(LayerRecurrence):
    made = 0

    def __init__(self, *args, **kwargs):
        Same.made += 1
        super().__init__(*args, **kwargs)


def layer_with_kernels(monkeypatch, kind):
    monkeypatch.setattr(MogrifierLSTMLayer, "fused_devices", ("cpu",))
    monkeypatch.setattr(MogrifierLSTMLayer, "fused_recurrence", staticmethod(lambda: kind))
    torch.manual_seed(0)
    return randomize(MogrifierLSTMLayer(C, H, rounds=3, rank=2), std=0.3)  # float32: a dtype the kernels take


def layer_results(layer, calls=2):
    g = torch.Generator().manual_seed(3)
    results = []
    for _ in range(calls):
        x = torch.randn(T, B, C, generator=g, requires_grad=True)
        h0, c0 = torch.randn(2, B, H, generator=g)
        y, (h, c) = layer(x, h0, c0)
        results += [y, c, *torch.autograd.grad((y.sum() + c.sum()), [x, *layer.parameters()])]
    return results


@pytest.mark.parametrize(
    "kind, problem", [(Raising, "RuntimeError: out of resource: shared memory"), (Wrong, "largest difference")]
)
def test_triton_kernels_that_fail_fall_back_to_torch(monkeypatch, kind, problem):
    layer = layer_with_kernels(monkeypatch, kind)
    with pytest.warns(PathFallback, match=f"Triton kernels failed .*{problem}.*--mogrifier-kernels torch"):
        got = layer_results(layer)
    assert layer.recurrence_kind(torch.empty(1)) is LayerRecurrence  # for good
    monkeypatch.setattr(MogrifierLSTMLayer, "fused_devices", ())
    assert_equal_lists(got, layer_results(layer))


def test_correct_triton_kernels_stay_on(monkeypatch):
    Same.made = 0
    layer = layer_with_kernels(monkeypatch, Same)
    got = layer_results(layer, calls=3)
    assert layer.kernel_check.problem is None and Same.made == 1 + 3  # the check's run, then one per call
    monkeypatch.setattr(MogrifierLSTMLayer, "fused_devices", ())
    assert_equal_lists(got, layer_results(layer, calls=3))


# -- the compiled regions ------------------------------------------------------------------------------------------


def raising_backend(gm, example_inputs):
    raise RuntimeError("inductor: C++ compile error")


def wrong_backend(gm, example_inputs):
    return lambda *args: [t * 1.01 if torch.is_tensor(t) and t.is_floating_point() else t for t in gm(*args)]


def compiled_embedding(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    embedding = DeFINEEmbedding(40, n=8, k=16, m=12, padding_idx=1, map_dropout=0.1).train()
    cfg = types.SimpleNamespace(torch_compile=True, torch_compile_backend=backend, torch_compile_mode=None)
    return compile_static_parts(embedding, cfg)


def embedding_results(embedding):
    tokens = torch.randint(0, 40, (2, 50), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(5)
    out = embedding(tokens)
    return [out, *torch.autograd.grad(out.square().sum(), list(embedding.parameters()))]


@pytest.mark.parametrize("backend, problem", [(raising_backend, "C\\+\\+ compile error"), (wrong_backend, "largest")])
def test_a_compiled_region_that_fails_runs_eagerly(backend, problem):
    embedding = compiled_embedding(backend)
    with pytest.warns(PathFallback, match=f"the compiled DeFINEEmbedding failed .*{problem}.*--torch-compile"):
        got = embedding_results(embedding)
    assert embedding.training  # the check ran in evaluation mode and put the mode back
    assert_equal_lists(got, embedding_results(compiled_embedding("eager")))


def test_a_correct_compiled_region_stays_compiled():
    embedding = compiled_embedding("eager")
    embedding_results(embedding)
    embedding_results(embedding)
    check = embedding._compiled_call_impl.check
    assert check.problem is None and len(check.checked) == 1
