"""The launch counter (benchmarks/launch_count.py): what one call dispatches, on cases whose count is known by
construction, and the benchmark's quick run."""

import os

import pytest
import torch
from triton_interpreter import interpreted

from benchmarks.launch_count import count_step


class AddsAndMatmul(torch.nn.Module):
    """``k`` additions and one matrix product. Shapes: ``x [B, 4] -> [B, 4]``."""

    def __init__(self, k: int):
        super().__init__()
        self.k, self.weight = k, torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        y = x @ self.weight
        for i in range(self.k):
            y = y + i
        return y


@pytest.mark.parametrize("k", [0, 1, 5])
def test_k_additions_and_one_matmul_count_k_plus_one(k):
    module, x = AddsAndMatmul(k), torch.randn(3, 4)
    with torch.no_grad():
        counts = count_step(lambda: module(x))
    assert counts.launches == k + 1
    assert counts.by_name == ({"aten::mm": 1, "aten::add": k} if k else {"aten::mm": 1})
    assert counts.syncs == 0


def test_views_reshapes_and_allocations_are_not_launches():
    x = torch.randn(4, 6)

    def shapes_only():
        x.view(24).reshape(6, 4).t().unsqueeze(0).expand(2, 4, 6)[:, 1:].select(0, 1).squeeze()
        x[1:].contiguous().flatten()[:3].detach().view_as(torch.empty(3))
        torch.empty(5), torch.empty_like(x), x.split(2), x.chunk(3, 1), x.unbind(0)

    assert count_step(shapes_only) == (0, 0, {}, {})
    # a reshape of a transposed tensor copies it: one kernel
    assert count_step(lambda: x.t().reshape(24)).by_name == {"aten::clone": 1}


def test_an_operation_counts_once_with_what_it_calls():
    """Composites count through what they call (linear: one addmm; cross-entropy: two kernels); a fused GPU
    kernel counts one (dropout, three operations on a CPU); a foreach operation counts one whatever its list."""
    linear, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
    target = torch.tensor([0, 2])
    with torch.no_grad():
        assert count_step(lambda: linear(x)).by_name == {"aten::addmm": 1}
        loss = count_step(lambda: torch.nn.functional.cross_entropy(linear(x), target))
        assert loss.by_name == {"aten::addmm": 1, "aten::_log_softmax": 1, "aten::nll_loss_forward": 1}
        assert count_step(lambda: torch.nn.functional.dropout(x, 0.5, training=True)).launches == 1
    for n in (2, 7):
        tensors = [torch.randn(3) for _ in range(n)]
        assert count_step(lambda: torch._foreach_add_(tensors, 1.0)).by_name == {"aten::_foreach_add_": 1}


def test_a_foreach_adam_step_costs_the_same_for_any_number_of_parameters_and_no_sync():
    """The step counters' .item() stays on the host (they live on the CPU on a GPU too): no sync counted."""
    counts = []
    for n in (2, 6):
        params = [torch.nn.Parameter(torch.randn(3)) for _ in range(n)]
        optimizer = torch.optim.Adam(params, foreach=True)

        def step():
            for p in params:
                p.grad = torch.ones_like(p)
            optimizer.step()

        counts.append(count_step(step))
    assert counts[0].launches - 2 == counts[1].launches - 6  # one ones_like per parameter, the step alike
    assert counts[0].syncs == counts[1].syncs == 0


def test_item_counts_one_sync_and_data_dependent_shapes_count_one_each():
    x = torch.randn(5)
    item = count_step(lambda: x.sum().item())
    assert (item.launches, item.syncs, item.syncs_by_name) == (1, 1, {"aten::_local_scalar_dense": 1})
    masked = count_step(lambda: x[x > 0])
    assert masked.syncs_by_name == {"aten::nonzero": 1} and masked.by_name == {"aten::gt": 1, "aten::index": 1}
    assert count_step(lambda: torch.unique(x)).syncs == 1
    assert count_step(lambda: bool(x[0] > 0)).syncs == 1


def test_a_compiled_function_counts_one_call_each_way():
    def body(x):
        for _ in range(6):
            x = (x + 1).sin()
        return x

    compiled = torch.compile(body, backend="aot_eager", fullgraph=True)
    x = torch.randn(4, requires_grad=True)
    with torch.no_grad():
        assert count_step(lambda: compiled(x)).by_name == {"compiled graph (forward)": 1}
    counts = count_step(lambda: compiled(x).sum().backward())
    # the graphs each way, then sum, its gradient's ones_like and the accumulation into x.grad outside them
    assert counts.by_name == {
        "compiled graph (forward)": 1,
        "compiled graph (backward)": 1,
        "aten::sum": 1,
        "aten::ones_like": 1,
        "aten::add_": 1,
    }


def test_a_graph_break_makes_two_graph_calls():
    def body(x):
        x = x.sin()
        torch._dynamo.graph_break()
        return x.cos()

    compiled = torch.compile(body, backend="aot_eager")
    x = torch.randn(4)
    with torch.no_grad():
        assert count_step(lambda: compiled(x)).by_name == {"compiled graph (forward)": 2}


def test_a_triton_kernel_launched_n_times_counts_n():
    triton = pytest.importorskip("triton", reason="Triton is not installed: pip install -r requirements-dev.txt")
    import triton.language as tl

    with interpreted():

        @triton.jit
        def double(x_ptr, numel, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(x_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=offs < numel), mask=offs < numel)

    def launches(x, n):
        def run():
            for _ in range(n):
                double[(3,)](x, x.numel(), BLOCK=8)  # three programs of 8 elements: one launch
            x.add_(1)

        return run

    for n in (1, 4):
        x = torch.ones(20)
        assert count_step(launches(x, n), warmup=0).by_name == {"triton::double": n, "aten::add_": 1}
        assert torch.equal(x, torch.full((20,), 2.0**n + 1))  # the kernel ran n times on every element


def test_counts_do_not_depend_on_the_thread_count():
    module, x = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1), torch.randn(5, 3, 16)
    counts = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            counts.append(count_step(lambda: module(x).sum().backward()))
    finally:
        torch.set_num_threads(threads)
    assert counts[0] == counts[1] and counts[0].launches > 20


def test_quick_lstm_rows_count_the_model_above_its_layers_and_write_no_file(capsys):
    from benchmarks import launch_count

    result = launch_count.main(["--quick", "--only", "lstm"])
    out = capsys.readouterr().out
    assert not result.failed and "wrote" not in out
    counts = {}
    for line in result.text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 3 and cells[3].isdigit():
            counts[(cells[1], cells[2])] = int(cells[3])
    scoring = "eager, scoring (eval, no grad)"
    assert set(counts) == {
        ("`lstm_lm_define`", "eager, training"),
        ("`lstm_lm_define`", scoring),
        ("`its 3 LSTM layers alone`", scoring),
    }
    # the model scores through the same three fused LSTM layers, plus its embedding, output layer and loss
    assert counts[("`lstm_lm_define`", scoring)] > counts[("`its 3 LSTM layers alone`", scoring)] >= 3
    assert counts[("`lstm_lm_define`", "eager, training")] > counts[("`lstm_lm_define`", scoring)]


def test_bad_options_name_the_flag(capsys):
    from benchmarks import launch_count

    for argv, flag in ((["--only", "gcnn"], "--only gcnn"), (["--mogrifier-cuda-path", "mod.func"], "MODULE:FUNCTION")):
        with pytest.raises(SystemExit):
            launch_count.main(["--quick", *argv])
        assert flag in capsys.readouterr().err


def test_a_missing_mogrifier_entry_point_names_the_flag(monkeypatch):
    from benchmarks.common import Bench, options
    from benchmarks.launch_count import mogrifier_entry

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # mogrifier_entry sets it on a CPU; restored after the test
    bench = Bench("benchmarks.launch_count", options("doc", rounds=1), [])
    with pytest.raises(ValueError, match="--mogrifier-cuda-path define_fairseq.modules:no_such_function"):
        mogrifier_entry(bench, "define_fairseq.modules:no_such_function")
    with pytest.raises(ImportError, match="--mogrifier-cuda-path no_such_module:f"):
        mogrifier_entry(bench, "no_such_module:f")


def test_json_records_one_per_figure(tmp_path):
    import json

    from benchmarks.common import Bench, options
    from benchmarks.launch_count import Row, write_records

    bench = Bench("benchmarks.launch_count", options("doc", rounds=1), ["--threads", "1"])
    rows = [Row("m", "eager", "launches per training step", 120, 3, "goal <= 1x: met")]
    state = {"revision": "abc1234", "uncommitted": []}
    records = json.loads(open(write_records(str(tmp_path / "x.json"), bench, rows, state)).read())
    assert [(r["unit"], r["value"]) for r in records] == [
        ("launches per training step", 120),
        ("syncs per training step", 3),
    ]
    assert records[0]["command"] == "python -m benchmarks.launch_count --threads 1"
    assert {"model", "mode", "revision", "machine", "torch", "goal"} <= set(records[0])
    assert records[0]["torch"] == torch.__version__ and records[0]["revision"] == "abc1234"


@pytest.mark.slow
def test_quick_runs_every_group_end_to_end_and_writes_no_file():
    """In a process of its own: the Mogrifier rows import the Triton step under TRITON_INTERPRET=1. About a
    minute on two cores (compilation with aot_eager, the interpreter)."""
    import subprocess
    import sys

    from conftest import REPO

    results = [os.path.join(REPO, "benchmarks", "results", "launch_count" + ext) for ext in (".md", ".json")]
    before = [os.stat(p).st_mtime_ns if os.path.exists(p) else None for p in results]
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.launch_count", "--quick"], cwd=REPO, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    expected = [
        "`transformer_define` | --torch-compile",
        "`transformer_xl_define_wt103_n128` | --torch-compile",
        "CUDA path (define_fairseq.modules.mogrifier.fused:fused_mogrifier_layer)",
        "CUDA path (define_fairseq.modules.mogrifier.triton_step:triton_mogrifier_layer)",
        "`lstm_lm_define` | eager, training",
    ]
    assert all(row in run.stdout for row in expected), run.stdout[-3000:]
    assert "wrote" not in run.stdout
    assert [os.stat(p).st_mtime_ns if os.path.exists(p) else None for p in results] == before
