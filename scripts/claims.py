"""README.md's results at a glance, from every data file's ``claims`` (``docs/results.md``, 'README's table'): one
row per claim of the papers, the project's measurement of it in one line and one verdict of the rule, the same pair
with the learning rate annealed to 0 where it was trained so, and a picture of each claim's gap at every point
(``PICTURE``).

A claim names its pair by a verdict of its data file (``verdicts``: the first is the row's, the rest are the
further comparisons of the claim, on the example's page) and, optionally, the same pair after longer training
(``longer``: ``{"table": TABLE, "verdict": i}``, a verdict of another data file of the same example, or of this one
without ``table``), and, optionally, the pair trained on an annealed schedule (``annealed``: ``{"table": TABLE,
"verdicts": [i, ...]}``, one verdict a budget, shortest first).
"""

import hashlib
import json
import re
import statistics
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from scripts.figures import NOTE, png_text, pyplot, save
from scripts.results_io import DataError, data_files, load, markdown_files, schedule, schedule_label
from scripts.verdicts import cells, params, verdict

PICTURE = "docs/results-gaps.png"
MARKER = "<!-- results:claims -->"
HEADER = [
    "claim (paper)",
    "the paper's figure",
    "measured here: a against b, mean ± sd",
    "verdict",
    "learning rate annealed to 0: a against b, verdict",
    "on the page",
]
# the picture's marker, colour and legend for each kind of point of a row
STYLES = {
    "short": ("o", "C0", "after the comparison's updates"),
    "long": ("s", "C3", "after longer training"),
    "annealed": ("^", "C2", "learning rate annealed to 0"),
}
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchor(root: Path, name: str) -> str:
    """``PAGE#heading``: the section of the page that renders the table ``EXAMPLE/TABLE`` (the heading above its
    marker), relative to the root; the example's README where no page renders it."""
    marker = f"<!-- results:{name} -->"
    for path in markdown_files(root)[1:]:
        seen: Dict[str, int] = {}
        last, fenced = "", False
        for line in path.read_text().splitlines():
            if FENCE.match(line):
                fenced = not fenced
            heading = None if fenced else HEADING.match(line)
            if heading:
                base = slug(heading[2])
                last = base + (f"-{seen[base]}" if base in seen else "")
                seen[base] = seen.get(base, 0) + 1
            if line.strip() == marker:
                return path.relative_to(root).as_posix() + (f"#{last}" if last else "")
    return f"examples/{name.partition('/')[0]}/README.md"


def side(data: dict, group: str, model: str, point: str) -> dict:
    """One side of a verdict: its values over the seeds, their mean and sd (None with one seed), its size."""
    values = [r["value"] for r in cells(data, group, model, point)]
    return {
        "values": values,
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else None,
        "seeds": len(values),
        "total": params(data, group, model).get("total"),
    }


def judged(data: dict, index: int, where: str) -> dict:
    """One verdict of a data file as the row and the picture use it: both sides, the rule's word, and a's lead over
    b relative to b's mean (positive where a is better) with the rule's margin, sd_a + sd_b, on the same scale."""
    try:
        v = data["verdicts"][index]
    except (KeyError, IndexError):
        raise DataError(f"{where}: a claim names verdict {index}, which the data file does not have") from None
    group = v.get("group", "")
    a, b = (side(data, group, v[k], v["point"]) for k in ("a", "b"))
    sign = -1 if data["better"] == "lower" else 1
    lead = sign * 100 * (a["mean"] - b["mean"]) / abs(b["mean"])
    margin = None if None in (a["sd"], b["sd"]) else 100 * (a["sd"] + b["sd"]) / abs(b["mean"])
    label = next(p["label"] for p in data["points"] if p["key"] == v["point"])
    # only an annealed point is named by its schedule here: the pages label the others, and the cells stay short
    found = schedule(data, [r for m in (v["a"], v["b"]) for r in cells(data, group, m, v["point"])])
    rate = schedule_label(found) if found == "cosine" else ""
    return {
        "v": v,
        "a": a,
        "b": b,
        "where": ", ".join(x for x in (group, label, rate) if x),
        "point": ", ".join(x for x in (label, rate) if x),
        "label": label,
        "word": verdict(a["values"], b["values"], data["better"]),
        "lead": lead,
        "margin": margin,
        "digits": data.get("digits", 2),
    }


def value(s: dict, digits: int) -> str:
    """mean ± sd, or the one seed's value."""
    return f"{s['mean']:.{digits}f}" + (f" ± {s['sd']:.{digits}f}" if s["sd"] is not None else "")


def seeds(j: dict) -> str:
    """'3 seeds', or '3 and 2 seeds' where the sides differ."""
    counts = dict.fromkeys((j["a"]["seeds"], j["b"]["seeds"]))
    return " and ".join(map(str, counts)) + f" seed{'s' * (max(counts) > 1)}"


def measured(claim: dict, short: dict, long: Optional[dict]) -> str:
    """The row's one line: the scale, both sides' means ± sd, the seeds, the sizes, the point; then the longer
    training's point, its seeds where they differ."""
    names = claim.get("names", {})
    a, b = (names.get(short["v"][k], f"`{short['v'][k]}`") for k in ("a", "b"))
    sizes = "/".join(f"{s['total']:.2f}M" for s in (short["a"], short["b"]) if s["total"] is not None)
    d = short["digits"]
    text = (
        f"{claim['scale']}: {a} {value(short['a'], d)} against {b} {value(short['b'], d)} "
        f"({seeds(short)}{'; ' + sizes if sizes else ''}), {short['where']}"
    )
    if long:
        again = "" if seeds(long) == seeds(short) else f" ({seeds(long)})"
        text += f"; {long['where']}: {value(long['a'], d)} against {value(long['b'], d)}{again}"
    return text


def annealed_cell(found: List[dict]) -> str:
    """The annealed column: each budget's point, both sides' mean ± sd, the rule's word; '–' where none."""
    if not found:
        return "–"
    d = found[0]["digits"]
    return "; ".join(
        f"{j['label']}: {value(j['a'], d)} against {value(j['b'], d)}"
        f"{'' if seeds(j) == seeds(found[0]) else f' ({seeds(j)})'}, {j['word']}"
        for j in found
    )


def tables(root: Path, path: Path, data: dict, claim: dict) -> Tuple[Optional[dict], List[dict], List[str]]:
    """The longer training's verdict of the claim (or None), its annealed verdicts, and a link to each of its tables
    that holds comparisons the row does not show: its own, the longer and the annealed training's, its ``also``."""
    example, shown = path.parent.parent.name, {(path, claim["verdicts"][0])}
    names = [(path, data, "more")]

    def other(key: str, word: str):
        table = path.with_name(f"{claim[key].get('table', path.stem)}.json")
        more = data if table == path else load(table)
        names.extend([] if table == path else [(table, more, word)])
        return table, more

    long, annealed = None, []
    if claim.get("longer"):
        table, more = other("longer", "trained longer")
        long = judged(more, claim["longer"]["verdict"], str(table))
        shown.add((table, claim["longer"]["verdict"]))
    if claim.get("annealed"):
        table, more = other("annealed", "annealed")
        annealed = [judged(more, i, str(table)) for i in claim["annealed"]["verdicts"]]
        shown.update((table, i) for i in claim["annealed"]["verdicts"])
    names += [(path.with_name(f"{t}.json"), load(path.with_name(f"{t}.json")), "more") for t in claim.get("also", [])]
    links = []
    for table, d, word in names:
        hidden = sum((table, i) not in shown for i in range(len(d.get("verdicts", []))))
        if hidden:
            links.append(f"[{hidden} {word}]({anchor(root, f'{example}/{table.stem}')})")
    return long, annealed, links or [f"[the table]({anchor(root, f'{example}/{path.stem}')})"]


def rows(root: Path) -> List[dict]:
    """Every claim of every data file, in the claims' order. The verdict is the rule's at the last point with two
    seeds a side: after longer training where it has them, else after the comparison's updates; the annealed
    budgets have a column of their own, each with its verdict."""
    found = []
    for path in data_files(root):
        data = load(path)
        for claim in data.get("claims", []):
            short = judged(data, claim["verdicts"][0], str(path))
            long, annealed, links = tables(root, path, data, claim)
            tested = [j for j in (long, short) if j and not j["word"].startswith("not tested")]
            found.append(
                {
                    "order": claim["order"],
                    "label": claim.get("label", claim["claim"]),
                    "cells": [
                        claim["claim"],
                        claim["paper"],
                        measured(claim, short, long),
                        tested[0]["word"] if tested else "not tested",
                        annealed_cell(annealed),
                        ", ".join(links),
                    ],
                    "points": [("short", short)] + [("long", long)] * bool(long) + [("annealed", j) for j in annealed],
                }
            )
    return sorted(found, key=lambda r: r["order"])


def note(found: List[dict]) -> str:
    """The digest of what the picture draws: a picture whose note differs was drawn from other data."""
    drawn = [
        [r["label"]]
        + [[j["where"], round(j["lead"], 3), j["margin"] and round(j["margin"], 3)] for _, j in r["points"]]
        for r in found
    ]
    return "claims " + hashlib.sha256(json.dumps(drawn).encode()).hexdigest()[:16]


def render(root: Path) -> str:
    """README.md's block: the table, then the picture."""
    found = rows(root)
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r["cells"]) + " |" for r in found]
    caption = "each claim's gap: after the comparison's updates, after longer training, annealed"
    return "\n".join(lines) + f"\n\n![{caption}]({PICTURE})\n"


def picture_stale(root: Path) -> bool:
    return png_text(root / PICTURE).get(NOTE) != note(rows(root))


def draw(root: Path) -> None:
    """Each claim's lead (the row's a over b, % of b's mean; right where a is better) with the rule's margin
    sd_a + sd_b as its bar: a bar clear of 0 is the rule's 'holds' (right) or 'reversed' (left); a hollow marker
    without a bar has one seed on a side."""
    found = rows(root)
    plt = pyplot("the picture of README.md's results")
    most = max(len(r["points"]) for r in found)
    figure, axis = plt.subplots(figsize=(9, (0.25 + 0.3 * most) * len(found) + 1.4))
    for y, row in enumerate(found):
        count = len(row["points"])
        for k, (kind, j) in enumerate(row["points"]):
            marker, colour, name = STYLES[kind]
            at = y + 0.7 * ((k + 0.5) / count - 0.5)  # a row's points one under another, within its band
            axis.errorbar(
                j["lead"],
                at,
                xerr=j["margin"] or 0,
                fmt=marker,
                color=colour,
                capsize=3,
                mfc=colour if j["margin"] is not None else "white",
                label=name,
            )
            text = f"{j['lead']:+.1f}%" + (f" ± {j['margin']:.1f}" if j["margin"] is not None else ", one seed")
            axis.annotate(
                f"{text} ({j['point']})",
                (j["lead"], at),
                xytext=(0, 6),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color=colour,
            )
    axis.axvline(0, color="0.4", linewidth=0.8)
    # linear within ±10%, where most gaps are, and logarithmic beyond, so that a gap of +100% leaves them readable
    axis.set_xscale("symlog", linthresh=10)
    ends = [j["lead"] + side * (j["margin"] or 0) for r in found for _, j in r["points"] for side in (-1, 1)]
    low, high = min(-12.0, 2.5 * min(ends)), max(12.0, 2.5 * max(ends))  # room for the labels above the markers
    ticks = [t for t in (-200, -100, -50, -20, -10, -5, 0, 5, 10, 20, 50, 100, 200, 500) if low <= t <= high]
    axis.set_xticks(ticks, [str(t) for t in ticks])
    axis.set_xlim(low, high)
    axis.set_yticks(range(len(found)), [r["label"] for r in found], fontsize=8)
    axis.set_ylim(len(found) - 0.4, -0.6)
    axis.set_xlabel("a's lead over b, % of b's mean (right: a better; linear within ±10%), bar: ±(sd_a + sd_b)")
    axis.grid(axis="x", alpha=0.3)
    handles, labels = axis.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    axis.legend(unique.values(), unique.keys(), fontsize=8, loc="upper right")
    figure.tight_layout()
    save(figure, root / PICTURE, note(found))
