"""The data side of :mod:`define_fairseq.tools.distill_c2s`: the teacher (the embedding table of a fairseq
checkpoint, with its dictionary) and the noisy spellings of its entries that the distillation trains on."""

import argparse
import hashlib
import os
import random
import sys
from typing import Dict, List, Optional, Sequence

import torch

from define_fairseq.data.char_noise import CharNoise, NoiseStats, sample_rng
from define_fairseq.modules.char2subword import BYTE_OFFSET, CONTINUES_CHAR, PAD_CHAR, WORD_START_CHAR, token_characters
from define_fairseq.tools.average_checkpoints import load_checkpoint

MIN_NOISE_CHARS = 5  # the paper noises only subwords longer than four characters
SINGLE_EDIT_TRIES = 100


# -- noisy spellings -------------------------------------------------------------------------------------------


def single_edit(word: str, types: Sequence[str], rng: random.Random) -> Optional[str]:
    """``word`` with exactly one character edit drawn from ``types`` (a position chosen uniformly), or None when
    ``word`` is shorter than five characters or no edit of ``types`` applies to it.

    Draws :class:`CharNoise` passes at rate ``1/len(word)`` until one makes exactly one edit: given one edit,
    every position is equally likely.
    """
    if len(word) < MIN_NOISE_CHARS:
        return None
    noise = CharNoise(1.0 / len(word), types, min_chars=MIN_NOISE_CHARS)
    for _ in range(SINGLE_EDIT_TRIES):
        stats = NoiseStats()
        noised = noise.noise_word(word, rng, stats)
        if stats.edits == 1:
            return noised
    return None


def spelling_characters(text: str, word_start: bool, continues: bool, max_chars: int) -> List[int]:
    """Character ids (as :func:`encode_characters` makes them) of a token spelled ``text`` with these markers."""
    head = [WORD_START_CHAR] if word_start else []
    tail = [CONTINUES_CHAR] if continues else []
    data = [BYTE_OFFSET + b for b in text.encode("utf-8")][: max(max_chars - len(head) - len(tail), 0)]
    return head + data + tail


def noisy_samples(symbols: Sequence[str], rate: float, types: Sequence[str], seed: int, epoch: int, max_chars: int):
    """The noisy copies of one epoch: ``(positions [S] long, chars [S, max_chars] long)``; position i stands for
    ``symbols[i]``. Entry i is drawn with ``sample_rng(seed, epoch, i)``."""
    positions, rows = [], []
    if rate > 0:
        for i, symbol in enumerate(symbols):
            text, word_start, continues = token_characters(symbol)
            if len(text) < MIN_NOISE_CHARS:
                continue
            rng = sample_rng(seed, epoch, i)
            if rng.random() >= rate:
                continue
            noised = single_edit(text, types, rng)
            if noised is not None:
                positions.append(i)
                rows.append(spelling_characters(noised, word_start, continues, max_chars))
    chars = torch.full((len(rows), max_chars), PAD_CHAR, dtype=torch.long)
    for r, ids in enumerate(rows):
        chars[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return torch.tensor(positions, dtype=torch.long), chars


# -- the checkpoint and the output file ------------------------------------------------------------------------


def symbols_md5(symbols: Sequence[str]) -> str:
    """A fingerprint of a dictionary's entries, in id order."""
    return hashlib.md5("\n".join(symbols).encode("utf-8")).hexdigest()


def load_checkpoint_state(checkpoint: str, data: Optional[str] = None) -> Dict:
    """The state of a fairseq checkpoint, read with ``torch.load(weights_only=True)`` (``argparse.Namespace``
    allowed); ``data`` overrides the data directory it records. CheckpointError naming it if it is not one."""
    from fairseq import checkpoint_utils

    overrides = {"data": data} if data else None

    def read(path):
        with torch.serialization.safe_globals([argparse.Namespace]):
            return checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides=overrides)

    return load_checkpoint(checkpoint, read, what="--checkpoint")


def checkpoint_table(state: Dict, checkpoint: str, side: str, data: Optional[str] = None):
    """``(dictionary, E [V, d] float)`` of ``side`` (``encoder``/``decoder``) from a loaded checkpoint ``state``
    (``checkpoint``: its path, for messages)."""
    from fairseq import tasks, utils

    key = f"{side}.embed_tokens.weight"
    model_state = state.get("model") or {}
    if key not in model_state:
        found = sorted(name for name in model_state if "embed_tokens" in name)[:8]
        raise ValueError(
            f"--checkpoint {checkpoint} has no {side} embedding table ({key!r} is not in its model "
            f"state; embedding weights found: {found or 'none'}); --side {side} needs a model whose "
            f"{side}.embed_tokens is an nn.Embedding"
        )
    table = model_state[key].float()
    if table.dim() != 2:
        raise ValueError(f"--checkpoint {checkpoint}: {key} has shape {tuple(table.shape)}, not [V, d]")
    cfg = state["cfg"]
    user_dir = cfg.common.get("user_dir", None) if cfg.get("common", None) is not None else None
    # (a plugin already imported, e.g. this one, is not looked for again at the path the checkpoint recorded)
    if user_dir and os.path.basename(os.path.normpath(user_dir)) not in sys.modules:
        utils.import_user_module(cfg.common)
    try:
        task = tasks.setup_task(cfg.task)
    except FileNotFoundError as error:
        hint = f"check --data {data}" if data else "if the binarized data directory moved, pass it with --data DIR"
        raise FileNotFoundError(
            f"--checkpoint {checkpoint}: its task could not read its dictionaries ({error}); {hint}"
        ) from error
    dictionary = task.source_dictionary if side == "encoder" else task.target_dictionary
    if dictionary is None:
        raise ValueError(
            f"--checkpoint {checkpoint}: its task ({cfg.task._name}) has no "
            f"{'source' if side == 'encoder' else 'target'} dictionary for --side {side}"
        )
    if len(dictionary) != table.size(0):
        raise ValueError(
            f"--checkpoint {checkpoint}: the {side} dictionary has {len(dictionary)} entries but "
            f"{key} has {table.size(0)} rows; pass the data directory the model was trained on "
            f"with --data"
        )
    return dictionary, table


def load_table(checkpoint: str, side: str, data: Optional[str] = None):
    """``(dictionary, E [V, d] float)`` of ``side`` (``encoder``/``decoder``) from a fairseq checkpoint."""
    return checkpoint_table(load_checkpoint_state(checkpoint, data), checkpoint, side, data)
