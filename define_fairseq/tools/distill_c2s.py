"""Distil a trained embedding table into a Char2Subword module (the paper's approximation stage, Sec. 3.1).

Given a trained fairseq checkpoint whose encoder (or decoder) embeds tokens with a table
``E [V, d]`` (``encoder.embed_tokens.weight``), train a :class:`Char2SubwordEmbedding` that builds every
non-special entry's vector from its characters, ``ê = f(chars)``, with the paper's unweighted four-term loss
(cosine, Euclidean, neighbour and cross-entropy terms, averaged over a batch; E stays frozen), whose formulas
are in :mod:`define_fairseq.tools.distill_c2s_losses`.

Character noise (``--noise-rate``): each epoch, every entry with more than four characters (BPE markers not
counted) gets, with probability ``--noise-rate``, one extra sample that spells it with a single-character
edit (one of ``--noise-types``); its target is still the clean vector. The clean entries are always trained.

Scale: a LayerNorm ends the module, so its output has about unit scale per dimension, while the rows of a
fairseq table are about ``d^-0.5`` per dimension (row norm about 1). The module's ``output_scale`` is set to
the root mean square of the regular entries of E, ``sqrt(mean(E[regular]^2))``, and kept during training, so
that ``ê`` starts at E's scale and the LayerNorm's gain learns the rest. The model multiplies the table by its
own ``embed_scale`` (sqrt(d) unless ``--no-scale-embedding``) after the lookup; the distilled module stands in
for the table itself, so the model keeps its ``embed_scale``. The special entries (``<s>``, ``<pad>``, ``</s>``,
``<unk>``) are not composed from characters: their learned vectors are set to E's rows (pad stays zero).

Usage::

    python -m define_fairseq.tools.distill_c2s --checkpoint checkpoints/checkpoint_best.pt \\
        --output c2s_encoder.pt --side encoder --epochs 20 --noise-rate 0.1

    # then, in Python, swap it into the loaded model:
    from define_fairseq.tools.distill_c2s import load_distilled
    model.encoder.embed_tokens = load_distilled("c2s_encoder.pt", task.source_dictionary)

With ``--side decoder`` and ``--share-decoder-input-output-embed``, the output projection still holds E after
the swap (only the input lookup is replaced).

The checkpoint is read with ``torch.load(weights_only=True)`` with ``argparse.Namespace`` allowed (fairseq's
argparse-era configs hold one), so no code from the file runs. A checkpoint that needs other Python objects is
refused with a message naming them; if you trust the file, rerun with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``.

Printed: the four terms per epoch (over that epoch's samples, noisy copies included) and, before and after
training, the terms on the clean entries, top-1 accuracy (the row of E nearest to ê by cosine, among the regular
entries, is the entry's own) and neighbour precision@k (the share of e's k nearest entries found among ê's k
nearest, the entry itself excluded from both).
"""

import argparse
import os
from typing import Dict, Optional, Sequence

import torch
from torch import Tensor

from define_fairseq.data.char_noise import NOISE_TYPES, parse_noise_types
from define_fairseq.modules.char2subword import Char2SubwordEmbedding
from define_fairseq.tools.average_checkpoints import CheckpointError, exit_on_checkpoint_error, read_torch_file
from define_fairseq.tools.distill_c2s_data import load_table, noisy_samples, symbols_md5
from define_fairseq.tools.distill_c2s_losses import (
    LOSS_TERMS,
    approximation_losses,
    approximation_metrics,
    nearest_neighbours,
)

# The module's options, as the transformer_c2s flags name them (without the "c2s_" prefix).
C2S_OPTIONS = ("char_dim", "layers", "heads", "ffn_dim", "max_chars", "dropout")


def build_module(dictionary, embedding_dim: int, c2s_args: Dict, output_scale: float) -> Char2SubwordEmbedding:
    """A :class:`Char2SubwordEmbedding` of ``dictionary`` (specials: its first ``nspecial`` entries)."""
    return Char2SubwordEmbedding(
        dictionary.symbols,
        dictionary.pad(),
        embedding_dim,
        special_indices=range(dictionary.nspecial),
        output_scale=output_scale,
        **{name: c2s_args[name] for name in C2S_OPTIONS},
    )


def read_distilled(path: str) -> Dict:
    """The contents of a file written by this tool (see :func:`save_distilled`); clear errors otherwise."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file (a Char2Subword module written by distill_c2s)")
    saved = read_torch_file(path, lambda p: torch.load(p, map_location="cpu", weights_only=True), what="--c2s")
    if not isinstance(saved, dict) or "c2s_args" not in saved or "state_dict" not in saved:
        raise CheckpointError(f"{path} is not a file written by define_fairseq.tools.distill_c2s")
    return saved


def load_distilled(path: str, dictionary, saved: Optional[Dict] = None) -> Char2SubwordEmbedding:
    """The module written by this tool, for ``dictionary`` (a fairseq ``Dictionary``: ``symbols``, ``pad()``,
    ``nspecial``), with its ``output_scale``: a stand-in for the table it was distilled from
    (``tokens [*] -> [*, d]``). ``saved``: the file's contents when already read (:func:`read_distilled`).
    Raises ValueError when ``dictionary`` is not the one it was distilled for."""
    if saved is None:
        saved = read_distilled(path)
    fingerprint = symbols_md5(dictionary.symbols)
    if fingerprint != saved["symbols_md5"]:
        raise ValueError(
            f"{path} was distilled for another dictionary ({saved.get('num_embeddings')} entries, md5 "
            f"{saved['symbols_md5']}) than the one given ({len(dictionary)} entries, md5 {fingerprint}); "
            f"use the {saved.get('side')} dictionary of the checkpoint it came from"
        )
    args = saved["c2s_args"]
    module = build_module(dictionary, args["embedding_dim"], args, float(saved["output_scale"]))
    module.load_state_dict(saved["state_dict"])
    return module


def save_distilled(
    path: str,
    module: Char2SubwordEmbedding,
    c2s_args: Dict,
    side: str,
    symbols: Sequence[str],
    checkpoint: str,
    metrics: Dict,
) -> None:
    """Write the module to ``path`` atomically (``path.tmp``, then a rename)."""
    saved = {
        "c2s_args": dict(c2s_args, embedding_dim=module.embedding_dim),
        "state_dict": {name: value.detach().cpu() for name, value in module.state_dict().items()},
        "output_scale": float(module.output_scale),
        "side": side,
        "symbols_md5": symbols_md5(symbols),
        "num_embeddings": len(symbols),
        "checkpoint": os.path.basename(checkpoint),
        "metrics": metrics,
    }
    tmp = path + ".tmp"
    torch.save(saved, tmp)
    os.replace(tmp, path)


# -- training --------------------------------------------------------------------------------------------------


def _format(name: str, terms: Dict[str, float], extra: str = "") -> str:
    total = sum(terms[t] for t in LOSS_TERMS)
    parts = [f"loss {total:.4f}"] + [f"{t} {terms[t]:.4f}" for t in LOSS_TERMS]
    return " | ".join([name] + parts) + extra


class Distiller:
    """Trains ``module`` to approximate ``table [V, d]`` on the entries that are not special."""

    def __init__(self, module: Char2SubwordEmbedding, table: Tensor, neighbours: int, device: torch.device):
        self.module = module.to(device)
        self.table = table.to(device)
        self.regular = (~module.is_special).nonzero().squeeze(1)
        self.scale = float(module.output_scale)
        count = self.regular.numel()
        if not 1 <= neighbours < count:
            raise ValueError(
                f"--neighbours {neighbours}: must be between 1 and {count - 1} (the table has {count} "
                f"non-special entries and an entry is not its own neighbour)"
            )
        self.neighbours = nearest_neighbours(self.table[self.regular], neighbours)  # [R, k], positions in regular

    def predict(self, chars: Tensor) -> Tensor:
        """``chars [N, M] -> [N, d]``: ê at E's scale."""
        return self.module.compose(chars) * self.scale

    def losses(self, positions: Tensor, pred: Tensor) -> Dict[str, Tensor]:
        """The loss terms of the regular entries at ``positions [N]`` predicted as ``pred [N, d]``."""
        reg_table = self.table[self.regular]
        return approximation_losses(
            pred, reg_table[positions], reg_table[self.neighbours[positions]], self.table, self.regular[positions]
        )

    @torch.no_grad()
    def evaluate(self, batch_size: int) -> Dict[str, float]:
        """Loss terms, accuracy and precision@k on the clean entries (eval mode)."""
        training = self.module.training
        self.module.eval()
        preds = [self.predict(self.module.chars[part]) for part in self.regular.split(batch_size)]
        self.module.train(training)
        pred = torch.cat(preds)
        positions = torch.arange(pred.size(0), device=pred.device)
        sums = {t: 0.0 for t in LOSS_TERMS}
        for part in positions.split(batch_size):
            for name, value in self.losses(part, pred[part]).items():
                sums[name] += float(value) * part.numel()
        result = {name: value / pred.size(0) for name, value in sums.items()}
        result.update(approximation_metrics(pred, self.table[self.regular], self.neighbours))
        return result

    def train_epoch(
        self,
        epoch: int,
        optimizer,
        batch_size: int,
        seed: int,
        noise_rate: float,
        noise_types: Sequence[str],
        symbols: Sequence[str],
    ) -> Dict[str, float]:
        """One pass over the clean entries plus this epoch's noisy copies; the mean loss terms."""
        self.module.train()
        device = self.table.device
        count = self.regular.numel()
        positions = torch.arange(count)
        chars = self.module.chars[self.regular].cpu()
        if noise_rate > 0:
            regular_symbols = [symbols[i] for i in self.regular.tolist()]
            noisy_positions, noisy_chars = noisy_samples(
                regular_symbols, noise_rate, noise_types, seed, epoch, chars.size(1)
            )
            positions = torch.cat([positions, noisy_positions])
            chars = torch.cat([chars, noisy_chars])
        generator = torch.Generator().manual_seed(seed * 100003 + epoch)
        order = torch.randperm(positions.numel(), generator=generator)
        sums = {t: 0.0 for t in LOSS_TERMS}
        for batch in order.split(batch_size):
            batch_positions, batch_chars = positions[batch].to(device), chars[batch].to(device)
            terms = self.losses(batch_positions, self.predict(batch_chars))
            optimizer.zero_grad()
            sum(terms.values()).backward()
            optimizer.step()
            for name, value in terms.items():
                sums[name] += value.detach().item() * batch.numel()
        result = {name: value / positions.numel() for name, value in sums.items()}
        result["samples"] = positions.numel()
        result["noisy"] = positions.numel() - count
        return result


def distill(args) -> Dict:
    """Run the tool (``args``: the parsed command line); returns the metrics before and after."""
    if args.epochs < 0:
        raise ValueError(f"--epochs {args.epochs}: must be at least 0")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size}: must be at least 1")
    if not 0.0 <= args.noise_rate <= 1.0:
        raise ValueError(
            f"--noise-rate {args.noise_rate}: must be in [0, 1] (the share of the entries with more "
            f"than four characters that get a misspelled copy each epoch)"
        )
    noise_types = parse_noise_types(args.noise_types, flag="--noise-types")
    if not os.path.isfile(args.checkpoint):
        raise FileNotFoundError(f"--checkpoint {args.checkpoint}: no such file")
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        raise FileNotFoundError(f"--output {args.output}: the directory {out_dir} does not exist")

    dictionary, table = load_table(args.checkpoint, args.side, args.data)
    device = torch.device("cpu" if args.cpu or not torch.cuda.is_available() else "cuda")
    torch.manual_seed(args.seed)
    c2s_args = {name: getattr(args, f"c2s_{name}") for name in C2S_OPTIONS}
    regular = [i for i in range(len(dictionary)) if i >= dictionary.nspecial and i != dictionary.pad()]
    if not regular:
        raise ValueError(f"--checkpoint {args.checkpoint}: the {args.side} dictionary has no regular entries")
    output_scale = float(table[regular].pow(2).mean().sqrt())
    if not output_scale > 0:
        raise ValueError(f"--checkpoint {args.checkpoint}: the {args.side} table is all zeros")
    module = build_module(dictionary, table.size(1), c2s_args, output_scale)
    with torch.no_grad():  # the specials keep E's own rows (the pad row stays zero)
        specials = module.is_special.nonzero().squeeze(1)
        module.special[module.special_slot[specials]] = table[specials] / output_scale
    module.special.requires_grad_(False)
    distiller = Distiller(module, table, args.neighbours, device)
    print(
        f"distilling the {args.side} table of {args.checkpoint}: {len(regular)} entries (+{len(specials)} "
        f"special) x {table.size(1)}, output_scale {output_scale:.5g}, {args.neighbours} neighbours, "
        f"{sum(p.numel() for p in module.parameters() if p.requires_grad)} parameters, device {device}",
        flush=True,
    )

    before = distiller.evaluate(args.batch_size)
    optimizer = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        terms = distiller.train_epoch(
            epoch, optimizer, args.batch_size, args.seed, args.noise_rate, noise_types, dictionary.symbols
        )
        print(_format(f"epoch {epoch}", terms, f" | samples {terms['samples']} | noisy {terms['noisy']}"), flush=True)
    after = distiller.evaluate(args.batch_size)
    k = args.neighbours
    for name, result in (("before", before), ("after", after)):
        print(_format(name, result, f" | accuracy {result['accuracy']:.4f} | precision@{k} {result['precision']:.4f}"))

    module.cpu()
    save_distilled(
        args.output,
        module,
        c2s_args,
        args.side,
        dictionary.symbols,
        args.checkpoint,
        {"before": before, "after": after},
    )
    print(f"wrote {args.output}")
    return {"before": before, "after": after}


def get_parser() -> argparse.ArgumentParser:
    from define_fairseq.models.transformer_c2s import C2S_FIELDS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a trained fairseq checkpoint")
    parser.add_argument("--output", required=True, help="where to write the distilled module (.pt)")
    parser.add_argument(
        "--side",
        choices=("encoder", "decoder"),
        default="encoder",
        help="which embedding table to distil (default: encoder)",
    )
    parser.add_argument(
        "--data", default=None, help="the binarized data directory (its dict.*.txt), if not where the checkpoint says"
    )
    fields = {name: field for name, _, field in C2S_FIELDS}
    for name in C2S_OPTIONS:
        field = fields[f"c2s_{name}"]
        parser.add_argument(
            f"--c2s-{name.replace('_', '-')}",
            type=type(field.default),
            default=field.default,
            help=f"{field.metadata['help']} (default: {field.default})",
        )
    parser.add_argument("--neighbours", type=int, default=10, help="k of L_nbr and of precision@k (default: 10)")
    parser.add_argument(
        "--noise-rate",
        type=float,
        default=0.0,
        help="probability that an entry with more than four characters gets a copy with one "
        "character edit, each epoch (default: 0, no noise)",
    )
    parser.add_argument(
        "--noise-types",
        default=",".join(NOISE_TYPES),
        help=f"comma-separated edit types (default: {','.join(NOISE_TYPES)})",
    )
    parser.add_argument("--epochs", type=int, default=20, help="passes over the entries (default: 20)")
    parser.add_argument("--batch-size", type=int, default=256, help="entries per update (default: 256)")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (default: 0.001)")
    parser.add_argument("--seed", type=int, default=1, help="initialisation, shuffling and noise (default: 1)")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even when a GPU is available")
    return parser


def main(argv=None):
    with exit_on_checkpoint_error():
        distill(get_parser().parse_args(argv))


if __name__ == "__main__":
    main()
