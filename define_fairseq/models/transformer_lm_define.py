"""``transformer_lm_define``: fairseq's Transformer language model with a DeFINE input (Mehta et al., 2020).

The input is :class:`DeFINEEmbedding`: a map layer of width ``n`` (a ``V x n`` table, or with ``--adaptive-input``
an adaptive input of base width ``n`` whose bands are projected to ``n``), then the DeFINE unit up to the model
width ``m`` (``--decoder-input-dim``, by default ``--decoder-embed-dim``). The output works in ``n`` dimensions
too (the paper's Fig. 1a): a bias-free projection ``d_model -> n``, then either

* a full softmax tied to the ``V x n`` table (the default with a plain table; ``--define-untie-output`` gives
  it its own ``V x d_model`` layer instead), or
* an adaptive softmax tied to the adaptive input, bands and projections (``--adaptive-input
  --adaptive-softmax-cutoff ... --tie-adaptive-weights --tie-adaptive-proj``, as ``transformer_lm_define_wiki103``).

DeFINE scales its map by sqrt(n) itself, so the decoder's sqrt(d_model) multiplier is off
(``--no-scale-embedding`` is implied).
"""

import dataclasses
from typing import Optional

import torch.nn as nn
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerDecoder
from fairseq.models.transformer_lm import (
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
    base_lm_architecture,
    transformer_lm_baevski_wiki103,
)
from fairseq.utils import safe_getattr

from define_fairseq.models.compile import CompileConfig, compile_static_parts, resolve_compile
from define_fairseq.models.config_helpers import check_tied_bands, config_namespace, plugin_defaults, resolve_cutoff
from define_fairseq.models.input_config import input_layer_config
from define_fairseq.models.input_layer import build_input_layer, resolve_input_layer

TransformerLMDefineConfig = dataclasses.make_dataclass(
    "TransformerLMDefineConfig",
    [
        (
            "define_untie_output",
            bool,
            dataclasses.field(
                default=False,
                metadata={
                    "help": "with a full softmax: give the model its own V x d_model output layer instead of tying "
                    "it to the V x n table"
                },
            ),
        ),
        # fairseq's defaults for these are "${model.decoder_embed_dim}", which resolves against the dataclass
        # default (512), not against --decoder-embed-dim; None lets the arch function copy the real value.
        (
            "decoder_input_dim",
            Optional[int],
            dataclasses.field(
                default=None,
                metadata={"help": "decoder input dimension (DeFINE's output m); default: --decoder-embed-dim"},
            ),
        ),
        (
            "decoder_output_dim",
            Optional[int],
            dataclasses.field(
                default=None, metadata={"help": "decoder output dimension; a tied output uses --define-n"}
            ),
        ),
    ],
    bases=(input_layer_config(input_layer="define"), CompileConfig, TransformerLanguageModelConfig),
)
TransformerLMDefineConfig.__module__ = __name__
TransformerLMDefineConfig.__doc__ = "transformer_lm's flags plus the define_* flags."


class DeFINELMDecoder(TransformerDecoder):
    """fairseq's decoder with a bias-free ``d_model -> n`` projection before an adaptive softmax tied in ``n``
    dimensions (fairseq skips ``project_out_dim`` whenever ``--tie-adaptive-weights`` is set)."""

    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn=True)
        if self.project_out_dim is None and self.embed_dim != self.output_embed_dim:
            self.project_out_dim = nn.Linear(self.embed_dim, self.output_embed_dim, bias=False)
            nn.init.xavier_uniform_(self.project_out_dim.weight)


@register_model("transformer_lm_define", dataclass=TransformerLMDefineConfig)
class TransformerLMDefine(TransformerLanguageModel):
    """Transformer LM whose input is a DeFINE unit and whose output is tied to its ``n``-dimensional map."""

    @classmethod
    def build_model(cls, args, task):
        # A DictConfig (Hydra, checkpoints) or a namespace becomes a namespace; unresolved "${...}" values are
        # left for the arch function to fill in.
        args = cls.resolved_config(args)
        resolve_compile(args)  # its flags checked before anything is built
        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = getattr(args, "tokens_per_sample", DEFAULT_MAX_TARGET_POSITIONS)
        if args.character_embeddings:
            raise ValueError(
                "--character-embeddings cannot be used with transformer_lm_define, whose input layer "
                "is DeFINE; use --arch transformer_lm for character embeddings"
            )
        spec = resolve_input_layer(
            args, task.source_dictionary, args.decoder_input_dim, "--decoder-input-dim", adaptive_map=True
        )
        if spec.kind != "table":  # the map scales itself (DeFINE by sqrt(n), a projective map by sqrt(d))
            args.no_scale_embedding = True
        n = spec.n
        # checked against the vocabulary here: fairseq's own error would not name the flag
        vocab = len(task.target_dictionary)
        input_cutoff = resolve_cutoff(
            args.adaptive_input_cutoff if args.adaptive_input else None, vocab, "--adaptive-input-cutoff"
        )
        if args.adaptive_input and not input_cutoff:
            raise ValueError("--adaptive-input needs --adaptive-input-cutoff (e.g. 20000,60000)")
        softmax_cutoff = resolve_cutoff(args.adaptive_softmax_cutoff, vocab, "--adaptive-softmax-cutoff")
        if args.tie_adaptive_weights:
            check_tied_bands(args, input_cutoff, softmax_cutoff)
            if args.define_untie_output:
                raise ValueError(
                    "--define-untie-output is for a full softmax; drop --tie-adaptive-weights to untie "
                    "an adaptive softmax"
                )
        elif args.adaptive_input or softmax_cutoff:
            if args.share_decoder_input_output_embed:
                raise ValueError(
                    "--share-decoder-input-output-embed ties a full softmax to the V x n table; with "
                    "an adaptive input or softmax use --tie-adaptive-weights instead"
                )
        else:
            args.share_decoder_input_output_embed = not args.define_untie_output
        if args.tie_adaptive_weights or args.share_decoder_input_output_embed:
            if args.decoder_output_dim not in (args.decoder_embed_dim, n):
                raise ValueError(
                    f"--decoder-output-dim={args.decoder_output_dim}: a tied output works in "
                    f"--define-n={n} dimensions; drop the flag"
                )
            args.decoder_output_dim = n
        embed_tokens = build_input_layer(spec).embed
        return compile_static_parts(cls(DeFINELMDecoder(args, task.target_dictionary, embed_tokens)), args)

    @classmethod
    def resolved_config(cls, cfg):
        """``cfg`` (a DictConfig or namespace) as a namespace with every field set: the arch's defaults, then
        fairseq's (which copy an unset ``--decoder-input-dim`` and ``--decoder-output-dim`` from
        ``--decoder-embed-dim``)."""
        return config_namespace(cfg, TransformerLMDefineConfig, defaults=False, arch=transformer_lm_define)


def transformer_lm_define(args):
    """Defaults of ``--arch transformer_lm_define`` (registered by ``register_model`` from the dataclass):
    fairseq's ``transformer_lm`` size (6 layers, d_model 512, FFN 2048, 8 heads) with DeFINE n=128, k=1024, N=3,
    m=512 and a full softmax tied to the V x 128 table."""
    plugin_defaults(args, TransformerLMDefineConfig)
    base_lm_architecture(args)


@register_model_architecture("transformer_lm_define", "transformer_lm_define_wiki103")
def transformer_lm_define_wiki103(args):
    """fairseq's ``transformer_lm_wiki103`` (Baevski & Auli: 16 layers, d_model 1024, FFN 4096, 8 heads, adaptive
    input and softmax with cutoffs 20000,60000 and factor 4, tied bands and projections) with the adaptive input
    at base width n=256 (bands 256/64/16 instead of 1024/256/64) feeding DeFINE N=3, k=4096 up to 1024. The output
    is projected 1024 -> 256 before the tied adaptive softmax."""
    args.define_n = safe_getattr(args, "define_n", 256)
    args.define_k = safe_getattr(args, "define_k", 4096)
    plugin_defaults(args, TransformerLMDefineConfig)
    transformer_lm_baevski_wiki103(args)
