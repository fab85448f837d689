"""The speed goals in one place, how a benchmark states a figure against its target, and the revision measured.

Every benchmark states each figure as a :class:`Check`; ``Bench.finish`` prints its human line (``- PASS: what:
1.04x (target >= 1x)``) and its record (``benchmarks.records``: one ``FIGURE {json}`` line, which
``benchmarks.gpu_round`` reads). :data:`GOALS` holds the targets of the goals that ``make gpu-round`` measures, for a
GPU and for a CPU; a benchmark tags its check with the goal's key, and a benchmark that does not is matched by the
goal's pattern on the check's text. Every speed ratio is a ratio of medians (:data:`RATIO_METHOD`).
"""

import os
import re
import subprocess
from typing import NamedTuple, Optional

RATIO_METHOD = "ratio of medians"  # the baseline's median time over the variant's, variants timed interleaved
ABSOLUTE_METHOD = "tokens over the median step time"


class Goal(NamedTuple):
    """A goal: its text, its target on a GPU and on a CPU (None: not a goal there), its unit ("x": a speed ratio),
    and a pattern that finds it among the checks of a benchmark that does not tag them."""

    what: str
    gpu: Optional[float]
    cpu: Optional[float]
    unit: str = "x"
    at_most: bool = False
    pattern: str = ""


GOALS = {
    "define_train_4k": Goal("transformer_define vs transformer, training, 4k target tokens a step", 1.0, 1.1),
    "define_train_26k": Goal("transformer_define vs transformer, training, 26k target tokens a step", 1.0, 1.1),
    "txl_nvidia_base": Goal("Transformer-XL at NVIDIA's base shape, training", 120000.0, None, unit="tokens/s"),
    "txl_define_train": Goal("Transformer-XL DeFINE n=128 vs standard 384 (Table 2 sizes), training", 1.15, 1.3),
    "txl_define_eval": Goal("Transformer-XL DeFINE n=128 vs standard 384 (Table 2 sizes), evaluation", 1.3, 1.3),
    "group_linear_dense": Goal(
        "GroupLinear g=4 vs dense, 1024 -> 2048 at 8192 tokens",
        1.5,
        1.5,
        pattern=r"GroupLinear.* (vs|than) dense at 1024",
    ),
    "mogrifier_lstm": Goal(
        "MogrifierLSTM r=5 at the PTB shape, as fairseq-train builds it, vs nn.LSTM",
        0.5,
        0.5,
        pattern=r"^`mogrifier_lstm_lm_ptb` stack.* vs `nn\.LSTM`",
    ),
    "lstm_scoring_b10": Goal("lstm_lm_define scoring vs its LSTM layers alone, batch 10", 0.95, 0.95),
    "lstm_scoring_b1": Goal("lstm_lm_define scoring vs its LSTM layers alone, batch 1", 0.95, 0.95),
}


def define_train_goal(tokens) -> str:
    """The translation training goal that a batch of about ``tokens`` target tokens measures, or ""."""
    if tokens is None:
        return ""
    return "define_train_4k" if 3000 <= tokens <= 5000 else "define_train_26k" if 20000 <= tokens <= 32000 else ""


def target(key: str, cuda: bool, default: float) -> float:
    """Goal ``key``'s target on the device (``default`` where ``key`` is empty or not a goal on that device)."""
    goal = GOALS.get(key)
    value = None if goal is None else goal.gpu if cuda else goal.cpu
    return default if value is None else value


def goal_of(what: str, key: str = "") -> str:
    """The goal a check states: its own ``key``, else the first goal whose pattern finds ``what``; "" if none."""
    if key:
        if key not in GOALS:
            raise KeyError(f"goal {key!r}: not in benchmarks/targets.py GOALS ({', '.join(GOALS)})")
        return key
    return next((k for k, g in GOALS.items() if g.pattern and re.search(g.pattern, what)), "")


def show(value: float, unit: str) -> str:
    """A figure as the tables print it: ``1.04x`` for a ratio, ``98,500 tokens/s`` for a rate, ``n/a`` for nan."""
    if value != value:
        return "n/a"
    return f"{value:.2f}x" if unit == "x" else f"{value:,.0f} {unit}"


def show_target(value: float, unit: str, at_most: bool = False) -> str:
    """A target as the tables print it: ``>= 1.5x``, ``<= 1.1x``, ``>= 120,000 tokens/s``."""
    return f"{'<=' if at_most else '>='} " + (f"{value:g}x" if unit == "x" else show(value, unit))


class Check(NamedTuple):
    """A figure: ``value`` against ``target``, at least (or, ``at_most``, at most); ``goal``: its key in
    :data:`GOALS`; ``unit``: "x" for a speed ratio (:data:`RATIO_METHOD`), else the unit of an absolute figure;
    ``batch``: what one timed call processes."""

    what: str
    value: float
    target: float
    at_most: bool = False
    goal: str = ""
    unit: str = "x"
    batch: str = ""

    @classmethod
    def of_goal(cls, goal: str, what: str, value: float, cuda: bool, default: float, **fields) -> "Check":
        """The check of goal ``goal``: its target on the device (:func:`target`, ``default`` where it has none)."""
        return cls(what, value, target(goal, cuda, default), goal=goal, **fields)

    @property
    def met(self) -> bool:
        return self.value <= self.target if self.at_most else self.value >= self.target

    def verdict(self) -> str:
        return "n/a" if self.value != self.value else "PASS" if self.met else "FAIL"

    def line(self) -> str:
        goal = show_target(self.target, self.unit, self.at_most)
        return f"- {self.verdict()}: {self.what}: {show(self.value, self.unit)} (target {goal})"


REVISION_VARIABLE = "DEFINE_FAIRSEQ_REVISION"  # the revision of a copied tree without git, as its copier knew it


def revision(cwd: Optional[str] = None) -> str:
    """The checkout's commit (short), with ``+dirty`` when the files differ from it (uncommitted changes or files
    git does not ignore); ``unknown (no git checkout)`` outside one. ``$DEFINE_FAIRSEQ_REVISION``, when set, instead.
    """
    if os.environ.get(REVISION_VARIABLE):
        return os.environ[REVISION_VARIABLE]

    def git(*args):
        # a copied checkout often belongs to another user: git would refuse it without safe.directory
        return subprocess.run(
            ["git", "-c", "safe.directory=*", *args], cwd=cwd, capture_output=True, text=True, timeout=60
        )

    try:
        head = git("rev-parse", "--short=10", "HEAD")
        status = git("status", "--porcelain")
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    if head.returncode != 0:
        return "unknown (no git checkout)"
    return head.stdout.strip() + ("+dirty" if status.returncode != 0 or status.stdout.strip() else "")
