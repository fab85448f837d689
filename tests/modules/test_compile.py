"""``torch.compile(fullgraph=True)`` of the modules whose shapes are static on their static paths: the DeFINE
embedding (``token_path="table"``), the Transformer-XL stack with its memory, and the projected adaptive softmax
(``static_shapes``). A graph break or a data-dependent operation (``torch.unique``, ``nonzero()``, ``.item()``) fails
the compilation; outputs and gradients are checked against eager ones.

The ``aot_eager`` backend traces forward and backward as the compiler does but runs them with eager kernels: seconds,
so it runs with every ``make test``. ``inductor`` generates and compiles C++ kernels, tens of seconds each on two
cores: ``slow``.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from define_fairseq.modules import DeFINEEmbedding, ProjectedAdaptiveSoftmax, TransformerXLStack

BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]


@pytest.fixture(autouse=True)
def fresh_compiler():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def compiled(module, backend):
    return torch.compile(module, backend=backend, fullgraph=True)


def assert_same_gradients(eager, compiled_grads, **tolerances):
    for a, b in zip(compiled_grads, eager):
        torch.testing.assert_close(a, b, **tolerances)


def check_segments_with_memory(stack, other, segments):
    """``other`` (``stack`` compiled, or a copy with its layers compiled) fed ``segments`` with the memory carried:
    each segment's output, memory and gradients equal the eager stack's."""
    memory = memory_c = None
    for x in segments:
        out, memory = stack(x, memory)
        out_c, memory_c = other(x, memory_c)
        torch.testing.assert_close(out_c, out)
        for a, b in zip(memory_c, memory):
            torch.testing.assert_close(a, b)
        grads = [torch.autograd.grad(o.square().sum(), list(m.parameters())) for o, m in ((out, stack), (out_c, other))]
        assert_same_gradients(*grads)


@pytest.mark.parametrize("backend", BACKENDS)
def test_define_embedding_table_path(backend):
    torch.manual_seed(0)
    emb = DeFINEEmbedding(50, n=16, k=64, m=24, padding_idx=1, token_path="table").train()
    tokens = torch.randint(0, 50, (3, 7))
    params = list(emb.parameters())
    out = emb(tokens)
    grads = torch.autograd.grad(out.square().sum(), params)
    out_c = compiled(emb, backend)(tokens)
    # float32, and inductor fuses the unit's elementwise steps (other roundings): float32 tolerances
    torch.testing.assert_close(out_c, out)
    assert_same_gradients(grads, torch.autograd.grad(out_c.square().sum(), params))


@pytest.mark.parametrize("backend", BACKENDS)
def test_transformer_xl_stack_with_memory(backend):
    """Two segments, the second attending over the first's memory (a second graph, with memory), dropout off."""
    torch.manual_seed(0)
    stack = TransformerXLStack(2, 16, 2, 8, 32, dropout=0.0, mem_len=5).train()
    segments = torch.randn(2, 3, 5, 16)
    check_segments_with_memory(stack, compiled(stack, backend), segments)


def adaptive_loss(softmax, h, target):
    """The summed cross-entropy of every cluster, as the package's ``lm_regularized_loss`` takes it."""
    logits, targets = softmax(h, target)
    return sum(F.cross_entropy(lg.float(), tg, reduction="sum") for lg, tg in zip(logits, targets))


@pytest.mark.parametrize("backend", BACKENDS)
def test_projected_adaptive_softmax_static_shapes(backend):
    torch.manual_seed(0)
    softmax = ProjectedAdaptiveSoftmax(40, 6, 8, [10, 20, 30], static_shapes=True).train()
    h = torch.randn(4, 5, 8, requires_grad=True)
    target = torch.randint(0, 40, (4, 5))
    target[0, :3] = torch.tensor([35, 36, 37])  # at least one row in the last cluster
    params = [h, *softmax.parameters()]
    loss = adaptive_loss(softmax, h, target)
    # the same loss as the row-selecting forward
    softmax.static_shapes = False
    torch.testing.assert_close(loss, adaptive_loss(softmax, h, target))
    softmax.static_shapes = True
    fn = torch.compile(adaptive_loss, backend=backend, fullgraph=True)
    loss_c = fn(softmax, h, target)
    torch.testing.assert_close(loss_c, loss)
    assert_same_gradients(torch.autograd.grad(loss, params), torch.autograd.grad(loss_c, params))
    # the full log-probabilities with autograd compile as well
    log_prob = torch.compile(softmax.get_log_prob, backend=backend, fullgraph=True)
    torch.testing.assert_close(log_prob(h), softmax.get_log_prob(h))
    assert math.isfinite(float(loss_c))


def graph_ops(record):
    """A torch.compile backend that runs the traced graph as it is and adds its operations' names to ``record``."""

    def backend(gm, example_inputs):
        record.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    return backend


@pytest.mark.parametrize("vocab, path", [(50, "table"), (300, "positions")])  # against the 3 x 20 = 60 tokens
def test_define_embedding_auto_path_takes_the_fewer_rows(vocab, path):
    """``auto`` runs the unit on the V rows of the map when V is below the call's tokens, else on every position;
    compiled (the choice is static given the shapes), in float64 equal to the eager ``unique`` path, gradients too."""
    torch.manual_seed(0)
    emb = DeFINEEmbedding(vocab, n=16, k=64, m=24, padding_idx=1, token_path="auto").double().train()
    tokens = torch.randint(0, vocab, (3, 20), generator=torch.Generator().manual_seed(1))
    assert emb.path_for(tokens) == path
    params = list(emb.parameters())
    ops = []
    out = torch.compile(emb, backend=graph_ops(ops), fullgraph=True)(tokens)
    # the table path maps every word id (an arange over V); the positions path maps the tokens themselves
    assert any("arange" in op for op in ops) == (path == "table"), ops
    emb.token_path = "unique"
    expected = emb(tokens)
    # float64: the paths sum the unit's gradients over other rows (V words, positions, distinct tokens)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(out.square().sum(), params)
    for a, b in zip(grads, torch.autograd.grad(expected.square().sum(), params)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_transformer_xl_layers_compiled_one_by_one():
    """Regional compilation: every layer compiled in place (the stack runs its memory bookkeeping eagerly); three
    training segments carrying the memory, then evaluation with the keys and values carried, equal to eager ones."""
    torch.manual_seed(0)
    stack = TransformerXLStack(3, 16, 2, 8, 32, dropout=0.0, mem_len=4)
    regional = TransformerXLStack(3, 16, 2, 8, 32, dropout=0.0, mem_len=4)
    regional.load_state_dict(stack.state_dict())
    for layer in regional.layers:
        layer.compile(backend="aot_eager", fullgraph=True)
    assert regional.state_dict().keys() == stack.state_dict().keys()
    segments = torch.randn(3, 2, 4, 16, requires_grad=True)  # as an embedding's output: one graph for every layer
    check_segments_with_memory(stack, regional, segments)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2  # without a memory, then with one
    with torch.no_grad():
        memory = memory_r = kv = kv_r = None
        for x in segments:
            out, memory, kv = stack.eval()(x, memory, memory_kv=kv, return_kv=True)
            out_r, memory_r, kv_r = regional.eval()(x, memory_r, memory_kv=kv_r, return_kv=True)
            torch.testing.assert_close(out_r, out)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 4


def storages(tensors):
    return {t.untyped_storage().data_ptr() for t in tensors}


@pytest.mark.parametrize("clone", [False, True])
def test_transformer_xl_memory_under_cuda_graphs_owns_its_storage(clone):
    """With ``clone_memory`` (set by ``--torch-compile-mode reduce-overhead``) the memory and keys and values carried
    to the next segment share no storage with what a layer returned (a CUDA graph's output buffers, which its next
    replay overwrites); without it the first segment's memory is the layers' outputs themselves."""
    torch.manual_seed(0)
    stack = TransformerXLStack(3, 16, 2, 8, 32, dropout=0.0, mem_len=8).eval()
    stack.clone_memory = clone
    returned = []
    for layer in stack.layers:  # a layer returns (output, (keys, values)) with return_kv
        layer.register_forward_hook(lambda module, args, output: returned.extend([output[0], *output[1]]))
    with torch.no_grad():
        out, memory, kv = stack(torch.randn(2, 4, 16), return_kv=True)
        carried = storages(memory[1:]) | storages(t for pair in kv for t in pair)
        assert bool(carried & storages(returned)) != clone
        again, _, _ = stack(torch.randn(2, 4, 16), memory, memory_kv=kv, return_kv=True)
    assert again.shape == (2, 4, 16)
