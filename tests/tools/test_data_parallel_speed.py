"""``benchmarks.data_parallel``: the ring all-reduce and step-time model, checked against cases worked by hand, and
the reading of the GPU results files it takes its measured steps from (a missing or malformed file is named)."""

import json
import math

import pytest

from benchmarks import data_parallel as dp

RESULTS = """# Training speed: transformer_define vs transformer

- Command: `python -m benchmarks.train_speed --device cuda`
- Run at revision 0123abc on the H200
- torch 2.11.0+cu130, fairseq 0.12.3.1, Python 3.12.3, {precision} (`--dtype`: autocast around forward and loss)
- GPU: NVIDIA H200 (140 GiB, CUDA 13.0, cuDNN 91900); host: 16-core CPU
- Batch (fixed): 150 sentences of 20-32 tokens + EOS; 4010 source and 4075 target tokens; Zipf-distributed tokens

| model | parameters | of which embeddings | step ms (median) | step ms (min) |
|---|---|---|---|---|
| `transformer` | 76.91 M | 32.77 M | {baseline} | 44.1 |
| `transformer_define, token_path=unique` | 54.34 M | 10.14 M | 54.2 | 52.1 |
| `transformer_define, token_path=positions` | 54.34 M | 10.14 M | 51.4 | 50.1 |
"""


def results_file(tmp_path, name="train_speed-nvidia-h200.md", precision="bf16", baseline="47.6"):
    path = tmp_path / name
    path.write_text(RESULTS.format(precision=precision, baseline=baseline))
    return str(path)


@pytest.fixture
def round_numbers(monkeypatch):
    """Assumptions with round values, so that the cases below can be worked by hand."""
    for key, value in (
        ("link_efficiency", 0.5),
        ("ring_step_latency_s", 1e-5),
        ("backward_share", 0.5),
        ("bucket_bytes", 100e6),
        ("legacy_buffer_elements", 2**28),
    ):
        monkeypatch.setitem(dp.ASSUMPTIONS, key, (value, "test"))
    monkeypatch.setitem(dp.LINKS, "test", dp.Link("a 20 GB/s link", 20e9, "test"))


def test_ring_all_reduce_worked_by_hand():
    # 1 GB over 4 GPUs at 10 GB/s: 2 x 3/4 x 0.1 s = 0.15 s, and 2 x 3 steps of 5 us
    assert dp.ring_allreduce_seconds(1e9, 4, 10e9, 5e-6) == pytest.approx(0.15 + 30e-6, rel=1e-12)
    # 8 GPUs, two calls: 2 x 7/8 x 0.1 s = 0.175 s, and 2 calls x 14 steps of 5 us
    assert dp.ring_allreduce_seconds(1e9, 8, 10e9, 5e-6, calls=2) == pytest.approx(0.175 + 140e-6, rel=1e-12)
    assert dp.ring_allreduce_seconds(1e9, 1, 10e9, 5e-6) == 0.0  # nothing to exchange on one GPU
    with pytest.raises(ValueError, match="gpus=0"):
        dp.ring_allreduce_seconds(1e9, 0, 10e9, 5e-6)


def test_step_time_with_and_without_overlap_worked_by_hand(round_numbers):
    # 100 M float32 gradients (400 MB) over 4 GPUs on a 20 GB/s link at half efficiency (10 GB/s):
    # 2 x 3/4 x 400 MB / 10 GB/s = 60 ms of transfer
    total, comm = dp.step_seconds(0.1, 100_000_000, 4, 4, "test", overlap=False)
    assert comm == pytest.approx(0.060 + 6 * 1e-5, rel=1e-12)  # one legacy_ddp call: 2 x 3 latency steps
    assert total == pytest.approx(0.1 + comm, rel=1e-12)
    # overlapped: 4 buckets of 100 MB, 60.24 ms; backward (half of a 50 ms step) hides 25 ms of it
    total, comm = dp.step_seconds(0.05, 100_000_000, 4, 4, "test", overlap=True)
    assert comm == pytest.approx(0.060 + 4 * 6 * 1e-5, rel=1e-12)
    assert total == pytest.approx(0.05 + (0.06024 - 0.025), rel=1e-12)
    # a long backward hides all but the last bucket: 2 x 3/4 x 100 MB / 10 GB/s + 6 latency steps
    total, _ = dp.step_seconds(1.0, 100_000_000, 4, 4, "test", overlap=True)
    assert total == pytest.approx(1.0 + 0.015 + 6e-5, rel=1e-12)


def test_the_fastest_define_row_its_precision_gpu_and_revision_are_read(tmp_path):
    (m,) = dp.parse_results(results_file(tmp_path))
    assert m.pair.baseline == "transformer" and m.baseline_ms == 47.6
    assert (m.define_name, m.define_ms) == ("transformer_define, token_path=positions", 51.4)
    assert (m.precision, m.gpu, m.revision) == ("bf16", "NVIDIA H200", "0123abc")
    assert "4075 target tokens" in m.batch
    assert m.file_params == {"baseline": "76.91 M", "define": "54.34 M"}


def test_the_committed_gpu_results_files_are_read():
    """Every default input parses, and holds both pairs between them (a format change shows here)."""
    measurements = [m for path in dp.input_files(None) for m in dp.parse_results(path)]
    assert {m.pair.baseline for m in measurements} == {"transformer", "transformer_xl_wt103_d384"}
    assert all(m.baseline_ms > 0 and m.define_ms > 0 and m.gpu.startswith("NVIDIA") for m in measurements)


def test_a_missing_input_file_is_named(tmp_path):
    missing = tmp_path / "train_speed-nvidia-x.md"
    with pytest.raises(FileNotFoundError, match="train_speed-nvidia-x.md: no such results file"):
        dp.parse_results(str(missing))


@pytest.mark.parametrize(
    "content,message",
    [
        ("# Notes\n\nno table here\n", "no training table of `transformer`"),
        (RESULTS.format(precision="bf16", baseline="failed: RuntimeError"), "the step of `transformer` is 'failed"),
        (RESULTS.format(precision="int8", baseline="47.6"), "no '- torch ..., <precision>' line"),
        (RESULTS.format(precision="bf16", baseline="47.6").replace("- GPU:", "- Machine:"), "not a GPU results"),
        (
            "\n".join(
                line
                for line in RESULTS.format(precision="bf16", baseline="47.6").splitlines()
                if "| `transformer_d" not in line
            ),
            "a row for `transformer` but none for `transformer_define`",
        ),
    ],
)
def test_a_malformed_input_file_is_named(tmp_path, content, message):
    path = tmp_path / "gpu-nvidia-bad.md"
    path.write_text(content)
    with pytest.raises(ValueError, match="gpu-nvidia-bad.md") as raised:
        dp.parse_results(str(path))
    assert message in str(raised.value)


def test_break_even_bandwidth_worked_by_hand(tmp_path):
    (m,) = dp.parse_results(results_file(tmp_path, baseline="46.4"))  # DeFINE 5 ms slower on one GPU
    params = {"baseline": 80_000_000, "define": 55_000_000}
    # 25 M parameters x 4 bytes x 2 x 3/4 = 150 MB saved per step, worth 5 ms at 30 GB/s
    assert dp.break_even_bandwidth(m, params, 4, 4) == pytest.approx(30e9, rel=1e-9)
    (faster,) = dp.parse_results(results_file(tmp_path, baseline="60"))
    assert dp.break_even_bandwidth(faster, params, 4, 4) == math.inf


def test_the_results_file_and_a_json_record_per_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(dp, "count_pair_params", lambda pair: {"baseline": 80_000_000, "define": 55_000_000})
    source = results_file(tmp_path, precision="fp16")
    out, records = tmp_path / "dp.md", tmp_path / "dp.json"
    assert dp.main(["--inputs", source, "--out", str(out), "--json", str(records)]) == 0
    data = json.loads(records.read_text())
    figures = data["figures"]
    assert len(figures) == 1 + 2 * 2 * 2  # measured, then 4 and 8 GPUs x NVLink and PCIe 5 x overlap or not
    assert all(f["input"]["file"].endswith("train_speed-nvidia-h200.md") for f in figures)
    assert all(f["input"]["revision"] == "0123abc" and f["gradient_element_bytes"] == 2 for f in figures)
    assert figures[0]["gpus"] == 1 and figures[0]["ratio"] == pytest.approx(47.6 / 51.4)
    # without overlap on PCIe 5 at 8 GPUs: each side's all-reduce as the formula gives it
    f = next(f for f in figures if (f["gpus"], f["link"], f["overlap"]) == (8, "PCIe 5", False))
    bandwidth = 63.0e9 * dp.assumption("link_efficiency")
    for side, params in (("baseline", 80_000_000), ("define", 55_000_000)):
        comm = dp.ring_allreduce_seconds(params * 2, 8, bandwidth, dp.assumption("ring_step_latency_s")) * 1e3
        assert f["allreduce_ms"][side] == pytest.approx(comm)
        assert f["expected_step_ms"][side] == pytest.approx(f["measured_step_ms"][side] + comm)
    assert data["inputs"][0]["revision"] == "0123abc" and len(data["inputs"][0]["sha256"]) == 64
    text = out.read_text()
    assert "| `transformer` vs `transformer_define` | [1] 4075 target tokens, fp16, NVIDIA H200 | 8 | PCIe 5 |" in text
    assert "## The DeFINE paper's setting" in text and "1.41x" in text
