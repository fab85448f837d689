"""GroupLinear forward + backward against a per-group loop of nn.Linear and a dense nn.Linear.

Shapes: the three layers of the base ``transformer_define``'s DeFINE unit (n=128, k=1024, m=512, depth 3, 4 groups
at most) and 1024 -> 2048 with 4 groups. The input requires grad, as inside DeFINE. Targets: GroupLinear no slower
than the loop at every shape; at least 2.5x faster than dense at 1024 -> 2048, 4 groups, 8192 tokens.

    .venv/bin/python -m benchmarks.group_linear [--device cuda] [--tokens 8192] [--rounds 15]
"""

import torch
import torch.nn as nn

from benchmarks.common import Bench, Check, options, ratio, run_main, table
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
    """GroupLinear's plain autograd formulation (``baddbmm`` on the transposed input, then a transposing copy)."""

    def forward(self, x):
        return super().forward(x) if self.groups == 1 else _group_linear_reference(x, self.weight, self.bias)


def main(argv=None):
    parser = options(__doc__, rounds=15, warmup=2, fp16=True)
    parser.add_argument("--tokens", type=int, default=8192, help="rows of the input")
    bench = Bench("benchmarks.group_linear", parser, argv)
    tokens = 64 if bench.args.quick else bench.args.tokens
    shapes = [(*s, f"transformer_define layer {i + 1}") for i, s in enumerate(define_layer_sizes(128, 1024, 512, 3, 4))]
    rows, checks = [], []
    for in_f, out_f, groups, label in shapes + [(1024, 2048, 4, "1024 -> 2048, 4 groups")]:
        torch.manual_seed(0)
        modules = {
            "GroupLinear": GroupLinear(in_f, out_f, groups),
            "plain": PlainGroupLinear(in_f, out_f, groups),
            "loop": LoopGroupLinear(in_f, out_f, groups),
            "dense": nn.Linear(in_f, out_f),
        }
        for m in modules.values():
            m.to(bench.device, bench.dtype)
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

        t = bench.time(
            {name: step(name) for name in modules}, before=None if bench.cuda else zero, repeat=20 if bench.cuda else 1
        )
        rows.append(
            [label, f"{in_f} -> {out_f}", groups]
            + [t.ms(n) for n in modules]
            + [ratio(t.speedup(n, "GroupLinear")) for n in ("plain", "loop", "dense")]
        )
        checks.append(
            Check(f"GroupLinear vs the loop at {in_f} -> {out_f}, g={groups}", t.speedup("loop", "GroupLinear"), 1.0)
        )
        if (in_f, out_f, groups) == (1024, 2048, 4):
            checks.append(
                Check(
                    f"GroupLinear vs dense at 1024 -> 2048, g=4, {tokens} tokens",
                    t.speedup("dense", "GroupLinear"),
                    1.5,
                )
            )
    notes = [
        f"{tokens} tokens, input requires grad; on a GPU each timing is 20 calls in a row; plain = GroupLinear's "
        f"autograd formulation, loop = one nn.Linear per group, dense = nn.Linear (benchmarks/README.md)"
    ]
    body = table(
        [
            "shape",
            "in -> out",
            "groups",
            "GroupLinear ms",
            "plain ms",
            "loop ms",
            "dense ms",
            "plain / GroupLinear",
            "loop / GroupLinear",
            "dense / GroupLinear",
        ],
        rows,
    )
    body += "\nRatios above 1 mean GroupLinear is faster.\n"
    return bench.finish("GroupLinear forward + backward", notes, body, checks)


if __name__ == "__main__":
    run_main(main)
