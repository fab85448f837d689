"""Shared helpers of the benchmarks: interleaved timing, the memory allocator a benchmark runs under (and running
it in a child process), page-fault counts, the machine's peak matrix-product rate, the header and markdown tables.

Every benchmark times its variants *interleaved*: each round runs every variant once (in an order rotated from
round to round), and a variant's figure is the median over rounds. Load from other processes then hits all
variants alike, and the ratios stay meaningful even on a busy machine.
"""

import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _loadavg() -> str:
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "n/a"


_START = (time.strftime("%Y-%m-%d %H:%M"), _loadavg())  # when the benchmark module was imported


# ---------------------------------------------------------------------------------------------------------------
# Memory allocators. The models compared here allocate buffers of hundreds of MB per step (logits, the dense
# gradient of a large embedding table). Whether such a buffer is fresh memory from the kernel (a minor page
# fault per 4 KiB page on first touch) or memory the allocator kept from the previous step depends on the
# allocator and its settings, and can cost seconds per step, more for the model with the larger buffers. A
# benchmark runs under one of these, in its own process; each results file names it and counts the page faults.

# The environment each allocator needs. tcmalloc is preloaded (PyTorch's CPU performance guide recommends
# jemalloc or tcmalloc); ``TCMALLOC_RELEASE_RATE=0`` keeps freed memory for reuse instead of returning it to the
# kernel, so that a steady-state step takes no page faults.
GLIBC_RETAIN = {
    "MALLOC_MMAP_THRESHOLD_": str(4 << 30),  # no mmap for buffers under 4 GiB: they come from the heap
    "MALLOC_TRIM_THRESHOLD_": str(64 << 30),  # never give freed heap memory back to the OS
    "MALLOC_TOP_PAD_": str(1 << 30),  # grow the heap in 1 GiB steps
}
ALLOCATORS = ("glibc", "glibc-retain", "tcmalloc")
TCMALLOC_PATHS = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
                  "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib64/libtcmalloc_minimal.so.4",
                  "/usr/lib/libtcmalloc_minimal.so.4", "/usr/local/lib/libtcmalloc_minimal.so.4")
_ALLOCATOR_VAR = "DEFINE_BENCH_ALLOCATOR"  # set in the process that runs under the chosen allocator


def allocator_env(name: str) -> Dict[str, str]:
    """Environment variables that make a fresh process use allocator ``name`` (one of :data:`ALLOCATORS`).

    ``tcmalloc`` is looked for in ``$TCMALLOC_LIBRARY``, then in the usual library folders; if it is not found,
    ``FileNotFoundError`` says how to install it or point to it.
    """
    if name == "glibc":
        return {}
    if name == "glibc-retain":
        return dict(GLIBC_RETAIN)
    if name == "tcmalloc":
        given = os.environ.get("TCMALLOC_LIBRARY")
        candidates = (given,) if given else TCMALLOC_PATHS
        found = next((path for path in candidates if os.path.isfile(path)), None)
        if found is None:
            where = f"TCMALLOC_LIBRARY={given} does not exist" if given else f"looked in {', '.join(TCMALLOC_PATHS)}"
            raise FileNotFoundError(f"--allocator tcmalloc: libtcmalloc not found ({where}). Install it (Debian, "
                                    f"Ubuntu: apt-get install libtcmalloc-minimal4) or set TCMALLOC_LIBRARY to the "
                                    f"library's path, or choose another allocator.")
        return {"LD_PRELOAD": found, "TCMALLOC_RELEASE_RATE": "0"}
    raise ValueError(f"unknown allocator {name!r}; choose from {', '.join(ALLOCATORS)}")


def allocator_note(name: str) -> str:
    env = allocator_env(name)
    return f"`{name}`" + (f" ({', '.join(f'`{k}={v}`' for k, v in env.items())})" if env else " (glibc's defaults)")


def _allocator_setting(key: str) -> bool:
    """Whether environment variable ``key`` changes which allocator runs or how it behaves."""
    glibc_tunable = key.startswith("MALLOC_") and key.endswith("_")
    return key == "LD_PRELOAD" or key.startswith("TCMALLOC_RELEASE") or glibc_tunable


def allocator_child_env(name: str, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a fresh process that runs under allocator ``name``: ``base`` (default: this process's
    environment) without any allocator setting of its own (``LD_PRELOAD``, glibc's ``MALLOC_*_`` tunables,
    ``TCMALLOC_RELEASE_RATE``), plus :func:`allocator_env` of ``name`` and the marker that names it."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not _allocator_setting(k)}
    env.update(allocator_env(name))
    env[_ALLOCATOR_VAR] = name
    return env


def current_allocator() -> str:
    """The allocator this process was started under through :func:`allocator_child_env` ('' if none was)."""
    return os.environ.get(_ALLOCATOR_VAR, "")


def check_allocator_loaded(name: str) -> None:
    """Raise ``RuntimeError`` if this process was meant to run under tcmalloc but the library is not mapped
    (e.g. the dynamic loader refused the preloaded file)."""
    if name != "tcmalloc" or not os.path.exists("/proc/self/maps"):
        return
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
        if "tcmalloc" not in f.read():
            raise RuntimeError(f"--allocator tcmalloc: LD_PRELOAD={os.environ.get('LD_PRELOAD')} did not load "
                               f"tcmalloc into this process; check that the file is a working libtcmalloc")


def run_under_allocator(name: str, module: str, argv: Sequence[str]) -> None:
    """Make this benchmark run under allocator ``name``: returns at once if this process already does (its
    environment is :func:`allocator_child_env` of ``name``, and tcmalloc, if asked for, is loaded); otherwise
    re-executes ``python -m module argv`` in that environment, and does not return. Meant for a benchmark's
    ``main`` run as a script: the process is replaced."""
    wanted = allocator_child_env(name)
    current = {k: v for k, v in os.environ.items() if _allocator_setting(k) or k == _ALLOCATOR_VAR}
    if current == {k: v for k, v in wanted.items() if _allocator_setting(k) or k == _ALLOCATOR_VAR}:
        check_allocator_loaded(name)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], wanted)


def run_child_json(module: str, argv: Sequence[str], allocator: str) -> dict:
    """Run ``python -m module argv --child-json FILE`` in a fresh process under ``allocator`` and return the JSON
    that the child writes to FILE (a child that fails raises ``CalledProcessError``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        subprocess.run([sys.executable, "-m", module, *argv, "--child-json", out], env=allocator_child_env(allocator),
                       check=True)
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def strip_option(argv: Sequence[str], option: str) -> List[str]:
    """``argv`` without ``option`` and its value (``--option value`` or ``--option=value``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == option:
            skip = True
        elif not a.startswith(option + "="):
            out.append(a)
    return out


def add_allocator_option(parser, benchmark: str) -> None:
    """``--allocator`` (default glibc) for a benchmark that runs under one allocator per process."""
    parser.add_argument("--allocator", choices=ALLOCATORS, default="glibc",
                        help=f"memory allocator to run under (the process re-executes itself with it); results of an "
                             f"allocator other than glibc go to results/{benchmark}-<allocator>.md")


def require_allocators(parser, names: Sequence[str]) -> None:
    """Stop with ``parser.error`` (before any measuring) if an allocator of ``names`` cannot be set up here."""
    for name in names:
        try:
            allocator_env(name)
        except FileNotFoundError as error:
            parser.error(str(error))


def enter_allocator(parser, name: str, benchmark: str, argv: Optional[Sequence[str]]) -> None:
    """:func:`run_under_allocator` for ``python -m benchmarks.<benchmark>`` given ``argv`` (``None``: this
    process's arguments); a missing library stops with ``parser.error``."""
    require_allocators(parser, [name])
    run_under_allocator(name, f"benchmarks.{benchmark}", sys.argv[1:] if argv is None else argv)


def result_name(benchmark: str, allocator: str) -> str:
    """The results file of ``benchmark`` run under ``allocator``: ``<benchmark>`` for glibc, else
    ``<benchmark>-<allocator>``."""
    return benchmark if allocator == "glibc" else f"{benchmark}-{allocator}"


def minor_faults() -> int:
    """Minor page faults of this process so far (a fresh 4 KiB page touched for the first time is one)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def counting_faults(fns: Dict[str, Callable[[], object]]):
    """``(wrapped, faults)``: ``wrapped`` calls the same functions and appends each call's minor page faults to
    ``faults[name]`` (warm-up calls included: drop the first ``warmup`` entries)."""
    faults: Dict[str, List[int]] = {name: [] for name in fns}

    def wrap(name, fn):
        def run():
            before = minor_faults()
            fn()
            faults[name].append(minor_faults() - before)
        return run

    return {name: wrap(name, fn) for name, fn in fns.items()}, faults


def fastest_mm_seconds(a_shape: Sequence[int], b_shape: Sequence[int], calls: int = 1, reps: int = 5) -> float:
    """Seconds of ``calls`` float32 products ``[a_shape] @ [b_shape]`` through ``torch.mm`` into a preallocated
    output, one after the other: the fastest of ``reps`` runs (after one untimed run)."""
    a, b = torch.randn(*a_shape), torch.randn(*b_shape)
    out = torch.empty(a_shape[0], b_shape[1])
    samples = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b, out=out)
        samples.append(time.perf_counter() - start)
    return min(samples[1:])


def peak_gflops(size: int = 2048, reps: int = 5) -> float:
    """GFLOP/s of the fastest of ``reps`` float32 ``size``-cubed products on this machine (after one untimed run)."""
    return 2 * size ** 3 / fastest_mm_seconds((size, size), (size, size), reps=reps) / 1e9


def set_threads(threads: int) -> None:
    """Use ``threads`` intra-op threads (and one inter-op thread where that can still be set)."""
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work has started
        pass


def interleaved(fns: Dict[str, Callable[[], object]], rounds: int, warmup: int = 1,
                before: Optional[Callable[[str], None]] = None, log: bool = False) -> Dict[str, List[float]]:
    """Time each callable of ``fns`` once per round, rounds interleaved; returns seconds per call per variant.

    ``warmup`` rounds are run first and not recorded. ``before(name)``, if given, runs untimed before each call
    (e.g. to clear gradients). The order of the variants is rotated every round.
    """
    names = list(fns)
    times: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(warmup + rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if before is not None:
                before(name)
            start = time.perf_counter()
            fns[name]()
            elapsed = time.perf_counter() - start
            if r >= warmup:
                times[name].append(elapsed)
        if log and r >= warmup:
            print(f"  round {r - warmup + 1}/{rounds}: "
                  + ", ".join(f"{n} {times[n][-1] * 1e3:.1f} ms" for n in names), file=sys.stderr, flush=True)
    return times


def parse_choices(parser, flag: str, value: str, known: Sequence[str]) -> List[str]:
    """The comma-separated list ``value`` of option ``flag``, each item one of ``known``; an empty list or an
    unknown item stops with ``parser.error`` naming the flag and the choices."""
    items = list(dict.fromkeys(item.strip() for item in value.split(",") if item.strip()))  # in order, once each
    unknown = [item for item in items if item not in known]
    if unknown or not items:
        parser.error(f"{flag}: unknown choice(s) {unknown}; choose from {', '.join(known)}")
    return items


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def header(title: str, module: str, notes: Sequence[str] = ()) -> str:
    """The markdown heading of a results file: the command, torch/fairseq versions, threads and machine."""
    argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
    command = f".venv/bin/python -m {module}" + (f" {argv}" if argv else "")
    try:
        import fairseq

        fairseq_version = fairseq.__version__
    except ImportError:
        fairseq_version = "not installed"
    lines = [
        f"# {title}",
        "",
        f"- Command: `{command}`",
        f"- torch {torch.__version__}, fairseq {fairseq_version}, Python {platform.python_version()}, float32",
        f"- Threads: {torch.get_num_threads()} (torch.set_num_threads), OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY', 'unset')} (see benchmarks/README.md)",
        f"- Machine: {os.cpu_count()}-core CPU, {cpu_name()}, {platform.system()} {platform.machine()}",
        f"- Load average (1/5/15 min) at the start of the run: {_START[1]}, at the end: {_loadavg()}; variants are "
        f"timed interleaved (one call of each per round, order rotated), figures are medians over rounds",
        f"- Run: {_START[0]} to {time.strftime('%H:%M')}",
    ]
    if current_allocator():
        lines.append(f"- Allocator: {allocator_note(current_allocator())} (`--allocator`; see benchmarks/README.md)")
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table (numbers already formatted by the caller)."""
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def write_result(name: str, text: str) -> str:
    """Write ``text`` to ``benchmarks/results/<name>.md``, print it and return the path."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    print(f"wrote {os.path.relpath(path)}")
    return path


def fmt_params(n: int) -> str:
    return f"{n / 1e6:.2f} M"


def count_params(module: torch.nn.Module) -> int:
    """Distinct parameters (a tied weight counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


# ---------------------------------------------------------------------------------------------------------------
# Models: the real registered fairseq archs, built without data files.


def make_dictionary(size: int):
    """A fairseq ``Dictionary`` of exactly ``size`` symbols (the 4 specials included)."""
    from fairseq.data import Dictionary

    d = Dictionary()
    i = 0
    while len(d) < size:
        d.add_symbol(f"w{i}")
        i += 1
    return d


def build_translation_model(arch: str, extra_args: Sequence[str] = (), vocab: int = 32000):
    """Build ``--arch arch`` for ``--task translation`` the way fairseq-train does: fairseq's parser, the
    namespace converted to its omegaconf config, then ``task.build_model(cfg.model)``.

    Returns ``(model, task, cfg)``; source and target dictionaries have ``vocab`` symbols each.
    """
    import fairseq  # noqa: F401
    import define_fairseq  # noqa: F401  (registers transformer_define)
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.tasks.translation import TranslationTask

    parser = options.get_training_parser()
    argv = ["/nonexistent-data-dir", "--task", "translation", "-s", "src", "-t", "tgt", "--arch", arch, "--cpu"]
    args = options.parse_args_and_arch(parser, argv + list(extra_args))
    cfg = convert_namespace_to_omegaconf(args)
    task = TranslationTask(cfg.task, make_dictionary(vocab), make_dictionary(vocab))
    model = task.build_model(cfg.model)
    return model, task, cfg


def build_define_and_baseline(layers: int):
    """``(transformer_define, transformer, task)``: the two compared models, same size (d_model 512, FFN 2048,
    ``layers`` + ``layers``), same seed, both with the decoder output tied (the stock one with
    ``--share-decoder-input-output-embed``)."""
    size = ["--encoder-layers", str(layers), "--decoder-layers", str(layers)]
    torch.manual_seed(1)
    define, task, _ = build_translation_model("transformer_define", size)
    torch.manual_seed(1)
    baseline, _, _ = build_translation_model("transformer", size + ["--share-decoder-input-output-embed"])
    return define, baseline, task


def zipf_tokens(generator: torch.Generator, shape, vocab: int, nspecial: int = 4, exponent: float = 1.0):
    """Token ids drawn Zipf-like over the ``vocab - nspecial`` ordinary symbols: P(rank r) ~ 1 / r**exponent."""
    ranks = torch.arange(1, vocab - nspecial + 1, dtype=torch.float64)
    probs = ranks.pow(-exponent)
    flat = torch.multinomial(probs / probs.sum(), int(torch.tensor(shape).prod()), replacement=True,
                             generator=generator)
    return (flat + nspecial).view(*shape)


def paired_ratio(times: Dict[str, List[float]], numerator: str, denominator: str) -> float:
    """Median over rounds of ``times[numerator][r] / times[denominator][r]``: each round's two calls ran close in
    time, so this ratio is less sensitive to slow drifts of the machine's load than a ratio of medians."""
    return median([a / b for a, b in zip(times[numerator], times[denominator])])
