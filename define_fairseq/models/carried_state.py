"""Recurrent state carried from one batch to the next (truncated back-propagation through time).

The ``stateful_lm`` task sends contiguous windows of ``B`` parallel token streams and marks the first batch of
every epoch and evaluation pass with ``reset_state=True``. A recurrent decoder asks :class:`CarriedState` for
the state to start a batch from and hands it the final state afterwards:

* ``reset_state is None`` (plain ``language_modeling`` task, generation): start from zeros, keep nothing;
* ``reset_state is True``: start from zeros, keep the final state (detached) for the next batch;
* ``reset_state is False``: start from the kept state of the current mode; training and evaluation keep
  theirs separately. With none kept, or one of another batch size, start from zeros and log a warning once.

Checkpoints: the training state belongs to the data position that fairseq-train saves with every checkpoint
(the epoch iterator's ``iterations_in_epoch``), so it is saved too, as the module's extra state
(``<decoder>.<name>._extra_state`` in the model's state dict: the data-parallel world size and, per rank, the
batch size, the tensors and their dtypes; ``{}`` when none is kept). Loading it back makes a run resumed mid-epoch
from ``checkpoint_last.pt`` continue its streams exactly. The evaluation state is never saved (every evaluation
pass starts with a reset).

Several data-parallel ranks: only rank 0 writes checkpoints, so the other ranks' states must reach it first.
:meth:`CarriedState.gather_training_state` sends them (a collective); the ``stateful_lm`` task calls it at the
start of every validation, which fairseq-train runs before every mid-epoch checkpoint. Each rank takes its own rows
back on resuming with the same number of ranks. Without a validation before the save (``--disable-validation``) the
checkpoint holds rank 0's rows only, and the other ranks start theirs from zeros (warned), as does every rank of a
run resumed with another number of ranks or batch size. A checkpoint without the entry (written before it existed)
loads as "nothing kept". Loading for evaluation or generation ignores the training state.
"""

import logging
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

logger = logging.getLogger(__name__)

# The key suffix under which torch saves a module's get_extra_state() in the state dict.
EXTRA_STATE_KEY = "_extra_state"


def map_tensors(state: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``state`` (tensors nested in lists/tuples/dicts) with ``fn`` applied to every tensor, in a fixed order."""
    if isinstance(state, torch.Tensor):
        return fn(state)
    if isinstance(state, (list, tuple)):
        return type(state)(map_tensors(s, fn) for s in state)
    if isinstance(state, dict):
        return {k: map_tensors(v, fn) for k, v in state.items()}
    return state


def detach_state(state: Any) -> Any:
    """``state`` (tensors nested in lists/tuples/dicts) with every tensor detached from the graph."""
    return map_tensors(state, torch.Tensor.detach)


def data_parallel_position() -> Tuple[int, int]:
    """``(rank, world size)`` of this process in torch.distributed's default group; ``(0, 1)`` without it."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _saved_rows(batch_size: int, state: Any) -> Dict[str, Any]:
    """One rank's training state as checkpoints hold it. The dtypes, in map_tensors' order: fairseq saves
    checkpoints in float32, and a model trained in fp16 needs its state back in fp16."""
    dtypes: List[str] = []
    map_tensors(state, lambda t: dtypes.append(str(t.dtype).replace("torch.", "")))
    return {"batch_size": batch_size, "dtypes": dtypes, "state": state}


def reorder_cached(decoder, incremental_state, key: str, new_order: torch.Tensor, batch_dim: int = 0) -> None:
    """Reorder for beam search the tensors ``decoder`` (a fairseq incremental decoder) caches under ``key`` in
    ``incremental_state``: ``index_select(batch_dim, new_order)`` on each; nothing when none are cached.

    Shapes: each cached tensor has the batch B at ``batch_dim``; ``new_order [B']``.
    """
    cached = decoder.get_incremental_state(incremental_state, key)
    if cached is None:
        return
    decoder.set_incremental_state(
        incremental_state, key, {name: value.index_select(batch_dim, new_order) for name, value in cached.items()}
    )


class CarriedState(nn.Module):
    """The bookkeeping of the state carried across batches; see the module docstring.

    ``state`` is whatever the decoder uses (e.g. a list of per-layer ``(h [B, H], c [B, H])``); this class
    only stores it, detached, with its batch size, keyed by the mode (``training``). It is a submodule of the
    decoder only for its extra state (the training state in checkpoints) and its device: it has no parameters.
    """

    def __init__(self, name: str = "recurrent state"):
        super().__init__()
        self.name = name
        self._kept: Dict[bool, Tuple[int, Any]] = {}
        self._warned = False
        self._not_loaded: Optional[str] = None  # why a checkpoint's training state was not taken
        # On rank 0 after gather_training_state: (the kept training state it was taken with, every rank's rows)
        self._gathered: Optional[Tuple[Any, List[Optional[Dict[str, Any]]]]] = None
        # Follows the decoder's device (and nothing else), so that a state loaded from a checkpoint goes there.
        self.register_buffer("device_probe", torch.empty(0), persistent=False)

    def initial(self, reset_state: Optional[bool], training: bool, batch_size: int) -> Optional[Any]:
        """The state to start a batch of ``batch_size`` streams from; ``None`` means zeros."""
        if reset_state is None or bool(reset_state):
            return None
        kept = self._kept.get(bool(training))
        if kept is None or kept[0] != batch_size:
            if not self._warned:
                if kept is not None:
                    found = f"the kept one is for {kept[0]} streams"
                elif training and self._not_loaded is not None:
                    found = self._not_loaded
                else:
                    found = "none was kept"
                logger.warning(
                    f"continuing a stream of {batch_size} sequences without the {self.name} of the previous batch "
                    f"({found}); starting from zeros. This is expected once after resuming mid-epoch from a "
                    f"checkpoint that does not hold this state."
                )
                self._warned = True
            return None
        device = self.device_probe.device
        return map_tensors(kept[1], lambda t: t.to(device))

    def keep(self, reset_state: Optional[bool], training: bool, batch_size: int, state: Any) -> None:
        """Keep the final ``state`` of a batch for the next one (nothing is kept when ``reset_state is None``)."""
        if reset_state is None:
            return
        self._kept[bool(training)] = (batch_size, detach_state(state))

    def clear(self) -> None:
        """Forget every kept state."""
        self._kept.clear()
        self._gathered = None

    def has_state(self, training: bool) -> bool:
        """Whether a state is kept for the mode ``training``."""
        return bool(training) in self._kept

    def kept_state(self, training: bool) -> Optional[Any]:
        """The state kept for the mode ``training`` (detached), or None."""
        kept = self._kept.get(bool(training))
        return None if kept is None else kept[1]

    # -- checkpoints -----------------------------------------------------------------------------------------

    def gather_training_state(self) -> None:
        """Send every data-parallel rank's kept training state to rank 0, which saves them all with its next
        checkpoint (:meth:`get_extra_state`), if none of them changes before. A collective: every rank must call it.
        Nothing to do with a single process. Rank 0 holds the other ranks' states on the CPU until then."""
        rank, world_size = data_parallel_position()
        if world_size == 1:
            return
        kept = self._kept.get(True)
        mine = None if kept is None else _saved_rows(kept[0], map_tensors(kept[1], torch.Tensor.cpu))
        gathered = [None] * world_size if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        self._gathered = (kept, gathered) if rank == 0 else None

    def get_extra_state(self) -> Dict[str, Any]:
        """The kept training state as saved in the state dict (``{}`` when none is kept): ``{"world_size": W,
        "ranks": [rows of rank 0, ..., rows of rank W-1]}``, each ``{"batch_size", "dtypes", "state"}`` or ``{}``
        for a rank whose state did not reach this one (see :meth:`gather_training_state`)."""
        kept = self._kept.get(True)
        if kept is None:
            return {}
        rank, world_size = data_parallel_position()
        ranks = [{} for _ in range(world_size)]
        if self._gathered is not None and self._gathered[0] is kept:  # gathered from this very state
            ranks = [rows or {} for rows in self._gathered[1]]
        ranks[rank] = _saved_rows(*kept)
        return {"world_size": world_size, "ranks": ranks}

    def set_extra_state(self, saved: Dict[str, Any]) -> None:
        """Take this rank's training state from a checkpoint (see :meth:`get_extra_state`); forget every kept
        state."""
        self._kept.clear()
        self._gathered = None
        self._warned = False
        self._not_loaded = None
        if not saved:
            return
        if "ranks" not in saved:  # written before every rank's state was saved: rank 0's (or one rank's) only
            ranks = [{} for _ in range(saved["world_size"])]
            ranks[saved["rank"]] = saved
            saved = {"world_size": saved["world_size"], "ranks": ranks}
        rank, world_size = data_parallel_position()
        if saved["world_size"] != world_size:
            self._not_loaded = (
                f"the checkpoint holds the state of {saved['world_size']} data-parallel processes, this run has "
                f"{world_size}"
            )
            return
        rows = saved["ranks"][rank]
        if not rows:
            self._not_loaded = (
                f"the checkpoint holds no state for rank {rank}: the ranks' states reach rank 0 at the validation "
                f"before a checkpoint, and this one was written without one (--disable-validation)"
            )
            return
        dtypes = iter(rows["dtypes"])
        device = self.device_probe.device
        state = map_tensors(rows["state"], lambda t: t.to(device=device, dtype=getattr(torch, next(dtypes))))
        self._kept[True] = (int(rows["batch_size"]), state)

    def upgrade_state_dict_named(self, state_dict: Dict[str, Any], name: str) -> None:
        """fairseq calls this before loading a state dict: one written before the training state was saved
        holds nothing kept."""
        state_dict.setdefault(f"{name}.{EXTRA_STATE_KEY}" if name else EXTRA_STATE_KEY, {})


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

    def reorder_incremental_state(
        self, incremental_state: Dict[str, Dict[str, Optional[torch.Tensor]]], new_order: torch.Tensor
    ):
        reorder_cached(self, incremental_state, "lstm_state", new_order)
