"""Speed figures as data: one record per figure, in a ``.json`` file beside each Markdown report of ``results/``.

A benchmark writes its records itself (``Bench.finish``, :func:`record`) and prints each as a ``FIGURE`` line
(:func:`figure_line`) that ``make gpu-round`` reads back (:func:`parse_figures`); for the reports committed before
it did, this module reads them back from the Markdown (the header's command, revision, machine and precision; the
figures of the ``Targets`` lines, of the ``gpu_report`` summary table and of the columns that give a ratio of
medians or a median step time)::

    python -m benchmarks.records           # rewrite results/<report>.json from results/<report>.md
    python -m benchmarks.records --check   # exit 1, naming each .json that differs from its report

Every ratio is a ratio of medians (:data:`benchmarks.targets.RATIO_METHOD`); a figure whose report gives only
another (the median of per-round ratios) says so in ``ratio_method``. A target comes from
:data:`benchmarks.targets.GOALS` where the figure is a goal's; the target the report printed is kept beside it.
A report that does not record its revision gives ``"revision": null``. Every ``.json`` of a speed report in
``results/`` is a list of records with the fields :data:`FIELDS`; a gpu round's records add :data:`ROUND_FIELDS`.
"""

import argparse
import json
import re
import sys
from pathlib import Path
from typing import List, Optional

from benchmarks.targets import ABSOLUTE_METHOD, GOALS, RATIO_METHOD, define_train_goal, goal_of

RESULTS = Path(__file__).resolve().parent / "results"
# reports that are not speed figures of a benchmark run, or whose .json their benchmark writes in its own form
NOT_RECORDS = {"data_parallel.md", "launch_count.md", "translation-corpora.md"}
PER_ROUND = "median of per-round ratios (the report gives no ratio of medians for this figure)"
FIELDS = ("benchmark", "what", "value", "unit", "target", "at_most", "goal", "met", "ratio_method", "report_target")
FIELDS += ("revision", "machine", "precision", "batch", "command", "report", "origin")
# ``origin``: "run" for the records a benchmark wrote as it ran, "report" for those read back from its Markdown
# a gpu round's records also name the round's item that measured them, its status ("measured", "failed", "skipped" or
# pytest's summary), its exit status and its seconds: a failed item is a record with no value
ROUND_FIELDS = ("item", "status", "rc", "seconds")
FIGURE_PREFIX = "FIGURE "


def record(
    benchmark: str, what: str, value: Optional[float], unit: str, target=None, at_most=False, gpu=None, **context
):
    """One figure as a record: ``target`` is the goal's (:data:`GOALS`, on a GPU or not: ``gpu``, else as the
    machine's name says) where ``what`` is a goal's figure, else ``target``; ``report_target`` keeps ``target``."""
    goal = context.pop("goal", None)
    goal = goal_of(what) if goal is None else goal  # None: the goal whose pattern finds ``what``; "": none
    gpu = "CPU" not in (context.get("machine") or "CPU") if gpu is None else gpu
    chosen = target
    if goal:
        goal_target = GOALS[goal].gpu if gpu else GOALS[goal].cpu
        chosen = goal_target if goal_target is not None else target
    value = None if value is None or value != value else value
    met = None if value is None or chosen is None else (value <= chosen if at_most else value >= chosen)
    method = context.pop("ratio_method", None) or {"x": RATIO_METHOD, "ms": "median"}.get(unit, ABSOLUTE_METHOD)
    out = dict(benchmark=benchmark, what=what, value=value, unit=unit, target=chosen, at_most=at_most, goal=goal)
    out.update(met=met, ratio_method=method, report_target=target)
    out.update({k: context.get(k) for k in FIELDS if k not in out})
    return out


def of_checks(checks, benchmark: str, report: str, context: dict, gpu: bool) -> List[dict]:
    """The records of a run's checks (:class:`benchmarks.targets.Check`) on a GPU or not; ``context``: the run's
    command, revision, precision and machine; ``report``: its results file under ``results/`` (None: none)."""
    context = dict(context, report=report, origin="run")
    context = {k: v for k, v in context.items() if k in FIELDS}
    return [
        record(
            benchmark,
            c.what,
            c.value,
            c.unit,
            c.target,
            c.at_most,
            goal=goal_of(c.what, c.goal),
            batch=c.batch or None,
            gpu=gpu,
            **context,
        )  # fmt: skip
        for c in checks
    ]


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


def header(text: str) -> dict:
    """Command, revision, machine and precision from a report's header (the lines before its first table)."""
    head = text.split("\n|", 1)[0]
    command = re.search(r"^- Command: `([^`]*)`", head, re.M)
    rev = re.search(r"^- Command: `[^`]*`; revision (\S+)", head, re.M) or re.search(r"at revision (\w+)", head)
    gpu = re.search(r"^- GPU: (.+?) \(", head, re.M) or re.search(r"^# Benchmarks on (.+?): figures", head, re.M)
    cpu = re.search(r"^- Machine: (\d+-core CPU, [^,]+)", head, re.M)
    precision = re.search(r"Python [\d.]+, (float32|bf16|fp16)", text)
    return dict(
        command=command.group(1) if command else None,
        revision=rev.group(1) if rev else None,
        machine=gpu.group(1) if gpu else cpu.group(1) if cpu else None,
        precision=("fp32" if precision.group(1) == "float32" else precision.group(1)) if precision else None,
        batch=(re.search(r"^- Batch[^:]*: (.+)$", head, re.M) or [None, None])[1],
    )


CHECK = re.compile(
    r"^- (?:PASS|FAIL|n/a)(?P<qual>[^:]*): (?P<what>.+?): "
    r"(?:\w+/\w+ = (?P<over>[\d.]+)$|(?P<value>[\d.,]+|n/a) ?(?P<unit>x|×|tokens/s))"
    r"(?: \((?P<paren>[^)]*)\))?",
    re.M,
)


def check_record(match, benchmark: str, context: dict) -> dict:
    what, paren = match.group("what"), match.group("paren") or ""
    qual = match.group("qual").strip()
    bound = re.search(r"target (>=|<=) ([\d.,]+)", paren) or re.search(r"(>=|<=) ([\d.,]+)x", what)
    # "(median of per-round ratios 1.33x)" gives a second estimate beside a ratio of medians; without a number the
    # figure itself is the median of per-round ratios
    method = PER_ROUND if re.fullmatch(r"median of per-round ratios", paren.strip()) else None
    value = match.group("over") or match.group("value")  # older reports: "what: dense/GroupLinear = 2.80"
    value = None if value == "n/a" else float(value.replace(",", ""))
    unit = "x" if match.group("unit") in ("x", "×", None) else match.group("unit")
    what = re.sub(r"(>=|<=) [\d.,]+x (faster than )?", "vs ", what)  # the target is a field of its own
    if qual.startswith("(") and qual.endswith(")"):  # one pair: the qualifier may end in a parenthesis of its own
        qual = qual[1:-1]
    return record(
        benchmark,
        f"{what} ({qual})" if qual else what,
        value,
        unit,
        float(bound.group(2).replace(",", "")) if bound else None,
        at_most=bool(bound) and bound.group(1) == "<=",
        ratio_method=method,
        **context,
    )


def table_records(text: str, benchmark: str, context: dict) -> List[dict]:
    """A record per row and figure of each table of models or shapes: its ``vs X (ratio of medians)``, ``X /
    GroupLinear`` (a ratio of medians too), ``step ms (median)``, ``batch ms (median)`` and ``X ms`` cells."""
    out, goal = [], ""
    tokens = re.search(r"(\d+) target tokens", context.get("batch") or "")
    tokens = int(tokens.group(1)) if tokens and benchmark == "train_speed" else None
    for block in re.findall(r"((?:^\|.*\|\n)+)", text, re.M):
        lines = block.strip("\n").split("\n")
        cols = [c.strip() for c in lines[0].strip("|").split("|")]
        if cols[0] not in ("model", "arch", "shape", "regime") or cols[0] == "regime" and cols[1] != "model":
            continue
        keys = 2 if cols[0] == "regime" else 1  # a regime's rows name their model in the second column
        regime = ""
        for line in lines[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            regime = cells[0] or regime  # a regime's first row names it, the rows after leave it empty
            row = cells[keys - 1].replace("`", "").strip("*") + (f", {regime}" if keys == 2 else "")
            for col, cell in zip(cols[keys:], cells[keys:]):
                vs, over = re.match(r"vs (.+) \(ratio of medians\)$", col), re.match(r"(\w+) / (\w+)$", col)
                timed = re.match(r"(step|batch) ms \(median\)$|ms per (batch) \(median\)$", col)
                timed = timed or re.match(r"(\w+) ms$", col)
                if vs and cell.endswith("x") and not row.split(",")[0].endswith(vs.group(1)):
                    what, unit, value = f"{row} vs {vs.group(1)}", "x", number(cell[:-1])
                    goal = define_train_goal(tokens) if what == "transformer_define vs transformer" else None
                elif over and cell.endswith("x"):
                    what, unit, value = f"{over.group(2)} vs {over.group(1)} at {row}", "x", number(cell[:-1])
                    goal = None  # a goal's pattern finds its figure
                elif timed and cols[0] != "shape":
                    what, unit, value = f"{row} {timed.group(1) or timed.group(2)}", "ms", number(cell)
                elif timed:
                    what, unit, value = f"{timed.group(1)} at {row}", "ms", number(cell)
                else:
                    continue
                out.append(record(benchmark, what, value, unit, **context, goal=goal if unit == "x" else ""))
    return out


def number(cell: str) -> Optional[float]:
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return None


def summary_records(text: str, context: dict) -> List[dict]:
    """The figures of a ``gpu_report`` summary table (benchmark | figure | measured | target | met)."""
    out = []
    for m in re.finditer(r"^\| `([\w ,=.-]+)` \| (.+?) \| ([\d.,]+)(x| tokens/s) \| (>=|<=) ([\d.,]+)", text, re.M):
        bench, what, value, unit, sign, bound = m.groups()
        bench = bench.split(",")[0].split(" ")[0]
        out.append(record(bench, what, number(value), unit.strip(), number(bound.rstrip("x")), sign == "<=", **context))
    return out


def from_report(md: Path) -> List[dict]:
    """The records of one committed Markdown report."""
    text = md.read_text()
    context = dict(header(text), report=f"results/{md.name}", origin="report")
    if md.name.startswith("gpu-") and "| benchmark | figure |" in text:
        records = summary_records(text, context)
        for section in text.split("\n## ")[1:]:
            name = re.search(r"^- Command: `[^`]*benchmarks\.(\w+)", section, re.M)
            batch = header(section)["batch"]
            records += table_records(section, name.group(1), dict(context, batch=batch)) if name else []
        return records
    benchmark = re.sub(r"(-tcmalloc.*|-nvidia.*)$", "", md.stem)
    records = table_records(text, benchmark, context)
    records += [check_record(m, benchmark, context) for m in CHECK.finditer(text)]
    return records


def written_by_run(md: Path) -> bool:
    try:
        records = json.loads(json_path(md).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(records, list) and any(r.get("origin") == "run" for r in records)


def reports() -> List[Path]:
    """The reports whose records are read from their Markdown: not those whose benchmark wrote its own."""
    own = {p.name for p in RESULTS.glob("gpu-round-*.md")}  # gpu_round writes its own records
    return [p for p in sorted(RESULTS.glob("*.md")) if p.name not in NOT_RECORDS | own and not written_by_run(p)]


def load(report: str) -> List[dict]:
    """The records of ``report`` (a path under ``results/``, ``.md`` or ``.json``)."""
    path = RESULTS / Path(report).name
    try:
        return json.loads(json_path(path.with_suffix(".md")).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: {error}; write it with python -m benchmarks.records") from error


def stale() -> List[str]:
    """The ``.json`` files that differ from what their reports give."""
    out = []
    for md in reports():
        path = json_path(md)
        if not path.exists() or json.loads(path.read_text()) != from_report(md):
            out.append(str(path.relative_to(RESULTS.parent.parent)))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a .json differs from its report")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        for name in names:
            print(f"{name} differs from its report; run python -m benchmarks.records")
        return 1 if names else 0
    for md in reports():
        write(json_path(md), from_report(md))
        print(f"wrote {json_path(md).relative_to(RESULTS.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
