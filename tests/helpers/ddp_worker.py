"""One rank of a data-parallel run: fairseq's distributed setup and Trainer, a few updates, then this rank's
parameters written to OUT_PREFIX<rank>.pt. Usage: ddp_worker.py OUT_PREFIX <fairseq-train arguments>."""

import sys

import torch
from fairseq import options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.trainer import Trainer

import define_fairseq  # noqa: F401


def run(cfg, out_prefix):
    utils.set_torch_seed(cfg.common.seed)  # as fairseq-train: every rank starts from the same parameters
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    epoch_itr = trainer.get_train_iterator(epoch=1, load_dataset=True)
    for i, sample in enumerate(epoch_itr.next_epoch_itr(shuffle=True)):
        if i == cfg.optimization.max_update:
            break
        trainer.train_step([sample])
    rank = distributed_utils.get_data_parallel_rank()
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, f"{out_prefix}{rank}.pt")


if __name__ == "__main__":
    out_prefix, argv = sys.argv[1], sys.argv[2:]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    distributed_utils.call_main(cfg, run, out_prefix=out_prefix)
