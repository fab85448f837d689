"""bfloat16: one training step of every registered arch on the CPU, through fairseq's own Trainer.

fairseq-train's argparse path turns ``--bf16`` into ``--tpu`` (``fairseq/options.py``), which needs torch_xla.
The Trainer itself trains in bfloat16 on any device when ``common.bf16`` is set without ``common.tpu``, as
``fairseq-hydra-train ... common.bf16=true`` runs it: the model and the batch are cast to bfloat16 and the
optimizer keeps fp32 master weights (fairseq's FP16Optimizer in its bf16 mode).
"""

import math

import pytest
import torch
from arch_cases import CASES, LM, case_argv

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)


def bf16_trainer(data, arch):
    """fairseq's Trainer for ``arch`` with ``common.bf16`` (and without the ``tpu`` that argparse adds)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        case_argv(
            data,
            arch,
            "--optimizer",
            "adam",
            "--lr",
            "0.001",
            "--max-tokens",
            "256",
            "--cpu",
            "--bf16",
            "--seed",
            "1",
            "--num-workers",
            "0",
        ),
    )
    cfg = convert_namespace_to_omegaconf(args)
    assert cfg.common.tpu  # fairseq's argparse path: --bf16 implies --tpu
    cfg.common.tpu = False
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return Trainer(cfg, task, model, criterion), task


@pytest.mark.parametrize("arch", sorted(CASES))
def test_a_bf16_training_step(arch, lm_data, translation_data):
    trainer, task = bf16_trainer(lm_data if CASES[arch][0] == LM else translation_data, arch)
    model = trainer.model
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    batches = task.get_batch_iterator(dataset=task.dataset("train"), max_tokens=256, seed=1).next_epoch_itr(
        shuffle=False
    )
    sample = next(batches)
    log = trainer.train_step([sample])
    assert log is not None and math.isfinite(log["loss"]), log
    changed = 0
    for name, p in model.named_parameters():
        assert p.dtype == torch.bfloat16, name
        assert torch.isfinite(p).all(), f"{arch}: {name} is not finite after the step"
        changed += not torch.equal(p.detach(), before[name])
    assert changed > len(before) // 2, f"{arch}: only {changed} of {len(before)} parameters moved"
