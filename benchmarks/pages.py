"""The speed tables of the pages (:data:`PAGES`), rendered from data: the goals (:data:`benchmarks.targets.GOALS`), the
launches per step (``results/launch_count.json``), the data-parallel step on paper (``results/data_parallel.json``)
and the measured figures (:data:`FIGURES`, from the records beside each report: ``benchmarks.records``)::

    python -m benchmarks.pages            # rewrite the tables between their markers, on every page
    python -m benchmarks.pages --check    # exit 1, naming each table that differs from its data

A table lies between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``, on any page; ``make results`` runs this
beside the comparison tables' renderer, and ``tests/tools/test_benchmark_pages.py`` fails when a committed table
differs.
"""

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import NamedTuple, Tuple

from benchmarks import records
from benchmarks.targets import GOALS, RATIO_METHOD, show, show_target

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "benchmarks" / "README.md"
PAGES = ("benchmarks/README.md", "README.md", "docs/*.md", "examples/*/README.md")
RESULTS = ROOT / "benchmarks" / "results"
BLOCK = re.compile(r"(<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.S)
# the data-parallel columns: (GPUs, link, overlapped with backward)
DP_COLUMNS = ((1, "", False), (8, "NVLink", False), (8, "PCIe 5", False), (8, "PCIe 5", True), (4, "PCIe 3", False))


def load(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: {error}; write it with the benchmark that owns it (benchmarks/README.md)")


def table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]) + "\n"


def targets_table() -> str:
    rows = []
    for key, goal in GOALS.items():
        on = [show_target(t, goal.unit, goal.at_most) if t is not None else "-" for t in (goal.gpu, goal.cpu)]
        rows.append((f"`{key}`", goal.what, *on))
    note = f"Ratios: {RATIO_METHOD} (the baseline's median step time over the variant's, timed interleaved).\n\n"
    return note + table(("goal", "what", "GPU target", "CPU target"), rows)


def launch_count_table(path: Path = RESULTS / "launch_count.json") -> str:
    records = load(path)
    rows, order = {}, []
    for r in records:
        key = (r["model"], r["mode"])
        if key not in rows:
            rows[key], _ = {"goal": r.get("goal") or ""}, order.append(key)
        kind = "syncs" if r["unit"].startswith("syncs") else "launches"
        rows[key][kind], rows[key]["per"] = f"{r['value']:g}", r["unit"].split(" per ", 1)[-1]
    revisions = sorted({r["revision"] for r in records})
    machines = sorted({f"{r['machine']}, torch {r['torch']}" for r in records})
    body = [(f"`{m}`", mode, rows[m, mode].get("launches", "-"), rows[m, mode].get("syncs", "-"), rows[m, mode]["per"],
             rows[m, mode]["goal"] or "") for m, mode in order]  # fmt: skip
    note = (
        f"From [results/launch_count.json](results/launch_count.json) (`{records[0]['command']}`; revision "
        f"{', '.join(revisions)}; {'; '.join(machines)}). Counts, not times: the same on any CPU and thread count.\n\n"
    )
    return note + table(("model", "mode", "launches", "syncs", "per", "goal"), body)


def data_parallel_table(path: Path = RESULTS / "data_parallel.json") -> str:
    data = load(path)
    groups, order = {}, []
    for f in data["figures"]:
        key = (f["pair"], f["input"]["file"], f["gpu"], f["precision"], f["input"]["batch"])
        if key not in groups:
            groups[key], _ = {}, order.append(key)
        groups[key][f["gpus"], f["link"], f["overlap"]] = f["ratio"]
    header = ["pair", "measured step (file)"]
    header += ["1 GPU" if n == 1 else f"{n} x {link}" + (", overlapped" if o else "") for n, link, o in DP_COLUMNS]
    rows = []
    for pair, file, gpu, precision, batch in order:
        cells = [f"{groups[pair, file, gpu, precision, batch][c]:.2f}x" if c in groups[pair, file, gpu, precision,
                 batch] else "-" for c in DP_COLUMNS]  # fmt: skip
        batch = batch.split(";")[0].replace("Batch (fixed): ", "")
        measured = f"{gpu}, {precision}, {batch} ([{Path(file).name}](results/{Path(file).name}))"
        rows.append((pair, measured, *cells))
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
        ("txl_speed-tcmalloc.md",) + GPU_REPORTS,
        r"(wt103_n128|DeFINE n=128).* vs standard 384",
        # the context network is the same in both models: the standard step over it alone is the most that any
        # input and output layer could gain in training
        bounds=(
            (
                "bound on any input layer's training gain: standard 384 step over the context network alone's",
                "transformer_xl_wt103_d384 step",
                "context network alone (same in both) step",
            ),
        ),
    ),
    "lstm-lm": Figures(
        ("lstm_lm_speed-tcmalloc.md",) + GPU_REPORTS,
        r"^(R3|lstm_lm_define .*vs|its 3 LSTM layers alone.* vs )",
    ),
}


def figures_table(spec: Figures, page: Path) -> str:
    rows = []
    for report in spec.reports:
        link = f"[{report}]({os.path.relpath(RESULTS / report, page.parent)})"
        found = records.load(report)
        for r in found:
            if not re.search(spec.pattern, r["what"]) or spec.targeted and r["report_target"] is None:
                continue
            value = show(float("nan") if r["value"] is None else r["value"], r["unit"]) if r["unit"] != "ms" else \
                f"{r['value']:g} ms"  # fmt: skip
            if r["unit"] == "x" and r["ratio_method"] != RATIO_METHOD:
                value += " (median of per-round ratios)"
            target = "-" if r["target"] is None else show_target(r["target"], r["unit"], r["at_most"])
            met = "-" if r["met"] is None else "yes" if r["met"] else "**no**"
            revision = r["revision"] or "revision not recorded"
            tokens = re.search(r"([\d,]+) target tokens", r["batch"] or "")
            batch = f"{int(tokens.group(1).replace(',', '')):,} target tokens" if tokens else ""
            rows.append((r["what"], batch, value, target, met, link, f"{r['machine']}, {r['precision']}", revision))
        times = {r["what"]: r for r in found if r["unit"] == "ms"}
        for label, a, b in spec.bounds:
            if a in times and b in times:
                r = times[a]
                value = show(times[a]["value"] / times[b]["value"], "x")
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
        if name not in RENDERERS:
            raise ValueError(f"{page}: a table named {name!r}; the names are {', '.join(RENDERERS)}")
        return match.group(1) + RENDERERS[name](page) + match.group(4)

    return BLOCK.sub(one, text)


def stale(page: Path = PAGE, at: Path = None) -> list:
    """The names of the tables of ``page`` that differ from their data (its links as if it lay at ``at``)."""
    text = Path(page).read_text()
    fresh = render(text, Path(at or page))
    old, new = dict(), dict()
    for source, into in ((text, old), (fresh, new)):
        for m in BLOCK.finditer(source):
            into[m.group("name")] = m.group("body")
    return [name for name in old if old[name] != new[name]]


def pages() -> list:
    """The pages that hold at least one table."""
    found = sorted({p for pattern in PAGES for p in ROOT.glob(pattern)})
    return [p for p in found if BLOCK.search(p.read_text())]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a table differs from its data")
    args = parser.parse_args(argv)
    status = 0
    for page in pages():
        if args.check:
            for name in stale(page):
                print(f"{page.relative_to(ROOT)}: bench:{name} differs from its data; run python -m benchmarks.pages")
                status = 1
            continue
        text = page.read_text()
        fresh = render(text, page)
        if fresh != text:  # a page whose tables hold is left untouched
            page.write_text(fresh)
        names = ", ".join(m.group("name") for m in BLOCK.finditer(page.read_text()))
        print(f"{page.relative_to(ROOT)}: rendered {names}")
    return status


if __name__ == "__main__":
    sys.exit(main())
