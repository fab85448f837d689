"""``lstm_lm_define``: the DeFINE paper's LSTM language model for WikiText-103 (Mehta et al., 2020, Table 1a).

The model, from tokens to the vocabulary::

    map (V x n table, or adaptive input of width n)  ->  DeFINE unit n -> m (``--input-layer define``; with
    ``--input-layer table`` the map has width m and feeds the LSTM itself)
    -> LSTM stack m -> hidden -> ... -> last layer (``--decoder-output-dim``, default n)
    -> [bias-free projection to n when the last layer is not n and the output is tied]
    -> full softmax (V x n, tied to the table, with a bias) or adaptive softmax (tied to the adaptive input,
       projections included)

The paper's archs (4 LSTM layers of 1024, the last of size m; adaptive cutoffs 20000,40000,200000, factor 4):

============================  ========================================  =====  =====
arch                          input / output                            N      n = m
============================  ========================================  =====  =====
``lstm_lm_standard_wt103``    V x 256 table, tied full softmax + bias   --     256
``lstm_lm_adaptive_wt103``    adaptive input / tied adaptive softmax    --     256
``lstm_lm_define_wt103_n3``   adaptive + DeFINE, k = 1024               3      256
``lstm_lm_define_wt103_n7``   adaptive + DeFINE, k = 1024               7      384
``lstm_lm_define_wt103_n11``  adaptive + DeFINE, k = 1024               11     512
============================  ========================================  =====  =====

Dropout follows Merity et al. (2018a) on WikiText-103 (locked dropout 0.1 on the LSTM input, between layers and
on the output); every AWD-LSTM regulariser of :mod:`define_fairseq.models.awd_lstm_lm` is available here as
well (``--awd-weight-drop`` etc., all off by default). Use ``--criterion adaptive_loss --ddp-backend
legacy_ddp`` (or ``lm_regularized_loss``) with an adaptive softmax.

State: with the ``stateful_lm`` task the final LSTM state of a batch starts the next one (truncated BPTT; see
:mod:`define_fairseq.models.carried_state`); with ``language_modeling`` every batch starts from zeros.
Generation (``fairseq-generate``/``fairseq-interactive --task language_modeling``) decodes incrementally.

The decoder (:mod:`define_fairseq.models.recurrent_lm_decoder`) is shared with ``awd_lstm_lm``, whose config
declares the same fields with AWD-LSTM's defaults.
"""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.models import register_model, register_model_architecture
from fairseq.utils import safe_getattr

from define_fairseq.models.compile import CompileConfig
from define_fairseq.models.input_config import AdaptiveInputConfig, input_layer_config
from define_fairseq.models.input_layer import InputLayerLanguageModel
from define_fairseq.models.recurrent_lm_decoder import (
    RecurrentLMDecoder,
    RecurrentLMSpec,
    build_recurrent_decoder,
    resolve_recurrent_lm,
)

__all__ = [
    "LSTMLMDefineConfig",
    "LSTMLMDefineModel",
    "RecurrentLMDecoder",
    "RecurrentLMSpec",
    "build_recurrent_decoder",
    "resolve_recurrent_lm",
]


# the bands of the adaptive input and softmax in the DeFINE paper's WikiText-103 LSTMs (Table 1a)
DEFINE_WT103_CUTOFF = "20000,40000,200000"


@dataclass
class LSTMLMDefineConfig(input_layer_config(input_layer="define", define_n=256), AdaptiveInputConfig, CompileConfig):
    """Options of ``lstm_lm_define``. Defaults: a V x 256 table, DeFINE (N = 3, k = 1024) to m = 256, 4 LSTM layers
    of 1024 (the last of n), locked dropout 0.1, a full softmax; the archs below set Table 1a's rows."""

    decoder_embed_dim: int = field(default=256, metadata={"help": "LSTM input width m (the DeFINE output width)"})
    decoder_hidden_size: int = field(default=1024, metadata={"help": "hidden size of every LSTM layer but the last"})
    decoder_layers: int = field(default=4, metadata={"help": "number of LSTM layers"})
    decoder_output_dim: Optional[int] = field(
        default=None, metadata={"help": "size of the last LSTM layer (default: n, the tied dimension)"}
    )
    dropout: float = field(
        default=0.1,
        metadata={
            "help": "locked dropout on the LSTM input, between layers and on the output, "
            "wherever --awd-input/hidden/output-dropout does not say otherwise"
        },
    )
    awd_input_dropout: Optional[float] = field(
        default=None, metadata={"help": "locked dropout on the embeddings (AWD-LSTM dropouti); default --dropout"}
    )
    awd_hidden_dropout: Optional[float] = field(
        default=None, metadata={"help": "locked dropout between LSTM layers (AWD-LSTM dropouth); default --dropout"}
    )
    awd_output_dropout: Optional[float] = field(
        default=None,
        metadata={"help": "locked dropout on the last LSTM layer's output (AWD-LSTM dropout); default --dropout"},
    )
    awd_embed_dropout: float = field(
        default=0.0, metadata={"help": "embedding dropout: drop whole words (AWD-LSTM dropoute)"}
    )
    awd_weight_drop: float = field(
        default=0.0, metadata={"help": "DropConnect on the hidden-to-hidden matrices (AWD-LSTM wdrop)"}
    )
    awd_ar_alpha: float = field(
        default=0.0, metadata={"help": "activation regularisation: alpha * mean(dropped last-layer output^2)"}
    )
    awd_tar_beta: float = field(
        default=0.0,
        metadata={
            "help": "temporal activation regularisation: beta * mean((h_t - h_{t-1})^2) of the "
            "last layer's output before dropout"
        },
    )
    adaptive_softmax_cutoff: Optional[str] = field(
        default=None,
        metadata={
            "help": "comma separated adaptive softmax cutoffs (none: full softmax); use "
            "--criterion adaptive_loss or lm_regularized_loss"
        },
    )
    adaptive_softmax_factor: float = field(default=4, metadata={"help": "adaptive softmax: width divisor per band"})
    adaptive_softmax_dropout: float = field(
        default=0.0, metadata={"help": "dropout inside the adaptive softmax tail clusters"}
    )
    tie_adaptive_weights: bool = field(
        default=False, metadata={"help": "tie the adaptive softmax to the adaptive input (same cutoffs, factor)"}
    )
    tie_adaptive_proj: bool = field(
        default=False, metadata={"help": "tie the adaptive softmax tail projections to the adaptive input's too"}
    )
    share_decoder_input_output_embed: bool = field(
        default=False, metadata={"help": "tie the full softmax to the V x n table"}
    )


@register_model("lstm_lm_define", dataclass=LSTMLMDefineConfig)
class LSTMLMDefineModel(InputLayerLanguageModel):
    """LSTM language model with an optional DeFINE unit and adaptive input/softmax (see the module docstring),
    built as every language model of the plugin (:class:`InputLayerLanguageModel`): its spec first, then the decoder.

    ``forward(src_tokens [B, T], src_lengths=None, reset_state=None, incremental_state=None)`` as
    :class:`RecurrentLMDecoder`.
    """

    config_class = LSTMLMDefineConfig
    build_decoder = staticmethod(build_recurrent_decoder)

    @classmethod
    def resolve(cls, args, dictionary) -> RecurrentLMSpec:
        """The decoder ``args`` describes, checked: adaptive input and softmax available, a full softmax tied to
        the V x n table under ``--share-decoder-input-output-embed``."""
        return resolve_recurrent_lm(
            args, dictionary, adaptive=True, tie_full_softmax=args.share_decoder_input_output_embed
        )


@register_model_architecture("lstm_lm_define", "lstm_lm_standard_wt103")
def lstm_lm_standard_wt103(args):
    """Table 1a R1: V x 256 table, 4 LSTM layers (1024, 1024, 1024, 256), full softmax tied, with a bias."""
    args.input_layer = safe_getattr(args, "input_layer", "table")
    args.share_decoder_input_output_embed = safe_getattr(args, "share_decoder_input_output_embed", True)
    # the paper has m = n in every row, so these archs take m from --define-n
    n = safe_getattr(args, "define_n", LSTMLMDefineConfig.define_n)
    args.decoder_embed_dim = safe_getattr(args, "decoder_embed_dim", n)


@register_model_architecture("lstm_lm_define", "lstm_lm_adaptive_wt103")
def lstm_lm_adaptive_wt103(args):
    """Table 1a R2: adaptive input / tied adaptive softmax of width 256, no DeFINE."""
    args.adaptive_input = safe_getattr(args, "adaptive_input", True)
    args.adaptive_input_cutoff = safe_getattr(args, "adaptive_input_cutoff", DEFINE_WT103_CUTOFF)
    args.adaptive_softmax_cutoff = safe_getattr(args, "adaptive_softmax_cutoff", DEFINE_WT103_CUTOFF)
    args.tie_adaptive_weights = safe_getattr(args, "tie_adaptive_weights", True)
    args.tie_adaptive_proj = safe_getattr(args, "tie_adaptive_proj", True)
    args.share_decoder_input_output_embed = safe_getattr(args, "share_decoder_input_output_embed", False)
    lstm_lm_standard_wt103(args)


@register_model_architecture("lstm_lm_define", "lstm_lm_define_wt103_n3")
def lstm_lm_define_wt103_n3(args):
    """Table 1a R3: adaptive input 256 -> DeFINE (N=3, k=1024) -> LSTM with m=256."""
    args.input_layer = safe_getattr(args, "input_layer", "define")
    lstm_lm_adaptive_wt103(args)


@register_model_architecture("lstm_lm_define", "lstm_lm_define_wt103_n7")
def lstm_lm_define_wt103_n7(args):
    """Table 1a R4: adaptive input 384 -> DeFINE (N=7, k=1024) -> LSTM with m=384."""
    args.define_n = safe_getattr(args, "define_n", 384)
    args.define_depth = safe_getattr(args, "define_depth", 7)
    lstm_lm_define_wt103_n3(args)


@register_model_architecture("lstm_lm_define", "lstm_lm_define_wt103_n11")
def lstm_lm_define_wt103_n11(args):
    """Table 1a R5: adaptive input 512 -> DeFINE (N=11, k=1024) -> LSTM with m=512."""
    args.define_n = safe_getattr(args, "define_n", 512)
    args.define_depth = safe_getattr(args, "define_depth", 11)
    lstm_lm_define_wt103_n3(args)
