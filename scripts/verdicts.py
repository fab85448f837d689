"""The rule of ``docs/results.md`` applied to a data file (``scripts.render_results``' format): a verdict on two
models at one point, and how it changes between two points of the same pair (the comparison's updates and a longer
budget)."""

import statistics
from typing import List, Tuple

from scripts.results_io import DataError

OWN = "the project's own comparison"


def cells(data: dict, group: str, model: str, point: str) -> List[dict]:
    runs = [r for r in data["runs"] if r.get("group", "") == group and r["model"] == model and r["point"] == point]
    return sorted(runs, key=lambda r: r["seed"])


def verdict(a: List[float], b: List[float], better: str) -> str:
    """The rule of docs/results.md: 'holds' when a is better than b by more than sd_a + sd_b, 'reversed' when b is,
    'level' when the means are within the summed spreads, 'not tested' when a side has fewer than two seeds."""
    if len(a) < 2 or len(b) < 2:
        return "not tested (one seed)"
    gap = statistics.fmean(a) - statistics.fmean(b)
    if abs(gap) <= statistics.stdev(a) + statistics.stdev(b):
        return "level"
    return "holds" if (gap < 0) == (better == "lower") else "reversed"


def params(data: dict, group: str, model: str) -> dict:
    for run in data["runs"]:
        if run.get("group", "") == group and run["model"] == model and run.get("parameters"):
            return run["parameters"]
    return {}


def label(data: dict, model: str) -> str:
    return (data.get("labels") or {}).get(model, f"`{model}`")


def side(data: dict, group: str, model: str, point: str) -> Tuple[List[float], str]:
    runs = cells(data, group, model, point)
    values = [r["value"] for r in runs]
    if not values:
        raise DataError(f"a verdict names {model} at {point} ({group or 'no group'}), which has no runs")
    p = params(data, group, model)
    size = f"{p['total']:.2f}M, " if "total" in p else ""
    digits = data.get("digits", 2)
    spread = f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else ""
    return (
        values,
        f"{label(data, model)} ({size}{len(values)} seed{'s' * (len(values) > 1)}): "
        f"{statistics.fmean(values):.{digits}f}{spread}",
    )


def judge(data: dict, v: dict) -> dict:
    """One verdict: both sides, the difference, the rule's answer and what differs besides the model."""
    point = next(p for p in data["points"] if p["key"] == v["point"])
    group = v.get("group", "")
    a, a_text = side(data, group, v["a"], v["point"])
    b, b_text = side(data, group, v["b"], v["point"])
    gap = statistics.fmean(a) - statistics.fmean(b)
    digits = data.get("digits", 2)
    relative = f", {100 * gap / statistics.fmean(b):+.1f}%" if statistics.fmean(b) else ""
    return {
        "relative": 100 * gap / statistics.fmean(b) if statistics.fmean(b) else None,
        "claim": v.get("claim") or OWN,
        "where": ", ".join(x for x in (group, point["label"]) if x),
        "pair": f"{v['a']} against {v['b']}",
        "a": a_text,
        "b": b_text,
        "gap": f"{gap:+.{digits}f}{relative}",
        "verdict": verdict(a, b, data["better"]),
        "differs": v.get("differs", "–"),
    }


# (the verdict at the earlier point, at the later one) -> what became of a's lead over b with training
CHANGES = {
    ("holds", "level"): "vanishes",
    ("holds", "reversed"): "reverses",
    ("level", "holds"): "appears",
    ("level", "level"): "level at both",
    ("level", "reversed"): "turns against it",
    ("reversed", "reversed"): "reversed at both",
    ("reversed", "level"): "the reversal vanishes",
    ("reversed", "holds"): "turns in its favour",
}


def change(data: dict, earlier: dict, later: dict) -> str:
    """What became of ``a``'s lead over ``b`` between two verdicts on the same pair (say after the comparison's
    updates and after longer training): where it holds at both, whether the relative gap grew or shrank; else the
    two verdicts' change (it vanishes, appears, reverses); 'not tested' where a side has one seed."""
    first, second = judge(data, earlier), judge(data, later)
    verdicts = (first["verdict"], second["verdict"])
    if any(v.startswith("not tested") for v in verdicts):
        alone = " and ".join(j["where"] for j in (first, second) if j["verdict"].startswith("not tested"))
        word = f"not judged, one seed at {alone}"
    elif verdicts == ("holds", "holds"):
        word = "holds, growing" if abs(second["relative"]) > abs(first["relative"]) else "holds, shrinking"
    else:
        word = CHANGES[verdicts]
    gaps = " → ".join(
        f"{j['relative']:+.1f}% at {j['where']}" if j["relative"] is not None else j["where"] for j in (first, second)
    )
    return f"{word} ({gaps})"


def changes(data: dict) -> List[Tuple[str, str]]:
    """(pair, change) for each pair of models judged both after the comparison's updates and after longer training
    (the points ``updates`` and ``long`` of the compare scripts), in the order of ``verdicts``."""
    by_pair: dict = {}
    for v in data.get("verdicts", []):
        if v["point"] in ("updates", "long"):
            by_pair.setdefault((v.get("group", ""), v["a"], v["b"]), {})[v["point"]] = v
    return [
        (
            f"{label(data, a)} against {label(data, b)}" + (f" ({group})" if group else ""),
            change(data, vs["updates"], vs["long"]),
        )
        for (group, a, b), vs in by_pair.items()
        if len(vs) == 2
    ]
