"""Two-rank gloo data-parallel training on CPU ends with identical parameters on both ranks."""

import socket
import subprocess
import sys

import torch
from arch_cases import TRANSLATION as TINY_MODEL
from conftest import HELPERS, TRAIN_FLAGS


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_rank_gloo_run_keeps_ranks_identical(translation_data, tmp_path):
    port = free_port()
    worker = HELPERS / "ddp_worker.py"
    common = [
        str(translation_data),
        "--arch",
        "transformer_define_iwslt_de_en",
        *TINY_MODEL,
        *TRAIN_FLAGS,
        "--share-all-embeddings",
        "--max-update",
        "4",
        "--max-tokens",
        "150",
        "--distributed-backend",
        "gloo",
        "--distributed-world-size",
        "2",
        "--distributed-init-method",
        f"tcp://127.0.0.1:{port}",
        "--distributed-no-spawn",
        "--ddp-backend",
        "legacy_ddp",
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(tmp_path / "rank"), *common, "--distributed-rank", str(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
    rank0 = torch.load(tmp_path / "rank0.pt")
    rank1 = torch.load(tmp_path / "rank1.pt")
    assert rank0.keys() == rank1.keys()
    for key in rank0:
        torch.testing.assert_close(rank0[key], rank1[key], rtol=0, atol=0, msg=key)
    # and training moved the parameters (the ranks agree after updates, not only at initialisation)
    from define_fairseq.tools.params import setup_from_train_args

    _, _, initial = setup_from_train_args(common[: common.index("--distributed-backend")])
    initial_table = initial.encoder.embed_tokens.table.weight
    assert not torch.allclose(rank0["encoder.embed_tokens.table.weight"], initial_table)
