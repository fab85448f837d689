"""Plain ``torch.nn`` modules; nothing here imports fairseq."""

from .adaptive_input import AdaptiveInput
from .checks import check_cutoff
from .define import DeFINE, GroupLayerNorm, define_layer_sizes, split_and_mix
from .define_embedding import DeFINEEmbedding, FoldedDeFINEEmbedding
from .group_linear import GroupLinear

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
from .locked_dropout import LockedDropout, locked_dropout  # noqa: E402
from .lstm_stack import LSTMStack  # noqa: E402
from .weight_drop import WeightDropLSTM, embedding_dropout  # noqa: E402

__all__ += ["LSTMStack", "LockedDropout", "WeightDropLSTM", "embedding_dropout", "locked_dropout"]

# Mogrifier LSTM (Melis et al., 2020).
from .mogrifier_layer import MogrifierDropoutMasks, MogrifierLSTMLayer, MogrifierRound  # noqa: E402
from .mogrifier_lstm import MogrifierLSTM  # noqa: E402

__all__ += ["MogrifierDropoutMasks", "MogrifierLSTM", "MogrifierLSTMLayer", "MogrifierRound"]

# Gated convolutional LM (Dauphin et al., 2017).
from .gated_conv import CausalConv1d, GatedConvBlock, GatedConvLayer, GatedConvStack, parse_layer_spec  # noqa: E402

__all__ += ["CausalConv1d", "GatedConvBlock", "GatedConvLayer", "GatedConvStack", "parse_layer_spec"]

# Char2Subword (Aguilar et al., 2021).
from .char2subword import Char2SubwordEmbedding, encode_characters, token_characters  # noqa: E402

__all__ += ["Char2SubwordEmbedding", "encode_characters", "token_characters"]

# Transformer-XL (Dai et al., 2019).
from .projected_adaptive_softmax import ProjectedAdaptiveSoftmax  # noqa: E402
from .projective_embedding import ProjectiveEmbedding  # noqa: E402
from .relative_attention import RelativeMultiheadAttention, rel_shift  # noqa: E402
from .transformer_xl import PositionwiseFeedForward, TransformerXLLayer, TransformerXLStack  # noqa: E402

__all__ += [
    "PositionwiseFeedForward",
    "ProjectedAdaptiveSoftmax",
    "ProjectiveEmbedding",
    "RelativeMultiheadAttention",
    "TransformerXLLayer",
    "TransformerXLStack",
    "rel_shift",
]
