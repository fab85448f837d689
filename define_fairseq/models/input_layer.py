"""The input layer of every model family, built in one place from the flags.

A family chooses its input layer with ``--input-layer`` (``transformer_c2s``: ``--decoder-input-layer``;
``transformer_define`` and ``transformer_lm_define`` always use DeFINE): a ``V x d`` table, a projective map
(``V x n`` table and ``n -> d``) or a DeFINE unit (``V x n`` table and DeFINE ``n -> d``), the last folded into a
``V x d`` table for inference under ``--define-folded``. With ``--adaptive-input`` the ``V x n`` table is an adaptive
input of base width ``n``. :func:`build_input_layer` builds any of them; the family keeps only what is its own (the
table's initialisation, and its output layer, which ties to the returned module's ``weight`` or, over an adaptive
map, to its ``weights_for_band``).
"""

from typing import Callable, NamedTuple, Optional

import torch
import torch.nn as nn

from define_fairseq.models.config_helpers import parse_cutoff
from define_fairseq.models.define_config import INPUT_LAYERS, build_define_embedding
from define_fairseq.modules import AdaptiveInput, FoldedDeFINEEmbedding, ProjectiveEmbedding, check_cutoff

TableInit = Callable[[torch.Tensor], None]


def fairseq_table_init(weight: torch.Tensor) -> None:
    """fairseq's ``Embedding``: N(0, width^-1/2)."""
    nn.init.normal_(weight, mean=0.0, std=weight.size(1) ** -0.5)


def embedding_table(vocab: int, width: int, padding_idx: Optional[int], init: TableInit) -> nn.Embedding:
    """A ``vocab x width`` ``nn.Embedding`` initialised by ``init``, its padding row zero."""
    embed = nn.Embedding(vocab, width, padding_idx=padding_idx)
    init(embed.weight)
    if padding_idx is not None:
        with torch.no_grad():
            embed.weight[padding_idx].zero_()
    return embed


class InputLayer(NamedTuple):
    """What :func:`build_input_layer` returns: ``embed`` (the family's ``embed_tokens``, of output width ``d``) and
    ``tied_width``, the width of what an output layer ties to (``embed.weight``'s, or the adaptive map's base
    width), and ``adaptive_cutoff``, the adaptive map's band boundaries (None without one)."""

    embed: nn.Module
    tied_width: int
    adaptive_cutoff: Optional[list]


def input_kind(cfg, kind_flag: str = "--input-layer") -> str:
    """The input layer ``cfg`` asks for: its ``input_layer`` (or ``decoder_input_layer``) field, else DeFINE (the
    families without a choice)."""
    field = kind_flag.lstrip("-").replace("-", "_")
    return str(getattr(cfg, field, None) or "define")


def tied_width(cfg, width: int, kind: str) -> int:
    """n, the width of the map an output layer ties to: ``--define-n`` for a projective map or DeFINE unit, the
    model's input width ``width`` for a table."""
    return width if kind == "table" else cfg.define_n


def adaptive_input_cutoff(cfg, vocab: int) -> Optional[list]:
    """The band boundaries of ``--adaptive-input`` (ending at ``vocab``), None without it; a ``ValueError`` naming
    the flag when the cutoff is missing."""
    if not getattr(cfg, "adaptive_input", False):
        return None
    cutoff = getattr(cfg, "adaptive_input_cutoff", None)
    if not cutoff:
        raise ValueError("--adaptive-input needs --adaptive-input-cutoff (e.g. 20000,40000,200000)")
    return check_cutoff(parse_cutoff(cutoff, "--adaptive-input-cutoff"), vocab, "--adaptive-input-cutoff")


def check_input_layer(
    cfg, width: int, width_flag: str, kind: str, kind_flag: str = "--input-layer", kinds=INPUT_LAYERS
) -> None:
    """The checks of the input-layer flags (``ValueError`` naming them): sizes, and what each kind needs. ``kinds``:
    the family's choices (a family may have a kind of its own, built elsewhere)."""
    if kind not in kinds:
        raise ValueError(f"{kind_flag} {kind}: choose one of {', '.join(kinds)}")
    if width < 1:
        raise ValueError(f"{width_flag}={width} must be at least 1")
    if getattr(cfg, "define_folded", False) and kind != "define":
        raise ValueError(f"--define-folded needs a DeFINE unit ({kind_flag} define), not {kind_flag} {kind}")
    if kind in ("projective", "define") and cfg.define_n < 1:
        raise ValueError(f"--define-n={cfg.define_n} must be at least 1")
    # where the kind is a flag, a depth below 1 is refused naming it (the table is its own kind); elsewhere the
    # unit names its own minimum
    if kind == "define" and cfg.define_depth < 1 and getattr(cfg, kind_flag.lstrip("-").replace("-", "_"), None):
        raise ValueError(f"{kind_flag} define needs --define-depth >= 1 (got {cfg.define_depth})")
    if kind == "projective" and cfg.define_n == width:
        raise ValueError(
            f"{kind_flag} projective with --define-n {cfg.define_n} = {width_flag}: nothing to project; "
            f"use {kind_flag} table"
        )


def build_input_layer(
    cfg,
    dictionary,
    width: int,
    width_flag: str,
    kind: Optional[str] = None,
    kind_flag: str = "--input-layer",
    table_init: TableInit = fairseq_table_init,
    scaled_table: bool = False,
    adaptive_map: bool = False,
) -> InputLayer:
    """The input layer ``cfg`` describes, of output width ``width`` (set by ``width_flag``), over ``dictionary``.

    ``kind``: ``table``, ``projective`` or ``define`` (default: :func:`input_kind`). ``table_init``: the family's
    initialisation of a ``V x width`` table. ``scaled_table``: the table is Transformer-XL's (a
    :class:`ProjectiveEmbedding` without projection, scaled by sqrt(d)) instead of a plain ``nn.Embedding``.
    ``adaptive_map``: the family has ``--adaptive-input`` (the language models that map through an adaptive input;
    fairseq's translation Transformers carry the flag but have no use for it). Every impossible combination raises
    ``ValueError`` naming the flags.
    """
    kind = kind or input_kind(cfg, kind_flag)
    check_input_layer(cfg, width, width_flag, kind, kind_flag)
    vocab, pad = len(dictionary), dictionary.pad()
    cutoff = adaptive_input_cutoff(cfg, vocab) if adaptive_map else None
    factor = getattr(cfg, "adaptive_input_factor", 4)
    n = tied_width(cfg, width, kind)
    if cutoff is not None and kind == "projective":
        raise ValueError(f"--adaptive-input needs {kind_flag} table or define, not projective")
    if kind == "table":
        if cutoff is not None:
            embed = AdaptiveInput(vocab, pad, width, cutoff, factor, output_dim=width)
        elif scaled_table:
            embed = ProjectiveEmbedding(vocab, width, width, padding_idx=pad)
        else:
            embed = embedding_table(vocab, width, pad, table_init)
    elif kind == "projective":
        embed = ProjectiveEmbedding(vocab, n, width, padding_idx=pad)
    elif cfg.define_folded:
        embed = FoldedDeFINEEmbedding(vocab, n, width, padding_idx=pad, adaptive_cutoff=cutoff, adaptive_factor=factor)
    else:
        embed = build_define_embedding(
            cfg, vocab, pad, width, width_flag, adaptive_cutoff=cutoff, adaptive_factor=factor
        )
    return InputLayer(embed, n, cutoff)
