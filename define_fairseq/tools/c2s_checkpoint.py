"""Put a distilled Char2Subword module into a trained Transformer: a starting checkpoint for ``transformer_c2s``.

The paper's second stage (Sec. 3.1): once a module approximates a trained model's source embedding table
(``python -m define_fairseq.tools.distill_c2s``), swap it in for the table and continue training the original
objective. This command writes the swapped model as a checkpoint that ``fairseq-train --arch transformer_c2s
--finetune-from-model FILE`` loads (optimizer, learning-rate schedule and data iterator start afresh)::

    python -m define_fairseq.tools.c2s_checkpoint --checkpoint checkpoints/checkpoint_best.pt \\
        --c2s c2s_encoder.pt --output c2s_init.pt

Every weight of the checkpoint is kept except ``encoder.embed_tokens.weight``, which the module's weights replace
(``encoder.embed_tokens.*``). The distilled module stands in for the table, so it is given the ``output_scale``
that ``transformer_c2s`` builds with the checkpoint's own ``--no-scale-embedding`` setting (``d^-0.5``, or 1 with
the flag), the change folded into its final LayerNorm (:meth:`Char2SubwordEmbedding.set_output_scale`): the
swapped model computes what the checkpoint computes with the table replaced by the module's approximation.

Train ``transformer_c2s`` with the checkpoint's model sizes, ``--no-scale-embedding`` setting and the module's
``--c2s-*`` sizes (printed). A checkpoint trained with ``--share-all-embeddings`` is fine: its decoder keeps the
shared table, so pass ``--share-decoder-input-output-embed``. The written file holds tensors and plain Python
values only; it is not a complete fairseq checkpoint (no configuration), only a starting point for training.
"""

import argparse
import os
from typing import Dict

import torch
from fairseq.utils import safe_getattr

from define_fairseq.tools.average_checkpoints import exit_on_checkpoint_error
from define_fairseq.tools.distill_c2s import C2S_OPTIONS, load_distilled, read_distilled
from define_fairseq.tools.distill_c2s_data import checkpoint_table, load_checkpoint_state

TABLE_KEY = "encoder.embed_tokens.weight"


def swap_in(state: Dict, module, checkpoint: str) -> Dict[str, torch.Tensor]:
    """The model state of ``state`` with its encoder table replaced by ``module`` (whose output scale is set
    to the one ``transformer_c2s`` uses for the checkpoint's ``--no-scale-embedding``)."""
    model = state["model"]
    table = model[TABLE_KEY]
    if tuple(table.shape) != (module.num_embeddings, module.embedding_dim):
        raise ValueError(
            f"--checkpoint {checkpoint}: {TABLE_KEY} is {tuple(table.shape)} but the module embeds "
            f"{module.num_embeddings} entries into {module.embedding_dim} dimensions"
        )
    # (cfg.model: a DictConfig, or an argparse.Namespace in an argparse-era checkpoint; safe_getattr reads both)
    no_scale = bool(safe_getattr(safe_getattr(state.get("cfg"), "model"), "no_scale_embedding", False))
    module.set_output_scale(1.0 if no_scale else module.embedding_dim**-0.5)
    out = {name: value for name, value in model.items() if name != TABLE_KEY}
    for name, value in module.state_dict().items():
        out[f"encoder.embed_tokens.{name}"] = value.detach().clone()
    return out


def write_start_checkpoint(path: str, model_state: Dict[str, torch.Tensor]) -> None:
    """Write ``model_state`` as a checkpoint that ``--finetune-from-model`` loads (atomically: ``path.tmp``,
    then a rename)."""
    state = {
        "model": model_state,
        "cfg": None,
        "optimizer_history": [{"criterion_name": "", "optimizer_name": "", "lr_scheduler_state": {}, "num_updates": 0}],
        "extra_state": {"train_iterator": {"epoch": 1}},
        "last_optimizer_state": None,
    }
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def build(args) -> Dict:
    """Run the command (``args``: the parsed command line); returns the module's ``c2s_*`` options."""
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        raise FileNotFoundError(f"--output {args.output}: the directory {out_dir} does not exist")
    state = load_checkpoint_state(args.checkpoint, args.data)
    dictionary, _ = checkpoint_table(state, args.checkpoint, "encoder", args.data)
    saved = read_distilled(args.c2s)
    if saved.get("side") != "encoder":
        raise ValueError(
            f"--c2s {args.c2s} was distilled from a {saved.get('side')} table; transformer_c2s embeds "
            f"the encoder side (distil with --side encoder)"
        )
    module = load_distilled(args.c2s, dictionary, saved)
    model_state = swap_in(state, module, args.checkpoint)
    write_start_checkpoint(args.output, model_state)
    options = {name: saved["c2s_args"][name] for name in C2S_OPTIONS}
    flags = " ".join(f"--c2s-{name.replace('_', '-')} {value}" for name, value in options.items())
    print(f"wrote {args.output}: the model of {args.checkpoint} with its encoder table replaced by {args.c2s}")
    print(f"train it with: --arch transformer_c2s ... {flags} --finetune-from-model {args.output}")
    return options


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="the trained Transformer whose encoder table was distilled")
    parser.add_argument("--c2s", required=True, help="the module written by define_fairseq.tools.distill_c2s")
    parser.add_argument("--output", required=True, help="where to write the starting checkpoint (.pt)")
    parser.add_argument(
        "--data", default=None, help="the binarized data directory (its dict.*.txt), if not where the checkpoint says"
    )
    return parser


def main(argv=None):
    with exit_on_checkpoint_error():
        build(get_parser().parse_args(argv))


if __name__ == "__main__":
    main()
