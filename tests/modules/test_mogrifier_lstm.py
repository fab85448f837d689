"""MogrifierLSTM against a literal re-computation of the paper's equations (mogrifier_reference.py), nn.LSTM and
gradcheck, on every path: rounds, rank, cap, dropout masks, float32 and float64."""

import pytest
import torch
import torch.nn as nn
from mogrifier_reference import (
    B,
    M,
    N,
    T,
    assert_same,
    literal_mogrifier,
    make_inputs,
    outputs_and_grads,
    random_masks,
    randomize,
    scalar_loss,
)

from define_fairseq.modules.mogrifier.layer import MogrifierDropoutMasks
from define_fairseq.modules.mogrifier.lstm import MogrifierLSTM


@pytest.mark.parametrize("dropout", [None, "shared", "per-step"], ids=["no-dropout", "masks", "per-step-masks"])
@pytest.mark.parametrize("cap", [True, False], ids=["cap", "no-cap"])
@pytest.mark.parametrize("rank", [0, 3], ids=["full", "rank3"])
@pytest.mark.parametrize("rounds", range(7))
def test_matches_literal_equations(rounds, rank, cap, dropout):
    """Fast path and reference path against the literal equations: output, final state and every gradient;
    2 layers (m != n in layer 1), random weights and initial state, summed layer outputs for odd ``rounds``; no
    dropout, masks shared by all steps, or a new mask (state mask included) at every step."""
    torch.manual_seed(0)
    model = MogrifierLSTM(
        M, N, num_layers=2, rounds=rounds, rank=rank, cap_input_gate=cap, sum_layer_outputs=rounds % 2 == 1
    ).double()
    randomize(model, seed=rounds)
    x, state = make_inputs(model)
    masks = None if dropout is None else random_masks(model, B, steps=T if dropout == "per-step" else None)
    expected = outputs_and_grads(lambda *a: literal_mogrifier(model, *a), model, x, state, masks)
    assert_same(outputs_and_grads(model.forward, model, x, state, masks), expected, "fast path")
    assert_same(outputs_and_grads(model.reference_forward, model, x, state, masks), expected, "reference path")
    with torch.no_grad():  # the inference loop (no buffers for backward)
        out, new_state = model(x, state, masks)
    torch.testing.assert_close(out, expected[0], atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(new_state[-1][1], expected[1][-1][1], atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("rank", [0, 3], ids=["full", "rank3"])
def test_float32_fast_path_matches_float64_equations(rank):
    """float32 (on CPU the fast path's float32 GEMMs may take a different kernel than float64) against the literal
    equations in float64: outputs, state and gradients, with state dropout."""
    torch.manual_seed(0)
    model = MogrifierLSTM(M, N, num_layers=2, rounds=5, rank=rank).double()
    randomize(model, seed=3)
    x, state = make_inputs(model)
    masks = random_masks(model, B)
    expected = outputs_and_grads(lambda *a: literal_mogrifier(model, *a), model, x, state, masks)
    model32 = model.float()
    x32 = x.detach().float().requires_grad_(True)
    state32 = [(h.detach().float().requires_grad_(True), c.detach().float().requires_grad_(True)) for h, c in state]
    masks32 = MogrifierDropoutMasks(
        [m.float() for m in masks.inputs], [m.float() for m in masks.states], masks.output.float()
    )
    out, new_state, grads = outputs_and_grads(model32.forward, model32, x32, state32, masks32)
    got = (out.double(), [(h.double(), c.double()) for h, c in new_state], [g.double() for g in grads])
    assert_same(got, expected, "float32", atol=1e-4, rtol=1e-4)


def test_three_layers_state_carried_over_calls_equals_one_call():
    """Running T steps in two calls with the state passed on equals one call; float32, eval mode, 3 layers."""
    torch.manual_seed(0)
    model = randomize(MogrifierLSTM(M, N, num_layers=3, rounds=5, rank=2, sum_layer_outputs=True)).eval()
    x = torch.randn(B, 6, M)
    out, state = model(x)
    out1, state1 = model(x[:, :2])
    out2, state2 = model(x[:, 2:], state1)
    torch.testing.assert_close(torch.cat([out1, out2], 1), out, atol=1e-6, rtol=1e-5)
    for (h, c), (h2, c2) in zip(state, state2):
        torch.testing.assert_close(h2, h, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(c2, c, atol=1e-6, rtol=1e-5)
    expected, _ = literal_mogrifier(model, x)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_reused_buffers_never_overwrite_live_results():
    """The fast path reuses its buffers from call to call: two graphs alive at once (gradient accumulation),
    a graph kept with retain_graph across another call, and outputs and states of inference calls all keep their
    values."""
    torch.manual_seed(0)
    model = randomize(MogrifierLSTM(M, N, num_layers=2, rounds=5, rank=3, state_dropout=0.3)).double().train()
    x1, state1 = make_inputs(model, seed=3)
    x2, state2 = make_inputs(model, seed=4)
    masks1, masks2 = random_masks(model, B, seed=5), random_masks(model, B, seed=6)

    def grads_of(x, state, masks):
        out, new_state = literal_mogrifier(model, x, state, masks)
        return torch.autograd.grad(scalar_loss(out, new_state), [x] + list(model.parameters()))

    expected1, expected2 = grads_of(x1, state1, masks1), grads_of(x2, state2, masks2)
    out1, s1 = model(x1, state1, masks1)
    out2, s2 = model(x2, state2, masks2)  # both graphs alive
    got2 = torch.autograd.grad(scalar_loss(out2, s2), [x2] + list(model.parameters()))
    loss1 = scalar_loss(out1, s1)
    got1 = torch.autograd.grad(loss1, [x1] + list(model.parameters()), retain_graph=True)
    for a, b in zip(got1 + got2, expected1 + expected2):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)
    out3, s3 = model(x2, state2, masks2)  # runs while the first graph is retained
    torch.autograd.grad(scalar_loss(out3, s3), [x2])
    again = torch.autograd.grad(loss1, [x1] + list(model.parameters()))
    for a, b in zip(again, expected1):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)
    model.eval()
    with torch.no_grad():
        y1, st1 = model(x1, state1)
        kept = [y1.clone()] + [t.clone() for hc in st1 for t in hc]
        model(x2, state2)
        model(x1[:, :2], state2)
    for a, b in zip([y1] + [t for hc in st1 for t in hc], kept):
        assert torch.equal(a, b)
    model.release_workspace()
    assert all(not layer.workspace.free for layer in model.layers)


def test_rounds_zero_without_cap_is_nn_lstm(monkeypatch):
    """rounds=0, cap off, no state dropout: one fused nn.LSTM kernel call per layer, equal to nn.LSTM with the same
    weights (outputs, state, input and weight gradients), and the weights round-trip through to_lstm."""
    torch.manual_seed(0)
    lstm = nn.LSTM(M, N, num_layers=2, batch_first=True).double()
    model = MogrifierLSTM(M, N, num_layers=2, rounds=0, cap_input_gate=False).double()
    model.load_lstm_weights(lstm)
    assert all(layer.uses_fused_lstm for layer in model.layers)
    calls = []
    real_lstm = torch.lstm
    monkeypatch.setattr(torch, "lstm", lambda *a: calls.append(1) or real_lstm(*a))
    x, state = make_inputs(model)
    out, (h, c) = lstm(x, (torch.stack([s[0] for s in state]), torch.stack([s[1] for s in state])))
    mine, mine_state = model(x, state)
    assert len(calls) == 2
    torch.testing.assert_close(mine, out, atol=1e-12, rtol=1e-10)
    for k in range(2):
        torch.testing.assert_close(mine_state[k][0], h[k], atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(mine_state[k][1], c[k], atol=1e-12, rtol=1e-10)
    gx_lstm, gw_lstm = torch.autograd.grad(out.square().sum(), [x, lstm.weight_hh_l1])
    gx, gw = torch.autograd.grad(mine.square().sum(), [x, model.layers[1].weight_hh])
    torch.testing.assert_close(gx, gx_lstm)
    torch.testing.assert_close(gw, gw_lstm)
    # the same model through the general recurrence (literal equations) agrees too
    torch.testing.assert_close(literal_mogrifier(model, x, state)[0], out, atol=1e-12, rtol=1e-10)
    back = model.to_lstm()
    torch.testing.assert_close(back(x)[0], lstm(x)[0], atol=1e-12, rtol=1e-10)


def test_rounds_zero_with_cap_or_state_dropout_is_not_the_fused_kernel(monkeypatch):
    calls = []
    real_lstm = torch.lstm
    monkeypatch.setattr(torch, "lstm", lambda *a: calls.append(1) or real_lstm(*a))
    torch.manual_seed(0)
    capped = MogrifierLSTM(M, N, rounds=0, cap_input_gate=True).double()
    randomize(capped)
    x, state = make_inputs(capped)
    torch.testing.assert_close(capped(x, state)[0], literal_mogrifier(capped, x, state)[0])
    plain = MogrifierLSTM(M, N, rounds=0, cap_input_gate=False, state_dropout=0.5).double().train()
    plain.load_lstm_weights(capped.to_lstm())
    masks = plain.sample_dropout_masks(B, T, x)
    torch.testing.assert_close(plain(x, state, masks)[0], literal_mogrifier(plain, x, state, masks)[0])
    assert calls == []
    plain.eval()  # no state mask in eval mode: the fused kernel again
    plain(x, state)
    assert calls == [1]
    # capping changes the function: an uncapped copy differs
    assert not torch.allclose(plain(x, state)[0], capped(x, state)[0])


@pytest.mark.parametrize("rank", [0, 3], ids=["full", "rank3"])
@pytest.mark.parametrize("rounds", [1, 2, 5, 6])
def test_zero_maps_make_every_round_the_identity(rounds, rank):
    """All Q/R weights and biases zero: 2*sigmoid(0) = 1, so the model equals the rounds=0 model with the same
    LSTM weights, whatever the input."""
    torch.manual_seed(0)
    model = randomize(MogrifierLSTM(M, N, num_layers=2, rounds=rounds, rank=rank)).eval()
    with torch.no_grad():
        for layer in model.layers:
            for mog in layer.mogrifier:
                for p in mog.parameters():
                    p.zero_()
    plain = MogrifierLSTM(M, N, num_layers=2, rounds=0).eval()
    with torch.no_grad():
        for src, dst in zip(model.layers, plain.layers):
            dst.weight_ih.copy_(src.weight_ih)
            dst.weight_hh.copy_(src.weight_hh)
            dst.bias.copy_(src.bias)
    x = torch.randn(B, T, M) * 3
    torch.testing.assert_close(model(x)[0], plain(x)[0], atol=1e-6, rtol=1e-5)
    # and with non-zero maps it is not the identity
    randomize(model, seed=5)
    assert not torch.allclose(model(x)[0], plain(x)[0], atol=1e-3)


class _Reference(nn.Module):
    """Calls ``model.reference_forward`` as its forward (so torch.func.functional_call can swap parameters)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model.reference_forward(*args)


@pytest.mark.parametrize("per_step", [False, True], ids=["shared-masks", "per-step-masks"])
@pytest.mark.parametrize("path", ["fast", "reference"])
@pytest.mark.parametrize("rank", [0, 2], ids=["full", "rank2"])
def test_gradcheck(path, rank, per_step):
    """torch.autograd.gradcheck in float64 on a tiny 2-layer model with capped input gate, state and dropout masks
    (shared by the steps, or one per step): gradients of the input, the initial state and every parameter."""
    torch.manual_seed(0)
    model = MogrifierLSTM(4, 3, num_layers=2, rounds=5, rank=rank, cap_input_gate=True, sum_layer_outputs=True).double()
    randomize(model, std=0.7)
    module = model if path == "fast" else _Reference(model)
    names = [name for name, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for p in module.parameters()]
    masks = random_masks(model, 2, seed=4, steps=3 if per_step else None)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(2, 3, generator=g, dtype=torch.float64, requires_grad=True)

    def fn(x, h0, c0, *ps):
        out, state = torch.func.functional_call(module, dict(zip(names, ps)), (x, [(h0, c0), (h0, c0)], masks))
        return out, state[0][1], state[1][0], state[1][1]

    # fast_mode compares v^T J u for random u, v instead of every Jacobian entry: a gradient 1% off in one parameter
    # or in the input fails it as it fails the full check, in an eighth of the time
    assert torch.autograd.gradcheck(fn, (x, h0, c0, *params), eps=1e-6, atol=1e-7, fast_mode=True)
