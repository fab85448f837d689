"""Recurrent state carried from one batch to the next (truncated back-propagation through time).

The ``stateful_lm`` task sends contiguous windows of ``B`` parallel token streams and marks the first batch of
every epoch and evaluation pass with ``reset_state=True``. A recurrent decoder asks :class:`CarriedState` for
the state to start a batch from and hands it the final state afterwards:

* ``reset_state is None`` (plain ``language_modeling`` task, generation): start from zeros, keep nothing;
* ``reset_state is True``: start from zeros, keep the final state (detached) for the next batch;
* ``reset_state is False``: start from the kept state of the current mode; training and evaluation keep
  theirs separately. With none kept, or one of another batch size (after resuming mid-epoch from a
  checkpoint), start from zeros and log a warning once.

The kept state is a plain attribute of the decoder, never part of its ``state_dict``.
"""

import logging
from typing import Any, Dict, List, Optional, Tuple

import torch

logger = logging.getLogger(__name__)


def detach_state(state: Any) -> Any:
    """``state`` (tensors nested in lists/tuples/dicts) with every tensor detached from the graph."""
    if isinstance(state, torch.Tensor):
        return state.detach()
    if isinstance(state, (list, tuple)):
        return type(state)(detach_state(s) for s in state)
    if isinstance(state, dict):
        return {k: detach_state(v) for k, v in state.items()}
    return state


class CarriedState:
    """The bookkeeping of the state carried across batches; see the module docstring.

    ``state`` is whatever the decoder uses (e.g. a list of per-layer ``(h [B, H], c [B, H])``); this class
    only stores it, detached, with its batch size, keyed by the mode (``training``).
    """

    def __init__(self, name: str = "recurrent state"):
        self.name = name
        self._kept: Dict[bool, Tuple[int, Any]] = {}
        self._warned = False

    def initial(self, reset_state: Optional[bool], training: bool, batch_size: int) -> Optional[Any]:
        """The state to start a batch of ``batch_size`` streams from; ``None`` means zeros."""
        if reset_state is None or bool(reset_state):
            return None
        kept = self._kept.get(bool(training))
        if kept is None or kept[0] != batch_size:
            if not self._warned:
                found = "none was kept" if kept is None else f"the kept one is for {kept[0]} streams"
                logger.warning(
                    f"continuing a stream of {batch_size} sequences without the {self.name} of the previous batch "
                    f"({found}); starting from zeros. This is expected once after resuming mid-epoch from a "
                    f"checkpoint.")
                self._warned = True
            return None
        return kept[1]

    def keep(self, reset_state: Optional[bool], training: bool, batch_size: int, state: Any) -> None:
        """Keep the final ``state`` of a batch for the next one (nothing is kept when ``reset_state is None``)."""
        if reset_state is None:
            return
        self._kept[bool(training)] = (batch_size, detach_state(state))

    def clear(self) -> None:
        """Forget every kept state."""
        self._kept.clear()

    def has_state(self, training: bool) -> bool:
        """Whether a state is kept for the mode ``training``."""
        return bool(training) in self._kept

    def kept_state(self, training: bool) -> Optional[Any]:
        """The state kept for the mode ``training`` (detached), or None."""
        kept = self._kept.get(bool(training))
        return None if kept is None else kept[1]


class IncrementalLSTMState:
    """Mixin for a ``FairseqIncrementalDecoder`` whose recurrent state is a list of per-layer ``(h [B, H],
    c [B, H])``: keeps it in fairseq's incremental state (under ``"lstm_state"``, keys ``h{l}`` / ``c{l}``) and
    reorders it for beam search. Put it before ``FairseqIncrementalDecoder`` in the bases."""

    def _cached_state(self, incremental_state) -> Optional[List]:
        cached = self.get_incremental_state(incremental_state, "lstm_state")
        if cached is None:
            return None
        return [(cached[f"h{i}"], cached[f"c{i}"]) for i in range(len(cached) // 2)]

    def _cache_state(self, incremental_state, state) -> None:
        cached: Dict[str, Optional[torch.Tensor]] = {}
        for i, (h, c) in enumerate(state):
            cached[f"h{i}"], cached[f"c{i}"] = h, c
        self.set_incremental_state(incremental_state, "lstm_state", cached)

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict[str, Optional[torch.Tensor]]],
                                  new_order: torch.Tensor):
        cached = self.get_incremental_state(incremental_state, "lstm_state")
        if cached is None:
            return
        self.set_incremental_state(incremental_state, "lstm_state",
                                   {key: value.index_select(0, new_order) for key, value in cached.items()})
