"""The recurrent modules on a CUDA device: MogrifierLSTM's fast path against its reference in float64 (outputs and
gradients), and the fused LSTM layers (weight drop included) running cuDNN's kernel with their weights in one chunk.

Marked ``cuda``; skipped without a CUDA device; ``DEFINE_FAIRSEQ_CUDA_TESTS=cpu`` runs them on the CPU (see
``cuda_device``), where the fused layers run oneDNN's LSTM kernel instead of cuDNN's and float16 is not tested.
"""

import warnings

import pytest
import torch
from arch_cases import build_case
from cuda_device import CUDA_TESTS, DEVICE, ON_CPU

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)
from define_fairseq.modules import LSTMStack, MogrifierLSTM, WeightDropLSTM

pytestmark = CUDA_TESTS

# the autograd node of one fused LSTM call over a whole sequence: cuDNN's on CUDA, oneDNN's on the CPU (float32)
FUSED_LSTM_NODE = {"cuda": "CudnnRnnBackward0", "cpu": "MkldnnRnnLayerBackward0"}[DEVICE.type]
# what PyTorch warns when cuDNN gets an LSTM's weights in separate tensors and copies them into one at every call
SCATTERED_WEIGHTS = "not part of single contiguous chunk of memory"
FUSED_DTYPES = [torch.float32] + ([] if ON_CPU else [torch.float16])
B, T = 3, 6


def graph_nodes(tensor: torch.Tensor):
    """The names of the autograd nodes that ``tensor`` was computed through, with their counts."""
    counts, seen, stack = {}, set(), [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        counts[node.name()] = counts.get(node.name(), 0) + 1
        stack += [child for child, _ in node.next_functions]
    return counts


def recorded_forward_backward(module, *inputs, backward=True):
    """``(output, autograd node counts, warnings)`` of ``module(*inputs)`` and a backward of its sum."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = module(*inputs)[0]
        nodes = graph_nodes(out)
        if backward:
            out.float().sum().backward()
    return out, nodes, [str(w.message) for w in caught]


# -- MogrifierLSTM: the fast path against the reference, float64 --------------------------------------------------

MOGRIFIER_CASES = {
    "5 rounds, full rank": dict(rounds=5, rank=0),
    "6 rounds, rank 3": dict(rounds=6, rank=3),
    "1 round, rank 2, no cap": dict(rounds=1, rank=2, cap_input_gate=False),
    "capped LSTM (hoisted input projection)": dict(rounds=0),
    "LSTM (fused kernel)": dict(rounds=0, cap_input_gate=False),
}


def mogrifier_outputs_and_gradients(run, model, x, state, masks):
    """``[output, every final h and c, the gradients of x, h0, c0 and every parameter]`` of ``run`` (``forward`` or
    ``reference_forward``) under a fixed random linear functional of the output and the final state."""
    out, new_state = run(x, state, masks=masks)
    finals = [t for hc in new_state for t in hc]
    g = torch.Generator().manual_seed(2)
    loss = sum((t * torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.device)).sum() for t in [out, *finals])
    leaves = [x, *[t for hc in state for t in hc], *model.parameters()]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [out, *finals, *[torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, grads)]]


@pytest.mark.parametrize("dropout", [False, True], ids=["eval", "masks"])
@pytest.mark.parametrize("case", MOGRIFIER_CASES)
def test_mogrifier_fast_path_equals_its_reference_in_float64(case, dropout):
    """On the device in float64, ``MogrifierLSTM.forward`` (the hand-written backward through time; the fused LSTM
    kernel for a plain LSTM without a state mask) equals ``reference_forward`` (step by step, autograd): output,
    final state and the gradients of the input, the initial state and every parameter, to float64 rounding. In eval
    mode without masks, and with the dropout masks of a training call passed to both (``masks=``)."""
    torch.manual_seed(0)
    dropouts = dict(input_dropout=0.3, inter_layer_dropout=0.2, state_dropout=0.25, output_dropout=0.1)
    model = MogrifierLSTM(7, 5, num_layers=2, **MOGRIFIER_CASES[case], **(dropouts if dropout else {}))
    with torch.no_grad():
        for p in model.parameters():  # larger than the initialisation, so that every gate works in its non-linear part
            p.copy_(torch.randn(p.shape) * 0.5)
    model = model.to(DEVICE, torch.float64).train(dropout)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, T, 7, generator=g, dtype=torch.float64).to(DEVICE).requires_grad_()
    state = [
        tuple(torch.randn(B, 5, generator=g, dtype=torch.float64).to(DEVICE).requires_grad_() for _ in "hc")
        for _ in range(2)
    ]
    masks = model.sample_dropout_masks(B, T, x) if dropout else None
    fast = mogrifier_outputs_and_gradients(model.forward, model, x, state, masks)
    reference = mogrifier_outputs_and_gradients(model.reference_forward, model, x, state, masks)
    assert len(fast) == len(reference)
    for i, (got, expected) in enumerate(zip(fast, reference)):
        assert got.device.type == DEVICE.type
        torch.testing.assert_close(got, expected, rtol=1e-8, atol=1e-10, msg=f"{case}: output {i}")


# -- the fused LSTM layers run cuDNN ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FUSED_DTYPES, ids=str)
@pytest.mark.parametrize("weight_drop", [0.5, 0.0], ids=["weight drop", "no weight drop"])
def test_lstm_stack_runs_one_fused_call_per_layer(weight_drop, dtype):
    """``LSTMStack`` in training mode (locked dropout between layers, weight drop on every layer's hidden-to-hidden
    matrix): each layer is one call of cuDNN's LSTM over the whole sequence (its autograd node), with its weights in
    one chunk (no warning), and the raw weights get their gradients; with weight drop two calls draw different
    masks."""
    stack = LSTMStack(8, [16, 16, 12], weight_drop=weight_drop, hidden_dropout=0.2).to(DEVICE, dtype).train()
    x = torch.randn(B, T, 8).to(DEVICE, dtype).requires_grad_()
    out, nodes, caught = recorded_forward_backward(stack, x)
    assert nodes.get(FUSED_LSTM_NODE, 0) == len(stack.layers), nodes
    assert not [w for w in caught if SCATTERED_WEIGHTS in w], caught
    for layer in stack.layers:
        for p in layer.lstm.parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all()
    if weight_drop:
        torch.manual_seed(1)
        first = stack(x)[0]
        torch.manual_seed(2)
        assert not torch.equal(first, stack(x)[0])


def test_weight_drop_lstm_eval_runs_the_fused_call():
    """In eval mode (no mask) after training calls, the layer is the plain fused ``nn.LSTM`` call again (whose
    cuDNN kernel, in eval mode, has no backward)."""
    layer = WeightDropLSTM(8, 16, weight_drop=0.5).to(DEVICE)
    x = torch.randn(B, T, 8, device=DEVICE, requires_grad=True)
    recorded_forward_backward(layer.train(), x)
    out, nodes, caught = recorded_forward_backward(layer.eval(), x, backward=False)
    assert nodes.get(FUSED_LSTM_NODE, 0) == 1, nodes
    assert not [w for w in caught if SCATTERED_WEIGHTS in w], caught
    torch.testing.assert_close(out, layer.lstm(x)[0])


@pytest.mark.parametrize("dtype", FUSED_DTYPES, ids=str)
def test_awd_lstm_model_runs_one_fused_call_per_layer(dtype, lm_data):
    """awd_lstm_lm with its own regularisers (weight drop 0.5, locked and embedding dropout, AR/TAR), as fairseq
    builds it and moves it to the device (in float16 as ``--fp16`` casts it): a training pass makes one fused cuDNN
    call per LSTM layer, without the warning."""
    cfg, task, model = build_case(lm_data, "awd_lstm_lm")
    model = model.to(DEVICE, dtype).train()
    layers = model.decoder.lstm.layers
    assert all(layer.weight_drop == 0.5 for layer in layers)
    sample = next(
        task.get_batch_iterator(
            dataset=task.dataset("train"), max_sentences=cfg.dataset.batch_size, seed=1
        ).next_epoch_itr(shuffle=False)
    )
    tokens = sample["net_input"]["src_tokens"].to(DEVICE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model(tokens)[0]
        nodes = graph_nodes(out)
        out.float().sum().backward()
    assert nodes.get(FUSED_LSTM_NODE, 0) == len(layers), nodes
    assert not [str(w.message) for w in caught if SCATTERED_WEIGHTS in str(w.message)]


# -- MogrifierLSTM's plain-LSTM layers: the fused kernel --------------------------------------------------------


def mogrifier_lstm(dtype=torch.float32):
    """Two layers that run the fused LSTM kernel (no rounds, no cap, no state dropout)."""
    return MogrifierLSTM(8, 12, num_layers=2, rounds=0, cap_input_gate=False, input_dropout=0.2).to(DEVICE, dtype)


def test_mogrifier_plain_lstm_layers_run_one_fused_call_each():
    model = mogrifier_lstm().train()
    x = torch.randn(B, T, 8, device=DEVICE, requires_grad=True)
    _, nodes, _ = recorded_forward_backward(model, x)
    assert nodes.get(FUSED_LSTM_NODE, 0) == model.num_layers, nodes


@pytest.mark.xfail(
    DEVICE.type == "cuda",
    strict=True,
    reason=(
        "MogrifierLSTMLayer passes torch.lstm its weight_ih, weight_hh, bias and a fresh zero bias as four separate "
        "tensors: cuDNN copies them into one buffer at every call and warns"
    ),
)
def test_mogrifier_plain_lstm_weights_are_one_chunk():
    model = mogrifier_lstm().train()
    x = torch.randn(B, T, 8, device=DEVICE, requires_grad=True)
    _, _, caught = recorded_forward_backward(model, x)
    assert not [w for w in caught if SCATTERED_WEIGHTS in w], caught
