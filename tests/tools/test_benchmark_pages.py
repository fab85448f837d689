"""benchmarks/README.md's goal, launch-count and data-parallel tables are rendered from their data
(``benchmarks.pages``): the committed page matches, and a figure edited by hand is caught."""

import pytest

from benchmarks import pages


def test_every_committed_benchmark_table_matches_its_data():
    assert pages.stale() == []


def test_a_figure_edited_by_hand_is_named(tmp_path):
    text = pages.PAGE.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `transformer` | eager |"))
    page = tmp_path / "README.md"
    page.write_text(text.replace(row, row.replace("| 1008 |", "| 1007 |")))
    assert pages.stale(page) == ["launch_count"]


def test_a_missing_data_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="launch_count.json.*write it with the benchmark"):
        pages.launch_count_table(tmp_path / "launch_count.json")


def test_every_goal_has_a_row():
    table = pages.targets_table()
    assert all(f"| `{key}` |" in table for key in pages.GOALS)
