"""The DeFINE options shared by every model of the plugin that can embed its tokens with DeFINE.

``define_n`` and ``define_depth`` are not here: their defaults differ between families (a V x 128 table for the
Transformers, 256 for the WikiText-103 LSTMs), so each family's config declares them once with its base arch's value
(:func:`define_n_field`, :func:`define_depth_field`). So does ``input_layer`` (:func:`input_layer_field`), in the
language models whose input layer is a choice.
"""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum

from define_fairseq.models.compile import CompileConfig
from define_fairseq.models.config_helpers import flag_names
from define_fairseq.modules.define import ACTIVATIONS, INITS, NORMS, VARIANTS
from define_fairseq.modules.define_embedding import TOKEN_PATHS, DeFINEEmbedding

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


def define_n_field(default: int, help: str = "DeFINE map dimension n (the V x n table)"):
    """The ``define_n`` field of a family's config, with its base arch's default."""
    return field(default=default, metadata={"help": help})


def define_depth_field(
    default: int, help: str = "DeFINE depth N: N-1 expansion layers up to k, then the reduce to the model width"
):
    """The ``define_depth`` field of a family's config, with its base arch's default."""
    return field(default=default, metadata={"help": help})


INPUT_LAYERS = ("table", "projective", "define")
"""The input layers a language model can have, chosen with ``--input-layer``: ``table`` (a ``V x d`` table),
``projective`` (a ``V x n`` table and a linear map ``n -> d``, Transformer-XL's, the DeFINE paper's Table 2
baseline), ``define`` (a ``V x n`` table and a DeFINE unit ``n -> d``); ``d`` is the width the model reads."""


TABLE_OR_DEFINE = ("table", "define")  # the choices of the families without a projective input

INPUT_LAYER_HELP = {
    "table": "a V x d table (d: {width})",
    "projective": "a V x n table and a linear map n -> d (n: --define-n)",
    "define": "a V x n table and a DeFINE unit n -> d (--define-n, --define-k, --define-depth, ...)",
}


def input_layer_field(default: str, width_flag: str, choices=INPUT_LAYERS):
    """The ``input_layer`` field of a family's config (type ``ChoiceEnum(choices)``), with its base arch's
    default; ``width_flag`` is the flag that sets ``d``."""
    described = "; ".join(f"{name}: {INPUT_LAYER_HELP[name]}" for name in choices)
    return field(default=default, metadata={"help": described.format(width=width_flag)})


@dataclass
class DeFINEConfig(CompileConfig):
    define_k: int = field(default=1024, metadata={"help": "DeFINE largest expansion width k"})
    define_max_groups: int = field(
        default=4, metadata={"help": "groups g_max of the first DeFINE layer; layer l uses max(g_max/2^(l-1), 1)"}
    )
    define_variant: ChoiceEnum(VARIANTS + ("delight",)) = field(
        default="define",
        metadata={
            "help": "define: HGT + split-and-mix skip; define_concat: plain concat skip (no mixer); "
            "hgt: no skip; glt: fixed groups; lt: dense layers; projective: one linear map n -> m; "
            "delight: the authors' unit (sacmehta/delight, --define-iclr)"
        },
    )
    define_activation: Optional[ChoiceEnum(list(ACTIVATIONS))] = field(
        default=None,
        metadata={
            "help": "activation after each DeFINE expansion layer (default: gelu; swish for --define-variant delight)"
        },
    )
    define_norm: Optional[ChoiceEnum(NORMS)] = field(
        default=None, metadata={"help": "normalisation after each DeFINE expansion layer (default: group)"}
    )
    define_dropout: float = field(default=0.0, metadata={"help": "dropout after each DeFINE expansion layer"})
    define_map_dropout: float = field(
        default=0.0,
        metadata={
            "help": "dropout on the scaled V x n map output before the DeFINE unit, one mask per "
            "sentence and feature (the authors' delight_emb_dropout)"
        },
    )
    define_init: ChoiceEnum(INITS) = field(
        default="unit",
        metadata={
            "help": "unit: the DeFINE unit's last layer starts scaled so that its output has "
            "unit variance, like the table it replaces; linear: nn.Linear's init "
            "throughout (not for --define-variant delight, which keeps the authors')"
        },
    )
    define_token_path: Optional[ChoiceEnum(TOKEN_PATHS)] = field(
        default=None,
        metadata={
            "help": "where the DeFINE unit runs while training: unique (once per distinct token of the batch; the "
            "host waits for the count), table (on the whole V x n map: static shapes, no host synchronisation), "
            "positions (on every position), auto (table when V is below the step's tokens, else positions); "
            "default: auto on CUDA and with --torch-compile, unique on a CPU"
        },
    )
    define_folded: bool = field(
        default=False,
        metadata={
            "help": "embeddings are plain V x m tables folded from DeFINE (set by define_fairseq.tools.fold_define)"
        },
    )


def build_define_embedding(
    cfg, vocab_size: int, padding_idx: Optional[int], m: int, m_flag: str, **options
) -> DeFINEEmbedding:
    """``DeFINEEmbedding(vocab_size, ...)`` of width ``m`` from a config with define_* fields, the one place where
    the flags reach the unit; its errors name the flags (``m_flag``: the flag that sets ``m``). ``options``: more
    keyword arguments (the adaptive map)."""
    with flag_names(m=m_flag, **DEFINE_FLAGS):
        return DeFINEEmbedding(
            vocab_size,
            n=cfg.define_n,
            k=cfg.define_k,
            m=m,
            depth=cfg.define_depth,
            max_groups=cfg.define_max_groups,
            variant=str(cfg.define_variant),
            activation=None if cfg.define_activation is None else str(cfg.define_activation),
            norm=None if cfg.define_norm is None else str(cfg.define_norm),
            dropout=cfg.define_dropout,
            init=str(cfg.define_init),
            map_dropout=getattr(cfg, "define_map_dropout", 0.0),  # absent from the configs of older checkpoints
            token_path=None if getattr(cfg, "define_token_path", None) is None else str(cfg.define_token_path),
            padding_idx=padding_idx,
            **options,
        )
