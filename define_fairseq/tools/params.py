"""Paper-style parameter breakdown of a model, from the same arguments as fairseq-train::

    python -m define_fairseq.tools.params data-bin/wmt14_en_de --user-dir define_fairseq \\
        --arch transformer_define --share-all-embeddings

prints, in millions, the lines ``DeFINE`` (the DeFINE units), ``context`` (the encoder/decoder or recurrent
stack), ``input/output`` (token tables, projections to and from them, output layers) and ``total``.
Parameters shared between modules are counted once.
"""

import logging
import os
import sys
import warnings
from typing import Dict, List, Optional

import torch.nn as nn

from define_fairseq.modules import DeFINE

# Submodules that map tokens to vectors or vectors to the vocabulary (fairseq's names).
INPUT_OUTPUT_MODULES = ("embed_tokens", "output_projection", "project_out_dim", "project_in_dim", "adaptive_softmax")
CATEGORIES = ("DeFINE", "context", "input/output")


def parameter_breakdown(model: nn.Module) -> Dict[str, int]:
    """Count ``model``'s parameters by category (see the module docstring); shared tensors are counted once."""
    category = {}
    for module in model.modules():
        if isinstance(module, DeFINE):
            for p in module.parameters():
                category.setdefault(id(p), ("DeFINE", p.numel()))
    for name, module in model.named_modules():
        if name.split(".")[-1] in INPUT_OUTPUT_MODULES:
            for p in module.parameters():
                category.setdefault(id(p), ("input/output", p.numel()))
    for p in model.parameters():
        category.setdefault(id(p), ("context", p.numel()))
    counts = {c: 0 for c in CATEGORIES}
    for c, numel in category.values():
        counts[c] += numel
    counts["total"] = sum(counts[c] for c in CATEGORIES)
    return counts


def format_breakdown(counts: Dict[str, int]) -> str:
    return "\n".join(f"{name:<13}{counts[name] / 1e6:9.2f}M" for name in (*CATEGORIES, "total"))


def setup_from_train_args(argv: List[str]):
    """``(cfg, task, model)`` exactly as fairseq-train builds them from ``argv`` (without training)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    data = getattr(args, "data", None)
    if data:
        first = data.split(os.pathsep)[0]
        if not os.path.isdir(first):
            raise FileNotFoundError(f"data directory {first} does not exist; give the directory written by "
                                    f"fairseq-preprocess (the same first argument as for fairseq-train)")
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    return cfg, task, task.build_model(cfg.model)


def main(argv: Optional[List[str]] = None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") and len(argv) == 1:
        print(__doc__)
        return
    logging.disable(logging.INFO)  # keep the report readable: no fairseq/Hydra chatter
    warnings.filterwarnings("ignore", category=UserWarning)
    _, _, model = setup_from_train_args(argv)
    print(format_breakdown(parameter_breakdown(model)))


if __name__ == "__main__":
    main()
