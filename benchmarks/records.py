"""The speed figures as data, and the pages' speed tables rendered from them::

    python -m benchmarks.records           # rewrite results/<report>.json from each report, then the pages' tables
    python -m benchmarks.records --check   # exit 1, naming each .json and each table that differs from its data

A benchmark writes its records itself (``Bench.finish``); those of the reports committed before it did are read back
from the Markdown (the header, the ``Targets`` lines, a ``gpu_report`` summary, the columns of ratios of medians and
median step times), a goal's target being that of ``targets.GOALS``. A page's table (:data:`PAGES`) lies between
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``: the goals, the launches per step, the data-parallel step on
paper, the figures of :data:`FIGURES`, or those a benchmark of ``targets.BENCHMARKS`` states against a target.
"""

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import List, NamedTuple, Optional, Tuple

from benchmarks import targets
from benchmarks.targets import RATIO_METHOD, json_path, record, show, show_target, table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "benchmarks" / "README.md"
PAGES = ("benchmarks/README.md", "README.md", "docs/*.md", "examples/*/README.md")
BLOCK = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.S)
# reports that are not speed figures of a benchmark run, or whose .json their benchmark writes in its own form
NOT_RECORDS = {"data_parallel.md", "launch_count.md", "translation-corpora.md"}
PER_ROUND = "median of per-round ratios (the report gives no ratio of medians for this figure)"


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
    what, paren, qual = match.group("what"), match.group("paren") or "", match.group("qual").strip()
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
    target = float(bound.group(2).replace(",", "")) if bound else None
    at_most = bool(bound) and bound.group(1) == "<="
    what = f"{what} ({qual})" if qual else what
    return record(benchmark, what, value, unit, target, at_most=at_most, ratio_method=method, **context)


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
        keys, regime = 2 if cols[0] == "regime" else 1, ""  # a regime's rows name their model in the second column
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
                    goal = targets.define_train_goal(tokens) if what == "transformer_define vs transformer" else None
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
    return table_records(text, benchmark, context) + [check_record(m, benchmark, context) for m in CHECK.finditer(text)]


def reports() -> List[Path]:
    """The reports whose records are read from their Markdown: not those whose benchmark wrote its own."""

    def written_by_run(md: Path) -> bool:
        try:
            records = json.loads(json_path(md).read_text())
        except (OSError, json.JSONDecodeError):
            return False
        return isinstance(records, list) and any(r.get("origin") == "run" for r in records)

    own = {p.name for p in RESULTS.glob("gpu-round-*.md")}  # gpu_round writes its own records
    return [p for p in sorted(RESULTS.glob("*.md")) if p.name not in NOT_RECORDS | own and not written_by_run(p)]


def load_json(path: Path, how: str = "the benchmark that owns it (benchmarks/README.md)"):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: {error}; write it with {how}") from error


def load(report: str) -> List[dict]:
    """The records of ``report`` (a path under ``results/``, ``.md`` or ``.json``)."""
    return load_json(json_path((RESULTS / Path(report).name).with_suffix(".md")), "python -m benchmarks.records")


def stale_records() -> List[str]:
    """The ``.json`` files that differ from what their reports give."""

    def differs(md: Path) -> bool:
        return not json_path(md).exists() or json.loads(json_path(md).read_text()) != from_report(md)

    return [str(json_path(md).relative_to(ROOT)) for md in reports() if differs(md)]


# ---- the pages' tables


def targets_table() -> str:
    rows = []
    for key, goal in targets.GOALS.items():
        on = [show_target(t, goal.unit, goal.at_most) if t is not None else "-" for t in (goal.gpu, goal.cpu)]
        rows.append((f"`{key}`", goal.what, *on))
    note = f"Ratios: {RATIO_METHOD} (the baseline's median step time over the variant's, timed interleaved).\n\n"
    return note + table(("goal", "what", "GPU target", "CPU target"), rows)


def launch_count_table(path: Path = RESULTS / "launch_count.json") -> str:
    records, rows = load_json(path), {}
    for r in records:
        row = rows.setdefault((r["model"], r["mode"]), {"goal": r.get("goal") or ""})
        kind = "syncs" if r["unit"].startswith("syncs") else "launches"
        row[kind], row["per"] = f"{r['value']:g}", r["unit"].split(" per ", 1)[-1]
    revisions = sorted({r["revision"] for r in records})
    machines = sorted({f"{r['machine']}, torch {r['torch']}" for r in records})
    body = [(f"`{m}`", mode, r.get("launches", "-"), r.get("syncs", "-"), r["per"], r["goal"]) for (m, mode), r in
            rows.items()]  # fmt: skip
    note = (
        f"From [results/launch_count.json](results/launch_count.json) (`{records[0]['command']}`; revision "
        f"{', '.join(revisions)}; {'; '.join(machines)}). Counts, not times: the same on any CPU and thread count.\n\n"
    )
    return note + table(("model", "mode", "launches", "syncs", "per", "goal"), body)


# the data-parallel columns: (GPUs, link, overlapped with backward)
DP_COLUMNS = ((1, "", False), (8, "NVLink", False), (8, "PCIe 5", False), (8, "PCIe 5", True), (4, "PCIe 3", False))


def data_parallel_table(path: Path = RESULTS / "data_parallel.json") -> str:
    data, groups = load_json(path), {}
    for f in data["figures"]:
        key = (f["pair"], f["input"]["file"], f["gpu"], f["precision"], f["input"]["batch"])
        groups.setdefault(key, {})[f["gpus"], f["link"], f["overlap"]] = f["ratio"]
    header = ["pair", "measured step (file)"]
    header += ["1 GPU" if n == 1 else f"{n} x {link}" + (", overlapped" if o else "") for n, link, o in DP_COLUMNS]
    rows = []
    for (pair, file, gpu, precision, batch), ratios in groups.items():
        cells = [f"{ratios[c]:.2f}x" if c in ratios else "-" for c in DP_COLUMNS]
        batch = batch.split(";")[0].replace("Batch (fixed): ", "")
        rows.append((pair, f"{gpu}, {precision}, {batch} ([{Path(file).name}](results/{Path(file).name}))", *cells))
    note = (
        "DeFINE's expected step against its baseline's (above 1: DeFINE faster) from "
        f"[results/data_parallel.json](results/data_parallel.json) (`{data['command']}`): a model on paper, from the "
        "measured single-GPU steps and each arch's gradient bytes; its assumptions are in "
        "[results/data_parallel.md](results/data_parallel.md).\n\n"
    )
    paper = data["paper"]
    explained = " or ".join(f"{r['explained']:.0%} ({r['traffic']})" for r in paper["rows"])
    rest = " or ".join(f"{r['rest_ratio']:.2f}x" for r in paper["rows"])
    (base, _, base_ms), (define, _, define_ms) = paper["baseline"], paper["define"]
    after = (
        f"\nThe paper's setting ({paper['source']}): {base}, {base_ms:g} ms a step; {define}, {define_ms:g} ms: "
        f"{base_ms / define_ms:.2f}x. Gradient traffic on its link explains {explained} of the difference; what is "
        f"left is still {rest} in DeFINE's favour, so on paper the paper's gain is mostly its context network's, not "
        "the all-reduce's.\n"
    )
    return note + table(header, rows) + after


class Figures(NamedTuple):
    """A table of measured figures: the records of ``reports`` (names under ``results/``) whose text ``pattern``
    finds, in the reports' order; ``targeted``: only those the report stated against a target. ``bounds``: rows
    ``(label, a, b)`` of the ratio of two of a report's median times, ``a / b``, where the report has both."""

    reports: Tuple[str, ...]
    pattern: str
    targeted: bool = False
    bounds: Tuple[Tuple[str, str, str], ...] = ()


GPU_REPORTS = ("gpu-nvidia-h100-80gb-hbm3.md", "gpu-nvidia-h200.md")
H200_RUNS = ("train_speed-nvidia-h200-4k-tokens.md", "train_speed-nvidia-h200-26k-tokens.md")
TOKEN_PATHS = tuple(f"train_speed-nvidia-h200-{r}.md" for r in ("4k-tokens-token-paths", "26k-tokens-token-paths"))
FP16_RUN = ("train_speed-nvidia-h200-4k-tokens-fp16.md",)
CPU_LATEST = ("train_speed-tcmalloc.md", "generate_speed.md", "lstm_lm_speed-tcmalloc.md", "txl_speed-tcmalloc.md")
CPU_LATEST += ("mogrifier_speed.md", "gcnn_speed.md", "group_linear.md")
# the context network is the same in both Transformer-XL models: the standard step over it alone is the most that any
# input and output layer could gain in training
TXL_BOUND = "bound on any input layer's training gain: standard 384 step over the context network alone's"
TXL_BOUND = (TXL_BOUND, "transformer_xl_wt103_d384 step", "context network alone (same in both) step")
FIGURES = {
    "gpu-goals": Figures(GPU_REPORTS, r"^(?!.* (at|step)$)(?!.* at [a-z0-9_ >-]+, \d groups$)(?!.* at transformer)"),
    "gpu-translation": Figures(
        GPU_REPORTS + H200_RUNS + TOKEN_PATHS[:1] + FP16_RUN + TOKEN_PATHS[1:], r"^transformer_define vs transformer$"
    ),
    "gpu-token-paths": Figures(TOKEN_PATHS + FP16_RUN, r" vs transformer$"),
    # ratios only: a reader compares GroupLinear with the other paths, not their milliseconds
    "gpu-group-linear": Figures(
        GPU_REPORTS + ("group_linear-nvidia-h200-fp16.md",), r"^GroupLinear vs \w+ at 1024 -> 2048, 4 groups$"
    ),
    "cpu-latest": Figures(CPU_LATEST, r" vs ", targeted=True),
    "gcnn": Figures(("gcnn_speed.md",) + GPU_REPORTS, r"^gcnn_lm_14 (tokens/s )?vs fconv", targeted=True),
    "mogrifier": Figures(("mogrifier_speed.md",) + GPU_REPORTS, r"MogrifierLSTM|mogrifier_lstm_lm_ptb", targeted=True),
    "txl": Figures(
        ("txl_speed-tcmalloc.md",) + GPU_REPORTS, r"(wt103_n128|DeFINE n=128).* vs standard 384", bounds=(TXL_BOUND,)
    ),
    "lstm-lm": Figures(
        ("lstm_lm_speed-tcmalloc.md",) + GPU_REPORTS, r"^(R3|lstm_lm_define .*vs|its 3 LSTM layers alone.* vs )"
    ),
}


def figures_table(spec: Figures, page: Path) -> str:
    rows = []
    for report in spec.reports:
        link = f"[{report}]({os.path.relpath(RESULTS / report, page.parent)})"
        found = load(report)
        for r in found:
            if not re.search(spec.pattern, r["what"]) or spec.targeted and r["report_target"] is None:
                continue
            value = (
                f"{r['value']:g} ms"
                if r["unit"] == "ms"
                else show(float("nan") if r["value"] is None else r["value"], r["unit"])
            )
            if r["unit"] == "x" and r["ratio_method"] != RATIO_METHOD:
                value += " (median of per-round ratios)"
            target = "-" if r["target"] is None else show_target(r["target"], r["unit"], r["at_most"])
            met = "-" if r["met"] is None else "yes" if r["met"] else "**no**"
            tokens = re.search(r"([\d,]+) target tokens", r["batch"] or "")
            batch = f"{int(tokens.group(1).replace(',', '')):,} target tokens" if tokens else ""
            machine = f"{r['machine']}, {r['precision']}"
            rows.append((r["what"], batch, value, target, met, link, machine, r["revision"] or "revision not recorded"))
        times = {r["what"]: r for r in found if r["unit"] == "ms"}
        for label, a, b in spec.bounds:
            if a in times and b in times:
                r, value = times[a], show(times[a]["value"] / times[b]["value"], "x")
                machine = f"{r['machine']}, {r['precision']}"
                rows.append((label, "", value, "-", "-", link, machine, r["revision"] or "revision not recorded"))
    if not rows:
        raise ValueError(f"no record of {', '.join(spec.reports)} matches {spec.pattern!r}")
    header = ["figure", "batch", "measured", "target", "met", "report", "machine, precision", "revision"]
    if not any(row[1] for row in rows):  # a batch column only where a report names its batch's tokens
        header, rows = header[:1] + header[2:], [row[:1] + row[2:] for row in rows]
    note = (
        f"Rendered from the records beside each report (`python -m benchmarks.records`); ratios: {RATIO_METHOD} "
        "unless the figure says otherwise; targets from [targets.py]"
        f"({os.path.relpath(ROOT / 'benchmarks' / 'targets.py', page.parent)}) where the figure is a goal's.\n\n"
    )
    return note + table(header, rows)


def benchmark_table(name: str, page: Path) -> str:
    """The figures that benchmark ``name``'s reports (``results/<name>.md``, ``<name>-*.md``) state against a target."""
    reports = sorted(p.name for pattern in (f"{name}.md", f"{name}-*.md") for p in RESULTS.glob(pattern))
    if not reports:
        raise ValueError(f"{page}: bench:{name}: no results/{name}.md yet; run python -m benchmarks.{name}")
    return figures_table(Figures(tuple(reports), "", targeted=True), page)


RENDERERS = {
    "targets": lambda page: targets_table(),
    "launch_count": lambda page: launch_count_table(),
    "data_parallel": lambda page: data_parallel_table(),
}
RENDERERS.update({name: (lambda page, spec=spec: figures_table(spec, page)) for name, spec in FIGURES.items()})


def render(text: str, page: Path = PAGE) -> str:
    """``text`` with each table rendered afresh; ``page``: where it lies (its links are relative to it)."""

    def one(match):
        name = match.group("name")
        if name in targets.BENCHMARKS and name not in RENDERERS:
            return match.group(1) + benchmark_table(name, page) + match.group(4)
        if name not in RENDERERS:
            raise ValueError(f"{page}: a table named {name!r}; the names are {', '.join(RENDERERS)} or a benchmark's")
        return match.group(1) + RENDERERS[name](page) + match.group(4)

    return BLOCK.sub(one, text)


def stale_tables(page: Path = PAGE, at: Path = None) -> list:
    """The names of the tables of ``page`` that differ from their data (its links as if it lay at ``at``)."""
    text = Path(page).read_text()
    old = {m.group("name"): m.group("body") for m in BLOCK.finditer(text)}
    new = {m.group("name"): m.group("body") for m in BLOCK.finditer(render(text, Path(at or page)))}
    return [name for name in old if old[name] != new[name]]


def pages() -> list:
    """The pages that hold at least one table."""
    found = sorted({p for pattern in PAGES for p in ROOT.glob(pattern)})
    return [p for p in found if BLOCK.search(p.read_text())]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a .json or a table differs from its data")
    args = parser.parse_args(argv)
    if args.check:
        stale = [f"{name} differs from its report" for name in stale_records()]
        for page in pages():
            stale += [f"{page.relative_to(ROOT)}: bench:{name} differs from its data" for name in stale_tables(page)]
        print("\n".join(f"{line}; run python -m benchmarks.records" for line in stale) or "no drift")
        return 1 if stale else 0
    for md in reports():
        targets.write(json_path(md), from_report(md))
        print(f"wrote {json_path(md).relative_to(ROOT)}")
    for page in pages():
        text = page.read_text()
        fresh = render(text, page)
        if fresh != text:  # a page whose tables hold is left untouched
            page.write_text(fresh)
        print(f"{page.relative_to(ROOT)}: rendered {', '.join(m.group('name') for m in BLOCK.finditer(fresh))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
