"""A checkpoint_last.pt cut short by a kill during fairseq's copy is put back from the save's complete first file
(define_fairseq.tools.last_checkpoint); a readable one is left alone; a finished run started again is not trained
further."""

import os

import pytest
import torch
from arch_cases import TRANSLATION as TINY_MODEL
from conftest import TRAIN_FLAGS, USER_DIR, run_module

from define_fairseq.tools.last_checkpoint import readable, repair_last_checkpoint


def save(path, value, mtime):
    torch.save({"model": {"w": torch.full((1000,), float(value))}}, path)
    os.utime(path, (mtime, mtime))


def test_a_truncated_last_checkpoint_is_replaced_by_the_newest_readable_one(tmp_path):
    save(tmp_path / "checkpoint_1_2.pt", 2, 100)
    save(tmp_path / "checkpoint_1_4.pt", 4, 200)  # the first file of the save whose copy was cut
    whole = (tmp_path / "checkpoint_1_4.pt").read_bytes()
    (tmp_path / "checkpoint_last.pt").write_bytes(whole[: len(whole) // 2])
    assert not readable(tmp_path / "checkpoint_last.pt")
    assert repair_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint_1_4.pt")
    assert (tmp_path / "checkpoint_last.pt").read_bytes() == whole
    assert not [name for name in os.listdir(tmp_path) if ".repair" in name]  # no temporary file left


def test_a_readable_or_missing_last_checkpoint_is_left_alone(tmp_path):
    assert repair_last_checkpoint(str(tmp_path)) is None
    save(tmp_path / "checkpoint_1_4.pt", 4, 200)
    save(tmp_path / "checkpoint_last.pt", 3, 100)
    assert repair_last_checkpoint(str(tmp_path)) is None
    assert torch.load(tmp_path / "checkpoint_last.pt")["model"]["w"][0] == 3


def test_a_truncated_last_checkpoint_with_nothing_to_resume_from_is_named(tmp_path):
    save(tmp_path / "checkpoint_1_4.pt", 4, 200)
    whole = (tmp_path / "checkpoint_1_4.pt").read_bytes()
    (tmp_path / "checkpoint_1_4.pt").write_bytes(whole[:100])  # (cannot happen with fairseq: for the message)
    (tmp_path / "checkpoint_last.pt").write_bytes(whole[:50])
    with pytest.raises(FileNotFoundError, match="checkpoint_last.pt is truncated .* remove"):
        repair_last_checkpoint(str(tmp_path))


def test_a_finished_run_started_again_is_left_as_it_is(translation_data, tmp_path):
    """fairseq-train resumed at --max-update would take one more update; the recipes' program does nothing."""
    command = [translation_data, "--user-dir", USER_DIR, "--arch", "transformer_define", *TINY_MODEL, *TRAIN_FLAGS]
    command += ["--max-update", "2", "--save-dir", tmp_path, "--no-epoch-checkpoints", "--data-buffer-size", "0"]
    run_module("define_fairseq.tools.train", *command)
    before = (tmp_path / "checkpoint_last.pt").read_bytes()
    again = run_module("define_fairseq.tools.train", *command)
    assert "is at 2 updates, --max-update 2: done already" in again.stdout + again.stderr
    assert (tmp_path / "checkpoint_last.pt").read_bytes() == before
