"""Paper-style parameter breakdown of a model, from the same arguments as fairseq-train::

    python -m define_fairseq.tools.params data-bin/wmt14_en_de --user-dir define_fairseq \\
        --arch transformer_define --share-all-embeddings

prints, in millions, the lines ``DeFINE`` (the DeFINE units), ``context`` (the encoder/decoder or recurrent
stack), ``input/output`` (token tables, projections to and from them, output layers) and ``total``.
Parameters shared between modules are counted once.

``--vocab-size V`` builds the model on a dictionary of exactly V symbols (fairseq's 4 special symbols
included) instead of the data directory's, e.g. to reproduce a paper's counts without its data::

    python -m define_fairseq.tools.params --vocab-size 267735 --user-dir define_fairseq \
        --task language_modeling --arch lstm_lm_define_wt103_n3
"""

import logging
import os
import sys
import tempfile
import warnings
from typing import Dict, List, Optional

import torch.nn as nn

from define_fairseq.modules import DeFINE
from define_fairseq.modules.define.delight import DelightDeFINE

# Submodules that map tokens to vectors or vectors to the vocabulary (fairseq's names).
INPUT_OUTPUT_MODULES = ("embed_tokens", "output_projection", "project_out_dim", "project_in_dim", "adaptive_softmax")
CATEGORIES = ("DeFINE", "context", "input/output")


def parameter_breakdown(model: nn.Module) -> Dict[str, int]:
    """Count ``model``'s parameters by category (see the module docstring); shared tensors are counted once."""
    category = {}
    for module in model.modules():
        # A projective "unit" is the factorised table's projection: input/output, as Transformer-XL counts it.
        if isinstance(module, (DeFINE, DelightDeFINE)) and module.variant != "projective":
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
            raise FileNotFoundError(
                f"data directory {first} does not exist; give the directory written by "
                f"fairseq-preprocess (the same first argument as for fairseq-train)"
            )
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    return cfg, task, task.build_model(cfg.model)


def _pop_vocab_size(argv: List[str]):
    """``(vocab_size or None, argv without --vocab-size)``."""
    rest, vocab = [], None
    it = iter(argv)
    for arg in it:
        if arg == "--vocab-size" or arg.startswith("--vocab-size="):
            value = arg.split("=", 1)[1] if "=" in arg else next(it, None)
            if value is None or not value.isdigit() or int(value) <= 4:
                raise ValueError(
                    f"--vocab-size {value}: give the number of symbols, more than fairseq's 4 special "
                    f"ones (e.g. --vocab-size 267735)"
                )
            vocab = int(value)
        else:
            rest.append(arg)
    return vocab, rest


def write_dictionaries(directory: str, vocab_size: int, langs=()) -> None:
    """``dict.txt`` (and ``dict.<lang>.txt`` for each of ``langs``) with ``vocab_size - 4`` made-up symbols, so
    that fairseq's dictionary (its 4 special symbols first) has exactly ``vocab_size`` entries."""
    body = "".join(f"w{i} {vocab_size - i}\n" for i in range(vocab_size - 4))
    for name in ["dict.txt"] + [f"dict.{lang}.txt" for lang in langs]:
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.write(body)


def _lang_flags(argv: List[str]) -> List[str]:
    langs = []
    for flag in ("-s", "--source-lang", "-t", "--target-lang"):
        if flag in argv[:-1]:
            langs.append(argv[argv.index(flag) + 1])
    return langs


def main(argv: Optional[List[str]] = None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") and len(argv) == 1:
        print(__doc__)
        return
    logging.disable(logging.INFO)  # keep the report readable: no fairseq/Hydra chatter
    warnings.filterwarnings("ignore", category=UserWarning)
    vocab_size, argv = _pop_vocab_size(argv)
    if vocab_size is None:
        _, _, model = setup_from_train_args(argv)
    else:
        with tempfile.TemporaryDirectory() as data:
            write_dictionaries(data, vocab_size, _lang_flags(argv))
            if argv and not argv[0].startswith("-"):
                argv = argv[1:]  # a data directory given anyway: the made-up dictionary replaces it
            _, task, model = setup_from_train_args([data, *argv])
            assert len(task.source_dictionary) == vocab_size, (len(task.source_dictionary), vocab_size)
    print(format_breakdown(parameter_breakdown(model)))


if __name__ == "__main__":
    main()
