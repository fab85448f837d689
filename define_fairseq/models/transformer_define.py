"""``transformer_define``: the fairseq Transformer with DeFINE input embeddings (Mehta et al., 2020, Sec. 4.2).

Encoder and decoder embed their tokens with :class:`DeFINEEmbedding` (``V x n`` table -> DeFINE -> d_model).
The decoder output is tied to the n-dimensional table (unless ``--define-untie-output``): fairseq's
``project_out_dim`` maps d_model -> n, then the tied ``V x n`` output layer (the paper's Fig. 1a; the authors'
code does the same). ``--share-all-embeddings`` shares the whole embedding (table and DeFINE unit) between
encoder and decoder; with ``--define-separate-units`` only the table is shared and each side has its own unit (the
authors' code); with ``--define-untie-output`` the decoder gets its own ``V x d_model`` output layer.
DeFINE's output is not multiplied by sqrt(d_model) (``--no-scale-embedding`` is implied). DeFINE is the input
layer this family chooses (``--input-layer define``); ``table`` and ``projective`` are the other kinds it offers.
"""

import dataclasses
import re
from typing import Any, List, Tuple

from fairseq.dataclass import FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import DEFAULT_MIN_PARAMS_TO_WRAP, TransformerConfig, TransformerModel
from fairseq.models.transformer.transformer_legacy import (
    DEFAULT_MAX_SOURCE_POSITIONS,
    DEFAULT_MAX_TARGET_POSITIONS,
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
)
from fairseq.utils import safe_getattr

from define_fairseq.models.compile import CompileConfig, compile_static_parts, resolve_compile
from define_fairseq.models.config_helpers import config_namespace, plugin_defaults
from define_fairseq.models.input_config import input_layer_config
from define_fairseq.models.input_layer import build_input_layer, resolve_input_layer


def _flat_fields(config_cls, prefix: str = "") -> List[Tuple[str, Any, dataclasses.Field]]:
    """``TransformerConfig``'s fields flattened the way its CLI flags are (``encoder.embed_dim`` ->
    ``encoder_embed_dim``), with the same help and defaults, so that one flat dataclass serves argparse and
    Hydra. (Defaults stay fairseq's: a bool defaulting to True would turn its flag into ``store_false``.)"""
    flat = []
    for f in dataclasses.fields(config_cls):
        if f.name.startswith("_"):
            continue
        if isinstance(f.type, type) and issubclass(f.type, FairseqDataclass):
            flat.extend(_flat_fields(f.type, prefix + f.name + "_"))
            continue
        default = f.default
        if isinstance(default, str):  # "${model.decoder.embed_dim}" -> "${model.decoder_embed_dim}"
            default = re.sub(r"\$\{model\.(encoder|decoder|quant_noise)\.", r"${model.\1_", default)
        if f.default_factory is not dataclasses.MISSING:
            value = dataclasses.field(default_factory=f.default_factory, metadata=f.metadata)
        else:
            value = dataclasses.field(default=default, metadata=f.metadata)
        flat.append((prefix + f.name, f.type, value))
    return flat


TransformerDefineConfig = dataclasses.make_dataclass(
    "TransformerDefineConfig",
    [
        (
            "define_untie_output",
            bool,
            dataclasses.field(
                default=False,
                metadata={
                    "help": "give the decoder its own V x d_model output layer instead of tying it to the V x n table"
                },
            ),
        ),
        (
            "define_separate_units",
            bool,
            dataclasses.field(
                default=False,
                metadata={
                    "help": "with --share-all-embeddings, share only the V x n table: encoder and decoder each "
                    "get their own DeFINE unit (the authors' code)"
                },
            ),
        ),
        *_flat_fields(TransformerConfig),
    ],
    bases=(input_layer_config(input_layer="define"), CompileConfig),
)
TransformerDefineConfig.__module__ = __name__
TransformerDefineConfig.__doc__ = (
    "Flat config of transformer_define: TransformerConfig's flags plus the define_* flags."
)


@register_model("transformer_define", dataclass=TransformerDefineConfig)
class TransformerDefineModel(TransformerModel):
    """Transformer encoder-decoder whose token embeddings are DeFINE units."""

    @classmethod
    def add_args(cls, parser):
        # No defaults on the parser, so that the arch functions can fill them in (as fairseq's Transformer).
        gen_parser_from_dataclass(parser, TransformerDefineConfig(), delete_default=True, with_prefix="")

    @classmethod
    def build_model(cls, args, task):
        # A DictConfig (Hydra, checkpoints) or a namespace becomes a namespace; a "${model...}" placeholder that
        # nothing resolved (a namespace built without fairseq-train's parser) is left for the arch to fill in.
        args = cls.resolved_config(args)
        resolve_compile(args)  # its flags checked before anything is built
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        for path in (args.encoder_embed_path, args.decoder_embed_path):
            if path:
                raise ValueError(
                    f"transformer_define builds its embeddings with its input layer; --encoder-embed-path / "
                    f"--decoder-embed-path ({path}) cannot be used with it"
                )
        # both input layers, resolved and checked before anything is built
        encoder_spec = resolve_input_layer(args, src_dict, args.encoder_embed_dim, "--encoder-embed-dim")
        decoder_spec = resolve_input_layer(args, tgt_dict, args.decoder_embed_dim, "--decoder-embed-dim")
        if encoder_spec.kind != "table":  # the map scales itself (DeFINE by sqrt(n), a projective map by sqrt(d))
            args.no_scale_embedding = True
        args.share_decoder_input_output_embed = not args.define_untie_output
        if args.define_separate_units and not args.share_all_embeddings:
            raise ValueError(
                "--define-separate-units shares the V x n table between encoder and decoder, which "
                "needs --share-all-embeddings; without it each side has its own table and unit already"
            )
        if args.share_decoder_input_output_embed:
            # The tied output layer is the V x n table; the decoder projects d_model -> n before it.
            if args.decoder_output_dim not in (args.decoder_embed_dim, decoder_spec.n):
                raise ValueError(
                    f"--decoder-output-dim={args.decoder_output_dim}: with a tied output layer "
                    f"transformer_define projects the decoder output to --define-n={decoder_spec.n}; "
                    f"drop the flag, or untie with --define-untie-output"
                )
            args.decoder_output_dim = decoder_spec.n
        if args.share_all_embeddings:
            if src_dict != tgt_dict:
                raise ValueError(
                    "--share-all-embeddings needs one dictionary for both languages: binarise with "
                    "fairseq-preprocess --joined-dictionary"
                )
            if args.encoder_embed_dim != args.decoder_embed_dim:
                raise ValueError(
                    f"--share-all-embeddings needs --encoder-embed-dim ({args.encoder_embed_dim}) equal to "
                    f"--decoder-embed-dim ({args.decoder_embed_dim})"
                )
        cfg = cls.transformer_config(args)
        # fairseq's order: the embeddings, then the encoder and the decoder
        embed = decoder_embed = build_input_layer(encoder_spec).embed
        if not args.share_all_embeddings or args.define_separate_units:
            decoder_embed = build_input_layer(decoder_spec).embed
        if args.share_all_embeddings and args.define_separate_units:
            decoder_embed.table = embed.table  # one V x n table (and tied output layer), two units
        model = cls(cfg, cls.build_encoder(cfg, src_dict, embed), cls.build_decoder(cfg, tgt_dict, decoder_embed))
        return compile_static_parts(model, args)

    @staticmethod
    def transformer_config(args) -> TransformerConfig:
        """fairseq's ``TransformerConfig`` of ``args``, with what fairseq's ``TransformerModel.build_model`` sets
        before it builds (the kept layers, the position limits, the activation offloading)."""
        if args.encoder_layers_to_keep:
            args.encoder_layers = len(args.encoder_layers_to_keep.split(","))
        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if getattr(args, "max_source_positions", None) is None:
            args.max_source_positions = DEFAULT_MAX_SOURCE_POSITIONS
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = DEFAULT_MAX_TARGET_POSITIONS
        if getattr(args, "offload_activations", False):
            args.checkpoint_activations = True  # offloading implies checkpointing
        if not args.share_all_embeddings:
            args.min_params_to_wrap = getattr(args, "min_params_to_wrap", DEFAULT_MIN_PARAMS_TO_WRAP)
        cfg = TransformerConfig.from_namespace(args)
        cfg.decoder.input_dim, cfg.decoder.output_dim = int(cfg.decoder.input_dim), int(cfg.decoder.output_dim)
        return cfg

    @classmethod
    def resolved_config(cls, cfg):
        """``cfg`` (a DictConfig or namespace) as a namespace with every field set: the arch's defaults, then
        fairseq's."""
        return config_namespace(cfg, TransformerDefineConfig, defaults=False, arch=transformer_define)


def transformer_define(args):
    """Defaults of ``--arch transformer_define``, the paper's WMT14 En-De setting: Transformer base with DeFINE
    n=128, k=1024, N=3, m=512. (``register_model`` with a dataclass registers that arch itself, from the
    dataclass defaults, which are these.)"""
    plugin_defaults(args, TransformerDefineConfig)
    base_architecture(args)


@register_model_architecture("transformer_define", "transformer_define_wmt_en_de_big")
def transformer_define_wmt_en_de_big(args):
    """Transformer big (d_model 1024, 16 heads) with DeFINE n=128, k=1024, N=3, m=1024."""
    plugin_defaults(args, TransformerDefineConfig)
    transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("transformer_define", "transformer_define_iwslt_de_en")
def transformer_define_iwslt_de_en(args):
    """fairseq's IWSLT Transformer size (d_model 512, FFN 1024, 4 heads, 6+6 layers) with DeFINE n=64, k=512."""
    args.define_n = safe_getattr(args, "define_n", 64)
    args.define_k = safe_getattr(args, "define_k", 512)
    plugin_defaults(args, TransformerDefineConfig)
    transformer_iwslt_de_en(args)
