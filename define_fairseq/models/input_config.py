"""The input-layer options of every model family, declared once and mixed into each family's config.

:class:`InputLayerConfig` holds the input kind (``--input-layer``), the width ``n`` of the ``V x n`` table under a
projective map or a DeFINE unit (``--define-n``) and the DeFINE unit's options; :class:`AdaptiveInputConfig` the
adaptive map's, in the families that map through one and whose fairseq base does not declare them. As in fairseq, a
family's config holds its base arch's defaults (a family whose base differs mixes in
``input_layer_config(field=value, ...)``, the same fields with only those defaults changed) and each named arch sets
what it changes with ``args.x = safe_getattr(args, "x", value)``.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from define_fairseq.models.input_layer import INPUT_KINDS
from define_fairseq.modules.define.embedding import TOKEN_PATHS
from define_fairseq.modules.define.unit import ACTIVATIONS, INITS, NORMS, OUTPUT_NORMS, VARIANTS


@dataclass
class DeFINEUnitConfig(FairseqDataclass):
    """The width ``n`` of the ``V x n`` table under a projective map or DeFINE unit, and the unit's options."""

    define_n: int = field(
        default=128,
        metadata={
            "help": "width n of the V x n table under a projective map or DeFINE unit, and of an output layer tied "
            "to it"
        },
    )
    define_k: int = field(default=1024, metadata={"help": "DeFINE largest expansion width k"})
    define_depth: int = field(
        default=3,
        metadata={"help": "DeFINE depth N: N-1 expansion layers up to k, then the reduce to the model width"},
    )
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
    define_output_norm: ChoiceEnum(OUTPUT_NORMS) = field(
        default="none",
        metadata={
            "help": "layer: a LayerNorm over the DeFINE unit's output, which holds the model's input at unit scale "
            "(an LSTM's gates saturate as the reduce layer's linear output grows); none: the output as it is"
        },
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


@dataclass
class InputLayerConfig(DeFINEUnitConfig):
    """The input kind and the options of each kind (``transformer_c2s`` names its decoder's kind
    ``--decoder-input-layer`` and mixes in :class:`DeFINEUnitConfig` alone)."""

    input_layer: ChoiceEnum(tuple(INPUT_KINDS)) = field(
        default="table",
        metadata={
            "help": "table: a V x d table; projective: a V x n table and a linear map n -> d (n: --define-n); "
            "define: a V x n table and a DeFINE unit n -> d (--define-n, --define-k, --define-depth, ...); d is the "
            "width the model reads"
        },
    )


@dataclass
class AdaptiveInputConfig(FairseqDataclass):
    """The adaptive map: the ``V x n`` table replaced by an adaptive input of base width ``n``."""

    adaptive_input: bool = field(default=False, metadata={"help": "map tokens with an adaptive input of width n"})
    adaptive_input_cutoff: Optional[str] = field(
        default=None, metadata={"help": "comma separated adaptive input band boundaries, e.g. 20000,40000,200000"}
    )
    adaptive_input_factor: float = field(default=4, metadata={"help": "adaptive input: width divisor per band"})


def input_layer_config(base=InputLayerConfig, **defaults):
    """``base`` (:class:`InputLayerConfig` or :class:`DeFINEUnitConfig`) with the defaults of the fields named in
    ``defaults`` changed (their types and help kept): the input layer of a family whose base arch differs."""
    changed = []
    for f in dataclasses.fields(base):
        if f.name in defaults:
            changed.append((f.name, f.type, field(default=defaults.pop(f.name), metadata=f.metadata)))
    if defaults:
        raise TypeError(f"{base.__name__} has no field {', '.join(sorted(defaults))}")
    config = dataclasses.make_dataclass(base.__name__, changed, bases=(base,))
    config.__module__ = base.__module__
    return config
