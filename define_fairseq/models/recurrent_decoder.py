"""The base of the plugin's recurrent language-model decoders (``lstm_lm_define``, ``awd_lstm_lm``,
``mogrifier_lstm_lm``): where a batch's recurrent state comes from and where its final state goes.

* incremental decoding (``incremental_state`` given: generation): the per-layer ``(h, c)`` cached in fairseq's
  incremental state; once it exists only the last token is read;
* otherwise the state carried across batches by :class:`~define_fairseq.models.carried_state.CarriedState`
  (``reset_state`` from the ``stateful_lm`` task; ``None``: start from zeros, keep nothing).
"""

from typing import Any, Dict, List, Optional, Tuple

import torch.nn as nn
from fairseq.models import FairseqIncrementalDecoder
from torch import Tensor

from define_fairseq.models.carried_state import CarriedState, IncrementalLSTMState
from define_fairseq.models.config_helpers import MAX_POSITIONS


class RecurrentDecoder(IncrementalLSTMState, FairseqIncrementalDecoder):
    """Embedding -> recurrent stack -> output layer, with the state handling of the module docstring.

    Args:
        dictionary: the target dictionary (V symbols).
        embed_tokens: token embedding whose ``embedding_dim`` equals ``lstm.input_size``.
        lstm: the recurrent stack; ``lstm(x [B, T, input_size], state) -> (output [B, T, H], final state)`` with
            the state a list of per-layer ``(h [B, H_l], c [B, H_l])`` (None: zeros).
        state_name: what the carried state is called in warnings.
        input_flag: the flag that sets the stack's input width (named when the embedding's width differs).

    A subclass implements :meth:`recur` (the embedding, the stack and whatever lies between) and may override
    :meth:`starting_state`.

    Shapes: ``forward(tokens [B, T], src_lengths=None, reset_state=None, incremental_state=None,
    features_only=False)`` returns ``(x, extra)``: ``x`` is ``output_layer(features [B, T, d])`` or, with
    ``features_only``, the features; during incremental decoding only the new tokens' positions (``T = 1``).
    """

    def __init__(self, dictionary, embed_tokens: nn.Module, lstm: nn.Module, state_name: str, input_flag: str):
        super().__init__(dictionary)
        if embed_tokens.embedding_dim != lstm.input_size:
            raise ValueError(
                f"the embedding gives {embed_tokens.embedding_dim} features but the first recurrent layer "
                f"takes {lstm.input_size} ({input_flag}); they must match"
            )
        self.embed_tokens = embed_tokens
        self.lstm = lstm
        self.carried_state = CarriedState(state_name)  # its training state is saved in checkpoints

    def forward(
        self,
        prev_output_tokens,
        src_lengths=None,
        reset_state=None,
        incremental_state=None,
        features_only: bool = False,
        **unused,
    ):
        x, extra = self.extract_features(
            prev_output_tokens, reset_state=reset_state, incremental_state=incremental_state
        )
        if not features_only:
            x = self.output_layer(x)
        return x, extra

    def extract_features(self, prev_output_tokens, reset_state=None, incremental_state=None, **unused):
        """Shapes: ``prev_output_tokens [B, T]`` -> features ``[B, T', d]`` (``T' = 1`` once an incremental state
        is cached) and ``extra``."""
        tokens = prev_output_tokens
        if incremental_state is not None:
            state = self._cached_state(incremental_state)
            if state is not None:
                tokens = tokens[:, -1:]
        else:
            state = self.starting_state(self.carried_state.initial(reset_state, self.training, tokens.size(0)))
        x, final_state, extra = self.recur(tokens, state)
        if incremental_state is not None:
            self._cache_state(incremental_state, final_state)
        else:
            self.carried_state.keep(reset_state, self.training, tokens.size(0), final_state)
        return x, extra

    def starting_state(self, state: Optional[List]) -> Optional[List]:
        """The carried ``state`` (None: zeros) as the batch starts from it; unchanged here."""
        return state

    def recur(self, tokens: Tensor, state: Optional[List]) -> Tuple[Tensor, List, Dict[str, Any]]:
        """``(features [B, T, d], final state, extra)`` of ``tokens [B, T]`` starting from ``state``."""
        raise NotImplementedError

    def max_positions(self):
        return MAX_POSITIONS
