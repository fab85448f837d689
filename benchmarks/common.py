"""The benchmarks' harness: common options, interleaved timing and the results file (the models and batches they
time: ``benchmarks/workloads.py``).

Every benchmark times its variants *interleaved*: each round runs every variant once (in an order rotated from
round to round), and a variant's figure is its median over rounds, after untimed warm-up rounds. Load from other
processes then hits all variants alike. On a GPU every timed call is bracketed by ``torch.cuda.synchronize()``.
"""

import argparse
import os
import platform
import re
import resource
import shlex
import statistics
import sys
import time
import traceback
from contextlib import nullcontext
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

import torch

from benchmarks.precision import LOSS_SCALE, MasterWeights
from benchmarks.records import figure_line, json_path, of_checks, write
from benchmarks.targets import Check, revision

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
KEEP_MARK = "<!-- written by hand below this line: kept when the benchmark is run again -->"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _loadavg() -> str:
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "n/a"


def options(doc: str, rounds: int, warmup: int = 1, fp16: bool = False) -> argparse.ArgumentParser:
    """The options every benchmark takes; the benchmark adds its own. ``fp16``: it offers ``--dtype fp16``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--dtype",
        choices=tuple(DTYPES) if fp16 else ("fp32", "bf16"),
        help="default fp32 on cpu, bf16 on cuda: autocast around forward and loss of whole models, parameters and "
        "inputs in that dtype for single modules; fp16 (where offered): float16 parameters with float32 master "
        "weights and a fixed loss scale (benchmarks/precision.py), as fairseq's --fp16",
    )
    p.add_argument("--threads", type=int, help="torch CPU threads (default 2 on cpu; torch's default on cuda)")
    p.add_argument("--rounds", type=int, default=rounds, help="timed interleaved rounds (median reported)")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed rounds first")
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, one round: checks that the benchmark runs; prints its tables, writes no file",
    )
    p.add_argument("--out", help="results file ('-': none; default benchmarks/results/<name>[-tcmalloc|-<gpu>].md)")
    return p


class Result(NamedTuple):
    text: str
    checks: List[Check]
    failed: bool  # a variant raised an error


class Timings:
    """Seconds per call (``times``), minor page faults per call (``faults``) and errors, per variant."""

    def __init__(self, names: Sequence[str]):
        self.times: Dict[str, List[float]] = {n: [] for n in names}
        self.faults: Dict[str, List[float]] = {n: [] for n in names}
        self.errors: Dict[str, str] = {}

    def median(self, name: str) -> float:
        return statistics.median(self.times[name]) if self.times.get(name) else float("nan")

    def ms(self, name: str) -> str:
        return self.errors[name][:80] if name in self.errors else ms(self.median(name))

    def min_ms(self, name: str) -> str:
        return ms(min(self.times[name])) if self.times.get(name) else ""

    def page_faults(self, name: str) -> str:
        return f"{statistics.median(self.faults[name]):.0f}" if self.faults.get(name) else ""

    def speedup(self, base: str, name: str) -> float:
        """How many times faster ``name`` ran than ``base`` (ratio of medians)."""
        return self.median(base) / self.median(name)

    def paired(self, base: str, name: str) -> float:
        """Median over rounds of ``base``'s time over ``name``'s: each round's two calls ran close in time."""
        pairs = [a / b for a, b in zip(self.times.get(base, []), self.times.get(name, []))]
        return statistics.median(pairs) if pairs else float("nan")

    def columns(self, name: str, base: str, work: float, faults: bool = False) -> List[str]:
        """The table cells of ``name`` against ``base``: its median and fastest ms (then its page faults, with
        ``faults``), ``work`` per second of its median (e.g. tokens/s), and how many times faster than ``base`` it
        ran (``speedup``, then ``paired``)."""
        cells = [self.ms(name), self.min_ms(name)] + ([self.page_faults(name)] if faults else [])
        return cells + [
            f"{work / self.median(name):.0f}",
            ratio(self.speedup(base, name)),
            ratio(self.paired(base, name)),
        ]


def ms(seconds: float) -> str:
    v = seconds * 1e3
    return "n/a" if v != v else f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.3g}"


def ratio(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}x"


def millions(n: int) -> str:
    return f"{n / 1e6:.2f} M"


def minor_faults() -> int:
    """Minor page faults of this process so far (a fresh 4 KiB page touched for the first time is one)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Bench:
    """One benchmark run: its options, device and precision, the timing and the results file."""

    def __init__(self, module: str, parser: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None):
        self.module, self.argv = module, list(sys.argv[1:] if argv is None else argv)
        self.args = args = parser.parse_args(self.argv)
        if args.device == "cuda" and not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
        args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
        if args.quick:
            args.rounds, args.warmup = 1, 1
        self.device, self.dtype, self.cuda = torch.device(args.device), DTYPES[args.dtype], args.device == "cuda"
        self.half = self.dtype == torch.float16  # whole models: model.half(), no autocast
        if args.threads or not self.cuda:
            torch.set_num_threads(args.threads or 2)
        self.failed = False
        self.start = (time.strftime("%Y-%m-%d %H:%M"), _loadavg())

    def autocast(self):
        """Mixed precision around a whole model's forward and loss (as fairseq's ``--amp``, in bfloat16)."""
        return (
            nullcontext() if self.dtype == torch.float32 or self.half else torch.autocast(self.device.type, self.dtype)
        )

    def to(self, obj):
        """``obj`` (a tensor, a module, or dicts / lists of them) on the device; a module in float16 with ``half``."""
        if isinstance(obj, dict):
            return {k: self.to(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.to(v) for v in obj)
        if self.half and isinstance(obj, torch.nn.Module):
            return obj.to(self.device).half()
        return obj.to(self.device) if hasattr(obj, "to") else obj

    def step(self, model, criterion, sample, optimizer=None, clip: float = 0.0):
        """A callable running one training step of ``model`` (``zero_grad``, forward and loss under autocast,
        backward, gradient norm clipped to ``clip`` if given, ``optimizer.step()``) or, without ``optimizer``, one
        scoring pass without autograd. With ``half`` the optimizer steps float32 masters (:class:`MasterWeights`)."""
        master = MasterWeights(optimizer) if self.half and optimizer is not None else None

        def run():
            if optimizer is None:
                with torch.no_grad(), self.autocast():
                    return criterion(model, sample)
            optimizer.zero_grad(set_to_none=True)
            with self.autocast():
                loss, _, _ = criterion(model, sample)
            (loss if master is None else loss * master.scale).backward()
            if master is not None:
                master.unscale_gradients()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters() if master is None else master.master, clip)
            optimizer.step()
            if master is not None:
                master.copy_back()

        return run

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time(
        self,
        fns: Dict[str, Callable[[], object]],
        rounds: Optional[int] = None,
        warmup: Optional[int] = None,
        before: Optional[Callable[[str], None]] = None,
        repeat: int = 1,
        log: bool = True,
    ) -> Timings:
        """Time each callable of ``fns`` once per round (``repeat`` calls in a row per timing, for calls too short
        to time one by one), rounds interleaved, order rotated; ``before(name)`` runs untimed before each timing.
        A callable that raises is reported (traceback on stderr), dropped and recorded in ``errors``."""
        rounds = self.args.rounds if rounds is None else rounds
        warmup = self.args.warmup if warmup is None else warmup
        t = Timings(list(fns))
        for r in range(warmup + rounds):
            live = [n for n in fns if n not in t.errors]
            shift = r % max(len(live), 1)
            for name in live[shift:] + live[:shift]:
                if before is not None:
                    before(name)
                self.sync()
                faults, start = minor_faults(), time.perf_counter()
                try:
                    for _ in range(repeat):
                        fns[name]()
                    self.sync()
                except Exception as error:  # reported in the table; the run goes on with the other variants
                    t.errors[name] = self.error(error)
                    continue
                if r >= warmup:
                    t.times[name].append((time.perf_counter() - start) / repeat)
                    t.faults[name].append((minor_faults() - faults) / repeat)
            if log and r >= warmup:
                print(
                    f"  round {r - warmup + 1}/{rounds}: " + ", ".join(f"{n} {t.ms(n)} ms" for n in live),
                    file=sys.stderr,
                    flush=True,
                )
        return t

    def error(self, error: Exception) -> str:
        """Report an error of one variant (traceback on stderr), mark the run failed; returns its table cell."""
        traceback.print_exc()
        self.failed = True
        return error_text(error)

    def peak_flops(self) -> float:
        """FLOP/s of the fastest of 5 square matrix products in the benchmark's dtype (a 2048-cubed float32 product
        on a CPU, 8192-cubed on a GPU), after one untimed product: the machine's best case."""
        size = 8192 if self.cuda else 2048
        dtype = self.dtype if self.cuda else torch.float32
        a, b = (torch.randn(size, size, device=self.device, dtype=dtype) for _ in range(2))
        out = torch.empty_like(a)
        samples = []
        for _ in range(6):
            self.sync()
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            self.sync()
            samples.append(time.perf_counter() - start)
        return 2 * size**3 / min(samples[1:])

    def command(self) -> str:
        return " ".join(["python", "-m", self.module] + [shlex.quote(a) for a in self.argv])

    def device_name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.cuda else cpu_name()

    def header(self, title: str, notes: Sequence[str] = ()) -> str:
        """The results file's heading: command, versions, precision, device, load, notes."""
        try:
            import fairseq

            fairseq_version = fairseq.__version__
        except ImportError:
            fairseq_version = "not installed"
        precision = (
            "float32"
            if self.dtype == torch.float32
            else (
                f"{self.args.dtype} (`--dtype`: autocast around forward and loss of whole models; single modules hold "
                f"parameters and inputs in it)"
            )
        )
        if self.half:
            precision = (
                f"fp16 (`--dtype`: float16 parameters and float32 master weights, loss scale {LOSS_SCALE:g} fixed, "
                f"as fairseq's --fp16 without its overflow check; single modules hold parameters and inputs in it)"
            )
        host = f"{os.cpu_count()}-core CPU, {cpu_name()}, {platform.system()} {platform.machine()}"
        if self.cuda:
            p = torch.cuda.get_device_properties(self.device)
            device = (
                f"- GPU: {torch.cuda.get_device_name(self.device)} ({p.total_memory / 2**30:.0f} GiB, CUDA "
                f"{torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}); host: {host}; "
                f"torch.cuda.synchronize() before and after every timed call"
            )
        else:
            device = (
                f"- Machine: {host}; threads: {torch.get_num_threads()} (torch.set_num_threads), "
                f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; allocator: {allocator()} "
                f"(see benchmarks/README.md)"
            )
        lines = [
            f"# {title}",
            "",
            f"- Command: `{self.command()}`; revision {revision(os.path.dirname(os.path.dirname(RESULTS_DIR)))}",
            f"- torch {torch.__version__}, fairseq {fairseq_version}, Python {platform.python_version()}, {precision}",
            device,
            f"- Load average (1/5/15 min) at the start of the run: {self.start[1]}, at the end: {_loadavg()}; "
            f"variants are timed interleaved (one call of each per round, order rotated), figures are medians "
            f"over {self.args.rounds} rounds after {self.args.warmup} warm-up round(s) unless said otherwise",
            f"- Run: {self.start[0]} to {time.strftime('%H:%M')}",
        ]
        if self.args.quick:
            lines.append("- **--quick: tiny sizes, one round; checks that the code runs, measures nothing**")
        return "\n".join(lines + [f"- {note}" for note in notes]) + "\n"

    def finish(self, title: str, notes: Sequence[str], body: str, checks: Sequence[Check]) -> Result:
        """Assemble the results text, print it, write it (unless ``--quick`` or ``--out -``) and return it."""
        text = self.header(title, notes) + "\n" + body.rstrip("\n") + "\n"
        if checks:
            text += "\n## Targets\n\n" + "\n".join(c.line() for c in checks) + "\n"
        print(text)
        path = self.result_path()
        rev = revision(os.path.dirname(os.path.dirname(RESULTS_DIR)))
        context = dict(command=self.command(), precision=self.args.dtype, machine=self.device_name(), revision=rev)
        report = f"results/{os.path.basename(path)}" if path else None
        figures = of_checks(checks, self.module.rsplit(".", 1)[-1], report, context, self.cuda)
        print("\n".join(figure_line(r) for r in figures), flush=True)
        if path:
            write_result(path, text)
            print(f"wrote {os.path.relpath(path)}")
            if checks and path.endswith(".md"):
                write(json_path(path), figures)
                print(f"wrote {os.path.relpath(json_path(path))}")
        return Result(text, list(checks), self.failed)

    def result_path(self) -> Optional[str]:
        if self.args.quick or self.args.out == "-":
            return None
        if self.args.out:
            return self.args.out
        name = self.module.rsplit(".", 1)[-1]
        if self.cuda:
            name += "-" + slug(torch.cuda.get_device_name(self.device))
        elif allocator().startswith("tcmalloc"):
            name += "-tcmalloc"
        return os.path.join(RESULTS_DIR, name + ".md")


def error_text(error: BaseException) -> str:
    """An error as one line for a table cell."""
    return f"failed: {type(error).__name__}: {error}".replace("|", "/").replace("\n", " ")[:300]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write_result(path: str, text: str) -> None:
    """Write ``text`` to ``path``, keeping what the file had from :data:`KEEP_MARK` on (hand-written history)."""
    kept = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = f.read()
        if KEEP_MARK in old:
            kept = "\n" + old[old.index(KEEP_MARK) :]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + kept)


def run_main(main: Callable[[], Result]) -> None:
    """``python -m benchmarks.<name>``: exit status 1 when a variant failed (its table says which)."""
    sys.exit(1 if main().failed else 0)


def allocator() -> str:
    """The memory allocator of this process (what is mapped into it) and the environment settings that tune it."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            maps = f.read()
    except OSError:
        maps = ""
    name = next((lib for lib in ("tcmalloc", "jemalloc", "mimalloc") if lib in maps), "glibc malloc")
    settings = [
        f"`{k}={v}`"
        for k, v in sorted(os.environ.items())
        if k == "LD_PRELOAD" or k.startswith("TCMALLOC_") or (k.startswith("MALLOC_") and k.endswith("_"))
    ]
    return name + (f" ({', '.join(settings)})" if settings else " (its defaults)")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table (numbers already formatted by the caller)."""
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    return "\n".join(out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]) + "\n"
