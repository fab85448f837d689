"""``awd_lstm_lm``: AWD-LSTM (Merity et al., 2018) for Penn Treebank, with or without a DeFINE input.

Archs:

* ``awd_lstm_lm``: AWD-LSTM's PTB model: a 400-dimensional embedding, 3 LSTM layers (1150, 1150, 400), a
  full softmax tied to the embedding (with a bias). Regularisation as AWD-LSTM's PTB command: locked dropout
  0.4 on the embeddings (dropouti), 0.25 between layers (dropouth) and 0.4 on the output (dropout), embedding
  dropout 0.1 (dropoute, whole words), weight drop 0.5 on the hidden-to-hidden matrices (wdrop), AR alpha 2,
  TAR beta 1. 24.22M parameters at V = 10,000.
* ``awd_lstm_lm_define``: the DeFINE paper's PTB model (Sec. 4.1.2): the embedding is replaced by a V x 128
  table and a DeFINE unit (N=7, k=1024) up to m = 400; the last LSTM layer has 128 units and the softmax is
  tied to the V x 128 table. This is the reading that gives the paper's "20M" at V = 10,000: LSTM 18.38M +
  table 1.28M + softmax bias 0.01M = 19.67M, plus the DeFINE unit (a 400-unit last layer tied through a
  projection would already need more than 21.5M).

AR/TAR reach the loss through ``extra["regularization"]``: train with ``--criterion lm_regularized_loss``.
For AWD-LSTM's contiguous batches with carried state (truncated BPTT, variable length) use
``--task stateful_lm --tokens-per-sample 70 --variable-bptt``. The output is tied to the table
(``--awd-untie-output`` gives it its own matrix).
"""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.models import register_model, register_model_architecture
from fairseq.utils import safe_getattr

from define_fairseq.models.compile import CompileConfig
from define_fairseq.models.input_config import input_layer_config
from define_fairseq.models.lstm_lm_define import LSTMLMDefineModel
from define_fairseq.models.recurrent_lm_decoder import RecurrentLMSpec, resolve_recurrent_lm


@dataclass
class AWDLSTMLMConfig(input_layer_config(define_depth=7), CompileConfig):
    """Options of ``awd_lstm_lm`` (the fields of ``lstm_lm_define`` but the adaptive ones); the defaults are
    AWD-LSTM's PTB model (a plain 400-d embedding), the DeFINE ones those of ``awd_lstm_lm_define``."""

    decoder_embed_dim: int = field(default=400, metadata={"help": "LSTM input width m (the DeFINE output width)"})
    decoder_hidden_size: int = field(default=1150, metadata={"help": "hidden size of every LSTM layer but the last"})
    decoder_layers: int = field(default=3, metadata={"help": "number of LSTM layers"})
    decoder_output_dim: Optional[int] = field(
        default=None, metadata={"help": "size of the last LSTM layer (default: n, the tied dimension)"}
    )
    dropout: float = field(
        default=0.4,
        metadata={
            "help": "locked dropout on the last LSTM layer's output (and wherever a --awd-*-dropout is not given)"
        },
    )
    awd_input_dropout: float = field(default=0.4, metadata={"help": "locked dropout on the embeddings (dropouti)"})
    awd_hidden_dropout: float = field(default=0.25, metadata={"help": "locked dropout between layers (dropouth)"})
    awd_output_dropout: float = field(default=0.4, metadata={"help": "locked dropout on the output (dropout)"})
    awd_embed_dropout: float = field(default=0.1, metadata={"help": "whole-word embedding dropout (dropoute)"})
    awd_weight_drop: float = field(default=0.5, metadata={"help": "DropConnect on hidden-to-hidden weights"})
    awd_ar_alpha: float = field(default=2.0, metadata={"help": "AR: alpha * mean(dropped output^2)"})
    awd_tar_beta: float = field(default=1.0, metadata={"help": "TAR: beta * mean((h_t - h_{t-1})^2)"})
    awd_untie_output: bool = field(
        default=False, metadata={"help": "give the softmax its own weights instead of tying it to the table"}
    )


@register_model("awd_lstm_lm", dataclass=AWDLSTMLMConfig)
class AWDLSTMLMModel(LSTMLMDefineModel):
    """AWD-LSTM language model (see the module docstring); the decoder is :class:`RecurrentLMDecoder`."""

    config_class = AWDLSTMLMConfig

    @classmethod
    def resolve(cls, args, dictionary) -> RecurrentLMSpec:
        """The decoder ``args`` describes, checked: no adaptive input or softmax, a full softmax tied to the table
        unless ``--awd-untie-output``."""
        return resolve_recurrent_lm(args, dictionary, adaptive=False, tie_full_softmax=not args.awd_untie_output)


@register_model_architecture("awd_lstm_lm", "awd_lstm_lm_define")
def awd_lstm_lm_define(args):
    """AWD-LSTM + DeFINE (the DeFINE paper, Table 1c): V x 128 table -> DeFINE (N=7, k=1024) -> m=400 ->
    LSTM (1150, 1150, 128) -> softmax tied to the V x 128 table; AWD-LSTM's regularisation."""
    args.input_layer = safe_getattr(args, "input_layer", "define")
