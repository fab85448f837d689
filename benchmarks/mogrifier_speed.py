"""Mogrifier LSTM training speed on CPU: forward plus backward of the recurrent stack alone.

Shape: the paper's PTB setting, 2 layers (``--layers``), hidden size 1000 (input 1000), batch 64, BPTT 70, rounds 5,
rank 84. One call: forward of a fixed ``[64, 70, 1000]`` input (requires grad, like an embedding output) from a
zero state, then backward of a fixed random output gradient, gradients cleared between calls (untimed). No
dropout. Variants:

* ``MogrifierLSTM`` (``define_fairseq.modules.MogrifierLSTM``, r=5, k=84, capped input gate): its fast path;
* the same module's ``reference_forward`` (per step, per round, plain autograd);
* ``MogrifierLSTM`` with full-rank Q/R (r=5, k=0): the fast path at the naive module's size;
* ``nn.LSTM`` of the same size (fused kernel, no mogrifier rounds);
* a straightforward module written below, as the common PyTorch copies do it: per layer an ``nn.LSTMCell`` and a
  ``ModuleList`` of full-rank ``nn.Linear`` (one per round), a Python loop over time steps and rounds.

Targets: ``MogrifierLSTM`` at least 0.5x the tokens/s of ``nn.LSTM``, at least 2x the tokens/s of the
straightforward module. ``--alternatives`` adds a second table (1 layer) with the other ways of running the same
recurrence that were measured before choosing the fast path: the same per-step computation with plain autograd
(eager), as a TorchScript function, and (``--compile``) with ``torch.compile`` on the step function (all three on
torch's threads throughout; ``torch.compile`` compiles for about half a minute on the first call).

    .venv/bin/python -m benchmarks.mogrifier_speed [--layers 2] [--rounds 3] [--threads 2] [--alternatives]

About 2 minutes on an idle 2-core machine (2.5 with ``--alternatives``).
"""

import argparse
import sys
import time
from typing import List, Tuple

import torch
import torch.nn as nn
from torch import Tensor

from benchmarks.common import header, interleaved, median, paired_ratio, set_threads, table, write_result
from define_fairseq.modules import MogrifierLSTM, mogrifier_recurrence


class NaiveMogrifierLSTM(nn.Module):
    """The straightforward Mogrifier LSTM: ``nn.LSTMCell`` per layer, one full-rank ``nn.Linear`` per round."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int, rounds: int):
        super().__init__()
        self.cells = nn.ModuleList()
        self.maps = nn.ModuleList()
        for k in range(num_layers):
            m = input_size if k == 0 else hidden_size
            self.cells.append(nn.LSTMCell(m, hidden_size))
            self.maps.append(nn.ModuleList(nn.Linear(hidden_size, m) if i % 2 == 0 else nn.Linear(m, hidden_size)
                                           for i in range(rounds)))
        self.hidden_size = hidden_size

    def forward(self, x):  # x [B, T, C] -> [B, T, H]
        for cell, maps in zip(self.cells, self.maps):
            h = x.new_zeros(x.shape[0], self.hidden_size)
            c = x.new_zeros(x.shape[0], self.hidden_size)
            outputs = []
            for t in range(x.shape[1]):
                xt = x[:, t]
                for i, linear in enumerate(maps):
                    if i % 2 == 0:
                        xt = 2 * torch.sigmoid(linear(h)) * xt
                    else:
                        h = 2 * torch.sigmoid(linear(xt)) * h
                h, c = cell(xt, (h, c))
                outputs.append(h)
            x = torch.stack(outputs, 1)
        return x


class LSTMStackBaseline(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


class MogrifierVariant(nn.Module):
    def __init__(self, model: MogrifierLSTM, reference: bool = False):
        super().__init__()
        self.model = model
        self.reference = reference

    def forward(self, x):
        return (self.model.reference_forward(x) if self.reference else self.model(x))[0]


# -- the alternatives to the hand-written backward (one layer, low rank, capped input gate) --------------------


def recurrence(x: Tensor, h: Tensor, c: Tensor, weight: Tensor, bias: Tensor, lefts: List[Tensor],
               rights: List[Tensor], biases: List[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """The fast path's per-step computation, written with ordinary autograd operations: x [T, B, m] -> y."""
    outputs: List[Tensor] = []
    n = h.shape[1]
    weight_t = weight.t()
    for t in range(x.shape[0]):
        xv = x[t]
        hv = h
        for i in range(len(lefts)):
            if i % 2 == 0:
                xv = 2.0 * torch.sigmoid(torch.addmm(biases[i], torch.mm(hv, rights[i].t()), lefts[i].t())) * xv
            else:
                hv = 2.0 * torch.sigmoid(torch.addmm(biases[i], torch.mm(xv, rights[i].t()), lefts[i].t())) * hv
        gates = torch.addmm(bias, torch.cat([xv, hv], 1), weight_t)
        i_gate = torch.sigmoid(gates[:, :n])
        f_gate = torch.sigmoid(gates[:, n: 2 * n])
        j = torch.tanh(gates[:, 2 * n: 3 * n])
        o_gate = torch.sigmoid(gates[:, 3 * n:])
        c = f_gate * c + torch.minimum(i_gate, 1.0 - f_gate) * j
        h = o_gate * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs), h, c


def step(xv: Tensor, h: Tensor, c: Tensor, weight_t: Tensor, bias: Tensor, lefts: List[Tensor],
         rights: List[Tensor], biases: List[Tensor]) -> Tuple[Tensor, Tensor]:
    n = h.shape[1]
    hv = h
    for i in range(len(lefts)):
        if i % 2 == 0:
            xv = 2.0 * torch.sigmoid(torch.addmm(biases[i], torch.mm(hv, rights[i].t()), lefts[i].t())) * xv
        else:
            hv = 2.0 * torch.sigmoid(torch.addmm(biases[i], torch.mm(xv, rights[i].t()), lefts[i].t())) * hv
    gates = torch.addmm(bias, torch.cat([xv, hv], 1), weight_t)
    i_gate = torch.sigmoid(gates[:, :n])
    f_gate = torch.sigmoid(gates[:, n: 2 * n])
    j = torch.tanh(gates[:, 2 * n: 3 * n])
    o_gate = torch.sigmoid(gates[:, 3 * n:])
    c = f_gate * c + torch.minimum(i_gate, 1.0 - f_gate) * j
    return o_gate * torch.tanh(c), c


class AlternativeLayer(nn.Module):
    """Runs layer 0 of a ``MogrifierLSTM`` (low rank) with one of the alternative implementations."""

    def __init__(self, model: MogrifierLSTM, how: str):
        super().__init__()
        self.model = model
        self.how = how
        if how == "script":
            self.fn = torch.jit.script(recurrence)
        elif how == "compile":
            self.compiled_step = torch.compile(step, dynamic=False)

    def forward(self, x):
        layer = self.model.layers[0]
        weight = torch.cat([layer.weight_ih, layer.weight_hh], 1)
        lefts = [mog.left for mog in layer.mogrifier]
        rights = [mog.right for mog in layer.mogrifier]
        biases = [mog.bias for mog in layer.mogrifier]
        xt = x.transpose(0, 1).contiguous()
        h = x.new_zeros(x.shape[0], layer.hidden_size)
        c = torch.zeros_like(h)
        if self.how == "compile":
            weight_t = weight.t()
            outputs = []
            for t in range(xt.shape[0]):
                h, c = self.compiled_step(xt[t], h, c, weight_t, layer.bias, lefts, rights, biases)
                outputs.append(h)
            y = torch.stack(outputs)
        else:
            fn = self.fn if self.how == "script" else recurrence
            y, _, _ = fn(xt, h, c, weight, layer.bias, lefts, rights, biases)
        return y.transpose(0, 1)


def time_variants(variants, x, rounds, warmup):
    grad = torch.randn(x.shape[0], x.shape[1], next(iter(variants.values())).hidden_out, generator=GEN)

    def call(module):
        def run():
            module(x).backward(grad)
        return run

    def clear(name):
        x.grad = None
        variants[name].zero_grad(set_to_none=True)

    return interleaved({name: call(m) for name, m in variants.items()}, rounds=rounds, warmup=warmup, before=clear,
                       log=True)


GEN = torch.Generator().manual_seed(0)


def count(module):
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def rows_for(variants, times, tokens, base):
    rows = []
    for name, module in variants.items():
        rows.append([name, f"{count(module) / 1e6:.2f} M", f"{median(times[name]) * 1e3:.0f}",
                     f"{min(times[name]) * 1e3:.0f}", f"{tokens / median(times[name]):.0f}",
                     f"{median(times[base]) / median(times[name]):.2f}x" if base in times else ""])
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--bptt", type=int, default=70)
    parser.add_argument("--mog-rounds", type=int, default=5, help="mogrifier rounds r")
    parser.add_argument("--rank", type=int, default=84)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median reported)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--alternatives", action="store_true",
                        help="also time the eager and TorchScript versions of the recurrence (1 layer)")
    parser.add_argument("--compile", action="store_true", help="with --alternatives: also torch.compile (slow)")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    H, L, r, k = args.hidden, args.layers, args.mog_rounds, args.rank
    tokens = args.batch * args.bptt
    x = torch.randn(args.batch, args.bptt, H, generator=GEN).requires_grad_(True)

    def mogrifier(rank, rounds=r, layers=L):
        torch.manual_seed(1)
        return MogrifierLSTM(H, H, num_layers=layers, rounds=rounds, rank=rank)

    fast = MogrifierVariant(mogrifier(k))
    variants = {
        f"`MogrifierLSTM` r={r}, k={k}": fast,
        f"`MogrifierLSTM` r={r}, k={k}, `reference_forward`": MogrifierVariant(fast.model, reference=True),
        f"`MogrifierLSTM` r={r}, full rank": MogrifierVariant(mogrifier(0)),
        "`nn.LSTM`": LSTMStackBaseline(H, H, L),
        f"straightforward: `nn.Linear` rounds (full rank, r={r}) + `nn.LSTMCell`": NaiveMogrifierLSTM(H, H, L, r),
    }
    for module in variants.values():
        module.hidden_out = H
        module.train()
    names = list(variants)
    fast_name, lstm_name, naive_name = names[0], names[3], names[4]
    times = time_variants(variants, x, args.rounds, args.warmup)
    rows = rows_for(variants, times, tokens, fast_name)
    vs_lstm = median(times[lstm_name]) / median(times[fast_name])
    vs_naive = median(times[naive_name]) / median(times[fast_name])
    checks = [
        (f"`MogrifierLSTM` tokens/s >= 0.5x `nn.LSTM`'s: {vs_lstm:.2f}x (ratio of medians; median of per-round "
         f"ratios {paired_ratio(times, lstm_name, fast_name):.2f}x)", vs_lstm >= 0.5),
        (f"`MogrifierLSTM` tokens/s >= 2x the straightforward module's: {vs_naive:.2f}x (ratio of medians; median "
         f"of per-round ratios {paired_ratio(times, naive_name, fast_name):.2f}x)", vs_naive >= 2.0),
    ]
    text = header("Mogrifier LSTM: forward + backward speed", "benchmarks.mogrifier_speed", [
        f"{L} layer(s), input {H}, hidden {H}, batch {args.batch}, BPTT {args.bptt} ({tokens} tokens per call), "
        f"rounds {r}, rank {k}, capped input gate (MogrifierLSTM); no dropout; input requires grad; "
        f"{args.rounds} interleaved rounds after {args.warmup} warm-up round(s)",
        f"MogrifierLSTM's small per-step work on one thread: "
        f"{'yes' if mogrifier_recurrence.small_work_on_one_thread() else 'no'} (only under "
        f"OMP_WAIT_POLICY=PASSIVE; see define_fairseq/modules/mogrifier_recurrence.py)",
    ])
    text += "\n" + table(["variant", "parameters", "ms per call (median)", "ms (min)", "tokens/s",
                          "speed vs `MogrifierLSTM`"], rows)
    text += ("\n\"speed vs\" is the variant's tokens/s relative to `MogrifierLSTM` (`MogrifierLSTM`'s time over the "
             "variant's): below 1 means slower.\n")

    if args.alternatives:
        alt_model = mogrifier(k, layers=1)
        alternatives = {
            "hand-written backward (`MogrifierLSTM`)": MogrifierVariant(alt_model),
            "eager, autograd": AlternativeLayer(alt_model, "eager"),
            "TorchScript (`torch.jit.script`), autograd": AlternativeLayer(alt_model, "script"),
        }
        if args.compile:
            start = time.perf_counter()
            alternatives["`torch.compile` step, autograd"] = AlternativeLayer(alt_model, "compile")
            alternatives["`torch.compile` step, autograd"].hidden_out = H
            alternatives["`torch.compile` step, autograd"](x).sum().backward()
            print(f"torch.compile: first call {time.perf_counter() - start:.0f} s", file=sys.stderr)
        with torch.no_grad():
            ref = alternatives["hand-written backward (`MogrifierLSTM`)"](x)
            for name, module in alternatives.items():
                torch.testing.assert_close(module(x), ref, atol=1e-4, rtol=1e-4, msg=name)
        for module in alternatives.values():
            module.hidden_out = H
        alt_times = time_variants(alternatives, x, args.rounds, args.warmup)
        first = next(iter(alternatives))
        text += (f"\n## Ways of running the same recurrence (1 layer, r={r}, k={k}; same outputs checked)\n\n"
                 + table(["implementation", "parameters", "ms per call (median)", "ms (min)", "tokens/s",
                          "speed vs hand-written backward"], rows_for(alternatives, alt_times, tokens, first)))

    text += "\n## Targets\n\n" + "".join(f"- {'PASS' if ok else 'FAIL'}: {what}\n" for what, ok in checks)
    write_result("mogrifier_speed", text)
    for what, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}: {what}")


if __name__ == "__main__":
    main()
