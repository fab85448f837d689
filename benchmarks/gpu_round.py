"""One prepared GPU round (``make gpu-round``): every speed goal of ``benchmarks/targets.py`` at this revision, in
one command that fits a short GPU loan, losing only the item that crashes or hangs.

    python -m benchmarks.gpu_round [--wheelhouse DIR] [--device cuda|cpu] [--quick] [--budget 470] [--only ID,...]
        [--out-dir benchmarks/results] [--logs DIR]

With ``--wheelhouse`` (the folder of ``make wheelhouse PY=3.12``) it first installs, compiling nothing: the wheels
with ``--no-deps`` from that folder alone, and fairseq's sdist unpacked and put on ``PYTHONPATH`` unbuilt (the
benchmarks import none of fairseq's compiled extensions). Then each item runs in its own process under its own time
limit, cut to what is left of ``--budget`` (seconds from the start, the install included): the CUDA tests of the
new paths first (``CUDA_TEST_FILES``), then every benchmark's eager variants, then the ``--torch-compile`` ones.
After each item it rewrites ``<out-dir>/gpu-round-<gpu>.md`` (one row per figure: the item, the figure beside its
target, met or not, the ratio method, precision, batch, exit status, seconds, revision, GPU and command; a failure
row for an item that raised or timed out) and ``gpu-round-<gpu>.json``: the same rows as the records every
benchmark writes (``benchmarks.records.FIELDS``, with the round's ``ROUND_FIELDS``), so that
``benchmarks.records.load`` and ``benchmarks.pages`` read it like any other report's. Each item's log and results
file are in ``--logs``. ``--device cpu --quick`` runs the harness on a CPU with tiny sizes.
"""

import argparse
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from typing import List, NamedTuple, Optional, Sequence

from benchmarks.records import FIELDS, ROUND_FIELDS, parse_figures
from benchmarks.targets import ABSOLUTE_METHOD, GOALS, RATIO_METHOD, REVISION_VARIABLE, revision, show, show_target

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the CUDA tests of the code that this round measures; plain modules, so they need nothing from tests/conftest.py,
# which builds a fairseq dataset at import and so needs fairseq's compiled extensions
CUDA_TEST_FILES = (
    "tests/modules/test_cuda_static_paths.py",
    "tests/modules/test_group_linear.py",
    "tests/modules/test_mogrifier_triton_cuda.py",
    "tests/modules/test_mogrifier_graphs.py",
    "tests/modules/test_mogrifier_lstm_settings.py",
)
COMPILE = "--torch-compile"  # its DeFINE token path: auto, the one with the fewer rows
MIN_LEFT = 30  # seconds: an item is not started with less of the budget left
KILL_GRACE = 10  # seconds between SIGTERM and SIGKILL for an item past its limit
# pip without any index or configuration: the wheelhouse alone
OFFLINE_UNSET = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_CONSTRAINT")


class Item(NamedTuple):
    """One process of the round: ``key``, its time limit in seconds, its command line and extra environment."""

    key: str
    limit: int
    argv: List[str]
    env: dict = {}


def items(device: str, quick: bool, python: str = sys.executable) -> List[Item]:
    """The round's items in order: the CUDA tests, eager variants, then compiled ones."""
    q = ["--quick"] if quick else []
    # the compiled variants' first steps compile (and may compile again once the memory is filled): not timed
    warm = ["--warmup", "3"]
    backend = " --torch-compile-backend aot_eager" if quick else ""  # no C compiler needed on a CPU
    graphs = backend or " --torch-compile-mode reduce-overhead"  # CUDA graphs; quick, on a CPU: aot_eager alone

    def bench(key, limit, module, *args):
        return Item(key, limit, [python, "-m", f"benchmarks.{module}", "--device", device, *args, *q])

    tests_mode = "gpu" if device == "cuda" else "cpu"
    pytest = [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist", "--noconftest"]
    return [
        Item("cuda_tests", 120, pytest + ["-m", "cuda", *CUDA_TEST_FILES], {"DEFINE_FAIRSEQ_CUDA_TESTS": tests_mode}),
        bench("group_linear", 60, "group_linear", "--rounds", "10"),
        bench("train_4k", 75, "train_speed", "--tokens", "4000", "--rounds", "20"),
        bench("train_26k", 90, "train_speed", "--tokens", "26000", "--rounds", "10"),
        bench("txl_base", 75, "txl_speed", "--shape", "nvidia-base", "--rounds", "10"),
        bench("txl_table2", 90, "txl_speed", "--rounds", "5"),
        bench("mogrifier", 90, "mogrifier_speed", "--rounds", "5", "--no-compile"),
        bench("lstm_scoring", 60, "lstm_lm_speed", "--skip-wt103", "--rounds", "5"),
        bench("train_4k_compiled", 150, "train_speed", "--tokens", "4000", "--rounds", "20", *warm,
              "--model-args", COMPILE + backend),
        bench("txl_base_compiled", 150, "txl_speed", "--shape", "nvidia-base", "--rounds", "10", *warm,
              "--model-args", COMPILE + backend),
        bench("txl_base_graphs", 150, "txl_speed", "--shape", "nvidia-base", "--rounds", "10", *warm,
              "--model-args", COMPILE + graphs),
        bench("train_26k_compiled", 150, "train_speed", "--tokens", "26000", "--rounds", "10", *warm,
              "--model-args", COMPILE + backend),
        bench("txl_table2_compiled", 180, "txl_speed", "--rounds", "5", *warm, "--model-args", COMPILE + backend),
    ]  # fmt: skip


def install(python: str, wheelhouse: str, src: str, log) -> str:
    """Install the wheels of ``wheelhouse`` (``--no-deps``, no index) and unpack fairseq's sdist into ``src``;
    returns the folder to put on ``PYTHONPATH``. Raises ``FileNotFoundError`` naming the flag when either is
    missing."""
    wheels = sorted(glob.glob(os.path.join(wheelhouse, "*.whl")))
    sdists = sorted(glob.glob(os.path.join(wheelhouse, "fairseq_fixed-*.tar.gz")))
    if not wheels or len(sdists) != 1:
        raise FileNotFoundError(
            f"--wheelhouse {wheelhouse}: needs the wheels and exactly one fairseq_fixed sdist (found {len(wheels)} "
            f"wheels, {len(sdists)} sdists); make it with `make wheelhouse PY=3.12` where a registry is reachable, "
            f"or leave --wheelhouse out where fairseq is installed"
        )
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_UNSET}
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "--no-deps", *wheels]
    if subprocess.run(pip, env=dict(env, PIP_CONFIG_FILE=os.devnull), stdout=log, stderr=log).returncode != 0:
        raise RuntimeError(f"--wheelhouse {wheelhouse}: pip could not install its wheels (its output: {log.name})")
    marker = os.path.join(src, ".unpacked-from")
    name = os.path.basename(sdists[0])
    if not (os.path.exists(marker) and open(marker).read() == name):
        os.makedirs(src, exist_ok=True)
        with tarfile.open(sdists[0]) as tar:
            for member in tar.getmembers():
                member.name = member.name.split("/", 1)[1] if "/" in member.name else ""
                if member.name and (member.isfile() or member.isdir()):
                    tar.extract(member, src, filter="data")
        with open(marker, "w") as f:
            f.write(name)
    print(f"install: {len(wheels)} wheels (--no-deps, no index); {name} unpacked in {src}", file=log, flush=True)
    return src


PROBE = r"""
import importlib.util, os, platform, torch
cuda = torch.cuda.is_available()
try:
    import triton; tv = triton.__version__
except ImportError:
    tv = "none"
import fairseq
def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False
exts = [m for m in ("fairseq.data.data_utils_fast", "fairseq.data.token_block_utils_fast", "fairseq.libbleu")
        if found(m)]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(torch.cuda.get_device_name() if cuda else "CPU")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda if cuda else 'n/a'}, cuDNN "
      f"{torch.backends.cudnn.version() if cuda else 'n/a'}, Triton {tv}, Python {platform.python_version()}; "
      f"fairseq {fairseq.__version__} from {os.path.dirname(fairseq.__file__)}, compiled extensions found: "
      f"{', '.join(exts) or 'none'}; host: {os.cpu_count()} x {cpu}")
"""


def run(item: Item, limit: float, env: dict, log_path: str):
    """Run ``item`` in its own process group, output to ``log_path``; after ``limit`` seconds SIGTERM to the group,
    SIGKILL after ``KILL_GRACE``. Returns ``(exit status, 124 when timed out; seconds)``."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(item.argv) + "\n")
        log.flush()
        proc = subprocess.Popen(
            item.argv, cwd=REPO, env=dict(env, **item.env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            for sig, wait in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, None)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
                except ProcessLookupError:
                    break
            rc = 124
    return rc, time.monotonic() - start


def failure(text: str, rc: int, limit: float) -> str:
    """Why an item failed, for its row: a timeout, else the last error line of its output."""
    lines = [line.strip() for line in text.splitlines() if re.search(r"Error|error:|Exception|Killed", line)]
    why = lines[-1][:200].replace("|", "/") if lines else f"no figure printed (exit status {rc})"
    return f"timed out after {limit:.0f} s; {why}" if rc == 124 else f"failed (exit status {rc}): {why}"


def command_of(item: Item) -> str:
    """``item``'s command as a user types it in the repository: its environment settings, then ``python ...``; the
    ``--out`` that the round adds (where its log folder keeps the item's results file) left out."""
    argv = item.argv[1:]
    if "--out" in argv[:-1]:
        at = argv.index("--out")
        argv = argv[:at] + argv[at + 2 :]
    return shlex.join([f"{k}={v}" for k, v in item.env.items()] + ["python"] + argv)


def benchmark_of(item: Item) -> Optional[str]:
    """The benchmark module an item runs (``train_speed``), or None for the CUDA tests."""
    module = next((a for a in item.argv if a.startswith("benchmarks.")), None)
    return module and module.split(".", 1)[1]


def verdict(met) -> str:
    return "n/a" if met is None else "PASS" if met else "FAIL"


class Round:
    """The rows so far (records, :data:`benchmarks.records.FIELDS` and ``ROUND_FIELDS``) and the two files they are
    written to."""

    def __init__(self, md: str, context: dict, header: Sequence[str]):
        self.md, self.json = md, md[: -len(".md")] + ".json"
        self.context, self.header, self.rows, self.sections = context, list(header), [], []
        self.report = f"results/{os.path.basename(md)}"

    def row(self, item: Item, record: Optional[dict] = None, **fields) -> dict:
        """A record of this round: ``record`` (a benchmark's, else one with no figure) with the round's revision,
        machine, report and ``item``'s command, then ``fields``."""
        out = {k: None for k in FIELDS + ROUND_FIELDS}
        out.update(record or {}, item=item.key, command=command_of(item))
        out["benchmark"] = out["benchmark"] or benchmark_of(item)
        out.update(revision=self.context["revision"], machine=self.context["machine"], report=self.report)
        out.update(origin="run", **fields)
        return out

    def add_item(self, item: Item, rc: int, seconds: float, limit: float, text: str, results: Optional[str]):
        ran = dict(rc=rc, seconds=round(seconds, 1))
        if item.key == "cuda_tests":
            summary = [line.strip("= ") for line in text.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
            if summary and rc in (0, 1):
                self.rows.append(self.row(item, what="CUDA tests (pytest -m cuda)", status=summary[-1], met=rc == 0,
                                          **ran))  # fmt: skip
                return self.write()
        figures = parse_figures(text)
        self.rows += [self.row(item, record, status="measured", **ran) for record in figures]
        if rc != 0 or not figures:
            self.rows.append(self.row(item, what=failure(text, rc, limit), status="failed", met=False, **ran))
        if results and os.path.exists(results):
            with open(results) as f:
                self.sections.append(f"### {item.key}\n\n" + re.sub(r"^#", "###", f.read(), flags=re.M))
        self.write()

    def skip(self, item: Item):
        self.rows.append(self.row(item, what=f"skipped: less than {MIN_LEFT} s of the budget left", status="skipped"))
        self.write()

    def write(self):
        with open(self.json, "w") as f:
            f.write(json.dumps(self.rows, indent=1, sort_keys=True) + "\n")
        with open(self.md, "w") as f:
            f.write(self.markdown())

    def markdown(self) -> str:
        c = self.context
        out = [f"# GPU round at {c['revision']} on {c['machine']}", ""] + [f"- {h}" for h in self.header] + [""]
        out += [
            "## Goals (the best row of each)",
            "",
            "| goal | target | best figure | met | row |",
            "|---|---|---|---|---|",
        ]
        for key, goal in GOALS.items():
            rows = [r for r in self.rows if r["goal"] == key and r["value"] is not None]
            if not rows:
                out.append(f"| {goal.what} | | not measured | n/a | |")
                continue
            best = (min if goal.at_most else max)(rows, key=lambda r: r["value"])
            target = show_target(best["target"], goal.unit, goal.at_most)
            out.append(
                f"| {goal.what} | {target} | {show(best['value'], goal.unit)} | {verdict(best['met'])} | "
                f"{best['what']} |"
            )
        columns = ["item", "figure", "measured", "target", "met", "goal", "ratio", "precision", "batch", "rc", "s"]
        out += ["", "## Rows", "", "| " + " | ".join(columns + ["revision", "GPU", "command"]) + " |"]
        out.append("|" + "---|" * (len(columns) + 3))
        for r in self.rows:
            measured = show(r["value"], r["unit"]) if r["value"] is not None else r["status"]
            target = show_target(r["target"], r["unit"], r["at_most"]) if r["target"] is not None else ""
            cells = [r["item"], r["what"], measured, target, verdict(r["met"]), r["goal"], r["ratio_method"]]
            cells += [r["precision"], r["batch"], r["rc"], r["seconds"], r["revision"], r["machine"]]
            out.append("| " + " | ".join("" if x is None else str(x).replace("|", "/") for x in cells)
                       + f" | `{r['command']}` |")  # fmt: skip
        return "\n".join(out + [""] + self.sections) + "\n"


def run_items(plan: Sequence[Item], report: Round, env: dict, logs: str, deadline: float, results: bool = True):
    """Run each item of ``plan`` (``time.monotonic()`` reaching ``deadline`` ends the round: an item is skipped
    with less than ``MIN_LEFT`` seconds left), its output in ``logs/<key>.log`` and, with ``results``, a benchmark's
    results file in ``logs/<key>.md``; the report is rewritten after each."""
    report.write()
    for item in plan:
        left = deadline - time.monotonic()
        if left < MIN_LEFT:
            report.skip(item)
            continue
        path = None
        if results and item.key != "cuda_tests":
            path = os.path.join(logs, f"{item.key}.md")
            item = item._replace(argv=item.argv + ["--out", path])
        limit = min(item.limit, left - KILL_GRACE)  # a killed item ends within the budget too
        print(f"== {item.key} (limit {limit:.0f} s)", file=sys.stderr, flush=True)
        log_path = os.path.join(logs, f"{item.key}.log")
        rc, seconds = run(item, limit, env, log_path)
        with open(log_path, errors="replace") as f:
            report.add_item(item, rc, seconds, limit, f.read(), path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the benchmarks' --quick): the harness")
    parser.add_argument("--budget", type=float, default=470, help="seconds for the whole round, the install included")
    parser.add_argument("--only", help="comma-separated items to run, of: " + ", ".join(i.key for i in items("", 0)))
    parser.add_argument("--wheelhouse", help="install from this folder first (make wheelhouse PY=3.12)")
    parser.add_argument("--fairseq-src", default=os.path.join(REPO, "build", "gpu-round-fairseq"))
    parser.add_argument("--out-dir", help="where the report goes (default benchmarks/results; --quick: --logs)")
    parser.add_argument("--logs", default=os.path.join(REPO, "build", "gpu-round-logs"), help="each item's output")
    parser.add_argument(
        "--revision", help="the revision to record where the tree is a copy without git (default: git's, +dirty)"
    )
    args = parser.parse_args(argv)
    start = time.monotonic()
    plan = items(args.device, args.quick)
    only = [k.strip() for k in (args.only or "").split(",") if k.strip()]
    if set(only) - {i.key for i in plan}:
        parser.error(f"--only {args.only}: choose from {', '.join(i.key for i in plan)}")
    plan = [i for i in plan if not only or i.key in only]
    os.makedirs(args.logs, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    paths = [REPO]
    install_note = "no install (--wheelhouse not given): the environment's fairseq"
    if args.wheelhouse:
        with open(os.path.join(args.logs, "install.log"), "w") as log:
            paths.append(install(sys.executable, args.wheelhouse, args.fairseq_src, log))
        install_note = f"installed from {args.wheelhouse} in {time.monotonic() - start:.0f} s, compiling nothing"
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    probe = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(f"the environment does not import torch and fairseq:\n{probe.stderr[-2000:]}")
    machine, environment = probe.stdout.strip().splitlines()[-2:]
    if args.device == "cuda" and machine == "CPU":
        parser.error("--device cuda: torch sees no CUDA device; run on a GPU node, or --device cpu --quick")
    if args.revision:  # the items' own results files name it too
        env[REVISION_VARIABLE] = args.revision
    rev = revision(REPO) if not args.revision else args.revision
    out_dir = args.out_dir or (args.logs if args.quick else os.path.join(REPO, "benchmarks", "results"))
    os.makedirs(out_dir, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", machine.lower()).strip("-")
    context = dict(revision=rev, machine=machine, device=args.device)
    header = [
        f"Command: `python -m benchmarks.gpu_round {shlex.join(argv if argv is not None else sys.argv[1:])}`; "
        f"revision {rev}; {time.strftime('%Y-%m-%d %H:%M %Z')}",
        f"{environment}; {install_note}",
        f"Budget {args.budget:.0f} s in all; each item in its own process under its own limit (exit status 124: "
        f"timed out, then killed), eager variants before compiled ones; the report is rewritten after each item",
        f"Ratios: {RATIO_METHOD} (the baseline's median time over the variant's, variants timed interleaved); "
        f"absolute figures: {ABSOLUTE_METHOD}",
    ] + (["**--quick: tiny sizes; checks the harness, measures nothing**"] if args.quick else [])
    report = Round(os.path.join(out_dir, f"gpu-round-{slug}.md"), context, header)
    run_items(plan, report, env, args.logs, start + args.budget, results=not args.quick)
    print(report.markdown())
    failed = sorted({r["item"] for r in report.rows if r["status"] == "failed"})
    print(f"wrote {report.md} and {report.json} ({time.monotonic() - start:.0f} s)", file=sys.stderr)
    if failed:
        print(f"gpu_round: {', '.join(failed)} failed (their rows say why; logs in {args.logs})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
