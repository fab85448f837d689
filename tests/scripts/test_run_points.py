"""scripts.run_points: a comparison's points (equal updates, equal time, longer training) taken from
the checkpoints of one training run."""

import json

import pytest
import torch
from arch_cases import case_argv
from conftest import run_cli

from scripts.run_points import at_updates, index, main, within_seconds


def fake_checkpoint(path, updates, seconds):
    torch.save(
        {
            "optimizer_history": [{"num_updates": updates}],
            "extra_state": {"previous_training_time": seconds},
            "model": {},
        },
        path,
    )


def test_index_reads_every_checkpoint_once_and_is_written(tmp_path):
    fake_checkpoint(tmp_path / "checkpoint_1_100.pt", 100, 30.0)
    fake_checkpoint(tmp_path / "checkpoint2.pt", 150, 46.0)  # an epoch's end: fairseq writes no checkpoint_E_U.pt
    fake_checkpoint(tmp_path / "checkpoint_2_200.pt", 200, 61.0)
    fake_checkpoint(tmp_path / "checkpoint_last.pt", 200, 61.0)
    fake_checkpoint(tmp_path / "checkpoint_best.pt", 100, 30.0)  # not a point of the run
    points = index(str(tmp_path))
    assert points == [
        (100, 30.0, "checkpoint_1_100.pt"),
        (150, 46.0, "checkpoint2.pt"),
        (200, 61.0, "checkpoint_2_200.pt"),
    ]
    assert json.loads((tmp_path / "points.json").read_text()) == [list(p) for p in points]
    (tmp_path / "checkpoint_1_100.pt").unlink()  # pruned later: the index still names it
    assert index(str(tmp_path)) == points


def test_queries_pick_the_exact_update_or_the_last_within_the_time(tmp_path, capsys):
    points = [(100, 30.0, "a.pt"), (200, 61.0, "b.pt"), (300, 90.0, "c.pt")]
    assert at_updates(points, 200) == points[1]
    with pytest.raises(ValueError, match=r"no checkpoint after exactly 250 updates .* --max-update >= 250"):
        at_updates(points, 250)
    assert within_seconds(points, 61.0) == points[1]
    assert within_seconds(points, 89.9) == points[1]
    with pytest.raises(ValueError, match="no checkpoint within 20 s"):
        within_seconds(points, 20.0)
    assert within_seconds(points, 100.0) == points[2] and "warning" not in capsys.readouterr().out
    assert within_seconds(points, 200.0) == points[2]  # the run stopped long before: it says so
    assert "ended at 90 s, before 200 s" in capsys.readouterr().out


def test_a_missing_run_is_named(tmp_path):
    with pytest.raises(SystemExit, match=f"{tmp_path} holds no checkpoint: train it first"):
        main([str(tmp_path), "at-updates", "100"])


@pytest.mark.slow  # two fairseq-train runs: make test-all and CI's second stack run it
def test_the_checkpoint_after_u_updates_of_a_longer_run_is_the_run_stopped_at_u(translation_data, tmp_path):
    """What makes one run serve every point: the schedule and the data order do not depend on --max-update."""

    def train(save_dir, updates, *flags):
        run_cli(
            "fairseq-train",
            *case_argv(translation_data, "transformer_define_iwslt_de_en"),
            "--max-tokens",
            "256",
            "--optimizer",
            "adam",
            "--lr",
            "0.003",
            "--lr-scheduler",
            "inverse_sqrt",
            "--warmup-updates",
            "3",
            "--seed",
            "1",
            "--cpu",
            "--num-workers",
            "0",
            "--max-update",
            str(updates),
            "--save-dir",
            str(save_dir),
            "--no-progress-bar",
            *flags,
        )

    train(tmp_path / "short", 6)
    train(tmp_path / "long", 12, "--save-interval-updates", "3", "--validate-interval-updates", "3")
    path, updates, seconds = main_output(tmp_path / "long", "at-updates", 6)
    assert updates == 6 and seconds > 0
    short = torch.load(tmp_path / "short" / "checkpoint_last.pt", weights_only=False)["model"]
    long = torch.load(path, weights_only=False)["model"]
    assert short.keys() == long.keys()
    for name in short:  # the same arithmetic in the same order: equal up to float32 rounding
        torch.testing.assert_close(long[name], short[name], rtol=1e-5, atol=1e-6)
    final = torch.load(tmp_path / "long" / "checkpoint_last.pt", weights_only=False)["model"]
    assert any(not torch.allclose(final[name], short[name]) for name in short)  # training went on


def main_output(run_dir, query, value):
    from conftest import run_module

    line = run_module("scripts.run_points", run_dir, query, value).stdout.strip().splitlines()[-1]
    path, updates, seconds = line.split("\t")
    return path, int(updates), float(seconds)
