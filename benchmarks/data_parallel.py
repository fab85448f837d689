"""Data-parallel training step time on paper: where DeFINE's parameter savings turn into speed. From the
single-GPU steps of the committed GPU results files and each model's gradient bytes, the expected step at 4 and 8
GPUs over NVLink and PCIe with a ring all-reduce, with and without overlap (``results/data_parallel.md`` gives the
formula and what is not modelled), beside the DeFINE paper's setting; every assumption is named with its source.
"""

import argparse
import glob
import hashlib
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

from benchmarks.common import REPO, RESULTS_DIR
from benchmarks.targets import table
from benchmarks.txl_speed import DEFINE as TXL_DEFINE, STANDARD as TXL_STANDARD, TASK as TXL_TASK

# the GPU results files read by default (under RESULTS_DIR), and whether a pattern must find one
DEFAULT_INPUTS = (("train_speed-nvidia-*.md", True), ("txl_speed-nvidia-*.md", False), ("gpu-nvidia-*.md", True))
PRECISION_LINE = r"- torch [^,]+, fairseq [^,]+, Python [^,]+, (\w+)"  # a results file's header names its precision


# a baseline arch and its DeFINE counterpart, as the results tables name them
Pair = NamedTuple("Pair", [("name", str), ("baseline", str), ("define", str)])
PAIRS = (
    Pair("transformer vs transformer_define (translation, V 32k)", "transformer", "transformer_define"),
    Pair("Transformer-XL standard 384 vs DeFINE n=128 (Table 2 sizes)", TXL_STANDARD, TXL_DEFINE),
)


# a link: its bandwidth in bytes/s, each direction, per GPU, as specified
Link = NamedTuple("Link", [("name", str), ("bandwidth", float), ("source", str)])
LINKS = {
    "NVLink": Link("NVLink 4 through NVSwitch (H100 / H200 SXM)", 450e9, "NVIDIA H100 and H200 Tensor Core GPU "
                   "datasheets: NVLink 900 GB/s per GPU, both directions together"),
    "PCIe 5": Link("PCIe 5.0 x16 (H100 / H200 on PCIe, no NVLink)", 63.0e9, "PCI-SIG PCIe 5.0: 32 GT/s a lane with "
                   "128b/130b coding, 63.0 GB/s each way at x16 (the H100 datasheet: PCIe Gen5 128 GB/s, both "
                   "directions)"),
    "PCIe 3": Link("PCIe 3.0 x16 (the paper's RTX 2080 Ti)", 15.75e9, "PCI-SIG PCIe 3.0: 8 GT/s a lane with 128b/130b "
                   "coding, 15.75 GB/s each way at x16; the RTX 2080 Ti is a PCIe 3.0 x16 card, and its NVLink bridge "
                   "joins two cards, not four"),
}  # fmt: skip
GPU_LINKS, PAPER_LINK, PAPER_GPUS = ("NVLink", "PCIe 5"), "PCIe 3", 4
ASSUMPTIONS = {
    "link_efficiency": (0.8, "share of a link's specified bandwidth that a ring all-reduce of large messages reaches "
                        "(assumed; nccl-tests' bus bandwidth, doc/PERFORMANCE.md, is the figure to set it from on a "
                        "given machine)"),
    "ring_step_latency_s": (5e-6, "latency of one of the 2 (N - 1) steps of a ring all-reduce (assumed: the order of "
                            "nccl-tests' times for an 8-byte all-reduce between two GPUs)"),
    "backward_share": (0.5, "share of the measured single-GPU step that is backward, during which buckets can be "
                       "all-reduced (assumed: backward does twice the forward's products; the loss, the optimizer "
                       "and the host's work take the rest)"),
    "bucket_bytes": (25 * 2**20, "pytorch_ddp's bucket: fairseq's --bucket-cap-mb, 25 by default"),
    "legacy_buffer_elements": (2**28, "legacy_ddp all-reduces through one buffer of 2**28 elements (fairseq's "
                               "LegacyDistributedDataParallel)"),
}  # fmt: skip
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
OVERLAP = {False: "no (legacy_ddp)", True: "yes (pytorch_ddp)"}


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
    return 0.0 if gpus == 1 else 2 * (gpus - 1) / gpus * nbytes / bandwidth + calls * 2 * (gpus - 1) * latency


def step_seconds(step: float, params: int, element_bytes: int, gpus: int, link: str, overlap: bool) -> tuple:
    """``(step seconds, all-reduce seconds)`` at ``gpus`` GPUs for a model whose single-GPU step is ``step``."""
    nbytes, bucket = params * element_bytes, assumption("bucket_bytes")
    bandwidth = LINKS[link].bandwidth * assumption("link_efficiency")
    latency = assumption("ring_step_latency_s")
    if not overlap:
        calls = math.ceil(params / assumption("legacy_buffer_elements"))
        comm = ring_allreduce_seconds(nbytes, gpus, bandwidth, latency, calls)
        return step + comm, comm
    comm = ring_allreduce_seconds(nbytes, gpus, bandwidth, latency, math.ceil(nbytes / bucket))
    last = ring_allreduce_seconds(min(nbytes, bucket), gpus, bandwidth, latency)
    return step + max(last, comm - assumption("backward_share") * step), comm


def break_even_bandwidth(m: Measurement, params: Dict[str, int], element_bytes: int, gpus: int) -> float:
    """The bus bandwidth (bytes/s) below which DeFINE's step is the shorter without overlap (latency left out):
    ``inf`` where it is shorter on one GPU already, 0 where its gradients are not the smaller."""
    saved = (params["baseline"] - params["define"]) * element_bytes * 2 * (gpus - 1) / gpus
    slower = (m.define_ms - m.baseline_ms) / 1e3
    return math.inf if slower <= 0 else saved / slower if saved > 0 else 0.0


def parse_results(path: str) -> List[Measurement]:
    """Every pair's training table in the results file ``path``: a table with a ``step ms (median)`` column and a
    row for a pair's baseline; the DeFINE side is its fastest row of the pair's DeFINE arch. Raises naming the file
    when it is missing, holds no such table, or a table lacks what is needed."""
    rel = os.path.abspath(path)
    rel = os.path.relpath(rel, REPO) if rel.startswith(REPO + os.sep) else rel
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{rel}: no such results file (give GPU results files with --inputs)")
    text = Path(path).read_text(encoding="utf-8")
    found = re.search(r"\brevision:? `?([0-9a-f]{7,40}(?:\+dirty)?)\b", text)
    above = dict(file=rel, revision=found.group(1) if found else None, section="", gpu="", precision="", batch="")
    measurements, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if block and "step ms (median)" in block[0]:  # a table has ended: its rows, under what came before it
            measurements += pair_steps(block[0], block[2:], **above)
        block = []
        if line.startswith("#"):
            above.update(section=line.lstrip("#").strip(), batch="")
        elif re.match(PRECISION_LINE, line):
            above["precision"] = re.match(PRECISION_LINE, line).group(1)
        elif line.startswith("- GPU: "):
            above["gpu"] = line[len("- GPU: ") :].split(" (")[0]
        elif line.startswith("- Batch"):
            above["batch"] = "; ".join(b.strip() for b in line[2:].split(";")[:2])
    if not measurements:
        raise ValueError(
            f"{rel}: no training table of {' or '.join(f'`{p.baseline}`' for p in PAIRS)} (a 'step ms (median)' "
            f"column): give train_speed, txl_speed or gpu_report results files made on a GPU"
        )
    return measurements


def pair_steps(header, body, file, revision, section, gpu, precision, batch) -> List[Measurement]:
    """The measurements of one table (``header``, ``body`` rows) for each pair whose baseline it has a row of, under
    the section, GPU, precision and batch lines above it in ``file`` (at ``revision``)."""
    where = f"{file}, the table under '{section}'"
    col, names, out = header.index("step ms (median)"), [r[0].strip("`") for r in body], []
    for pair in (p for p in PAIRS if p.baseline in names):
        if precision not in GRADIENT_BYTES:
            raise ValueError(f"{where}: no '- torch ..., <precision>' line of {', '.join(GRADIENT_BYTES)} above it")
        if not gpu:
            raise ValueError(f"{where}: no '- GPU: <name>' line above it: not a GPU results file")
        steps, params = {}, {}
        for name, row in ((n, r) for n, r in zip(names, body) if n == pair.baseline or n.startswith(pair.define)):
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
        file_params = {"baseline": params[pair.baseline], "define": params[fastest]}
        steps = (steps[pair.baseline], fastest, steps[fastest])
        out.append(Measurement(pair, file, revision, section, gpu, precision, batch or section, *steps, file_params))
    return out


def input_files(inputs: Optional[Sequence[str]]) -> List[str]:
    """The files given, or every file of :data:`DEFAULT_INPUTS`; a required pattern that finds none raises."""
    files = list(inputs or [])
    for pattern, required in DEFAULT_INPUTS if not inputs else ():
        found = sorted(glob.glob(os.path.join(RESULTS_DIR, pattern)))
        if required and not found:
            raise FileNotFoundError(f"benchmarks/results/{pattern}: no such results file (run the GPU benchmarks)")
        files += found
    return files


def count_pair_params(pair: Pair) -> Dict[str, int]:
    """The distinct parameters of the pair's two archs, built as the benchmarks that timed them build them."""
    from benchmarks.common import build_model, count_params
    from benchmarks.train_speed import translation_models

    if pair.baseline == "transformer":
        define, baseline = translation_models(6)[:2]
    else:
        flags = ["--txl-mem-len", "150"]
        define, baseline = (build_model(arch, 267735, TXL_TASK, flags)[2] for arch in (pair.define, pair.baseline))
    return {"baseline": count_params(baseline), "define": count_params(define)}


def figures(measurements: Sequence[Measurement], params: Dict[str, Dict[str, int]]) -> List[dict]:
    """One record per measurement, GPU count, link and overlap: the expected step time of each side and their
    ratio (the baseline's step over DeFINE's: above 1, DeFINE is faster)."""
    records = []
    for m in measurements:
        element_bytes, counts = GRADIENT_BYTES[m.precision][0], params[m.pair.name]
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
            steps, comms = dict(baseline=m.baseline_ms, define=m.define_ms), dict(baseline=0.0, define=0.0)
            for side, step in list(steps.items()) if gpus > 1 else ():
                total, comm = step_seconds(step / 1e3, counts[side], element_bytes, gpus, link, overlap)
                steps[side], comms[side] = total * 1e3, comm * 1e3
            record.update(allreduce_ms=comms, expected_step_ms=steps, ratio=steps["baseline"] / steps["define"])
            records.append(record)
    return records


def paper_setting() -> List[dict]:
    """The paper's two Transformer-XL runs: the all-reduce time of each model's float32 gradients over its link,
    set beside its ms a batch (how much of the 1.41x the gradients' traffic can explain)."""
    bandwidth = LINKS[PAPER_LINK].bandwidth * assumption("link_efficiency")
    paper_ms = dict(baseline=PAPER["baseline"][2], define=PAPER["define"][2])
    rows = []
    for how, factor in (("ring all-reduce", 2 * (PAPER_GPUS - 1) / PAPER_GPUS), ("DataParallel", 2.0)):
        comm = {side: PAPER[side][1] * 4 * factor / bandwidth * 1e3 for side in ("baseline", "define")}
        rest = {side: PAPER[side][2] - comm[side] for side in comm}
        explained = (comm["baseline"] - comm["define"]) / (paper_ms["baseline"] - paper_ms["define"])
        rows.append(dict(traffic=how, gradient_traffic_factor=factor, allreduce_ms=comm, paper_ms=paper_ms,
                         rest_ms=rest, explained=explained, rest_ratio=rest["baseline"] / rest["define"]))  # fmt: skip
    return rows


def short_batch(m: Measurement) -> str:
    """``25955 target tokens`` or ``batch 15 x 150`` from a table's batch line or heading, else the whole line."""
    tokens, streams = re.search(r"(\d+) target tokens", m.batch), re.search(r"batch (\d+) x tgt_len (\d+)", m.batch)
    if tokens:
        return f"{tokens.group(1)} target tokens"
    return f"batch {streams.group(1)} x {streams.group(2)}" if streams else m.batch


HEADER = """# Data-parallel step time on paper: DeFINE against its baselines

- Command: `{command}`
- Each GPU keeps the measured single-GPU batch and step; at N GPUs the step adds a ring all-reduce of the gradients,
  2 (N - 1) / N x bytes / (bandwidth x link efficiency) + 2 (N - 1) x latency per all-reduce call: after backward
  (no overlap: fairseq's `--ddp-backend legacy_ddp`, the language-model recipes' choice) or, overlapped with backward
  (`pytorch_ddp`, 25 MB buckets), only what outlasts backward, at least the last bucket.
- Gradient bytes: the distinct parameters of each arch, built as its benchmark builds it, x the bytes of an
  all-reduced gradient element ({elements}).
- DeFINE's side is the fastest DeFINE row of each measured table. Ratio: the baseline's step over DeFINE's (above 1,
  DeFINE is faster). Not modelled: NCCL's kernels sharing the GPU with backward, legacy_ddp's copies into its buffer,
  the PCIe topology (eight GPUs on PCIe usually span two CPU sockets, slower than assumed), `--update-freq k` (one
  all-reduce per k batches: the all-reduce's share divided by k).
"""


def render(measurements: List[Measurement], records: List[dict], paper: List[dict], inputs: List[dict], command: str):
    """The results file: assumptions, inputs, gradients, expected step times, break-even bandwidths, the paper."""
    files = [i["file"] for i in inputs]
    label = {
        (m.file, m.section): f"[{files.index(m.file) + 1}] {short_batch(m)}, {m.precision}, {m.gpu}"
        for m in measurements
    }
    short = {p.name: f"`{p.baseline}` vs `{p.define}`" for p in PAIRS}
    elements = "; ".join(f"{k}: {v[0]}, {v[1]}" for k, v in GRADIENT_BYTES.items())
    rows = [[f"link: {k}", f"{v.bandwidth / 1e9:g} GB/s each way: {v.name}", v.source] for k, v in LINKS.items()]
    rows += [[k, f"{v[0]:g}", v[1]] for k, v in ASSUMPTIONS.items()]
    text = HEADER.format(command=command, elements=elements) + "\n## Assumptions\n\n"
    text += table("name | value | source", rows)
    rows = [[k + 1, f"`{i['file']}`", i["revision"] or "none", i["sha256"][:12]] for k, i in enumerate(inputs)]
    text += "\n## Inputs\n\n" + table(" | file | revision recorded in it | sha256 (first 12 hex digits)", rows)
    grads = {(r["pair"], r["gradient_element_bytes"]): r["parameters"] for r in records}
    built = {r["pair"]: r["parameters"] for r in records}  # each pair's, whatever the gradients' precision
    rows = []
    for (pair, size), n in grads.items():
        base, define = n["baseline"], n["define"]
        mb = f"{base * size / 1e6:.0f} / {define * size / 1e6:.0f}"
        rows.append([short[pair], f"{base / 1e6:.2f} M / {define / 1e6:.2f} M", size, mb, f"{base / define:.2f}x"])
    columns = "model pair | parameters (built) | bytes an element | all-reduced MB | their ratio (the ceiling)"
    text += "\n## Gradients\n\n" + table(columns, rows)
    printed = {
        f"{m.file} ({m.define_name if side == 'define' else m.pair.baseline}): {m.file_params[side]}"
        for m in measurements
        for side in ("baseline", "define")
        if m.file_params[side] and m.file_params[side] != f"{built[m.pair.name][side] / 1e6:.2f} M"
    }
    text += (
        "\nThe ceiling: the step ratio when the all-reduce takes all of the step. The parameters the results files "
        f"print: {'; '.join(sorted(printed)) if printed else 'the built counts, every one'}.\n\n"
        "## Expected step time\n\n"
    )
    rows = []
    for r in records:
        steps, link, measured = r["expected_step_ms"], r["link"], label[(r["input"]["file"], r["input"]["section"])]
        cells = [link or "- (measured)", OVERLAP[r["overlap"]] if link else "-", f"{steps['baseline']:.1f}"]
        rows.append([short[r["pair"]], measured, r["gpus"], *cells, f"{steps['define']:.1f}", f"{r['ratio']:.2f}x"])
    text += table("model pair | measured step | GPUs | link | overlap | baseline ms | DeFINE ms | ratio", rows)
    variants = "; ".join(sorted({f"`{m.define_name}`" for m in measurements}))
    text += (
        f"\nDeFINE's side: {variants} (each table's fastest). The {PAPER_LINK} rows put the paper's link under the "
        "steps measured here.\n\n## Where DeFINE's smaller gradients turn into speed\n\nThe bus bandwidth (link x "
        "efficiency) below which DeFINE's step is the shorter without overlap: DeFINE's gradient bytes saved x 2 (N "
        '- 1) / N over its extra single-GPU time ("always": it is the faster on one GPU already).\n\n'
    )
    rows = []
    for m in measurements:
        cells = [break_even_bandwidth(m, built[m.pair.name], GRADIENT_BYTES[m.precision][0], n) for n in (4, 8)]
        cells = ["always" if b == math.inf else f"{b / 1e9:.1f} GB/s" for b in cells]
        rows.append([short[m.pair.name], label[(m.file, m.section)], f"{m.baseline_ms / m.define_ms:.2f}x", *cells])
    text += table("model pair | measured step | ratio on one GPU | break-even, 4 GPUs | 8 GPUs", rows)
    bus = ", ".join(f"{k} {v.bandwidth * assumption('link_efficiency') / 1e9:.1f} GB/s" for k, v in LINKS.items())
    return text + f"\nThe bus bandwidths assumed here: {bus}.\n\n" + paper_section(paper)


def paper_section(paper: List[Dict]) -> str:
    (name, params, ms), (define, define_params, define_ms) = PAPER["baseline"], PAPER["define"]
    gap = ms - define_ms
    text = (
        f"## The DeFINE paper's setting\n\n{PAPER['source']}. {name}: {params / 1e6:.2f} M parameters, "
        f"{ms:g} ms a batch; {define}: {define_params / 1e6:.2f} M, {define_ms:g} ms ({ms / define_ms:.2f}x). "
        f"At {PAPER_GPUS} GPUs over {LINKS[PAPER_LINK].name}, float32 gradients, without overlap; DataParallel (the "
        "official Transformer-XL code's multi-GPU mode) copies the parameters to every GPU and sums the gradients on "
        "one, every step: about 2 x bytes through a chain of links. What the gradients' traffic leaves of the "
        f"paper's {gap:g} ms difference is the two models' compute:\n\n"
    )
    rows = [
        [f"{p['traffic']}, {p['gradient_traffic_factor']:.2f} x bytes"]
        + [f"{p['allreduce_ms']['baseline']:.0f} / {p['allreduce_ms']['define']:.0f}", f"{p['explained']:.0%}"]
        + [f"{p['rest_ms']['baseline']:.0f} / {p['rest_ms']['define']:.0f}", f"{p['rest_ratio']:.2f}x"]
        for p in paper
    ]
    columns = f"gradient traffic | ms (standard / DeFINE) | of the {gap:g} ms | the rest, ms | ratio of the rests"
    return text + table(columns, rows)


def main(argv=None) -> int:
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
    digest = {path: hashlib.sha256(Path(path).read_bytes()).hexdigest() for path, _ in per_file}
    inputs = [dict(file=found[0].file, revision=found[0].revision, sha256=digest[path]) for path, found in per_file]
    command = " ".join(["python -m benchmarks.data_parallel"] + list(sys.argv[1:] if argv is None else argv))
    text = render(measurements, records, paper, inputs, command)
    print(text)
    assumptions = {k: dict(value=v[0], source=v[1]) for k, v in ASSUMPTIONS.items()}
    links = {k: v._asdict() for k, v in LINKS.items()}
    data = dict(command=command, assumptions=assumptions, links=links, inputs=inputs, figures=records)
    data = json.dumps(dict(data, paper=dict(PAPER, rows=paper)), indent=1, sort_keys=True) + "\n"
    for path, default, content in ((args.out, "data_parallel.md", text), (args.json, "data_parallel.json", data)):
        if path != "-":
            Path(path or os.path.join(RESULTS_DIR, default)).write_text(content, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
