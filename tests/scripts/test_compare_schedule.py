"""compare.sh -S: the learning rate's schedule of a comparison, the same for every model. Each script runs for real
(examples/compare_lib.sh and the script's own arguments) on a prepared OUT, with stand-ins for what trains and
scores: define_fairseq.tools.train records its arguments and writes a run's log, checkpoint names and index;
define_fairseq.tools.params and fairseq-eval-lm print fixed figures; run_points and compare_runs are the real ones.
Seconds, not minutes: tests/recipes/test_examples.py trains for real."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

# define_fairseq.tools.train's stand-in: the arguments, one JSON line per run, then a finished run of --max-update
# updates: a checkpoint name per --save-interval-updates (run_points reads their index), the configuration line
# naming the scheduler, a validation per checkpoint and fairseq's last line
TRAIN = """
import json, os, sys

args = sys.argv[1:]


def last(flag, default=None):
    return ([args[i + 1] for i, a in enumerate(args[:-1]) if a == flag] or [default])[-1]


save, updates, every = last("--save-dir"), int(last("--max-update")), int(last("--save-interval-updates"))
with open(os.environ["STUB_ARGV"], "a") as log:
    log.write(json.dumps(args) + "\\n")
os.makedirs(save, exist_ok=True)
points = [[u, u / 100, f"checkpoint_1_{u}.pt"] for u in range(every, updates + 1, every)]
for name in [p[2] for p in points] + ["checkpoint_last.pt"]:
    open(os.path.join(save, name), "w").close()
with open(os.path.join(save, "points.json"), "w") as index:
    json.dump(points, index)
config = {"optimization": {"max_update": updates}, "lr_scheduler": {"_name": last("--lr-scheduler", "fixed")}}
print(f"2026-01-01 00:00:00 | INFO | fairseq_cli.train | {config}")
for u, seconds, _ in points:
    print("2026-01-01 00:00:00 | INFO | train_inner | " + json.dumps({"num_updates": str(u), "wall": str(seconds)}))
    valid = {"valid_loss": str(10 - u / updates), "valid_num_updates": str(u)}
    print("2026-01-01 00:00:00 | INFO | valid | " + json.dumps(valid))
print(f"2026-01-01 00:00:00 | INFO | fairseq_cli.train | done training in {updates / 100} seconds")
"""
# run_points as it is, without the checkpoint reader's torch import: the stand-in's runs come with their index
RUN_POINTS = """
import os, sys, types

sys.path.insert(0, os.getcwd())
sys.modules["define_fairseq.tools.last_checkpoint"] = types.SimpleNamespace(checkpoint_point=None)
from scripts.run_points import main

main()
"""
PYTHON = """#!/usr/bin/env bash
case "${1:-} ${2:-}" in
    "-m define_fairseq.tools.train") shift 2; exec "$STUB_PYTHON" "$STUBS/train.py" "$@" ;;
    "-m define_fairseq.tools.params") echo "total          1.00M"; exit 0 ;;
    "-m scripts.run_points") shift 2; exec "$STUB_PYTHON" "$STUBS/run_points.py" "$@" ;;
    "-c import matplotlib") exit 1 ;;  # no curves: seconds saved
esac
exec "$STUB_PYTHON" "$@"
"""
SCHEDULER_FLAGS = ("--lr-scheduler", "--lr-period-updates", "--lr-shrink", "--warmup-updates", "--warmup-init-lr")
TXL = "examples/transformer_xl/compare.sh"
LM = "examples/language_model/compare.sh"


@pytest.fixture
def stubs(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "train.py").write_text(TRAIN)
    (bin_dir / "run_points.py").write_text(RUN_POINTS)
    for name, text in (("python", PYTHON), ("fairseq-eval-lm", "#!/bin/sh\necho 'Perplexity: 100.00'\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def prepared(out):
    """An OUT whose text and word-level data are made (lm_data skips them): 96 symbols and fairseq's 4."""
    (out / "text").mkdir(parents=True)
    (out / "data-bin").mkdir()
    (out / "data-bin" / "dict.txt").write_text("".join(f"w{i} 5\n" for i in range(96)))
    return out


def compare(stubs, script, out, *args):
    env = dict(
        os.environ,
        PATH=f"{stubs}{os.pathsep}{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}",
        STUBS=str(stubs),
        STUB_PYTHON=sys.executable,
        STUB_ARGV=str(stubs / "argv.jsonl"),
    )
    command = ["bash", str(REPO / script), "-o", str(out), *map(str, args)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)


def trained(stubs):
    """Each run the stand-in trained: (save dir relative to OUT/runs, its arguments)."""
    path = stubs / "argv.jsonl"
    runs = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [("/".join(args[args.index("--save-dir") + 1].split("/")[-2:]), args) for args in runs]


def flags(args):
    """The scheduler's flags of one run's arguments, each flag's last value (fairseq's argparse keeps the last)."""
    return {f: [args[i + 1] for i, a in enumerate(args[:-1]) if a == f][-1] for f in SCHEDULER_FLAGS if f in args}


def test_cosine_anneals_both_sides_alike_and_gives_each_budget_its_own_run(stubs, tmp_path):
    """Transformer-XL's 400 warm-up updates stay, then the cosine ends at each run's budget; both inputs train with
    the same flags; 3,000 and 6,000 updates are two runs, each scored at its end, recorded as annealed."""
    out = prepared(tmp_path / "out")
    proc = compare(stubs, TXL, out, "-S", "cosine", "-m", "define projective", "-s", 1, "-u", 3000, "-L", 6000)
    assert proc.returncode == 0, proc.stderr
    runs = trained(stubs)
    assert [d for d, _ in runs] == [
        "train-cosine-3000/define.s1",
        "train-cosine-6000/define.s1",
        "train-cosine-3000/projective.s1",
        "train-cosine-6000/projective.s1",
    ]
    for directory, args in runs:
        budget = int(directory.split("/")[0].split("-")[-1])
        assert args[args.index("--max-update") + 1] == str(budget)
        assert flags(args) == {
            "--lr-scheduler": "cosine",
            "--lr-period-updates": str(budget - 400),
            "--lr-shrink": "0",
            "--warmup-updates": "400",
            "--warmup-init-lr": "1e-7",
        }
    assert flags(runs[0][1]) != flags(runs[1][1])  # each budget its own schedule
    assert flags(runs[0][1]) == flags(runs[2][1]) and flags(runs[1][1]) == flags(runs[3][1])  # both sides alike
    for regime, budget in (("updates", 3000), ("long", 6000)):
        point = json.loads((out / "runs" / regime / "define.s1" / "point.json").read_text())
        assert (point["run"], point["updates"]) == (f"../../train-cosine-{budget}/define.s1", budget)
    assert not (out / "runs" / "train").exists() and not (out / "runs" / "time").exists()  # no equal time
    kept = sorted(p.name for p in (out / "runs" / "train-cosine-6000" / "define.s1").glob("checkpoint*.pt"))
    assert kept == ["checkpoint_1_6000.pt", "checkpoint_last.pt"]  # the point's checkpoint and the last
    data = json.loads((out / "results.json").read_text())
    assert {(r["point"], r["updates"], r["schedule"]) for r in data["runs"]} == {
        ("updates", 3000, "cosine"),
        ("long", 6000, "cosine"),
    }
    assert "-S cosine" in data["runs"][0]["command"]
    report = (out / "results.md").read_text()
    assert "Learning rate: annealed" in report and "OUT/runs/train-cosine-BUDGET" in report


def test_a_rerun_skips_the_runs_done_for_its_schedule_and_budget(stubs, tmp_path):
    """Run again, nothing trains; a longer -L trains the new budget's runs from the start, leaves the shorter
    budget's as they are and scores the long point again from the new run."""
    out = prepared(tmp_path / "out")
    common = ("-S", "cosine", "-m", "define projective", "-s", 1, "-u", 3000)
    assert compare(stubs, TXL, out, *common, "-L", 6000).returncode == 0
    assert len(trained(stubs)) == 4
    again = compare(stubs, TXL, out, *common, "-L", 6000)
    assert again.returncode == 0 and len(trained(stubs)) == 4 and "==>" not in again.stdout
    longer = compare(stubs, TXL, out, *common, "-L", 9000)
    assert longer.returncode == 0, longer.stderr
    assert [d for d, _ in trained(stubs)[4:]] == ["train-cosine-9000/define.s1", "train-cosine-9000/projective.s1"]
    assert "define, seed 1: the long point again, after 9000 updates (it was after 6000)" in longer.stdout
    point = json.loads((out / "runs" / "long" / "projective.s1" / "point.json").read_text())
    assert point["run"] == "../../train-cosine-9000/projective.s1"
    assert (out / "runs" / "train-cosine-6000" / "projective.s1" / "train.log").is_file()


def test_the_default_keeps_the_scripts_own_schedule_and_one_run(stubs, tmp_path):
    out = prepared(tmp_path / "out")
    proc = compare(stubs, TXL, out, "-m", "define projective", "-s", 1, "-u", 3000, "-L", 6000, "-T")
    assert proc.returncode == 0, proc.stderr
    assert [d for d, _ in trained(stubs)] == ["train/define.s1", "train/projective.s1"]
    for _, args in trained(stubs):
        assert flags(args) == {"--lr-scheduler": "inverse_sqrt", "--warmup-updates": "400", "--warmup-init-lr": "1e-7"}
    assert {r["schedule"] for r in json.loads((out / "results.json").read_text())["runs"]} == {"inverse_sqrt"}
    assert (out / "schedule").read_text() == "fixed\n"


@pytest.mark.parametrize("marker", [True, False])
def test_an_out_of_fixed_rate_runs_is_never_reused_for_cosine(stubs, tmp_path, marker):
    """Into an OUT of fixed-schedule runs (OUT/schedule, or an OUT from before -S: runs and no marker) a cosine
    comparison stops before training, and the other way round."""
    out = prepared(tmp_path / "out")
    assert compare(stubs, LM, out, "-m", "transformer_lm", "-s", 1, "-u", 2000, "-T").returncode == 0
    if not marker:
        (out / "schedule").unlink()
    proc = compare(stubs, LM, out, "-S", "cosine", "-m", "transformer_lm", "-s", 1, "-u", 2000)
    assert proc.returncode == 2 and len(trained(stubs)) == 1
    assert f"error: -S cosine: {out} holds runs of the fixed schedule; give each schedule its own OUT" in proc.stderr
    other = prepared(tmp_path / "other")
    assert compare(stubs, LM, other, "-S", "cosine", "-m", "transformer_lm", "-s", 1, "-u", 2000).returncode == 0
    proc = compare(stubs, LM, other, "-m", "transformer_lm", "-s", 1, "-u", 2000, "-T")
    assert proc.returncode == 2 and "error: -S fixed: " in proc.stderr and "runs of the cosine schedule" in proc.stderr


def test_without_a_warm_up_the_cosine_spans_the_whole_run_on_both_sides(stubs, tmp_path):
    out = prepared(tmp_path / "out")
    proc = compare(stubs, LM, out, "-S", "cosine", "-m", "transformer_lm transformer_lm_define", "-s", 1, "-u", 2000)
    assert proc.returncode == 0, proc.stderr
    (_, baseline), (_, define) = trained(stubs)
    assert (
        flags(baseline)
        == flags(define)
        == {"--lr-scheduler": "cosine", "--lr-period-updates": "2000", "--lr-shrink": "0"}
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (("-u", 400, "-i", 200), "error: -S cosine: a run of 400 updates ends within the warm-up (400 updates)"),
        (("-x", "--lr-scheduler fixed"), "error: -S cosine: -x sets --lr-scheduler"),
    ],
)
def test_a_cosine_budget_within_the_warm_up_or_another_scheduler_stops_before_training(stubs, tmp_path, args, message):
    proc = compare(stubs, TXL, prepared(tmp_path / "out"), "-S", "cosine", "-m", "define projective", "-s", 1, *args)
    assert proc.returncode == 2 and message in proc.stderr and not trained(stubs)


@pytest.mark.parametrize("script", sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("examples/*/compare.sh")))
def test_every_compare_script_refuses_a_bad_schedule_naming_the_flag(stubs, tmp_path, script):
    proc = compare(stubs, script, tmp_path / "out", "-S", "linear")
    assert proc.returncode == 2 and "error: -S linear: the schedule is fixed or cosine" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script", sorted(p.relative_to(REPO).as_posix() for p in REPO.glob("examples/*/compare.sh")))
def test_every_compare_scripts_usage_names_the_schedule(stubs, tmp_path, script):
    proc = compare(stubs, script, tmp_path / "out", "-h")
    assert proc.returncode == 0 and "[-S fixed|cosine]" in proc.stdout
    assert "a longer -L is a new run, not the shorter one trained on" in proc.stdout
