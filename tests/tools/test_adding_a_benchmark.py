"""A benchmark added as ``docs/development.md`` ("Layout", ``benchmarks/``) says: its file and one entry in
``benchmarks.targets.BENCHMARKS``. Here a throwaway one, a sum against a sort, written to a temporary folder of the
``benchmarks`` package: it is timed and recorded on its own and in the GPU report, and its figure is rendered on a
page from its records."""

import importlib
import json
import sys

import pytest

import benchmarks
from benchmarks import gpu_report, records, targets

TINY = '''
"""A sum against a sort of the same tensor."""

import torch

from benchmarks.common import Bench, options, run_main
from benchmarks.targets import table


def main(argv=None):
    bench = Bench("benchmarks.tiny", options(__doc__, rounds=3), argv)
    x = torch.randn(4096)
    t = bench.time({"sort": lambda: x.sort(), "sum": lambda: x.sum()})
    rows = [[name, t.ms(name), t.per_s(name, x.numel())] for name in ("sort", "sum")]
    check = bench.check("sum vs sort, elements/s", t.speedup("sort", "sum"), 0.5)
    return bench.finish("Tiny: a sum against a sort", [], table("variant | ms (median) | elements/s", rows), [check])


if __name__ == "__main__":
    run_main(main)
'''


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """``benchmarks/tiny.py`` (in a temporary folder of the package) and its entry in the registry."""
    folder = tmp_path / "package"
    folder.mkdir()
    (folder / "tiny.py").write_text(TINY)
    monkeypatch.setattr(benchmarks, "__path__", [*benchmarks.__path__, str(folder)])
    monkeypatch.setitem(targets.BENCHMARKS, "tiny", (["--rounds", "2"],))
    monkeypatch.setattr(records, "RESULTS", tmp_path / "results")
    yield importlib.import_module("benchmarks.tiny")
    sys.modules.pop("benchmarks.tiny", None)


def test_an_added_benchmark_is_timed_recorded_and_rendered(tiny, tmp_path):
    # timed, and its results file and records written beside it
    report = tmp_path / "results" / "tiny.md"
    result = tiny.main(["--rounds", "2", "--out", str(report)])
    assert not result.failed and "medians over 2 rounds" in result.text and "| sum |" in result.text
    (record,) = json.loads(report.with_suffix(".json").read_text())
    assert (record["benchmark"], record["what"], record["origin"]) == ("tiny", "sum vs sort, elements/s", "run")
    assert record["value"] > 0 and record["report"] == "results/tiny.md" and set(record) == set(targets.FIELDS)
    assert records.load("tiny.md") == [record]  # read as it ran
    # rendered: a page's table between its markers, named after the benchmark
    page = tmp_path / "page.md"
    page.write_text("Intro.\n\n<!-- bench:tiny -->\n<!-- /bench:tiny -->\n")
    text = records.render(page.read_text(), page)
    assert "| sum vs sort, elements/s |" in text and "| >= 0.5x |" in text and "[tiny.md](results/tiny.md)" in text
    page.write_text(text)
    assert records.stale_tables(page) == []


def test_an_added_benchmark_runs_in_the_gpu_report(tiny, tmp_path):
    out = tmp_path / "gpu-cpu.md"
    assert gpu_report.main(["--device", "cpu", "--only", "tiny", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| `tiny` | sum vs sort, elements/s |" in text and "## Tiny: a sum against a sort" in text
    (record,) = json.loads(out.with_suffix(".json").read_text())
    assert record["benchmark"] == "tiny" and record["value"] > 0 and record["report"] == "results/gpu-cpu.md"


def test_every_entry_of_the_registry_is_a_benchmark_file():
    for name, runs in targets.BENCHMARKS.items():
        assert callable(importlib.import_module(f"benchmarks.{name}").main), name
        assert runs and all(isinstance(run, list) for run in runs), name
