"""``benchmarks/gpu_round.py`` (``make gpu-round``) on a CPU: each item in its own process under its own limit, a
failing or hanging item losing only itself, the report rewritten after each item with the revision, the command and
the figure beside the goal's target (or a failure row) in every row, the same rows as the records every benchmark
writes (``benchmarks.records``), which the records and the pages read like any other report's; the plan's order,
limits and CUDA test files; a whole round in quick mode writing what a GPU loan returns (at most 8 files, two
folders deep at most, the summary last in its output); and a real benchmark in quick mode in a process that cannot
load fairseq's compiled extensions, as on a GPU node where fairseq's sources are on PYTHONPATH unbuilt."""

import glob
import json
import os
import re
import subprocess
import sys
import tarfile
import time

import pytest
from conftest import REPO

from benchmarks import gpu_report, gpu_round, records
from benchmarks.targets import FIELDS, GOALS, RATIO_METHOD, ROUND_FIELDS

PY = sys.executable
# a benchmark's output: its check as the record Bench.finish prints, with the 1.0 target the check carried
FIGURE = (
    "from benchmarks.targets import Check, figure_line, of_checks; "
    "(r,) = of_checks([Check({what!r}, {value}, 1.0, goal={goal!r}, batch='8 x 4 tokens')], 'fake', None, "
    "dict(command='python -m benchmarks.fake', precision='fp32', machine='CPU', revision='x'), gpu=False); "
    "print(figure_line(r))"
)
REVISION = re.compile(r"^([0-9a-f]{7,}(\+dirty)?|unknown \(.*\))$")


def figure_item(key, what, value, goal=""):
    return gpu_round.Item(key, 30, [PY, "-c", FIGURE.format(what=what, value=value, goal=goal)])


def test_a_raising_and_a_hanging_item_lose_only_themselves(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_round, "KILL_GRACE", 1)
    report = gpu_round.Round(str(tmp_path / "gpu-round-cpu.md"), dict(revision="abc1234+dirty", machine="CPU",
                                                                       device="cpu"), ["a header line"])  # fmt: skip
    # ignores SIGTERM and leaves a child behind: the whole process group is killed
    marker = f"left-behind-{os.getpid()}-{time.monotonic_ns()}"  # names the grandchild on a shared machine
    hang = "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    hang += f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}']); "
    hang += "print('started', flush=True); time.sleep(300)"
    plan = [
        figure_item("first", "ours vs theirs", 1.2, goal="define_train_4k"),
        gpu_round.Item("raises", 30, [PY, "-c", "raise RuntimeError('deliberately broken')"]),
        gpu_round.Item("hangs", 2, [PY, "-c", hang]),
        gpu_round.Item("after", 30, [PY, "-c", f"print(open({report.md!r}).read())"]),
        figure_item("last", "GroupLinear g=4 vs dense at 1024 -> 2048, 8 tokens", 0.5),
    ]
    env = dict(os.environ, PYTHONPATH=REPO)
    start = time.monotonic()
    gpu_round.run_items(plan, report, env, str(tmp_path), start + 600, results=False)
    assert time.monotonic() - start < 20  # the hang cost its limit and the grace, not its 300 s
    written = json.loads((tmp_path / "gpu-round-cpu.json").read_text())
    assert all(set(r) == set(FIELDS + ROUND_FIELDS) for r in written)  # one schema, every row
    rows = {r["item"]: r for r in written}
    assert list(rows) == ["first", "raises", "hangs", "after", "last"]
    assert all(r["revision"] == "abc1234+dirty" and r["machine"] == "CPU" for r in rows.values())
    assert all(r["report"] == "results/gpu-round-cpu.md" and r["origin"] == "run" for r in rows.values())
    # the goal's CPU target from benchmarks/targets.py, not the 1.0 the line carried
    first = rows["first"]
    assert (first["value"], first["target"], first["met"], first["report_target"]) == (
        1.2, GOALS["define_train_4k"].cpu, True, 1.0)  # fmt: skip
    assert first["ratio_method"] == RATIO_METHOD and first["precision"] == "fp32" and first["batch"] == "8 x 4 tokens"
    assert first["benchmark"] == "fake" and first["command"].startswith("python -c ")  # the item's command
    assert rows["raises"]["what"] == "failed (exit status 1): RuntimeError: deliberately broken"
    assert rows["raises"]["status"] == "failed" and rows["raises"]["value"] is None and rows["raises"]["met"] is False
    assert rows["hangs"]["rc"] == 124 and rows["hangs"]["what"].startswith("timed out after 2 s")
    # the item after the hang ran, and read a report that already had the two failures
    after = (tmp_path / "after.log").read_text()
    assert "deliberately broken" in after and "timed out after 2 s" in after
    assert rows["after"]["status"] == "failed" and rows["after"]["rc"] == 0  # it printed no figure
    # a benchmark that does not tag its check is matched by the goal's pattern
    assert rows["last"]["goal"] == "group_linear_dense" and rows["last"]["met"] is False
    text = report.md and open(report.md).read()
    assert "| hangs | timed out after 2 s" in text and "`python -c " in text
    assert "| transformer_define vs transformer, training, 4k target tokens a step | >= 1.1x | 1.20x | PASS |" in text
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 1  # nothing left running


def test_a_rounds_records_are_read_and_rendered_like_any_reports(tmp_path, monkeypatch):
    report = gpu_round.Round(str(tmp_path / "gpu-round-cpu.md"), dict(revision="abc1234", machine="CPU",
                                                                       device="cpu"), [])  # fmt: skip
    plan = [figure_item("first", "ours vs theirs", 1.2, goal="define_train_4k")]
    gpu_round.run_items(plan, report, dict(os.environ, PYTHONPATH=REPO), str(tmp_path), time.monotonic() + 60, False)
    monkeypatch.setattr(records, "RESULTS", tmp_path)
    (record,) = records.load("gpu-round-cpu.md")
    assert record["what"] == "ours vs theirs" and record["value"] == 1.2
    table = records.figures_table(records.Figures(("gpu-round-cpu.md",), r"^ours vs"), records.PAGE)
    assert "| ours vs theirs | 1.20x | >= 1.1x | yes |" in table and "| CPU, fp32 | abc1234 |" in table


def test_an_item_is_skipped_when_the_budget_is_spent(tmp_path):
    report = gpu_round.Round(str(tmp_path / "r.md"), dict(revision="r", machine="CPU", device="cpu"), [])
    gpu_round.run_items([figure_item("late", "x", 1.0)], report, dict(os.environ), str(tmp_path), time.monotonic())
    (row,) = report.rows
    assert row["status"] == "skipped" and "budget" in row["what"] and not (tmp_path / "late.log").exists()


BLOCK_EXTENSIONS = """
import importlib.abc, importlib.machinery, sys

class NoFairseqExtensions(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith("fairseq"):
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and (spec.origin or "").endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
                raise ImportError(f"{name}: a compiled extension (refused by the test)")
        return None

sys.meta_path.insert(0, NoFairseqExtensions())
"""


# a whole round end to end (about 40 s): in make test-all; the harness's own behaviour is tested in make test below
@pytest.mark.slow
def test_the_round_in_quick_mode_without_fairseqs_compiled_extensions(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCK_EXTENSIONS)
    proc = subprocess.run(
        [PY, "-m", "benchmarks.gpu_round", "--device", "cpu", "--quick", "--only", "train_4k",
         "--logs", str(tmp_path / "logs"), "--out-dir", str(tmp_path / "logs"), "--budget", "400"],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(blocker)), capture_output=True, text=True, timeout=500,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "logs" / "gpu-round-cpu.md").read_text()
    assert "compiled extensions found: none" in text and "--quick" in text
    (record,) = json.loads((tmp_path / "logs" / "gpu-round-cpu.json").read_text())
    assert record["item"] == "train_4k" and record["goal"] == "define_train_4k" and record["status"] == "measured"
    assert REVISION.match(record["revision"]) and record["machine"] == "CPU" and record["precision"] == "fp32"
    assert record["command"].startswith("python -m benchmarks.train_speed --device cpu --tokens 4000")
    assert record["value"] > 0 and record["met"] in (True, False) and record["ratio_method"] == RATIO_METHOD
    assert record["benchmark"] == "train_speed" and record["report"] == "results/gpu-round-cpu.md"
    assert f"| {GOALS['define_train_4k'].what} | >= 1.1x |" in text


def test_the_cuda_tests_row_is_pytests_summary(tmp_path):
    report = gpu_round.Round(str(tmp_path / "r.md"), dict(revision="r", machine="GPU", device="cuda"), [])
    (tests,) = [i for i in gpu_round.items("cuda", quick=False) if i.key == "cuda_tests"]
    failed = "FAILED tests/gpu/test_cuda_training.py::test_training_steps_equal_the_cpu[gcnn] - AssertionError: x"
    text = f"..F.\n{failed}\n=== 1 failed, 6 passed, 2 skipped in 39.1s ===\n"
    report.add_item(tests, 1, 40.0, 120, text, None)
    report.add_item(tests, 124, 120.0, 120, "..\n", None)
    (ran, hung) = report.rows
    assert (ran["status"], ran["met"], ran["benchmark"]) == ("1 failed, 6 passed, 2 skipped in 39.1s", False, None)
    assert ran["what"].endswith("; failed: tests/gpu/test_cuda_training.py::test_training_steps_equal_the_cpu[gcnn]")
    assert ran["command"].startswith("DEFINE_FAIRSEQ_CUDA_TESTS=gpu python -m pytest")
    assert hung["status"] == "failed" and hung["what"].startswith("timed out after 120 s")
    assert "| cuda_tests | 120 | 120.0 | 124 | FAIL: 1 failed, 6 passed" in report.summary(200.0)


def test_the_plan_runs_the_tests_then_the_eager_goals_then_the_graphs_then_the_compiled_items():
    plan = gpu_round.items("cuda", quick=False)
    assert [i.key for i in plan] == [
        "triton_cuda", "cuda_tests", "accumulation",
        "mogrifier", "train_4k", "train_26k", "txl_base", "txl_table2", "group_linear", "lstm_scoring",
        "txl_base_graphs", "train_4k_compiled", "txl_base_compiled", "train_26k_compiled", "txl_table2_compiled",
    ]  # fmt: skip
    files = {i.key: [a for a in i.argv if a.startswith("tests/")] for i in plan if gpu_report.is_tests(i)}
    assert files["triton_cuda"] == ["tests/modules/test_mogrifier_triton_cuda.py"]  # the Triton compilation alone
    assert files["accumulation"] == list(gpu_round.ACCUMULATION)
    (tests, accumulation) = [next(i for i in plan if i.key == k) for k in ("cuda_tests", "accumulation")]
    assert (
        "accumulation or lstm_lm_graphs" in accumulation.argv
        and "not (mogrifier_graphs and accumulation)" in tests.argv
    )
    # every test file that marks its tests cuda is in the round (none left out as it grows)
    paths = glob.glob(os.path.join(REPO, "tests", "**", "test_*.py"), recursive=True)
    marked = {os.path.relpath(f, REPO) for f in paths if re.search(r"\bCUDA_TESTS\b", open(f).read())}
    assert "tests/models/test_mogrifier_lstm_lm_graphs.py" in marked and "tests/gpu/test_cuda_programs.py" in marked
    assert marked <= {f for fs in files.values() for f in fs}
    assert all(os.path.exists(os.path.join(REPO, f)) for fs in files.values() for f in fs)
    # the docstring's arithmetic: the install, the tests and the first two eager goals fit the budget, the third not
    limits = [i.limit for i in plan]
    assert f"limits add up to {sum(limits):,} s against a budget of {gpu_round.BUDGET} s" in gpu_round.__doc__
    assert gpu_round.INSTALL_S + sum(limits[:5]) == 415 <= gpu_round.BUDGET < gpu_round.INSTALL_S + sum(limits[:6])
    assert "come to 415 s, within 450 s" in gpu_round.__doc__.replace("\n", " ")
    # --quick (the harness on any machine, a loaded CPU too) gives each item its limit times QUICK_LIMITS
    quick = gpu_round.items("cpu", quick=True)
    assert [i.limit for i in quick] == [limit * gpu_round.QUICK_LIMITS for limit in limits] and limits[4] == 45


def test_without_conftest_the_files_that_need_it_are_named_not_run():
    kept, dropped = gpu_round.without_conftest(gpu_round.items("cuda", quick=False))
    assert [i.key for i in kept] == [i.key for i in gpu_round.items("cuda", quick=False)]
    tests = {i.key: i for i in kept}
    assert not any(a.startswith("tests/gpu/") for a in tests["cuda_tests"].argv)
    assert (
        tests["cuda_tests"].argv[-1] == "--noconftest"
        and "tests/modules/test_group_linear.py" in tests["cuda_tests"].argv
    )
    assert [a for a in tests["accumulation"].argv if a.startswith("tests/")] == [
        "tests/modules/test_mogrifier_graphs.py"
    ]
    assert {k.key: f for k, f in dropped} == {
        "cuda_tests": ", ".join(gpu_round.GPU_TESTS),
        "accumulation": "tests/models/test_mogrifier_lstm_lm_graphs.py",
    }


def test_a_quick_round_writes_at_most_8_files_two_folders_deep_and_prints_its_summary_last(
    tmp_path, monkeypatch, capsys
):
    """The whole plan in quick mode, a stand-in for each item (a pytest summary, a figure after 30,000 characters of
    output, one that raises; a real benchmark's run is the slow test's): what comes back from a GPU loan."""
    real = gpu_round.items

    def stand_ins(device, quick, python=PY):
        plan = []
        for item in real(device, quick, python):
            if gpu_report.is_tests(item):
                item = item._replace(argv=[PY, "-c", "print('3 passed in 0.5s')", "pytest"])
            elif item.key == "txl_base":
                item = item._replace(argv=[PY, "-c", "raise RuntimeError('deliberately broken')"])
            else:
                goal = "group_linear_dense" if item.key == "group_linear" else ""
                noise = "print('x' * 30000); " + FIGURE.format(what=f"{item.key} vs theirs", value=1.2, goal=goal)
                item = item._replace(argv=[PY, "-c", noise])
            plan.append(item)
        return plan

    monkeypatch.setattr(gpu_round, "items", stand_ins)
    out, logs = tmp_path / "out", tmp_path / "logs"
    argv = ["--device", "cpu", "--quick", "--out-dir", str(out), "--logs", str(logs), "--budget", "1000"]
    assert gpu_round.main(argv) == 1  # txl_base failed
    stdout = capsys.readouterr().out
    files = [os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs]
    assert len(files) <= 8 and all(f.count(os.sep) <= 2 for f in files)
    assert sorted(files) == ["gpu-round-cpu.json", "gpu-round-cpu.md", "gpu-round-logs.tar.gz"]
    with tarfile.open(out / "gpu-round-logs.tar.gz") as tar:
        names = tar.getnames()
    keys = [i.key for i in real("cpu", True)]
    assert names == [f"gpu-round-logs/{k}.log" for k in keys]
    # the summary is the end of the output, whole within the 12,000 characters a loan returns; no item's output
    summary = stdout
    assert summary.startswith("## GPU round at") and len(summary) <= gpu_report.SUMMARY_CHARS < 12000
    assert all(f"| {k} | " in summary for k in keys)
    assert f"| triton_cuda | {120 * gpu_round.QUICK_LIMITS} | " in summary and "PASS: 3 passed in 0.5s" in summary
    assert "failed (exit status 1): RuntimeError: deliberately broken" in summary
    assert "group_linear_dense" in summary and "- Files: gpu-round-cpu.md, gpu-round-cpu.json" in summary


def test_the_summary_is_cut_to_what_a_loan_returns(tmp_path):
    report = gpu_report.Round(str(tmp_path / "r.md"), dict(revision="r", machine="CPU", device="cpu"), ["h", "env"])
    for n in range(300):
        report.skip(gpu_round.Item(f"item{n}", 30, [PY]), "why " * 100)
    summary = report.summary(1.0)
    assert len(summary) <= gpu_report.SUMMARY_CHARS and summary.endswith("(cut: the report has it all)\n")
    assert len(open(report.md).read()) > 100000  # the report keeps every row whole
