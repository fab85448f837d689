"""``transformer_define``: the fairseq Transformer with DeFINE input embeddings (Mehta et al., 2020, Sec. 4.2).

Encoder and decoder embed their tokens with :class:`DeFINEEmbedding` (``V x n`` table -> DeFINE -> d_model).
With ``--share-decoder-input-output-embed`` or ``--share-all-embeddings`` the decoder output is tied to the
n-dimensional table: fairseq's ``project_out_dim`` maps d_model -> n, then the tied ``V x n`` output layer
(the paper's Fig. 1a; the authors' code does the same). ``--share-all-embeddings`` shares the whole
embedding (table and DeFINE unit) between encoder and decoder.
"""

import dataclasses
import re
from argparse import Namespace
from typing import Any, List, Tuple

from fairseq.dataclass import FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
)

from define_fairseq.models.define_config import DeFINEConfig, define_embedding_kwargs
from define_fairseq.modules import DeFINEEmbedding, FoldedDeFINEEmbedding


def _flat_fields(config_cls, defaults: dict, prefix: str = "") -> List[Tuple[str, Any, dataclasses.Field]]:
    """``TransformerConfig``'s fields flattened the way its CLI flags are (``encoder.embed_dim`` ->
    ``encoder_embed_dim``), with the same help and defaults (except those in ``defaults``), so that one flat
    dataclass serves argparse and Hydra."""
    flat = []
    for f in dataclasses.fields(config_cls):
        if f.name.startswith("_"):
            continue
        if isinstance(f.type, type) and issubclass(f.type, FairseqDataclass):
            flat.extend(_flat_fields(f.type, defaults, prefix + f.name + "_"))
            continue
        default = defaults.get(prefix + f.name, f.default)
        if isinstance(default, str):  # "${model.decoder.embed_dim}" -> "${model.decoder_embed_dim}"
            default = re.sub(r"\$\{model\.(encoder|decoder|quant_noise)\.", r"${model.\1_", default)
        if f.default_factory is not dataclasses.MISSING and prefix + f.name not in defaults:
            value = dataclasses.field(default_factory=f.default_factory, metadata=f.metadata)
        else:
            value = dataclasses.field(default=default, metadata=f.metadata)
        flat.append((prefix + f.name, f.type, value))
    return flat


# Defaults that differ from the stock Transformer: DeFINE's output already has the right scale (no sqrt(d)
# multiplier), and the decoder output is tied to the n-dimensional table.
DEFINE_TRANSFORMER_DEFAULTS = {"no_scale_embedding": True, "share_decoder_input_output_embed": True}

TransformerDefineConfig = dataclasses.make_dataclass(
    "TransformerDefineConfig",
    _flat_fields(TransformerConfig, DEFINE_TRANSFORMER_DEFAULTS),
    bases=(DeFINEConfig,),
)
TransformerDefineConfig.__module__ = __name__
TransformerDefineConfig.__doc__ = "Flat config of transformer_define: TransformerConfig's flags plus the define_* flags."


@register_model("transformer_define", dataclass=TransformerDefineConfig)
class TransformerDefineModel(TransformerModel):
    """Transformer encoder-decoder whose token embeddings are DeFINE units."""

    @classmethod
    def add_args(cls, parser):
        # No defaults on the parser, so that the arch functions can fill them in (as fairseq's Transformer).
        gen_parser_from_dataclass(parser, TransformerDefineConfig(), delete_default=True, with_prefix="")

    @classmethod
    def build_model(cls, args, task):
        if not isinstance(args, Namespace):  # a DictConfig from Hydra or a checkpoint
            args = Namespace(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TransformerDefineConfig)
                                if hasattr(args, f.name)})
        transformer_define(args)
        tied = args.share_all_embeddings or args.share_decoder_input_output_embed
        if tied:
            # The tied output layer is the V x n table; the decoder projects d_model -> n before it.
            args.decoder_output_dim = args.define_n
        return super().build_model(args, task)

    @classmethod
    def build_embedding(cls, cfg, dictionary, embed_dim, path=None):
        if path:
            raise ValueError(f"transformer_define builds its embeddings with DeFINE; --encoder-embed-path / "
                             f"--decoder-embed-path ({path}) cannot be used with it")
        if cfg.define_folded:
            return FoldedDeFINEEmbedding(len(dictionary), cfg.define_n, embed_dim, padding_idx=dictionary.pad())
        return DeFINEEmbedding(len(dictionary), padding_idx=dictionary.pad(),
                               **define_embedding_kwargs(cfg, embed_dim))


def _set_default(args, name, value):
    if getattr(args, name, None) is None:
        setattr(args, name, value)


def _define_defaults(args):
    """The define_* defaults and DEFINE_TRANSFORMER_DEFAULTS; called before fairseq's arch functions, which
    would otherwise set their own (e.g. an untied decoder output)."""
    for field in dataclasses.fields(DeFINEConfig):
        if not field.name.startswith("_"):
            _set_default(args, field.name, field.default)
    for name, value in DEFINE_TRANSFORMER_DEFAULTS.items():
        _set_default(args, name, value)


def transformer_define(args):
    """Defaults of ``--arch transformer_define``, the paper's WMT14 En-De setting: Transformer base with DeFINE
    n=128, k=1024, N=3, m=512. (``register_model`` with a dataclass registers that arch itself, from the
    dataclass defaults, which are these.)"""
    _define_defaults(args)
    base_architecture(args)


@register_model_architecture("transformer_define", "transformer_define_wmt_en_de_big")
def transformer_define_wmt_en_de_big(args):
    """Transformer big (d_model 1024, 16 heads) with DeFINE n=128, k=1024, N=3, m=1024."""
    _define_defaults(args)
    transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("transformer_define", "transformer_define_iwslt_de_en")
def transformer_define_iwslt_de_en(args):
    """fairseq's IWSLT Transformer size (d_model 512, FFN 1024, 4 heads, 6+6 layers) with DeFINE n=64, k=512."""
    _set_default(args, "define_n", 64)
    _set_default(args, "define_k", 512)
    _define_defaults(args)
    transformer_iwslt_de_en(args)
