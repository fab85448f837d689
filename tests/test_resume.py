"""Training stopped after some updates and resumed from ``checkpoint_last.pt`` ends with the same weights as an
uninterrupted run of the same number of updates (transformer_define, CPU, dropout on: the resumed run must
also pick up the data order, the position inside the epoch, the optimizer state and the per-update seeds)."""

import torch

from conftest import TINY_MODEL, TRAIN_FLAGS, USER_DIR, run_cli

UPDATES = 8
STOP_AT = 3  # inside the first epoch: the resumed run starts in the middle of it
assert TRAIN_FLAGS[-2:] == ["--dropout", "0.0"]
FLAGS = TRAIN_FLAGS[:-2] + ["--dropout", "0.2"]  # dropout on: the per-update seeds matter too


def train(data, save_dir, max_update, *extra):
    return run_cli("fairseq-train", data, "--user-dir", USER_DIR, "--arch", "transformer_define", *TINY_MODEL,
                   *FLAGS, "--max-update", str(max_update), "--save-dir", save_dir, "--no-epoch-checkpoints",
                   "--disable-validation", *extra)


def weights(path):
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def test_resumed_training_matches_an_uninterrupted_run(translation_data, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(translation_data, straight, UPDATES)
    first = train(translation_data, resumed, STOP_AT)
    assert f"num_updates: {STOP_AT} >= max_update: {STOP_AT}" in first.stdout + first.stderr
    state = torch.load(resumed / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["extra_state"]["train_iterator"]["iterations_in_epoch"] == STOP_AT  # stopped mid-epoch
    second = train(translation_data, resumed, UPDATES)
    assert "Loaded checkpoint" in second.stdout + second.stderr
    a, b = weights(straight / "checkpoint_last.pt"), weights(resumed / "checkpoint_last.pt")
    assert set(a) == set(b)
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
    # and the weights did move after the interruption
    halfway = state["model"]
    assert any(not torch.equal(halfway[name], a[name]) for name in a)
