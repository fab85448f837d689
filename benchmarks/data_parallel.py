"""Data-parallel training step time on paper: where DeFINE's parameter savings turn into speed.

Each GPU of a data-parallel run keeps the batch of one (fairseq's ``--max-tokens`` is per GPU), computes what one
GPU computes, then all-reduces the gradients. From the per-step times measured on one GPU (the committed GPU
results files, parsed) and each model's gradient bytes (its parameters, counted by building the arch as the
benchmarks do, times the bytes of a gradient element that fairseq all-reduces), this works out the expected step
at 4 and 8 GPUs over NVLink and over PCIe with a ring all-reduce:

    all-reduce = 2 (N - 1) / N x bytes / bandwidth + 2 (N - 1) x latency per all-reduce call

without overlap (fairseq's ``--ddp-backend legacy_ddp``, which the language-model recipes run: the gradients are
all-reduced after backward) and with it (``pytorch_ddp``, the default: buckets of 25 MB all-reduced while backward
runs, so that only what outlasts backward, or at least the last bucket, adds to the step). Beside it, the DeFINE
paper's setting: Transformer-XL on WikiText-103 on four RTX 2080 Ti, 855 against 606 ms a batch (1.41x). The
bandwidths and the rest are named assumptions (:data:`LINKS`, :data:`ASSUMPTIONS`), each with its source.

    .venv/bin/python -m benchmarks.data_parallel [--inputs FILE ...] [--out PATH|-] [--json PATH|-]
"""

import argparse
import glob
import hashlib
import json
import math
import os
import re
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence

from benchmarks.common import RESULTS_DIR

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the GPU results files read by default (under RESULTS_DIR), and whether a pattern must find one
DEFAULT_INPUTS = (("train_speed-nvidia-*.md", True), ("txl_speed-nvidia-*.md", False), ("gpu-nvidia-*.md", True))
PRECISION_LINE = r"- torch [^,]+, fairseq [^,]+, Python [^,]+, (\w+)"  # a results file's header names its precision


class Pair(NamedTuple):
    """A baseline arch and its DeFINE counterpart, as the results tables name them."""

    name: str
    baseline: str
    define: str


PAIRS = (
    Pair("transformer vs transformer_define (translation, V 32k)", "transformer", "transformer_define"),
    Pair(
        "Transformer-XL standard 384 vs DeFINE n=128 (Table 2 sizes)",
        "transformer_xl_wt103_d384",
        "transformer_xl_define_wt103_n128",
    ),
)


class Link(NamedTuple):
    name: str
    bandwidth: float  # bytes/s, each direction, per GPU, as specified
    source: str


LINKS = {
    "NVLink": Link(
        "NVLink 4 through NVSwitch (H100 / H200 SXM)",
        450e9,
        "NVIDIA H100 and H200 Tensor Core GPU datasheets: NVLink 900 GB/s per GPU, both directions together",
    ),
    "PCIe 5": Link(
        "PCIe 5.0 x16 (H100 / H200 on PCIe, no NVLink)",
        63.0e9,
        "PCI-SIG PCIe 5.0: 32 GT/s a lane with 128b/130b coding, 63.0 GB/s each way at x16 (the H100 datasheet: "
        "PCIe Gen5 128 GB/s, both directions)",
    ),
    "PCIe 3": Link(
        "PCIe 3.0 x16 (the paper's RTX 2080 Ti)",
        15.75e9,
        "PCI-SIG PCIe 3.0: 8 GT/s a lane with 128b/130b coding, 15.75 GB/s each way at x16; the RTX 2080 Ti is a "
        "PCIe 3.0 x16 card, and its NVLink bridge joins two cards, not four",
    ),
}
GPU_LINKS = ("NVLink", "PCIe 5")
PAPER_LINK, PAPER_GPUS = "PCIe 3", 4

ASSUMPTIONS = {
    "link_efficiency": (
        0.8,
        "share of a link's specified bandwidth that a ring all-reduce of large messages reaches (assumed; nccl-tests' "
        "bus bandwidth, doc/PERFORMANCE.md, is the figure to set it from on a given machine)",
    ),
    "ring_step_latency_s": (
        5e-6,
        "latency of one of the 2 (N - 1) steps of a ring all-reduce (assumed: the order of nccl-tests' times for an "
        "8-byte all-reduce between two GPUs)",
    ),
    "backward_share": (
        0.5,
        "share of the measured single-GPU step that is backward, during which buckets can be all-reduced (assumed: "
        "backward does twice the forward's products; the loss, the optimizer and the host's work take the rest)",
    ),
    "bucket_bytes": (25 * 2**20, "pytorch_ddp's bucket: fairseq's --bucket-cap-mb, 25 by default"),
    "legacy_buffer_elements": (
        2**28,
        "legacy_ddp all-reduces through one buffer of 2**28 elements (fairseq's LegacyDistributedDataParallel)",
    ),
}
# the precision of a results file's step -> bytes per gradient element that fairseq all-reduces, and why
GRADIENT_BYTES = {
    "bf16": (4, "float32 gradients: bf16 autocast keeps float32 parameters, as fairseq's --amp"),
    "fp16": (2, "float16 gradients: float16 parameters, as fairseq's --fp16 (all-reduced before the float32 masters)"),
    "float32": (4, "float32 gradients"),
}
PAPER = {
    "source": "DeFINE paper (Mehta et al., ICLR 2020), Table 2 and A.3: Transformer-XL on WikiText-103, four RTX "
    "2080 Ti, PyTorch 1.2, the official Transformer-XL code; its precision is not stated (float32 gradients assumed)",
    "baseline": ("Transformer-XL, standard input, n = 384", 139.33e6, 855.0),
    "define": ("Transformer-XL, DeFINE, n = 128", 72.90e6, 606.0),
}


def assumption(key: str) -> float:
    return ASSUMPTIONS[key][0]


class Measurement(NamedTuple):
    """One pair's single-GPU training steps, read from one table of a results file."""

    pair: Pair
    file: str  # relative to the repository
    revision: Optional[str]
    section: str
    gpu: str
    precision: str
    batch: str
    baseline_ms: float
    define_name: str  # the fastest DeFINE variant of the table
    define_ms: float
    file_params: Dict[str, str]  # the parameter counts the table prints


def ring_allreduce_seconds(nbytes: float, gpus: int, bandwidth: float, latency: float, calls: int = 1) -> float:
    """Seconds of a ring all-reduce of ``nbytes`` over ``gpus`` GPUs in ``calls`` calls: ``2 (N - 1) / N x nbytes /
    bandwidth`` plus ``2 (N - 1)`` steps of ``latency`` a call; 0 on one GPU."""
    if gpus < 1 or bandwidth <= 0 or nbytes < 0:
        raise ValueError(f"ring all-reduce: gpus={gpus}, bandwidth={bandwidth}, bytes={nbytes}: out of range")
    if gpus == 1:
        return 0.0
    return 2 * (gpus - 1) / gpus * nbytes / bandwidth + calls * 2 * (gpus - 1) * latency


def step_seconds(step: float, params: int, element_bytes: int, gpus: int, link: str, overlap: bool) -> tuple:
    """``(step seconds, all-reduce seconds)`` at ``gpus`` GPUs for a model whose single-GPU step is ``step``."""
    nbytes = params * element_bytes
    bandwidth = LINKS[link].bandwidth * assumption("link_efficiency")
    latency = assumption("ring_step_latency_s")
    if not overlap:
        calls = math.ceil(params / assumption("legacy_buffer_elements"))
        comm = ring_allreduce_seconds(nbytes, gpus, bandwidth, latency, calls)
        return step + comm, comm
    bucket = assumption("bucket_bytes")
    comm = ring_allreduce_seconds(nbytes, gpus, bandwidth, latency, math.ceil(nbytes / bucket))
    last = ring_allreduce_seconds(min(nbytes, bucket), gpus, bandwidth, latency)
    return step + max(last, comm - assumption("backward_share") * step), comm


def break_even_bandwidth(m: Measurement, params: Dict[str, int], element_bytes: int, gpus: int) -> float:
    """The bus bandwidth (bytes/s) below which DeFINE's step is the shorter without overlap (latency left out):
    ``inf`` where it is shorter on one GPU already, 0 where its gradients are not the smaller."""
    saved = (params["baseline"] - params["define"]) * element_bytes * 2 * (gpus - 1) / gpus
    slower = (m.define_ms - m.baseline_ms) / 1e3
    if slower <= 0:
        return math.inf
    return saved / slower if saved > 0 else 0.0


def _cells(line: str) -> List[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_results(path: str) -> List[Measurement]:
    """Every pair's training table in the results file ``path``: a table with a ``step ms (median)`` column and a
    row for a pair's baseline; the DeFINE side is its fastest row of the pair's DeFINE arch. Raises naming the file
    when it is missing, holds no such table, or a table lacks what is needed."""
    rel = os.path.abspath(path)
    rel = os.path.relpath(rel, REPO) if rel.startswith(REPO + os.sep) else rel
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{rel}: no such results file (give GPU results files with --inputs)")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    text = "\n".join(lines)
    found = re.search(r"\brevision:? `?([0-9a-f]{7,40}(?:\+dirty)?)\b", text)
    revision = found.group(1) if found else None
    section = gpu = precision = batch = ""
    measurements, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section, batch = line.lstrip("#").strip(), ""
        elif re.match(PRECISION_LINE, line):
            precision = re.match(PRECISION_LINE, line).group(1)
        elif line.startswith("- GPU: "):
            gpu = line[len("- GPU: ") :].split(" (")[0]
        elif line.startswith("- Batch"):
            batch = line[2:].split(";")[:2]
            batch = "; ".join(b.strip() for b in batch)
        if not line.startswith("|"):
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i].startswith("|"):
            i += 1
        rows = [_cells(r) for r in lines[start:i]]
        header, body = rows[0], rows[2:]
        if "step ms (median)" not in header:
            continue
        col, names = header.index("step ms (median)"), [r[0].strip("`") for r in body]
        for pair in PAIRS:
            if pair.baseline not in names:
                continue
            where = f"{rel}, the table under '{section}'"
            if precision not in GRADIENT_BYTES:
                raise ValueError(f"{where}: no '- torch ..., <precision>' line of {', '.join(GRADIENT_BYTES)} above it")
            if not gpu:
                raise ValueError(f"{where}: no '- GPU: <name>' line above it: not a GPU results file")
            steps, params = {}, {}
            for name, row in zip(names, body):
                if name == pair.baseline or name.startswith(pair.define):
                    try:
                        steps[name] = float(row[col])
                    except (ValueError, IndexError):
                        cell = row[col] if col < len(row) else "nothing"
                        raise ValueError(f"{where}: the step of `{name}` is {cell!r}, not milliseconds") from None
                    params[name] = row[1] if header[1] == "parameters" else ""
            defines = [n for n in steps if n != pair.baseline]
            if not defines:
                raise ValueError(f"{where}: a row for `{pair.baseline}` but none for `{pair.define}`")
            fastest = min(defines, key=steps.get)
            measurements.append(
                Measurement(
                    pair, rel, revision, section, gpu, precision, batch or section, steps[pair.baseline], fastest,
                    steps[fastest], {"baseline": params[pair.baseline], "define": params[fastest]},
                )
            )  # fmt: skip
        i = max(i, start + 1)
    if not measurements:
        raise ValueError(
            f"{rel}: no training table of {' or '.join(f'`{p.baseline}`' for p in PAIRS)} (a 'step ms (median)' "
            f"column): give train_speed, txl_speed or gpu_report results files made on a GPU"
        )
    return measurements


def input_files(inputs: Optional[Sequence[str]]) -> List[str]:
    """The files given, or every file of :data:`DEFAULT_INPUTS`; a required pattern that finds none raises naming
    it."""
    if inputs:
        return list(inputs)
    files = []
    for pattern, required in DEFAULT_INPUTS:
        found = sorted(glob.glob(os.path.join(RESULTS_DIR, pattern)))
        if required and not found:
            raise FileNotFoundError(f"benchmarks/results/{pattern}: no such results file (run the GPU benchmarks)")
        files += found
    return files


def count_pair_params(pair: Pair) -> Dict[str, int]:
    """The distinct parameters of the pair's two archs, built as the benchmarks that timed them build them."""
    import torch

    from benchmarks.workloads import build_model, count_params

    if pair.baseline == "transformer":
        from benchmarks.train_speed import translation_models

        define, baseline, _, _ = translation_models(6)
        return {"baseline": count_params(baseline), "define": count_params(define)}
    task = ["--task", "language_modeling", "--criterion", "lm_regularized_loss", "--ddp-backend", "legacy_ddp"]
    counts = {}
    for side, arch in (("baseline", pair.baseline), ("define", pair.define)):
        torch.manual_seed(1)
        counts[side] = count_params(build_model(arch, 267735, task, ["--txl-mem-len", "150"])[2])
    return counts


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def figures(measurements: Sequence[Measurement], params: Dict[str, Dict[str, int]]) -> List[dict]:
    """One record per measurement, GPU count, link and overlap: the expected step time of each side and their
    ratio (the baseline's step over DeFINE's: above 1, DeFINE is faster)."""
    records = []
    for m in measurements:
        element_bytes = GRADIENT_BYTES[m.precision][0]
        counts = params[m.pair.name]
        settings = [(1, "", False)] + [(n, link, o) for n in (4, 8) for link in GPU_LINKS for o in (False, True)]
        if m.pair.baseline.startswith("transformer_xl"):
            settings += [(PAPER_GPUS, PAPER_LINK, o) for o in (False, True)]
        for gpus, link, overlap in settings:
            record = dict(
                pair=m.pair.name, input=dict(file=m.file, revision=m.revision, section=m.section, batch=m.batch),
                gpu=m.gpu, precision=m.precision, gradient_element_bytes=element_bytes, parameters=counts,
                parameters_in_file=m.file_params, define_variant=m.define_name, gpus=gpus, link=link,
                overlap=overlap, measured_step_ms=dict(baseline=m.baseline_ms, define=m.define_ms),
            )  # fmt: skip
            steps, comms = {}, {}
            for side, step in (("baseline", m.baseline_ms), ("define", m.define_ms)):
                if gpus == 1:
                    steps[side], comms[side] = step, 0.0
                    continue
                total, comm = step_seconds(step / 1e3, counts[side], element_bytes, gpus, link, overlap)
                steps[side], comms[side] = total * 1e3, comm * 1e3
            record.update(allreduce_ms=comms, expected_step_ms=steps, ratio=steps["baseline"] / steps["define"])
            records.append(record)
    return records


def paper_setting() -> List[dict]:
    """The paper's two Transformer-XL runs: the all-reduce time of each model's float32 gradients over its link,
    set beside its ms a batch (how much of the 1.41x the gradients' traffic can explain)."""
    bandwidth = LINKS[PAPER_LINK].bandwidth * assumption("link_efficiency")
    rows = []
    for how, factor in (("ring all-reduce", 2 * (PAPER_GPUS - 1) / PAPER_GPUS), ("DataParallel", 2.0)):
        comm = {side: PAPER[side][1] * 4 * factor / bandwidth * 1e3 for side in ("baseline", "define")}
        rest = {side: PAPER[side][2] - comm[side] for side in comm}
        rows.append(
            dict(
                traffic=how, gradient_traffic_factor=factor, allreduce_ms=comm, paper_ms=dict(
                    baseline=PAPER["baseline"][2], define=PAPER["define"][2]), rest_ms=rest,
                explained=(comm["baseline"] - comm["define"]) / (PAPER["baseline"][2] - PAPER["define"][2]),
                rest_ratio=rest["baseline"] / rest["define"],
            )
        )  # fmt: skip
    return rows


def main(argv=None) -> int:
    from benchmarks.data_parallel_report import render

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = ", ".join(p for p, _ in DEFAULT_INPUTS)
    parser.add_argument("--inputs", nargs="+", help=f"GPU results files (default: benchmarks/results/{defaults})")
    parser.add_argument("--out", help="the tables ('-': none; default benchmarks/results/data_parallel.md)")
    parser.add_argument("--json", help="the records ('-': none; default benchmarks/results/data_parallel.json)")
    args = parser.parse_args(argv)
    per_file = [(path, parse_results(path)) for path in input_files(args.inputs)]
    measurements = [m for _, found in per_file for m in found]
    params = {p.name: count_pair_params(p) for p in PAIRS if any(m.pair == p for m in measurements)}
    records, paper = figures(measurements, params), paper_setting()
    inputs = [dict(file=found[0].file, revision=found[0].revision, sha256=sha256(path)) for path, found in per_file]
    command = " ".join(["python -m benchmarks.data_parallel"] + list(sys.argv[1:] if argv is None else argv))
    text = render(measurements, records, paper, inputs, command)
    print(text)
    data = dict(
        command=command,
        assumptions={k: dict(value=v[0], source=v[1]) for k, v in ASSUMPTIONS.items()},
        links={k: v._asdict() for k, v in LINKS.items()},
        inputs=inputs,
        figures=records,
        paper=dict(PAPER, rows=paper),
    )
    for path, default, content in (
        (args.out, "data_parallel.md", text),
        (args.json, "data_parallel.json", json.dumps(data, indent=1, sort_keys=True) + "\n"),
    ):
        if path != "-":
            with open(path or os.path.join(RESULTS_DIR, default), "w", encoding="utf-8") as f:
                f.write(content)
    return 0


if __name__ == "__main__":
    sys.exit(main())
