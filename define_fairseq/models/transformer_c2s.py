"""``transformer_c2s``: the fairseq Transformer with Char2Subword source embeddings (Aguilar et al., 2021).

The encoder embeds each source token from its characters (:class:`Char2SubwordEmbedding`). With the
``translation_c2s`` task the batches carry every source token's characters (``src_chars``), so a misspelled
word that the dictionary lacks is embedded from its letters instead of as ``<unk>``; without them the encoder
reads the characters of the dictionary entries.

The decoder input (``--decoder-input-layer``) is a plain table (``table``, the default;
``--share-decoder-input-output-embed`` ties it to the output), Char2Subword too (``char2subword``, output layer
untied), or DeFINE (``define`` with the ``--define-*`` flags, the output tied to its ``V x n`` table as in
``transformer_define``).
``--share-all-embeddings`` is refused: a Char2Subword embedding has no table to share with an output layer.
"""

import dataclasses
from typing import Optional

import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase
from fairseq.models.transformer.transformer_legacy import (
    DEFAULT_MAX_SOURCE_POSITIONS,
    DEFAULT_MAX_TARGET_POSITIONS,
    base_architecture,
    transformer_iwslt_de_en,
)
from fairseq.utils import safe_getattr

from define_fairseq.models.compile import CompileConfig, compile_static_parts, resolve_compile
from define_fairseq.models.config_helpers import config_namespace, flag_names, plugin_defaults
from define_fairseq.models.input_config import DeFINEUnitConfig
from define_fairseq.models.input_layer import INPUT_KINDS, build_input_layer, resolve_input_layer
from define_fairseq.models.transformer_define import _flat_fields
from define_fairseq.modules.char2subword import Char2SubwordEmbedding

CHAR2SUBWORD = "char2subword"  # the decoder's input kind of this family's own, besides the input layer's kinds

C2S_FIELDS = [
    (
        "c2s_char_dim",
        int,
        dataclasses.field(
            default=256,
            metadata={"help": "Char2Subword: width of the character embeddings and of the character Transformer"},
        ),
    ),
    ("c2s_layers", int, dataclasses.field(default=2, metadata={"help": "Char2Subword: character Transformer layers"})),
    ("c2s_heads", int, dataclasses.field(default=4, metadata={"help": "Char2Subword: attention heads"})),
    ("c2s_ffn_dim", int, dataclasses.field(default=512, metadata={"help": "Char2Subword: feed-forward width"})),
    (
        "c2s_max_chars",
        int,
        dataclasses.field(
            default=24,
            metadata={"help": "Char2Subword: characters kept per token (BPE markers included); longer tokens are cut"},
        ),
    ),
    (
        "c2s_dropout",
        float,
        dataclasses.field(default=0.0, metadata={"help": "Char2Subword: dropout inside the character Transformer"}),
    ),
    (
        "c2s_train_embedding_only",
        bool,
        dataclasses.field(
            default=False,
            metadata={
                "help": "train only the encoder's Char2Subword module and keep every other weight as it is "
                "(the paper's second stage: a trained model whose table was swapped for a distilled module, see "
                "define_fairseq.tools.c2s_checkpoint)"
            },
        ),
    ),
    (
        "decoder_input_layer",
        ChoiceEnum((CHAR2SUBWORD, *INPUT_KINDS)),
        dataclasses.field(
            default="table",
            metadata={
                "help": "the decoder's input layer: table (a V x d table); char2subword (Char2Subword, the output "
                "layer then untied); projective or define (a V x n table and a linear map or a DeFINE unit to d, "
                "--define-n, --define-k, ...; the output tied to the V x n table)"
            },
        ),
    ),
]

TransformerC2SConfig = dataclasses.make_dataclass(
    "TransformerC2SConfig", [*C2S_FIELDS, *_flat_fields(TransformerConfig)], bases=(DeFINEUnitConfig, CompileConfig)
)
TransformerC2SConfig.__module__ = __name__
TransformerC2SConfig.__doc__ = "Flat config of transformer_c2s: TransformerConfig's flags, c2s_* and define_* flags."


def build_char2subword(args, dictionary, embed_dim: int, output_scale: float) -> Char2SubwordEmbedding:
    """A :class:`Char2SubwordEmbedding` of ``dictionary`` from the ``c2s_*`` options."""
    with flag_names(dropout="--c2s-dropout"):
        return Char2SubwordEmbedding(
            dictionary.symbols,
            dictionary.pad(),
            embed_dim,
            special_indices=range(dictionary.nspecial),
            char_dim=args.c2s_char_dim,
            layers=args.c2s_layers,
            heads=args.c2s_heads,
            ffn_dim=args.c2s_ffn_dim,
            max_chars=args.c2s_max_chars,
            dropout=args.c2s_dropout,
            output_scale=output_scale,
        )


class Char2SubwordTransformerEncoder(TransformerEncoderBase):
    """fairseq's Transformer encoder whose ``forward`` also takes ``src_chars [B, T, M]``: the characters of
    each source token (rows of zeros: use the token id). ``forward(src_tokens [B, T], src_lengths, ...,
    src_chars=None)`` returns fairseq's encoder output dict."""

    def forward(
        self,
        src_tokens,
        src_lengths: Optional[torch.Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[torch.Tensor] = None,
        src_chars: Optional[torch.Tensor] = None,
    ):
        if token_embeddings is None:
            token_embeddings = self.embed_tokens(src_tokens, src_chars)
        return super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)


@register_model("transformer_c2s", dataclass=TransformerC2SConfig)
class TransformerC2SModel(TransformerModel):
    """Transformer encoder-decoder with Char2Subword source embeddings (see the module docstring).
    ``forward(src_tokens, src_lengths, prev_output_tokens, src_chars=None)`` as fairseq's Transformer."""

    @classmethod
    def add_args(cls, parser):
        gen_parser_from_dataclass(parser, TransformerC2SConfig(), delete_default=True, with_prefix="")

    @classmethod
    def build_model(cls, args, task):
        args = cls.resolved_config(args)
        resolve_compile(args)  # its flags checked before anything is built
        if args.share_all_embeddings:
            raise ValueError(
                "transformer_c2s cannot --share-all-embeddings: a Char2Subword encoder embedding has "
                "no table to tie an output layer to; drop the flag (--share-decoder-input-output-embed "
                "still ties the decoder's own table)"
            )
        if args.encoder_embed_path:
            raise ValueError(
                "--encoder-embed-path cannot be used with transformer_c2s (the encoder builds its "
                "embeddings from characters)"
            )
        if getattr(args, "max_source_positions", None) is None:
            args.max_source_positions = DEFAULT_MAX_SOURCE_POSITIONS
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = DEFAULT_MAX_TARGET_POSITIONS
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        kind = str(args.decoder_input_layer)
        if kind == CHAR2SUBWORD and args.decoder_embed_dim < 1:
            raise ValueError(f"--decoder-embed-dim={args.decoder_embed_dim} must be at least 1")
        spec = None
        if kind != CHAR2SUBWORD:
            spec = resolve_input_layer(
                args, tgt_dict, args.decoder_embed_dim, "--decoder-embed-dim", kind, "--decoder-input-layer"
            )

        if kind == CHAR2SUBWORD:
            if args.share_decoder_input_output_embed:
                raise ValueError(
                    "--share-decoder-input-output-embed needs a decoder table; with --decoder-input-layer "
                    "char2subword the output layer is its own V x d matrix: drop one of the two flags"
                )
            decoder_embed = build_char2subword(
                args, tgt_dict, args.decoder_embed_dim, 1.0 if args.no_scale_embedding else args.decoder_embed_dim**-0.5
            )
        elif kind == "table":  # fairseq's, which can read --decoder-embed-path
            decoder_embed = cls.build_embedding(args, tgt_dict, args.decoder_embed_dim, args.decoder_embed_path)
        else:
            if INPUT_KINDS[kind].mapped:
                # a map has unit scale like Char2Subword's: no sqrt(d) multiplier on either side; the output ties to
                # its V x n table
                args.no_scale_embedding = True
                args.share_decoder_input_output_embed = True
                args.decoder_output_dim = spec.n
            decoder_embed = build_input_layer(spec).embed
        # The module ends in a LayerNorm (unit scale); fairseq multiplies by sqrt(d) unless --no-scale-embedding.
        encoder_embed = build_char2subword(
            args, src_dict, args.encoder_embed_dim, 1.0 if args.no_scale_embedding else args.encoder_embed_dim**-0.5
        )
        encoder = cls.build_encoder(args, src_dict, encoder_embed)
        decoder = cls.build_decoder(args, tgt_dict, decoder_embed)
        model = cls(args, encoder, decoder)
        if args.c2s_train_embedding_only:
            for name, parameter in model.named_parameters():
                parameter.requires_grad_(name.startswith("encoder.embed_tokens."))
        return compile_static_parts(model, args)

    @classmethod
    def resolved_config(cls, cfg):
        """``cfg`` (a DictConfig or namespace) as a namespace with every field set: the arch's defaults, then
        fairseq's."""
        return config_namespace(cfg, TransformerC2SConfig, defaults=False, arch=transformer_c2s)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return Char2SubwordTransformerEncoder(TransformerConfig.from_namespace(args), src_dict, embed_tokens)

    def forward(
        self,
        src_tokens,
        src_lengths,
        prev_output_tokens,
        src_chars: Optional[torch.Tensor] = None,
        return_all_hiddens: bool = True,
        features_only: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        encoder_out = self.encoder(
            src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens, src_chars=src_chars
        )
        return self.decoder(
            prev_output_tokens,
            encoder_out=encoder_out,
            features_only=features_only,
            alignment_layer=alignment_layer,
            alignment_heads=alignment_heads,
            src_lengths=src_lengths,
            return_all_hiddens=return_all_hiddens,
        )


def transformer_c2s(args):
    """Defaults of ``--arch transformer_c2s``: Transformer base (6+6 layers, d 512) with a Char2Subword encoder
    embedding (characters 256 wide, 2 layers, 4 heads, FFN 512, up to 24 characters)."""
    plugin_defaults(args, TransformerC2SConfig)
    base_architecture(args)


@register_model_architecture("transformer_c2s", "transformer_c2s_iwslt_de_en")
def transformer_c2s_iwslt_de_en(args):
    """fairseq's IWSLT size (d 512, FFN 1024, 4 heads, 6+6 layers) with Char2Subword on the source."""
    plugin_defaults(args, TransformerC2SConfig)
    transformer_iwslt_de_en(args)


@register_model_architecture("transformer_c2s", "transformer_c2s_small")
def transformer_c2s_small(args):
    """A CPU size: 3+3 layers, d 256, FFN 1024, 4 heads; characters 128 wide, 2 layers, FFN 256."""
    args.encoder_layers = safe_getattr(args, "encoder_layers", 3)
    args.decoder_layers = safe_getattr(args, "decoder_layers", 3)
    args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", 256)
    args.decoder_embed_dim = safe_getattr(args, "decoder_embed_dim", 256)
    args.encoder_ffn_embed_dim = safe_getattr(args, "encoder_ffn_embed_dim", 1024)
    args.decoder_ffn_embed_dim = safe_getattr(args, "decoder_ffn_embed_dim", 1024)
    args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", 4)
    args.decoder_attention_heads = safe_getattr(args, "decoder_attention_heads", 4)
    args.c2s_char_dim = safe_getattr(args, "c2s_char_dim", 128)
    args.c2s_ffn_dim = safe_getattr(args, "c2s_ffn_dim", 256)
    transformer_c2s(args)
