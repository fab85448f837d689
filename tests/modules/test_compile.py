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
    yield
    torch._dynamo.reset()


def compiled(module, backend):
    return torch.compile(module, backend=backend, fullgraph=True)


def assert_same_gradients(eager, compiled_grads, **tolerances):
    for a, b in zip(compiled_grads, eager):
        torch.testing.assert_close(a, b, **tolerances)


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
    params = list(stack.parameters())
    fn = compiled(stack, backend)
    memory = memory_c = None
    for x in segments:
        out, memory = stack(x, memory)
        out_c, memory_c = fn(x, memory_c)
        torch.testing.assert_close(out_c, out)
        for a, b in zip(memory_c, memory):
            torch.testing.assert_close(a, b)
        assert_same_gradients(
            torch.autograd.grad(out.square().sum(), params), torch.autograd.grad(out_c.square().sum(), params)
        )


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
