"""Plain ``torch.nn`` modules; nothing here imports fairseq."""

from define_fairseq.modules.adaptive_input import AdaptiveInput
from define_fairseq.modules.checks import check_cutoff
from define_fairseq.modules.define.embedding import DeFINEEmbedding, FoldedDeFINEEmbedding
from define_fairseq.modules.define.group_linear import GroupLinear
from define_fairseq.modules.define.unit import DeFINE, GroupLayerNorm, define_layer_sizes, split_and_mix

__all__ = [
    "AdaptiveInput",
    "DeFINE",
    "DeFINEEmbedding",
    "FoldedDeFINEEmbedding",
    "GroupLayerNorm",
    "GroupLinear",
    "define_layer_sizes",
    "check_cutoff",
    "split_and_mix",
]

# Recurrent building blocks (AWD-LSTM style).
from define_fairseq.modules.awd_lstm.locked_dropout import LockedDropout, locked_dropout  # noqa: E402
from define_fairseq.modules.awd_lstm.lstm_stack import LSTMStack  # noqa: E402
from define_fairseq.modules.awd_lstm.weight_drop import WeightDropLSTM, embedding_dropout  # noqa: E402

__all__ += ["LSTMStack", "LockedDropout", "WeightDropLSTM", "embedding_dropout", "locked_dropout"]

# Mogrifier LSTM (Melis et al., 2020).
from define_fairseq.modules.mogrifier.layer import MogrifierDropoutMasks, MogrifierLSTMLayer, MogrifierRound  # noqa: E402
from define_fairseq.modules.mogrifier.lstm import MogrifierLSTM  # noqa: E402

__all__ += ["MogrifierDropoutMasks", "MogrifierLSTM", "MogrifierLSTMLayer", "MogrifierRound"]

# Gated convolutional LM (Dauphin et al., 2017).
from define_fairseq.modules.gated_conv import (  # noqa: E402
    CausalConv1d,
    GatedConvBlock,
    GatedConvLayer,
    GatedConvStack,
    parse_layer_spec,
)

__all__ += ["CausalConv1d", "GatedConvBlock", "GatedConvLayer", "GatedConvStack", "parse_layer_spec"]

# Char2Subword (Aguilar et al., 2021).
from define_fairseq.modules.char2subword import Char2SubwordEmbedding, encode_characters, token_characters  # noqa: E402

__all__ += ["Char2SubwordEmbedding", "encode_characters", "token_characters"]

# Transformer-XL (Dai et al., 2019).
from define_fairseq.modules.projective_embedding import ProjectiveEmbedding  # noqa: E402
from define_fairseq.modules.transformer_xl.attention import RelativeMultiheadAttention, rel_shift  # noqa: E402
from define_fairseq.modules.transformer_xl.layers import PositionwiseFeedForward, TransformerXLLayer, TransformerXLStack  # noqa: E402
from define_fairseq.modules.transformer_xl.projected_adaptive_softmax import ProjectedAdaptiveSoftmax  # noqa: E402

__all__ += [
    "PositionwiseFeedForward",
    "ProjectedAdaptiveSoftmax",
    "ProjectiveEmbedding",
    "RelativeMultiheadAttention",
    "TransformerXLLayer",
    "TransformerXLStack",
    "rel_shift",
]
