"""Data-parallel training (two gloo ranks on CPU, one fairseq-train process each) stopped mid-epoch and started
again with the same command and a higher ``--max-update`` ends with the weights of an uninterrupted run.

The command is the one the README gives for several processes, nothing added for resuming: rank 0 reads
``checkpoint_last.pt`` and sends it to rank 1 (fairseq's default, which the plugin's allowed configuration globals
make work under torch >= 2.6, :mod:`define_fairseq.checkpoint_broadcast`). For the recurrent language models the
checkpoint holds every rank's carried state (the LSTM and Mogrifier state, the Transformer-XL memory), gathered on
rank 0 at the validation before each checkpoint, and each rank continues its own streams."""

import random
import subprocess
import time

import pytest
import torch
from conftest import REPO, USER_DIR
from script_programs import program as served
from test_data_parallel import free_port
from test_resume import LM_FLAGS, STATEFUL, STOP_AT, TRANSLATION, UPDATES, ZEROS_WARNING, assert_same_weights, load

from define_fairseq.models.carried_state import map_tensors
from define_fairseq.tools.last_checkpoint import readable

RANKS = 2
# fairseq-train's flags for RANKS data-parallel CPU processes (legacy_ddp: adaptive_loss and the carried state)
GLOO_RANKS = [
    "--data-buffer-size",
    "0",
    "--ddp-backend",
    "legacy_ddp",
    "--distributed-backend",
    "gloo",
    "--distributed-world-size",
    str(RANKS),
]
MODELS = {
    "transformer_define": ([*TRANSLATION, "--max-tokens", "100"], None),  # several batches a rank
    "lstm_lm_define": (LM_FLAGS + STATEFUL["lstm_lm_define"][0], "carried_state"),
    "mogrifier_lstm_lm": (LM_FLAGS + STATEFUL["mogrifier_lstm_lm"][0], "carried_state"),
    "transformer_xl_lm": (LM_FLAGS + STATEFUL["transformer_xl_lm"][0], "memory"),
}
# make test keeps Transformer-XL (the broadcast and the largest carried state); the others are slow (make test-all)
CASES = [name if name == "transformer_xl_lm" else pytest.param(name, marks=pytest.mark.slow) for name in MODELS]


def flat(state) -> torch.Tensor:
    """Every tensor of a carried state, flattened into one."""
    tensors = []
    map_tensors(state, tensors.append)
    return torch.cat([t.flatten().float() for t in tensors])


def start_ranks(data, save_dir, max_update, flags, *extra, program=None, output=subprocess.PIPE):
    """fairseq-train (or ``program``) on ``RANKS`` gloo ranks, a process each (``--distributed-no-spawn``, forked
    with fairseq imported: ``script_programs``), their output to ``output``."""
    port = free_port()
    command = [
        *(program or [served("fairseq-train")]),
        str(data),
        "--user-dir",
        USER_DIR,
        *flags,
        "--max-update",
        str(max_update),
        "--save-dir",
        str(save_dir),
        "--save-interval-updates",
        str(STOP_AT),
        "--no-epoch-checkpoints",
        *GLOO_RANKS,
        "--distributed-init-method",
        f"tcp://127.0.0.1:{port}",
        "--distributed-no-spawn",
        *extra,
    ]
    return [
        subprocess.Popen(
            [*command, "--distributed-rank", str(rank)],
            cwd=REPO,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(RANKS)
    ]


def train_ranks(data, save_dir, max_update, flags, *extra, program=None):
    """:func:`start_ranks`, then their outputs once both ended well."""
    return finish(start_ranks(data, save_dir, max_update, flags, *extra, program=program))


def finish(procs):
    """The outputs of ``procs`` once they all ended well (within 5 minutes)."""
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(o[-3000:] for o in outputs)
    return outputs


@pytest.mark.parametrize("model", CASES)
def test_a_two_rank_run_resumed_mid_epoch_matches_an_uninterrupted_run(model, translation_data, lm_data, tmp_path):
    flags, attribute = MODELS[model]
    data = translation_data if attribute is None else lm_data
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train_ranks(data, straight, UPDATES, flags)
    train_ranks(data, resumed, STOP_AT, flags)
    halfway = load(resumed / "checkpoint_last.pt")
    assert halfway["extra_state"]["train_iterator"]["iterations_in_epoch"] == STOP_AT  # stopped mid-epoch
    if attribute is not None:
        saved = halfway["model"][f"decoder.{attribute}._extra_state"]
        assert saved["world_size"] == RANKS and all(rows["batch_size"] == 4 for rows in saved["ranks"])
        states = [flat(rows["state"]) for rows in saved["ranks"]]
        assert not torch.equal(states[0], states[1])  # each rank's own rows
        if model == "transformer_xl_lm":  # what it costs: layers x streams x --txl-mem-len x d a rank
            assert [state.numel() for state in states] == [2 * 4 * 8 * 16] * RANKS

    outputs = train_ranks(data, resumed, UPDATES, flags)
    assert "Loaded checkpoint" in outputs[0]  # (fairseq logs on rank 0 only, warnings on every rank)
    assert all(ZEROS_WARNING not in output for output in outputs)
    final = load(straight / "checkpoint_last.pt")["model"]
    assert_same_weights(final, load(resumed / "checkpoint_last.pt")["model"])
    assert any(not torch.equal(halfway["model"][name], final[name]) for name in final if torch.is_tensor(final[name]))


@pytest.mark.slow
def test_without_a_validation_before_the_checkpoint_rank_1_starts_from_zeros(lm_data, tmp_path):
    """The counter-check: with --disable-validation the ranks' states never reach rank 0, the checkpoint holds rank
    0's rows only, rank 1 says so and starts its rows from zeros, and the run ends elsewhere."""
    flags, _ = MODELS["lstm_lm_define"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train_ranks(lm_data, straight, UPDATES, flags)
    train_ranks(lm_data, resumed, STOP_AT, flags, "--disable-validation")
    saved = load(resumed / "checkpoint_last.pt")["model"]["decoder.carried_state._extra_state"]
    assert saved["ranks"][0] and not saved["ranks"][1]
    rank0, rank1 = train_ranks(lm_data, resumed, UPDATES, flags, "--disable-validation")
    assert ZEROS_WARNING not in rank0
    assert ZEROS_WARNING in rank1 and "the checkpoint holds no state for rank 1" in rank1
    final = load(straight / "checkpoint_last.pt")["model"]
    other = load(resumed / "checkpoint_last.pt")["model"]
    assert max((other[name] - final[name]).abs().max().item() for name in final if torch.is_tensor(final[name])) > 1e-4


@pytest.mark.slow
def test_a_two_rank_run_killed_at_random_moments_ends_with_the_uninterrupted_runs_weights(lm_data, tmp_path):
    """Both ranks killed (SIGKILL) at random moments and the same command started again each time, the run ends
    with the weights of an uninterrupted one. Every update is validated and saved, and each start is killed at a
    random moment after 1 to 3 of its saves, so the kills land in checkpoint writes too; the recipes' program
    (define_fairseq.tools.train) puts back a checkpoint_last.pt that a kill during fairseq's copy left truncated.
    Prints how many kills, resumes and repairs it made."""
    flags, _ = MODELS["lstm_lm_define"]
    updates, every = 40, ("--save-interval-updates", "1")
    program = [served("python"), "-m", "define_fairseq.tools.train"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    train_ranks(lm_data, straight, updates, flags, *every, program=program)
    rng = random.Random(0)
    kills = truncated = 0
    log = tmp_path / "killed.log"  # a file, not a pipe that nobody reads until the kill
    for attempt in range(60):
        target = len(list(killed.glob("checkpoint_*_*.pt"))) + rng.randint(1, 3)
        with log.open("w") as output:
            procs = start_ranks(lm_data, killed, updates, flags, *every, program=program, output=output)
        # after 1 to 3 saves of this start (so that every start makes progress, on any machine's speed), kill at a
        # random moment of the next update, validation and save
        while all(p.poll() is None for p in procs) and len(list(killed.glob("checkpoint_*_*.pt"))) < target:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.1))
        if any(p.poll() is None for p in procs):
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
            kills += 1
            truncated += (killed / "checkpoint_last.pt").exists() and not readable(killed / "checkpoint_last.pt")
            continue
        assert [p.wait() for p in procs] == [0] * RANKS, log.read_text()[-5000:]
        break
    else:
        pytest.fail(f"the run did not finish in 60 starts ({kills} kills)")
    print(f"{kills} kills, {attempt} resumes, {truncated} truncated checkpoint_last.pt put back")
    assert kills >= 3  # the schedule of delays kills most starts: the test did kill and resume
    assert_same_weights(load(straight / "checkpoint_last.pt")["model"], load(killed / "checkpoint_last.pt")["model"])
