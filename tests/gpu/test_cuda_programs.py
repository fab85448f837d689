"""fairseq's programs on a CUDA device, one representative arch per family (``arch_cases.FAMILIES``): 30 updates in
float16 (``--fp16``, ``--memory-efficient-fp16``) and bfloat16 (``python -m define_fairseq.tools.train --bf16``),
a checkpoint saved on the GPU read on the CPU, fairseq-generate and fairseq-eval-lm on the GPU.

One arch per family, not every arch: each run is a process start (a few seconds), and the per-arch CUDA case is
the float32 step comparison of ``test_cuda_training``. Marked ``cuda``; skipped without a CUDA device;
``DEFINE_FAIRSEQ_CUDA_TESTS=cpu`` runs them on the CPU (see ``cuda_device``; float16 then trains without
``--fp16``'s flat float32 copy of the weights, which fairseq allocates on the current CUDA device).
"""

import itertools
import math
import re

import pytest
import torch
from arch_cases import CASES, FAMILIES, LM, STATEFUL, build_case, case_argv
from conftest import USER_DIR, needs_fairseq_eos_blocks, run_cli, run_module
from cuda_device import CUDA_TESTS, DEVICE, DEVICE_FLAGS, ON_CPU, fp32_arithmetic
from lm_helpers import check_generate_continues_a_prefix, eval_lm, load, log_probs, tokens_batch

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)

pytestmark = CUDA_TESTS

LM_FAMILIES = sorted(name for name, arch in FAMILIES.items() if CASES[arch][0] == LM)

# precision -> (program, its flags): fairseq-train's console script, or a module run with ``python -m``
PRECISIONS = {
    "fp16": ("fairseq-train", ["--fp16"] + (["--fp16-no-flatten-grads"] if ON_CPU else [])),
    "memory-efficient-fp16": ("fairseq-train", ["--memory-efficient-fp16"]),
    "bf16": ("define_fairseq.tools.train", ["--bf16"]),
}
# what fairseq-train logs of its configuration for each
CONFIGURED = {
    "fp16": ["'fp16': True"],
    "memory-efficient-fp16": ["'fp16': True", "'memory_efficient_fp16': True"],
    "bf16": ["'bf16': True", "'tpu': False"],
}
UPDATES = 30
EDGE = 5  # the losses compared at each end of the run
TRAIN_INNER = re.compile(r"\| train_inner \| .*?\bloss=([^,\s]+).*?\bnum_updates=(\d+)")


def data_for(arch, lm_data, translation_data):
    return lm_data if CASES[arch][0] == LM else translation_data


def batch_flags(fam):
    return [] if fam in STATEFUL else ["--max-tokens", "256"]


def train_inner_losses(output: str):
    """``{update: loss}`` of fairseq's per-update log lines (``--log-format simple --log-interval 1``)."""
    return {int(update): float(loss) for loss, update in TRAIN_INNER.findall(output)}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_mixed_precision_training_lowers_the_loss(fam, precision, lm_data, translation_data, tmp_path):
    """30 updates (Adam, lr 0.005, the arch's dropout) in the given precision: every update is logged with a finite
    loss, and the mean loss of the last 5 updates is at least 0.1 bit below that of the first 5 (on these corpora
    the 30 updates lower it by 0.58 to 1.74 bits, float16 and bfloat16 on the CPU; one batch's loss varies by about
    0.1 bit)."""
    arch = FAMILIES[fam]
    program, flags = PRECISIONS[precision]
    argv = case_argv(
        data_for(arch, lm_data, translation_data),
        arch,
        *batch_flags(fam),
        "--optimizer",
        "adam",
        "--lr",
        "0.005",
        "--max-update",
        UPDATES,
        "--no-save",
        "--disable-validation",
        "--save-dir",
        tmp_path,
        "--log-format",
        "simple",
        "--log-interval",
        "1",
        "--num-workers",
        "0",
        "--seed",
        "1",
        *DEVICE_FLAGS,
        *flags,
        stateful=fam in STATEFUL,
    )
    if program == "fairseq-train":
        proc = run_cli(program, *argv)
    else:
        proc = run_module(program, *argv, "--data-buffer-size", "0")
    output = proc.stdout + proc.stderr
    for setting in CONFIGURED[precision]:
        assert setting in output, f"{arch} {precision}: fairseq did not run with {setting}:\n{output[-3000:]}"
    if not ON_CPU:
        assert "CUDA enviroments for all 1 workers" in output, f"{arch}: fairseq did not train on the GPU"
    losses = train_inner_losses(output)
    assert sorted(losses) == list(range(1, UPDATES + 1)), f"{arch} {precision}: updates logged {sorted(losses)}"
    curve = [losses[u] for u in range(1, UPDATES + 1)]
    assert all(math.isfinite(loss) for loss in curve), f"{arch} {precision}: {curve}"
    first, last = sum(curve[:EDGE]) / EDGE, sum(curve[-EDGE:]) / EDGE
    assert last <= first - 0.1, f"{arch} {precision}: the loss did not fall ({first:.3f} -> {last:.3f}): {curve}"


# -- a checkpoint saved on the GPU, fairseq-generate and fairseq-eval-lm ------------------------------------------

CHECKPOINT_UPDATES = 10  # enough for the model to use its context a little (its state, its memory)


@pytest.fixture(scope="module")
def device_checkpoint(lm_data, translation_data, tmp_path_factory):
    """``family -> (checkpoint path, the model on the device that it holds)``: fairseq's Trainer on the device makes
    10 training steps of the family's arch (Adam, the arch's dropout) and saves the checkpoint, as fairseq-train
    does."""
    from fairseq.trainer import Trainer

    made = {}

    def make(fam):
        if fam not in made:
            arch = FAMILIES[fam]
            cfg, task, model = build_case(
                data_for(arch, lm_data, translation_data), arch, *batch_flags(fam), optimizer=("adam", "0.005")
            )
            cfg.common.cpu = DEVICE.type == "cpu"
            trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
            assert next(trainer.model.parameters()).device.type == DEVICE.type
            epochs = task.get_batch_iterator(
                dataset=task.dataset("train"),
                max_tokens=cfg.dataset.max_tokens,
                max_sentences=cfg.dataset.batch_size,
                seed=1,
            )
            updates = 0
            while updates < CHECKPOINT_UPDATES:
                for sample in itertools.islice(epochs.next_epoch_itr(), CHECKPOINT_UPDATES - updates):
                    assert trainer.train_step([sample]) is not None
                    updates += 1
            path = tmp_path_factory.mktemp(fam) / "checkpoint.pt"
            trainer.consolidate_optimizer()  # what fairseq's checkpoint_utils.save_checkpoint does first
            trainer.save_checkpoint(str(path), {})
            made[fam] = path, trainer.model.eval()
        return made[fam]

    return make


def tensors_in(value):
    """Every tensor in a checkpoint's nested dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


def same_on_the_cpu(value, expected) -> bool:
    """``value`` equals ``expected`` with its tensors moved to the CPU: the same nested dicts, lists and tuples (a
    recurrent model's carried state is saved as one), equal tensors and equal other values."""
    if isinstance(expected, torch.Tensor):
        return isinstance(value, torch.Tensor) and torch.equal(value, expected.cpu())
    if isinstance(expected, dict):
        return (
            isinstance(value, dict)
            and value.keys() == expected.keys()
            and all(same_on_the_cpu(value[k], expected[k]) for k in expected)
        )
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(expected)
            and all(same_on_the_cpu(v, e) for v, e in zip(value, expected))
        )
    return value == expected


def fixed_batch_log_probs(model, arch, task, device):
    """The log-probabilities of a fixed batch of 3 x 8 tokens (after 3 x 7 source tokens for translation)."""
    tokens = tokens_batch(len(task.target_dictionary), length=8).to(device)
    if CASES[arch][0] == LM:
        return log_probs(model, tokens)
    source = tokens_batch(len(task.source_dictionary), length=7, seed=1, bos=False).to(device)
    return log_probs(model, source, src_lengths=torch.full((3,), 7, device=device), prev_output_tokens=tokens)


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_checkpoint_saved_on_the_gpu_loads_on_the_cpu(fam, device_checkpoint):
    """The checkpoint (with Adam's state) holds CPU tensors only (``torch.load`` without ``map_location`` reads it
    on a machine without a GPU); fairseq's ``checkpoint_utils`` builds the model on the CPU with the very same
    weights, and it gives the log-probabilities of the model on the device, within float32 rounding
    (log-probabilities of about -4, computed in different orders)."""
    arch = FAMILIES[fam]
    path, device_model = device_checkpoint(fam)
    saved = torch.load(path, weights_only=False)
    devices = {t.device.type for t in tensors_in(saved)}
    assert devices == {"cpu"}, f"{arch}: the checkpoint holds tensors on {devices}"
    model, task = load(path)
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    state, expected_state = model.state_dict(), device_model.state_dict()
    assert state.keys() == expected_state.keys()
    for name, value in state.items():
        assert same_on_the_cpu(value, expected_state[name]), f"{arch}: {name} changed on the way"
    with fp32_arithmetic():
        expected = fixed_batch_log_probs(device_model, arch, task, DEVICE)
    got = fixed_batch_log_probs(model, arch, task, torch.device("cpu"))
    torch.testing.assert_close(got, expected.cpu(), rtol=1e-4, atol=1e-4)


# Language models generate in fairseq's eos break mode, which numpy 2 breaks in fairseq (docs/development.md,
# "Tested stacks").
@pytest.mark.parametrize(
    "fam",
    [
        pytest.param(fam, marks=needs_fairseq_eos_blocks) if CASES[FAMILIES[fam]][0] == LM else fam
        for fam in sorted(FAMILIES)
    ],
)
def test_fairseq_generate_on_the_gpu(fam, lm_data, translation_data, device_checkpoint):
    """fairseq-generate with the GPU (beam 2) reads the GPU-saved checkpoint: a language model continues the first
    2 words of each valid sentence (``lm_helpers.check_generate_continues_a_prefix``); a translation model gives
    every test sentence a hypothesis with a finite log-probability score."""
    arch = FAMILIES[fam]
    path = device_checkpoint(fam)[0]
    if CASES[arch][0] == LM:
        check_generate_continues_a_prefix(lm_data, path, "--beam", "2", cpu=ON_CPU)
        return
    proc = run_cli(
        "fairseq-generate",
        translation_data,
        "--user-dir",
        USER_DIR,
        "--task",
        CASES[arch][0],
        "--path",
        path,
        *DEVICE_FLAGS,
        "--beam",
        "2",
        "--batch-size",
        "8",
        "--gen-subset",
        "test",
        "--required-batch-size-multiple",
        "1",
    )
    sources = re.findall(r"^S-\d+\t", proc.stdout, re.M)
    scores = [float(score) for score in re.findall(r"^H-\d+\t(\S+)\t", proc.stdout, re.M)]
    assert sources and len(scores) == len(sources)
    assert all(math.isfinite(score) and score <= 0 for score in scores), scores


@pytest.mark.parametrize("fam", LM_FAMILIES)
def test_fairseq_eval_lm_on_the_gpu_equals_the_cpu(fam, lm_data, device_checkpoint, monkeypatch):
    """fairseq-eval-lm on the GPU reports the loss that it reports on the CPU for the test split (carrying the state
    or memory from batch to batch with ``--task stateful_lm``), to the 4 decimals it prints. TF32 is off in the
    programs (``NVIDIA_TF32_OVERRIDE=0``, read by cuBLAS and cuDNN): cuDNN allows it by default, and an LSTM in TF32
    moves the loss by about 1e-3."""
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    path = device_checkpoint(fam)[0]
    if fam in STATEFUL:
        flags = ["--task", "stateful_lm", "--batch-size", "2", "--tokens-per-sample", "16"]
    else:
        flags = ["--tokens-per-sample", "16", "--max-tokens", "256"]
    on_cpu, _ = eval_lm(lm_data, path, *flags)
    on_device, _ = eval_lm(lm_data, path, *flags, cpu=ON_CPU)
    assert math.isfinite(on_cpu)
    assert on_device == pytest.approx(on_cpu, abs=3e-4)
