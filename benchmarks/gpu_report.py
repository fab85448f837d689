"""Every benchmark of ``targets.BENCHMARKS`` on a GPU with short settings, in one process, and one table of its
figures beside the GPU targets, each benchmark's own tables after it (default ``results/gpu-<gpu name>.md``, its
records beside it). A missed target does not stop the run; a benchmark that raises is reported in the table and the
others still run (exit status 1). ``--device cpu --quick`` checks the whole report on a CPU. :class:`Round` is the
report of ``make gpu-round`` (``benchmarks/gpu_round.py``): its rows as records, its Markdown and its summary.
"""

import argparse
import gc
import importlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Optional, Sequence

import numpy
import torch

from benchmarks import targets
from benchmarks.common import REPO, RESULTS_DIR, listed
from benchmarks.targets import BENCHMARKS, GOALS, show, show_target, table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that everything runs")
    parser.add_argument("--out", help="the report's file ('-': none)")
    parser.add_argument("--tests-log", help="pytest's output on this machine: its summary line goes in the report")
    parser.add_argument("--only", help="comma-separated benchmarks to run, of: " + ", ".join(BENCHMARKS))
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
    only = listed(parser, "--only", args.only, list(BENCHMARKS))
    device, rev = torch.cuda.get_device_name() if cuda else "CPU", targets.revision(REPO)
    start, rows, sections, failed, checks = time.perf_counter(), [], [], False, []
    for name, extra in [(name, extra) for name, runs in BENCHMARKS.items() if name in only for extra in runs]:
        shown = [a for i, a in enumerate(extra) if a != "--rounds" and (i == 0 or extra[i - 1] != "--rounds")]
        began, label = time.perf_counter(), " ".join([name, *shown])  # with the options that set what it measures
        print(f"== {label}", file=sys.stderr, flush=True)
        try:
            flags = ["--device", args.device, "--out", "-", *extra] + (["--quick"] if args.quick else [])
            result = importlib.import_module(f"benchmarks.{name}").main(flags)
            failed |= result.failed
            checks.append((name, result.checks))
            for c in result.checks:
                met = "n/a" if c.value != c.value else "yes" if c.met else "**no**"
                target = show_target(c.target, c.unit, c.at_most)
                rows.append([f"`{label}`", c.what, show(c.value, c.unit), target, met])
            seconds = time.perf_counter() - began
            sections.append(re.sub(r"^#", "##", result.text, flags=re.M) + f"\n({label}: {seconds:.0f} s)\n")
        except (Exception, SystemExit) as error:  # reported; the other benchmarks still run
            traceback.print_exc()
            failed = True
            rows.append([f"`{label}`", f"**{targets.error_text(error)}**", "", "", ""])
        finally:
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    command = "python -m benchmarks.gpu_report " + " ".join(argv if argv is not None else sys.argv[1:])
    tests = ""
    if args.tests_log:
        log = Path(args.tests_log).read_text() if os.path.exists(args.tests_log) else ""
        tests = f"\n- `pytest -m cuda`: {pytest_summary(log) or 'no summary line in ' + args.tests_log}"
    quick = "\n- **--quick: tiny sizes, measures nothing**" if args.quick else ""
    text = (
        f"# Benchmarks on {device}: figures and targets\n\n- Command: `{command}`; revision {rev}"
        f"\n- {environment(cuda)}; {time.strftime('%Y-%m-%d %H:%M')}, {time.perf_counter() - start:.0f} s in all"
        f"{tests}{quick}\n- Ratios are speed ratios (how many times faster) from one run, the variants timed "
        "interleaved; each benchmark's section below gives its settings, precision and tables\n\n"
    )
    text += table(["benchmark", "figure", "measured", "target", "met"], rows) + "\n" + "\n".join(sections)
    print(text)
    out = args.out or (None if args.quick else os.path.join(RESULTS_DIR, f"gpu-{targets.slug(device)}.md"))
    if out and out != "-":
        targets.write_result(out, text)
        print(f"wrote {os.path.relpath(out)}")
        # each benchmark's default precision on the device
        context = dict(command=command, revision=rev, machine=device, precision="bf16" if cuda else "fp32")
        report = f"results/{os.path.basename(out)}"
        records = [r for name, c in checks for r in targets.of_checks(c, name, report, context, cuda)]
        targets.write(targets.json_path(out), records)
    return 1 if failed else 0


def environment(cuda: bool) -> str:
    """The GPU, its driver, CUDA, torch, numpy and Python, as one line."""
    text = f"torch {torch.__version__}, numpy {numpy.__version__}, Python {platform.python_version()}"
    if not cuda:
        return text
    driver = "driver unknown (no nvidia-smi)"
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        found = subprocess.run(query, capture_output=True, text=True)
        driver = f"driver {found.stdout.split()[0]}" if found.returncode == 0 and found.stdout.split() else driver
    p = torch.cuda.get_device_properties(0)
    return (
        f"{p.name} ({p.total_memory / 2**30:.0f} GiB, compute capability {p.major}.{p.minor}), "
        f"{driver}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, " + text
    )


# ---- make gpu-round's report: benchmarks/gpu_round.py runs the items (each with a key, a limit, its argv, its extra
# environment and, for a pytest item, what it checks) and hands each one's output to a Round
SUMMARY_CHARS = 11000  # the summary printed last fits in the 12,000 characters of output that a GPU loan returns
CELL_CHARS = 160  # a result in the summary, cut to this; the report holds it whole


def verdict(met) -> str:
    return "n/a" if met is None else "PASS" if met else "FAIL"


def pytest_summary(text: str) -> Optional[str]:
    """pytest's last summary line in ``text`` (``1 failed, 6 passed, 2 skipped in 39.1s``), or None."""
    found = [line.strip("= ") for line in text.splitlines() if re.search(r"\d+ \w+.* in [\d.]+s\b", line)]
    return found[-1] if found else None


def is_tests(item) -> bool:
    """Whether ``item`` runs pytest (one row: pytest's summary) rather than a benchmark (a row per figure)."""
    return "pytest" in item.argv


def failure(text: str, rc: int, limit: float, missing: str = "figure") -> str:
    """Why an item failed, for its row: a timeout, else the last error line of its output."""
    lines = [line.strip() for line in text.splitlines() if re.search(r"Error|error:|Exception|Killed", line)]
    why = lines[-1][:200].replace("|", "/") if lines else f"no {missing} printed (exit status {rc})"
    return f"timed out after {limit:.0f} s; {why}" if rc == 124 else f"failed (exit status {rc}): {why}"


def command_of(item) -> str:
    """``item``'s command as a user types it in the repository: its environment settings, then ``python ...``; the
    ``--out`` that the round adds (where its log folder keeps the item's results file) left out."""
    argv = item.argv[1:]
    if "--out" in argv[:-1]:
        at = argv.index("--out")
        argv = argv[:at] + argv[at + 2 :]
    return shlex.join([f"{k}={v}" for k, v in item.env.items()] + ["python"] + argv)


def cut(text: str, chars: int = CELL_CHARS) -> str:
    text = str(text).replace("|", "/").replace("\n", " ")
    return text if len(text) <= chars else text[: chars - 3] + "..."


class Round:
    """The rows so far (records: ``targets.FIELDS`` and ``ROUND_FIELDS``), rewritten to ``md`` and
    the ``.json`` beside it after each item, and their summary (:meth:`summary`), which the round prints last."""

    def __init__(self, md: str, context: dict, header: Sequence[str], budget: Optional[float] = None):
        self.md, self.json = md, md[: -len(".md")] + ".json"
        self.context, self.header, self.rows, self.sections = context, list(header), [], []
        self.report = f"results/{os.path.basename(md)}"
        self.budget, self.limits = budget, {}

    def row(self, item, record: Optional[dict] = None, **fields) -> dict:
        """A record of this round: ``record`` (a benchmark's, else one with no figure) with the round's revision,
        machine, report and ``item``'s command, then ``fields``."""
        out = {k: None for k in targets.FIELDS + targets.ROUND_FIELDS}
        out.update(record or {}, item=item.key, command=command_of(item))
        module = next((a for a in item.argv if a.startswith("benchmarks.")), None)  # None: a pytest item
        out["benchmark"] = out["benchmark"] or module and module.split(".", 1)[1]
        out.update(revision=self.context["revision"], machine=self.context["machine"], report=self.report)
        out.update(origin="run", **fields)
        return out

    def add_item(self, item, rc: int, seconds: float, limit: float, text: str, results: Optional[str]):
        self.limits[item.key] = round(limit)
        ran = dict(rc=rc, seconds=round(seconds, 1))
        if is_tests(item):
            summary = pytest_summary(text)
            if summary and rc in (0, 1):
                failed = [line.split(" ", 1)[1].split(" - ", 1)[0] for line in text.splitlines()
                          if line.startswith(("FAILED ", "ERROR "))]  # fmt: skip
                what = item.what + (f"; failed: {', '.join(failed)}" if failed else "")
                self.rows.append(self.row(item, what=cut(what, 2000), status=summary, met=rc == 0, **ran))
                return self.write()
        figures = targets.parse_figures(text)
        self.rows += [self.row(item, record, status="measured", **ran) for record in figures]
        if rc != 0 or not figures:
            why = failure(text, rc, limit, "test summary" if is_tests(item) else "figure")
            self.rows.append(self.row(item, what=why, status="failed", met=False, **ran))
        if results and os.path.exists(results):
            self.sections.append(f"### {item.key}\n\n" + re.sub(r"^#", "###", Path(results).read_text(), flags=re.M))
        self.write()

    def skip(self, item, why: str):
        """A row for an item, or the files of one, that did not run: ``why``."""
        self.rows.append(self.row(item, what=why, status="skipped"))
        self.write()

    def write(self):
        targets.write(self.json, self.rows)
        Path(self.md).write_text(self.markdown())

    def goals(self) -> list:
        """The table of each goal's best row."""
        out = ["| goal | target | best figure | met | row |", "|---|---|---|---|---|"]
        for key, goal in GOALS.items():
            rows = [r for r in self.rows if r["goal"] == key and r["value"] is not None]
            if not rows:
                out.append(f"| {goal.what} | | not measured | n/a | |")
                continue
            best = (min if goal.at_most else max)(rows, key=lambda r: r["value"])
            target = show_target(best["target"], goal.unit, goal.at_most)
            value, met = show(best["value"], goal.unit), verdict(best["met"])
            out.append(f"| {goal.what} | {target} | {value} | {met} | {best['item']}: {best['what']} |")
        return out

    def markdown(self) -> str:
        c = self.context
        out = [f"# GPU round at {c['revision']} on {c['machine']}", ""] + [f"- {h}" for h in self.header] + [""]
        out += ["## Goals (the best row of each)", ""] + self.goals()
        columns = "item | figure | measured | target | met | goal | ratio | precision | batch | rc | s | revision | GPU"
        rows = []
        for r in self.rows:
            measured = show(r["value"], r["unit"]) if r["value"] is not None else r["status"]
            target = show_target(r["target"], r["unit"], r["at_most"]) if r["target"] is not None else ""
            cells = [r["item"], r["what"], measured, target, verdict(r["met"]), r["goal"], r["ratio_method"]]
            cells += [r["precision"], r["batch"], r["rc"], r["seconds"], r["revision"], r["machine"]]
            rows.append(["" if x is None else str(x).replace("|", "/") for x in cells] + [f"`{r['command']}`"])
        out += ["", "## Rows", "", table(columns + " | command", rows)]
        return "\n".join(out + self.sections) + "\n"

    def summary(self, seconds: float, files: Sequence[str] = ()) -> str:
        """The goals and one line per item (its limit, seconds, exit status and result), at most
        ``SUMMARY_CHARS`` characters: what the round prints last, for a loan that returns only its output's tail."""
        c, budget = self.context, f" of {self.budget:.0f}" if self.budget else ""
        out = [f"## GPU round at {c['revision']} on {c['machine']}: {seconds:.0f} s{budget}"]
        out += [f"- {cut(h, 600)}" for h in self.header[1:2]] + ([f"- Files: {', '.join(files)}"] if files else [])
        out += ["", *self.goals(), "", "| item | limit s | s | rc | result |", "|---|---|---|---|---|"]
        for key in dict.fromkeys(r["item"] for r in self.rows):
            rows = [r for r in self.rows if r["item"] == key]
            out.append(f"| {key} | {self.limits.get(key, '')} | {rows[-1]['seconds'] or ''} | "
                       f"{'' if rows[-1]['rc'] is None else rows[-1]['rc']} | {cut(result(rows))} |")  # fmt: skip
        text = "\n".join(out) + "\n"
        return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 40] + "\n(cut: the report has it all)\n"


def result(rows: Sequence[dict]) -> str:
    """One item's rows in a few words: pytest's summary and its failures, or its figures and the goals among them;
    then why it failed or what of it did not run."""
    figures = [r for r in rows if r["status"] == "measured"]
    parts = [f"{len(figures)} figures"] if figures else []
    parts += [f"{r['goal']} {show(r['value'], r['unit'])} {verdict(r['met'])}" for r in figures if r["goal"]]
    for r in rows:
        if r["status"] not in ("measured", "failed", "skipped"):  # pytest's summary
            failed = r["what"].partition("; failed: ")[2]
            parts.append(f"{verdict(r['met'])}: {r['status']}" + (f"; failed: {failed}" if failed else ""))
    return "; ".join(parts + [r["what"] for r in rows if r["status"] in ("failed", "skipped")])


if __name__ == "__main__":
    sys.exit(main())
