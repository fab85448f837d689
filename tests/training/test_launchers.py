"""The ways of starting several fairseq-train processes that work on CPU (gloo), each one training two ranks into
one run: an explicit init method with ``--distributed-no-spawn`` (the tests of resuming use it), ``torchrun`` with
``--distributed-init-method env://``, and Slurm's variables with ``--distributed-port`` (``scontrol`` stood in for by
a script that names this machine). fairseq's own spawn and torchrun without an init method need CUDA devices to
count (docs/multi-gpu.md says what they do on GPUs). Each fairseq-train is forked with fairseq imported
(``script_programs``), in the environment its launcher gave it."""

import os
import subprocess

import pytest
import torch
from conftest import BIN, REPO, USER_DIR
from script_programs import program as served
from test_data_parallel import free_port
from test_resume import LM_FLAGS, STATEFUL, load
from test_resume_ranks import GLOO_RANKS, finish

FLAGS = [
    "--user-dir",
    USER_DIR,
    *LM_FLAGS,
    *STATEFUL["lstm_lm_define"][0],
    "--max-update",
    "2",
    "--no-epoch-checkpoints",
    *GLOO_RANKS,
]


def assert_two_rank_run(save_dir, output):
    """One run of two ranks: both joined one group, and rank 0's checkpoint holds the carried state of two."""
    assert "distributed init (rank 1)" in output and "distributed init (rank 0)" in output
    saved = load(save_dir / "checkpoint_last.pt")["model"]["decoder.carried_state._extra_state"]
    assert saved["world_size"] == 2 and all(saved["ranks"])


@pytest.mark.slow
def test_torchrun_with_the_env_init_method(lm_data, tmp_path):
    """torchrun sets RANK and WORLD_SIZE; on CPU fairseq needs the init method and the rank on its command line (it
    would take the CUDA device LOCAL_RANK % torch.cuda.device_count() otherwise)."""
    command = " ".join(
        [served("fairseq-train"), str(lm_data), *FLAGS, "--save-dir", str(tmp_path)]
        + ["--distributed-init-method", "env://", "--distributed-no-spawn", '--distributed-rank "$RANK"']
    )
    torchrun = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()), "--no-python"]
    proc = subprocess.Popen(
        [*torchrun, "bash", "-c", command], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert_two_rank_run(tmp_path, "\n".join(finish([proc])))


@pytest.mark.slow
def test_slurm_variables_with_a_port(lm_data, tmp_path):
    """One Slurm task per rank (srun --ntasks-per-node 2): fairseq reads the rank from SLURM_PROCID and the first
    host of the node list (from scontrol) as the address; --distributed-port gives the port. Both tasks say local id
    0: fairseq selects the CUDA device of the local id when it is above 0, which a CPU-only torch cannot."""
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\n")
    (shims / "scontrol").chmod(0o755)
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = dict(
            os.environ,
            PATH=f"{shims}:{os.environ['PATH']}",
            SLURM_JOB_NODELIST="node1",
            SLURM_NNODES="1",
            SLURM_NTASKS_PER_NODE="2",
            SLURM_NODEID="0",
            SLURM_PROCID=str(rank),
            SLURM_LOCALID="0",
        )
        command = [served("fairseq-train"), str(lm_data), *FLAGS, "--save-dir", str(tmp_path / "run")]
        procs.append(
            subprocess.Popen(
                [*command, "--distributed-port", port],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    assert_two_rank_run(tmp_path / "run", "\n".join(finish(procs)))


def test_fairseqs_spawn_counts_cuda_devices(lm_data, tmp_path):
    """fairseq-train --distributed-world-size N alone spawns a process per CUDA device; without any it stops."""
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the CUDA devices to spawn on")
    proc = subprocess.run(
        [served("fairseq-train"), str(lm_data), *FLAGS, "--save-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert f"world size is 2 but have {torch.cuda.device_count()} available devices" in proc.stdout + proc.stderr
