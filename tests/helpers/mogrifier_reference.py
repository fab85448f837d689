"""The Mogrifier LSTM by the paper's equations, computed literally (the reference of the MogrifierLSTM tests),
and the random inputs, masks and losses those tests compare on."""

import torch

from define_fairseq.modules.mogrifier.layer import MogrifierDropoutMasks

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
            f_gate = torch.sigmoid(pre[:, n : 2 * n])
            j = torch.tanh(pre[:, 2 * n : 3 * n])
            o_gate = torch.sigmoid(pre[:, 3 * n :])
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

    return MogrifierDropoutMasks(
        [mask(layer.input_size) for layer in model.layers],
        [mask(model.hidden_size) for _ in model.layers],
        mask(model.hidden_size),
    )


def scalar_loss(out, state, seed=2):
    """A random linear functional of the output and the final state (so every gradient path is exercised)."""
    g = torch.Generator().manual_seed(seed)

    def weights(t):  # drawn on the CPU in float64 whatever the device and dtype, so that every run gets the same
        return torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.device, t.dtype)

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
    state = [
        (
            torch.randn(B, model.hidden_size, generator=g, dtype=torch.float64, requires_grad=True),
            torch.randn(B, model.hidden_size, generator=g, dtype=torch.float64, requires_grad=True),
        )
        for _ in range(model.num_layers)
    ]
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
