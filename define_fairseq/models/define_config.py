"""The DeFINE unit's arguments read from a configuration, and the flags that set each (for its errors)."""

from typing import Optional

from define_fairseq.models.config_helpers import flag_names
from define_fairseq.modules.define.embedding import DeFINEEmbedding

# DeFINEEmbedding's arguments (and its adaptive map's factor) -> the flags that set them
DEFINE_FLAGS = dict(
    n="--define-n",
    k="--define-k",
    depth="--define-depth",
    max_groups="--define-max-groups",
    variant="--define-variant",
    activation="--define-activation",
    norm="--define-norm",
    dropout="--define-dropout",
    init="--define-init",
    map_dropout="--define-map-dropout",
    factor="--adaptive-input-factor",
)


def define_options(cfg) -> dict:
    """The DeFINE unit's arguments (``DeFINEEmbedding``'s names, but ``m`` and the map's) from a configuration with
    the define_* fields, as plain values."""
    return dict(
        n=cfg.define_n,
        k=cfg.define_k,
        depth=cfg.define_depth,
        max_groups=cfg.define_max_groups,
        variant=str(cfg.define_variant),
        activation=None if cfg.define_activation is None else str(cfg.define_activation),
        norm=None if cfg.define_norm is None else str(cfg.define_norm),
        dropout=cfg.define_dropout,
        init=str(cfg.define_init),
        map_dropout=getattr(cfg, "define_map_dropout", 0.0),  # absent from the configs of older checkpoints
        token_path=None if getattr(cfg, "define_token_path", None) is None else str(cfg.define_token_path),
    )


def build_define_embedding(
    cfg, vocab_size: int, padding_idx: Optional[int], m: int, m_flag: str, **options
) -> DeFINEEmbedding:
    """``DeFINEEmbedding(vocab_size, ...)`` of width ``m`` from a checkpoint's configuration (the folding tool's
    way to rebuild a unit); its errors name the flags (``m_flag``: the flag that sets ``m``). ``options``: more
    keyword arguments (the adaptive map)."""
    with flag_names(m=m_flag, **DEFINE_FLAGS):
        return DeFINEEmbedding(vocab_size, m=m, padding_idx=padding_idx, **define_options(cfg), **options)
