"""``transformer_xl_lm``: Transformer-XL (Dai et al., 2019) with a table, projective or DeFINE input layer, the
DeFINE paper's main WikiText-103 experiment (Table 2).

The model, from tokens to the vocabulary::

    input layer (--input-layer):
        table        V x d table, scaled by sqrt(d)                                   (n = d, no projection)
        projective   V x n table -> n x d projection, scaled by sqrt(d)               (Transformer-XL's adaptive
                                                                                      embedding with div_val 1)
        define       V x n table -> DeFINE unit (N, k) -> d                          (not scaled, as in
                                                                                      transformer_define)
    -> Transformer-XL stack: relative positional attention with the shared r_w / r_r biases, segment-level
       recurrence over a memory of --txl-mem-len states per layer (no gradient through it)
    -> projected adaptive softmax tied to the V x n table (--adaptive-softmax-cutoff, 4 clusters on WT103), one
       d -> n projection per cluster

Projections (d -> n, one per cluster, none when n = d), so that a model with n != d has the paper's input/output
count V·n + V + 4·n·d (Table 2's input/output column): the projective model ties the head cluster's projection to
its input projection and gives each tail cluster its own; the DeFINE model has no input projection (DeFINE reduces
to d itself) and four output projections. Transformer-XL's own code ties the tail clusters' projections to the input
projection instead, which gives two distinct matrices; the paper's counts need four.

With ``--task stateful_lm`` the memory is carried from batch to batch (reset at the start of each epoch and
evaluation pass), as Transformer-XL trains and evaluates; the training memory is saved in checkpoints, so a run
resumed mid-epoch continues it (see :mod:`define_fairseq.models.carried_state`). With any other task (e.g.
``language_modeling`` for sampling) every batch starts without memory. In incremental decoding (fairseq-generate,
sampling) the memory holds every earlier position, so each step equals the full pass. Evaluation in Transformer-XL's
setting:
``--model-overrides "{'txl_mem_len': 640, 'txl_clamp_len': 400, 'txl_same_length': True}"`` with
``--tokens-per-sample 64``.

Train with ``--criterion lm_regularized_loss --ddp-backend legacy_ddp`` (it scores every target word; fairseq's
``adaptive_loss`` would skip, in each tail cluster, the word whose index there equals the padding index).
"""

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.models import FairseqIncrementalDecoder, register_model, register_model_architecture
from fairseq.utils import safe_getattr
from torch import Tensor

from define_fairseq.models.carried_state import CarriedState, reorder_cached
from define_fairseq.models.compile import CompileConfig
from define_fairseq.models.config_helpers import MAX_POSITIONS, resolve_cutoff
from define_fairseq.models.input_config import InputLayerConfig
from define_fairseq.models.input_layer import (
    InputLayerLanguageModel,
    InputLayerSpec,
    build_input_layer,
    resolve_input_layer,
)
from define_fairseq.modules.checks import check_nonnegative, check_positive, check_probability
from define_fairseq.modules.transformer_xl.layers import TransformerXLStack
from define_fairseq.modules.transformer_xl.projected_adaptive_softmax import ProjectedAdaptiveSoftmax

TXL_WT103_CUTOFF = "20000,40000,200000"  # the adaptive softmax cutoffs of Transformer-XL's WikiText-103 models


@dataclass
class TransformerXLConfig(InputLayerConfig, CompileConfig):
    decoder_layers: int = field(default=16, metadata={"help": "number of Transformer-XL layers"})
    decoder_embed_dim: int = field(default=410, metadata={"help": "model width d (d_model)"})
    decoder_attention_heads: int = field(default=10, metadata={"help": "attention heads"})
    txl_head_dim: int = field(
        default=41,
        metadata={"help": "width of each head (heads x width may differ from d: the paper's 384 model keeps 10 x 41)"},
    )
    decoder_ffn_embed_dim: int = field(default=2100, metadata={"help": "inner width of the feed-forward layers"})
    dropout: float = field(
        default=0.1,
        metadata={
            "help": "dropout on the embeddings, positions, sublayer outputs and the features given to the softmax"
        },
    )
    attention_dropout: float = field(default=0.0, metadata={"help": "dropout on the attention probabilities"})
    txl_pre_norm: bool = field(default=False, metadata={"help": "LayerNorm before each sublayer (default: after)"})
    txl_mem_len: int = field(default=150, metadata={"help": "states kept per layer from the previous segments"})
    txl_clamp_len: int = field(
        default=-1, metadata={"help": "relative distances beyond this use the encoding of this distance (-1: none)"}
    )
    txl_same_length: bool = field(
        default=False, metadata={"help": "every position attends to the same number of states (evaluation)"}
    )
    adaptive_softmax_cutoff: Optional[str] = field(
        default=TXL_WT103_CUTOFF,
        metadata={
            "help": "comma separated cluster boundaries of the projected adaptive softmax (empty: one "
            "cluster, a full softmax)"
        },
    )
    adaptive_softmax_dropout: float = field(default=0.0, metadata={"help": "dropout on the softmax's input"})


class TransformerXLDecoder(FairseqIncrementalDecoder):
    """Input layer -> :class:`TransformerXLStack` -> :class:`ProjectedAdaptiveSoftmax` (see the module docstring).

    ``forward(src_tokens [B, T], reset_state=None, incremental_state=None, features_only=False)`` returns
    ``(features [B, T, d], extra)``; the criterion and ``get_normalized_probs`` apply ``self.adaptive_softmax``.
    """

    def __init__(
        self, dictionary, embed_tokens: nn.Module, stack: TransformerXLStack, adaptive_softmax: ProjectedAdaptiveSoftmax
    ):
        super().__init__(dictionary)
        self.embed_tokens = embed_tokens
        self.stack = stack
        self.adaptive_softmax = adaptive_softmax
        self.memory = CarriedState("Transformer-XL memory")

    def forward(
        self,
        prev_output_tokens: Tensor,
        src_lengths=None,
        reset_state: Optional[bool] = None,
        incremental_state=None,
        features_only: bool = False,
        **unused,
    ):
        return self.extract_features(prev_output_tokens, reset_state=reset_state, incremental_state=incremental_state)

    def extract_features(
        self, prev_output_tokens: Tensor, reset_state: Optional[bool] = None, incremental_state=None, **unused
    ):
        if self.stack.mark_cudagraph_steps:  # CUDA graphs: a new step, before any of its graphs runs
            torch.compiler.cudagraph_mark_step_begin()
        tokens = prev_output_tokens
        batch = tokens.size(0)
        # Without autograd (evaluation, generation) the weights cannot change between two calls, so the keys and
        # values of the memory are kept with it instead of being computed again every segment.
        cache_kv = not torch.is_grad_enabled()
        if incremental_state is not None:
            memory, memory_kv = self._cached_memory(incremental_state)
            if memory is not None:
                tokens = tokens[:, -1:]
                keep = memory[0].size(0) + tokens.size(1)
            else:
                keep = tokens.size(1)
        else:
            state = self.memory.initial(reset_state, self.training, batch)
            memory, memory_kv = (None, None) if state is None else (state["memory"], state.get("kv"))
            keep = None
        x = self.embed_tokens(tokens)
        memory_kv = memory_kv if cache_kv else None
        if cache_kv:
            x, memory, memory_kv = self.stack(x, memory, keep=keep, memory_kv=memory_kv, return_kv=True)
        else:
            x, memory = self.stack(x, memory, keep=keep)
        if incremental_state is not None:
            cached = {f"h{i}": m for i, m in enumerate(memory)}
            for i, (keys, values) in enumerate(memory_kv or []):
                cached[f"k{i}"], cached[f"v{i}"] = keys, values
            self.set_incremental_state(incremental_state, "memory", cached)
        else:
            state = {"memory": memory} if memory_kv is None else {"memory": memory, "kv": memory_kv}
            self.memory.keep(reset_state, self.training, batch, state)
        return x, {"attn": None, "inner_states": None}

    def _cached_memory(self, incremental_state):
        """``(memory, memory_kv or None)`` kept in ``incremental_state``, or ``(None, None)``."""
        cached = self.get_incremental_state(incremental_state, "memory")
        if cached is None:
            return None, None
        layers = len(self.stack.layers)
        memory = [cached[f"h{i}"] for i in range(layers)]
        if "k0" not in cached:
            return memory, None
        return memory, [(cached[f"k{i}"], cached[f"v{i}"]) for i in range(layers)]

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], new_order: Tensor):
        # memory, keys and values are [M, B, *]: the batch is dimension 1
        reorder_cached(self, incremental_state, "memory", new_order, batch_dim=1)

    def output_layer(self, features: Tensor, **kwargs) -> Tensor:
        return features

    def max_positions(self) -> int:
        return MAX_POSITIONS


@dataclass(frozen=True)
class TransformerXLSpec:
    """A :class:`TransformerXLDecoder`'s configuration, read and checked: what :func:`build_transformer_xl_decoder`
    builds. ``input``: the input layer, d wide (a table is Transformer-XL's, scaled by sqrt(d)); the stack's
    arguments as :class:`TransformerXLStack` names them (``num_layers`` to ``same_length``); the softmax's
    ``cutoff`` (the tail clusters' boundaries, without V; empty: one cluster) and ``softmax_dropout``."""

    input: InputLayerSpec
    num_layers: int
    heads: int
    head_dim: int
    ffn_dim: int
    dropout: float
    attention_dropout: float
    pre_norm: bool
    mem_len: int
    clamp_len: int
    same_length: bool
    cutoff: Tuple[int, ...]
    softmax_dropout: float


def resolve_transformer_xl(cfg, dictionary) -> TransformerXLSpec:
    """The decoder that ``cfg`` (a namespace of :class:`TransformerXLConfig` fields) describes over ``dictionary``,
    every flag checked and nothing built; a ``ValueError`` naming the flag for every impossible setting."""
    layer = resolve_input_layer(cfg, dictionary, cfg.decoder_embed_dim, "--decoder-embed-dim", scaled_table=True)
    d = layer.width
    if d % 2:
        raise ValueError(
            f"--decoder-embed-dim={d} must be even (the sinusoidal position encoding has d/2 sine and "
            f"d/2 cosine components)"
        )
    mem_len = check_nonnegative(cfg.txl_mem_len, "--txl-mem-len", "0: no memory")
    if cfg.txl_clamp_len < -1:
        raise ValueError(f"--txl-clamp-len={cfg.txl_clamp_len} must be -1 (no clamping) or >= 0")
    if cfg.txl_same_length and mem_len == 0:
        raise ValueError(
            "--txl-same-length needs a memory (--txl-mem-len > 0): it makes every position attend to mem_len states"
        )
    cutoff = resolve_cutoff(cfg.adaptive_softmax_cutoff or None, len(dictionary), "--adaptive-softmax-cutoff")
    return TransformerXLSpec(
        input=layer,
        num_layers=check_positive(cfg.decoder_layers, "--decoder-layers"),
        heads=check_positive(cfg.decoder_attention_heads, "--decoder-attention-heads"),
        head_dim=check_positive(cfg.txl_head_dim, "--txl-head-dim"),
        ffn_dim=check_positive(cfg.decoder_ffn_embed_dim, "--decoder-ffn-embed-dim"),
        dropout=check_probability(cfg.dropout, "--dropout"),
        attention_dropout=check_probability(cfg.attention_dropout, "--attention-dropout"),
        pre_norm=cfg.txl_pre_norm,
        mem_len=mem_len,
        clamp_len=cfg.txl_clamp_len,
        same_length=cfg.txl_same_length,
        cutoff=() if cutoff is None else tuple(cutoff[:-1]),
        softmax_dropout=check_probability(cfg.adaptive_softmax_dropout, "--adaptive-softmax-dropout"),
    )


def build_transformer_xl_decoder(spec: TransformerXLSpec, dictionary) -> TransformerXLDecoder:
    """The decoder ``spec`` describes (of :func:`resolve_transformer_xl`, which checked it), over ``dictionary``,
    its softmax tied to the input layer's table.

    Shapes: as :class:`TransformerXLDecoder`'s.
    """
    layer = build_input_layer(spec.input)
    embed, clusters = layer.embed, len(spec.cutoff) + 1
    projections = None
    if getattr(embed, "projection", None) is not None:  # a projective map: the head cluster ties to its projection
        projections = [embed.projection] + [None] * (clusters - 1)
    adaptive_softmax = ProjectedAdaptiveSoftmax(
        len(dictionary),
        layer.tied_width,
        spec.input.width,
        list(spec.cutoff),
        table=layer.weight,
        projections=projections,
        dropout=spec.softmax_dropout,
    )
    stack = TransformerXLStack(
        spec.num_layers,
        spec.input.width,
        spec.heads,
        spec.head_dim,
        spec.ffn_dim,
        dropout=spec.dropout,
        attention_dropout=spec.attention_dropout,
        pre_norm=spec.pre_norm,
        mem_len=spec.mem_len,
        clamp_len=spec.clamp_len,
        same_length=spec.same_length,
    )
    return TransformerXLDecoder(dictionary, embed, stack, adaptive_softmax)


@register_model("transformer_xl_lm", dataclass=TransformerXLConfig)
class TransformerXLLanguageModel(InputLayerLanguageModel):
    """Transformer-XL language model (see the module docstring). ``forward(src_tokens [B, T], src_lengths=None,
    reset_state=None, incremental_state=None)`` as :class:`TransformerXLDecoder`."""

    config_class = TransformerXLConfig
    resolve = staticmethod(resolve_transformer_xl)
    build_decoder = staticmethod(build_transformer_xl_decoder)


def _input_width(base, name: str, n: int, what: str):
    """Register the arch ``name``: ``base`` with an input table ``n`` wide (Table 2 has each input at several
    widths n, which differ in nothing else)."""

    def arch(args):
        args.define_n = safe_getattr(args, "define_n", n)
        base(args)

    arch.__name__ = arch.__qualname__ = name
    arch.__doc__ = f"The {what} input at n = {n}."
    register_model_architecture("transformer_xl_lm", name)(arch)


@register_model_architecture("transformer_xl_lm", "transformer_xl_wt103")
def transformer_xl_wt103(args):
    """Transformer-XL's WikiText-103 base model (the paper's starred 151M reference), the config's defaults: 16
    layers, d 410, 10 heads x 41, d_inner 2100, a V x 410 table as input, adaptive softmax tied to it."""


@register_model_architecture("transformer_xl_lm", "transformer_xl_wt103_d384")
def transformer_xl_wt103_d384(args):
    """The paper's standard 384 model: d 384, d_inner 1920, still 10 heads x 41, a V x 384 table as input."""
    args.decoder_embed_dim = safe_getattr(args, "decoder_embed_dim", 384)
    args.decoder_ffn_embed_dim = safe_getattr(args, "decoder_ffn_embed_dim", 1920)


@register_model_architecture("transformer_xl_lm", "transformer_xl_projective_wt103_n128")
def transformer_xl_projective_wt103_n128(args):
    """Table 2's projective input at n = 128: a V x 128 table and a 128 -> 384 projection, d 384."""
    args.input_layer = safe_getattr(args, "input_layer", "projective")
    args.define_n = safe_getattr(args, "define_n", 128)
    transformer_xl_wt103_d384(args)


for _n in (64, 256):
    _input_width(transformer_xl_projective_wt103_n128, f"transformer_xl_projective_wt103_n{_n}", _n, "projective")


@register_model_architecture("transformer_xl_lm", "transformer_xl_define_wt103_n128")
def transformer_xl_define_wt103_n128(args):
    """Table 2's DeFINE input at n = 128: a V x 128 table and DeFINE (N = 3, k = 4096) to m = d = 384."""
    args.input_layer = safe_getattr(args, "input_layer", "define")
    args.define_n = safe_getattr(args, "define_n", 128)
    args.define_k = safe_getattr(args, "define_k", 4096)
    transformer_xl_wt103_d384(args)


for _n in (64, 256, 384):
    _input_width(transformer_xl_define_wt103_n128, f"transformer_xl_define_wt103_n{_n}", _n, "DeFINE")
