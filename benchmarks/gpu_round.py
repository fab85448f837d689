"""One prepared GPU round (``make gpu-round``): the CUDA tests of the new paths and every speed goal of
``benchmarks/targets.py`` at this revision, in one command that fits a short GPU loan, losing only the item that
crashes or hangs (docs/development.md, "Checking a GPU node", says what each item runs and what comes back).

It installs from ``--wheelhouse`` (:func:`install`), then runs each item (:func:`items`) in its own process under its
own limit (``SIGTERM`` ``KILL_GRACE`` s before it, ``SIGKILL`` at it), cut to what is left of ``--budget``, and
rewrites the report (``gpu_report.Round``), its records and a logs archive in ``--out-dir`` after each item.

The arithmetic: the limits add up to 1,270 s against a budget of 450 s (the loan's command has about 480 s: the
device call's ``timeout_s`` is 480), so they cannot all be given their full limit. The install takes about 30 s
(``INSTALL_S``); the tests (280 s) and the first two eager goals (105 s) come to 415 s, within 450 s: they always run
to their full limit. The rest run on what those leave: each is started only with ``MIN_LEFT`` s or more left, and
cut to what is left. On an H200 every CUDA test took 65 s (``make gpu-check``, 12 processes) and each benchmark 5
to 20 s (``benchmarks/results/gpu-nvidia-h200.md``), each item's process adding an estimated 10 s of start, so the
tests and the eager goals should end by about 300 s, leaving Transformer-XL's graphs and a compiled item their time.
"""

import argparse
import glob
import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import List, NamedTuple, Sequence, Tuple

from benchmarks import targets
from benchmarks.common import REPO, listed
from benchmarks.gpu_report import Round, is_tests

TRITON_TESTS = ("tests/modules/test_mogrifier_triton_cuda.py",)
# the other CUDA tests of plain modules, which run without tests/conftest.py (--noconftest)
CUDA_MODULE_TESTS = (
    "tests/modules/test_cuda_static_paths.py",
    "tests/modules/test_group_linear.py",
    "tests/modules/test_mogrifier_graphs.py",
    "tests/modules/test_mogrifier_lstm_settings.py",
)
# the CUDA tests that use tests/conftest.py's fixtures (lm_data, setup_model), whose import needs fairseq's
# compiled data extensions
GPU_TESTS = tuple(sorted(glob.glob("tests/gpu/test_*.py", root_dir=REPO)))
CONFTEST_TESTS = GPU_TESTS + ("tests/models/test_mogrifier_lstm_lm_graphs.py",)
ACCUMULATION = ("tests/modules/test_mogrifier_graphs.py", "tests/models/test_mogrifier_lstm_lm_graphs.py")
CUDA_TEST_WORKERS = 12  # pytest processes sharing the GPU for cuda_tests, as make gpu-check ran them on an H200
# fairseq's extensions that are no torch C++ extension: its Cython data utilities and BLEU (fairseq-generate)
FAIRSEQ_EXTENSIONS = ("fairseq.data.data_utils_fast", "fairseq.data.token_block_utils_fast", "fairseq.libbleu")
BUDGET = 450  # seconds for the whole round: the device call's timeout_s (480) less a margin
COMPILE = "--torch-compile"  # its DeFINE token path: auto, the one with the fewer rows
INSTALL_S = 30  # seconds the install is expected to take, in the module docstring's arithmetic
MIN_LEFT = 30  # seconds: an item is not started with less of the budget left
ARCHIVE = "gpu-round-logs.tar.gz"  # in --out-dir, beside the report
KILL_GRACE = 5  # seconds between SIGTERM and SIGKILL, which comes at the item's limit
QUICK_LIMITS = 5  # --quick runs on any machine, a loaded 2-core CPU too: the limits, a GPU's, times this
# pip without any index or configuration: the wheelhouse alone
OFFLINE_UNSET = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_CONSTRAINT")


class Item(NamedTuple):
    """One process of the round: ``key``, its time limit in seconds, its command line and extra environment; for a
    pytest item, what it checks and which of its files need tests/conftest.py."""

    key: str
    limit: int
    argv: List[str]
    env: dict = {}
    what: str = ""
    conftest: Tuple[str, ...] = ()


def items(device: str, quick: bool, python: str = sys.executable) -> List[Item]:
    """The round's items in order: the CUDA tests, the eager speed goals, Transformer-XL's graphs, compiled ones."""
    q = ["--quick"] if quick else []
    scale = QUICK_LIMITS if quick else 1
    # the compiled variants' first steps compile (and may compile again once the memory is filled): not timed
    warm = ["--warmup", "3"]
    backend = " --torch-compile-backend aot_eager" if quick else ""  # no C compiler needed on a CPU
    graphs = backend or " --torch-compile-mode reduce-overhead"  # CUDA graphs; quick, on a CPU: aot_eager alone

    def bench(key, limit, module, *args):
        return Item(key, limit * scale, [python, "-m", f"benchmarks.{module}", "--device", device, *args, *q])

    xdist = device == "cuda" and importlib.util.find_spec("xdist") is not None

    def tests(key, limit, what, files, *select, workers=False):
        flags = ["-n", str(CUDA_TEST_WORKERS)] if workers and xdist else ["-p", "no:xdist"]
        conftest = tuple(f for f in files if f in CONFTEST_TESTS)
        argv = [python, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", *flags, *select, *files]
        env = {"DEFINE_FAIRSEQ_CUDA_TESTS": "gpu" if device == "cuda" else "cpu"}
        return Item(key, limit * scale, argv + ([] if conftest else ["--noconftest"]), env, what, conftest)

    return [
        tests("triton_cuda", 120, "the Triton kernels compiled for the device", TRITON_TESTS, "-m", "cuda"),
        tests("cuda_tests", 100, "the CUDA tests (pytest -m cuda)", CUDA_MODULE_TESTS + GPU_TESTS, "-m",
              "cuda", "-k", "not (mogrifier_graphs and accumulation)", workers=True),
        tests("accumulation", 60, "the Mogrifier's CUDA graphs over accumulated windows, module and model",
              ACCUMULATION, "-k", "accumulation or lstm_lm_graphs"),
        bench("mogrifier", 60, "mogrifier_speed", "--rounds", "5", "--no-compile"),
        bench("train_4k", 45, "train_speed", "--tokens", "4000", "--rounds", "20"),
        bench("train_26k", 60, "train_speed", "--tokens", "26000", "--rounds", "10"),
        bench("txl_base", 45, "txl_speed", "--shape", "nvidia-base", "--rounds", "10"),
        bench("txl_table2", 60, "txl_speed", "--rounds", "5"),
        bench("group_linear", 45, "group_linear", "--rounds", "10"),
        bench("lstm_scoring", 45, "lstm_lm_speed", "--skip-wt103", "--rounds", "5"),
        bench("txl_base_graphs", 120, "txl_speed", "--shape", "nvidia-base", "--rounds", "10", *warm,
              "--model-args", COMPILE + graphs),
        bench("train_4k_compiled", 120, "train_speed", "--tokens", "4000", "--rounds", "20", *warm,
              "--model-args", COMPILE + backend),
        bench("txl_base_compiled", 120, "txl_speed", "--shape", "nvidia-base", "--rounds", "10", *warm,
              "--model-args", COMPILE + backend),
        bench("train_26k_compiled", 120, "train_speed", "--tokens", "26000", "--rounds", "10", *warm,
              "--model-args", COMPILE + backend),
        bench("txl_table2_compiled", 150, "txl_speed", "--rounds", "5", *warm, "--model-args", COMPILE + backend),
    ]  # fmt: skip


def without_conftest(plan: Sequence[Item]) -> Tuple[List[Item], List[Tuple[Item, str]]]:
    """``plan`` where tests/conftest.py cannot load: each pytest item without its files that need it (and with
    ``--noconftest``), and the ``(item, files)`` left out; an item with no file left is left out whole."""
    kept, dropped = [], []
    for item in plan:
        if not item.conftest:
            kept.append(item)
            continue
        dropped.append((item, ", ".join(item.conftest)))
        argv = [a for a in item.argv if a not in item.conftest]
        if any(a.startswith("tests/") for a in argv):
            kept.append(item._replace(argv=argv + ["--noconftest"], conftest=()))
    return kept, dropped


BUILD = r"""
import os, numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
args = ["-std=c++11", "-O2"]
data = [Extension(f"fairseq.data.{n}", [f"fairseq/data/{n}.pyx"], language="c++", extra_compile_args=args,
                  include_dirs=[numpy.get_include()]) for n in ("data_utils_fast", "token_block_utils_fast")]
bleu = Extension("fairseq.libbleu", ["fairseq/clib/libbleu/libbleu.cpp", "fairseq/clib/libbleu/module.cpp"],
                 extra_compile_args=args)
setup(name="fairseq-extensions", py_modules=[], ext_modules=cythonize(data, quiet=True, language_level=3) + [bleu],
      script_args=["build_ext", "--inplace", "-j", str(os.cpu_count())])
"""


def install(python: str, wheelhouse: str, src: str, log) -> str:
    """Install the wheels of ``wheelhouse`` (``--no-deps``, no index), unpack fairseq's sdist into ``src`` and
    build its ``FAIRSEQ_EXTENSIONS`` there (a failed build is only logged: the tests that need them are then
    reported as not run); returns the folder to put on ``PYTHONPATH``. Raises ``FileNotFoundError`` naming the flag
    when the wheels or the sdist are missing."""
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
    if not (os.path.exists(marker) and Path(marker).read_text() == name):
        os.makedirs(src, exist_ok=True)
        with tarfile.open(sdists[0]) as tar:
            for member in tar.getmembers():
                member.name = member.name.split("/", 1)[1] if "/" in member.name else ""
                if member.name and (member.isfile() or member.isdir()):
                    tar.extract(member, src, filter="data")
        Path(marker).write_text(name)
    log.flush()
    built = subprocess.run([python, "-c", BUILD], cwd=src, stdout=log, stderr=log, timeout=180).returncode == 0
    print(f"install: {len(wheels)} wheels (--no-deps, no index); {name} unpacked in {src}; its extensions "
          f"{'built' if built else 'NOT built (above)'}", file=log, flush=True)  # fmt: skip
    return src


PROBE = r"""
import importlib.util, os, sys, torch
from benchmarks.common import cpu_name
from benchmarks.gpu_report import environment  # as make gpu-check's report gives it
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
exts = [m for m in sys.argv[1:] if found(m)]
print(torch.cuda.get_device_name() if cuda else "CPU")
print(f"{environment(cuda)}, Triton {tv}; fairseq {fairseq.__version__} from {os.path.dirname(fairseq.__file__)}, "
      f"compiled extensions found: {', '.join(exts) or 'none'}; host: {os.cpu_count()} x {cpu_name()}")
print(len(exts) == len(sys.argv) - 1)
"""


def run(item: Item, limit: float, env: dict, log_path: str):
    """Run ``item`` in its own process group, output to ``log_path``; SIGTERM to the group ``KILL_GRACE`` s before
    ``limit``, SIGKILL at it. Returns ``(exit status, 124 when timed out; seconds)``."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(item.argv) + "\n")
        log.flush()
        proc = subprocess.Popen(
            item.argv, cwd=REPO, env=dict(env, **item.env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=max(limit - KILL_GRACE, 1))
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


def archive(logs: str, names: Sequence[str], path: str):
    """The files ``names`` of ``logs`` as one ``.tar.gz`` at ``path``, replaced whole (a kill mid-write leaves the
    previous one)."""
    with tarfile.open(path + ".part", "w:gz") as tar:
        for name in names:
            if os.path.exists(os.path.join(logs, name)):
                tar.add(os.path.join(logs, name), arcname=f"gpu-round-logs/{name}")
    os.replace(path + ".part", path)


def run_items(plan: Sequence[Item], report: Round, env: dict, logs: str, deadline: float, results: bool = True,
              archive_path: str = "", logged: Sequence[str] = ()):  # fmt: skip
    """Run each item of ``plan`` (``time.monotonic()`` reaching ``deadline`` ends the round: an item is skipped
    with less than ``MIN_LEFT`` seconds left), its output in ``logs/<key>.log`` and, with ``results``, a
    benchmark's results file in ``logs/<key>.md``; the report (and, with ``archive_path``, the archive of those
    files and ``logged``) is rewritten after each."""
    report.write()
    names = list(logged)
    for item in plan:
        left = deadline - time.monotonic()
        if left < MIN_LEFT:
            report.skip(item, f"skipped: less than {MIN_LEFT} s of the budget left")
            continue
        path = None
        if results and not is_tests(item):
            path = os.path.join(logs, f"{item.key}.md")
            item = item._replace(argv=item.argv + ["--out", path])
        limit = min(item.limit, left)  # a killed item ends within the budget too
        print(f"== {item.key} (limit {limit:.0f} s)", file=sys.stderr, flush=True)
        log_path = os.path.join(logs, f"{item.key}.log")
        rc, seconds = run(item, limit, env, log_path)
        print(f"   {item.key}: exit status {rc}, {seconds:.0f} s", file=sys.stderr, flush=True)
        report.add_item(item, rc, seconds, limit, Path(log_path).read_text(errors="replace"), path)
        names += [f"{item.key}.log"] + ([f"{item.key}.md"] if path else [])
        if archive_path:
            archive(logs, names, archive_path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (the benchmarks' --quick): the harness")
    parser.add_argument("--budget", type=float, default=BUDGET, help="seconds for the whole round, install included")
    parser.add_argument("--only", help="comma-separated items to run, of: " + ", ".join(i.key for i in items("", 0)))
    parser.add_argument("--wheelhouse", help="install from this folder first (make wheelhouse PY=3.12)")
    parser.add_argument("--fairseq-src", default=os.path.join(REPO, "build", "gpu-round-fairseq"))
    parser.add_argument("--out-dir", default=os.path.join(REPO, "build", "gpu-round"),
                        help="the report, its records and the logs archive ($OUT on a GPU loan)")  # fmt: skip
    parser.add_argument("--logs", default=os.path.join(REPO, "build", "gpu-round-logs"), help="each item's output")
    parser.add_argument("--revision", help="the revision to record in a copy without git (default: git's, +dirty)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    plan = items(args.device, args.quick)
    only = listed(parser, "--only", args.only, [i.key for i in plan])
    plan = [i for i in plan if i.key in only]
    os.makedirs(args.logs, exist_ok=True)
    os.makedirs(args.out_dir, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    paths, logged = [REPO], []
    install_note = "no install (--wheelhouse not given): the environment's fairseq"
    if args.wheelhouse:
        logged.append("install.log")
        with open(os.path.join(args.logs, "install.log"), "w") as log:
            try:
                paths.append(install(sys.executable, args.wheelhouse, args.fairseq_src, log))
            finally:  # the install's log comes back even when it fails
                archive(args.logs, logged, os.path.join(args.out_dir, ARCHIVE))
        install_note = f"installed from {args.wheelhouse} in {time.monotonic() - start:.0f} s"
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    argv_probe = [sys.executable, "-c", PROBE, *FAIRSEQ_EXTENSIONS]
    probe = subprocess.run(argv_probe, cwd=REPO, env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(f"the environment does not import torch and fairseq:\n{probe.stderr[-2000:]}")
    machine, environment, extensions = probe.stdout.strip().splitlines()[-3:]
    if args.device == "cuda" and machine == "CPU":
        parser.error("--device cuda: torch sees no CUDA device; run on a GPU node, or --device cpu --quick")
    if args.revision:  # the items' own results files name it too
        env[targets.REVISION_VARIABLE] = args.revision
    rev = targets.revision(REPO) if not args.revision else args.revision
    context = dict(revision=rev, machine=machine, device=args.device)
    header = [
        f"Command: `python -m benchmarks.gpu_round {shlex.join(argv if argv is not None else sys.argv[1:])}`; "
        f"revision {rev}; {time.strftime('%Y-%m-%d %H:%M %Z')}",
        f"{environment}; {install_note}",
        f"Budget {args.budget:.0f} s in all; each item in its own process under its own limit (exit status 124: "
        f"timed out, then killed), in the order of benchmarks/gpu_round.py; the report is rewritten after each item",
        f"Ratios: {targets.RATIO_METHOD} (the baseline's median time over the variant's, variants timed interleaved); "
        f"absolute figures: {targets.ABSOLUTE_METHOD}",
    ] + (["**--quick: tiny sizes; checks the harness, measures nothing**"] if args.quick else [])
    report = Round(os.path.join(args.out_dir, f"gpu-round-{targets.slug(machine)}.md"), context, header, args.budget)
    tar = os.path.join(args.out_dir, ARCHIVE)
    if extensions != "True":
        plan, dropped = without_conftest(plan)
        for item, files in dropped:
            report.skip(item, f"not run on this node: {files}: tests/conftest.py needs fairseq's compiled extensions "
                              f"({', '.join(FAIRSEQ_EXTENSIONS)}), which are missing (install.log)")  # fmt: skip
    archive(args.logs, logged, tar)
    run_items(plan, report, env, args.logs, start + args.budget, not args.quick, tar, logged)
    failed = sorted({r["item"] for r in report.rows if r["status"] == "failed" or r["what"].startswith("not run")})
    print(f"gpu_round: wrote {report.md}, {report.json} and {tar}", file=sys.stderr)
    if failed:
        print(f"gpu_round: {', '.join(failed)} failed or did not run (their rows say why)", file=sys.stderr)
    sys.stderr.flush()
    files = [os.path.basename(p) for p in (report.md, report.json, tar)]
    print(report.summary(time.monotonic() - start, files), flush=True)  # last: a loan returns only the tail
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
