"""The benchmarks' harness: common options, interleaved timing, the models and batches timed, and the results file.

Every benchmark times its variants *interleaved*: each round runs every variant once (in an order rotated from
round to round), and a variant's figure is its median over rounds, after untimed warm-up rounds. Load from other
processes then hits all variants alike. On a GPU every timed call is bracketed by ``torch.cuda.synchronize()``.
``Bench.finish`` writes the results file and the records of its checks beside it (``benchmarks/targets.py``).
"""

import argparse
import os
import platform
import resource
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from contextlib import nullcontext
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

import torch

from benchmarks import targets
from benchmarks.targets import Check, ms, ratio

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
REPO = os.path.dirname(os.path.dirname(RESULTS_DIR))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LOSS_SCALE = 128.0  # fairseq's --fp16-init-scale
PRECISION = {  # as a results file's header names them
    "fp32": "float32",
    "bf16": "bf16 (`--dtype`: autocast around forward and loss of whole models; single modules hold parameters and "
    "inputs in it)",
    "fp16": f"fp16 (`--dtype`: float16 parameters and float32 master weights, loss scale {LOSS_SCALE:g} fixed, as "
    "fairseq's --fp16 without its overflow check; single modules hold parameters and inputs in it)",
}


def options(doc: str, rounds: int, warmup: int = 1, fp16: bool = False) -> argparse.ArgumentParser:
    """The options every benchmark takes; the benchmark adds its own. ``fp16``: it offers ``--dtype fp16``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    dtypes = tuple(DTYPES) if fp16 else ("fp32", "bf16")  # what each does: PRECISION, benchmarks/README.md
    p.add_argument("--dtype", choices=dtypes, help="default fp32 on cpu, bf16 on cuda; see benchmarks/README.md")
    p.add_argument("--threads", type=int, help="torch CPU threads (default 2 on cpu; torch's default on cuda)")
    p.add_argument("--rounds", type=int, default=rounds, help="timed interleaved rounds (median reported)")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed rounds first")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round: checks that it runs; writes no file")
    p.add_argument("--out", help="results file ('-': none; default benchmarks/results/<name>[-tcmalloc|-<gpu>].md)")
    return p


def listed(parser, flag: str, value: Optional[str], choices: Sequence[str], empty: bool = False) -> List[str]:
    """The names that option ``flag`` lists, comma-separated, in ``value`` (None: every one of ``choices``); a usage
    error naming ``choices`` where one is not among them or, unless ``empty``, none is given."""
    names = [n.strip() for n in (",".join(choices) if value is None else value).split(",") if n.strip()]
    if not (names or empty) or set(names) - set(choices):
        parser.error(f"{flag} {value}: choose from {', '.join(choices)}")
    return names


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

    def per_s(self, name: str, work: float) -> str:
        """``work`` (tokens, FLOP) per second of ``name``'s median."""
        return f"{work / self.median(name):.0f}"

    def speedup(self, base: str, name: str) -> float:
        """How many times faster ``name`` ran than ``base`` (ratio of medians)."""
        return self.median(base) / self.median(name)

    def paired(self, base: str, name: str) -> float:
        """Median over rounds of ``base``'s time over ``name``'s: each round's two calls ran close in time."""
        pairs = [a / b for a, b in zip(self.times.get(base, []), self.times.get(name, []))]
        return statistics.median(pairs) if pairs else float("nan")

    def columns(self, name: str, base: str, work: float, faults: bool = False) -> List[str]:
        """``name``'s cells: median and fastest ms (page faults with ``faults``), ``work`` per second, and how many
        times faster than ``base`` it ran (``speedup``, then ``paired``)."""
        cells = [self.ms(name), self.min_ms(name)] + ([self.page_faults(name)] if faults else [])
        return cells + [self.per_s(name, work), ratio(self.speedup(base, name)), ratio(self.paired(base, name))]


class Bench:
    """One benchmark run: its options, device and precision, the timing and the results file."""

    def __init__(self, module: str, parser: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None):
        self.module, self.name = module, module.rsplit(".", 1)[-1]
        self.argv = list(sys.argv[1:] if argv is None else argv)
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
        self.start = (time.strftime("%Y-%m-%d %H:%M"), loadavg())

    def autocast(self):
        """Mixed precision around a whole model's forward and loss (as fairseq's ``--amp``, in bfloat16)."""
        plain = self.dtype == torch.float32 or self.half
        return nullcontext() if plain else torch.autocast(self.device.type, self.dtype)

    def to(self, obj):
        """``obj`` (a tensor, a module, or dicts / lists of them) on the device; a module in float16 with ``half``."""
        if isinstance(obj, dict):
            return {k: self.to(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.to(v) for v in obj)
        if self.half and isinstance(obj, torch.nn.Module):
            return obj.to(self.device).half()
        return obj.to(self.device) if hasattr(obj, "to") else obj

    def build(self, vocab: int, task_args: Sequence[str], archs: Dict[str, tuple]) -> Dict[str, tuple]:
        """``{name: (cfg, task, model, criterion)}`` of ``{name: (arch, flags)}``, each as :func:`build_model` builds it
        (from seed 1), the model on the device."""
        built = {name: build_model(arch, vocab, task_args, flags) for name, (arch, flags) in archs.items()}
        return {name: (cfg, task, self.to(model), criterion) for name, (cfg, task, model, criterion) in built.items()}

    def check(self, what: str, value: float, target: float, goal: str = "", **fields) -> Check:
        """``what`` against ``target``, or against goal ``goal``'s target on this device where it has one."""
        return Check(what, value, targets.goal_target(goal, self.cuda, target), goal=goal, **fields)

    def step(self, model, criterion, sample, optimizer=None, clip: float = 0.0, master=None):
        """A callable running one training step of ``model`` (``zero_grad``, forward and loss under autocast,
        backward, gradient norm clipped to ``clip`` if given, ``optimizer.step()``) or, without ``optimizer``, one
        scoring pass without autograd. ``master``: the float32 masters that ``optimizer`` steps for a float16 model
        (``train_speed.MasterWeights``)."""

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

    def time(self, fns: Dict[str, Callable[[], object]], rounds=None, warmup=None, before=None, repeat=1, log=True):
        """:class:`Timings` of each callable of ``fns`` once per round (``repeat`` calls in a row per timing, for
        calls too short to time one by one), rounds interleaved, order rotated; ``before(name)`` runs untimed before
        each timing. A callable that raises is reported (traceback on stderr), dropped and recorded in ``errors``."""
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
                times = ", ".join(f"{n} {t.ms(n)} ms" for n in live)
                print(f"  round {r - warmup + 1}/{rounds}: {times}", file=sys.stderr, flush=True)
        return t

    def error(self, error: Exception) -> str:
        """Report an error of one variant (traceback on stderr), mark the run failed; returns its table cell."""
        traceback.print_exc()
        self.failed = True
        return targets.error_text(error)

    def peak_flops(self) -> float:
        """FLOP/s of the fastest of 5 square matrix products in the benchmark's dtype (a 2048-cubed float32 product
        on a CPU, 8192-cubed on a GPU), after one untimed product: the machine's best case."""
        size, dtype = (8192, self.dtype) if self.cuda else (2048, torch.float32)
        a, b = (torch.randn(size, size, device=self.device, dtype=dtype) for _ in range(2))
        out, samples = torch.empty_like(a), []
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

    def header(self, title: str, notes: Sequence[str], rev: str) -> str:
        """The results file's heading: command, versions, precision, device, load, notes."""
        try:
            from fairseq import __version__ as fairseq_version
        except ImportError:
            fairseq_version = "not installed"
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
            f"- Command: `{self.command()}`; revision {rev}",
            f"- torch {torch.__version__}, fairseq {fairseq_version}, Python {platform.python_version()}, "
            + PRECISION[self.args.dtype],
            device,
            f"- Load average (1/5/15 min) at the start of the run: {self.start[1]}, at the end: {loadavg()}; "
            f"variants are timed interleaved (one call of each per round, order rotated), figures are medians "
            f"over {self.args.rounds} rounds after {self.args.warmup} warm-up round(s) unless said otherwise",
            f"- Run: {self.start[0]} to {time.strftime('%H:%M')}",
        ]
        if self.args.quick:
            lines.append("- **--quick: tiny sizes, one round; checks that the code runs, measures nothing**")
        return "\n".join(lines + [f"- {note}" for note in notes]) + "\n"

    def finish(self, title: str, notes: Sequence[str], body: str, checks: Sequence[Check]) -> Result:
        """The results text: printed, with a ``FIGURE`` line per check, and written (unless ``--quick`` or ``--out
        -``) with the records of the checks in the ``.json`` beside it."""
        rev = targets.revision(REPO)
        text = self.header(title, notes, rev) + "\n" + body.rstrip("\n") + "\n"
        if checks:
            text += "\n## Targets\n\n" + "\n".join(c.line() for c in checks) + "\n"
        print(text)
        path = self.result_path()
        context = dict(command=self.command(), precision=self.args.dtype, machine=self.device_name(), revision=rev)
        report = f"results/{os.path.basename(path)}" if path else None
        figures = targets.of_checks(checks, self.name, report, context, self.cuda)
        print("\n".join(targets.figure_line(r) for r in figures), flush=True)
        if path:
            targets.write_result(path, text)
            print(f"wrote {os.path.relpath(path)}")
            if checks and path.endswith(".md"):
                targets.write(targets.json_path(path), figures)
                print(f"wrote {os.path.relpath(targets.json_path(path))}")
        return Result(text, list(checks), self.failed)

    def result_path(self) -> Optional[str]:
        if self.args.quick or self.args.out == "-":
            return None
        if self.args.out:
            return self.args.out
        name = self.name
        if self.cuda:
            name += "-" + targets.slug(torch.cuda.get_device_name(self.device))
        elif allocator().startswith("tcmalloc"):
            name += "-tcmalloc"
        return os.path.join(RESULTS_DIR, name + ".md")


def run_main(main: Callable[[], Result]) -> None:
    """``python -m benchmarks.<name>``: exit status 1 when a variant failed (its table says which)."""
    sys.exit(1 if main().failed else 0)


def loadavg() -> str:
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "n/a"


def minor_faults() -> int:
    """Minor page faults of this process so far (a fresh 4 KiB page touched for the first time is one)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


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
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


# ---- what the benchmarks time: the registered fairseq archs, built as fairseq-train builds them without data files
# (fairseq's parser, its omegaconf config, task.build_model), on made-up dictionaries; batches of Zipf-like tokens
ADAPTIVE_LM = "--task language_modeling --criterion adaptive_loss --ddp-backend legacy_ddp".split()


def count_params(module: torch.nn.Module) -> int:
    """Distinct parameters (a tied weight counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def build_model(arch: str, vocab: int, task_args: Sequence[str], extra: Sequence[str] = (), langs=(), seed=1):
    """``(cfg, task, model, criterion)`` of ``--arch arch`` on dictionaries of ``vocab`` made-up symbols (``dict.txt``,
    and ``dict.<lang>.txt`` for each of ``langs``), its parameters drawn from ``seed``."""
    import define_fairseq  # noqa: F401  (registers the plugin's models)
    from define_fairseq.tools.params import setup_from_train_args, write_dictionaries

    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as data:
        write_dictionaries(data, vocab, langs)
        argv = [data, "--user-dir", "define_fairseq", "--arch", arch, *task_args, *extra, "--cpu"]
        cfg, task, model = setup_from_train_args(argv)
    return cfg, task, model, task.build_criterion(cfg.criterion)


def zipf_tokens(generator: torch.Generator, shape, vocab: int, nspecial: int = 4, exponent: float = 1.0):
    """Token ids drawn Zipf-like over the ``vocab - nspecial`` ordinary symbols: P(rank r) ~ 1 / r**exponent."""
    probs = torch.arange(1, vocab - nspecial + 1, dtype=torch.float64).pow(-exponent)
    flat = torch.multinomial(probs / probs.sum(), int(torch.tensor(shape).prod()), True, generator=generator)
    return (flat + nspecial).view(*shape)


def lm_sample(vocab: int, batch: int, length: int, seed: int = 0) -> dict:
    """A language-modelling batch of Zipf-distributed tokens: ``src_tokens [batch, length]``, targets shifted."""
    stream = zipf_tokens(torch.Generator().manual_seed(seed), (batch, length + 1), vocab)
    net_input = {"src_tokens": stream[:, :-1].contiguous(), "src_lengths": torch.full((batch,), length)}
    target = stream[:, 1:].contiguous()
    return dict(id=torch.arange(batch), nsentences=batch, ntokens=batch * length, net_input=net_input, target=target)
