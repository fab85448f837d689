"""Speed figures as records (``benchmarks.records``): a benchmark writes them beside its report, the committed reports
are read back into them without drift, a report without a revision says null, and a goal's target is the one of
``benchmarks/targets.py`` whatever the report printed."""

import json

from benchmarks import gpu_report, group_linear, records
from benchmarks.common import Bench, Result, options
from benchmarks.targets import GOALS, RATIO_METHOD, Check, write

REPORT = """# Training speed: transformer_define vs transformer

- Command: `python -m benchmarks.train_speed --device cuda`
- torch 2.11.0+cu130, fairseq 0.12.3.1, Python 3.12.3, bf16 (`--dtype`: autocast)
- GPU: NVIDIA H200 (140 GiB, CUDA 13.0, cuDNN 91900); host: 16-core CPU

| model | step ms (median) | vs transformer (ratio of medians) | vs transformer (median of per-round ratios) |
|---|---|---|---|
| `transformer` | 47.6 | 1.00x | 1.00x |
| `transformer_define` | 54.2 | 0.88x | 0.87x |

## Targets

- FAIL: GroupLinear vs dense at 1024 -> 2048, g=4, 8192 tokens: 0.51x (target >= 2.5x)
- PASS: ours evaluation tokens/s >= 1.3x theirs: 1.31x (median of per-round ratios 1.33x)
- PASS: ours folded vs theirs: 1.29x (median of per-round ratios)
- FAIL (training, batch 20 (a named batch)): ours tokens/s >= 3x theirs: 2.32x (ratio of medians)
"""


def by_what(rows):
    return {r["what"]: r for r in rows}


def test_every_committed_report_matches_its_records():
    assert records.stale_records() == []
    assert all(records.json_path(md).exists() for md in records.reports())


def test_a_report_is_read_into_records(tmp_path):
    md = tmp_path / "train_speed-nvidia-h200.md"
    md.write_text(REPORT)
    rows = by_what(records.from_report(md))
    step, ratio = rows["transformer_define step"], rows["transformer_define vs transformer"]
    assert (step["value"], step["unit"], ratio["value"], ratio["ratio_method"]) == (54.2, "ms", 0.88, RATIO_METHOD)
    assert "transformer vs transformer" not in rows  # the baseline against itself is no figure
    assert ratio["revision"] is None and ratio["machine"] == "NVIDIA H200" and ratio["precision"] == "bf16"
    assert ratio["command"] == "python -m benchmarks.train_speed --device cuda"
    dense = rows["GroupLinear vs dense at 1024 -> 2048, g=4, 8192 tokens"]
    assert (dense["goal"], dense["target"], dense["report_target"]) == ("group_linear_dense", GOALS[
        "group_linear_dense"].gpu, 2.5)  # fmt: skip
    second = rows["ours evaluation tokens/s vs theirs"]  # the target moves out of the text into its field
    assert (second["value"], second["ratio_method"], second["target"]) == (1.31, RATIO_METHOD, 1.3)
    assert rows["ours folded vs theirs"]["ratio_method"] == records.PER_ROUND  # the report's only estimate
    qualified = rows["ours tokens/s vs theirs (training, batch 20 (a named batch))"]  # its own parentheses kept
    assert (qualified["value"], qualified["target"]) == (2.32, 3.0)


def test_a_revision_in_the_header_is_kept(tmp_path):
    md = tmp_path / "x.md"
    md.write_text(REPORT.replace("--device cuda`", "--device cuda`; revision 0123abcd45"))
    assert {r["revision"] for r in records.from_report(md)} == {"0123abcd45"}


def test_a_benchmark_writes_its_records_beside_its_report(tmp_path):
    bench = Bench("benchmarks.example", options("doc", rounds=3), ["--out", str(tmp_path / "x.md")])
    checks = [Check("GroupLinear g=4 vs dense at 1024 -> 2048, 8 tokens", 0.5, 2.5), Check("a", 1.2, 1.0)]
    bench.finish("T", [], "body", checks)
    dense, other = json.loads((tmp_path / "x.json").read_text())
    assert (dense["goal"], dense["target"], dense["met"], dense["origin"]) == ("group_linear_dense", 1.5, False, "run")
    assert (other["value"], other["target"], other["met"], other["report"]) == (1.2, 1.0, True, "results/x.md")
    assert other["command"] == "python -m benchmarks.example --out " + str(tmp_path / "x.md")
    assert other["precision"] == "fp32" and other["revision"] and other["ratio_method"] == RATIO_METHOD


def test_a_run_that_wrote_its_records_is_not_read_back(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "RESULTS", tmp_path)
    (tmp_path / "a.md").write_text(REPORT)
    (tmp_path / "b.md").write_text(REPORT)
    write(tmp_path / "b.json", [dict(what="x", origin="run")])
    assert [p.name for p in records.reports()] == ["a.md"]


def test_gpu_report_writes_the_records_of_every_benchmark(monkeypatch, tmp_path):
    monkeypatch.setattr(group_linear, "main", lambda argv: Result("# Fake\n", [Check("ours vs theirs", 1.5, 1.2)], 0))
    out = tmp_path / "gpu-cpu.md"
    assert gpu_report.main(["--device", "cpu", "--quick", "--only", "group_linear", "--out", str(out)]) == 0
    (row,) = json.loads((tmp_path / "gpu-cpu.json").read_text())
    assert (row["benchmark"], row["what"], row["value"], row["met"]) == ("group_linear", "ours vs theirs", 1.5, True)
    assert row["command"].startswith("python -m benchmarks.gpu_report") and row["report"] == "results/gpu-cpu.md"
