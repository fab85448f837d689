"""fairseq-train, except that ``--bf16`` trains in bfloat16 on GPUs and CPUs instead of asking for a TPU.

fairseq-train's command line turns ``--bf16`` into ``--tpu`` (fairseq's ``options.parse_args_and_arch``), and
``--tpu`` needs torch_xla, so ``fairseq-train --bf16`` stops in ``get_tpu_device`` on any other machine.
fairseq's Trainer itself trains in bfloat16 whenever ``common.bf16`` is set without ``common.tpu`` (as
``fairseq-hydra-train ... common.bf16=true`` does). This entry point parses the same arguments as fairseq-train,
keeps ``--tpu`` only when the command line asks for it, and runs fairseq's own training loop::

    python -m define_fairseq.tools.train DATA --user-dir define_fairseq --arch transformer_define --bf16 ...

Every other argument means what it means to fairseq-train (multi-GPU training included). fairseq saves
checkpoints in float32 whatever the training precision.
"""

import logging
import os
import sys
from typing import List, Optional

from fairseq import distributed_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq_cli import train as fairseq_train


def parse_args(argv: Optional[List[str]] = None):
    """fairseq-train's arguments, with ``tpu`` as the command line gives it (not implied by ``--bf16``)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=argv)
    args.tpu = "--tpu" in argv
    return args


def main(argv: Optional[List[str]] = None) -> None:
    # fairseq-train's log format (its module sets it up only when nothing has logged before it was imported, and
    # importing this package, which imports fairseq, logs)
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stdout, force=True)
    args = parse_args(argv)
    cfg = convert_namespace_to_omegaconf(args)
    distributed_utils.call_main(cfg, fairseq_train.main)


if __name__ == "__main__":
    main()
