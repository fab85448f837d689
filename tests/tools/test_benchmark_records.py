"""Speed figures as records: a benchmark writes them beside its report, a goal's target being the one of
``benchmarks/targets.py`` whatever the check carried, and ``gpu_report`` writes those of every benchmark it ran."""

import json

from benchmarks import gpu_report, group_linear
from benchmarks.common import Bench, Result, options
from benchmarks.targets import RATIO_METHOD, Check


def test_a_benchmark_writes_its_records_beside_its_report(tmp_path):
    bench = Bench("benchmarks.example", options("doc", rounds=3), ["--out", str(tmp_path / "x.md")])
    checks = [Check("GroupLinear g=4 vs dense at 1024 -> 2048, 8 tokens", 0.5, 2.5), Check("a", 1.2, 1.0)]
    bench.finish("T", [], "body", checks)
    dense, other = json.loads((tmp_path / "x.json").read_text())
    assert (dense["goal"], dense["target"], dense["met"], dense["origin"]) == ("group_linear_dense", 1.5, False, "run")
    assert (other["value"], other["target"], other["met"], other["report"]) == (1.2, 1.0, True, "results/x.md")
    assert other["command"] == "python -m benchmarks.example --out " + str(tmp_path / "x.md")
    assert other["precision"] == "fp32" and other["revision"] and other["ratio_method"] == RATIO_METHOD


def test_gpu_report_writes_the_records_of_every_benchmark(monkeypatch, tmp_path):
    monkeypatch.setattr(group_linear, "main", lambda argv: Result("# Fake\n", [Check("ours vs theirs", 1.5, 1.2)], 0))
    out = tmp_path / "gpu-cpu.md"
    assert gpu_report.main(["--device", "cpu", "--quick", "--only", "group_linear", "--out", str(out)]) == 0
    (row,) = json.loads((tmp_path / "gpu-cpu.json").read_text())
    assert (row["benchmark"], row["what"], row["value"], row["met"]) == ("group_linear", "ours vs theirs", 1.5, True)
    assert row["command"].startswith("python -m benchmarks.gpu_report") and row["report"] == "results/gpu-cpu.md"
