"""The examples' scripts end to end on a toy corpus: what they write and the errors they give."""

import json
import os
import random
import re
import shutil
import subprocess

import pytest
from conftest import REPO, write_tiny_corpus
from script_programs import script_path

from scripts.results_io import LOG_ENTRY

# Minutes each: `make test` leaves them out, `make test-all` and CI (.ci/run) run them.
pytestmark = pytest.mark.slow


def run_script(script, *args, check=True):
    env = dict(os.environ, PATH=script_path())  # fairseq's programs forked with fairseq imported
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
    points = ("-s", 2, "-u", 40, "-L", 60, "-i", 20)
    run_script("examples/translation/compare.sh", "-o", out, *points, "-m", "baseline define", "-c", toy_corpus)
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
    proc = run_script(
        "examples/translation/compare.sh", "-o", tmp_path / "a", "-m", "baseline transformer", check=False
    )
    assert proc.returncode == 2 and "unknown model 'transformer'" in proc.stderr
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "train.en").write_text("a b\n")
    proc = run_script("examples/translation/compare.sh", "-o", tmp_path / "b", "-c", partial, check=False)
    assert proc.returncode != 0 and f"{partial}/train.de is missing or empty" in proc.stderr
    assert not (tmp_path / "b" / "corpus").exists()


def test_language_model_compare_writes_its_table_and_curves(toy_corpus, tmp_path):
    out = tmp_path / "out"
    models = "transformer_lm transformer_lm_define lstm_adaptive"
    run_script(
        "examples/language_model/compare.sh", "-o", out, "-s", 2, "-u", 20, "-i", 10, "-m", models, "-c", toy_corpus
    )
    rows = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == ["transformer_lm", "transformer_lm_define", "lstm_adaptive"]
    number = r"\d+\.\d\d"
    for row in rows:  # test perplexity mean ± spread (two seeds) at equal updates and at equal time
        assert len(re.findall(rf"\| {number} ± {number} \({number}, {number}\) \|", row)) == 2, row

    # each family's equal time is its own baseline's: the baselines' two points are one checkpoint
    def point(regime, name):
        return json.loads((out / "runs" / regime / f"{name}.s1" / "point.json").read_text())

    assert point("updates", "lstm_adaptive")["updates"] == point("time", "lstm_adaptive")["updates"] == 20
    assert point("time", "transformer_lm_define")["seconds"] <= point("updates", "transformer_lm")["seconds"]
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_runs_go_on_from_their_last_checkpoint_to_the_scores_of_one_run_trained_at_once(toy_corpus, tmp_path):
    """A run stopped after a checkpoint (a session's end: its log still train.log.tmp, nothing scored) goes on from
    there; -L on a finished OUT trains its runs on and scores the longer point again: each point scores exactly what
    a run trained that long at once scores."""
    common = ["-s", 1, "-i", 10, "-m", "lstm_adaptive", "-c", toy_corpus, "-T", "-u", 20]
    continued, at_once = tmp_path / "continued", tmp_path / "at_once"
    run_script("examples/language_model/compare.sh", "-o", continued, *common)
    assert not (continued / "runs" / "long").exists()
    run = continued / "runs" / "train" / "lstm_adaptive.s1"
    log = (run / "train.log").read_text()
    (run / "train.log.tmp").write_text(log[: log.index("done training")].rsplit("\n", 1)[0] + "\n")
    for path in (run / "train.log", run / "points.json"):
        path.unlink()
    shutil.rmtree(continued / "runs" / "updates")
    proc = run_script("examples/language_model/compare.sh", "-o", continued, *common, "-L", 40)
    assert "stopped part way; on from its last checkpoint" in proc.stdout
    proc = run_script("examples/language_model/compare.sh", "-o", continued, *common, "-L", 60)
    assert "on from 40 to 60 updates" in proc.stdout
    assert "the long point again, after 60 updates (it was after 40)" in proc.stdout
    run_script("examples/language_model/compare.sh", "-o", at_once, *common, "-L", 60)
    for regime in ("updates", "long"):
        scores = [(out / "runs" / regime / "lstm_adaptive.s1" / "score").read_text() for out in (continued, at_once)]
        assert scores[0] == scores[1], regime
    log = (run / "train.log").read_text()
    assert log.count("done training") == 2 and log.count("Loaded checkpoint") == 2


def test_a_cosine_run_anneals_its_learning_rate_to_zero_at_its_last_update(toy_corpus, tmp_path):
    """-S cosine with fairseq's own scheduler: the rate falls at every epoch's end and the log gives 0 after the
    run's last update; the run is its budget's own, and the data say it was annealed (about 40 s of CPU)."""
    out = tmp_path / "out"
    lm = "examples/language_model/compare.sh"
    run_script(lm, "-o", out, "-S", "cosine", "-s", 1, "-u", 20, "-i", 10, "-m", "lstm_adaptive", "-c", toy_corpus)
    log = (out / "runs" / "train-cosine-20" / "lstm_adaptive.s1" / "train.log").read_text()
    assert "'lr_period_updates': 20.0, 'lr_shrink': 0.0" in log
    epochs = [json.loads(m["json"]) for m in map(LOG_ENTRY.search, log.splitlines()) if m and m["kind"] == "train"]
    rates = [(int(e["train_num_updates"]), float(e["train_lr"])) for e in epochs]
    assert rates[-1] == (20, 0.0) and all(a[1] > b[1] for a, b in zip(rates, rates[1:])), rates
    assert {r["schedule"] for r in json.loads((out / "results.json").read_text())["runs"]} == {"cosine"}


def test_language_model_compare_puts_r3_at_r2s_count_by_its_width(toy_corpus, tmp_path):
    """lstm_adaptive_define_eq: R3 with the adaptive input and softmax at the largest n whose model has no more
    parameters than R2, so its count is within 2% of R2's (the paper's R3 has +1.3%); lstm_adaptive_define_ln_eq the
    same with a LayerNorm over DeFINE's output, sized on its own."""
    out = tmp_path / "out"
    models = ("-m", "lstm_adaptive_define_eq lstm_adaptive_define_ln_eq")  # R2 is counted, not trained
    run_script(
        "examples/language_model/compare.sh", "-o", out, "-s", 1, "-u", 10, "-i", 10, "-T", *models, "-c", toy_corpus
    )
    report = (out / "results.md").read_text()
    for name, file, norm in (
        ("lstm_adaptive_define_eq", "define_eq_lstm", "none"),
        ("lstm_adaptive_define_ln_eq", "define_ln_eq_lstm", "layer"),
    ):
        n, define_eq, r2 = map(int, (out / file).read_text().splitlines()[0].split("\t"))
        assert n % 4 == 0 and n < 256 and 0.98 * r2 <= define_eq <= r2
        log = (out / "runs" / "train" / f"{name}.s1" / "train.log").read_text()
        assert f"'define_n': {n}," in log and f"num. shared model params: {define_eq:,} " in log  # the model trained
        assert f"'define_output_norm': {norm}," in log
        assert f"{name}: n = {n}." in report


def test_transformer_xl_compare_puts_the_projective_input_at_defines_count(tmp_path):
    # 400 words and k = 64: table rows enough for DeFINE's unit to buy the projective input more columns
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(0)
    for split, lines in (("train", 600), ("valid", 20), ("test", 20)):
        text = "".join(" ".join(f"w{rng.randrange(400)}" for _ in range(12)) + "\n" for _ in range(lines))
        (corpus / f"{split}.txt").write_text(text)
    out = tmp_path / "out"
    models = ("-m", "projective define projective_eq", "-x", "--define-k 64")
    run_script(
        "examples/transformer_xl/compare.sh", "-o", out, "-s", 1, "-u", 20, "-i", 10, "-T", *models, "-c", corpus
    )
    rows = {
        line.split("`")[1]: line for line in (out / "results.md").read_text().splitlines() if line.startswith("| `")
    }
    assert list(rows) == ["projective", "define", "projective_eq"]
    assert all(re.search(r"\| \d+\.\d\d \(\d+\.\d\d\) \|", row) for row in rows.values()), rows
    n, projective_eq, define = map(int, (out / "projective_eq").read_text().splitlines()[0].split("\t"))
    assert n > 64 and projective_eq <= define  # DeFINE's unit buys the projective input more table columns
    log = (out / "runs" / "train" / "projective_eq.s1" / "train.log").read_text()
    assert f"'define_n': {n}," in log and f"num. shared model params: {projective_eq:,} " in log  # the model trained


def test_mogrifier_compare_gives_the_lstm_the_mogrifiers_count(toy_corpus, tmp_path):
    out = tmp_path / "out"
    run_script("examples/mogrifier/compare.sh", "-o", out, "-s", 1, "-u", 20, "-i", 10, "-T", "-c", toy_corpus)
    rows = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == ["lstm", "mogrifier"]
    hidden, lstm, mogrifier = map(int, (out / "lstm_size").read_text().splitlines()[0].split("\t"))
    assert hidden > 256 and lstm <= mogrifier  # the rounds' parameters buy the LSTM more hidden units
    assert "--mogrifier-hidden-size {0} --mogrifier-embed-dim {0}".format(hidden) in (out / "results.md").read_text()


def test_gated_conv_compare_writes_its_table(toy_corpus, tmp_path):
    out = tmp_path / "out"
    run_script("examples/gated_conv_lm/compare.sh", "-o", out, "-s", 1, "-u", 20, "-i", 10, "-c", toy_corpus)
    rows = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == ["fconv_lm", "gcnn_lm_8"]
    assert all(len(re.findall(r"\| \d+\.\d\d \(\d+\.\d\d\) \|", row)) == 2 for row in rows), rows  # updates, time


def seed_table(results, seed):
    return results.split(f"Seed {seed}:\n\n")[1].split("\n\n")[0]


def test_char2subword_robustness_adds_a_seed_to_its_table_and_reports_their_spread(toy_corpus, tmp_path):
    out = tmp_path / "out"
    script, size = "examples/char2subword/robustness.sh", ("-u", 10, "-U", 10, "-c", toy_corpus)
    run_script(script, "-o", out, "-s", 1, *size)
    first = (out / "results.md").read_text()
    assert "Seed 1:" in first and "Seed 2:" not in first and "±" not in first
    run_script(script, "-o", out, "-s", "2-2", *size)  # a seed added later: seed 1 is read back, not retrained
    results = (out / "results.md").read_text()
    assert seed_table(results, 1) == seed_table(first, 1)
    names = ["transformer", "transformer_continued", "transformer_c2s"]
    tables = results.split("Seed ")[1:]
    assert [t.split(":")[0] for t in tables] == ["1", "2"]
    number = r"\d+\.\d\d"
    for table in tables:
        rows = [line for line in table.splitlines() if line.startswith("| `")]
        assert [row.split("`")[1] for row in rows[:3]] == names
        assert all(len(re.findall(rf"\| {number} \([+-]{number}\)", row)) == 4 for row in rows[:3]), rows
    means = [line for line in tables[1].split("Mean ± standard deviation")[1].splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in means] == names
    assert all(len(re.findall(rf"{number} ± {number}", row)) == 5 for row in means), means
    assert "'seed': 2" in (out / "seed2" / "transformer_c2s" / "train.log").read_text()
    assert (out / "seed1" / "transformer" / "train.log").read_text().count("done training") == 1
    assert not list(out.rglob("*.tmp"))


def test_char2subword_robustness_refuses_a_bad_seed_range_a_positional_argument_and_no_updates(tmp_path):
    proc = run_script("examples/char2subword/robustness.sh", "-o", tmp_path / "a", "-s", "3-2", check=False)
    assert proc.returncode == 2 and "-s 3-2: the seeds are a count N" in proc.stderr
    proc = run_script("examples/char2subword/robustness.sh", tmp_path / "b", check=False)
    assert proc.returncode == 2 and "unexpected argument" in proc.stderr
    proc = run_script("examples/char2subword/robustness.sh", "-o", tmp_path / "c", "-U", 0, check=False)
    assert proc.returncode == 2 and "-u/-U 0: a number of updates" in proc.stderr
    assert not any((tmp_path / name).exists() for name in "abc")
