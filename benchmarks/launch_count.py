"""Launches per training step, counted on a CPU: what one step would dispatch to a GPU, one kernel launch at a time.

:func:`count_step` counts, on the profiler's tree of one call's events: every kernel-launching aten operation
outside compiled regions (the outermost of each branch that is not a composite, a view or :data:`NOT_LAUNCHES`; a
``_foreach_*`` operation and ``dropout`` count one, as their GPU kernels), one per call of a compiled graph each way,
one per Triton kernel launch (interpreted ones too), and apart the host synchronisations (:data:`SYNCS`) outside an
optimizer's ``step``. The counts are what the dispatcher was asked to do: the same on any machine and thread count.
The rows (``*_rows``): the other benchmarks' models, eager and compiled, and the Mogrifier per time step and layer.
"""

import contextlib
import copy
import functools
import importlib
import json
import os
import platform
import subprocess
import sys
from collections import Counter, namedtuple
from types import SimpleNamespace
from typing import Callable, Dict, NamedTuple
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.common import REPO, Bench, build_model, cpu_name, listed, lm_sample, options, run_main
from benchmarks.targets import revision, table

TRITON_EVENT = "triton::"  # prefix of the profiler range around each Triton launch
COMPILED_REGION = "Torch-Compiled Region"
FORWARD_GRAPH, BACKWARD_GRAPH = "CompiledFunction", "CompiledFunctionBackward"
INFERENCE_GRAPH = "AOTDispatcher Runtime Wrapper Prologue"  # recorded before each AOT graph call
OPTIMIZER_STEP = "Optimizer.step#"
GROUPS = ("transformer", "txl", "mogrifier", "lstm")  # the benchmark's rows: a *_rows function each
# aten operations that launch nothing on a GPU: allocations, metadata, autograd bookkeeping, the host copy of .item()
NOT_LAUNCHES = frozenset(
    "aten::" + name
    for name in """empty empty_like empty_strided new_empty new_empty_strided _unsafe_view detach_ set_ as_strided_
    resize_ resize_as_ item _local_scalar_dense is_nonzero result_type size stride numel dim sym_size sym_stride
    _has_compatible_shallow_copy_type lift_fresh_copy _nested_tensor_from_mask_left_aligned record_stream sym_numel
    _assert_async _assert_scalar""".split()
)
# aten operations that make the host wait for a GPU (a value or an output size read from the data)
SYNCS = frozenset(
    "aten::" + name
    for name in """_local_scalar_dense nonzero _unique _unique2 unique_dim unique_consecutive unique_dim_consecutive
    masked_select equal nonzero_numpy""".split()
)
FUSED_ON_GPU = frozenset(("aten::dropout", "aten::feature_dropout", "aten::alpha_dropout"))
MOGRIFIER = "define_fairseq.modules.mogrifier."
MOGRIFIER_CUDA_PATHS = f"{MOGRIFIER}fused:fused_mogrifier_layer,{MOGRIFIER}triton_step:triton_mogrifier_layer"
DEFINE_EAGER_GOAL, DEFINE_COMPILED_GOAL, MOGRIFIER_GOAL = 1.10, 1.0, 27  # issue 43's goals on a CPU
TRAINING = "launches per training step"


# what one call dispatched: launches (kernels, graph calls, Triton launches), host syncs, each in all and by name
Counts = NamedTuple("Counts", [("launches", int), ("syncs", int), ("by_name", dict), ("syncs_by_name", dict)])


@functools.lru_cache(maxsize=None)
def _launches_itself(name: str) -> bool:
    """Whether aten operation ``name`` is a kernel of its own: not a composite, not a view, not in NOT_LAUNCHES."""
    if name in NOT_LAUNCHES:
        return False
    packet = getattr(torch.ops.aten, name[len("aten::") :], None)
    if name in FUSED_ON_GPU or packet is None:
        return True
    for overload in packet.overloads():
        if overload.endswith("out"):
            continue
        op = getattr(packet, overload)
        try:
            composite = torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
        except RuntimeError:  # a TorchScript builtin form (add.t, add.int): no dispatcher kernel
            continue
        returns = op._schema.returns
        if composite or bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write:
            return False  # a composite or a view
    return True


def _walk(event, launches: Counter) -> None:
    name = event.name
    if name.startswith(TRITON_EVENT):
        launches[name] += 1  # the interpreter's own tensor work is no launch
    elif name == BACKWARD_GRAPH:
        launches["compiled graph (backward)"] += 1
    elif name.startswith(COMPILED_REGION):
        _walk_region(event, launches)
    elif name.startswith("aten::") and _launches_itself(name):
        launches[name] += 1
    else:
        for child in event.cpu_children:
            _walk(child, launches)


def _walk_region(region, launches: Counter) -> None:
    """A frame run by torch.compile: its graph calls count one each; with autograd the graph is a
    ``CompiledFunction`` and aten operations beside it are eager code between graphs (counted); without autograd
    the graph's operations run straight inside the region (not counted)."""
    children = region.cpu_children
    with_autograd, calls = any(c.name == FORWARD_GRAPH for c in children), 0
    for child in children:
        if child.name == FORWARD_GRAPH or (not with_autograd and child.name == INFERENCE_GRAPH):
            calls += 1
        elif with_autograd or child.name.startswith((COMPILED_REGION, TRITON_EVENT)):
            _walk(child, launches)
    launches["compiled graph (forward)"] += max(calls, 1)


def _syncs(event, syncs: Counter, in_optimizer: bool) -> bool:
    """Counts the innermost synchronising operations under ``event`` (``item`` -> ``_local_scalar_dense`` once,
    ``index`` with a mask -> ``nonzero`` once); whether there was one."""
    in_optimizer = in_optimizer or event.name.startswith(OPTIMIZER_STEP)
    found = False
    for child in event.cpu_children:
        found = _syncs(child, syncs, in_optimizer) or found
    if event.name in SYNCS and not found:
        found = True
        if not in_optimizer:
            syncs[event.name] += 1
    return found


@contextlib.contextmanager
def _triton_launches_recorded():
    """Each Triton kernel launch inside a profiler range ``triton::<kernel>`` (once Triton is imported)."""

    def recorded(run):
        def wrapper(self, *args, grid, warmup, **kwargs):
            if warmup:
                return run(self, *args, grid=grid, warmup=warmup, **kwargs)
            name = getattr(getattr(self, "fn", None), "__name__", None) or type(self).__name__
            with record_function(TRITON_EVENT + name):
                return run(self, *args, grid=grid, warmup=warmup, **kwargs)

        return wrapper

    with contextlib.ExitStack() as patched:
        if "triton" in sys.modules:
            from triton.runtime.interpreter import InterpretedFunction
            from triton.runtime.jit import JITFunction

            for cls in (JITFunction, InterpretedFunction):
                patched.enter_context(mock.patch.object(cls, "run", recorded(cls.__dict__["run"])))
        yield


def count_step(fn: Callable[[], object], warmup: int = 1) -> Counts:
    """The launches and host synchronisations of one call of ``fn`` (the module docstring says what counts),
    after ``warmup`` uncounted calls (compilation, an optimizer's lazily made state)."""
    for _ in range(warmup):
        fn()
    with _triton_launches_recorded(), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    launches, syncs = Counter(), Counter()
    for event in prof.events():
        if event.cpu_parent is None:
            _walk(event, launches)
            _syncs(event, syncs, False)
    return Counts(sum(launches.values()), sum(syncs.values()), dict(launches), dict(syncs))


# a row: a model in a mode, its launches and syncs per unit, its goal (met or not), the commonest launches and syncs
Row = namedtuple("Row", "model mode unit value syncs goal launches sync_names", defaults=("", "", ""))


def commonest(by_name: Dict[str, float], n: int = 6) -> str:
    return ", ".join(f"{k.replace('aten::', '')} {v:g}" for k, v in Counter(by_name).most_common(n) if v)


def row(model: str, mode: str, unit: str, counts: Counts, goal: str = "") -> Row:
    names = (commonest(counts.by_name), commonest(counts.syncs_by_name))
    return Row(model, mode, unit, counts.launches, counts.syncs, goal, *names)


def compiled(model, token_path=None):
    """A copy of ``model`` as ``--torch-compile --torch-compile-backend aot_eager`` builds it."""
    from define_fairseq.models.compile import compile_static_parts

    cfg = SimpleNamespace(torch_compile=True, torch_compile_backend="aot_eager", define_token_path=token_path)
    return compile_static_parts(copy.deepcopy(model), cfg)


def training_counts(bench, variants, criterion, samples, warmup, sizes, what=""):
    """``{key: Counts}`` of a training step of each of ``variants`` on ``samples[0]``, a note for each that counts
    otherwise on ``samples[1]`` (batch size ``sizes[1]``), if given, and a note's end: whether all held there."""
    counts, notes = {}, []
    for key, model in variants.items():
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)
        found = [count_step(bench.step(model, criterion, sample, optimizer), warmup) for sample in samples]
        counts[key] = found[0]
        if found[-1].launches != found[0].launches:
            notes.append(f"{' '.join(key)}: {found[-1].launches} launches at the other batch size")
    held = f" (counted at {what}{sizes[-1]} too: {'the same' if not notes else 'not the same, below'})"
    return counts, notes, held if len(sizes) > 1 else ""


def transformer_rows(bench, quick, warmup):
    from benchmarks.train_speed import DEFINE, translation_batch, translation_models, with_token_path

    layers, vocab, sentences = (1, 500, (4,)) if quick else (6, 32000, (16, 8))
    define, baseline, task, criterion = translation_models(layers, vocab)
    variants = {
        ("transformer", "eager"): baseline,
        ("transformer_define", "eager"): define,
        ("transformer_define", "eager, --define-token-path positions"): with_token_path(define, "positions"),
        ("transformer_define", "--torch-compile"): compiled(define),
    }
    if not quick:
        variants[(DEFINE, "--torch-compile --define-token-path positions")] = compiled(define, "positions")
    samples = [bench.to(translation_batch(task, n, 20, 32)) for n in sentences]
    counts, notes, held = training_counts(bench, variants, criterion, samples, warmup, sentences)
    base, rows = counts[("transformer", "eager")].launches, []
    for (model, mode), c in counts.items():
        limit = DEFINE_COMPILED_GOAL if "compile" in mode else DEFINE_EAGER_GOAL
        verdict = "met" if c.launches <= limit * base else "not met"
        goal = f"{c.launches / base:.3f}x transformer's; goal <= {limit:g}x: {verdict}" if model == DEFINE else ""
        rows.append(row(model, mode, TRAINING, c, goal))
    note = (
        f"transformer, transformer_define: train_speed's models ({layers} + {layers} layers, V = {vocab:,}), "
        f"label-smoothed cross-entropy, {sentences[0]} sentences of 20-32 tokens"
        f"{held}; fairseq's transformer has no --torch-compile: eager only"
    )
    return rows, [note] + notes


def txl_rows(bench, quick, warmup):
    from benchmarks.txl_speed import DEFINE, STANDARD, TASK, txl_batch

    sizes = (3000, 1, "500,1000,2000", (4,), 8) if quick else (32000, 4, "2500,5000,25000", (8, 4), 64)
    vocab, layers, cutoff, batches, tgt_len = sizes
    shape = ["--decoder-layers", str(layers), "--adaptive-softmax-cutoff", cutoff, "--txl-mem-len", str(tgt_len)]
    variants, criterion = {}, None
    for arch in (STANDARD, DEFINE):
        _, _, model, criterion = build_model(arch, vocab, TASK, shape)
        variants[(arch, "eager")], variants[(arch, "--torch-compile")] = model, compiled(model)
    if not quick:
        variants[(DEFINE, "--torch-compile --define-token-path positions")] = compiled(model, "positions")
    samples = [bench.to(txl_batch(vocab, b, tgt_len, seed=0)) for b in batches]
    warmup = max(warmup, 2)  # the second step has a memory
    counts, notes, held = training_counts(bench, variants, criterion, samples, warmup, batches, "batch ")
    rows = [row(model, mode, TRAINING, c) for (model, mode), c in counts.items()]
    note = (
        f"Transformer-XL: txl_speed's archs at {layers} layers, V = {vocab:,}, adaptive softmax cutoffs {cutoff}, "
        f"lm_regularized_loss, batch {batches[0]} x {tgt_len} with the memory ({tgt_len}) of the step before" + held
    )
    return rows, [note] + notes


def mogrifier_entry(bench, entry: str):
    """The function ``entry`` (``MODULE:FUNCTION``) names, imported with Triton's interpreter on a CPU."""
    if not bench.cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # read when Triton defines a kernel, at its module's import
    name, _, function = entry.partition(":")
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        raise ImportError(f"--mogrifier-cuda-path {entry}: cannot import {name}: {error}") from error
    if not function or not hasattr(module, function):
        raise ValueError(f"--mogrifier-cuda-path {entry}: give MODULE:FUNCTION, a function of {name}")
    return getattr(module, function)


def mogrifier_rows(bench, quick, warmup, entries: str):
    """Launches per time step and layer of the ``mogrifier_lstm_lm_ptb`` stack (small width): forward and backward
    at T1 < T2 < T3, (c(T2) - c(T1)) / ((T2 - T1) x layers), where the per-sequence work cancels; on the CPU path and
    through each of ``entries`` (comma-separated ``MODULE:FUNCTION``, run as ``triton_mogrifier_layer``)."""
    from benchmarks.mogrifier_speed import LayerSteps, ptb_stack

    paths = {f"CUDA path ({e})": mogrifier_entry(bench, e) for e in entries.split(",") if e.strip()}
    hidden, batch, lengths = (8, 2, (2, 3, 4)) if quick else (32, 4, (4, 8, 12))
    stack = ptb_stack(bench, 100, hidden, 4)
    for layer in stack.layers:
        layer.kernels = "torch"  # what a CPU runs; the CUDA paths below choose their own kernels
    layers, rows, notes = stack.num_layers, [], []
    runners = {"CPU path (MogrifierLSTM, kernels='torch')": lambda x: stack(x)[0]}
    runners.update({mode: LayerSteps(stack, run_layer) for mode, run_layer in paths.items()})
    for mode, runner in runners.items():
        counts = []
        for t in lengths:
            x = torch.randn(batch, t, stack.input_size, device=bench.device, requires_grad=True)
            counts.append(count_step(lambda: runner(x).sum().backward(), warmup))
        steps = [(b - a) * layers for a, b in zip(lengths, lengths[1:])]
        per = [(b.launches - a.launches) / n for a, b, n in zip(counts, counts[1:], steps)]
        names = {k: (v - counts[0].by_name.get(k, 0)) / steps[0] for k, v in counts[1].by_name.items()}
        met = "met" if per[0] <= MOGRIFIER_GOAL else "not met"
        goal = f"goal <= {MOGRIFIER_GOAL}: {met}" if mode.startswith("CUDA") else ""
        syncs = (counts[1].syncs - counts[0].syncs) / steps[0]
        unit = "launches per time step and layer"
        rows.append(Row("mogrifier_lstm_lm_ptb stack", mode, unit, per[0], syncs, goal, commonest(names)))
        if per[0] != per[1]:
            notes.append(f"Mogrifier {mode}: {per[1]:g} per time step and layer from T = {lengths[1]} to {lengths[2]}")
    note = (
        f"Mogrifier: the mogrifier_lstm_lm_ptb stack as fairseq-train builds it ({layers} layers, rounds 5, its "
        f"dropouts) at input and hidden {hidden}, rank 4, batch {batch}; forward and backward at T = "
        f"{', '.join(map(str, lengths))}: per time step and layer from the first two (the same from the last two "
        f"unless said); a CUDA path runs each layer through its function (--mogrifier-cuda-path; Triton kernels "
        f"{'compiled' if bench.cuda else 'interpreted, TRITON_INTERPRET=1'}; the stack's dropout between layers "
        f"left out); on a GPU the default replays a BPTT window as CUDA graphs, which the host does not count"
    )
    return rows, [note] + notes


def lstm_rows(bench, quick, warmup):
    from benchmarks.lstm_lm_speed import layers_alone

    vocab, bptt, batches, hidden = (500, 8, (2,), 64) if quick else (10000, 70, (20, 10), 1150)
    flags = f"--decoder-embed-dim 400 --decoder-hidden-size {hidden} --decoder-layers 3 --dropout 0.4 "
    flags += f"--share-decoder-input-output-embed --decoder-output-dim {hidden} --define-n 128 --define-depth 7 "
    flags += "--define-k 1024"
    _, _, model, criterion = build_model("lstm_lm_define", vocab, ["--task", "language_modeling"], flags.split())
    model, name, scoring = bench.to(model), "lstm_lm_define", "eager, scoring (eval, no grad)"
    train = [bench.to(lm_sample(vocab, b, bptt)) for b in batches]
    counts, notes, held = training_counts(bench, {(name, "eager, training"): model}, criterion, train, warmup, batches)
    model.eval()
    sample = bench.to(lm_sample(vocab, batches[-1], bptt))
    counts[(name, scoring)] = count_step(bench.step(model, criterion, sample), warmup)
    alone = layers_alone(bench, model.decoder.lstm, batches[-1], bptt, training=False)
    counts[("its 3 LSTM layers alone", scoring)] = count_step(alone, warmup)
    rows = [row(model, mode, "launches per step", c) for (model, mode), c in counts.items()]
    note = (
        f"lstm_lm_define: lstm_lm_speed's DeFINE model (n = 128, N = 7, k = 1024; V = {vocab:,}, embedding 400, 3 "
        f"LSTM layers of {hidden}, tied), cross-entropy, BPTT {bptt}; training at batch {batches[0]}"
        f"{held}, scoring at batch {batches[-1]}"
    )
    return rows, [note] + notes


def code_state() -> Dict[str, object]:
    """The revision measured and the tracked code files that differ from it (results aside): the counts include them."""
    status = ["git", "-c", "safe.directory=*", "status", "--porcelain", "--untracked-files=no", "--"]
    status = subprocess.run(status + ["define_fairseq", "benchmarks"], cwd=REPO, capture_output=True, text=True)
    changed = [line[3:] for line in status.stdout.splitlines() if line.strip() and not line.endswith((".md", ".json"))]
    return {"revision": revision(REPO), "uncommitted": changed}


def write_records(path: str, bench: Bench, rows, state: Dict[str, object]) -> str:
    """One JSON record per figure of ``rows`` (launches and syncs each) with what was measured where; returns it."""
    context = dict(state, machine=f"{platform.machine()}, {cpu_name()}", torch=torch.__version__)
    context["command"] = bench.command()
    records = [dict(context, model=r.model, mode=r.mode, unit=unit, value=value, goal=r.goal) for r in rows
               for unit, value in ((r.unit, r.value), (r.unit.replace("launches", "syncs"), r.syncs))]  # fmt: skip
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(records, indent=1) + "\n")
    return path


def main(argv=None):
    parser = options(__doc__, rounds=1, warmup=2)
    parser.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated, of {', '.join(GROUPS)}")
    like = "triton_mogrifier_layer(layer, x [T, B, m], h0, c0) -> (y, (h, c)) (default %(default)s)"
    like = f"the Mogrifier's CUDA paths to count, comma-separated MODULE:FUNCTION, each a function like {like}"
    parser.add_argument("--mogrifier-cuda-path", default=MOGRIFIER_CUDA_PATHS, help=like)
    bench = Bench("benchmarks.launch_count", parser, argv)
    args = bench.args
    groups = listed(parser, "--only", args.only, GROUPS)
    if not all(":" in entry for entry in args.mogrifier_cuda_path.split(",")):
        parser.error(f"--mogrifier-cuda-path {args.mogrifier_cuda_path}: give MODULE:FUNCTION, comma-separated")
    rows, notes = [], []
    for group in groups:
        extra = (args.mogrifier_cuda_path,) if group == "mogrifier" else ()
        try:
            found = globals()[f"{group}_rows"](bench, args.quick, args.warmup, *extra)
        except Exception as error:  # reported in the table; the other groups are still counted
            found = [Row(group, bench.error(error), "", float("nan"), float("nan"))], []
        rows += found[0]
        notes += found[1]
    state = code_state()
    notes.append(
        f"Counted by count_step (benchmarks/launch_count.py says what counts): one call after {args.warmup} "
        f"uncounted ones; counts, not times: deterministic, the same on any machine, load and thread count. "
        f"Code files with uncommitted changes, counted as they were: {', '.join(state['uncommitted']) or 'none'}"
    )
    columns = "model | mode | launches | syncs | per | goal (issue 43, on a CPU) | commonest launches | "
    columns += "syncs by operation"
    cells = [[f"`{r.model}`", r.mode, f"{r.value:g}", f"{r.syncs:g}", r.unit.replace("launches per ", "")] + list(r[5:])
             for r in rows]  # fmt: skip
    result = bench.finish("Kernel launches per step, counted on a CPU", notes, table(columns, cells), [])
    path = bench.result_path()
    if path:
        print(f"wrote {os.path.relpath(write_records(os.path.splitext(path)[0] + '.json', bench, rows, state))}")
    return result


if __name__ == "__main__":
    run_main(main)
