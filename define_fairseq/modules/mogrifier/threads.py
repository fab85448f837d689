"""How the fast path of a Mogrifier LSTM layer (``recurrence.py``) runs its small per-step work and reuses
its buffers: :class:`Threads` switches torch's CPU intra-op thread count between one thread and the caller's setting
(on under ``OMP_WAIT_POLICY=PASSIVE``, see :func:`small_work_on_one_thread`), and :class:`Workspace` keeps the
buffers from one call to the next. The measurements behind these choices are in
``benchmarks/results/mogrifier_speed.md``.
"""

import functools
import os
from typing import Optional, Sequence

import torch

# None: decided by OMP_WAIT_POLICY (see small_work_on_one_thread); True / False forces it (benchmarks compare).
SMALL_WORK_ON_ONE_THREAD: Optional[bool] = None


@functools.lru_cache(maxsize=None)
def _passive_wait_policy() -> bool:
    return os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"


def small_work_on_one_thread() -> bool:
    """Whether the small per-step work runs on one thread: where waking OpenMP's idle threads is expensive because
    they sleep at once (``OMP_WAIT_POLICY=PASSIVE``, which the OpenMP runtime reads at start-up; read here at the
    first call), unless :data:`SMALL_WORK_ON_ONE_THREAD` says otherwise."""
    if SMALL_WORK_ON_ONE_THREAD is not None:
        return SMALL_WORK_ON_ONE_THREAD
    return _passive_wait_policy()


class Threads:
    """Switches torch's CPU intra-op thread count between one thread (small per-step work) and the caller's
    setting (large GEMMs), because an element-wise kernel at these sizes computes for less time than waking
    sleeping threads takes. A context manager: restores the caller's count on exit, also on error. Does nothing on
    GPU, with one thread, or when :func:`small_work_on_one_thread` is false.
    """

    def __init__(self, device: torch.device):
        self.count = torch.get_num_threads()
        self.enabled = device.type == "cpu" and self.count > 1 and small_work_on_one_thread()

    def small(self) -> None:
        if self.enabled:
            torch.set_num_threads(1)

    def large(self) -> None:
        if self.enabled:
            torch.set_num_threads(self.count)

    def __enter__(self):
        self.small()
        return self

    def __exit__(self, *exc):
        self.large()
        return False


class Workspace:
    """The fast path's buffers kept from one call to the next (one per layer), because touching a few hundred MB
    of fresh memory at every call costs page faults. A run gives its buffers back when it is destroyed (after its
    backward, when autograd frees the graph, or after an inference forward), so no buffer is reused while a graph
    that saved it is alive. Only the latest finished run's buffers are kept; ``clear()`` drops them. Never copied.
    """

    def __init__(self):
        self.free = {}

    def take(self, like: torch.Tensor, *shape: int) -> torch.Tensor:
        key = (shape, like.dtype, like.device)
        buffers = self.free.get(key)
        return buffers.pop() if buffers else like.new_empty(shape)

    def give(self, tensors: Sequence[torch.Tensor]) -> None:
        """Keep ``tensors`` (and nothing else) for the next run."""
        free = {}
        for t in tensors:
            free.setdefault((tuple(t.shape), t.dtype, t.device), []).append(t)
        self.free = free

    def clear(self) -> None:
        self.free = {}

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.free = {}

    def __deepcopy__(self, memo):
        return Workspace()
