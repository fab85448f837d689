"""The speed tables of the pages (``benchmarks.records``): goals, launch counts, the data-parallel step and the measured
figures, rendered from their data; every committed page matches, and a figure edited by hand is caught."""

import pytest

from benchmarks import records as pages
from benchmarks.targets import GOALS


def test_every_committed_benchmark_table_matches_its_data():
    found = pages.pages()
    assert pages.PAGE in found
    assert len(found) >= 6  # benchmarks/README.md and five examples' pages
    where = lambda page: page.relative_to(pages.ROOT).as_posix()  # noqa: E731
    assert {where(page): pages.stale_tables(page) for page in found} == {where(page): [] for page in found}


def test_a_figure_edited_by_hand_is_named(tmp_path):
    text = pages.PAGE.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `transformer` | eager |"))
    page = tmp_path / "README.md"
    page.write_text(text.replace(row, row.replace("| 1008 |", "| 1007 |")))
    assert pages.stale_tables(page, at=pages.PAGE) == ["launch_count"]


def test_a_measured_speed_figure_edited_by_hand_is_named(tmp_path):
    text = pages.PAGE.read_text()
    block = text[text.index("<!-- bench:cpu-latest -->") :]
    row = next(line for line in block.splitlines() if "| 2.80x | >= 1.5x |" in line)
    page = tmp_path / "README.md"
    page.write_text(text.replace(row, row.replace("| 2.80x |", "| 2.90x |")))
    assert pages.stale_tables(page, at=pages.PAGE) == ["cpu-latest"]
    assert pages.stale_tables(page) != []  # rendered elsewhere, its links to the reports differ too


def test_a_figure_names_its_report_revision_and_machine_relative_to_its_page():
    page = pages.ROOT / "examples" / "translation" / "README.md"
    text = pages.figures_table(pages.FIGURES["gpu-translation"], page)
    assert "[gpu-nvidia-h200.md](../../benchmarks/results/gpu-nvidia-h200.md)" in text
    assert "| NVIDIA H100 80GB HBM3, bf16 | revision not recorded |" in text  # its report has no revision
    assert "| NVIDIA H200, bf16 | 36fc3d6 |" in text


def test_a_goal_shows_the_target_of_targets_py_not_the_reports():
    text = pages.figures_table(pages.FIGURES["gpu-goals"], pages.PAGE)
    row = next(line for line in text.splitlines() if line.startswith("| GroupLinear vs dense at 1024"))
    assert f"| >= {GOALS['group_linear_dense'].gpu:g}x |" in row  # the report printed >= 2.5x


def test_a_missing_data_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="launch_count.json.*write it with the benchmark"):
        pages.launch_count_table(tmp_path / "launch_count.json")
    with pytest.raises(ValueError, match="nothing.json.*write it with the benchmark"):
        pages.figures_table(pages.Figures(("nothing.md",), "."), pages.PAGE)


def test_every_goal_has_a_row():
    table = pages.targets_table()
    assert all(f"| `{key}` |" in table for key in GOALS)


def test_every_table_is_rendered_on_some_page():
    used = {m.group("name") for page in pages.pages() for m in pages.BLOCK.finditer(page.read_text())}
    assert set(pages.RENDERERS) <= used


def test_a_bound_row_is_the_ratio_of_its_reports_two_median_times():
    spec = pages.FIGURES["txl"]
    label, a, b = spec.bounds[0]
    text = pages.figures_table(spec, pages.ROOT / "examples" / "transformer_xl" / "README.md")
    rows = [line for line in text.splitlines() if line.startswith(f"| {label} |")]
    assert len(rows) == len(spec.reports)  # every report times both
    for report, row in zip(spec.reports, rows):
        times = {r["what"]: r["value"] for r in pages.load(report)}
        assert f"| {times[a] / times[b]:.2f}x |" in row and f"[{report}]" in row
