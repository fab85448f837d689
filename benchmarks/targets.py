"""The benchmarks and the speed goals in one place, and how a figure is stated and shown: a :class:`Check` against
its target, its record (:data:`FIELDS`), the tables' formats, the results file and the revision measured.

A benchmark is its file, ``benchmarks/<name>.py`` (a ``main(argv)`` that returns ``common.Bench.finish``'s result),
and its entry in :data:`BENCHMARKS`. :data:`GOALS` holds the targets that ``make gpu-round`` measures, for a GPU and
for a CPU; a check tagged with a goal's key, or whose text the goal's pattern finds, is judged against the goal's
target. ``Bench.finish`` prints each check's line (``- PASS: what: 1.04x (target >= 1x)``) and its record as a
``FIGURE {json}`` line, which ``benchmarks.gpu_round`` reads back. Every speed ratio is a ratio of medians.
"""

import json
import os
import re
import subprocess
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence

# each benchmark -> its runs in ``python -m benchmarks.gpu_report`` (the options of each: a few tens of seconds on one
# H100, the Mogrifier's torch.compile about a minute)
BENCHMARKS = {
    "group_linear": (["--rounds", "10"],),
    "train_speed": (["--rounds", "10"], ["--tokens", "26000", "--rounds", "5"], ["--dtype", "fp16", "--rounds", "10"]),
    "generate_speed": (["--rounds", "5"],),
    "lstm_lm_speed": (["--rounds", "5"],),
    "mogrifier_speed": (["--rounds", "5"],),
    "txl_speed": (["--rounds", "5"], ["--shape", "nvidia-base", "--rounds", "5"]),
    "gcnn_speed": (["--parts", "train,generate", "--rounds", "3"],),
}
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


# the patterns of the goals whose benchmarks do not tag their checks
DENSE_1024 = r"GroupLinear.* (vs|than) dense at 1024"
MOGRIFIER_STACK = r"^`mogrifier_lstm_lm_ptb` stack.* vs `nn\.LSTM`"  # the model as built, not the module alone
GOALS = {
    "define_train_4k": Goal("transformer_define vs transformer, training, 4k target tokens a step", 1.0, 1.1),
    "define_train_26k": Goal("transformer_define vs transformer, training, 26k target tokens a step", 1.0, 1.1),
    "txl_nvidia_base": Goal("Transformer-XL at NVIDIA's base shape, training", 120000.0, None, unit="tokens/s"),
    "txl_define_train": Goal("Transformer-XL DeFINE n=128 vs standard 384 (Table 2 sizes), training", 1.15, 1.3),
    "txl_define_eval": Goal("Transformer-XL DeFINE n=128 vs standard 384 (Table 2 sizes), evaluation", 1.3, 1.3),
    "group_linear_dense": Goal("GroupLinear g=4 vs dense, 1024 -> 2048 at 8192 tokens", 1.5, 1.5, pattern=DENSE_1024),
    "mogrifier_lstm": Goal(
        "MogrifierLSTM r=5 at the PTB shape, as fairseq-train builds it, vs nn.LSTM", 0.5, 0.5, pattern=MOGRIFIER_STACK
    ),
    "lstm_scoring_b10": Goal("lstm_lm_define scoring vs its LSTM layers alone, batch 10", 0.95, 0.95),
    "lstm_scoring_b1": Goal("lstm_lm_define scoring vs its LSTM layers alone, batch 1", 0.95, 0.95),
}


def define_train_goal(tokens) -> str:
    """The translation training goal that a batch of about ``tokens`` target tokens measures, or ""."""
    if tokens is None:
        return ""
    return "define_train_4k" if 3000 <= tokens <= 5000 else "define_train_26k" if 20000 <= tokens <= 32000 else ""


def goal_target(key: str, cuda: bool, default: float) -> float:
    """Goal ``key``'s target on the device (``default`` where ``key`` is empty or not a goal on that device)."""
    goal = GOALS.get(key)
    value = None if goal is None else goal.gpu if cuda else goal.cpu
    return default if value is None else value


def goal_of(what: str, key: str = "") -> str:
    """The goal a check states: its own ``key``, else the first goal whose pattern finds ``what``; "" if none."""
    if key and key not in GOALS:
        raise KeyError(f"goal {key!r}: not in benchmarks/targets.py GOALS ({', '.join(GOALS)})")
    return key or next((k for k, g in GOALS.items() if g.pattern and re.search(g.pattern, what)), "")


def show(value: float, unit: str) -> str:
    """A figure as the tables print it: ``1.04x`` for a ratio, ``98,500 tokens/s`` for a rate, ``n/a`` for nan."""
    return ratio(value) if unit == "x" or value != value else f"{value:,.0f} {unit}"


def show_target(value: float, unit: str, at_most: bool = False) -> str:
    """A target as the tables print it: ``>= 1.5x``, ``<= 1.1x``, ``>= 120,000 tokens/s``."""
    return f"{'<=' if at_most else '>='} " + (f"{value:g}x" if unit == "x" else show(value, unit))


class Check(NamedTuple):
    """A figure: ``value`` against ``target``, at least (or, ``at_most``, at most); ``goal``: its key in
    :data:`GOALS`; ``unit``: "x" for a speed ratio, else the unit of an absolute figure; ``batch``: what one timed
    call processes."""

    what: str
    value: float
    target: float
    at_most: bool = False
    goal: str = ""
    unit: str = "x"
    batch: str = ""

    @property
    def met(self) -> bool:
        return self.value <= self.target if self.at_most else self.value >= self.target

    def verdict(self) -> str:
        return "n/a" if self.value != self.value else "PASS" if self.met else "FAIL"

    def line(self) -> str:
        goal = show_target(self.target, self.unit, self.at_most)
        return f"- {self.verdict()}: {self.what}: {show(self.value, self.unit)} (target {goal})"


FIELDS = ("benchmark", "what", "value", "unit", "target", "at_most", "goal", "met", "ratio_method", "report_target")
FIELDS += ("revision", "machine", "precision", "batch", "command", "report", "origin")
# ``origin``: "run" for the records a benchmark wrote as it ran, "report" for those converted once from its Markdown;
# a gpu round's records also name its item, its status ("measured", "failed", "skipped" or pytest's summary), exit
# status and seconds: a failed item is a record with no value
ROUND_FIELDS = ("item", "status", "rc", "seconds")
FIGURE_PREFIX = "FIGURE "


def of_checks(checks, benchmark: str, report: Optional[str], context: dict, gpu: bool) -> List[dict]:
    """The records of a run's checks on a GPU or not: a goal's figure (:func:`goal_of`) against the goal's target
    there, ``report_target`` keeping the check's; ``context``: the run's command, revision, precision and machine;
    ``report``: its results file under ``results/`` (None: none)."""
    context = {k: v for k, v in dict(context, report=report, origin="run").items() if k in FIELDS}
    records = []
    for c in checks:
        goal, value = goal_of(c.what, c.goal), None if c.value != c.value else c.value  # nan: null in JSON
        target = goal_target(goal, gpu, c.target)
        met = None if value is None else (value <= target if c.at_most else value >= target)
        method = {"x": RATIO_METHOD, "ms": "median"}.get(c.unit, ABSOLUTE_METHOD)
        out = dict(benchmark=benchmark, what=c.what, value=value, unit=c.unit, target=target, at_most=c.at_most)
        out.update(goal=goal, met=met, ratio_method=method, report_target=c.target, batch=c.batch or None)
        records.append(dict(out, **{k: context.get(k) for k in FIELDS if k not in out}))
    return records


def figure_line(record: dict) -> str:
    """``record`` as one machine-readable line of a benchmark's output: ``FIGURE`` and the record as JSON."""
    return FIGURE_PREFIX + json.dumps(record, sort_keys=True)


def parse_figures(text: str) -> List[dict]:
    """The records of the ``FIGURE`` lines in ``text`` (a benchmark's output), in order."""
    return [json.loads(line[len(FIGURE_PREFIX) :]) for line in text.splitlines() if line.startswith(FIGURE_PREFIX)]


def write(path, records: List[dict]) -> None:
    Path(path).write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")


def json_path(md) -> Path:
    return Path(str(md)[: -len(".md")] + ".json")


KEEP_MARK = "<!-- written by hand below this line: kept when the benchmark is run again -->"


def ms(seconds: float) -> str:
    v = seconds * 1e3
    return "n/a" if v != v else f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.3g}"


def ratio(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}x"


def millions(n: int) -> str:
    return f"{n / 1e6:.2f} M"


def table(columns, rows: Sequence[Sequence[object]]) -> str:
    """A markdown table of ``columns`` (a list, or one string ``"a | b"``) and ``rows`` (cells formatted already)."""
    columns = columns.split(" | ") if isinstance(columns, str) else columns
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]) + "\n"


def error_text(error: BaseException) -> str:
    """An error as one line for a table cell."""
    return f"failed: {type(error).__name__}: {error}".replace("|", "/").replace("\n", " ")[:300]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write_result(path: str, text: str) -> None:
    """Write ``text`` to ``path``, keeping what the file had from :data:`KEEP_MARK` on (hand-written history)."""
    old = Path(path).read_text(encoding="utf-8") if os.path.exists(path) else ""
    kept = "\n" + old[old.index(KEEP_MARK) :] if KEEP_MARK in old else ""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    Path(path).write_text(text + kept, encoding="utf-8")


REVISION_VARIABLE = "DEFINE_FAIRSEQ_REVISION"  # the revision of a copied tree without git, as its copier knew it


def revision(cwd: Optional[str] = None) -> str:
    """The checkout's commit (short), with ``+dirty`` when the files differ from it (uncommitted changes or files
    git does not ignore); ``unknown (no git checkout)`` outside one. ``$DEFINE_FAIRSEQ_REVISION``, when set, instead.
    """
    if os.environ.get(REVISION_VARIABLE):
        return os.environ[REVISION_VARIABLE]

    def git(*args):  # a copied checkout often belongs to another user: git would refuse it without safe.directory
        argv = ["git", "-c", "safe.directory=*", *args]
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)

    try:
        head, status = git("rev-parse", "--short=10", "HEAD"), git("status", "--porcelain")
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    if head.returncode != 0:
        return "unknown (no git checkout)"
    return head.stdout.strip() + ("+dirty" if status.returncode != 0 or status.stdout.strip() else "")
