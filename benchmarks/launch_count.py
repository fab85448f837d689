"""Launches per training step, counted on a CPU: what one step would dispatch to a GPU, one kernel launch at a time.

:func:`count_step` runs a callable under the torch profiler and counts, on the tree of its events:

* every **kernel-launching aten operation outside compiled regions**: the outermost aten operation of each branch
  that is neither a composite (an operation with a ``CompositeImplicitAutograd`` form: ``linear``, ``dropout``,
  ``to``, ``log_softmax`` ... count through the operations they call), nor a view or reshape (its schema returns
  an alias of an input), nor an allocation, ``detach``, ``item`` and the like (:data:`NOT_LAUNCHES`).
  An operation counts once with whatever it calls inside (``sum``'s ``fill_``, a ``_foreach_add_``'s per-tensor
  ``add_`` on a CPU: one multi-tensor kernel on a GPU); ``dropout`` counts one, as the GPU's fused kernel, though
  a CPU runs it as three;
* **one per call of a compiled graph** (``torch.compile``): each forward graph called inside a "Torch-Compiled
  Region" (an autograd ``CompiledFunction``, or an inference graph) and each ``CompiledFunctionBackward``, never the
  operations inside (with Inductor on a GPU a graph launches its fused kernels; ``aot_eager`` on a CPU runs the
  graph's aten operations one by one);
* **one per Triton kernel launch**, counted by wrapping Triton's launch (``JITFunction.run`` and, under
  ``TRITON_INTERPRET=1``, ``InterpretedFunction.run``), so that interpreted kernels count as compiled ones do;
* and, apart, the **host synchronisations** (:data:`SYNCS`: ``item``, ``nonzero``, ``unique``, boolean indexing
  ...), except inside an optimizer's ``step``, whose step counters stay on the host on a GPU too.

The counts do not depend on the machine or on the thread count: they are what the dispatcher was asked to do.

The benchmark counts one training step (forward, fairseq's criterion, backward, ``torch.optim.Adam(foreach=True)``;
no clipping) of ``transformer`` and ``transformer_define`` (train_speed's models, 6 + 6 layers, V = 32k),
Transformer-XL with the standard and the DeFINE input (txl_speed's archs at 4 layers, V = 32k, memory carried), and
``lstm_lm_define`` (lstm_lm_speed's DeFINE model; also scoring), eager and with ``--torch-compile`` (backend
``aot_eager``: graph calls, as Inductor's would be, without a C compiler); and the Mogrifier LSTM per time step and
layer (``mogrifier_lstm_lm_ptb``'s stack at a small width, forward and backward at several lengths, the difference
over the extra steps), on its CPU path and through ``--mogrifier-cuda-path`` (the fused kernels and the Triton
step, interpreted on a CPU). Counts do not depend on the batch
size (checked at two sizes and said in the notes). Results: ``benchmarks/results/launch_count.md`` and ``.json``.

    .venv/bin/python -m benchmarks.launch_count [--quick] [--only transformer,txl,mogrifier,lstm] [--out FILE]
        [--mogrifier-cuda-path MODULE:FUNCTION,...]
"""

import contextlib
import functools
import json
import os
import platform
import subprocess
import sys
from collections import Counter
from typing import Callable, Dict, Iterator, NamedTuple

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.common import Bench, cpu_name, options, run_main, table
from benchmarks.targets import revision

TRITON_EVENT = "triton::"  # prefix of the profiler range around each Triton launch
COMPILED_REGION = "Torch-Compiled Region"
FORWARD_GRAPH, BACKWARD_GRAPH = "CompiledFunction", "CompiledFunctionBackward"
INFERENCE_GRAPH = "AOTDispatcher Runtime Wrapper Prologue"  # recorded before each AOT graph call
OPTIMIZER_STEP = "Optimizer.step#"
GROUPS = ("transformer", "txl", "mogrifier", "lstm")  # the benchmark's rows (benchmarks/launch_count_models.py)
# aten operations that launch nothing on a GPU: allocations, metadata, autograd bookkeeping, the host copy of .item()
NOT_LAUNCHES = frozenset(
    "aten::" + name
    for name in (
        "empty empty_like empty_strided new_empty new_empty_strided _unsafe_view detach_ set_ as_strided_ resize_ "
        "resize_as_ item _local_scalar_dense is_nonzero result_type size stride numel dim "
        "_has_compatible_shallow_copy_type lift_fresh_copy _nested_tensor_from_mask_left_aligned "
        "record_stream _assert_async _assert_scalar sym_size sym_stride sym_numel"
    ).split()
)
# aten operations that make the host wait for a GPU (a value or an output size read from the data)
SYNCS = frozenset(
    "aten::" + name
    for name in (
        "_local_scalar_dense nonzero _unique _unique2 unique_dim unique_consecutive unique_dim_consecutive "
        "masked_select equal nonzero_numpy"
    ).split()
)
FUSED_ON_GPU = frozenset(("aten::dropout", "aten::feature_dropout", "aten::alpha_dropout"))


class Counts(NamedTuple):
    """What one call dispatched: ``launches`` (kernel launches, compiled-graph calls and Triton launches),
    ``syncs`` (host synchronisations), ``by_name`` (launches per operation, graph or kernel name; sums to
    ``launches``) and ``syncs_by_name``."""

    launches: int
    syncs: int
    by_name: Dict[str, int]
    syncs_by_name: Dict[str, int]


@functools.lru_cache(maxsize=None)
def _launches_itself(name: str) -> bool:
    """Whether aten operation ``name`` (the profiler's name, no overload) is a kernel of its own: not a composite
    of other aten operations, not a view, not in :data:`NOT_LAUNCHES`."""
    if name in NOT_LAUNCHES:
        return False
    if name in FUSED_ON_GPU:
        return True
    packet = getattr(torch.ops.aten, name[len("aten::") :], None)
    if packet is None:
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
        view = bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write
        if composite or view:
            return False
    return True


def _walk(event, launches: Counter) -> None:
    name = event.name
    if name.startswith(TRITON_EVENT):
        launches[name] += 1
        return  # the interpreter's own tensor work is no launch
    if name == BACKWARD_GRAPH:
        launches["compiled graph (backward)"] += 1
        return
    if name.startswith(COMPILED_REGION):
        _walk_region(event, launches)
        return
    if name.startswith("aten::") and _launches_itself(name):
        launches[name] += 1
        return
    for child in event.cpu_children:
        _walk(child, launches)


def _walk_region(region, launches: Counter) -> None:
    """A frame run by torch.compile: its graph calls count one each; with autograd the graph is a
    ``CompiledFunction`` and aten operations beside it are eager code between graphs (counted); without autograd
    the graph's operations run straight inside the region (not counted)."""
    children = region.cpu_children
    with_autograd = any(c.name == FORWARD_GRAPH for c in children)
    calls = 0
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
def _triton_launches_recorded() -> Iterator[None]:
    """Each Triton kernel launch inside a profiler range ``triton::<kernel>`` (only if Triton is imported: a
    kernel cannot be launched without it)."""
    if "triton" not in sys.modules:
        yield
        return
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    saved = {cls: cls.__dict__["run"] for cls in (JITFunction, InterpretedFunction)}

    def recorded(run):
        def wrapper(self, *args, grid, warmup, **kwargs):
            if warmup:
                return run(self, *args, grid=grid, warmup=warmup, **kwargs)
            name = getattr(getattr(self, "fn", None), "__name__", None) or type(self).__name__
            with record_function(TRITON_EVENT + name):
                return run(self, *args, grid=grid, warmup=warmup, **kwargs)

        return wrapper

    try:
        for cls, run in saved.items():
            cls.run = recorded(run)
        yield
    finally:
        for cls, run in saved.items():
            cls.run = run


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


def code_state() -> Dict[str, object]:
    """The revision measured (as the results file's header gives it) and the tracked code files that differed from
    it (results files aside), whose changes the counts include."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    status = subprocess.run(
        ["git", "-c", "safe.directory=*", "status", "--porcelain", "--untracked-files=no", "--", "define_fairseq",
         "benchmarks"], cwd=repo, capture_output=True, text=True,
    ).stdout  # fmt: skip
    changed = [line[3:] for line in status.splitlines() if line.strip() and not line.endswith((".md", ".json"))]
    return {"revision": revision(repo), "uncommitted": changed}


def write_records(path: str, bench: Bench, rows, state: Dict[str, object]) -> str:
    """One JSON record per figure of ``rows`` (launches and syncs each) with what was measured where; returns
    ``path``."""
    context = dict(state, machine=f"{platform.machine()}, {cpu_name()}", torch=torch.__version__)
    context["command"] = bench.command()
    records = [
        dict(context, model=r.model, mode=r.mode, unit=unit, value=value, goal=r.goal)
        for r in rows
        for unit, value in ((r.unit, r.value), (r.unit.replace("launches", "syncs"), r.syncs))
    ]
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(records, indent=1) + "\n")
    return path


def main(argv=None):
    from benchmarks import launch_count_models as models

    parser = options(__doc__, rounds=1, warmup=2)
    parser.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated, of {', '.join(GROUPS)}")
    parser.add_argument(
        "--mogrifier-cuda-path",
        default=models.MOGRIFIER_CUDA_PATHS,
        help="the Mogrifier's CUDA paths to count, comma-separated MODULE:FUNCTION, each running one "
        "MogrifierLSTMLayer over a sequence as triton_mogrifier_layer(layer, x [T, B, m], h0, c0) -> (y, (h, c)) "
        "does (default %(default)s)",
    )
    bench = Bench("benchmarks.launch_count", parser, argv)
    args = bench.args
    groups = [g.strip() for g in args.only.split(",") if g.strip()]
    if not groups or set(groups) - set(GROUPS):
        parser.error(f"--only {args.only}: choose from {', '.join(GROUPS)}")
    if not all(":" in entry for entry in args.mogrifier_cuda_path.split(",")):
        parser.error(f"--mogrifier-cuda-path {args.mogrifier_cuda_path}: give MODULE:FUNCTION, comma-separated")
    rows, notes = [], []
    for group in groups:
        extra = (args.mogrifier_cuda_path,) if group == "mogrifier" else ()
        try:
            found = getattr(models, f"{group}_rows")(bench, args.quick, args.warmup, *extra)
        except Exception as error:  # reported in the table; the other groups are still counted
            found = [models.Row(group, bench.error(error), "", float("nan"), float("nan"))], []
        rows += found[0]
        notes += found[1]
    state = code_state()
    changed = ", ".join(state["uncommitted"]) or "none"
    notes.append(
        f"Counted by count_step (benchmarks/launch_count.py says what counts): one call after {args.warmup} "
        f"uncounted ones; counts, not times: deterministic, the same on any machine, load and thread count. "
        f"Code files with uncommitted changes, counted as they were: {changed}"
    )
    columns = ["model", "mode", "launches", "syncs", "per", "goal (issue 43, on a CPU)", "commonest launches"]
    cells = [
        [f"`{r.model}`", r.mode, f"{r.value:g}", f"{r.syncs:g}", r.unit.replace("launches per ", ""), r.goal]
        + [r.launches, r.sync_names]
        for r in rows
    ]
    body = table(columns + ["syncs by operation"], cells)
    result = bench.finish("Kernel launches per step, counted on a CPU", notes, body, [])
    path = bench.result_path()
    if path:
        json_path = write_records(os.path.splitext(path)[0] + ".json", bench, rows, state)
        print(f"wrote {os.path.relpath(json_path)}")
    return result


if __name__ == "__main__":
    run_main(main)
