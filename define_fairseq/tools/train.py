"""fairseq-train, except that ``--bf16`` trains in bfloat16 on GPUs and CPUs instead of asking for a TPU, that a
truncated ``checkpoint_last.pt`` is put back before resuming, and that a finished run always exits with status 0.

fairseq-train's command line turns ``--bf16`` into ``--tpu`` (fairseq's ``options.parse_args_and_arch``), and
``--tpu`` needs torch_xla, so ``fairseq-train --bf16`` stops in ``get_tpu_device`` on any other machine.
fairseq's Trainer itself trains in bfloat16 whenever ``common.bf16`` is set without ``common.tpu`` (as
``fairseq-hydra-train ... common.bf16=true`` does). This entry point parses the same arguments as fairseq-train,
keeps ``--tpu`` only when the command line asks for it, and runs fairseq's own training loop::

    python -m define_fairseq.tools.train DATA --user-dir define_fairseq --arch transformer_define --bf16 ...

Every other argument means what it means to fairseq-train (multi-GPU training included). fairseq saves
checkpoints in float32 whatever the training precision.

Before training, a ``checkpoint_last.pt`` that a run killed during a save left truncated is put back from the
save's complete first file (:mod:`define_fairseq.tools.last_checkpoint`), so the run resumes; and a run whose
``checkpoint_last.pt`` has reached ``--max-update`` (killed after its final save, or started again once done) is
left as it is, where fairseq-train would train one more update before noticing.

The third difference: every training process ends cleanly once fairseq's training loop has returned. fairseq's
training iterator collates batches in a daemon thread (``--data-buffer-size`` > 0, the default), and a run that
stops mid-epoch (``--max-update``) can exit while that thread is still inside a PyTorch operation; PyTorch's
C++ shutdown then aborts the finished process (SIGABRT, "terminate called without an active exception") and
fairseq-train reports a failure after having saved everything. See :func:`end_process`.

The fourth: training on the CPU (``--cpu``, or no GPU) flushes denormal floats to zero
(:func:`flush_denormals`). Without it an LSTM's backward slows down as training goes on: oneDNN's LSTM backward
meets more and more denormal values (below 1.2e-38 in float32), which x86 CPUs compute many times more slowly.
Flushing changes only values that small.
"""

import atexit
import logging
import os
import sys
import threading
from typing import List, Optional

import torch
import torch.distributed as dist
from fairseq import distributed_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq_cli import train as fairseq_train

from define_fairseq.tools.last_checkpoint import LAST, last_updates, repair_last_checkpoint


def parse_args(argv: Optional[List[str]] = None):
    """fairseq-train's arguments, with ``tpu`` as the command line gives it (not implied by ``--bf16``)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=argv)
    args.tpu = "--tpu" in argv
    return args


def end_process() -> None:
    """End a process whose training has finished, with exit status 0.

    Python's own exit would wait for the non-daemon threads, run the exit handlers (logging, fairseq's
    tensorboard writers, DataLoader and multiprocessing clean-up) and then the C++ static destructors, which abort
    the process while fairseq's daemon collating thread is inside a PyTorch operation. This does the first two
    and leaves with ``os._exit(0)``, skipping only the destructors. With torch.distributed every rank first
    waits for the others (as fairseq's ``distributed_main`` does after training), so none leaves early.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier(distributed_utils.get_global_group())
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # the handlers Python would run at exit (os._exit skips them)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the C++ static destructors: they abort the process while fairseq's collating thread is in PyTorch.
    os._exit(0)


def flush_denormals(cpu: bool) -> None:
    """On the CPU (``cpu`` true), make this thread and the threads it starts afterwards treat denormal floats as
    zero; on GPUs, leave the CPU's floating-point mode as it is."""
    if cpu:
        torch.set_flush_denormal(True)


def train_and_end(cfg, **kwargs) -> None:
    """fairseq-train's ``main`` in this process (each spawned GPU process too), then :func:`end_process`."""
    flush_denormals(cfg.common.cpu or not torch.cuda.is_available())  # fairseq trains on the CPU in both cases
    fairseq_train.main(cfg, **kwargs)
    end_process()


def main(argv: Optional[List[str]] = None) -> None:
    """Train as fairseq-train does with ``argv`` (default: the command line); ends the process when done."""
    # fairseq-train's log format (its module sets it up only when nothing has logged before it was imported, and
    # importing this package, which imports fairseq, logs)
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stdout,
        force=True,
    )
    args = parse_args(argv)
    if args.restore_file == LAST:  # the run resumes from SAVE_DIR/checkpoint_last.pt: a killed copy is put back
        repair_last_checkpoint(args.save_dir)
        done = last_updates(args.save_dir)
        if args.max_update and done is not None and done >= args.max_update:  # fairseq would take one more update
            logging.info(f"{args.save_dir}/{LAST} is at {done} updates, --max-update {args.max_update}: done already")
            return
    cfg = convert_namespace_to_omegaconf(args)
    distributed_utils.call_main(cfg, train_and_end)


if __name__ == "__main__":
    main()
