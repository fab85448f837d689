"""scripts.claims: README.md's results at a glance, one short row per claim, and the picture drawn from the same data;
both fail the drift check when edited by hand or left behind by their data."""

import json
import re

import pytest
from conftest import REPO

from scripts import claims, render_results
from scripts.figures import NOTE, png_text

LONGEST = 200  # characters in a rendered cell: beyond it a row of README's table no longer reads at a glance


def cells_of(block: str):
    """Every cell of the Markdown table rows in ``block``."""
    for line in block.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|(---\|)+", line):
            yield from (cell.strip() for cell in line.strip("|").split(" | "))


def claims_block(text: str) -> str:
    return text.split(claims.MARKER, 1)[1].split("<!-- /results:claims -->", 1)[0]


def test_no_cell_of_readmes_table_is_longer_than_200_characters():
    found = list(cells_of(claims_block((REPO / "README.md").read_text())))
    assert len(found) >= 5 * 3, "README.md's results:claims block has no table"
    long = [cell for cell in found if len(cell) > LONGEST]
    assert not long, f"cells over {LONGEST} characters (move the detail to the example's page): {long}"


def test_each_row_has_one_verdict_word_and_one_line():
    for row in claims.rows(REPO):
        assert row["cells"][3] in ("holds", "reversed", "level", "not tested")
        annealed = row["cells"][4]
        assert annealed == "–" or all(
            p.rsplit(", ", 1)[1].startswith(("holds", "reversed", "level", "not tested")) for p in annealed.split("; ")
        )
        assert all("\n" not in cell for cell in row["cells"])


def test_the_committed_picture_was_drawn_from_the_data():
    assert png_text(REPO / claims.PICTURE).get(NOTE) == claims.note(claims.rows(REPO))


def runs(model, point, values, total):
    return [
        {"model": model, "point": point, "seed": s, "value": v, "parameters": {"total": total}}
        for s, v in enumerate(values, 1)
    ]


def toy(long_b=(7.0, 7.2)):
    """a ahead of b after 1,000 updates (10.5 against 13.5), then b's long values; a claim on the pair."""
    return {
        "metric": "perplexity",
        "better": "lower",
        "points": [{"key": "updates", "label": "1,000 updates"}, {"key": "long", "label": "9,000 updates"}],
        "runs": runs("a", "updates", (10.0, 11.0), 1.0)
        + runs("b", "updates", (13.0, 14.0), 1.5)
        + runs("a", "long", (5.0, 6.0), 1.0)
        + runs("b", "long", long_b, 1.5),
        "verdicts": [
            {"a": "a", "b": "b", "point": "updates", "claim": "Toy, Table 1"},
            {"a": "a", "b": "b", "point": "long", "claim": "Toy, Table 1"},
            {"a": "b", "b": "a", "point": "updates", "claim": None},
        ],
        "claims": [
            {
                "order": 1,
                "claim": "A beats B (Toy, Table 1)",
                "label": "toy",
                "paper": "40 against 42",
                "scale": "2 layers",
                "names": {"a": "A"},
                "verdicts": [0],
                "longer": {"verdict": 1},
            }
        ],
    }


def toy_root(tmp_path, data):
    results = tmp_path / "examples" / "toy" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "t.json").write_text(json.dumps(data))
    (tmp_path / "examples" / "toy" / "README.md").write_text(
        "# Toy\n\n```bash\n# not a heading\n```\n\n## The `toy` comparison, measured (CPU)\n\n"
        "<!-- results:toy/t -->\n<!-- /results:toy/t -->\n"
    )
    (tmp_path / "README.md").write_text(f"intro\n{claims.MARKER}\n<!-- /results:claims -->\nmore\n")
    return tmp_path


@pytest.mark.parametrize(
    "long_b, word, tail",
    [
        ((7.0, 7.2), "holds", "; 9,000 updates: 5.50 ± 0.71 against 7.10 ± 0.14"),
        ((5.0, 6.5), "level", "; 9,000 updates: 5.50 ± 0.71 against 5.75 ± 1.06"),
        ((7.0,), "holds", "; 9,000 updates: 5.50 ± 0.71 against 7.00 (2 and 1 seeds)"),  # one seed there: the first
    ],
)
def test_the_row_and_its_verdict(tmp_path, long_b, word, tail):
    row = claims.rows(toy_root(tmp_path, toy(long_b)))[0]
    first = "2 layers: A 10.50 ± 0.71 against `b` 13.50 ± 0.71 (2 seeds; 1.00M/1.50M), 1,000 updates"
    assert row["cells"][2] == first + tail
    assert row["cells"][3] == word
    assert row["cells"][4] == "–"  # no annealed training
    # the third verdict is on the page only; the link is to the heading above the table's marker
    assert row["cells"][5] == "[1 more](examples/toy/README.md#the-toy-comparison-measured-cpu)"


def annealed_toy(b_values=(12.0, 12.4), b_long=(9.0,)):
    """toy() with the pair also trained annealed in a file of its own, at two budgets (b's long budget one seed)."""
    data = toy()
    data["claims"][0]["annealed"] = {"table": "cos", "verdicts": [0, 1]}
    cos = {
        "metric": "perplexity",
        "better": "lower",
        "schedule": "cosine",
        "points": [{"key": "updates", "label": "1,000 updates"}, {"key": "long", "label": "4,000 updates"}],
        "runs": runs("a", "updates", (11.0, 11.4), 1.0)
        + runs("b", "updates", b_values, 1.5)
        + runs("a", "long", (8.0, 8.2), 1.0)
        + runs("b", "long", b_long, 1.5),
        "verdicts": [
            {"a": "a", "b": "b", "point": "updates", "claim": "Toy, Table 1, annealed"},
            {"a": "a", "b": "b", "point": "long", "claim": "Toy, Table 1, annealed"},
            {"a": "b", "b": "a", "point": "long", "claim": None},
        ],
    }
    return data, cos


@pytest.mark.parametrize(
    "b_values, word",
    [((12.0, 12.4), "holds"), ((11.0, 11.6), "level"), ((10.0, 10.4), "reversed")],
)
def test_the_annealed_budgets_have_a_column_with_their_own_verdicts(tmp_path, b_values, word):
    data, cos = annealed_toy(b_values)
    root = toy_root(tmp_path, data)
    (root / "examples" / "toy" / "results" / "cos.json").write_text(json.dumps(cos))
    (row,) = claims.rows(root)
    b = f"{sum(b_values) / 2:.2f} ± {abs(b_values[1] - b_values[0]) / 2**0.5:.2f}"
    assert row["cells"][4] == (
        f"1,000 updates: 11.20 ± 0.28 against {b}, {word}; 4,000 updates: 8.10 ± 0.14 against 9.00 (2 and 1 seeds), "
        "not tested (one seed)"
    )
    assert row["cells"][3] == "holds"  # the fixed-rate verdict stays the row's own
    # the annealed file's third verdict is on the page only; its two shown ones are not counted
    assert row["cells"][5] == (
        "[1 more](examples/toy/README.md#the-toy-comparison-measured-cpu), [1 annealed](examples/toy/README.md)"
    )
    assert [kind for kind, _ in row["points"]] == ["short", "long", "annealed", "annealed"]


def test_a_hand_edit_of_readmes_table_and_a_stale_picture_are_named(tmp_path):
    pytest.importorskip("matplotlib")
    root = toy_root(tmp_path, toy())
    stale = render_results.update(root, check=True)
    assert "README.md: results:claims" in stale and any(s.startswith(claims.PICTURE) for s in stale)
    render_results.update(root, check=False)
    assert render_results.update(root, check=True) == []
    readme = root / "README.md"
    text = readme.read_text()
    assert "| A beats B (Toy, Table 1) | 40 against 42 |" in text and f"]({claims.PICTURE})" in text
    readme.write_text(text.replace("| holds |", "| level |"))
    with pytest.raises(SystemExit, match="README.md: results:claims"):
        render_results.main(["--check", "--root", str(root)])
    readme.write_text(text)
    (root / "examples" / "toy" / "results" / "t.json").write_text(json.dumps(toy((5.0, 6.5))))
    stale = render_results.update(root, check=True)
    assert f"{claims.PICTURE}: drawn from other data than README.md's results:claims" in stale


def test_a_claim_naming_a_missing_verdict_names_the_file(tmp_path):
    data = toy()
    data["claims"][0]["verdicts"] = [7]
    with pytest.raises(SystemExit, match="t.json: a claim names verdict 7"):
        render_results.main(["--check", "--root", str(toy_root(tmp_path, data))])


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("Table 2 at a small scale, on any corpus", "table-2-at-a-small-scale-on-any-corpus"),
        ("The `toy` comparison: 500 warm-up updates (CPU)", "the-toy-comparison-500-warm-up-updates-cpu"),
        ("README's table", "readmes-table"),
    ],
)
def test_the_anchor_is_githubs(heading, anchor):
    assert claims.slug(heading) == anchor
