"""The results table and learning curves of a comparison: models trained with several seeds, for equal updates
and for equal wall time (``examples/translation/compare.sh``, ``examples/language_model/compare.sh``)::

    python -m scripts.compare_runs OUT_DIR --metric BLEU [--plot OUT_DIR/curves.png]

reads ``OUT_DIR/runs/{updates,time,long}/MODEL.sSEED/`` (any of the regimes), each holding ``params.txt``
(``define_fairseq.tools.params``), ``score`` (the test metric, one number) and either ``train.log`` (fairseq-train
with ``--log-format json``) or ``point.json``: ``{"run": DIR, "updates": U, "seconds": T}``, a checkpoint of the
training run in DIR (relative to the point's directory) after U updates and T seconds
(``scripts.run_points``). It prints a Markdown table: parameters, the metric's mean, standard
deviation and per-seed values, the training time and the updates done, per regime, and the learning rate's
schedule that the runs' logs record (``--lr-scheduler``; ``cosine`` from ``compare.sh -S cosine``: annealed to 0 at
the run's last update). ``--plot`` draws the validation loss against updates and against wall-clock time, each
seed's longest curve (matplotlib needed for the plot only). Models keep the order of their first appearance in
``--models`` (default: alphabetical).
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from scripts.figures import pyplot, save
from scripts.results_io import LOG_ENTRY, ROOT, RUN_NAME, load as load_data, locked, merge, schedule_label, write_atomic

DONE = re.compile(r"done training in (?P<seconds>[\d.]+) seconds")
RESUMED = re.compile(r"Loaded checkpoint .* \(epoch \d+ @ [1-9]\d* updates\)")
# the learning-rate scheduler in the configuration fairseq-train logs at its start
SCHEDULER = re.compile(r"'lr_scheduler': \{'_name': '(?P<name>[\w.]+)'")
WINDOW = 0.2  # the last share of a run's updates over which late_gain measures how far it still fell


def gain(valid: Sequence[Tuple[int, float]], at: int, window: float = WINDOW) -> Optional[float]:
    """How far a run still fell late, a figure and no rule: 1 - best ppl up to ``at`` / best ppl up to
    (1 - window) * ``at``, the best so far, not the last validation (a stream's validation perplexity rises and falls
    with the position in the epoch); None when ``at`` was not validated or no validation comes early enough.
    ``valid``: (updates, loss in base 2, fairseq's), by updates."""
    if at not in dict(valid):
        return None
    earlier = [loss for u, loss in valid if u <= (1 - window) * at]
    if not earlier:
        return None
    return 1 - 2 ** (min(loss for u, loss in valid if u <= at) - min(earlier))


def _timestamp(line: str) -> Optional[datetime]:
    """The time a fairseq log line was written (its ``YYYY-MM-DD HH:MM:SS`` prefix), or None."""
    match = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", line)
    return datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S") if match else None


class Run:
    """One training run, or one point of it: its validation curve, wall-clock times, parameters and test score."""

    def __init__(self, directory: Path):
        self.directory = directory
        match = RUN_NAME.match(directory.name)
        if match is None:
            raise ValueError(f"{directory}: a run directory is named MODEL.sSEED")
        self.model, self.seed = match["model"], int(match["seed"])
        self.valid: List[tuple] = []  # (updates, loss)
        self.wall: Dict[int, float] = {}  # updates -> seconds since the start
        self.updates, self.seconds, self.schedule = 0, None, None
        point = directory / "point.json"
        cut = json.loads(point.read_text()) if point.is_file() else None
        log = directory / (cut["run"] if cut else ".") / "train.log"
        if not log.is_file():
            raise ValueError(f"{log} is missing: the run did not train")
        offset = last_wall = 0.0
        restart: Optional[datetime] = None
        for line in log.read_text(errors="replace").splitlines():
            scheduler = SCHEDULER.search(line)
            self.schedule = scheduler["name"] if scheduler else self.schedule
            entry = LOG_ENTRY.search(line)
            if entry:
                values = json.loads(entry["json"])
                if entry["kind"] == "train":  # an epoch's summary: train_num_updates, train_wall, ...
                    values = {key[len("train_") :]: value for key, value in values.items() if key.startswith("train_")}
                if entry["kind"] == "valid":
                    self.valid.append((int(values["valid_num_updates"]), float(values["valid_loss"])))
                elif "num_updates" in values:
                    self.updates = max(self.updates, int(values["num_updates"]))
                    if "wall" in values:
                        stamp = _timestamp(line)
                        if restart is None:
                            last_wall = float(values["wall"])
                        elif stamp is not None:
                            last_wall = offset + (stamp - restart).total_seconds()
                        self.wall[int(values["num_updates"])] = last_wall
            elif RESUMED.search(line):
                # a process that went on from a checkpoint (compare.sh -L, or a run stopped part way): fairseq's
                # clock restarts, or stays at 0, there, so its times are the log's timestamps from here on, after
                # the time trained before (the pause between the two is not training time)
                restart, offset = _timestamp(line), last_wall
            done = DONE.search(line)
            if done:
                self.seconds = float(done["seconds"])
        if self.seconds is None:
            raise ValueError(f"{log} has no 'done training' line: the run did not finish")
        if cut:
            self.updates, self.seconds = int(cut["updates"]), float(cut["seconds"])
            self.valid = [(u, loss) for u, loss in self.valid if u <= self.updates]
            self.wall = {u: t for u, t in self.wall.items() if u <= self.updates}
        self.params = dict(
            re.findall(
                r"^(DeFINE|context|input/output|total)\s+([\d.]+)M$", (directory / "params.txt").read_text(), re.M
            )
        )
        score = (directory / "score").read_text().split()
        if len(score) != 1:
            raise ValueError(f"{directory / 'score'}: expected one number, found {score!r}")
        self.score = float(score[0])

    def seconds_at(self, updates: int) -> Optional[float]:
        """Wall-clock seconds when ``updates`` were done (linear between the logged points)."""
        points = sorted(self.wall.items())
        for (u0, t0), (u1, t1) in zip(points, points[1:]):
            if u0 <= updates <= u1:
                return t0 + (t1 - t0) * (updates - u0) / max(u1 - u0, 1)
        return points[-1][1] if points and updates >= points[-1][0] else None


def load(out: Path, regime: str) -> List[Run]:
    """The scored runs of one regime (other runs may still be training, or another process filling the same OUT may
    still be scoring one: they are named and left out)."""
    root = out / "runs" / regime
    if not root.is_dir():
        return []
    chosen = [d for d in sorted(root.iterdir()) if d.is_dir()]
    unscored = [d for d in chosen if not (d / "score").is_file()]
    if unscored:
        print(f"left out, not scored yet: {', '.join(str(d) for d in unscored)}", file=sys.stderr)
    return [Run(d) for d in chosen if d not in unscored]


def summary(values: List[float], digits: int) -> str:
    mean = statistics.fmean(values)
    spread = f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else ""
    each = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"{mean:.{digits}f}{spread} ({each})"


REGIMES = {"updates": "equal updates", "time": "equal time", "long": "longer training"}


def table(runs: Dict[str, List[Run]], metric: str, order: List[str]) -> str:
    """One row per model: parameters, then per regime the metric, the training time and the updates done."""
    header = ["model", "parameters", "input/output", "DeFINE"]
    for regime in runs:
        header += [f"{metric}, {REGIMES[regime]}", "training time (s)", "updates"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model in order:
        per_regime = {
            regime: sorted((r for r in rs if r.model == model), key=lambda r: r.seed) for regime, rs in runs.items()
        }
        first = next((rs[0] for rs in per_regime.values() if rs), None)
        if first is None:
            continue
        p = first.params
        row = [f"`{model}`", f"{p.get('total', '?')}M", f"{p.get('input/output', '?')}M", f"{p.get('DeFINE', '?')}M"]
        for rs in per_regime.values():
            row += (
                [
                    summary([r.score for r in rs], 2),
                    f"{statistics.fmean(r.seconds for r in rs):.0f}",
                    "/".join(str(r.updates) for r in rs),
                ]
                if rs
                else ["-", "-", "-"]
            )
        lines.append("| " + " | ".join(row) + " |")
    seeds = sorted({r.seed for rs in runs.values() for r in rs})
    schedules = sorted({r.schedule for rs in runs.values() for r in rs if r.schedule})
    lines += [
        "",
        f"Seeds {', '.join(map(str, seeds))}: mean ± standard deviation over the seeds, each seed's value in "
        f"brackets (updates: per seed)."
        + (f" Learning rate: {'; '.join(schedule_label(s, long=True) for s in schedules)}." if schedules else ""),
    ]
    return "\n".join(lines)


def revision() -> str:
    """The checkout's commit, with ``+changes`` when tracked files differ from it; or 'not recorded'."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not recorded"
    return head + ("+changes" if dirty else "")


def machine(device: str) -> str:
    """The CPU's model and core count, and the device the runs trained on."""
    cpu = platform.processor() or platform.machine()
    try:
        names = re.findall(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores" + (f"; {device}" if device else "")


def records(runs: Dict[str, List[Run]], group: str, command: str, device: str) -> List[dict]:
    """One data record per scored point (render_results' format)."""
    where = {"command": command or "not recorded", "revision": revision(), "machine": machine(device)}
    found = []
    for regime, rs in runs.items():
        for r in rs:
            sizes = {key: float(value) for key, value in r.params.items()}
            late = gain(r.valid, r.updates)
            found.append(
                {
                    "group": group,
                    "model": r.model,
                    "point": regime,
                    "seed": r.seed,
                    "value": r.score,
                    "parameters": sizes,
                    "updates": r.updates,
                    "seconds": r.seconds,
                    **({} if late is None else {"late_gain": round(100 * late, 2)}),
                    **({"schedule": r.schedule} if r.schedule else {}),
                    **where,
                }
            )
    return found


def save_data(path: Path, metric: str, better: str, new: List[dict], points: Optional[List[dict]] = None) -> dict:
    """Merge ``new`` into the data file at ``path`` (created when missing, with ``points``, by default the compare
    scripts' regimes); call under ``locked(path)``."""
    data = (
        load_data(path)
        if path.is_file()
        else {
            "metric": metric,
            "better": better,
            "digits": 2,
            "runs": [],
            "points": points or [{"key": key, "label": f"{metric}, {label}"} for key, label in REGIMES.items()],
        }
    )
    data["runs"] = merge(data["runs"], new)
    write_atomic(path, json.dumps(data, indent=1) + "\n")
    return data


def plot(runs: List[Run], order: List[str], path: Path) -> None:
    plt = pyplot("--plot")
    figure, (by_updates, by_time) = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, model in enumerate(order):
        colour = colours[index % len(colours)]
        for number, run in enumerate(r for r in runs if r.model == model):
            label = model if number == 0 else None
            steps = [u for u, _ in run.valid]
            losses = [loss for _, loss in run.valid]
            by_updates.plot(steps, losses, color=colour, alpha=0.8, linewidth=1.2, label=label)
            minutes = [run.seconds_at(u) for u in steps]
            kept = [(m / 60, loss) for m, loss in zip(minutes, losses) if m is not None]
            by_time.plot(
                [m for m, _ in kept], [loss for _, loss in kept], color=colour, alpha=0.8, linewidth=1.2, label=label
            )
    for axis, xlabel in ((by_updates, "updates"), (by_time, "wall-clock minutes of training")):
        axis.set_xlabel(xlabel)
        axis.set_ylabel("validation loss (base 2)")
        axis.grid(alpha=0.3)
    by_updates.legend()
    figure.tight_layout()
    save(figure, path)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the comparison's output directory (with runs/updates, runs/time)")
    parser.add_argument("--metric", default="score", help="the name of the test metric in the table")
    parser.add_argument("--models", default=None, help="comma separated model names, in the table's order")
    parser.add_argument("--plot", type=Path, default=None, help="write the learning curves to this PNG")
    parser.add_argument(
        "--better",
        choices=("lower", "higher"),
        default=None,
        help="which way the metric improves (default: higher for BLEU, else lower)",
    )
    parser.add_argument("--data", type=Path, default=None, help="the data file (default: OUT/results.json)")
    parser.add_argument("--group", default="", help="the setting the runs share, in the data (e.g. the corpus)")
    parser.add_argument("--command", default="", help="the command that made the runs, kept in the data")
    parser.add_argument("--device", default="", help="the device and precision, kept in the data with the CPU")
    parser.add_argument("--report", type=Path, default=None, help="write the table here (atomically), not stdout")
    parser.add_argument("--note", default="", help="a line written under the table")
    args = parser.parse_args(argv)
    better = args.better or ("higher" if "bleu" in args.metric.lower() else "lower")
    data_path = args.data or args.out / "results.json"
    models = args.models.split(",") if args.models else []
    with locked(data_path):  # one writer at a time reads the runs on disk, merges the data, writes the report
        try:
            runs = {regime: load(args.out, regime) for regime in REGIMES}
        except (OSError, ValueError) as error:
            raise SystemExit(f"error: {error}") from None
        runs = {regime: rs for regime, rs in runs.items() if rs}
        if not runs:
            raise SystemExit(f"error: {args.out / 'runs'} holds no finished run (runs/updates or runs/time)")
        found = sorted({r.model for rs in runs.values() for r in rs})
        order = [m for m in models if m in found] + [m for m in found if m not in models]
        try:
            save_data(data_path, args.metric, better, records(runs, args.group, args.command, args.device))
        except ValueError as error:
            raise SystemExit(f"error: {error}") from None
        report = table(runs, args.metric, order) + (f"\n\n{args.note}" if args.note else "") + "\n"
        if args.report:
            write_atomic(args.report, report)
    sys.stdout.write(report)
    if args.plot is not None:
        longest = {}
        for run in (r for rs in runs.values() for r in rs):
            if run.updates > getattr(longest.get((run.model, run.seed)), "updates", -1):
                longest[run.model, run.seed] = run
        plot(sorted(longest.values(), key=lambda r: r.seed), order, args.plot)


if __name__ == "__main__":
    main()
