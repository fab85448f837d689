"""MogrifierLSTM against a literal re-computation of the paper's equations, nn.LSTM, gradcheck and its settings."""

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from define_fairseq.modules import mogrifier_recurrence
from define_fairseq.modules.mogrifier_lstm import (MogrifierDropoutMasks, MogrifierLSTM, MogrifierLSTMLayer,
                                                   MogrifierRound)

M, N, B, T = 7, 5, 3, 4  # input size, hidden size, batch, time steps of the small models


def at_step(mask, t):
    """The mask of time step ``t``: a shared ``[B, C]`` mask, or row ``t`` of a per-step ``[T, B, C]`` one."""
    return None if mask is None else mask if mask.dim() == 2 else mask[t]


def literal_mogrifier(model, x, state=None, masks=None):
    """The equations of the paper (Eq. 1-2 and the LSTM), one time step and one round at a time, with plain tensor
    operations on the module's parameters; separate products for x and h (no fused GEMM).

    x [B, T, m] -> (output [B, T, n], [(h, c)] per layer); masks [B, C] shared or [T, B, C] per step.
    """
    batch, steps, _ = x.shape
    n = model.hidden_size
    layers = model.layers
    if masks is None:
        masks = MogrifierDropoutMasks([None] * len(layers), [None] * len(layers), None)
    if state is None:
        state = [(x.new_zeros(batch, n), x.new_zeros(batch, n)) for _ in layers]
    inputs = [x[:, t] for t in range(steps)]
    per_layer_outputs, new_state = [], []
    for k, layer in enumerate(layers):
        maps = []  # (Q^i, bias^i) for i = 1..r
        for mog in layer.mogrifier:
            q = mog.weight if mog.rank == 0 else mog.left @ mog.right
            maps.append((q, mog.bias))
        r = len(maps)
        h, c = state[k]
        outputs = []
        for t in range(steps):
            x_t = inputs[t] if masks.inputs[k] is None else inputs[t] * at_step(masks.inputs[k], t)
            h_prev = h if masks.states[k] is None else h * at_step(masks.states[k], t)
            xs, hs = {-1: x_t}, {0: h_prev}
            for i in range(1, r + 1):
                q, bias = maps[i - 1]
                if i % 2 == 1:
                    xs[i] = 2 * torch.sigmoid(hs[i - 1] @ q.t() + bias) * xs[i - 2]
                else:
                    hs[i] = 2 * torch.sigmoid(xs[i - 1] @ q.t() + bias) * hs[i - 2]
            x_up, h_up = xs[max(xs)], hs[max(hs)]
            pre = x_up @ layer.weight_ih.t() + h_up @ layer.weight_hh.t() + layer.bias
            i_gate = torch.sigmoid(pre[:, :n])
            f_gate = torch.sigmoid(pre[:, n: 2 * n])
            j = torch.tanh(pre[:, 2 * n: 3 * n])
            o_gate = torch.sigmoid(pre[:, 3 * n:])
            if model.cap_input_gate:
                i_gate = torch.where(i_gate < 1 - f_gate, i_gate, 1 - f_gate)
            c = f_gate * c + i_gate * j
            h = o_gate * torch.tanh(c)
            outputs.append(h)
        new_state.append((h, c))
        per_layer_outputs.append(torch.stack(outputs, 1))
        inputs = outputs
    out = sum(per_layer_outputs) if model.sum_layer_outputs else per_layer_outputs[-1]
    if masks.output is not None:
        out = out * (masks.output.unsqueeze(1) if masks.output.dim() == 2 else masks.output.transpose(0, 1))
    return out, new_state


def randomize(model, std=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return model


def random_masks(model, batch, p=0.3, seed=1, steps=None):
    """Masks shared by every step ``[B, C]``, or with ``steps`` one per step ``[steps, B, C]``."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch,) if steps is None else (steps, batch)

    def mask(size):
        return (torch.rand(*shape, size, generator=g, dtype=torch.float64) > p).double() / (1 - p)

    return MogrifierDropoutMasks([mask(layer.input_size) for layer in model.layers],
                                 [mask(model.hidden_size) for _ in model.layers], mask(model.hidden_size))


def scalar_loss(out, state, seed=2):
    """A random linear functional of the output and the final state (so every gradient path is exercised)."""
    g = torch.Generator().manual_seed(seed)

    def weights(t):  # drawn in float64 whatever the dtype, so that float32 and float64 runs get the same
        return torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype)

    loss = (out * weights(out)).sum()
    for h, c in state:
        loss = loss + (h * weights(h)).sum() + (c * weights(c)).sum()
    return loss


def outputs_and_grads(fn, model, x, state, masks):
    out, new_state = fn(x, state, masks)
    leaves = [x] + [t for hc in state for t in hc] + list(model.parameters())
    grads = torch.autograd.grad(scalar_loss(out, new_state), leaves, allow_unused=True)
    grads = [torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, grads)]
    return out, new_state, grads


def make_inputs(model, seed=3, steps=T):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, steps, model.input_size, generator=g, dtype=torch.float64, requires_grad=True)
    state = [(torch.randn(B, model.hidden_size, generator=g, dtype=torch.float64, requires_grad=True),
              torch.randn(B, model.hidden_size, generator=g, dtype=torch.float64, requires_grad=True))
             for _ in range(model.num_layers)]
    return x, state


def assert_same(a, b, what, atol=1e-10, rtol=1e-8):
    out_a, state_a, grads_a = a
    out_b, state_b, grads_b = b
    torch.testing.assert_close(out_a, out_b, atol=atol, rtol=rtol, msg=f"{what}: output")
    for k, ((ha, ca), (hb, cb)) in enumerate(zip(state_a, state_b)):
        torch.testing.assert_close(ha, hb, atol=atol, rtol=rtol, msg=f"{what}: h of layer {k}")
        torch.testing.assert_close(ca, cb, atol=atol, rtol=rtol, msg=f"{what}: c of layer {k}")
    assert len(grads_a) == len(grads_b)
    for i, (ga, gb) in enumerate(zip(grads_a, grads_b)):
        torch.testing.assert_close(ga, gb, atol=atol, rtol=rtol, msg=f"{what}: gradient {i}")


@pytest.mark.parametrize("dropout", [None, "shared", "per-step"], ids=["no-dropout", "masks", "per-step-masks"])
@pytest.mark.parametrize("cap", [True, False], ids=["cap", "no-cap"])
@pytest.mark.parametrize("rank", [0, 3], ids=["full", "rank3"])
@pytest.mark.parametrize("rounds", range(7))
def test_matches_literal_equations(rounds, rank, cap, dropout):
    """Fast path and reference path against the literal equations: output, final state and every gradient;
    2 layers (m != n in layer 1), random weights and initial state, summed layer outputs for odd ``rounds``; no
    dropout, masks shared by all steps, or a new mask (state mask included) at every step."""
    torch.manual_seed(0)
    model = MogrifierLSTM(M, N, num_layers=2, rounds=rounds, rank=rank, cap_input_gate=cap,
                          sum_layer_outputs=rounds % 2 == 1).double()
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
    masks32 = MogrifierDropoutMasks([m.float() for m in masks.inputs], [m.float() for m in masks.states],
                                    masks.output.float())
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
    model = MogrifierLSTM(4, 3, num_layers=2, rounds=5, rank=rank, cap_input_gate=True,
                          sum_layer_outputs=True).double()
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

    assert torch.autograd.gradcheck(fn, (x, h0, c0, *params), eps=1e-6, atol=1e-7)


def test_dropout_masks_are_shared_over_time_and_come_before_the_rounds():
    torch.manual_seed(0)
    model = MogrifierLSTM(M, N, num_layers=2, rounds=5, rank=3, input_dropout=0.5, inter_layer_dropout=0.4,
                          state_dropout=0.3, output_dropout=0.6, shared_mask_dropout=True).double().train()
    randomize(model)
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
        pre = (x_up * masks.inputs[0]) @ layer.weight_ih.t() + (h_up * masks.states[0]) @ layer.weight_hh.t() \
            + layer.bias
        i, f, j, o = torch.sigmoid(pre[:, :n]), torch.sigmoid(pre[:, n:2 * n]), torch.tanh(pre[:, 2 * n:3 * n]), \
            torch.sigmoid(pre[:, 3 * n:])
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
    torch.manual_seed(0)
    model = MogrifierLSTM(M, N, num_layers=2, rounds=5, rank=3, input_dropout=0.5, inter_layer_dropout=0.4,
                          state_dropout=0.3, output_dropout=0.6, state_dropout_per_step=state_per_step)
    model = randomize(model.double()).train()
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
        values = bias[k * n: (k + 1) * n]
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


@pytest.mark.parametrize("kwargs, words", [
    (dict(rounds=-1), ["rounds", "--mogrifier-rounds"]),
    (dict(rank=-2), ["rank", "--mogrifier-rank"]),
    (dict(rank=N), ["rank", "--mogrifier-rank", "min(input_size, hidden_size) = 5"]),
    (dict(rank=1.5), ["rank", "--mogrifier-rank"]),
    (dict(input_dropout=1.0), ["input_dropout", "--mogrifier-input-dropout"]),
    (dict(inter_layer_dropout=-0.1), ["inter_layer_dropout", "--mogrifier-inter-layer-dropout"]),
    (dict(state_dropout=1.5), ["state_dropout", "--mogrifier-state-dropout"]),
    (dict(output_dropout=1.0), ["output_dropout", "--mogrifier-output-dropout"]),
    (dict(num_layers=0), ["num_layers", "--mogrifier-layers"]),
    (dict(hidden_size=0), ["hidden_size", "--mogrifier-hidden-size"]),
    (dict(input_size=0), ["input_size", "--mogrifier-embed-dim"]),
])
def test_invalid_settings_raise(kwargs, words):
    args = dict(input_size=M, hidden_size=N)
    args.update(kwargs)
    with pytest.raises(ValueError) as err:
        MogrifierLSTM(**args)
    for word in words:
        assert word in str(err.value)


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
    model = MogrifierLSTM(M, N, num_layers=2, rounds=5, rank=3, input_dropout=0.2, inter_layer_dropout=0.2,
                          state_dropout=0.2, output_dropout=0.2)
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
    torch.manual_seed(0)
    model = randomize(MogrifierLSTM(M, N, num_layers=2, rounds=5, rank=3)).double()
    x, state = make_inputs(model)
    expected = outputs_and_grads(model.forward, model, x, state, None)
    gpu = MogrifierLSTM(M, N, num_layers=2, rounds=5, rank=3).double().cuda()
    gpu.load_state_dict(model.state_dict())
    xg = x.detach().cuda().requires_grad_(True)
    sg = [(h.detach().cuda().requires_grad_(True), c.detach().cuda().requires_grad_(True)) for h, c in state]
    got = outputs_and_grads(gpu.forward, gpu, xg, sg, None)
    assert_same((got[0].cpu(), [(h.cpu(), c.cpu()) for h, c in got[1]], [g.cpu() for g in got[2]]), expected,
                "gpu", atol=1e-9)
    assert math.isfinite(got[0].sum().item())


@pytest.mark.parametrize("policy, one_thread", [("PASSIVE", "True"), ("passive", "True"), ("ACTIVE", "False"),
                                                (None, "False")])
def test_small_work_runs_on_one_thread_only_under_the_passive_wait_policy(policy, one_thread):
    """The switch to one thread pays where waking OpenMP's sleeping threads is expensive (PASSIVE) and costs time
    otherwise; the OpenMP runtime reads the policy at start-up, so a fresh process decides."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    code = ("from define_fairseq.modules import mogrifier_recurrence; "
            "print(mogrifier_recurrence.small_work_on_one_thread())")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert proc.stdout.split()[-1] == one_thread


def test_wait_policy_is_read_when_first_needed_not_at_import():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = ("import os; from define_fairseq.modules import mogrifier_recurrence; "
            "os.environ['OMP_WAIT_POLICY'] = 'PASSIVE'; print(mogrifier_recurrence.small_work_on_one_thread())")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert proc.stdout.split()[-1] == "True"


def test_thread_switch_restores_the_callers_thread_count(monkeypatch):
    monkeypatch.setattr(mogrifier_recurrence, "SMALL_WORK_ON_ONE_THREAD", True)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with mogrifier_recurrence.Threads(torch.device("cpu")) as threads:
                assert torch.get_num_threads() == 1
                threads.large()
                assert torch.get_num_threads() == 2
                threads.small()
                raise RuntimeError("inside")
        assert torch.get_num_threads() == 2
        monkeypatch.setattr(mogrifier_recurrence, "SMALL_WORK_ON_ONE_THREAD", False)
        with mogrifier_recurrence.Threads(torch.device("cpu")):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
