"""scripts.render_results: the rule for verdicts, the committed tables against their data, and two
processes writing one comparison's report."""

import json
import multiprocessing
import statistics

import pytest
from conftest import REPO
from test_compare_runs import write_run

from scripts import render_results
from scripts.compare_runs import main as compare_main


def test_every_committed_table_matches_its_data():
    """A number edited by hand in a rendered block (or data changed without `make results`) fails here."""
    assert render_results.update(REPO, check=True) == []


def test_a_table_edited_by_hand_is_named(tmp_path):
    (tmp_path / "examples" / "toy" / "results").mkdir(parents=True)
    (tmp_path / "examples" / "toy" / "results" / "t.json").write_text(json.dumps(toy_data()))
    readme = tmp_path / "examples" / "toy" / "README.md"
    readme.write_text("text\n<!-- results:toy/t -->\n<!-- /results:toy/t -->\nmore\n")
    (tmp_path / "README.md").write_text("no tables\n")
    assert render_results.update(tmp_path, check=True) == ["examples/toy/README.md: results:toy/t"]
    render_results.update(tmp_path, check=False)
    assert render_results.update(tmp_path, check=True) == []
    assert "10.50 ± 0.71 (10.00, 11.00)" in readme.read_text() and readme.read_text().endswith("more\n")
    readme.write_text(readme.read_text().replace("10.50 ± 0.71", "10.60 ± 0.71"))
    with pytest.raises(SystemExit, match="examples/toy/README.md: results:toy/t"):
        render_results.main(["--check", "--root", str(tmp_path)])


def toy_data(b_values=(13.0, 14.0), better="lower"):
    runs = [
        {"model": "a", "point": "updates", "seed": s, "value": v, "parameters": {"total": 1.0}}
        for s, v in ((1, 10.0), (2, 11.0))
    ]
    runs += [
        {"model": "b", "point": "updates", "seed": s, "value": v, "parameters": {"total": 1.5}}
        for s, v in enumerate(b_values, 1)
    ]
    return {
        "metric": "perplexity",
        "better": better,
        "points": [{"key": "updates", "label": "ppl"}],
        "runs": runs,
        "verdicts": [{"a": "a", "b": "b", "point": "updates", "claim": None, "differs": "nothing"}],
    }


@pytest.mark.parametrize(
    "a, b, better, expected",
    [
        ([10.0, 11.0], [13.0, 14.0], "lower", "holds"),  # gap 3 > 0.71 + 0.71
        ([10.0, 11.0], [13.0, 14.0], "higher", "reversed"),
        ([10.0, 11.0], [11.0, 12.5], "lower", "level"),  # gap 1.25 <= 0.71 + 1.06
        ([10.0], [13.0, 14.0], "lower", "not tested (one seed)"),
    ],
)
def test_the_rule(a, b, better, expected):
    assert render_results.verdict(a, b, better) == expected
    gap = abs(statistics.fmean(a) - statistics.fmean(b))
    if len(a) > 1:
        assert (gap > statistics.stdev(a) + statistics.stdev(b)) == (expected in ("holds", "reversed"))


def test_a_verdict_row_names_both_sides_and_labels_the_projects_own():
    text = render_results.render(toy_data())
    assert "the project's own comparison" in text and "`a` (1.00M, 2 seeds): 10.50 ± 0.71" in text
    assert "`b` (1.50M, 2 seeds): 13.50 ± 0.71" in text and "| holds | nothing |" in text


@pytest.mark.parametrize(
    "b_values, bold",
    [
        ((13.0, 14.0), True),  # holds: gap 3 > 0.71 + 0.71
        ((11.0, 12.5), False),  # level: gap 1.25 <= 0.71 + 1.06
        ((13.0,), False),  # one seed on b's side: not tested
    ],
)
def test_bold_marks_the_best_mean_only_where_its_verdict_holds(b_values, bold):
    text = render_results.table(toy_data(b_values))
    assert ("**10.50 ± 0.71 (10.00, 11.00)**" in text) == bold
    assert text.count("**") == (2 if bold else 0)


def test_bold_needs_the_verdict_against_every_other_row():
    """a holds against b but is level with c, so no row of the column is bold."""
    data = toy_data()
    data["runs"] += [{"model": "c", "point": "updates", "seed": s, "value": v} for s, v in ((1, 10.5), (2, 11.5))]
    assert "**" not in render_results.table(data)


def test_a_data_file_without_its_metric_is_refused(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"better": "lower", "points": [], "runs": []}))
    with pytest.raises(SystemExit, match="r.json: no 'metric'"):
        render_results.main(["--print", str(path)])


@pytest.mark.parametrize(
    "verdict, message",
    [
        ({"a": "a", "b": "b", "point": "time"}, "names a point that 'points' does not list"),
        ({"a": "a", "b": "c", "point": "updates"}, "names 'c' at updates, which has no runs"),
    ],
)
def test_a_verdict_on_missing_data_names_the_file(tmp_path, verdict, message):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(dict(toy_data(), verdicts=[verdict])))
    with pytest.raises(SystemExit, match=f"r.json: the verdict .* {message}"):
        render_results.main(["--print", str(path)])


def one_writer(out: str, model: str) -> None:
    compare_main([out, "--metric", "BLEU", "--models", model, "--report", f"{out}/results.md"])


def test_two_writers_keep_each_others_runs(tmp_path):
    """Two processes filling one OUT, each with its own -m, both finishing at once: the report and the data hold
    both models, whichever writes last."""
    for seed in (1, 2):
        write_run(tmp_path, "updates", "baseline", seed, 26.0 + seed, [(200, 8.0)], 100)
        write_run(tmp_path, "updates", "define", seed, 27.0 + seed, [(200, 8.0)], 110)
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=one_writer, args=(str(tmp_path), m)) for m in ("baseline", "define")]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
        assert w.exitcode == 0
    report = (tmp_path / "results.md").read_text()
    assert "| `baseline` |" in report and "| `define` |" in report
    data = render_results.load(tmp_path / "results.json")
    assert sorted((r["model"], r["seed"]) for r in data["runs"]) == [
        ("baseline", 1),
        ("baseline", 2),
        ("define", 1),
        ("define", 2),
    ]
    assert not list(tmp_path.glob("*.tmp*"))


def two_points(long_b, gains=(0.4, 0.9)):
    """toy_data with a longer-training point: a's lead at 'updates' holds (10.5 against 13.5)."""
    data = toy_data()
    data["points"] = [{"key": "updates", "label": "3,000 updates"}, {"key": "long", "label": "30,000 updates"}]
    for run in list(data["runs"]):
        data["runs"].append(dict(run, point="long", value=run["value"] - 5, late_gain=gains[run["seed"] - 1]))
    for run in list(data["runs"]):
        if run["model"] == "b" and run["point"] == "long":
            if run["seed"] > len(long_b):  # b has fewer seeds there
                data["runs"].remove(run)
            else:
                run["value"] = long_b[run["seed"] - 1]
    data["verdicts"].append({"a": "a", "b": "b", "point": "long", "claim": None, "differs": "nothing"})
    return data


@pytest.mark.parametrize(
    "long_b, change",
    [
        ((6.6, 7.1), "holds, shrinking (-22.2% at 3,000 updates → -19.7% at 30,000 updates)"),  # 5.5 against 6.85
        ((12.0, 13.0), "holds, growing (-22.2% at 3,000 updates → -56.0% at 30,000 updates)"),
        ((5.0, 6.5), "vanishes (-22.2% at 3,000 updates → -4.3% at 30,000 updates)"),  # level: 5.5 against 5.75
        ((3.0, 3.5), "reverses (-22.2% at 3,000 updates → +69.2% at 30,000 updates)"),
        ((3.0,), "not judged, one seed at 30,000 updates (-22.2% at 3,000 updates → +83.3% at 30,000 updates)"),
    ],
)
def test_the_page_says_what_became_of_a_lead_with_longer_training(long_b, change):
    """The verdicts after the short run and after longer training, read together: the lead grows or shrinks where it
    holds at both, else vanishes or reverses; the relative gaps of both points are shown."""
    text = render_results.render(two_points(long_b))
    line = text.strip().splitlines()[-1]
    gaps = [
        100 * (statistics.fmean(a) - statistics.fmean(b)) / statistics.fmean(b)
        for a, b in (([10.0, 11.0], [13.0, 14.0]), ([5.0, 6.0], list(long_b)))
    ]
    assert f"{gaps[0]:+.1f}%" in change and f"{gaps[1]:+.1f}%" in change
    assert line == f"With training, `a` against `b`: {change}."


def test_the_page_gives_the_late_gain_of_each_point_as_a_figure_without_a_rule():
    text = render_results.render(two_points((9.0, 10.0), gains=(0.4, 1.5)))
    line = next(line for line in text.splitlines() if line.startswith("Gain over the last 20% of the updates"))
    assert line.endswith(": 30,000 updates: 0.40% to 1.50% (4 runs).")  # no gains recorded at 3,000 updates
    assert "levelled" not in text.lower() and "plateau" not in text.lower()


@pytest.mark.parametrize(
    "schedule, where, rate",
    [
        ("cosine", "ppl, annealed", "annealed (after the warm-up, a cosine to 0 at each run's last update"),
        ("fixed", "ppl, fixed lr", "fixed (constant after any warm-up), not annealed"),
        ("inverse_sqrt", "ppl, inverse-sqrt lr", "inverse square root after the warm-up, not annealed"),
        (None, "ppl", None),
    ],
)
def test_the_schedule_of_the_runs_labels_the_verdict_rows_and_the_provenance(schedule, where, rate):
    """An annealed point (compare.sh -S cosine) and a fixed-rate one read apart on the page: each verdict's place
    names the runs' schedule, the line under the table says it in full; a file may give it once for all its runs."""
    data = toy_data()
    for run in data["runs"][:2]:  # a's runs give their own; b's take the file's
        run.update({"schedule": schedule} if schedule else {})
    data.update({"schedule": schedule} if schedule else {})
    text = render_results.render(data)
    assert f"| {where} | `a` (1.00M, 2 seeds)" in text
    assert (f"Learning rate: {rate}" in text) if rate else ("Learning rate" not in text)


def test_runs_of_two_schedules_in_one_cell_are_refused(tmp_path):
    data = toy_data()
    data["runs"][0]["schedule"], data["runs"][1]["schedule"] = "fixed", "cosine"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match=r"r.json: \('', 'a', 'updates'\) holds runs of different schedules"):
        render_results.main(["--print", str(path)])
