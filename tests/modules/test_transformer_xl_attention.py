"""rel_shift, relative multi-head attention and the Transformer-XL stack (memory, causal and same-length masks,
relative positions, cached keys and values) against naive re-computations, and their parameter counts."""

import math

import pytest
import torch
from test_projected_adaptive_softmax import count

from define_fairseq.modules import RelativeMultiheadAttention, TransformerXLStack, rel_shift


def small_stack(**kwargs):
    torch.manual_seed(0)
    config = dict(num_layers=2, d_model=8, num_heads=2, head_dim=3, d_inner=16, dropout=0.0, mem_len=4)
    config.update(kwargs)
    return TransformerXLStack(**config).double().eval()


# --------------------------------------------------------------------------------------------------------------
# rel_shift and the attention


@pytest.mark.parametrize("t,m", [(4, 0), (3, 5), (1, 2)])
def test_rel_shift_equals_direct_gather(t, m):
    torch.manual_seed(0)
    k = m + t
    b, h, dh = 2, 3, 5
    q = torch.randn(t, b, h, dh, dtype=torch.float64)
    r = torch.randn(k, h, dh, dtype=torch.float64)
    raw = torch.einsum("ibhd,jhd->bhij", q, r)
    shifted = rel_shift(raw)
    assert shifted.shape == (b, h, t, k)
    for i in range(t):
        for j in range(m + i + 1):
            expected = torch.einsum("bhd,hd->bh", q[i], r[k - 1 - (m + i - j)])
            torch.testing.assert_close(shifted[:, :, i, j], expected)


def naive_attention(att, x, pos, u, v, mask, memory):
    """Loops over batch, head, query and key."""
    t, b, d = x.shape
    cat = x if memory is None else torch.cat([memory, x])
    k = cat.size(0)
    m = k - t
    h, dh = att.num_heads, att.head_dim
    src = att.layer_norm(cat) if att.pre_norm else cat
    wq, wk, wv = att.qkv.weight.chunk(3, dim=0)
    r = (pos @ att.r_net.weight.T).view(k, h, dh)
    out = torch.zeros(t, b, h * dh, dtype=x.dtype)
    for bi in range(b):
        for hi in range(h):
            sl = slice(hi * dh, (hi + 1) * dh)
            for i in range(t):
                qi = src[m + i, bi] @ wq[sl].T
                scores = []
                for j in range(k):
                    if mask[i, j]:
                        scores.append(torch.tensor(-math.inf, dtype=x.dtype))
                        continue
                    kj = src[j, bi] @ wk[sl].T
                    dist = m + i - j
                    scores.append(((qi + u[hi]) @ kj + (qi + v[hi]) @ r[k - 1 - dist, hi]) / math.sqrt(dh))
                probs = torch.softmax(torch.stack(scores), dim=0)
                values = src[:, bi] @ wv[sl].T
                out[i, bi, sl] = probs @ values
    y = out @ att.out.weight.T
    return x + y if att.pre_norm else att.layer_norm(x + y)


@pytest.mark.parametrize("pre_norm", [False, True])
@pytest.mark.parametrize("m", [0, 3])
def test_attention_matches_naive_loops(pre_norm, m):
    torch.manual_seed(0)
    d, h, dh, t, b = 6, 2, 4, 3, 2
    att = RelativeMultiheadAttention(d, h, dh, pre_norm=pre_norm).double()
    for p in att.parameters():
        torch.nn.init.normal_(p, 0.0, 0.5)
    x = torch.randn(t, b, d, dtype=torch.float64)
    memory = torch.randn(m, b, d, dtype=torch.float64) if m else None
    pos = torch.randn(m + t, d, dtype=torch.float64)
    u = torch.randn(h, dh, dtype=torch.float64)
    v = torch.randn(h, dh, dtype=torch.float64)
    mask = torch.ones(t, m + t, dtype=torch.bool).triu(1 + m)
    mask[t - 1, 0] = True  # an extra masked key as well
    x.requires_grad_(True)
    got = att(x, pos, u, v, mask, memory)
    want = naive_attention(att, x, pos, u, v, mask, memory)
    torch.testing.assert_close(got, want)
    # the gradients too: the memory goes through the key/value rows of the weight only, the naive loops take
    # queries, keys and values of cat(memory, x) from the whole weight
    weights = torch.randn_like(got)
    inputs = [x, *att.parameters()]
    for a, b in zip(
        torch.autograd.grad((got * weights).sum(), inputs), torch.autograd.grad((want * weights).sum(), inputs)
    ):
        torch.testing.assert_close(a, b)


def test_attention_width_may_differ_from_d_model():
    att = RelativeMultiheadAttention(12, 10, 5)
    assert att.qkv.weight.shape == (150, 12) and att.r_net.weight.shape == (50, 12)
    assert att.out.weight.shape == (12, 50)
    assert all(mod.bias is None for mod in (att.qkv, att.r_net, att.out))


# --------------------------------------------------------------------------------------------------------------
# the stack


def test_causality_with_and_without_memory():
    stack = small_stack()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    memory = [torch.randn(3, 2, 8, dtype=torch.float64) for _ in range(2)]
    for mem in (None, memory):
        base, _ = stack(x, mem)
        for t in range(6):
            changed = x.clone()
            changed[:, t] += torch.randn(2, 8, dtype=torch.float64)
            out, _ = stack(changed, mem)
            torch.testing.assert_close(out[:, :t], base[:, :t], rtol=0, atol=1e-12)
            assert not torch.allclose(out[:, t], base[:, t])


@pytest.mark.parametrize("pre_norm", [False, True])
def test_segments_with_memory_equal_one_pass(pre_norm):
    stack = small_stack(pre_norm=pre_norm)
    x = torch.randn(2, 12, 8, dtype=torch.float64)
    full, full_memory = stack(x, keep=100)
    memory, outs = None, []
    for start in range(0, 12, 4):
        out, memory = stack(x[:, start : start + 4], memory, keep=100)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=1e-9, atol=1e-9)
    for a, b in zip(memory, full_memory):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    assert full_memory[0].shape == (12, 2, 8)
    torch.testing.assert_close(full_memory[0], x.transpose(0, 1))  # layer 0's input is the (undropped) input


def test_mem_len_keeps_exactly_the_last_states_and_is_detached():
    stack = small_stack(mem_len=3)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    memory = [torch.randn(2, 2, 8, dtype=torch.float64) for _ in range(2)]
    _, everything = stack(x, memory, keep=100)
    assert [m.shape[0] for m in everything] == [7, 7]
    torch.testing.assert_close(everything[0][:2], memory[0])
    out, kept = stack(x, memory)
    assert all(m.shape == (3, 2, 8) for m in kept)
    for a, b in zip(kept, everything):
        torch.testing.assert_close(a, b[-3:])
    assert not any(m.requires_grad for m in kept) and out.requires_grad
    _, none = stack(x, memory, keep=0)
    assert all(m.shape == (0, 2, 8) for m in none)
    stack.mem_len = 0
    _, none = stack(x)
    assert all(m.shape == (0, 2, 8) for m in none)
    out, _ = stack(x, none)  # an empty memory works
    torch.testing.assert_close(out, stack(x)[0])


def test_memory_gets_no_gradient():
    stack = small_stack()
    memory = [torch.randn(3, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    out, new_memory = stack(x, memory)
    out.sum().backward()
    assert x.grad is not None
    assert all(not m.requires_grad and m.grad_fn is None for m in new_memory)


def test_memory_validation():
    stack = small_stack()
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="one tensor per layer"):
        stack(x, [torch.zeros(3, 2, 8, dtype=torch.float64)])
    with pytest.raises(ValueError, match=r"memory\[1\]"):
        stack(x, [torch.zeros(3, 2, 8, dtype=torch.float64), torch.zeros(2, 2, 8, dtype=torch.float64)])
    with pytest.raises(ValueError, match=r"memory\[0\]"):
        stack(x, [torch.zeros(3, 1, 8, dtype=torch.float64)] * 2)


def test_causal_and_same_length_masks_follow_the_original_rule():
    stack = small_stack(mem_len=2)
    causal = stack.attention_mask(3, 2)
    assert causal.tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]]
    stack.same_length = True
    # T=3, M=2, mem_len=2: K=5, mask_len=3, shift=0: every query sees exactly 2 keys
    assert stack.attention_mask(3, 2).int().tolist() == [[1, 0, 0, 1, 1], [1, 1, 0, 0, 1], [1, 1, 1, 0, 0]]
    # T=3, M=0, mem_len=2: K=3, mask_len=1, shift=2
    assert stack.attention_mask(3, 0).int().tolist() == [[0, 1, 1], [0, 0, 1], [1, 0, 0]]
    # T=2, M=1, mem_len=4: mask_len=-1 <= 0, shift=T: only the causal part
    stack.mem_len = 4
    assert stack.attention_mask(2, 1).int().tolist() == [[0, 0, 1], [0, 0, 0]]
    # T=2, M=3, mem_len=2: K=5, mask_len=3, shift=-1: query 0 sees keys 2..3, query 1 keys 3..4
    stack.mem_len = 2
    assert stack.attention_mask(2, 3).int().tolist() == [[1, 1, 0, 0, 1], [1, 1, 1, 0, 0]]
    stack.mem_len = 0
    with pytest.raises(ValueError, match="same_length"):
        stack.attention_mask(2, 0)


def test_same_length_changes_the_output_only_beyond_the_window():
    stack = small_stack(mem_len=2)
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    base, _ = stack(x)
    stack.same_length = True
    windowed, _ = stack(x)
    torch.testing.assert_close(windowed[:, :2], base[:, :2])
    assert not torch.allclose(windowed[:, 2:], base[:, 2:])


def test_relative_positions_and_clamp_len():
    stack = small_stack()
    inv = 1.0 / 10000 ** (torch.arange(0.0, 8, 2) / 8)
    dist = torch.tensor([5.0, 4, 3, 2, 1, 0])
    angles = dist[:, None] * inv[None]
    torch.testing.assert_close(stack.relative_positions(6), torch.cat([angles.sin(), angles.cos()], -1))
    stack.clamp_len = 3
    angles = dist.clamp(max=3)[:, None] * inv[None]
    torch.testing.assert_close(stack.relative_positions(6), torch.cat([angles.sin(), angles.cos()], -1))

    x = torch.randn(2, 6, 8, dtype=torch.float64)
    stack.clamp_len = -1
    free, _ = stack(x)
    short, _ = stack(x[:, :4])
    stack.clamp_len = 3  # K = 4 <= c + 1: no distance is clamped
    torch.testing.assert_close(stack(x[:, :4])[0], short)
    clamped, _ = stack(x)  # K = 6: distances 4 and 5 are clamped
    assert not torch.allclose(clamped, free)
    torch.testing.assert_close(clamped[:, :4], free[:, :4])  # queries 0..3 only see distances <= 3


@pytest.mark.parametrize("pre_norm", [False, True])
def test_pre_and_post_norm_shapes_and_bf16(pre_norm):
    torch.manual_seed(0)
    stack = TransformerXLStack(2, 8, 2, 3, 16, dropout=0.1, attention_dropout=0.1, pre_norm=pre_norm, mem_len=3)
    assert (stack.final_norm is not None) == pre_norm
    x = torch.randn(2, 5, 8)
    out, memory = stack(x)
    assert out.shape == (2, 5, 8) and len(memory) == 2 and memory[0].shape == (3, 2, 8)
    out.sum().backward()
    assert stack.r_w_bias.grad is not None and stack.r_r_bias.grad is not None
    stack = stack.to(torch.bfloat16)
    for train in (True, False):
        stack.train(train)
        out, memory = stack(x.bfloat16())
        out2, _ = stack(x.bfloat16(), memory)
        assert out.dtype == out2.dtype == torch.bfloat16 and memory[0].dtype == torch.bfloat16
        assert torch.isfinite(out).all() and torch.isfinite(out2).all()


def test_stack_validation():
    ok = dict(num_layers=1, d_model=8, num_heads=2, head_dim=4, d_inner=16)
    for name, bad in [
        ("num_layers", 0),
        ("d_model", 0),
        ("num_heads", 0),
        ("head_dim", 0),
        ("d_inner", 0),
        ("mem_len", -1),
        ("clamp_len", -2),
        ("dropout", 1.0),
        ("dropout", -0.1),
    ]:
        with pytest.raises(ValueError, match=name):
            TransformerXLStack(**{**ok, name: bad})
    with pytest.raises(ValueError, match="d_model"):
        TransformerXLStack(**{**ok, "d_model": 7})
    TransformerXLStack(**ok, clamp_len=0)


def test_initialisation():
    torch.manual_seed(0)
    stack = TransformerXLStack(2, 64, 4, 16, 128, pre_norm=True)
    ff = stack.layers[0].feed_forward
    assert torch.count_nonzero(ff.fc1.bias) == 0 and torch.count_nonzero(ff.fc2.bias) == 0
    assert abs(ff.fc1.weight.std().item() - 0.02) < 0.002
    ln = stack.layers[1].attention.layer_norm
    assert abs(ln.weight.mean().item() - 1.0) < 0.01 and 0.01 < ln.weight.std().item() < 0.03
    assert torch.count_nonzero(ln.bias) == 0
    assert 0.01 < stack.r_w_bias.std().item() < 0.03 and not torch.equal(stack.r_w_bias, stack.r_r_bias)


def stack_formula(layers, d, h, dh, d_inner, pre_norm=False):
    attention = 3 * d * h * dh + d * h * dh + h * dh * d + 2 * d
    feed_forward = d * d_inner + d_inner + d_inner * d + d + 2 * d
    return layers * (attention + feed_forward) + 2 * h * dh + (2 * d if pre_norm else 0)


@pytest.mark.parametrize("d,d_inner,expected", [(410, 2100, 41_067_220), (384, 1920, 36_250_420)])
def test_stack_parameter_counts(d, d_inner, expected):
    with torch.device("meta"):
        stack = TransformerXLStack(16, d, 10, 41, d_inner)
        pre = TransformerXLStack(3, d, 10, 41, d_inner, pre_norm=True)
    assert count(stack) == stack_formula(16, d, 10, 41, d_inner) == expected
    assert count(pre) == stack_formula(3, d, 10, 41, d_inner, pre_norm=True)


@pytest.mark.parametrize("pre_norm,same_length,clamp_len", [(False, False, -1), (True, True, 3)])
def test_cached_keys_and_values_give_the_same_outputs_and_memory(pre_norm, same_length, clamp_len):
    """Evaluation with the memory's keys and values kept (``return_kv`` / ``memory_kv``) equals recomputing them
    from the memory every segment, over segments that fill and then slide a memory of 6, and the kept keys and
    values are those of the kept memory."""
    stack = (
        TransformerXLStack(
            2, 8, 2, 3, 16, dropout=0.0, pre_norm=pre_norm, mem_len=6, clamp_len=clamp_len, same_length=same_length
        )
        .double()
        .eval()
    )
    x = torch.randn(2, 16, 8, dtype=torch.float64)
    memory = cached = kv = None
    with torch.no_grad():
        for start in range(0, 16, 4):
            plain, memory = stack(x[:, start : start + 4], memory)
            fast, cached, kv = stack(x[:, start : start + 4], cached, memory_kv=kv, return_kv=True)
            torch.testing.assert_close(fast, plain, rtol=0, atol=1e-12)
            for layer, (mem, mem_c, (keys, values)) in enumerate(zip(memory, cached, kv)):
                torch.testing.assert_close(mem_c, mem, rtol=0, atol=1e-12)
                attention = stack.layers[layer].attention
                heads = attention.qkv(attention.layer_norm(mem) if pre_norm else mem)
                expected_keys, expected_values = heads.chunk(3, dim=-1)[1:]
                torch.testing.assert_close(keys, expected_keys, rtol=0, atol=1e-12)
                torch.testing.assert_close(values, expected_values, rtol=0, atol=1e-12)
    assert memory[0].shape == kv[0][0].shape[:2] + (8,) == (6, 2, 8)
    with pytest.raises(ValueError, match="memory_kv needs the memory"):
        stack(x[:, :4], None, memory_kv=kv)
