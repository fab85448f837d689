"""Every benchmark on a GPU with short settings, in one run, and one table of its figures beside the GPU targets;
each benchmark's own tables follow in the same file (default ``benchmarks/results/gpu-<gpu name>.md``).

    .venv/bin/python -m benchmarks.gpu_report [--out PATH] [--only train_speed,mogrifier_speed] [--tests-log LOG]

A missed target does not stop the run; a benchmark that raises is reported in the table and the others still run
(exit status 1 when something raised, 0 otherwise). ``--device cpu --quick`` checks the whole report on a CPU.
"""

import argparse
import gc
import importlib
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback

import numpy
import torch

from benchmarks.common import RESULTS_DIR, error_text, slug, table, write_result
from benchmarks.records import json_path, of_checks, write
from benchmarks.targets import revision, show, show_target

# (benchmark, its options): each a few tens of seconds on one H100 (the Mogrifier's torch.compile about a minute)
RUNS = (
    ("group_linear", ["--rounds", "10"]),
    ("train_speed", ["--rounds", "10"]),
    ("train_speed", ["--tokens", "26000", "--rounds", "5"]),
    ("train_speed", ["--dtype", "fp16", "--rounds", "10"]),
    ("generate_speed", ["--rounds", "5"]),
    ("lstm_lm_speed", ["--rounds", "5"]),
    ("mogrifier_speed", ["--rounds", "5"]),
    ("txl_speed", ["--rounds", "5"]),
    ("txl_speed", ["--shape", "nvidia-base", "--rounds", "5"]),
    ("gcnn_speed", ["--parts", "train,generate", "--rounds", "3"]),
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that everything runs")
    parser.add_argument("--out", help="the report's file ('-': none)")
    parser.add_argument("--tests-log", help="pytest's output on this machine: its summary line goes in the report")
    parser.add_argument("--only", help="comma-separated benchmarks to run, of: " + ", ".join(n for n, _ in RUNS))
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    only = [n.strip() for n in (args.only or ",".join(n for n, _ in RUNS)).split(",") if n.strip()]
    if not only or set(only) - {n for n, _ in RUNS}:
        parser.error(f"--only {args.only}: choose from {', '.join(n for n, _ in RUNS)}")
    device = torch.cuda.get_device_name() if cuda else "CPU"
    rev = revision(os.path.dirname(RESULTS_DIR))
    start, rows, sections, failed, checks = time.perf_counter(), [], [], False, []
    for name, extra in RUNS:
        if name not in only:
            continue
        began, label = time.perf_counter(), run_label(name, extra)
        print(f"== {label}", file=sys.stderr, flush=True)
        try:
            result = importlib.import_module(f"benchmarks.{name}").main(
                ["--device", args.device, "--out", "-", *extra] + (["--quick"] if args.quick else [])
            )
            failed |= result.failed
            checks.append((name, result.checks))
            rows += [
                [
                    f"`{label}`",
                    c.what,
                    show(c.value, c.unit),
                    show_target(c.target, c.unit, c.at_most),
                    "n/a" if c.value != c.value else "yes" if c.met else "**no**",
                ]
                for c in result.checks
            ]
            sections.append(
                re.sub(r"^#", "##", result.text, flags=re.M) + f"\n({label}: {time.perf_counter() - began:.0f} s)\n"
            )
        except (Exception, SystemExit) as error:  # reported; the other benchmarks still run
            traceback.print_exc()
            failed = True
            rows.append([f"`{label}`", f"**{error_text(error)}**", "", "", ""])
        finally:
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    command = " ".join(argv if argv is not None else sys.argv[1:])
    tests = ""
    if args.tests_log:
        summaries = (
            [line.strip("= \n") for line in open(args.tests_log) if re.search(r"\d+ (passed|failed)", line)]
            if os.path.exists(args.tests_log)
            else []
        )
        tests = f"\n- `pytest -m cuda`: {summaries[-1] if summaries else 'no summary line in ' + args.tests_log}"
    text = (
        f"# Benchmarks on {device}: figures and targets\n\n"
        f"- Command: `python -m benchmarks.gpu_report {command}`; revision {rev}"
        f"\n- {environment(cuda)}; {time.strftime('%Y-%m-%d %H:%M')}, {time.perf_counter() - start:.0f} s in all"
        + tests
        + ("\n- **--quick: tiny sizes, measures nothing**" if args.quick else "")
        + "\n- Ratios are speed ratios (how many times faster) from one run, the variants timed interleaved; each "
        "benchmark's section below gives its settings, precision and tables\n\n"
        + table(["benchmark", "figure", "measured", "target", "met"], rows)
        + "\n"
        + "\n".join(sections)
    )
    print(text)
    out = args.out or (None if args.quick else os.path.join(RESULTS_DIR, f"gpu-{slug(device)}.md"))
    if out and out != "-":
        write_result(out, text)
        print(f"wrote {os.path.relpath(out)}")
        context = dict(command=f"python -m benchmarks.gpu_report {command}", revision=rev, machine=device)
        context["precision"] = "bf16" if cuda else "fp32"  # each benchmark's default on the device
        report = f"results/{os.path.basename(out)}"
        write(json_path(out), [r for name, c in checks for r in of_checks(c, name, report, context, cuda)])
    return 1 if failed else 0


def run_label(name: str, extra) -> str:
    """The benchmark's name and the options that set what it measures (all but ``--rounds``)."""
    shown = [a for i, a in enumerate(extra) if a != "--rounds" and (i == 0 or extra[i - 1] != "--rounds")]
    return " ".join([name, *shown])


def environment(cuda: bool) -> str:
    """The GPU, its driver, CUDA, torch, numpy and Python, as one line."""
    text = f"torch {torch.__version__}, numpy {numpy.__version__}, Python {platform.python_version()}"
    if not cuda:
        return text
    driver = "driver unknown (no nvidia-smi)"
    if shutil.which("nvidia-smi"):
        query = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
        driver = f"driver {query.stdout.split()[0]}" if query.returncode == 0 and query.stdout.split() else driver
    props = torch.cuda.get_device_properties(0)
    return (
        f"{props.name} ({props.total_memory / 2**30:.0f} GiB, compute capability {props.major}.{props.minor}), "
        f"{driver}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, " + text
    )


if __name__ == "__main__":
    sys.exit(main())
