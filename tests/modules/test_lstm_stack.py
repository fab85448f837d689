"""LSTMStack, locked dropout, weight drop and embedding dropout against plain re-computations (no fairseq)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from define_fairseq.modules.awd_lstm.locked_dropout import LockedDropout, locked_dropout
from define_fairseq.modules.awd_lstm.lstm_stack import LSTMStack
from define_fairseq.modules.awd_lstm.weight_drop import WeightDropLSTM, embedding_dropout


def reference_lstm_layer(x, w_ih, w_hh, b_ih, b_hh, h, c):
    """One LSTM layer written out step by step (PyTorch's gate order i, f, g, o). x [B, T, I]; h, c [B, H]."""
    outputs = []
    for t in range(x.size(1)):
        gates = x[:, t] @ w_ih.t() + b_ih + h @ w_hh.t() + b_hh
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs, dim=1), h, c


def layer_weights(stack, i):
    lstm = stack.layers[i].lstm
    return lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0


def random_state(sizes, batch):
    return [(torch.randn(batch, s), torch.randn(batch, s)) for s in sizes]


def test_stack_equals_multi_layer_nn_lstm_with_copied_weights():
    torch.manual_seed(0)
    stack = LSTMStack(5, [6, 6, 6]).eval()
    reference = nn.LSTM(5, 6, num_layers=3, batch_first=True).eval()
    with torch.no_grad():
        for i in range(3):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(reference, f"{name}_l{i}").copy_(getattr(stack.layers[i].lstm, f"{name}_l0"))
    x = torch.randn(3, 7, 5)
    state = random_state([6, 6, 6], 3)
    out, new_state = stack(x, state)
    h0 = torch.stack([h for h, _ in state])
    c0 = torch.stack([c for _, c in state])
    ref_out, (ref_h, ref_c) = reference(x, (h0, c0))
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(torch.stack([h for h, _ in new_state]), ref_h)
    torch.testing.assert_close(torch.stack([c for _, c in new_state]), ref_c)


def test_stack_of_different_sizes_equals_step_by_step_recomputation():
    torch.manual_seed(1)
    stack = LSTMStack(4, [9, 7, 3]).eval()
    x = torch.randn(2, 6, 4)
    state = random_state([9, 7, 3], 2)
    out, new_state = stack(x, state)
    assert out.shape == (2, 6, 3)
    h_in = x
    for i in range(3):
        h_in, h, c = reference_lstm_layer(h_in, *layer_weights(stack, i), *state[i])
        torch.testing.assert_close(new_state[i][0], h)
        torch.testing.assert_close(new_state[i][1], c)
    torch.testing.assert_close(out, h_in)


def test_zero_state_is_the_default_and_state_carries_over_windows():
    torch.manual_seed(2)
    stack = LSTMStack(4, [8, 5]).eval()
    x = torch.randn(2, 9, 4)
    full, full_state = stack(x)
    zero = stack.zero_state(2, x)
    torch.testing.assert_close(stack(x, zero)[0], full)
    first, state = stack(x[:, :4])
    second, second_state = stack(x[:, 4:], state)
    torch.testing.assert_close(torch.cat([first, second], dim=1), full)
    for (h, c), (h_ref, c_ref) in zip(second_state, full_state):
        torch.testing.assert_close(h, h_ref)
        torch.testing.assert_close(c, c_ref)


def test_locked_dropout_shares_one_mask_over_time():
    torch.manual_seed(3)
    x = torch.ones(16, 12, 10)
    y = locked_dropout(x, 0.5, training=True)
    assert set(y.unique().tolist()) == {0.0, 2.0}
    assert torch.equal(y, y[:, :1].expand_as(y))  # the same mask at every time step
    assert not torch.equal(y[0], y[1])  # but one per sequence
    time_first = locked_dropout(x.transpose(0, 1), 0.5, training=True, batch_first=False)
    assert torch.equal(time_first, time_first[:1].expand_as(time_first))
    module = LockedDropout(0.5)
    module.eval()
    assert torch.equal(module(x), x)
    assert torch.equal(locked_dropout(x, 0.0), x)
    with pytest.raises(ValueError, match="probability"):
        LockedDropout(1.0)


def test_hidden_dropout_between_layers_is_locked():
    torch.manual_seed(4)
    stack = LSTMStack(3, [6, 4], hidden_dropout=0.5).train()
    seen = {}
    stack.layers[1].register_forward_pre_hook(lambda module, args: seen.setdefault("input", args[0]))
    stack(torch.randn(5, 8, 3))
    zeros = seen["input"] == 0
    assert zeros.any()
    assert torch.equal(zeros, zeros[:, :1].expand_as(zeros))  # whole features of a sequence are dropped
    stack.eval()
    seen.clear()
    stack(torch.randn(5, 8, 3))
    assert not (seen["input"] == 0).any()


def test_weight_drop_is_applied_and_reaches_the_raw_weight():
    torch.manual_seed(5)
    layer = WeightDropLSTM(4, 6, weight_drop=0.5).train()
    raw = layer.lstm.weight_hh_l0
    x = torch.randn(3, 7, 4)

    torch.manual_seed(11)
    out, (h, c) = layer(x)
    torch.manual_seed(11)
    dropped = F.dropout(raw.detach(), 0.5, training=True)  # the same draw as inside the layer
    assert (dropped == 0).any()
    w_ih, b_ih, b_hh = layer.lstm.weight_ih_l0, layer.lstm.bias_ih_l0, layer.lstm.bias_hh_l0
    zeros = torch.zeros(3, 6)
    expected, expected_h, expected_c = reference_lstm_layer(x, w_ih, dropped, b_ih, b_hh, zeros, zeros)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(h[0], expected_h)
    torch.testing.assert_close(c[0], expected_c)

    undropped = reference_lstm_layer(x, w_ih, raw, b_ih, b_hh, zeros, zeros)[0]
    assert not torch.allclose(out, undropped)  # the mask changes the output ...
    assert not torch.allclose(layer(x)[0], out)  # ... and a new one is drawn on every call

    torch.manual_seed(11)
    out, _ = layer(x)
    out.pow(2).sum().backward()
    assert raw.grad is not None and raw.grad.abs().sum() > 0  # the gradient reaches the raw parameter
    assert torch.all(raw.grad[dropped == 0] == 0)  # through the mask

    layer.eval()
    torch.testing.assert_close(layer(x)[0], undropped.detach())
    assert layer.lstm.weight_hh_l0 is raw  # nothing replaced


def test_stack_weight_drop_changes_the_output_in_training_only():
    torch.manual_seed(6)
    stack = LSTMStack(4, [5, 5], weight_drop=0.6)
    x = torch.randn(2, 5, 4)
    stack.eval()
    reference = stack(x)[0]
    torch.testing.assert_close(stack(x)[0], reference)
    stack.train()
    assert not torch.allclose(stack(x)[0], reference)


def test_embedding_dropout_drops_whole_words():
    torch.manual_seed(7)
    tokens = torch.randint(0, 6, (8, 20))
    embedded = torch.randn(8, 20, 5)
    y = embedding_dropout(embedded, tokens, 6, 0.5, training=True)
    factor = y / embedded
    for word in range(6):
        values = factor[tokens == word]
        if values.numel():
            assert torch.allclose(values, values.flatten()[0].expand_as(values))  # every occurrence alike
            assert values.flatten()[0].item() in (0.0, pytest.approx(2.0))
    assert (factor == 0).any()
    assert torch.equal(embedding_dropout(embedded, tokens, 6, 0.5, training=False), embedded)


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="layer size"):
        LSTMStack(4, [])
    stack = LSTMStack(4, [5, 3])
    with pytest.raises(ValueError, match=r"\[B, T, 4\]"):
        stack(torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match="2 layers"):
        stack(torch.randn(2, 3, 4), random_state([5], 2))
