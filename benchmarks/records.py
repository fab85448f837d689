"""The pages' speed tables rendered from the records::

    python -m benchmarks.records           # rewrite every page's speed tables from the records
    python -m benchmarks.records --check   # exit 1, naming each table that differs from its data

A benchmark writes its records itself (``Bench.finish``: ``results/<report>.json`` beside its report); those of the
reports committed before it did were converted once from their Markdown (``"origin": "report"``), with the targets
that ``targets.GOALS`` then gave, as a run's records keep those of its day. A page's table (:data:`PAGES`) lies between
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``: the goals, the launches per step, the data-parallel step on
paper, the figures of :data:`FIGURES`, or those a benchmark of ``targets.BENCHMARKS`` states against a target.
"""

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import List, NamedTuple, Tuple

from benchmarks import targets
from benchmarks.targets import RATIO_METHOD, json_path, show, show_target, table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "benchmarks" / "README.md"
PAGES = ("benchmarks/README.md", "README.md", "docs/*.md", "examples/*/README.md")
BLOCK = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.S)


def load_json(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: {error}; write it with the benchmark that owns it (benchmarks/README.md)") from error


def load(report: str) -> List[dict]:
    """The records of ``report`` (a path under ``results/``, ``.md`` or ``.json``)."""
    return load_json(json_path((RESULTS / Path(report).name).with_suffix(".md")))


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
TRANSLATION = GPU_REPORTS + H200_RUNS + TOKEN_PATHS[:1] + FP16_RUN + TOKEN_PATHS[1:]
GROUP_LINEAR = GPU_REPORTS + ("group_linear-nvidia-h200-fp16.md",)
FIGURES = {
    "gpu-goals": Figures(GPU_REPORTS, r"^(?!.* (at|step)$)(?!.* at [a-z0-9_ >-]+, \d groups$)(?!.* at transformer)"),
    "gpu-translation": Figures(TRANSLATION, r"^transformer_define vs transformer$"),
    "gpu-token-paths": Figures(TOKEN_PATHS + FP16_RUN, r" vs transformer$"),
    # ratios only: a reader compares GroupLinear with the other paths, not their milliseconds
    "gpu-group-linear": Figures(GROUP_LINEAR, r"^GroupLinear vs \w+ at 1024 -> 2048, 4 groups$"),
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
            value = show(float("nan") if r["value"] is None else r["value"], r["unit"])
            value = f"{r['value']:g} ms" if r["unit"] == "ms" else value
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
    parser.add_argument("--check", action="store_true", help="exit 1 when a table differs from its data")
    args = parser.parse_args(argv)
    if args.check:
        stale = [f"{p.relative_to(ROOT)}: bench:{name}" for p in pages() for name in stale_tables(p)]
        print("\n".join(f"{t} differs from its data; run python -m benchmarks.records" for t in stale) or "no drift")
        return 1 if stale else 0
    for page in pages():
        text = page.read_text()
        fresh = render(text, page)
        if fresh != text:  # a page whose tables hold is left untouched
            page.write_text(fresh)
        print(f"{page.relative_to(ROOT)}: rendered {', '.join(m.group('name') for m in BLOCK.finditer(fresh))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
