"""The benchmarks' measuring helpers: allocator selection, page-fault counting and the LSTM matrix-product floor."""

import os
import subprocess
import sys

import pytest

from benchmarks.common import allocator_child_env, allocator_env, result_name, strip_option
from benchmarks.lstm_lm_speed import build_lm, step_products
from benchmarks.txl_speed import io_training_flops, txl_batch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_allocator_env_glibc_variants():
    assert allocator_env("glibc") == {}
    retain = allocator_env("glibc-retain")
    assert set(retain) == {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"}
    with pytest.raises(ValueError, match="unknown allocator 'jemalloc'"):
        allocator_env("jemalloc")


def test_tcmalloc_missing_library_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("TCMALLOC_LIBRARY", str(tmp_path / "libtcmalloc_minimal.so.4"))
    with pytest.raises(FileNotFoundError, match=r"--allocator tcmalloc.*TCMALLOC_LIBRARY=.*does not exist.*apt-get"):
        allocator_env("tcmalloc")


def test_tcmalloc_given_library_is_preloaded_and_keeps_memory(monkeypatch, tmp_path):
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    lib.write_bytes(b"")
    monkeypatch.setenv("TCMALLOC_LIBRARY", str(lib))
    assert allocator_env("tcmalloc") == {"LD_PRELOAD": str(lib), "TCMALLOC_RELEASE_RATE": "0"}


def test_result_names():
    assert result_name("txl_speed", "glibc") == "txl_speed"
    assert result_name("txl_speed", "tcmalloc") == "txl_speed-tcmalloc"


def test_strip_option_drops_both_forms_and_keeps_the_rest():
    argv = ["--rounds", "3", "--allocators", "glibc", "--threads=2", "--allocators=tcmalloc", "--allocatorsx", "1"]
    assert strip_option(argv, "--allocators") == ["--rounds", "3", "--threads=2", "--allocatorsx", "1"]


FAULTS_SCRIPT = """
import torch
from benchmarks.common import counting_faults
calls, faults = counting_faults({"fresh": lambda: torch.ones(32 << 20), "none": lambda: None})
calls["fresh"](); calls["none"](); calls["fresh"]()
print(faults["fresh"][0], faults["fresh"][1], faults["none"][0], len(faults["fresh"]), len(faults["none"]))
"""


def test_counting_faults_sees_fresh_memory():
    # A 128 MB buffer is above glibc's largest mmap threshold: with glibc's defaults (a child process without any
    # allocator setting) every call gets a fresh mapping, one fault per page written.
    env = allocator_child_env("glibc")
    proc = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    first, second, none, calls_fresh, calls_none = map(int, proc.stdout.split())
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            huge = "[always]" in f.read()
    except OSError:
        huge = False
    pages = (128 << 20) // ((2 << 20) if huge else 4096)
    assert (calls_fresh, calls_none) == (2, 1)
    assert first > pages // 2 and second > pages // 2, (first, second)
    assert none < 100


def test_child_environment_drops_the_callers_allocator_settings():
    base = {"PATH": "/bin", "LD_PRELOAD": "/x/libjemalloc.so", "MALLOC_TOP_PAD_": "1", "TCMALLOC_RELEASE_RATE": "5",
            "MALLOC_CONF": "kept: not a glibc tunable"}
    assert allocator_child_env("glibc", base) == {"PATH": "/bin", "MALLOC_CONF": "kept: not a glibc tunable",
                                                  "DEFINE_BENCH_ALLOCATOR": "glibc"}
    retain = allocator_child_env("glibc-retain", base)
    assert "LD_PRELOAD" not in retain and retain["MALLOC_TOP_PAD_"] == str(1 << 30)


@pytest.mark.parametrize("training", [True, False])
def test_step_products_lists_every_product_with_its_arithmetic(training):
    layers, proj = [(8, 16), (16, 16)], (16, 8)
    parts = step_products(layers, proj, vocab=50, batch=3, bptt=5, training=training, reps=1)
    per_layer = 6 if training else 2  # input, recurrent (+ back in time, dW_hh, dW_ih, input gradient)
    per_dense = 3 if training else 1  # forward (+ input and weight gradients)
    assert len(parts) == per_layer * len(layers) + per_dense * 2
    flops = {label: f for label, _, f in parts}
    assert flops["layer 1 recurrent products, 5 x [3, 16] @ [16, 64]"] == 2 * 3 * 16 * 64 * 5
    assert flops["output layer [15, 8] @ [8, 50]"] == 2 * 15 * 8 * 50
    # The arithmetic of a training step: backward products are twice the forward ones.
    forward = sum(f for _, _, f in step_products(layers, proj, 50, 3, 5, training=False, reps=1))
    assert sum(flops.values()) == (3 * forward if training else forward)
    no_proj = step_products(layers, None, vocab=50, batch=3, bptt=5, training=training, reps=1)
    assert len(no_proj) == len(parts) - per_dense and "output layer [15, 16] @ [16, 50]" in [p for p, _, _ in no_proj]


TINY_TXL = ["--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-attention-heads", "2", "--txl-head-dim",
            "6", "--decoder-ffn-embed-dim", "24", "--adaptive-softmax-cutoff", "20,40", "--define-n", "8",
            "--define-k", "32", "--txl-mem-len", "4"]
TXL_TASK = ["--task", "language_modeling", "--criterion", "lm_regularized_loss", "--ddp-backend", "legacy_ddp"]


def test_io_training_flops_of_the_transformer_xl_layers():
    vocab = 60
    sample = txl_batch(3, 10, seed=0, vocab=vocab)
    target = sample["target"].reshape(-1)
    in_tail = [int(((target >= lo) & (target < hi)).sum()) for lo, hi in ((20, 40), (40, 60))]
    assert sum(in_tail) > 0
    # Standard input, table width = d = 16: no projections; the head scores 20 words + 2 cluster entries.
    standard, _, _ = build_lm("transformer_xl_lm", vocab, TXL_TASK, TINY_TXL)
    expected = 30 * 22 * 16 + (in_tail[0] + in_tail[1]) * 20 * 16
    assert io_training_flops(standard, sample) == 6 * expected
    # DeFINE input, table width n = 8: every cluster projects 16 -> 8, and the unit runs per distinct token.
    define, _, _ = build_lm("transformer_xl_lm", vocab, TXL_TASK, TINY_TXL + ["--txl-input", "define"])
    unit = sum(p.numel() for name, p in define.decoder.embed_tokens.define.named_parameters()
               if name.startswith("layers.") and name.endswith("weight"))
    distinct = sample["net_input"]["src_tokens"].unique().numel()
    expected = (distinct * unit + 30 * (22 * 8 + 16 * 8) + in_tail[0] * (20 * 8 + 16 * 8)
                + in_tail[1] * (20 * 8 + 16 * 8))
    assert io_training_flops(define, sample) == 6 * expected
    # Without the distinct-token path the unit runs on every position.
    define.decoder.embed_tokens.unique_tokens = False
    expected += (sample["net_input"]["src_tokens"].numel() - distinct) * unit
    assert io_training_flops(define, sample) == 6 * expected


def test_benchmark_refuses_a_missing_tcmalloc_before_measuring(tmp_path):
    env = dict(os.environ, TCMALLOC_LIBRARY=str(tmp_path / "missing.so"))
    env.pop("DEFINE_BENCH_ALLOCATOR", None)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.txl_speed", "--allocator", "tcmalloc"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2  # argparse's usage error
    assert "error: --allocator tcmalloc: libtcmalloc not found" in proc.stderr
    assert "round 1/" not in proc.stderr  # nothing was timed
