"""Every registered arch on a CUDA device against the CPU: training steps in float32 and the synchronising calls of
a training pass; and each family's incremental decoding on the device against its full pass.

Marked ``cuda``; skipped without a CUDA device; ``DEFINE_FAIRSEQ_CUDA_TESTS=cpu`` runs them with a second CPU
copy as "the device" (see ``cuda_device``), which checks the harness but not the GPU.
"""

import copy
import math
from collections import Counter

import pytest
import torch
from arch_cases import CASES, FAMILIES, LM, ONE_MORE_LAYER, build_case, family, registered_archs
from cuda_device import CUDA_TESTS, DEVICE, assert_close_at_scale, counted_syncs, fp32_arithmetic, to_device
from lm_helpers import check_incremental_decoding, tokens_batch

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)
from define_fairseq.modules import DeFINE

pytestmark = CUDA_TESTS

LR = 0.1  # plain SGD: the update is -LR x the gradient, so the updated parameters compare the gradients

# Tolerances. Both devices compute in float32 (unit roundoff 6e-8) in different orders (cuBLAS/cuDNN kernels
# against MKL/oneDNN, atomics in the embedding backward): every value differs by rounding only, about sqrt(K) x 6e-8
# of the magnitudes summed for a sum of K terms. Against the same step in float64 on the CPU, float32 is off by at
# most 5e-6 of a tensor's largest gradient entry in every arch here (1e-7 relative for the loss); 1e-4 leaves a
# factor of 20 for the GPU's orderings, while a real difference (a mask, a missing term, a stale state) moves values
# by percents. A gradient that is zero in exact arithmetic (the bias of an attention key projection: the softmax
# ignores a shift shared by all keys) is pure rounding of terms as large as the model's other gradients: tensors
# are compared at no less than GRADIENT_FLOOR x the model's largest gradient entry.
LOSS_RTOL = 1e-5  # the loss is one mean over the batch
TENSOR_REL = 1e-4
GRADIENT_FLOOR = 1e-2


def data_for(arch, lm_data, translation_data):
    return lm_data if CASES[arch][0] == LM else translation_data


def first_batches(cfg, task, count: int):
    batches = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=cfg.dataset.max_tokens, max_sentences=cfg.dataset.batch_size, seed=1
    ).next_epoch_itr(shuffle=False)
    return [next(batches) for _ in range(count)]


def assert_without_dropout(model, criterion, sample):
    """Two training-mode losses of a copy of ``model`` under different seeds are equal: no dropout is left on."""
    probe = copy.deepcopy(model).train()
    with torch.no_grad():
        torch.manual_seed(1)
        first = criterion(probe, sample)[0]
        torch.manual_seed(2)
        second = criterion(probe, sample)[0]
    assert torch.equal(first, second), "a dropout is still active: add its flag to NO_DROPOUT"


def sgd_step(task, model, criterion, optimizer, sample, update: int) -> torch.Tensor:
    """One update as fairseq's Trainer makes it, without its bookkeeping: ``task.train_step`` (forward, the
    criterion's summed loss, backward), the gradients divided by the sample size, one step of fairseq's SGD.
    Returns the loss per sample-size unit; the gradients stay in ``.grad``."""
    optimizer.zero_grad()
    loss, sample_size, _ = task.train_step(sample, model, criterion, optimizer, update)
    optimizer.multiply_grads(1.0 / float(sample_size))
    optimizer.step()
    return loss.detach() / float(sample_size)


@pytest.mark.parametrize("arch", sorted(registered_archs()))
def test_training_steps_equal_the_cpu(arch, lm_data, translation_data):
    """Two training steps (two batches; a family with carried state starts the second from the first one's state)
    of the same initial weights on the CPU and on the device, in float32 with TF32 off: the loss, every gradient and
    every updated parameter agree within float32 rounding.

    A step is fairseq's ``task.train_step`` and one step of fairseq's SGD (``sgd_step``): with plain SGD the update
    is the gradient itself, where Adam's first step (about lr x the gradient's sign) would turn the rounding noise of
    a gradient near zero into a whole step. Dropout is off (``arch_cases.NO_DROPOUT``, checked): CUDA's random
    generator and the CPU's draw different masks from the same seed."""
    from fairseq import optim

    cfg, task, model = build_case(data_for(arch, lm_data, translation_data), arch, dropout=False, optimizer=("sgd", LR))
    samples = first_batches(cfg, task, 2)
    criterion = task.build_criterion(cfg.criterion)
    assert_without_dropout(model, criterion, samples[0])
    device_model = copy.deepcopy(model).to(DEVICE)
    device_criterion = task.build_criterion(cfg.criterion).to(DEVICE)
    cpu_optimizer = optim.build_optimizer(cfg.optimizer, list(model.parameters()))
    device_optimizer = optim.build_optimizer(cfg.optimizer, list(device_model.parameters()))
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    travel = dict.fromkeys(initial, 0.0)  # the sum over the steps of LR x the largest gradient entry
    eps = torch.finfo(torch.float32).eps
    with fp32_arithmetic():
        for update, sample in enumerate(samples):
            expected = sgd_step(task, model, criterion, cpu_optimizer, sample, update)
            got = sgd_step(task, device_model, device_criterion, device_optimizer, to_device(sample), update)
            step = f"{arch}, step {update + 1}"
            assert math.isfinite(expected.item())
            torch.testing.assert_close(got.cpu(), expected, rtol=LOSS_RTOL, atol=0, msg=f"{step}: loss")
            device_parameters = dict(device_model.named_parameters())
            assert device_parameters.keys() == initial.keys()
            floor = GRADIENT_FLOOR * max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None)
            for name, p in model.named_parameters():
                q = device_parameters[name]
                assert q.device.type == DEVICE.type, f"{step}: {name} is on {q.device}"
                assert (p.grad is None) == (q.grad is None), f"{step}: {name} has a gradient on one device only"
                if p.grad is not None:
                    assert_close_at_scale(q.grad, p.grad, f"{step}: gradient of {name}", TENSOR_REL, floor=floor)
                    travel[name] += LR * max(p.grad.abs().max().item(), floor)
                # each update moves a weight by LR x its gradient, known to TENSOR_REL of the gradient's scale, and
                # adding it to the weight rounds once more at the weight's magnitude
                slack = TENSOR_REL * travel[name] + 2 * (update + 1) * eps * p.detach().abs().max().item()
                assert_close_at_scale(q, p, f"{step}: updated {name}", 0.0, slack=slack)
    moved = sum(not torch.equal(p.detach(), initial[name]) for name, p in model.named_parameters())
    assert moved > len(initial) // 2, f"{arch}: only {moved} of {len(initial)} parameters moved"


# -- synchronising calls -----------------------------------------------------------------------------------------


def doubled_in_time(sample):
    """``sample`` with every sequence the model reads step by step (the decoder's input and the target) written
    twice in a row: twice the time steps, the same tokens."""
    net_input = dict(sample["net_input"])
    key = "prev_output_tokens" if "prev_output_tokens" in net_input else "src_tokens"
    net_input[key] = torch.cat([net_input[key]] * 2, dim=1)
    if key == "src_tokens" and "src_lengths" in net_input:
        net_input["src_lengths"] = net_input["src_lengths"] * 2
    return {
        **sample,
        "net_input": net_input,
        "target": torch.cat([sample["target"]] * 2, dim=1),
        "ntokens": 2 * sample["ntokens"],
    }


def syncs_of_a_training_pass(model, criterion, sample):
    """The synchronising calls of one forward, loss and backward in training mode (after one such pass, so that
    nothing is counted that only the first call of a kernel or library does)."""
    model.train()

    def training_pass():
        criterion(model, sample)[0].backward()
        model.zero_grad(set_to_none=True)

    training_pass()
    with counted_syncs() as syncs:
        training_pass()
    return syncs


@pytest.mark.parametrize("arch", sorted(registered_archs()))
def test_no_synchronisation_per_layer_or_time_step(arch, lm_data, translation_data):
    """The number of calls that make the host wait for the GPU in a training pass (with the arch's dropout) does not
    grow with the number of time steps, nor with one layer more in every stack and in the DeFINE unit: no
    ``.item()``, ``.cpu()``, ``torch.unique`` and the like inside a loop over steps or layers. The ones outside
    every loop stay (DeFINE's distinct tokens of the batch, the adaptive input's and softmax's choice of the rows
    of each band, fairseq's check for padding); the same tokens, twice as long, make the same choices. (On the CPU
    nothing can be counted: the comparison holds trivially.)"""
    data = data_for(arch, lm_data, translation_data)
    cfg, task, model = build_case(data, arch)
    sample = first_batches(cfg, task, 1)[0]
    depths = {len(m.layers) for m in model.modules() if isinstance(m, DeFINE)}
    deeper_flags = ONE_MORE_LAYER[family(arch)] + (["--define-depth", str(depths.pop() + 1)] if depths else [])
    deeper = build_case(data, arch, *deeper_flags)[2]
    assert sum(p.numel() for p in deeper.parameters()) > sum(p.numel() for p in model.parameters())
    criterion = task.build_criterion(cfg.criterion).to(DEVICE)
    model, deeper = model.to(DEVICE), deeper.to(DEVICE)
    base = syncs_of_a_training_pass(model, criterion, to_device(sample))
    longer = syncs_of_a_training_pass(model, criterion, to_device(doubled_in_time(sample)))
    more_layers = syncs_of_a_training_pass(deeper, criterion, to_device(sample))
    assert len(longer) == len(base) and len(more_layers) == len(base), (
        f"{arch}: {len(base)} synchronising calls per training pass, {len(longer)} with twice the time steps, "
        f"{len(more_layers)} with one layer more; the extra ones at "
        f"{sorted(((Counter(longer) | Counter(more_layers)) - Counter(base)).elements())}"
    )


# -- incremental decoding ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_incremental_decoding_equals_the_full_pass(fam, lm_data, translation_data):
    """Each family's decoder on the device, fed one position at a time and reordered as beam search does, gives the
    log-probabilities of the full pass (``lm_helpers.check_incremental_decoding``), to 1e-4: one position and a
    whole sequence run different kernels (cuDNN, cuBLAS, fused attention) in float32, and a wrong state or cache
    moves log-probabilities of about -4 by tenths."""
    arch = FAMILIES[fam]
    cfg, task, model = build_case(data_for(arch, lm_data, translation_data), arch)
    model = model.to(DEVICE).eval()
    tokens = tokens_batch(len(task.target_dictionary), length=10).to(DEVICE)
    with fp32_arithmetic():
        if CASES[arch][0] == LM:
            check_incremental_decoding(model, tokens, rtol=1e-4, atol=1e-4)
            return
        source = tokens_batch(len(task.source_dictionary), length=7, seed=1, bos=False).to(DEVICE)
        with torch.no_grad():
            encoder_out = model.encoder(source, src_lengths=torch.full((3,), 7, device=DEVICE))
        check_incremental_decoding(model, tokens, encoder_out=encoder_out, rtol=1e-4, atol=1e-4)
