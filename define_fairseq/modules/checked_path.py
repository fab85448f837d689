"""Accelerated paths that check themselves against their eager path on first use (:class:`CheckedPath`): the
Mogrifier's CUDA graphs and Triton kernels and the ``--torch-compile`` regions all go through it.

The first call of a path for a key (a call signature: shapes, dtypes, mode) runs the accelerated function and the
eager one on copies of the same inputs from the same random state, compares their outputs (carried state
included) and, under autograd, their gradients for the same random output gradients (inputs and parameters), then
makes the real call, from the random state it found: the check changes no number the caller trains on. On an
exception or a difference beyond :func:`tolerance`, it warns once (the path, what went wrong or the largest
difference, the switch that turns it off) and runs the eager path from then on. Later calls of a checked key run
the accelerated path alone, so the work per step after the first is unchanged.

``DEFINE_FAIRSEQ_EAGER=1`` in the environment runs every accelerated path of the plugin eagerly (:func:`eager_only`).
"""

import logging
import math
import os
import time
import warnings
from contextlib import nullcontext
from typing import Callable, ContextManager, Hashable, Iterable, List, Optional, Sequence

import torch

logger = logging.getLogger(__name__)

EAGER_VARIABLE = "DEFINE_FAIRSEQ_EAGER"


def eager_only() -> bool:
    """Whether ``DEFINE_FAIRSEQ_EAGER`` asks for every accelerated path off (any value but empty, 0 or false)."""
    return os.environ.get(EAGER_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def tolerance(dtype: torch.dtype) -> float:
    """The largest difference allowed, relative to the eager tensor's largest magnitude: the square root of the
    dtype's machine epsilon (half its digits), far above the rounding of two orders of the same sums and far below
    a wrong term (float32: 3.5e-4, bfloat16: 0.088, float16: 0.031, float64: 1.5e-8)."""
    return math.sqrt(torch.finfo(dtype).eps)


class PathFallback(UserWarning):
    """An accelerated path failed its first-use check; the eager path runs instead."""


def flatten(value) -> List[torch.Tensor]:
    """The tensors of a (nested) tuple, list or dict of outputs, in order (None and non-tensors left out)."""
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in flatten(item)]
    return []


def _largest_difference(fast: Sequence[Optional[torch.Tensor]], eager: Sequence[Optional[torch.Tensor]]):
    """``(relative difference, tolerance)`` of the worst pair; ``(inf, nan)`` where the two disagree in number,
    shape or finiteness."""
    if len(fast) != len(eager):
        return math.inf, math.nan
    worst, allowed = 0.0, math.inf
    for a, b in zip(fast, eager):
        if a is None or b is None:  # an unused input's gradient on one side: zeros
            a, b = (torch.zeros_like(b) if a is None else a), (torch.zeros_like(a) if b is None else b)
        if a is None or a.shape != b.shape:
            return math.inf, math.nan
        if not a.is_floating_point():
            if not torch.equal(a, b):
                return math.inf, math.nan
            continue
        a, b = a.detach().double(), b.detach().double()
        finite = torch.isfinite(b)
        if not torch.equal(torch.isfinite(a), finite):
            return math.inf, math.nan
        scale = b[finite].abs().max().item() if finite.any() else 0.0
        difference = (a - b)[finite].abs().max().item() if finite.any() else 0.0
        worst = max(worst, difference / scale if scale > 0 else difference)
        allowed = min(allowed, tolerance(torch.promote_types(a.dtype, b.dtype)))
    return worst, allowed


class CheckedPath:
    """One accelerated path of one module: ``name`` (what the messages call it), ``switch`` (the flag or setting
    that turns it off) and ``announce`` (logged before its first call, which may capture or compile).

    ``__call__(key, fast, eager, inputs, parameters=())`` returns ``fast(*inputs)`` where the path is on and ``key``
    has passed its check, else checks it first (see the module docstring) or runs ``eager(*inputs)``. ``inputs``
    are the calls' arguments (tensors are copied for the check, floating ones given gradients where they require
    them); ``parameters`` are the tensors the functions read besides them, whose gradients are compared too.
    ``check_mode`` (optional) is a context manager entered around the check's two calls (e.g. evaluation mode, for
    a path whose random numbers differ from the eager path's). Not copied: a copy checks again.
    """

    def __init__(
        self, name: str, switch: str, announce: str, check_mode: Optional[Callable[[], ContextManager]] = None
    ):
        self.name, self.switch, self.announce = name, switch, announce
        self.check_mode = check_mode or nullcontext
        self.checked: set = set()
        self.problem: Optional[str] = None  # why it runs eagerly, once it failed

    @property
    def on(self) -> bool:
        return self.problem is None and not eager_only()

    def __call__(self, key: Hashable, fast: Callable, eager: Callable, inputs: Sequence, parameters: Iterable = ()):
        if not self.on:
            return eager(*inputs)
        if key in self.checked or _capturing():
            return fast(*inputs)
        logger.info(f"{self.name}: {self.announce}")
        start = time.perf_counter()
        parameters = [p for p in parameters if torch.is_tensor(p)]
        worst = allowed = math.nan
        try:
            with self.check_mode():
                got = _outputs_and_gradients(fast, inputs, parameters)
                want = _outputs_and_gradients(eager, inputs, parameters)
            worst, allowed = _largest_difference(got, want)
            problem = None if worst <= allowed else f"largest difference {worst:.3g}, beyond {allowed:.1g}"
            result = None if problem else fast(*inputs)
        except Exception as error:  # noqa: BLE001 - any failure of the accelerated path falls back
            problem = describe(error)
        if problem is not None:
            self._fall_back(problem)
            return eager(*inputs)
        self.checked.add(key)
        logger.info(
            f"{self.name}: ready in {time.perf_counter() - start:.1f} s (its first call, checked against the eager "
            f"path: largest difference {worst:.1g}, tolerance {allowed:.1g})"
        )
        return result

    def _fall_back(self, problem: str) -> None:
        self.problem = problem
        warnings.warn(
            f"{self.name} failed its check against the eager path ({problem}); it runs eagerly from now on (the "
            f"same function, slower). {self.switch} turns it off; {EAGER_VARIABLE}=1 turns off every accelerated path",
            PathFallback,
            stacklevel=3,
        )

    def __deepcopy__(self, memo):
        return CheckedPath(self.name, self.switch, self.announce, self.check_mode)

    def __getstate__(self):
        return {"name": self.name, "switch": self.switch, "announce": self.announce, "check_mode": None}

    def __setstate__(self, state):
        self.__init__(**state)


def describe(error: BaseException) -> str:
    """``Type: message`` of ``error`` in one line: its first line, and the next where the first ends in a colon (a
    compiler's wrapped exception: ``backend='inductor' raised:`` then the cause)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()] or [""]
    text = " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]
    return f"{type(error).__name__}: {text[:300]}"


def _capturing() -> bool:
    """Inside a CUDA graph capture nothing may synchronise: a key is checked before (in the capture's warm-up)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _devices(inputs: Sequence) -> List[int]:
    return sorted({t.device.index or 0 for t in flatten(list(inputs)) if t.is_cuda})


def _outputs_and_gradients(function: Callable, inputs: Sequence, parameters: List[torch.Tensor]) -> list:
    """``function``'s outputs on copies of ``inputs`` and, under autograd, the gradients of their sum weighted by
    fixed random tensors, for the inputs that require them and ``parameters``; the random state left as found."""
    copies = [
        t.detach().clone().requires_grad_(t.requires_grad and t.is_floating_point()) if torch.is_tensor(t) else t
        for t in inputs
    ]
    with torch.random.fork_rng(devices=_devices(inputs)):
        outputs = flatten(function(*copies))
    results = [t.detach().clone() for t in outputs]
    differentiable = [t for t in outputs if t.requires_grad]
    leaves = [t for t in copies if torch.is_tensor(t) and t.requires_grad] + [p for p in parameters if p.requires_grad]
    if torch.is_grad_enabled() and differentiable and leaves:
        generator = torch.Generator().manual_seed(0)
        weights = [torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t) for t in differentiable]
        grads = torch.autograd.grad(differentiable, leaves, weights, allow_unused=True)
        results += [None if g is None else g.detach().clone() for g in grads]
    return results
