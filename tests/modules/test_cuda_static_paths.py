"""The static paths on a CUDA device: the DeFINE embedding's ``table`` path makes no synchronising call in a training
forward and backward (the ``unique`` path makes one, ``torch.unique``), the projected adaptive softmax's
``static_shapes`` forward neither, ``GroupLinear`` under bf16 autocast takes its device's formulation (the fused one
on a CPU, the plain one on a GPU) and agrees with the reference formulation under autocast, the row-selecting
adaptive softmax and ``AdaptiveInput`` wait for the host once a step each, and Transformer-XL layers compiled as CUDA
graphs carry their memory safely.

Marked ``cuda``; skipped without a CUDA device; ``DEFINE_FAIRSEQ_CUDA_TESTS=cpu`` runs them on the CPU (see
``cuda_device``), where no synchronising call can be counted.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from cuda_device import CUDA_TESTS, DEVICE, ON_CPU, counted_syncs, fp32_arithmetic

from define_fairseq.modules import (
    AdaptiveInput,
    DeFINEEmbedding,
    GroupLinear,
    ProjectedAdaptiveSoftmax,
    TransformerXLStack,
)
from define_fairseq.modules.define import group_linear
from define_fairseq.modules.define.embedding import TOKEN_PATHS

pytestmark = CUDA_TESTS


def embedding(path, dtype=torch.float32):
    torch.manual_seed(0)
    return DeFINEEmbedding(300, n=16, k=64, m=24, padding_idx=1, token_path=path).to(DEVICE, dtype).train()


def tokens():
    return torch.randint(0, 300, (4, 9), generator=torch.Generator().manual_seed(1)).to(DEVICE)


@pytest.mark.parametrize("path", TOKEN_PATHS)
def test_token_paths_equal_the_per_position_computation(path):
    """float64 on the device, tolerances as in ``test_define_embedding``: only the summation order differs."""
    emb = embedding(path, torch.float64)
    params = list(emb.parameters())
    out = emb(tokens())
    literal = emb.define(emb.table(tokens()) * math.sqrt(16))
    torch.testing.assert_close(out, literal, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(out.square().sum(), params)
    for a, b in zip(grads, torch.autograd.grad(literal.square().sum(), params)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_table_path_makes_no_synchronising_call():
    syncs = {}
    for path in ("unique", "table"):
        emb, x = embedding(path), tokens()
        emb(x).square().sum().backward()  # first calls (allocator, kernels) outside the count
        with counted_syncs() as found:
            emb(x).square().sum().backward()
        syncs[path] = found
    assert syncs["table"] == []
    if not ON_CPU:
        assert syncs["unique"], "torch.unique should make the host wait: is the sync counting working?"


def test_static_adaptive_softmax_makes_no_synchronising_call():
    torch.manual_seed(0)
    softmax = ProjectedAdaptiveSoftmax(300, 16, 24, [100, 200], static_shapes=True).to(DEVICE).train()
    h = torch.randn(36, 24, device=DEVICE, requires_grad=True)
    target = torch.randint(0, 300, (36,), device=DEVICE)

    def step():
        logits, targets = softmax(h, target)
        sum(F.cross_entropy(lg, tg, reduction="sum") for lg, tg in zip(logits, targets)).backward()

    step()
    with counted_syncs() as found:
        step()
    assert found == []


def test_adaptive_softmax_and_input_wait_for_the_host_once_a_step():
    """The row-selecting adaptive softmax and ``AdaptiveInput`` learn their clusters' (bands') sizes with one
    synchronising call each, for all clusters at once, in a training forward and backward."""
    torch.manual_seed(0)
    softmax = ProjectedAdaptiveSoftmax(300, 16, 24, [100, 200]).to(DEVICE).train()
    adaptive = AdaptiveInput(300, 1, 24, [100, 200], factor=2).to(DEVICE).train()
    x = torch.randint(0, 300, (4, 9), device=DEVICE)
    target = torch.randint(0, 300, (36,), device=DEVICE)

    def step():
        h = adaptive(x).reshape(36, 24)
        logits, targets = softmax(h, target)
        sum(F.cross_entropy(lg, tg, reduction="sum") for lg, tg in zip(logits, targets)).backward()

    step()
    with counted_syncs() as found:
        step()
    assert len(found) <= 2, found
    for module in ("adaptive_input.py", "projected_adaptive_softmax.py"):
        assert sum(line.split(":")[0].endswith(module) for line in found) <= 1, found


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_group_linear_under_autocast_takes_its_devices_formulation(dtype, monkeypatch):
    if ON_CPU and dtype == torch.float16:
        pytest.skip("float16 autocast: the CUDA case")
    calls = []
    apply = group_linear._GroupLinearFunction.apply
    monkeypatch.setattr(group_linear._GroupLinearFunction, "apply", lambda *a: calls.append(1) or apply(*a))
    torch.manual_seed(0)
    layer = GroupLinear(64, 128, 4).to(DEVICE)
    x = torch.randn(33, 64, device=DEVICE, requires_grad=True)
    with torch.autocast(DEVICE.type, dtype=dtype):
        y = layer(x)
        expected = group_linear._group_linear_reference(x, layer.weight, layer.bias)
    assert calls == ([1] if DEVICE.type in group_linear.FUSED_DEVICES else []) and y.dtype == dtype
    torch.testing.assert_close(y, expected)  # dtype's tolerance: one rounding of the same accumulation
    g = torch.randn_like(y)
    params = [x, layer.weight, layer.bias]
    for a, b in zip(torch.autograd.grad(y, params, g), torch.autograd.grad(expected, params, g)):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1.6e-2, atol=1e-2)


def test_transformer_xl_layers_as_cuda_graphs_carry_their_memory_safely():
    """Each layer compiled as CUDA graphs (``reduce-overhead``, as ``--torch-compile-mode reduce-overhead`` builds
    it), the memory carried over four training segments, then evaluation with the keys and values carried: equal to
    the eager stack. A memory left in a graph's output buffer would be overwritten by the next replay and differ.
    On the CPU: ``aot_eager``, no CUDA graphs (what is checked there is the harness)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    stack = TransformerXLStack(3, 32, 4, 8, 64, dropout=0.0, mem_len=6).to(DEVICE)
    graphs = TransformerXLStack(3, 32, 4, 8, 64, dropout=0.0, mem_len=6).to(DEVICE)
    graphs.load_state_dict(stack.state_dict())
    options = dict(backend="aot_eager") if ON_CPU else dict(mode="reduce-overhead")
    for layer in graphs.layers:
        layer.compile(**options)
    graphs.clone_memory = True
    segments = torch.randn(6, 2, 6, 32, device=DEVICE).requires_grad_()
    with fp32_arithmetic():
        memory = memory_g = None
        for x in segments[:4]:
            out, memory = stack(x, memory)
            torch.compiler.cudagraph_mark_step_begin()  # as the Transformer-XL decoder does
            out_g, memory_g = graphs(x, memory_g)
            # float32 on one device; inductor's kernels may sum in another order than eager ones
            torch.testing.assert_close(out_g, out, rtol=1e-4, atol=1e-5)
            grads = [
                torch.autograd.grad(o.square().sum(), list(s.parameters())) for o, s in ((out, stack), (out_g, graphs))
            ]
            for a, b in zip(*grads):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        with torch.no_grad():
            kv = kv_g = None
            for x in segments[4:]:
                out, memory, kv = stack.eval()(x, memory, memory_kv=kv, return_kv=True)
                torch.compiler.cudagraph_mark_step_begin()
                out_g, memory_g, kv_g = graphs.eval()(x, memory_g, memory_kv=kv_g, return_kv=True)
                torch.testing.assert_close(out_g, out, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
