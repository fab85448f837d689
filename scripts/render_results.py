"""Every published comparison from its per-seed data, with one rule for verdicts (``docs/results.md``)::

    python -m scripts.render_results            # rewrite the tables of README.md and examples/*/README.md
    python -m scripts.render_results --check    # exit 1, naming each table that differs from its data
    python -m scripts.render_results --print OUT/results.json   # one data file's tables, to stdout

A data file (``examples/NAME/results/TABLE.json``, or ``OUT/results.json`` that ``compare_runs`` writes) holds one
comparison: ``metric``, ``better`` (``lower`` or ``higher``), ``digits``, ``points`` (the table's value columns:
``[{"key", "label"}]``), the ``command``, ``revision`` and ``machine`` shared by its runs (a run may give its own),
and ``runs``: one record per group (a corpus or setting, may be empty), model, point and seed, with its ``value``
and, where known, ``parameters`` (millions: ``total``, ``input/output``, ``DeFINE``), ``updates`` and ``seconds``.
A run (or the file, for all its runs) may give the learning rate's ``schedule`` (``fixed``, ``inverse_sqrt``,
``cosine``: annealed) and its ``late_gain``, the fall of its best validation perplexity over its last 20% of updates
(a figure, not a rule). ``verdicts`` name the pairs the rule judges (``a`` against ``b`` at a ``point`` of a
``group``, the ``claim`` of a paper it tests or null for the project's own comparison, and what ``differs`` besides
the model); ``claims`` are the rows of README.md's results table that come from this file.

A Markdown file holds a rendered table between ``<!-- results:EXAMPLE/TABLE -->`` and ``<!-- /results:EXAMPLE/TABLE
-->`` (the data in ``examples/EXAMPLE/results/TABLE.json``); ``<!-- results:claims -->`` is README.md's table of
the papers' claims, from every data file's ``claims``, and its picture (``scripts.claims``).
"""

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from scripts import claims
from scripts.compare_runs import WINDOW
from scripts.results_io import (
    ROOT,
    DataError,
    load,
    locked,  # noqa: F401 (examples/char2subword/robustness.sh imports it from here)
    markdown_files,
    schedule,
    schedule_label,
    write_atomic,
)
from scripts.verdicts import cells, changes, judge, label, params, verdict

BLOCK = re.compile(r"(<!-- results:(?P<name>[\w./-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


def summary(values: List[float], digits: int, seeds: List[int]) -> str:
    """mean ± sd (each seed's value), or the one value and its seed."""
    each = ", ".join(f"{v:.{digits}f}" for v in values)
    if len(values) == 1:
        return f"{values[0]:.{digits}f} (seed {seeds[0]})"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f} ({each})"


def groups_and_models(data: dict) -> List[Tuple[str, str]]:
    seen: Dict[Tuple[str, str], None] = {}
    order = data.get("models") or []
    runs = sorted(data["runs"], key=lambda r: order.index(r["model"]) if r["model"] in order else len(order))
    groups = data.get("groups") or []
    runs = sorted(runs, key=lambda r: groups.index(r.get("group", "")) if r.get("group", "") in groups else 0)
    for run in runs:
        seen.setdefault((run.get("group", ""), run["model"]), None)
    return list(seen)


def table(data: dict) -> str:
    """One row per group and model: the parameters, then each point's values over the seeds."""
    digits, rows = data.get("digits", 2), groups_and_models(data)
    grouped = any(group for group, _ in rows)
    extra = data.get("parameter_columns", [])
    header = (["setting"] if grouped else []) + ["model", "parameters"] + [f"of which {c}" for c in extra]
    header += [p["label"] for p in data["points"]]
    timed = [p for p in data["points"] if any("seconds" in r for r in cells_all(data, p["key"]))]
    header += [f"training time (s), {p['label']}" for p in timed] if data.get("show_seconds") else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    best = best_means(data, rows)
    last_group = None
    for group, model in rows:
        p = params(data, group, model)
        row = ([group if group != last_group else ""] if grouped else []) + [label(data, model)]
        row += [f"{p['total']:.2f}M" if "total" in p else "–"] + [f"{p[c]:.2f}M" if c in p else "–" for c in extra]
        last_group = group
        for point in data["points"]:
            runs = cells(data, group, model, point["key"])
            if not runs:
                row.append("–")
                continue
            text = summary([r["value"] for r in runs], digits, [r["seed"] for r in runs])
            if (
                runs
                and any(r.get("updates") not in (None, runs[0].get("updates")) for r in runs)
                or (point.get("show_updates") and runs[0].get("updates") is not None)
            ):
                text += ", updates " + "/".join(str(r.get("updates", "?")) for r in runs)
            row.append(f"**{text}**" if best.get((group, point["key"])) == model else text)
        if data.get("show_seconds"):
            for point in timed:
                secs = [r["seconds"] for r in cells(data, group, model, point["key"]) if r.get("seconds") is not None]
                row.append(f"{statistics.fmean(secs):.0f}" if secs else "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def cells_all(data: dict, point: str) -> List[dict]:
    return [r for r in data["runs"] if r["point"] == point]


def best_means(data: dict, rows: List[Tuple[str, str]]) -> Dict[Tuple[str, str], str]:
    """The model to bold in each group and point: the best mean, only where the rule's verdict of it against every
    other model there is 'holds' (so never with one seed, nor where the spreads overlap)."""
    if data.get("bold", True) is False:
        return {}
    best = {}
    for point in data["points"]:
        if not point.get("scored", True):
            continue
        for group in dict.fromkeys(g for g, _ in rows):
            values = {
                m: [r["value"] for r in runs]
                for g, m in rows
                if g == group
                for runs in [cells(data, g, m, point["key"])]
                if runs
            }
            if len(values) < 2:
                continue
            pick = min if data["better"] == "lower" else max
            top = pick(values, key=lambda m: statistics.fmean(values[m]))
            if all(verdict(values[top], v, data["better"]) == "holds" for m, v in values.items() if m != top):
                best[group, point["key"]] = top
    return best


def verdict_table(data: dict) -> str:
    header = ["claim tested", "where", "a", "b", "a − b", "verdict (docs/results.md)", "besides the model"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for v in data.get("verdicts", []):
        j = judge(data, v)
        runs = [r for m in (v["a"], v["b"]) for r in cells(data, v.get("group", ""), m, v["point"])]
        found = schedule(data, runs)
        j["where"] += f", {schedule_label(found)}" if found else ""
        lines.append("| " + " | ".join(j[k] for k in ("claim", "where", "a", "b", "gap", "verdict", "differs")) + " |")
    return "\n".join(lines)


def provenance(data: dict) -> str:
    """The command, revision and machine of the runs, each once, and their learning rate's schedule."""
    found = {}
    for key in ("command", "revision", "machine"):
        values = list(dict.fromkeys(str(r.get(key, data.get(key, "not recorded"))) for r in data["runs"]))
        found[key] = "; ".join(f"`{x}`" if key == "command" else x for x in values)
    seeds = sorted({r["seed"] for r in data["runs"]})
    names = list(dict.fromkeys(r.get("schedule", data.get("schedule")) for r in data["runs"]))
    rates = "; ".join(schedule_label(n, long=True) for n in names if n)
    return (
        f"{data['metric']} ({data['better']} is better): mean ± standard deviation over the seeds, each seed's "
        f"value in brackets; seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}. Command as published: "
        f"{found['command']}. "
        f"Revision: {found['revision']}. Machine: {found['machine']}." + (f" Learning rate: {rates}." if rates else "")
    )


def late_gains(data: dict) -> str:
    """At each point whose runs carry their ``late_gain``, its range: how far the runs still fell, no verdict."""
    parts = []
    for point in data["points"]:
        gains = [r["late_gain"] for r in cells_all(data, point["key"]) if r.get("late_gain") is not None]
        if gains:
            parts.append(f"{point['label']}: {min(gains):.2f}% to {max(gains):.2f}% ({len(gains)} runs)")
    if not parts:
        return ""
    return (
        f"Gain over the last {WINDOW:.0%} of the updates (the fall of each run's best validation perplexity; a figure, "
        "not a rule: docs/results.md): " + "; ".join(parts) + "."
    )


def render(data: dict) -> str:
    parts = [table(data), "", provenance(data)]
    late = late_gains(data)
    if late:
        parts += ["", late]
    if data.get("verdicts"):
        parts += ["", verdict_table(data)]
    found = changes(data)
    if found:
        parts += ["", "With training, " + "; ".join(f"{pair}: {what}" for pair, what in found) + "."]
    return "\n".join(parts) + "\n"


def render_block(root: Path, name: str) -> str:
    if name == "claims":
        return claims.render(root)
    example, _, table_name = name.partition("/")
    path = root / "examples" / example / "results" / f"{table_name}.json"
    if not path.is_file():
        raise DataError(
            f"a results:{name} marker names {path}, which does not exist; add the data file or fix the marker"
        )
    return render(load(path))


def update(root: Path, check: bool) -> List[str]:
    """Render every marked block; with ``check``, only name those that differ. Returns the differing blocks."""
    stale = []
    for path in markdown_files(root):
        text = path.read_text()
        new = BLOCK.sub(lambda m: m[1] + render_block(root, m["name"]) + m[4], text)
        if new != text:
            for old, fresh in zip(BLOCK.finditer(text), BLOCK.finditer(new)):
                if old["body"] != fresh["body"]:
                    stale.append(f"{path.relative_to(root)}: results:{old['name']}")
            if not check:
                write_atomic(path, new)
    if claims.MARKER in (root / "README.md").read_text() and claims.picture_stale(root):
        stale.append(f"{claims.PICTURE}: drawn from other data than README.md's results:claims")
        if not check:
            claims.draw(root)
    return stale


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs from its data")
    parser.add_argument("--print", type=Path, metavar="DATA", help="print this data file's tables")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    try:
        if args.print:
            sys.stdout.write(render(load(args.print)))
            return
        stale = update(args.root, args.check)
    except DataError as error:
        raise SystemExit(f"error: {error}") from None
    if args.check and stale:
        raise SystemExit(
            "error: these tables differ from their data (a number edited by hand, or data changed "
            "without rendering); run `make results`:\n  " + "\n  ".join(stale)
        )
    print(
        f"{'checked' if args.check else 'rendered'}: every results table matches its data"
        if not stale or args.check
        else "rendered:\n  " + "\n  ".join(stale)
    )


if __name__ == "__main__":
    main()
