"""GroupLinear vs a per-group loop of nn.Linear vs a dense nn.Linear: forward + backward time on CPU.

Shapes: every layer of the base ``transformer_define`` DeFINE unit (n=128, k=1024, m=512, depth 3, 4 groups
at most) and 1024 -> 2048 with 4 groups. The input requires grad (as inside DeFINE, where each layer's input
comes from the trainable table), so backward computes the input, weight and bias gradients.

Targets: GroupLinear no slower than the loop at every shape; at least 2.5x faster than dense at 1024 -> 2048,
4 groups, 8192 tokens.

    .venv/bin/python -m benchmarks.group_linear [--tokens 8192] [--rounds 15] [--threads 2]
"""

import argparse

import torch
import torch.nn as nn

from benchmarks.common import header, interleaved, median, set_threads, table, write_result
from define_fairseq.modules import GroupLinear
from define_fairseq.modules.define import define_layer_sizes
from define_fairseq.modules.group_linear import _group_linear_reference


class LoopGroupLinear(nn.Module):
    """The straightforward alternative: one ``nn.Linear`` per group on ``chunk``s of the input, then ``cat``."""

    def __init__(self, in_features: int, out_features: int, groups: int):
        super().__init__()
        self.groups = groups
        self.linears = nn.ModuleList(nn.Linear(in_features // groups, out_features // groups) for _ in range(groups))

    def forward(self, x):
        return torch.cat([lin(c) for lin, c in zip(self.linears, x.chunk(self.groups, dim=-1))], dim=-1)


class PlainGroupLinear(GroupLinear):
    """GroupLinear's previous forward: the plain autograd ``baddbmm`` formulation, with transposing copies."""

    def forward(self, x):
        if self.groups == 1:
            return super().forward(x)
        return _group_linear_reference(x, self.weight, self.bias)


def shapes():
    base = [tuple(s) + ("transformer_define layer %d" % (i + 1),)
            for i, s in enumerate(define_layer_sizes(128, 1024, 512, 3, 4))]
    return base + [(1024, 2048, 4, "1024 -> 2048, 4 groups")]


def bench_shape(in_f, out_f, groups, tokens, rounds):
    torch.manual_seed(0)
    modules = {
        "GroupLinear": GroupLinear(in_f, out_f, groups),
        "plain": PlainGroupLinear(in_f, out_f, groups),
        "loop": LoopGroupLinear(in_f, out_f, groups),
        "dense": nn.Linear(in_f, out_f),
    }
    x = torch.randn(tokens, in_f, requires_grad=True)
    grad = torch.randn(tokens, out_f)

    def step(module):
        def run():
            module(x).backward(grad)
        return run

    def zero(name):
        x.grad = None
        modules[name].zero_grad(set_to_none=True)

    times = interleaved({name: step(m) for name, m in modules.items()}, rounds=rounds, warmup=2, before=zero)
    return {name: median(t) * 1e3 for name, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192, help="rows of the input (tokens)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per shape (median reported)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    set_threads(args.threads)

    rows, checks = [], []
    for in_f, out_f, groups, label in shapes():
        ms = bench_shape(in_f, out_f, groups, args.tokens, args.rounds)
        vs_loop = ms["loop"] / ms["GroupLinear"]
        vs_dense = ms["dense"] / ms["GroupLinear"]
        rows.append([label, f"{in_f} -> {out_f}", groups, f"{ms['GroupLinear']:.1f}", f"{ms['plain']:.1f}",
                     f"{ms['loop']:.1f}", f"{ms['dense']:.1f}", f"{ms['plain'] / ms['GroupLinear']:.2f}x",
                     f"{vs_loop:.2f}x", f"{vs_dense:.2f}x"])
        checks.append((f"GroupLinear no slower than the loop at {in_f} -> {out_f}, g={groups}: loop/GroupLinear = "
                       f"{vs_loop:.2f}", vs_loop >= 1.0))
        if (in_f, out_f, groups) == (1024, 2048, 4):
            checks.append((f"GroupLinear >= 2.5x faster than dense at 1024 -> 2048, g=4, {args.tokens} tokens: "
                           f"dense/GroupLinear = {vs_dense:.2f}", vs_dense >= 2.5))
        print(rows[-1], flush=True)

    text = header("GroupLinear forward + backward", "benchmarks.group_linear",
                  [f"{args.tokens} tokens, float32, input requires grad; {args.rounds} interleaved rounds per shape "
                   f"after 2 warm-up rounds",
                   "GroupLinear = define_fairseq.modules.GroupLinear (bmm writing into strided views of the output, "
                   "custom autograd Function); plain = GroupLinear's previous forward (baddbmm on the transposed "
                   "input, then a transposing copy to [N, out]; plain autograd); loop = a ModuleList of nn.Linear, "
                   "one per group, on x.chunk(groups), then torch.cat; dense = nn.Linear(in, out); with 1 group "
                   "GroupLinear and plain are F.linear and the loop is one nn.Linear plus the copy torch.cat makes"])
    text += "\n" + table(["shape", "in -> out", "groups", "GroupLinear ms", "plain ms", "loop ms", "dense ms",
                          "plain / GroupLinear", "loop / GroupLinear", "dense / GroupLinear"], rows)
    text += "\nRatios above 1 mean GroupLinear is faster.\n\n## Targets\n\n"
    text += "".join(f"- {'PASS' if ok else 'FAIL'}: {what}\n" for what, ok in checks)
    write_result("group_linear", text)


if __name__ == "__main__":
    main()
