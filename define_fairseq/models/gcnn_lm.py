"""``gcnn_lm``: the gated convolutional language model of Dauphin et al. (ICML 2017), as the paper draws it.

The model, from tokens to the vocabulary::

    V x e lookup (or a V x n table -> DeFINE unit -> e, ``--input-layer define``)
    -> residual blocks of causal gated convolutions (``--gcnn-layers``), GLU by default
    -> adaptive softmax (``--adaptive-softmax-cutoff``) or a full softmax

Where it differs from fairseq's ``fconv_lm`` (``fconv_lm_dauphin_*``), it follows the paper: the first
convolution reads the lookup table directly (no input projection), residuals are not scaled by √0.5
(``--gcnn-residual-scale``), a bottleneck block has one residual around its layers, and there is no dropout by
default (the paper mentions none). Where a block changes the width the skip is a weight-normalised 1×1
projection, as in fairseq (the paper does not say).

The archs follow Table 1 of the paper as fairseq (``fconv_lm_dauphin_*``) and theanolm give it; its widths,
kernels and embedding sizes are not checked against the paper's table (``examples/gated_conv_lm/README.md``).
Adaptive softmax cutoffs are fairseq's:

==============  =======  ===========================================================  ======  ==========
arch            dataset  blocks, (width, kernel)                                      e       receptive
==============  =======  ===========================================================  ======  ==========
``gcnn_lm_8``   WT103    (800, 4) x 8 (the paper's text: "8 layers of 800 units")     280     25
``gcnn_lm_14``  WT103    (850, 6) x 3, (850, 1), (850, 5) x 4, (850, 1), (850, 4) x 3,  280     47
                         (1024, 4), (2048, 4)
``gcnn_lm_13``  GBW      (1268, 4) x 13                                               128     40
``gcnn_lm_8b``  GBW      (512, 1); bottlenecks [1x1 128, 5 128, 1x1 512] x 3,         128     25
                         [256, 256, 512] x 3, [1x1 1024, 1x1 1024, 1x1 2048] x 1
``gcnn_lm_14b`` GBW      (512, 5); bottlenecks [1x1 128, 5 128, 1x1 512] x 3,         128     57
                         [512, 512, 1024] x 3, [1024, 1024, 2048] x 6, [1024, 1024, 4096]
==============  =======  ===========================================================  ======  ==========

Use ``--criterion adaptive_loss --ddp-backend legacy_ddp`` with the adaptive softmax. Generation decodes one
token at a time, each layer keeping its last k - 1 inputs (``incremental_state``), equal to the full pass.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch.nn as nn
from fairseq.dataclass import ChoiceEnum
from fairseq.models import FairseqIncrementalDecoder, register_model, register_model_architecture
from fairseq.modules import AdaptiveSoftmax
from fairseq.utils import safe_getattr
from torch import Tensor

from define_fairseq.models.adaptive_softmax import AdaptiveSoftmaxSpec, build_adaptive_softmax, resolve_adaptive_softmax
from define_fairseq.models.carried_state import reorder_cached
from define_fairseq.models.compile import CompileConfig
from define_fairseq.models.config_helpers import MAX_POSITIONS
from define_fairseq.models.input_config import InputLayerConfig
from define_fairseq.models.input_layer import (
    InputLayerLanguageModel,
    InputLayerSpec,
    build_input_layer,
    resolve_input_layer,
)
from define_fairseq.modules.checks import check_choice, check_probability
from define_fairseq.modules.gated_conv import ACTIVATIONS, Block, GatedConvStack, parse_layer_spec

GCNN_8 = "[(800, 4)] * 8"
GCNN_14 = "[(850, 6)] * 3 + [(850, 1)] + [(850, 5)] * 4 + [(850, 1)] + [(850, 4)] * 3 + [(1024, 4)] + [(2048, 4)]"
GCNN_13 = "[(1268, 4)] * 13"
GCNN_8B = (
    "[(512, 1)] + [[(128, 1), (128, 5), (512, 1)]] * 3 + [[(256, 1), (256, 5), (512, 1)]] * 3"
    " + [[(1024, 1), (1024, 1), (2048, 1)]]"
)
GCNN_14B = (
    "[(512, 5)] + [[(128, 1), (128, 5), (512, 1)]] * 3 + [[(512, 1), (512, 5), (1024, 1)]] * 3"
    " + [[(1024, 1), (1024, 5), (2048, 1)]] * 6 + [[(1024, 1), (1024, 5), (4096, 1)]]"
)
# fairseq's adaptive softmax cutoffs of fconv_lm_dauphin_wikitext103 and fconv_lm_dauphin_gbw
DAUPHIN_WT103_CUTOFF = "10000,20000,200000"
DAUPHIN_GBW_CUTOFF = "10000,50000,200000"


@dataclass
class GatedConvLMConfig(InputLayerConfig, CompileConfig):
    decoder_embed_dim: int = field(default=280, metadata={"help": "lookup width e (the first block's input)"})
    gcnn_layers: str = field(
        default=GCNN_8,
        metadata={
            "help": "residual blocks: a Python list of (width, kernel) tuples, each a block of one gated "
            "convolution, or of lists of such tuples, each a bottleneck block with one residual; "
            '+ and * allowed, e.g. "[(850, 6)] * 3 + [[(128, 1), (128, 5), (512, 1)]]"'
        },
    )
    gcnn_activation: ChoiceEnum(ACTIVATIONS) = field(
        default="glu",
        metadata={
            "help": "glu: (X*W+b) x sigmoid(X*V+c) (the paper's); gtu, bilinear, relu, tanh, "
            "linear: the paper's ablations"
        },
    )
    gcnn_residual_scale: float = field(
        default=1.0,
        metadata={"help": "multiply each block's x + F(x) by this (1: the paper; fairseq's fconv_lm uses 0.7071)"},
    )
    gcnn_no_weight_norm: bool = field(
        default=False, metadata={"help": "plain convolutions instead of weight-normalised ones"}
    )
    dropout: float = field(
        default=0.0,
        metadata={
            "help": "dropout on the lookup output, every convolution's input and the features "
            "given to the softmax (the paper uses none)"
        },
    )
    adaptive_softmax_cutoff: Optional[str] = field(
        default=None,
        metadata={
            "help": "comma separated adaptive softmax cutoffs (none: full softmax); use "
            "--criterion adaptive_loss --ddp-backend legacy_ddp"
        },
    )
    adaptive_softmax_dropout: float = field(
        default=0.0, metadata={"help": "dropout inside the adaptive softmax tail clusters"}
    )
    adaptive_softmax_factor: float = field(default=4, metadata={"help": "adaptive softmax: width divisor per band"})


class GatedConvLMDecoder(FairseqIncrementalDecoder):
    """Lookup -> :class:`GatedConvStack` -> output layer.

    ``forward(tokens [B, T], incremental_state=None, features_only=False)`` returns ``(x, extra)``: ``x`` the
    logits ``[B, T, V]`` (full softmax) or the features ``[B, T, d]`` given to the adaptive softmax. In
    incremental decoding, once a state is cached, only the last token of ``tokens`` is read and one position is
    returned; every layer keeps its last ``kernel - 1`` inputs in ``incremental_state``.
    """

    def __init__(
        self,
        dictionary,
        embed_tokens: nn.Module,
        convolutions: GatedConvStack,
        output_projection: Optional[nn.Linear] = None,
        adaptive_softmax: Optional[AdaptiveSoftmax] = None,
        dropout: float = 0.0,
    ):
        super().__init__(dictionary)
        if embed_tokens.embedding_dim != convolutions.input_dim:
            raise ValueError(
                f"the lookup gives {embed_tokens.embedding_dim} features but the first block takes "
                f"{convolutions.input_dim}"
            )
        if (output_projection is None) == (adaptive_softmax is None):
            raise ValueError("give exactly one of output_projection (full softmax) and adaptive_softmax")
        check_probability(dropout, "dropout")
        self.embed_tokens = embed_tokens
        self.convolutions = convolutions
        self.output_projection = output_projection
        self.adaptive_softmax = adaptive_softmax
        self.dropout = dropout

    def forward(self, prev_output_tokens: Tensor, incremental_state=None, features_only: bool = False, **unused):
        x, extra = self.extract_features(prev_output_tokens, incremental_state=incremental_state)
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(self, prev_output_tokens: Tensor, incremental_state=None, **unused):
        tokens = prev_output_tokens
        state = None
        if incremental_state is not None:
            state = self._cached_histories(incremental_state)
            if state is None:
                state = self.convolutions.initial_state(tokens.size(0), self._dtype_probe())
            else:
                tokens = tokens[:, -1:]
        x = self.embed_tokens(tokens)
        x = nn.functional.dropout(x, self.dropout, self.training)
        x, state = self.convolutions(x, state)
        x = nn.functional.dropout(x, self.dropout, self.training)
        if incremental_state is not None:
            self.set_incremental_state(incremental_state, "histories", {str(i): h for i, h in enumerate(state)})
        return x, {"attn": None, "inner_states": None}

    def _dtype_probe(self) -> Tensor:
        """A tensor with the dtype and device of the convolutions' parameters."""
        return next(self.convolutions.parameters())

    def _cached_histories(self, incremental_state) -> Optional[List[Tensor]]:
        cached = self.get_incremental_state(incremental_state, "histories")
        if cached is None:
            return None
        return [cached[str(i)] for i in range(len(cached))]

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        reorder_cached(self, incremental_state, "histories", new_order)

    def output_layer(self, features: Tensor, **kwargs) -> Tensor:
        if self.adaptive_softmax is not None:
            return features
        return self.output_projection(features)

    def max_positions(self) -> int:
        return MAX_POSITIONS


def gcnn_table_init(weight: Tensor) -> None:
    """fairseq's fconv_lm initialisation of the table: N(0, 0.1)."""
    nn.init.normal_(weight, mean=0.0, std=0.1)


@dataclass(frozen=True)
class GatedConvLMSpec:
    """A :class:`GatedConvLMDecoder`'s configuration, read and checked: what :func:`build_gated_conv_decoder`
    builds. ``input``: the lookup (``V x e``, or a map and a unit to e); ``blocks``: the residual blocks of
    ``(width, kernel)`` layers (:func:`~define_fairseq.modules.gated_conv.parse_layer_spec`); ``activation``,
    ``weight_norm``, ``dropout``, ``residual_scale``: the stack's; ``adaptive_softmax``: the output layer, or None
    for a full softmax."""

    input: InputLayerSpec
    blocks: Tuple[Tuple[Tuple[int, int], ...], ...]
    activation: str
    weight_norm: bool
    dropout: float
    residual_scale: float
    adaptive_softmax: Optional[AdaptiveSoftmaxSpec]


def resolve_gated_conv_lm(cfg, dictionary) -> GatedConvLMSpec:
    """The decoder that ``cfg`` (a namespace of :class:`GatedConvLMConfig` fields) describes over ``dictionary``,
    every flag checked and nothing built; a ``ValueError`` naming the flag for every impossible setting."""
    layer = resolve_input_layer(
        cfg, dictionary, cfg.decoder_embed_dim, "--decoder-embed-dim", table_init=gcnn_table_init
    )
    blocks: List[Block] = parse_layer_spec(cfg.gcnn_layers, "--gcnn-layers")
    if cfg.gcnn_residual_scale <= 0:
        raise ValueError(f"--gcnn-residual-scale={cfg.gcnn_residual_scale} must be positive")
    output_dim = blocks[-1][-1][0]  # the last block's output: the features given to the softmax
    return GatedConvLMSpec(
        input=layer,
        blocks=tuple(tuple(block) for block in blocks),
        activation=check_choice(str(cfg.gcnn_activation), ACTIVATIONS, "--gcnn-activation"),
        weight_norm=not cfg.gcnn_no_weight_norm,
        dropout=check_probability(cfg.dropout, "--dropout"),
        residual_scale=cfg.gcnn_residual_scale,
        adaptive_softmax=resolve_adaptive_softmax(cfg, layer.vocab, output_dim),
    )


def build_gated_conv_decoder(spec: GatedConvLMSpec, dictionary) -> GatedConvLMDecoder:
    """The decoder ``spec`` describes (of :func:`resolve_gated_conv_lm`, which checked it), over ``dictionary``.

    Shapes: as :class:`GatedConvLMDecoder`'s.
    """
    layer = build_input_layer(spec.input)
    convolutions = GatedConvStack(
        spec.input.width,
        [list(block) for block in spec.blocks],
        activation=spec.activation,
        weight_norm=spec.weight_norm,
        dropout=spec.dropout,
        residual_scale=spec.residual_scale,
    )
    output_projection = adaptive_softmax = None
    if spec.adaptive_softmax is not None:
        adaptive_softmax = build_adaptive_softmax(spec.adaptive_softmax)
    else:
        d = convolutions.output_dim
        output_projection = nn.Linear(d, len(dictionary))
        nn.init.normal_(output_projection.weight, mean=0.0, std=d**-0.5)
        nn.init.zeros_(output_projection.bias)
    return GatedConvLMDecoder(
        dictionary,
        layer.embed,
        convolutions,
        output_projection=output_projection,
        adaptive_softmax=adaptive_softmax,
        dropout=spec.dropout,
    )


@register_model("gcnn_lm", dataclass=GatedConvLMConfig)
class GatedConvLanguageModel(InputLayerLanguageModel):
    """Gated convolutional LM (see the module docstring). ``forward(src_tokens [B, T], src_lengths=None,
    incremental_state=None)`` as :class:`GatedConvLMDecoder`."""

    config_class = GatedConvLMConfig
    resolve = staticmethod(resolve_gated_conv_lm)
    build_decoder = staticmethod(build_gated_conv_decoder)


@register_model_architecture("gcnn_lm", "gcnn_lm_8")
def gcnn_lm_8(args):
    """GCNN-8 (WikiText-103): 8 layers of 800 units, kernel 4 (the width of the paper's text, "8 layers of 800
    units"), lookup 280 (the config's defaults), fairseq's WikiText-103 cutoffs."""
    args.adaptive_softmax_cutoff = safe_getattr(args, "adaptive_softmax_cutoff", DAUPHIN_WT103_CUTOFF)


@register_model_architecture("gcnn_lm", "gcnn_lm_14")
def gcnn_lm_14(args):
    """GCNN-14 (WikiText-103): the layer table of fairseq's ``fconv_lm_dauphin_wikitext103``, lookup 280."""
    args.gcnn_layers = safe_getattr(args, "gcnn_layers", GCNN_14)
    gcnn_lm_8(args)


@register_model_architecture("gcnn_lm", "gcnn_lm_13")
def gcnn_lm_13(args):
    """GCNN-13 (Google Billion Word): 13 layers of 1268 units, kernel 4, lookup 128."""
    args.decoder_embed_dim = safe_getattr(args, "decoder_embed_dim", 128)
    args.gcnn_layers = safe_getattr(args, "gcnn_layers", GCNN_13)
    args.adaptive_softmax_cutoff = safe_getattr(args, "adaptive_softmax_cutoff", DAUPHIN_GBW_CUTOFF)


@register_model_architecture("gcnn_lm", "gcnn_lm_8b")
def gcnn_lm_8b(args):
    """GCNN-8 Bottleneck (Google Billion Word, the paper's speed model): one 1x1 layer and 7 bottleneck blocks."""
    args.gcnn_layers = safe_getattr(args, "gcnn_layers", GCNN_8B)
    gcnn_lm_13(args)


@register_model_architecture("gcnn_lm", "gcnn_lm_14b")
def gcnn_lm_14b(args):
    """GCNN-14 Bottleneck (Google Billion Word): one k=5 layer and 13 bottleneck blocks up to 4096 units."""
    args.gcnn_layers = safe_getattr(args, "gcnn_layers", GCNN_14B)
    gcnn_lm_13(args)
