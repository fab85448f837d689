"""GroupLinear forward + backward (the input requires grad, as inside DeFINE) against a per-group loop of
nn.Linear and a dense nn.Linear, at the three layers of the base ``transformer_define``'s DeFINE unit and 1024 ->
2048 with 4 groups; both formulations (``fused``: its autograd function; ``plain``: a batched multiply), "GroupLinear"
the one it takes on the device. On a GPU each variant is also timed by CUDA-graph replay, the GPU's time without the
host's launches. Targets: no slower than the loop at every shape; >= 1.5x dense at 1024 -> 2048, 4 groups, 8192
tokens, in device time (CUDA-graph replay on a GPU, the wall time on a CPU).
"""

import torch
import torch.nn as nn

from benchmarks.common import Bench, Timings, options, run_main
from benchmarks.targets import ms, ratio, table
from define_fairseq.modules import GroupLinear
from define_fairseq.modules.define.group_linear import FUSED_DEVICES, _group_linear_fused, _group_linear_reference
from define_fairseq.modules.define.unit import define_layer_sizes

FORMULATIONS = ("fused", "plain")
GOAL_SHAPE = (1024, 2048, 4)
NAMES = ("fused", "plain", "loop", "dense")


class LoopGroupLinear(nn.Module):
    """The straightforward alternative: one ``nn.Linear`` per group on ``chunk``s of the input, then ``cat``."""

    def __init__(self, in_features: int, out_features: int, groups: int):
        super().__init__()
        self.groups = groups
        self.linears = nn.ModuleList(nn.Linear(in_features // groups, out_features // groups) for _ in range(groups))

    def forward(self, x):
        return torch.cat([lin(c) for lin, c in zip(self.linears, x.chunk(self.groups, dim=-1))], dim=-1)


class FormulationGroupLinear(GroupLinear):
    """GroupLinear held to one of its formulations (``fused`` or ``plain``) whatever the device."""

    def __init__(self, in_features: int, out_features: int, groups: int, formulation: str):
        super().__init__(in_features, out_features, groups)
        self.formulation = formulation

    def forward(self, x):
        if self.groups == 1:
            return super().forward(x)
        apply = _group_linear_fused if self.formulation == "fused" else _group_linear_reference
        return apply(x, self.weight, self.bias)


def graph_timings(bench: Bench, calls, replays: int) -> Timings:
    """GPU seconds per call of each of ``calls`` (name -> (callable, zeroing callable)): each captured once as a
    CUDA graph (after three warm-up calls on a side stream, gradients set to None so that the graph writes rather
    than accumulates them), then per round ``replays`` replays between two CUDA events, rounds interleaved and
    rotated as ``Bench.time`` does; the median over rounds."""
    graphs = {}
    for name, (call, zero) in calls.items():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                zero()
                call()
        torch.cuda.current_stream().wait_stream(side)
        zero()
        graphs[name] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[name]):
            call()
    t, names = Timings(list(graphs)), list(graphs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(bench.args.warmup + bench.args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            torch.cuda.synchronize()
            start.record()
            for _ in range(replays):
                graphs[name].replay()
            end.record()
            end.synchronize()
            if r >= bench.args.warmup:
                t.times[name].append(start.elapsed_time(end) / 1e3 / replays)
    return t


def main(argv=None):
    parser = options(__doc__, rounds=15, warmup=2, fp16=True)
    parser.add_argument("--tokens", type=int, default=8192, help="rows of the input")
    parser.add_argument("--replays", type=int, default=50, help="CUDA-graph replays per timing (GPU)")
    bench = Bench("benchmarks.group_linear", parser, argv)
    tokens = 64 if bench.args.quick else bench.args.tokens
    chosen = "fused" if bench.device.type in FUSED_DEVICES else "plain"
    other = FORMULATIONS[1 - FORMULATIONS.index(chosen)]
    shapes = [(*s, f"transformer_define layer {i + 1}") for i, s in enumerate(define_layer_sizes(128, 1024, 512, 3, 4))]
    rows, gpu_rows, checks, goal = [], [], [], float("nan")
    for in_f, out_f, groups, label in shapes + [(*GOAL_SHAPE, "1024 -> 2048, 4 groups")]:
        torch.manual_seed(0)
        modules = {f: FormulationGroupLinear(in_f, out_f, groups, f) for f in FORMULATIONS}
        modules.update(loop=LoopGroupLinear(in_f, out_f, groups), dense=nn.Linear(in_f, out_f))
        modules = {name: m.to(bench.device, bench.dtype) for name, m in modules.items()}
        x = torch.randn(tokens, in_f, device=bench.device, dtype=bench.dtype, requires_grad=True)
        grad = torch.randn(tokens, out_f, device=bench.device, dtype=bench.dtype)

        def zero(name):
            x.grad = None
            modules[name].zero_grad(set_to_none=True)

        def step(name):
            def run():
                if bench.cuda:  # many calls per timing: gradients must not accumulate
                    zero(name)
                modules[name](x).backward(grad)

            return run

        fns = {name: step(name) for name in modules}
        t = bench.time(fns, before=None if bench.cuda else zero, repeat=20 if bench.cuda else 1)
        speedups = [ratio(t.speedup(n, chosen)) for n in (other, "loop", "dense")]
        rows.append([label, f"{in_f} -> {out_f}", groups] + [t.ms(n) for n in modules] + speedups)
        what = f"GroupLinear vs the loop at {in_f} -> {out_f}, g={groups}"
        checks.append(bench.check(what, t.speedup("loop", chosen), 1.0))
        if (in_f, out_f, groups) == GOAL_SHAPE and not bench.cuda:
            goal = t.speedup("dense", chosen)  # a CPU runs the kernels itself: its wall time is its device time
        if not bench.cuda:
            continue
        for part, backward in (("forward", False), ("forward + backward", True)):
            calls = {
                n: ((lambda m=m: m(x).backward(grad)) if backward else (lambda m=m: m(x)), lambda n=n: zero(n))
                for n, m in modules.items()
            }
            try:
                g = graph_timings(bench, calls, bench.args.replays)
            except Exception as error:  # the wall times and the other shapes still count
                gpu_rows.append([label, part, bench.error(error)] + [""] * 7)
                continue
            cells = [ms(g.median(n)) for n in modules] + [ratio(g.speedup(n, chosen)) for n in (other, "loop", "dense")]
            gpu_rows.append([label, part] + cells + [ratio(g.paired("dense", chosen))])
            if backward and (in_f, out_f, groups) == GOAL_SHAPE:
                goal = g.speedup("dense", chosen)
    clock = "GPU time (CUDA-graph replay)" if bench.cuda else "CPU time"
    what = f"GroupLinear g=4 vs dense at 1024 -> 2048, {tokens} tokens, forward + backward, {clock}"
    checks.append(bench.check(what, goal, 1.5))
    wall = "torch.cuda.synchronize() around 20 calls in a row, the host's launches included"
    notes = [
        f"{tokens} tokens, input requires grad; GroupLinear = its {chosen} formulation, the one it takes on "
        f"{bench.device.type}; fused = its custom autograd function, plain = the batched multiply and a transposing "
        f"copy, loop = one nn.Linear per group, dense = nn.Linear (benchmarks/README.md)",
        "wall time: " + (wall if bench.cuda else "one call per timing"),
    ]
    if bench.cuda:
        notes.append(
            f"GPU time: each variant captured as a CUDA graph (forward, and forward + backward), {bench.args.replays} "
            f"replays between two CUDA events per round, the median over rounds"
        )
    columns = [f"{n} ms" for n in NAMES] + [f"{other} / GroupLinear", "loop / GroupLinear", "dense / GroupLinear"]
    body = "## Wall time\n\n" + table(["shape", "in -> out", "groups"] + columns, rows)
    if gpu_rows:
        gpu_columns = ["shape", "pass"] + columns + ["dense / GroupLinear (median of rounds)"]
        body += "\n## GPU time (CUDA-graph replay)\n\n" + table(gpu_columns, gpu_rows)
    body += "\nRatios above 1 mean GroupLinear is faster.\n"
    return bench.finish("GroupLinear forward + backward", notes, body, checks)


if __name__ == "__main__":
    run_main(main)
