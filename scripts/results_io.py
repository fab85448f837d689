"""What the comparison scripts share, below all of them: the names of a comparison's run directories and log lines,
and the reading, merging and writing of its data files (the format of ``docs/results.md``).

It imports no other module of ``scripts``, so that ``compare_runs``, ``verdicts``, ``claims`` and
``render_results`` each import it, and one another one way only (``tests/scripts/test_imports.py``).
"""

import fcntl
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List

ROOT = Path(__file__).resolve().parents[1]
# a run's directory, MODEL.sSEED, and the json entries of a fairseq log (--log-format json)
RUN_NAME = re.compile(r"^(?P<model>.+)\.s(?P<seed>\d+)$")
LOG_ENTRY = re.compile(r"\| (?P<kind>train_inner|valid|train) \| (?P<json>\{.*\})\s*$")
RUN_KEY = ("group", "model", "point", "seed")
PROVENANCE = ("command", "revision", "machine")
# a run's learning-rate schedule (fairseq's --lr-scheduler, as the run's log records it): its name in a verdict's
# row, then in full; cosine is compare.sh -S cosine's, annealed to 0 at the run's last update
SCHEDULES = {
    "cosine": ("annealed", "annealed (after the warm-up, a cosine to 0 at each run's last update; each budget a run)"),
    "fixed": ("fixed lr", "fixed (constant after any warm-up), not annealed"),
    "inverse_sqrt": ("inverse-sqrt lr", "inverse square root after the warm-up, not annealed"),
}


def schedule_label(name: str, long: bool = False) -> str:
    """The words for a schedule's name (``SCHEDULES``; another scheduler by its own name)."""
    return SCHEDULES.get(name, (f"{name} lr", f"fairseq's {name} schedule"))[long]


def schedule(data: dict, runs: List[dict]) -> str:
    """The one schedule of ``runs`` (their own ``schedule``, else the file's), '' where none is recorded."""
    found = {run.get("schedule", data.get("schedule", "")) for run in runs}
    return found.pop() if len(found) == 1 else ""


class DataError(ValueError):
    """A data file that cannot be rendered; the message names the file and the fix."""


def load(path: Path) -> dict:
    """A data file, checked for what the renderer needs."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise DataError(f"{path}: {error}; write it with compare_runs or by hand as docs/results.md describes")
    for key in ("metric", "better", "points", "runs"):
        if key not in data:
            raise DataError(f"{path}: no '{key}'; every data file names it (docs/results.md, 'The data files')")
    if data["better"] not in ("lower", "higher"):
        raise DataError(f"{path}: 'better' is {data['better']!r}; it is 'lower' or 'higher'")
    points = {p["key"] for p in data["points"]}
    for run in data["runs"]:
        missing = [k for k in ("model", "point", "seed", "value") if k not in run]
        if missing or run["point"] not in points:
            raise DataError(
                f"{path}: the run {run} lacks {missing or 'a point listed in points'}; give each run "
                f"model, point (one of {sorted(points)}), seed and value"
            )
    cells: dict = {}
    for run in data["runs"]:
        cell = (run.get("group", ""), run["model"], run["point"])
        if cells.setdefault(cell, run.get("schedule", data.get("schedule"))) != run.get(
            "schedule", data.get("schedule")
        ):
            raise DataError(
                f"{path}: {cell} holds runs of different schedules; keep each schedule's runs in a group or file of "
                f"their own (a verdict compares runs of one schedule)"
            )
    for v in data.get("verdicts", []):
        if v.get("point") not in points:
            raise DataError(f"{path}: the verdict {v} names a point that 'points' does not list ({sorted(points)})")
        for model in (v.get("a"), v.get("b")):
            if not any(run["model"] == model and run["point"] == v["point"] for run in data["runs"]):
                raise DataError(f"{path}: the verdict {v} names {model!r} at {v['point']}, which has no runs")
    return data


def data_files(root: Path) -> List[Path]:
    """Every published data file, in a fixed order."""
    return sorted(root.glob("examples/*/results/*.json"))


def markdown_files(root: Path) -> List[Path]:
    """The pages with rendered blocks: README.md first, then each example's."""
    return [root / "README.md"] + sorted(root.glob("examples/*/README.md"))


def merge(old: List[dict], new: List[dict]) -> List[dict]:
    """The runs of ``old`` and ``new``, a new run replacing an old one with the same group, model, point and seed;
    an old run whose measurements are unchanged keeps its command, revision and machine, the ones it ran under."""
    key = lambda run: tuple(run.get(k, "") for k in RUN_KEY)  # noqa: E731
    measured = lambda run: {k: v for k, v in run.items() if k not in PROVENANCE}  # noqa: E731
    merged = {key(run): run for run in old}
    for run in new:
        kept = merged.get(key(run))
        if kept is None or measured(kept) != measured(run):
            merged[key(run)] = run
    return sorted(merged.values(), key=lambda run: tuple(str(run.get(k, "")).zfill(6) for k in RUN_KEY))


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path.lock``: one process at a time reads, merges and writes ``path``."""
    with open(f"{path}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary name in the same folder and a rename."""
    tmp = Path(f"{path}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)
