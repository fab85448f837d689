"""MogrifierLSTM's dropout masks (shared over time or per step), initialisation, parameter counts, argument
checks and thread handling."""

import math
import re

import pytest
import torch
import torch.nn as nn
from mogrifier_reference import B, M, N, T, assert_same, literal_mogrifier, make_inputs, outputs_and_grads, randomize

from define_fairseq.modules.mogrifier import threads as recurrence_threads
from define_fairseq.modules.mogrifier.layer import MogrifierDropoutMasks, MogrifierLSTMLayer, MogrifierRound
from define_fairseq.modules.mogrifier.lstm import MogrifierLSTM

# the official configs' four dropouts, each its own probability
DROPOUTS = dict(input_dropout=0.5, inter_layer_dropout=0.4, state_dropout=0.3, output_dropout=0.6)


def two_layers(**kwargs) -> MogrifierLSTM:
    """A 2-layer MogrifierLSTM of 5 rank-3 rounds (``kwargs``: its other arguments), built after seed 0."""
    torch.manual_seed(0)
    return MogrifierLSTM(M, N, num_layers=2, rounds=5, rank=3, **kwargs)


def test_dropout_masks_are_shared_over_time_and_come_before_the_rounds():
    model = randomize(two_layers(**DROPOUTS, shared_mask_dropout=True).double()).train()
    x, state = make_inputs(model)
    # one mask per sequence: [B, features], no time dimension
    masks = model.sample_dropout_masks(B, T, x)
    assert [m.shape for m in masks.inputs] == [(B, M), (B, N)]
    assert [m.shape for m in masks.states] == [(B, N), (B, N)]
    assert masks.output.shape == (B, N)
    assert set(masks.inputs[0].unique().tolist()) <= {0.0, 2.0}
    # in training mode forward draws exactly such masks (same random stream) and applies them at every step, x and
    # h_{t-1} multiplied before the mogrifier rounds (the literal re-computation does it that way)
    torch.manual_seed(7)
    out, _ = model(x, state)
    torch.manual_seed(7)
    drawn = model.sample_dropout_masks(B, T, x)
    torch.testing.assert_close(out, literal_mogrifier(model, x, state, drawn)[0], atol=1e-10, rtol=1e-8)
    # the same masks applied after the rounds (to x_up and h_up) would give something else
    after = literal_after_rounds(model, x, state, drawn)
    assert not torch.allclose(after, out, atol=1e-4)
    # two calls draw different masks; eval mode has none
    assert not torch.allclose(model(x, state)[0], model(x, state)[0])
    model.eval()
    torch.testing.assert_close(model(x, state)[0], literal_mogrifier(model, x, state)[0], atol=1e-10, rtol=1e-8)


def literal_after_rounds(model, x, state, masks):
    """Layer 1 of ``model`` with the input and state masks applied to x_up and h_up instead (a wrong order)."""
    layer, n = model.layers[0], model.hidden_size
    h, c = state[0]
    outs = []
    for t in range(x.shape[1]):
        x_up, h_up = layer.mogrify(x[:, t], h)
        pre = (
            (x_up * masks.inputs[0]) @ layer.weight_ih.t() + (h_up * masks.states[0]) @ layer.weight_hh.t() + layer.bias
        )
        i, f, j, o = (
            torch.sigmoid(pre[:, :n]),
            torch.sigmoid(pre[:, n : 2 * n]),
            torch.tanh(pre[:, 2 * n : 3 * n]),
            torch.sigmoid(pre[:, 3 * n :]),
        )
        c = f * c + torch.minimum(i, 1 - f) * j
        h = o * torch.tanh(c)
        outs.append(h)
    layer1 = torch.stack(outs, 1)
    inp = layer1 * masks.inputs[1].unsqueeze(1)
    rest = MogrifierLSTM(N, N, 1, model.rounds, model.rank).double()
    rest.layers[0] = model.layers[1]
    out, _ = rest(inp, [state[1]], MogrifierDropoutMasks([None], [masks.states[1]], None))
    return out * masks.output.unsqueeze(1)


def test_input_and_output_masks_drop_the_same_features_at_every_step():
    """With ``shared_mask_dropout`` (behaviour, not just shapes): the features input dropout removes get zero
    gradient at every time step; the output features output dropout removes are zero at every time step."""
    torch.manual_seed(0)
    model = MogrifierLSTM(M, N, rounds=5, rank=3, input_dropout=0.5, shared_mask_dropout=True).train()
    x = torch.randn(B, 6, M, requires_grad=True)
    out, _ = model(x)
    (grad,) = torch.autograd.grad(out.sum(), x)
    dropped = grad[:, 0] == 0
    assert dropped.any() and (~dropped).any()
    for t in range(6):
        assert torch.equal(grad[:, t] == 0, dropped)
    model = MogrifierLSTM(M, N, rounds=5, rank=3, output_dropout=0.5, shared_mask_dropout=True).train()
    out, _ = model(torch.randn(B, 6, M))
    zeros = out[:, 0] == 0
    assert zeros.any() and (~zeros).any()
    for t in range(6):
        assert torch.equal(out[:, t] == 0, zeros)


def test_input_and_output_masks_are_new_at_every_step_by_default():
    """The official configs' dropout (``shared_mask_dropout`` off): the features input dropout removes (zero
    gradient) and the output features output dropout zeroes change from step to step."""
    torch.manual_seed(0)
    model = MogrifierLSTM(M, N, rounds=5, rank=3, input_dropout=0.5).train()
    x = torch.randn(B, 6, M, requires_grad=True)
    out, _ = model(x)
    (grad,) = torch.autograd.grad(out.sum(), x)
    dropped = grad == 0
    assert dropped.any() and (~dropped).any()
    assert any(not torch.equal(dropped[:, t], dropped[:, 0]) for t in range(1, 6))
    model = MogrifierLSTM(M, N, rounds=5, rank=3, output_dropout=0.5).train()
    zeros = model(torch.randn(B, 6, M))[0] == 0
    assert zeros.any() and (~zeros).any()
    assert any(not torch.equal(zeros[:, t], zeros[:, 0]) for t in range(1, 6))


@pytest.mark.parametrize("state_per_step", [False, True], ids=["state-mask-per-window", "state-mask-per-step"])
def test_training_draws_masks_per_step_and_eval_none(state_per_step):
    """Training mode, the official configs' dropout: new input, inter-layer and output masks at every step; the
    state mask shared by the steps of a call (PTB) or new at every step (WikiText-2); forward (the fast path) uses
    exactly the masks it draws. Eval mode: no dropout at all."""
    model = randomize(two_layers(**DROPOUTS, state_dropout_per_step=state_per_step).double()).train()
    steps = 6
    x, state = make_inputs(model, steps=steps)
    torch.manual_seed(7)
    out, _ = model(x, state)
    torch.manual_seed(7)
    masks = model.sample_dropout_masks(B, steps, x)
    torch.testing.assert_close(out, literal_mogrifier(model, x, state, masks)[0], atol=1e-10, rtol=1e-8)

    def new_at_some_step(mask):
        return any(not torch.equal(mask[t], mask[0]) for t in range(1, steps))

    assert [m.shape for m in masks.inputs] == [(steps, B, M), (steps, B, N)]
    assert masks.output.shape == (steps, B, N)
    assert all(new_at_some_step(m) for m in masks.inputs + [masks.output])
    if state_per_step:
        assert all(m.shape == (steps, B, N) and new_at_some_step(m) for m in masks.states)
    else:  # one [B, N] mask per layer, multiplying h_{t-1} at every step (the literal re-computation does so)
        assert [m.shape for m in masks.states] == [(B, N), (B, N)]
        assert not torch.equal(masks.states[0], masks.states[1])
    model.eval()
    out, _ = model(x, state)
    torch.testing.assert_close(out, literal_mogrifier(model, x, state)[0], atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(model(x, state)[0], out)


def test_gate_biases_follow_the_official_initialisation():
    """The official code draws each gate's bias (a vector of n) from its variance-scaling truncated normal with
    fan_in n: std sqrt(1.3 / n) before the cut at two of those, so 0.8796 sqrt(1.3 / n) after it; the forget gate's
    is centred on the forget bias. n = 2000 draws per gate: the sample mean within 5 standard errors, the sample std
    within 10 % (about 7 standard errors)."""
    torch.manual_seed(0)
    n, forget_bias = 2000, 1.0
    bias = MogrifierLSTMLayer(1, n, rounds=0, forget_bias=forget_bias).bias.detach().double()
    cut = 2 * math.sqrt(1.3 / n)
    std = 0.87962566 * math.sqrt(1.3 / n)
    for k, (gate, mean) in enumerate(zip("ifjo", (0.0, forget_bias, 0.0, 0.0))):
        values = bias[k * n : (k + 1) * n]
        assert abs(values.mean().item() - mean) < 5 * std / math.sqrt(n), gate
        assert abs(values.std().item() / std - 1) < 0.1, gate
        assert (values - mean).abs().max().item() <= cut * (1 + 1e-6), gate


def test_parameter_counts_per_round():
    m, n, k = 12, 9, 4
    model = MogrifierLSTM(m, n, num_layers=2, rounds=6, rank=k)
    low = model.layers[0].mogrifier
    for i, mog in enumerate(low):
        count = sum(p.numel() for p in mog.parameters())
        # rounds 1, 3, 5 (i even) gate x: k(m+n)+m; rounds 2, 4, 6 gate h: k(m+n)+n
        assert count == (k * (m + n) + m if i % 2 == 0 else k * (m + n) + n)
        assert mog.left.shape == ((m, k) if i % 2 == 0 else (n, k))
    full = MogrifierLSTM(m, n, num_layers=2, rounds=6, rank=0)
    for i, mog in enumerate(full.layers[0].mogrifier):
        assert sum(p.numel() for p in mog.parameters()) == m * n + (m if i % 2 == 0 else n)
        assert mog.weight.shape == ((m, n) if i % 2 == 0 else (n, m))
    # distinct parameters per round and per layer; the LSTM part has nn.LSTM's weights and one bias vector
    lstm = 4 * n * (m + n) + 4 * n + 4 * n * (2 * n) + 4 * n
    rounds = 3 * (k * (m + n) + m) + 3 * (k * (m + n) + n) + 6 * (k * 2 * n + n)
    assert sum(p.numel() for p in model.parameters()) == lstm + rounds
    assert len({id(p) for p in model.parameters()}) == len(list(model.parameters()))


def test_initialisation():
    torch.manual_seed(0)
    fan_in, k = 400, 50
    mog = MogrifierRound(fan_in, 300, rank=k)
    # truncated normal (2 std) with std (1 / (fan_in k))^(1/4): its own std is 0.8796 of that
    target = (1.0 / (fan_in * k)) ** 0.25 * 0.8796
    for factor in (mog.left, mog.right):
        assert abs(factor.std().item() / target - 1) < 0.05
        assert factor.abs().max().item() <= 2 * (1.0 / (fan_in * k)) ** 0.25 + 1e-6
    assert torch.equal(mog.bias, torch.zeros(300))
    product_var = (mog.left @ mog.right).var().item()
    assert 0.3 / fan_in < product_var < 1.2 / fan_in
    full = MogrifierRound(fan_in, 300)
    assert abs(full.weight.var().item() * fan_in - 1) < 0.05
    model = MogrifierLSTM(300, 200, rounds=2, rank=10, forget_bias=1.0)
    layer = model.layers[0]
    assert abs(layer.weight_ih.var().item() * 300 - 1) < 0.05
    assert abs(layer.weight_hh.var().item() * 200 - 1) < 0.05


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rounds=-1), "rounds=-1: must be an integer >= 0 (0: a plain LSTM)"),
        (dict(rank=-2), "rank=-2: must be an integer >= 0 (0: full rank)"),
        (dict(rank=N), "rank=5: give 0 (full rank) or a rank below min(input_size, hidden_size) = 5"),
        (dict(rank=1.5), "rank=1.5: must be an integer"),
        (dict(input_dropout=1.0), "input_dropout=1.0: a dropout probability must be in [0, 1)"),
        (dict(inter_layer_dropout=-0.1), "inter_layer_dropout=-0.1: "),
        (dict(state_dropout=1.5), "state_dropout=1.5: "),
        (dict(output_dropout=1.0), "output_dropout=1.0: "),
        (dict(num_layers=0), "num_layers=0: must be an integer >= 1"),
        (dict(hidden_size=0), "hidden_size=0: "),
        (dict(input_size=0), "input_size=0: "),
    ],
)
def test_invalid_settings_raise_naming_the_argument(kwargs, message):
    args = dict(input_size=M, hidden_size=N)
    args.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        MogrifierLSTM(**args)
    assert "--" not in str(err.value)


def test_bad_input_shapes_raise():
    model = MogrifierLSTM(M, N, num_layers=2, rounds=2, rank=2)
    with pytest.raises(ValueError, match=r"\[B, T, 7\]"):
        model(torch.randn(B, T, M + 1))
    with pytest.raises(ValueError, match="2 layers"):
        model(torch.randn(B, T, M), [(torch.zeros(B, N), torch.zeros(B, N))])
    with pytest.raises(ValueError, match="nn.LSTM"):
        model.load_lstm_weights(nn.LSTM(M, N, num_layers=1))
    wrong_steps = MogrifierDropoutMasks([None, None], [torch.ones(T + 1, B, N), None], None)
    with pytest.raises(ValueError, match=r"state mask must be \[B, n\]"):
        model(torch.randn(B, T, M), None, wrong_steps)


def test_attributes_and_float32_training_step():
    model = two_layers(**dict.fromkeys(DROPOUTS, 0.2))
    assert (model.input_size, model.hidden_size, model.num_layers, model.rounds, model.rank) == (M, N, 2, 5, 3)
    x = torch.randn(B, T, M, requires_grad=True)
    out, state = model(x)
    assert out.shape == (B, T, N) and out.is_contiguous()
    assert len(state) == 2 and state[0][0].shape == (B, N)
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert x.grad is not None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_gpu_matches_cpu():
    model = randomize(two_layers()).double()
    x, state = make_inputs(model)
    expected = outputs_and_grads(model.forward, model, x, state, None)
    gpu = MogrifierLSTM(M, N, num_layers=2, rounds=5, rank=3).double().cuda()
    gpu.load_state_dict(model.state_dict())
    xg = x.detach().cuda().requires_grad_(True)
    sg = [(h.detach().cuda().requires_grad_(True), c.detach().cuda().requires_grad_(True)) for h, c in state]
    got = outputs_and_grads(gpu.forward, gpu, xg, sg, None)
    assert_same(
        (got[0].cpu(), [(h.cpu(), c.cpu()) for h, c in got[1]], [g.cpu() for g in got[2]]), expected, "gpu", atol=1e-9
    )
    assert math.isfinite(got[0].sum().item())


@pytest.fixture
def wait_policy(monkeypatch):
    """``wait_policy(value)`` sets OMP_WAIT_POLICY (``None``: unset) for the module, which reads it at its first
    decision and keeps it (as the OpenMP runtime reads it at start-up); the decision is by the policy alone."""
    monkeypatch.setattr(recurrence_threads, "SMALL_WORK_ON_ONE_THREAD", None)
    recurrence_threads._passive_wait_policy.cache_clear()

    def set_policy(policy):
        if policy is None:
            monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        else:
            monkeypatch.setenv("OMP_WAIT_POLICY", policy)

    yield set_policy
    recurrence_threads._passive_wait_policy.cache_clear()


@pytest.mark.parametrize("policy, one_thread", [("PASSIVE", True), ("passive", True), ("ACTIVE", False), (None, False)])
def test_small_work_runs_on_one_thread_only_under_the_passive_wait_policy(wait_policy, policy, one_thread):
    """The switch to one thread pays where waking OpenMP's sleeping threads is expensive (PASSIVE) and costs time
    otherwise."""
    wait_policy(policy)
    assert recurrence_threads.small_work_on_one_thread() is one_thread


def test_wait_policy_is_read_when_first_needed_not_at_import(wait_policy):
    """Set after the module was imported, the policy decides; changed after the first decision, it no longer does
    (the OpenMP runtime has read it by then)."""
    wait_policy("PASSIVE")
    assert recurrence_threads.small_work_on_one_thread() is True
    wait_policy("ACTIVE")
    assert recurrence_threads.small_work_on_one_thread() is True


def test_thread_switch_restores_the_callers_thread_count(monkeypatch):
    monkeypatch.setattr(recurrence_threads, "SMALL_WORK_ON_ONE_THREAD", True)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with recurrence_threads.Threads(torch.device("cpu")) as threads:
                assert torch.get_num_threads() == 1
                threads.large()
                assert torch.get_num_threads() == 2
                threads.small()
                raise RuntimeError("inside")
        assert torch.get_num_threads() == 2
        monkeypatch.setattr(recurrence_threads, "SMALL_WORK_ON_ONE_THREAD", False)
        with recurrence_threads.Threads(torch.device("cpu")):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
