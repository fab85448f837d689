"""The benchmarks' harness (interleaved timing, targets, results files, allocator report) and their FLOP counts."""

import os
import re
import subprocess
import sys

import pytest
import torch
from arch_cases import TXL_TINY
from conftest import REPO

from benchmarks import gpu_report, group_linear
from benchmarks.common import Bench, Result, Timings, build_model, options
from benchmarks.lstm_lm_speed import step_flops
from benchmarks.targets import (
    FIELDS,
    GOALS,
    KEEP_MARK,
    RATIO_METHOD,
    Check,
    define_train_goal as goal_key,
    figure_line,
    goal_of,
    goal_target as target,
    of_checks,
    parse_figures,
    revision,
    write_result,
)
from benchmarks.txl_speed import io_training_flops, txl_batch


def make_bench(*argv):
    return Bench("benchmarks.example", options("doc", rounds=3), list(argv))


def test_rounds_are_interleaved_rotated_and_warm_up_is_not_recorded():
    bench = make_bench("--rounds", "3", "--warmup", "2")
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    timings = bench.time(fns, before=lambda name: calls.append("before " + name), log=False)
    assert calls[:6] == ["before a", "a", "before b", "b", "before c", "c"]
    order = [c for c in calls if not c.startswith("before")]
    assert order == list("abcbcacababcbca")  # 2 warm-up rounds, 3 timed, each rotated by one
    assert all(len(timings.times[n]) == 3 and len(timings.faults[n]) == 3 for n in "abc")
    assert not timings.errors and not bench.failed


def test_repeat_calls_a_variant_several_times_per_timing():
    bench = make_bench("--rounds", "2", "--warmup", "0")
    count = []
    timings = bench.time({"a": lambda: count.append(1)}, repeat=5, log=False)
    assert len(count) == 10 and len(timings.times["a"]) == 2


def test_a_failing_variant_is_reported_and_the_others_still_run():
    bench = make_bench("--rounds", "2")
    ran = []

    def broken():
        raise RuntimeError("no kernel | for this")

    timings = bench.time({"ok": lambda: ran.append(1), "broken": broken}, log=False)
    assert len(ran) == 3 and len(timings.times["ok"]) == 2
    assert timings.errors["broken"] == "failed: RuntimeError: no kernel / for this"  # no "|": a table cell
    assert timings.ms("broken").startswith("failed") and timings.median("broken") != timings.median("broken")
    assert bench.failed


def test_ratios_of_medians_and_of_rounds():
    t = Timings(["base", "fast"])
    t.times = {"base": [4.0, 6.0, 30.0], "fast": [2.0, 2.0, 3.0]}
    assert t.median("base") == 6.0 and t.speedup("base", "fast") == 3.0
    assert t.paired("base", "fast") == 3.0  # median of 2, 3 and 10
    t.times["base"] = []
    assert t.speedup("base", "fast") != t.speedup("base", "fast")  # nan: nothing measured


def test_checks_at_least_at_most_and_not_measured():
    assert Check("x", 1.2, 1.1).met and not Check("x", 1.0, 1.1).met
    assert Check("r", 1.05, 1.1, at_most=True).met and not Check("r", 1.2, 1.1, at_most=True).met
    assert Check("x", 1.234, 1.1).line() == "- PASS: x: 1.23x (target >= 1.1x)"
    assert Check("r", 1.2, 1.1, at_most=True).line() == "- FAIL: r: 1.20x (target <= 1.1x)"
    assert Check("x", float("nan"), 1.0).line().startswith("- n/a: x: n/a")
    rate = Check("t", 98500.4, 120000.0, unit="tokens/s")
    assert rate.line() == "- FAIL: t: 98,500 tokens/s (target >= 120,000 tokens/s)"


def test_figure_lines_are_the_records_and_parse_back():
    checks = [
        Check("ours vs theirs", 1.25, 1.0, goal="define_train_26k", batch="960 sentences"),
        Check("n", float("nan"), 1),
    ]
    context = dict(command="python -m benchmarks.x", precision="bf16", machine="NVIDIA H200", revision="abc")
    written = of_checks(checks, "x", "results/x.md", context, gpu=True)
    text = "noise\n" + "\n".join(figure_line(r) for r in written)
    first, second = parse_figures(text + "\n- PASS: not a figure line\n")
    assert [first, second] == written and set(first) == set(FIELDS)  # the record the run writes, field for field
    assert first["what"] == "ours vs theirs" and first["value"] == 1.25 and first["met"] is True
    assert (first["goal"], first["batch"], first["precision"]) == ("define_train_26k", "960 sentences", "bf16")
    assert first["ratio_method"] == RATIO_METHOD and first["command"] == "python -m benchmarks.x"
    assert first["target"] == GOALS["define_train_26k"].gpu and first["report_target"] == 1.0
    assert second["value"] is None and second["met"] is None  # nan goes through JSON as null
    # a CPU's name does not say "CPU": the run's device decides which of the goal's targets applies
    (cpu,) = of_checks(checks[:1], "x", None, dict(context, machine="Intel(R) Xeon(R) Processor"), gpu=False)
    assert cpu["target"] == GOALS["define_train_26k"].cpu != GOALS["define_train_26k"].gpu


def test_goals_targets_and_patterns():
    assert target("txl_define_train", cuda=True, default=9) == 1.15 and target("txl_define_train", False, 9) == 1.3
    assert target("txl_nvidia_base", cuda=False, default=7) == 7  # a GPU goal alone
    assert target("", cuda=True, default=2.5) == 2.5
    assert goal_of("GroupLinear g=4 vs dense at 1024 -> 2048, 8192 tokens, GPU time") == "group_linear_dense"
    assert goal_of("`mogrifier_lstm_lm_ptb` stack (default on a GPU: ...) vs `nn.LSTM`, tokens/s") == "mogrifier_lstm"
    assert goal_of("`MogrifierLSTM` r=5, k=84 vs `nn.LSTM`, tokens/s") == ""  # a module, not the model as built
    with pytest.raises(KeyError, match="not in benchmarks/targets.py GOALS"):
        goal_of("x", "no_such_goal")
    assert [goal_key(t) for t in (None, 112, 4000, 26000, 60000)] == ["", "", "define_train_4k", "define_train_26k", ""]
    assert all(g.unit in ("x", "tokens/s") for g in GOALS.values())


def test_revision_names_the_commit_and_a_tree_that_differs(tmp_path, monkeypatch):
    monkeypatch.delenv("DEFINE_FAIRSEQ_REVISION", raising=False)
    assert revision(str(tmp_path)) == "unknown (no git checkout)"

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)  # fmt: skip

    git("init", "-q")
    (tmp_path / "a").write_text("1")
    git("add", "a")
    git("commit", "-q", "-m", "one")
    head = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=tmp_path, capture_output=True, text=True)
    assert revision(str(tmp_path)) == head.stdout.strip()
    (tmp_path / "b").write_text("new")  # a file git does not ignore
    assert revision(str(tmp_path)) == head.stdout.strip() + "+dirty"
    monkeypatch.setenv("DEFINE_FAIRSEQ_REVISION", "0123abcdef+dirty")  # a copied tree: its copier says
    assert revision(str(tmp_path / "copy")) == "0123abcdef+dirty"


def test_quick_and_out_options(tmp_path):
    quick = make_bench("--quick", "--rounds", "7")
    assert (quick.args.rounds, quick.args.warmup, quick.result_path()) == (1, 1, None)
    assert make_bench("--out", "-").result_path() is None
    assert make_bench("--out", str(tmp_path / "x.md")).result_path() == str(tmp_path / "x.md")
    default = make_bench().result_path()
    assert os.path.basename(default) in ("example.md", "example-tcmalloc.md")
    assert make_bench().args.dtype == "fp32" and make_bench("--dtype", "bf16").dtype == torch.bfloat16


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_a_gpu_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        make_bench("--device", "cuda")
    assert exit_info.value.code == 2 and "--device cuda: torch sees no CUDA device" in capsys.readouterr().err


def test_bf16_autocast_and_device_placement():
    bench = make_bench("--dtype", "bf16")
    with bench.autocast():
        y = torch.mm(torch.randn(2, 3), torch.randn(3, 4))
    assert y.dtype == torch.bfloat16
    with make_bench().autocast():
        assert torch.mm(torch.randn(2, 3), torch.randn(3, 4)).dtype == torch.float32
    moved = bench.to({"a": [torch.ones(1)], "n": 3, "s": "x"})
    assert moved["a"][0].device.type == "cpu" and moved["n"] == 3 and moved["s"] == "x"


def test_header_names_the_command_and_the_machine():
    bench = make_bench("--rounds", "2", "--quick")
    header = bench.header("Title", ["a note"], "0123abcdef")
    assert header.startswith("# Title\n")
    assert "- Command: `python -m benchmarks.example --rounds 2 --quick`; revision 0123abcdef" in header
    assert "threads: 2" in header and "allocator: " in header and "- a note" in header and "--quick" in header


def test_write_result_keeps_the_hand_written_part(tmp_path):
    path = str(tmp_path / "r.md")
    write_result(path, "# run 1\n")
    write_result(path, "# run 2\n")
    assert open(path).read() == "# run 2\n"
    with open(path, "a") as f:
        f.write(f"\n{KEEP_MARK}\n\n## History\n\nkept\n")
    write_result(path, "# run 3\n")
    text = open(path).read()
    assert text.startswith("# run 3\n") and "run 2" not in text
    assert text.endswith(f"{KEEP_MARK}\n\n## History\n\nkept\n")


ALLOCATOR_SCRIPT = "from benchmarks.common import allocator; print(allocator())"


def clean_env(**extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k == "LD_PRELOAD" or k.startswith("TCMALLOC_") or (k.startswith("MALLOC_") and k.endswith("_")))
    }
    return dict(env, **extra)


def test_allocator_report_names_the_settings():
    def run(env):
        return subprocess.run(
            [sys.executable, "-c", ALLOCATOR_SCRIPT],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.strip()

    assert run(clean_env()) == "glibc malloc (its defaults)"
    assert run(clean_env(MALLOC_TOP_PAD_="1073741824")) == "glibc malloc (`MALLOC_TOP_PAD_=1073741824`)"


FAULTS_SCRIPT = """
import torch
from benchmarks.common import Bench, options
bench = Bench("benchmarks.example", options("doc", rounds=2), ["--warmup", "0"])
t = bench.time({"fresh": lambda: torch.ones(32 << 20), "none": lambda: None}, log=False)
print(min(t.faults["fresh"]), max(t.faults["none"]))
"""


def test_page_faults_are_counted_per_call():
    # A 128 MB buffer is above glibc's largest mmap threshold: with glibc's defaults every call gets a fresh
    # mapping, one fault per page written.
    proc = subprocess.run(
        [sys.executable, "-c", FAULTS_SCRIPT],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    fresh, none = map(float, proc.stdout.split())
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            huge = "[always]" in f.read()
    except OSError:
        huge = False
    assert fresh > (128 << 20) // ((2 << 20) if huge else 4096) // 2, fresh
    assert none < 100


@pytest.mark.parametrize("training", [True, False])
def test_step_flops_of_an_lstm_lm(training):
    layers, proj = [(8, 16), (16, 16)], (16, 8)
    n = 3 * 5
    forward = (
        2 * n * 8 * 64
        + 2 * n * 16 * 64  # layer 1: input and recurrent products
        + 2 * n * 16 * 64 * 2  # layer 2
        + 2 * n * 16 * 8
        + 2 * n * 8 * 50
    )  # projection, output layer
    assert step_flops(layers, proj, vocab=50, batch=3, bptt=5, training=training) == (3 if training else 1) * forward
    no_proj = forward - 2 * n * 16 * 8 - 2 * n * 8 * 50 + 2 * n * 16 * 50
    assert step_flops(layers, None, 50, 3, 5, training) == (3 if training else 1) * no_proj


# one Transformer-XL layer of the tests' tiny size, with a short memory
TINY_TXL = [*TXL_TINY, "--decoder-layers", "1", "--txl-mem-len", "4"]
TXL_TASK = ["--task", "language_modeling", "--criterion", "lm_regularized_loss", "--ddp-backend", "legacy_ddp"]


def test_io_training_flops_of_the_transformer_xl_layers():
    vocab = 60
    sample = txl_batch(vocab, 3, 10, seed=0)
    target = sample["target"].reshape(-1)
    in_tail = [int(((target >= lo) & (target < hi)).sum()) for lo, hi in ((20, 40), (40, 60))]
    assert sum(in_tail) > 0
    # Standard input, table width = d = 16: no projections; the head scores 20 words + 2 cluster entries.
    standard = build_model("transformer_xl_lm", vocab, TXL_TASK, TINY_TXL)[2]
    expected = 30 * 22 * 16 + (in_tail[0] + in_tail[1]) * 20 * 16
    assert io_training_flops(standard, sample) == 6 * expected
    # DeFINE input, table width n = 8: every cluster projects 16 -> 8, and the unit runs per distinct token.
    define = build_model("transformer_xl_lm", vocab, TXL_TASK, TINY_TXL + ["--input-layer", "define"])[2]
    unit = sum(
        p.numel()
        for name, p in define.decoder.embed_tokens.define.named_parameters()
        if name.startswith("layers.") and name.endswith("weight")
    )
    distinct = sample["net_input"]["src_tokens"].unique().numel()
    expected = (
        distinct * unit + 30 * (22 * 8 + 16 * 8) + in_tail[0] * (20 * 8 + 16 * 8) + in_tail[1] * (20 * 8 + 16 * 8)
    )
    assert io_training_flops(define, sample) == 6 * expected
    # Without the distinct-token path the unit runs on every position.
    define.decoder.embed_tokens.unique_tokens = False
    expected += (sample["net_input"]["src_tokens"].numel() - distinct) * unit
    assert io_training_flops(define, sample) == 6 * expected


def test_a_benchmark_runs_end_to_end_and_returns_its_table_and_targets(capsys):
    result = group_linear.main(["--quick"])
    assert not result.failed
    assert "| 1024 -> 2048, 4 groups | 1024 -> 2048 | 4 |" in result.text
    assert [c.target for c in result.checks] == [1.0] * 4 + [1.5]
    assert "wrote" not in capsys.readouterr().out  # --quick writes no file


def test_gpu_report_tables_figures_and_survives_a_failing_benchmark(monkeypatch, tmp_path):
    def fake(argv):
        assert "--device" in argv and "--quick" in argv and "--out" in argv
        return Result(
            "# Fake\n\n## Part\n", [Check("ours vs theirs", 1.5, 1.2), Check("r", 1.3, 1.1, at_most=True)], False
        )

    def broken(argv):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(group_linear, "main", fake)
    from benchmarks import train_speed

    monkeypatch.setattr(train_speed, "main", broken)
    out = tmp_path / "report.md"
    status = gpu_report.main(["--device", "cpu", "--quick", "--only", "group_linear,train_speed", "--out", str(out)])
    text = out.read_text()
    assert status == 1  # something raised
    assert "| `group_linear` | ours vs theirs | 1.50x | >= 1.2x | yes |" in text
    assert "| `group_linear` | r | 1.30x | <= 1.1x | **no** |" in text
    assert "| `train_speed` | **failed: RuntimeError: out of memory** |" in text
    assert re.search(r"^- Command: `python -m benchmarks.gpu_report .*`; revision \S+", text, re.M)
    assert "## Fake\n\n### Part" in text  # each benchmark's own text follows, its headings one level down
