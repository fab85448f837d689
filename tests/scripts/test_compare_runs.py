"""scripts.compare_runs: the comparison table and learning curves from run directories."""

import json
import statistics

import pytest
from conftest import run_module

from scripts.compare_runs import gain, main


def write_run(root, regime, model, seed, score, valid, seconds, total="2.37", scheduler=None):
    """A finished run: fairseq's json log lines (train_inner with wall time, valid), params and score; with
    ``scheduler``, first the configuration fairseq-train logs, naming it."""
    run = root / "runs" / regime / f"{model}.s{seed}"
    run.mkdir(parents=True)
    lines = []
    if scheduler:
        config = {"optimization": {"max_update": valid[-1][0]}, "lr_scheduler": {"_name": scheduler, "min_lr": 0.0}}
        lines.append(f"2026-01-01 00:00:00 | INFO | fairseq_cli.train | {config}")
    for updates, loss in valid:
        inner = {"num_updates": str(updates), "wall": str(updates * seconds / valid[-1][0]), "loss": "7.0"}
        lines.append(f"2026-01-01 00:00:00 | INFO | train_inner | {json.dumps(inner)}")
        lines.append(
            f"2026-01-01 00:00:00 | INFO | valid | "
            f"{json.dumps({'valid_loss': str(loss), 'valid_num_updates': str(updates)})}"
        )
    summary = {"train_num_updates": str(valid[-1][0]), "train_wall": str(seconds)}  # the epoch's summary line
    lines.append(f"2026-01-01 00:00:00 | INFO | train | {json.dumps(summary)}")
    lines.append(f"2026-01-01 00:00:00 | INFO | fairseq_cli.train | done training in {seconds} seconds")
    (run / "train.log").write_text("\n".join(lines) + "\n")
    (run / "params.txt").write_text(
        f"DeFINE 0.07M\ncontext 1.39M\ninput/output 0.50M\ntotal {total}M\n".replace(" ", " " * 10)
    )
    (run / "score").write_text(f"{score}\n")


def test_table_gives_mean_spread_and_each_seed_per_regime(tmp_path, capsys):
    for seed, score in ((1, 26.0), (2, 27.0), (3, 25.0)):
        write_run(tmp_path, "updates", "baseline", seed, score, [(200, 8.0), (400, 7.0)], 100)
        write_run(tmp_path, "updates", "define", seed, score - 1, [(200, 8.5), (400, 7.5)], 110, total="1.96")
    write_run(tmp_path, "time", "define", 1, 24.5, [(200, 8.5), (360, 7.6)], 100, total="1.96")
    main([str(tmp_path), "--metric", "BLEU", "--models", "baseline,define"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| `")]
    assert rows[0].startswith("| `baseline` | 2.37M | 0.50M | 0.07M |")
    spread = statistics.stdev([26.0, 27.0, 25.0])
    assert f"26.00 ± {spread:.2f} (26.00, 27.00, 25.00) | 100 | 400/400/400 | - | - | - |" in rows[0]
    assert f"25.00 ± {spread:.2f} (25.00, 26.00, 24.00) | 110 | 400/400/400 | 24.50 (24.50) | 100 | 360 |" in rows[1]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    write_run(tmp_path, "updates", "baseline", 1, 26.0, [(200, 8.0), (400, 7.0)], 100)
    main([str(tmp_path), "--plot", str(tmp_path / "curves.png")])
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unfinished_run_is_named(tmp_path):
    write_run(tmp_path, "updates", "baseline", 1, 26.0, [(200, 8.0)], 100)
    log = tmp_path / "runs" / "updates" / "baseline.s1" / "train.log"
    log.write_text(log.read_text().replace("done training", "stopped"))
    proc = run_module("scripts.compare_runs", tmp_path, check=False)
    assert proc.returncode != 0 and f"{log} has no 'done training' line" in proc.stderr


def test_a_point_still_being_scored_is_left_out(tmp_path, capsys):
    for seed in (1, 2):
        write_run(tmp_path, "updates", "baseline", seed, 26.0 + seed, [(200, 8.0)], 100)
    (tmp_path / "runs" / "updates" / "baseline.s2" / "score").unlink()  # another process is scoring it
    main([str(tmp_path), "--metric", "BLEU"])
    out, err = capsys.readouterr()
    assert "27.00 (27.00)" in out and "28.00" not in out and "Seeds 1:" in out
    assert "left out, not scored yet" in err and "baseline.s2" in err


def test_models_limits_the_table_to_their_runs_while_others_still_train(tmp_path, capsys):
    write_run(tmp_path, "updates", "baseline", 1, 26.0, [(200, 8.0)], 100)
    (tmp_path / "runs" / "updates" / "projective.s1").mkdir()  # training: no train.log yet
    main([str(tmp_path), "--models", "baseline"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| `")]
    assert len(rows) == 1 and rows[0].startswith("| `baseline` |")
    (tmp_path / "runs" / "updates" / "projective.s1" / "score").write_text("30.0\n")  # scored, but no log
    with pytest.raises(SystemExit, match="projective.s1/train.log is missing"):
        main([str(tmp_path)])


def write_point(root, regime, model, seed, score, updates, seconds):
    """A point cut from the run under runs/train (scripts.run_points)."""
    point = root / "runs" / regime / f"{model}.s{seed}"
    point.mkdir(parents=True)
    train = root / "runs" / "train" / f"{model}.s{seed}"
    (point / "point.json").write_text(
        json.dumps({"run": f"../../train/{model}.s{seed}", "updates": updates, "seconds": seconds})
    )
    (point / "params.txt").write_text((train / "params.txt").read_text())
    (point / "score").write_text(f"{score}\n")


def test_points_of_one_run_give_each_regime_its_updates_time_and_curve(tmp_path, capsys):
    curve = [(200, 8.0), (400, 7.0), (600, 6.5), (800, 6.4)]
    write_run(tmp_path, "train", "define", 1, 0.0, curve, 400)
    write_point(tmp_path, "updates", "define", 1, 25.0, 400, 201.5)
    write_point(tmp_path, "time", "define", 1, 25.5, 600, 299.0)
    write_point(tmp_path, "long", "define", 1, 27.0, 800, 400.0)
    main([str(tmp_path), "--metric", "BLEU", "--models", "define", "--plot", str(tmp_path / "c.png")])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| `define`"))
    assert "| 25.00 (25.00) | 202 | 400 | 25.50 (25.50) | 299 | 600 | 27.00 (27.00) | 400 | 800 |" in row
    from scripts.compare_runs import load

    cut = load(tmp_path, "updates")[0]
    assert cut.valid == curve[:2] and max(cut.wall) == 400


def test_a_run_trained_on_keeps_one_clock_without_the_pauses(tmp_path):
    """A run trained further (compare.sh -L on a finished OUT) or stopped part way and gone on with appends the log of
    another process, whose wall clock fairseq restarts (or leaves at 0): its times continue the time trained before,
    from the log lines' timestamps after the process loaded the checkpoint; the pause in between does not count."""
    write_run(tmp_path, "updates", "define", 1, 30.0, [(100, 8.0), (200, 7.0)], 100)
    log = tmp_path / "runs" / "updates" / "define.s1" / "train.log"

    def process(loaded, resumed_at, inner):
        text = (
            f"2026-01-01 {loaded} | INFO | fairseq.trainer | Loaded checkpoint x.pt (epoch 1 @ {resumed_at} updates)\n"
        )
        return text + "".join(
            f"2026-01-01 {time} | INFO | train_inner | {json.dumps({'num_updates': str(u), 'wall': '0'})}\n"
            for time, u in inner
        )

    more = process("00:00:40", 200, [("00:01:00", 300), ("00:01:30", 400)])
    log.write_text(log.read_text() + more + process("00:10:00", 400, [("00:10:20", 500)]))
    from scripts.compare_runs import load

    run = load(tmp_path, "updates")[0]
    assert run.wall == {100: 50.0, 200: 100.0, 300: 120.0, 400: 150.0, 500: 170.0}


def test_the_data_file_keeps_every_point_and_merges_with_what_it_holds(tmp_path):
    write_run(tmp_path, "updates", "baseline", 1, 26.0, [(200, 8.0)], 100)
    main([str(tmp_path), "--metric", "BLEU", "--command", "bash compare.sh -s 1", "--group", "demo"])
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["metric"] == "BLEU" and data["better"] == "higher"
    (run,) = data["runs"]
    assert run["model"] == "baseline" and run["seed"] == 1 and run["value"] == 26.0 and run["point"] == "updates"
    assert run["parameters"]["total"] == 2.37 and run["updates"] == 200 and run["seconds"] == 100.0
    assert run["command"] == "bash compare.sh -s 1" and run["group"] == "demo" and run["revision"] and run["machine"]
    # a later run in another OUT, merged into the same data file: both kept
    other = tmp_path / "other"
    write_run(other, "updates", "baseline", 2, 27.0, [(200, 8.0)], 100)
    main([str(other), "--metric", "BLEU", "--data", str(tmp_path / "results.json"), "--group", "demo"])
    data = json.loads((tmp_path / "results.json").read_text())
    assert [(r["seed"], r["value"]) for r in data["runs"]] == [(1, 26.0), (2, 27.0)]


def test_a_run_merged_again_unchanged_keeps_the_revision_it_ran_under(tmp_path):
    write_run(tmp_path, "updates", "baseline", 1, 26.0, [(200, 8.0)], 100)
    write_run(tmp_path, "updates", "define", 1, 25.0, [(200, 8.0)], 100)
    path = tmp_path / "results.json"
    main([str(tmp_path), "--metric", "BLEU", "--command", "bash compare.sh -s 1"])
    data = json.loads(path.read_text())
    for run in data["runs"]:
        run["revision"], run["command"] = "0ld0ld0", "an older command"
    path.write_text(json.dumps(data))
    (tmp_path / "runs" / "updates" / "define.s1" / "score").write_text("24.0\n")  # define scored again, differently
    main([str(tmp_path), "--metric", "BLEU", "--command", "bash compare.sh -s 1"])
    runs = {r["model"]: r for r in json.loads(path.read_text())["runs"]}
    assert (runs["baseline"]["revision"], runs["baseline"]["command"]) == ("0ld0ld0", "an older command")
    assert runs["define"]["value"] == 24.0 and runs["define"]["revision"] != "0ld0ld0"
    assert runs["define"]["command"] == "bash compare.sh -s 1"


# (updates, validation loss in base 2): falling fast, then by 0.01 bits (0.69% in perplexity) over the last fifth
CURVE = [(1000, 9.0), (2000, 8.0), (3000, 7.5), (4000, 7.2), (5000, 7.1), (6000, 7.09), (7000, 7.08), (8000, 7.08)]


def test_the_late_gain_is_the_fall_of_the_best_perplexity_over_the_last_fifth():
    assert gain(CURVE, 5000) == pytest.approx(1 - 2**7.1 / 2**7.2)  # from 4,000's best to 5,000's
    assert gain(CURVE, 6000) == pytest.approx(1 - 2 ** (7.09 - 7.2))  # from 4,800: the best up to then, 4,000's
    assert gain(CURVE, 8000) == pytest.approx(1 - 2 ** (7.08 - 7.09))
    bumpy = [(1000, 8.0), (2000, 7.0), (3000, 7.3), (4000, 7.0), (5000, 7.2)]
    assert gain(bumpy, 5000) == 0.0  # a rise and the fall back to the old best are no gain: the best so far
    assert gain(CURVE, 4500) is None and gain(CURVE, 1000) is None  # not validated there; nothing before 800


def test_the_data_and_the_table_record_each_runs_schedule_and_late_gain(tmp_path, capsys):
    """The scheduler that a run's log names (compare.sh -S cosine's: annealed), kept per run in the data and named
    under the table; a log without one (older runs) records none."""
    for seed in (1, 2):
        write_run(tmp_path, "updates", "define", seed, 25.0, CURVE, 400, scheduler="cosine")
    write_run(tmp_path, "updates", "baseline", 1, 26.0, CURVE, 400)
    main([str(tmp_path), "--metric", "BLEU"])
    assert (
        "Learning rate: annealed (after the warm-up, a cosine to 0 at each run's last update" in capsys.readouterr().out
    )
    runs = {(r["model"], r["seed"]): r for r in json.loads((tmp_path / "results.json").read_text())["runs"]}
    assert runs["define", 1]["schedule"] == runs["define", 2]["schedule"] == "cosine"
    assert "schedule" not in runs["baseline", 1]
    assert runs["define", 1]["late_gain"] == round(100 * gain(CURVE, 8000), 2) == 0.69
