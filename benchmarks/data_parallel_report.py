"""The text of ``benchmarks/results/data_parallel.md``: what ``benchmarks.data_parallel`` works out, as tables."""

import math
import re
from typing import Dict, List

from benchmarks.common import table
from benchmarks.data_parallel import (
    ASSUMPTIONS,
    GRADIENT_BYTES,
    LINKS,
    PAIRS,
    PAPER,
    PAPER_GPUS,
    PAPER_LINK,
    Measurement,
    assumption,
    break_even_bandwidth,
)

OVERLAP = {False: "no (legacy_ddp)", True: "yes (pytorch_ddp)"}


def short_batch(m: Measurement) -> str:
    """``25955 target tokens`` or ``batch 15 x 150`` from a table's batch line or heading, else the whole line."""
    tokens = re.search(r"(\d+) target tokens", m.batch)
    if tokens:
        return f"{tokens.group(1)} target tokens"
    streams = re.search(r"batch (\d+) x tgt_len (\d+)", m.batch)
    return f"batch {streams.group(1)} x {streams.group(2)}" if streams else m.batch


def header(command: str) -> str:
    elements = "; ".join(f"{k}: {v[0]}, {v[1]}" for k, v in GRADIENT_BYTES.items())
    return f"""# Data-parallel step time on paper: DeFINE against its baselines

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
    text = header(command) + "\n## Assumptions\n\n"
    text += table(
        ["name", "value", "source"],
        [[f"link: {k}", f"{v.bandwidth / 1e9:g} GB/s each way: {v.name}", v.source] for k, v in LINKS.items()]
        + [[k, f"{v[0]:g}", v[1]] for k, v in ASSUMPTIONS.items()],
    )
    text += "\n## Inputs\n\n" + table(
        ["", "file", "revision recorded in it", "sha256 (first 12 hex digits)"],
        [[k + 1, f"`{i['file']}`", i["revision"] or "none", i["sha256"][:12]] for k, i in enumerate(inputs)],
    )
    grads = {(r["pair"], r["gradient_element_bytes"]): r["parameters"] for r in records}
    text += "\n## Gradients\n\n" + table(
        ["model pair", "parameters (built)", "bytes an element", "all-reduced MB", "their ratio (the ceiling)"],
        [
            [
                short[pair],
                f"{counts['baseline'] / 1e6:.2f} M / {counts['define'] / 1e6:.2f} M",
                size,
                f"{counts['baseline'] * size / 1e6:.0f} / {counts['define'] * size / 1e6:.0f}",
                f"{counts['baseline'] / counts['define']:.2f}x",
            ]
            for (pair, size), counts in grads.items()
        ],
    )
    printed = {
        f"{m.file} ({m.define_name if side == 'define' else m.pair.baseline}): {m.file_params[side]}"
        for m in measurements
        for side in ("baseline", "define")
        if m.file_params[side] and m.file_params[side] != f"{grads_of(grads, m)[side] / 1e6:.2f} M"
    }
    text += (
        "\nThe ceiling: the step ratio when the all-reduce takes all of the step. The parameters the results files "
        f"print: {'; '.join(sorted(printed)) if printed else 'the built counts, every one'}.\n\n"
        "## Expected step time\n\n"
    )
    rows = []
    for r in records:
        steps, link = r["expected_step_ms"], r["link"]
        rows.append(
            [short[r["pair"]], label[(r["input"]["file"], r["input"]["section"])], r["gpus"]]
            + [link or "- (measured)", OVERLAP[r["overlap"]] if link else "-"]
            + [f"{steps['baseline']:.1f}", f"{steps['define']:.1f}", f"{r['ratio']:.2f}x"]
        )
    text += table(["model pair", "measured step", "GPUs", "link", "overlap", "baseline ms", "DeFINE ms", "ratio"], rows)
    variants = "; ".join(sorted({f"`{m.define_name}`" for m in measurements}))
    text += (
        f"\nDeFINE's side: {variants} (each table's fastest). The {PAPER_LINK} rows put the paper's link under the "
        "steps measured here.\n\n## Where DeFINE's smaller gradients turn into speed\n\nThe bus bandwidth (link x "
        "efficiency) below which DeFINE's step is the shorter without overlap: DeFINE's gradient bytes saved x 2 (N "
        '- 1) / N over its extra single-GPU time ("always": it is the faster on one GPU already).\n\n'
    )
    rows = []
    for m in measurements:
        counts = grads_of(grads, m)
        cells = [break_even_bandwidth(m, counts, GRADIENT_BYTES[m.precision][0], gpus) for gpus in (4, 8)]
        rows.append(
            [short[m.pair.name], label[(m.file, m.section)], f"{m.baseline_ms / m.define_ms:.2f}x"]
            + ["always" if b == math.inf else f"{b / 1e9:.1f} GB/s" for b in cells]
        )
    text += table(["model pair", "measured step", "ratio on one GPU", "break-even, 4 GPUs", "8 GPUs"], rows)
    bus = ", ".join(f"{k} {v.bandwidth * assumption('link_efficiency') / 1e9:.1f} GB/s" for k, v in LINKS.items())
    return text + f"\nThe bus bandwidths assumed here: {bus}.\n\n" + paper_section(paper)


def grads_of(grads: Dict, m: Measurement) -> Dict[str, int]:
    return grads[(m.pair.name, GRADIENT_BYTES[m.precision][0])]


def paper_section(paper: List[Dict]) -> str:
    base, define = PAPER["baseline"], PAPER["define"]
    gap = base[2] - define[2]
    text = (
        f"## The DeFINE paper's setting\n\n{PAPER['source']}. {base[0]}: {base[1] / 1e6:.2f} M parameters, "
        f"{base[2]:g} ms a batch; {define[0]}: {define[1] / 1e6:.2f} M, {define[2]:g} ms ({base[2] / define[2]:.2f}x). "
        f"At {PAPER_GPUS} GPUs over {LINKS[PAPER_LINK].name}, float32 gradients, without overlap; DataParallel (the "
        "official Transformer-XL code's multi-GPU mode) copies the parameters to every GPU and sums the gradients on "
        "one, every step: about 2 x bytes through a chain of links. What the gradients' traffic leaves of the "
        f"paper's {gap:g} ms difference is the two models' compute:\n\n"
    )
    return text + table(
        ["gradient traffic", "ms (standard / DeFINE)", f"of the {gap:g} ms", "the rest, ms", "ratio of the rests"],
        [
            [
                f"{p['traffic']}, {p['gradient_traffic_factor']:.2f} x bytes",
                f"{p['allreduce_ms']['baseline']:.0f} / {p['allreduce_ms']['define']:.0f}",
                f"{p['explained']:.0%}",
                f"{p['rest_ms']['baseline']:.0f} / {p['rest_ms']['define']:.0f}",
                f"{p['rest_ratio']:.2f}x",
            ]
            for p in paper
        ],
    )
