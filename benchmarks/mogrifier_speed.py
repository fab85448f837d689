"""Mogrifier LSTM, forward + backward of the recurrent stack alone at the paper's PTB shape (2 layers, 1000 -> 1000,
batch 64 x BPTT 70, r=5, k=84, no dropout): ``MogrifierLSTM`` (its fast path), its ``reference_forward``, full rank,
``nn.LSTM`` and a straightforward module (``nn.LSTMCell``, full-rank ``nn.Linear`` rounds); ``--compile`` (default on
a GPU): ``torch.compile`` of the reference step; on a GPU: the fast path as CUDA graphs; ``--triton``: the Triton step
(on a CPU under ``TRITON_INTERPRET=1``, with ``--quick``). Then the stack that fairseq-train builds for
``mogrifier_lstm_lm_ptb``, on each of its paths, beside ``nn.LSTM`` (benchmarks/README.md). Targets: ``MogrifierLSTM``
>= 0.5x the tokens/s of ``nn.LSTM`` (on a GPU: the model's default path) and >= 2x the straightforward module's.
"""

import argparse
import copy
import time

import torch
import torch.nn as nn

from benchmarks.common import Bench, build_model, count_params, options, run_main
from benchmarks.targets import millions, ratio, table
from define_fairseq.modules import MogrifierLSTM
from define_fairseq.modules.mogrifier import threads as recurrence_threads
from define_fairseq.modules.mogrifier.layer import MogrifierLSTMLayer


class Straightforward(nn.Module):
    """The Mogrifier LSTM as common PyTorch copies write it: ``nn.LSTMCell`` per layer, one full-rank ``nn.Linear``
    per round, a Python loop over time steps and rounds. Shapes: ``x [B, T, C] -> [B, T, H]``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int, rounds: int):
        super().__init__()
        sizes = [input_size] + [hidden_size] * (num_layers - 1)
        self.cells = nn.ModuleList(nn.LSTMCell(m, hidden_size) for m in sizes)
        self.maps = nn.ModuleList(
            nn.ModuleList(nn.Linear(hidden_size, m) if i % 2 == 0 else nn.Linear(m, hidden_size) for i in range(rounds))
            for m in sizes
        )

    def forward(self, x):
        for cell, maps in zip(self.cells, self.maps):
            h = c = x.new_zeros(x.shape[0], cell.hidden_size)
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


class Output(nn.Module):
    """The output tensor alone (the first item of what ``module.<method>(x)`` returns). Shapes: as ``module``."""

    def __init__(self, module: nn.Module, method: str = "forward"):
        super().__init__()
        self.module, self.method = module, method

    def forward(self, x):
        return getattr(self.module, self.method)(x)[0]


class LayerSteps(nn.Module):
    """A ``MogrifierLSTM``'s layers, each run from zero states through ``run_layer(layer, y [T, B, C], h0, c0) -> (y,
    (h, c))`` (default: the Triton step, autograd through each step's kernels and GEMMs). Shapes: ``x [B, T, C] ->
    [B, T, H]``."""

    def __init__(self, model: MogrifierLSTM, run_layer=None):
        super().__init__()
        if run_layer is None:
            from define_fairseq.modules.mogrifier import triton_step  # needs Triton: imported only for this variant

            run_layer = triton_step.triton_mogrifier_layer
        self.model, self.run_layer = model, run_layer

    def forward(self, x):
        y = x.transpose(0, 1).contiguous()
        for layer in self.model.layers:
            h = y.new_zeros(y.shape[1], layer.hidden_size)
            y, _ = self.run_layer(layer, y, h, h)
        return y.transpose(0, 1)


def compiled_layer():
    """A ``run_layer`` of :class:`LayerSteps`: ``torch.compile`` of ``reference_step``, step by step (autograd through
    the compiled step)."""
    step = torch.compile(MogrifierLSTMLayer.reference_step, dynamic=False)

    def run_layer(layer, y, h, c):
        # a state that requires grad from the first step: every call has the same guards, one compiled graph
        h, c = torch.zeros_like(h, requires_grad=True), torch.zeros_like(c, requires_grad=True)
        outputs = []
        for t in range(y.shape[0]):
            h, c = step(layer, y[t], h, c)
            outputs.append(h)
        return torch.stack(outputs), (h, c)

    return run_layer


def main(argv=None):
    parser = options(__doc__, rounds=3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1000, help="input and hidden size")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--bptt", type=int, default=70)
    parser.add_argument("--mog-rounds", type=int, default=5, help="mogrifier rounds r")
    parser.add_argument("--rank", type=int, default=84)
    compiled = "also torch.compile of the reference step (default: on a GPU only)"
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, help=compiled)
    parser.add_argument("--triton", action="store_true", help="also the Triton step (modules/mogrifier/triton_step.py)")
    bench = Bench("benchmarks.mogrifier_speed", parser, argv)
    args = bench.args
    H, B, T, k = (32, 4, 5, 8) if args.quick else (args.hidden, args.batch, args.bptt, args.rank)
    L, r = args.layers, args.mog_rounds

    def place(module):
        return module.to(bench.device, bench.dtype).train()

    def mogrifier(rank):
        torch.manual_seed(1)
        return place(MogrifierLSTM(H, H, num_layers=L, rounds=r, rank=rank))

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, H, generator=gen).to(bench.device, bench.dtype).requires_grad_()
    grad = torch.randn(B, T, H, generator=gen).to(bench.device, bench.dtype)
    fast = mogrifier(k)
    names = {
        "fast": f"`MogrifierLSTM` r={r}, k={k}",
        "reference": f"`MogrifierLSTM` r={r}, k={k}, `reference_forward`",
        "full": f"`MogrifierLSTM` r={r}, full rank",
        "lstm": "`nn.LSTM`",
        "naive": f"straightforward: `nn.Linear` rounds (full rank, r={r}) + `nn.LSTMCell`",
        "compile": "`torch.compile` of `MogrifierLSTMLayer.reference_step`, step by step",
        "graph": "`MogrifierLSTM` fast path as CUDA graphs (`make_graphed_callables`)",
        "triton": "Triton step (`mogrifier.triton_step.triton_mogrifier_layer`), step by step",
    }
    makers = {
        "fast": lambda: Output(fast),
        "reference": lambda: Output(fast, "reference_forward"),
        "full": lambda: Output(mogrifier(0)),
        "lstm": lambda: place(Output(nn.LSTM(H, H, L, batch_first=True))),
        "naive": lambda: place(Straightforward(H, H, L, r)),
    }
    if args.compile if args.compile is not None else bench.cuda:
        makers["compile"] = lambda: LayerSteps(fast, compiled_layer())
    if args.triton:
        makers["triton"] = lambda: LayerSteps(fast)
    if bench.cuda:
        makers["graph"] = lambda: torch.cuda.make_graphed_callables(Output(copy.deepcopy(fast)), (x,))
    variants, errors, first_call = {}, {}, {}
    reference = Output(fast)(x).detach().float()
    tolerance = 1e-4 if bench.dtype == torch.float32 else 0.1
    for key, make in makers.items():
        try:
            start = time.perf_counter()
            variants[key] = module = make()
            if key in ("reference", "compile", "graph", "triton"):  # the same function as the fast path
                torch.testing.assert_close(module(x).detach().float(), reference, atol=tolerance, rtol=tolerance)
            first_call[key] = time.perf_counter() - start
        except Exception as error:  # reported in the table; the other variants are still measured
            errors[key] = bench.error(error)
            variants.pop(key, None)

    def clear(key):
        x.grad = None
        variants[key].zero_grad(set_to_none=True)

    t = bench.time({key: (lambda m=m: m(x).backward(grad)) for key, m in variants.items()}, before=clear)
    t.errors.update(errors)
    rows = []
    for key in makers:
        params = millions(count_params(variants[key])) if key in variants else ""
        rows.append([names[key], params, t.ms(key), t.min_ms(key), t.per_s(key, B * T), ratio(t.speedup("fast", key))])
    notes = [
        f"{L} layer(s), input {H}, hidden {H}, batch {B}, BPTT {T} ({B * T} tokens per call), rounds {r}, rank "
        f"{k}, capped input gate; no dropout; input requires grad; outputs of the reference path, the compiled "
        f"steps, the CUDA graphs and the Triton step checked against the fast path's (within {tolerance:g})"
    ]
    if "compile" in first_call:
        notes.append(
            f"torch.compile: building the module and its first call (compilation) took {first_call['compile']:.0f} s"
        )
    if not bench.cuda:
        one = "yes" if recurrence_threads.small_work_on_one_thread() else "no"
        notes.append(
            f"MogrifierLSTM's small per-step work on one thread: {one} (only under OMP_WAIT_POLICY=PASSIVE; see "
            "define_fairseq/modules/mogrifier/threads.py)"
        )
    columns = "variant | parameters | ms per call (median) | ms (min) | tokens/s | speed vs `MogrifierLSTM`"
    body = table(columns, rows)
    body += "\n\"speed vs\": the variant's tokens/s relative to `MogrifierLSTM`'s fast path; below 1 means slower.\n"
    vs_lstm = [key for key in ("fast", "compile", "graph") if key in makers]
    checks = [bench.check(f"{names[key]} vs `nn.LSTM`, tokens/s", t.speedup("lstm", key), 0.5) for key in vs_lstm]
    what = "`MogrifierLSTM` vs the straightforward module, tokens/s"
    checks.append(bench.check(what, t.speedup("naive", "fast"), 2.0))
    model_body, model_notes, model_checks = model_stack(bench, x.new_empty(0))
    title = "Mogrifier LSTM: forward + backward speed"
    return bench.finish(title, notes + model_notes, body + model_body, checks + model_checks)


def ptb_stack(bench: Bench, vocab: int, hidden=None, rank=None):
    """The ``mogrifier_lstm_lm_ptb`` stack as fairseq-train builds it (its size unless ``hidden``, ``rank``), on the
    device in float32."""
    size = [] if hidden is None else ["--mogrifier-hidden-size", str(hidden), "--mogrifier-rank", str(rank)]
    task = ["--task", "language_modeling", "--criterion", "lm_regularized_loss"]
    return build_model("mogrifier_lstm_lm_ptb", vocab, task, size)[2].decoder.lstm.to(bench.device).train()


def model_stack(bench: Bench, like: torch.Tensor):
    """The ``mogrifier_lstm_lm_ptb`` stack as fairseq-train builds it, per path, beside ``nn.LSTM``: (table, notes,
    checks)."""
    B, T, V = (4, 5, 100) if bench.args.quick else (64, 70, 10_000)
    lstm = ptb_stack(bench, V, 32 if bench.args.quick else None, 8 if bench.args.quick else None).to(bench.dtype)
    H, L = lstm.hidden_size, lstm.num_layers
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(B, T, H, generator=gen).to(like).requires_grad_()
    grad = torch.randn(B, T, H, generator=gen).to(like)
    cudnn = nn.LSTM(H, H, L, batch_first=True).to(bench.device, bench.dtype).train()

    def path(kernels: str, graphs: bool):
        def run():
            for layer in lstm.layers:
                layer.kernels = kernels
            lstm.cuda_graphs = graphs
            lstm(x)[0].backward(grad)

        return run

    names = {"lstm": "`nn.LSTM` (cuDNN on a GPU)", "torch": "`kernels='torch'`: the torch fast path, eager"}
    fns = {"lstm": lambda: cudnn(x)[0].backward(grad), "torch": path("torch", False)}
    if bench.cuda:
        names["graphs"] = "default on a GPU: fused Triton kernels, CUDA graphs"
        names["fused"] = "fused Triton kernels, eager (`--mogrifier-no-cuda-graphs`)"
        fns["graphs"], fns["fused"] = path("auto", True), path("auto", False)

    def clear(key):
        x.grad = None
        lstm.zero_grad(set_to_none=True)
        cudnn.zero_grad(set_to_none=True)

    t = bench.time(fns, before=clear)
    rows = [[names[k], t.ms(k), t.min_ms(k), t.per_s(k, B * T), ratio(t.speedup("lstm", k))] for k in fns]
    columns = "`mogrifier_lstm_lm_ptb` stack | ms per call (median) | ms (min) | tokens/s | vs `nn.LSTM`"
    notes = [
        f"the `mogrifier_lstm_lm_ptb` stack as fairseq-train builds it: {L} layers, hidden {H}, rounds "
        f"{lstm.rounds}, rank {lstm.rank}, its dropouts (masks drawn inside, per step), batch {B}, BPTT {T}, from "
        f"zero states; `nn.LSTM` {L} x {H} beside it"
    ]
    best = "graphs" if bench.cuda else "torch"
    what = f"`mogrifier_lstm_lm_ptb` stack ({names[best]}) vs `nn.LSTM`, tokens/s"
    return "\n" + table(columns, rows), notes, [bench.check(what, t.speedup("lstm", best), 0.5)]


if __name__ == "__main__":
    run_main(main)
