"""The examples' scripts end to end on a toy corpus: what they write and the errors they give."""

import json
import os
import re
import subprocess

import pytest

from conftest import BIN, REPO, write_tiny_corpus

# Minutes each: `make test` leaves them out, `make test-all` and CI (.ci/run) run them.
pytestmark = pytest.mark.slow


def run_script(script, *args, check=True):
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(REPO / script), *map(str, args)], capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def toy_corpus(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus")
    write_tiny_corpus(corpus)
    for split in ("train", "valid", "test"):  # the language models' text: {split}.txt
        (corpus / f"{split}.txt").write_text((corpus / f"{split}.en").read_text())
    return corpus


def test_translation_compare_writes_its_table_and_curves(toy_corpus, tmp_path):
    out = tmp_path / "out"
    run_script("examples/translation/compare.sh", "-o", out, "-s", 2, "-u", 40, "-L", 60, "-i", 20,
               "-m", "baseline define", "-c", toy_corpus)
    results = (out / "results.md").read_text()
    rows = {m: line for line in results.splitlines() for m in ("baseline", "define") if line.startswith(f"| `{m}`")}
    assert set(rows) == {"baseline", "define"}
    number = r"\d+\.\d\d"
    for row in rows.values():  # BLEU mean ± spread (two seeds) at equal updates and at equal time; seed 1 longer
        assert len(re.findall(rf"{number} ± {number} \({number}, {number}\)", row)) == 2, row
        assert re.search(rf"\| {number} \({number}\) \| \d+ \| 60 \|$", row), row
        assert "| 40/40 |" in row
    for seed in (1, 2):  # one training run per model and seed; the baseline's time at 40 updates bounds the others'
        budget = json.loads((out / "runs" / "updates" / f"baseline.s{seed}" / "point.json").read_text())["seconds"]
        timed = json.loads((out / "runs" / "time" / f"define.s{seed}" / "point.json").read_text())
        assert timed["seconds"] <= budget
        kept = {p.name for p in (out / "runs" / "train" / f"define.s{seed}").glob("checkpoint*.pt")}
        assert len(kept) <= 4 and "checkpoint_last.pt" in kept  # the points' checkpoints and the last only
    assert "max_update': 60" in (out / "runs" / "train" / "define.s1" / "train.log").read_text()
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(out.rglob("*.tmp"))


def test_translation_compare_refuses_an_unknown_model_and_a_missing_corpus_file(toy_corpus, tmp_path):
    proc = run_script("examples/translation/compare.sh", "-o", tmp_path / "a", "-m", "baseline transformer",
                      check=False)
    assert proc.returncode == 2 and "unknown model 'transformer'" in proc.stderr
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "train.en").write_text("a b\n")
    proc = run_script("examples/translation/compare.sh", "-o", tmp_path / "b", "-c", partial, check=False)
    assert proc.returncode != 0 and f"{partial}/train.de is missing or empty" in proc.stderr
    assert not (tmp_path / "b" / "corpus").exists()


def test_language_model_compare_writes_its_table_and_curves(toy_corpus, tmp_path):
    out = tmp_path / "out"
    run_script("examples/language_model/compare.sh", "-o", out, "-s", 2, "-t", 0.05,
               "-m", "transformer_lm transformer_lm_define", "-c", toy_corpus)
    rows = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == ["transformer_lm", "transformer_lm_define"]
    number = r"\d+\.\d\d"
    assert all(re.search(rf"\| {number} ± {number} \({number}, {number}\) \|", row) for row in rows), rows
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
