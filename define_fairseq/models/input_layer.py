"""The input layer of every model family: its flags resolved into plain values, then built, and tied to an output.

A family's ``build_model`` reads and checks the flags once, into an :class:`InputLayerSpec`
(:func:`resolve_input_layer`), before it builds any module; :func:`build_input_layer` builds the layer from the spec
alone, with the builder of its kind in :data:`INPUT_KINDS`: a ``V x d`` table (``table``), a ``V x n`` table and a
linear map ``n -> d`` (``projective``), a ``V x n`` table and a DeFINE unit ``n -> d`` (``define``, folded into a
``V x d`` table under ``--define-folded``). With ``--adaptive-input`` the ``V x n`` table is an adaptive input of base
width ``n``. The result, an :class:`InputLayer`, says what an output layer ties to, and :func:`tie_output` ties one.
A family keeps only its own table initialisation and its output layer's shape.
"""

from dataclasses import dataclass
from typing import Callable, Dict, NamedTuple, Optional

import torch
import torch.nn as nn
from fairseq.models import FairseqLanguageModel

from define_fairseq.models.compile import compile_static_parts, resolve_compile
from define_fairseq.models.config_helpers import config_namespace, flag_names, resolve_cutoff
from define_fairseq.models.define_config import DEFINE_FLAGS, define_options
from define_fairseq.modules import AdaptiveInput, DeFINEEmbedding, FoldedDeFINEEmbedding, ProjectiveEmbedding

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


@dataclass(frozen=True)
class InputLayerSpec:
    """An input layer's flags, read and checked: what :func:`build_input_layer` builds from.

    ``kind`` (set by ``kind_flag``), over ``vocab`` symbols with ``padding_idx``, of output width ``width`` (set by
    ``width_flag``); ``n`` the width of the map an output layer ties to; ``define`` the DeFINE unit's arguments
    (``DeFINEEmbedding``'s names); ``folded`` a folded DeFINE unit; ``adaptive_cutoff`` and ``adaptive_factor`` the
    adaptive map's bands (None: a plain table); ``table_init`` the family's initialisation of a ``V x d`` table,
    ``scaled_table`` the table is Transformer-XL's (scaled by sqrt(d), its own initialisation).
    """

    kind: str
    kind_flag: str
    vocab: int
    padding_idx: Optional[int]
    width: int
    width_flag: str
    n: int
    define: Dict[str, object]
    folded: bool
    adaptive_cutoff: Optional[list]
    adaptive_factor: float
    table_init: TableInit
    scaled_table: bool


class InputKind(NamedTuple):
    """An input kind: ``build(spec)`` returns its module (``embedding_dim`` ``spec.width``, a ``weight`` of width
    ``spec.n`` unless it maps through an adaptive input); ``mapped``: its table is ``V x n`` (``--define-n``), not
    ``V x d``; ``adaptive``: it can map through an adaptive input."""

    build: Callable[[InputLayerSpec], nn.Module]
    mapped: bool
    adaptive: bool


def _table(spec: InputLayerSpec) -> nn.Module:
    if spec.adaptive_cutoff is not None:
        return AdaptiveInput(
            spec.vocab, spec.padding_idx, spec.width, spec.adaptive_cutoff, spec.adaptive_factor, output_dim=spec.width
        )
    if spec.scaled_table:
        return ProjectiveEmbedding(spec.vocab, spec.width, spec.width, padding_idx=spec.padding_idx)
    return embedding_table(spec.vocab, spec.width, spec.padding_idx, spec.table_init)


def _projective(spec: InputLayerSpec) -> nn.Module:
    return ProjectiveEmbedding(spec.vocab, spec.n, spec.width, padding_idx=spec.padding_idx)


def _define(spec: InputLayerSpec) -> nn.Module:
    adaptive = dict(adaptive_cutoff=spec.adaptive_cutoff, adaptive_factor=spec.adaptive_factor)
    if spec.folded:
        return FoldedDeFINEEmbedding(spec.vocab, spec.n, spec.width, padding_idx=spec.padding_idx, **adaptive)
    with flag_names(m=spec.width_flag, **DEFINE_FLAGS):
        return DeFINEEmbedding(spec.vocab, m=spec.width, padding_idx=spec.padding_idx, **spec.define, **adaptive)


def build_define_embedding(
    cfg, vocab_size: int, padding_idx: Optional[int], m: int, m_flag: str, adaptive_cutoff=None, adaptive_factor=4
) -> DeFINEEmbedding:
    """A ``DeFINEEmbedding`` of width ``m`` (set by ``m_flag``) rebuilt from a checkpoint's configuration, the
    folding tool's way, through the seam's own DeFINE builder; its errors name the flags."""
    spec = InputLayerSpec(
        kind="define",
        kind_flag="--input-layer",
        vocab=vocab_size,
        padding_idx=padding_idx,
        width=m,
        width_flag=m_flag,
        n=cfg.define_n,
        define=define_options(cfg),
        folded=False,
        adaptive_cutoff=adaptive_cutoff,
        adaptive_factor=adaptive_factor,
        table_init=fairseq_table_init,
        scaled_table=False,
    )
    return _define(spec)


INPUT_KINDS: Dict[str, InputKind] = {
    "table": InputKind(_table, mapped=False, adaptive=True),
    "projective": InputKind(_projective, mapped=True, adaptive=False),
    "define": InputKind(_define, mapped=True, adaptive=True),
}
"""The input kinds, ``--input-layer``'s choices: a kind added here is offered by every family."""


class InputLayer(NamedTuple):
    """What :func:`build_input_layer` returns: ``embed`` (the family's ``embed_tokens``, of output width ``d``),
    ``weight`` (the ``V x n`` table an output layer ties to; None over an adaptive map, whose bands a tied adaptive
    softmax takes from ``embed``), ``tied_width`` (n) and ``adaptive_cutoff`` (the adaptive map's band boundaries,
    None without one)."""

    embed: nn.Module
    weight: Optional[nn.Parameter]
    tied_width: int
    adaptive_cutoff: Optional[list]


def adaptive_input_cutoff(cfg, vocab: int) -> Optional[list]:
    """The band boundaries of ``--adaptive-input`` (ending at ``vocab``), None without it; a ``ValueError`` naming
    the flag when the cutoff is missing."""
    if not getattr(cfg, "adaptive_input", False):
        return None
    cutoff = getattr(cfg, "adaptive_input_cutoff", None)
    if not cutoff:
        raise ValueError("--adaptive-input needs --adaptive-input-cutoff (e.g. 20000,40000,200000)")
    return resolve_cutoff(cutoff, vocab, "--adaptive-input-cutoff")


def resolve_input_layer(
    cfg,
    dictionary,
    width: int,
    width_flag: str,
    kind: Optional[str] = None,
    kind_flag: str = "--input-layer",
    table_init: TableInit = fairseq_table_init,
    scaled_table: bool = False,
    adaptive_map: bool = False,
) -> InputLayerSpec:
    """The input layer that ``cfg`` (a resolved configuration: see ``input_config``) describes, of output width
    ``width`` (set by ``width_flag``), over ``dictionary``, checked; every impossible combination raises
    ``ValueError`` naming the flags.

    ``kind``: the family's own reading of ``kind_flag`` (default: ``cfg.input_layer``). ``adaptive_map``: the family
    has ``--adaptive-input`` (the language models that map through an adaptive input; fairseq's translation
    Transformers carry the flag but have no use for it).
    """
    kind = str(kind or cfg.input_layer)
    if kind not in INPUT_KINDS:
        raise ValueError(f"{kind_flag} {kind}: choose one of {', '.join(INPUT_KINDS)}")
    if width < 1:
        raise ValueError(f"{width_flag}={width} must be at least 1")
    mapped, folded = INPUT_KINDS[kind].mapped, bool(getattr(cfg, "define_folded", False))
    if folded and kind != "define":
        raise ValueError(f"--define-folded needs a DeFINE unit ({kind_flag} define), not {kind_flag} {kind}")
    if mapped and cfg.define_n < 1:
        raise ValueError(f"--define-n={cfg.define_n} must be at least 1")
    if kind == "define" and cfg.define_depth < 1:  # the unit names its own minimum above 0
        raise ValueError(f"{kind_flag} define needs --define-depth >= 1 (got {cfg.define_depth})")
    if kind == "projective" and cfg.define_n == width:
        raise ValueError(
            f"{kind_flag} projective with --define-n {cfg.define_n} = {width_flag}: nothing to project; "
            f"use {kind_flag} table"
        )
    vocab = len(dictionary)
    cutoff = adaptive_input_cutoff(cfg, vocab) if adaptive_map else None
    if cutoff is not None and not INPUT_KINDS[kind].adaptive:
        choices = " or ".join(name for name, each in INPUT_KINDS.items() if each.adaptive)
        raise ValueError(f"--adaptive-input needs {kind_flag} {choices}, not {kind}")
    return InputLayerSpec(
        kind=kind,
        kind_flag=kind_flag,
        vocab=vocab,
        padding_idx=dictionary.pad(),
        width=width,
        width_flag=width_flag,
        n=cfg.define_n if mapped else width,
        define=define_options(cfg),
        folded=folded,
        adaptive_cutoff=cutoff,
        adaptive_factor=getattr(cfg, "adaptive_input_factor", 4),
        table_init=table_init,
        scaled_table=scaled_table,
    )


def build_input_layer(spec: InputLayerSpec) -> InputLayer:
    """The input layer ``spec`` describes, and what an output layer ties to. Shapes: ``embed(tokens [...])`` ->
    ``[..., spec.width]``; ``weight [V, n]``."""
    embed = INPUT_KINDS[spec.kind].build(spec)
    weight = None if spec.adaptive_cutoff is not None else embed.weight
    return InputLayer(embed, weight, spec.n, spec.adaptive_cutoff)


def check_tie(layer, tie_flag: str) -> None:
    """A full softmax can tie to the input layer ``layer`` (an :class:`InputLayerSpec`, so that a family checks the
    tie before it builds, or the built :class:`InputLayer`): a ``ValueError`` naming ``tie_flag`` (the flag that asked
    for the tie) when it maps through an adaptive input, which has no single table (tie an adaptive softmax to its
    bands instead)."""
    if layer.adaptive_cutoff is not None:
        raise ValueError(
            f"{tie_flag}: a full softmax cannot be tied to an adaptive input (it has no single V x n table): add "
            f"--adaptive-softmax-cutoff with --tie-adaptive-weights, or untie"
        )


def tie_output(layer: InputLayer, output: nn.Module, tie_flag: str) -> nn.Module:
    """``output`` (a module whose ``weight`` is ``[V, n]``: a full softmax) with that weight replaced by the input
    layer's table; returns it. A ``ValueError`` naming ``tie_flag`` (the flag that asked for the tie) when the input
    layer has no single table (:func:`check_tie`) or the widths differ."""
    check_tie(layer, tie_flag)
    if output.weight.shape != layer.weight.shape:
        raise ValueError(
            f"{tie_flag}: the output layer is {list(output.weight.shape)}, the input layer's table "
            f"{list(layer.weight.shape)}"
        )
    output.weight = layer.weight
    return output


class InputLayerLanguageModel(FairseqLanguageModel):
    """A language model of one decoder over the input layer, configured before it is built, its static parts
    compiled under ``--torch-compile``.

    A family names its options dataclass (``config_class``) and two functions: ``resolve(args, dictionary)``, the
    family's spec (a frozen dataclass: every flag read, parsed and checked, the input layer's
    :class:`InputLayerSpec` in its ``input`` field), and ``build_decoder(spec, dictionary)``, the decoder built from
    the spec alone. So a bad flag raises before any module is built. Shapes: as the decoder's.
    """

    config_class: type
    resolve: Callable
    build_decoder: Callable

    @classmethod
    def build_model(cls, cfg, task):
        args = cls.resolved_config(cfg)
        resolve_compile(args)  # its flags checked before anything is built
        spec = cls.resolve(args, task.target_dictionary)
        return compile_static_parts(cls(cls.build_decoder(spec, task.target_dictionary)), args)

    @classmethod
    def resolved_config(cls, cfg):
        """``cfg`` (a DictConfig or namespace) as a namespace with every field set: the family's defaults."""
        return config_namespace(cfg, cls.config_class)
