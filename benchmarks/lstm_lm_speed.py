"""Training and scoring speed of the LSTM language models, each comparison timed interleaved: (1) Table 1a R3
(``lstm_lm_define_wt103_n3``) against R2 (``lstm_lm_adaptive_wt103``), V = 267,735, batch 60 x BPTT 140; (2)
``lstm_lm_define`` (a fused ``nn.LSTM`` per layer) against fairseq's ``lstm_lm`` (a loop of ``nn.LSTMCell``), the same
network at AWD-LSTM's PTB size and with a DeFINE unit, training at batch 20 and scoring at batch 10 and 1, beside
its 3 LSTM layers alone and the step's matrix products at the peak rate (a floor). A training step: forward, loss,
backward, clipping (0.25), SGD. Targets: R3's step at most 1.1x R2's; >= 3x fairseq's tokens/s on a CPU, >= 5x on a
GPU; in scoring, within 5% of the tokens/s of its LSTM layers alone.
"""

import copy

import torch

from benchmarks.common import ADAPTIVE_LM, Bench, count_params, lm_sample, options, run_main
from benchmarks.targets import millions, ms, ratio, table

FAIRSEQ, SAME = "fairseq `lstm_lm`", "`lstm_lm_define`, no DeFINE (same network)"
ALONE = "*its 3 LSTM layers alone (fused nn.LSTM, on a fixed input)*"
SIZE = "--decoder-embed-dim 400 --decoder-hidden-size 1150 --decoder-layers 3 --dropout 0.4 "
SIZE += "--share-decoder-input-output-embed"
VARIANTS = {  # at the PTB size: name -> (arch, flags)
    FAIRSEQ: ("lstm_lm", (SIZE + " --decoder-out-embed-dim 400").split()),
    SAME: ("lstm_lm_define", (SIZE + " --decoder-output-dim 1150 --define-n 400 --input-layer table").split()),
    "`lstm_lm_define`, DeFINE n=128, N=7, k=1024 (m=400)": (
        "lstm_lm_define",
        (SIZE + " --decoder-output-dim 1150 --define-n 128 --define-depth 7 --define-k 1024").split(),
    ),
}
COLUMNS = "regime | model | parameters | ms per batch (median) | tokens/s | vs lstm_lm (ratio of medians) | "
COLUMNS += "vs lstm_lm (median of per-round ratios) | matrix-product GFLOP/s"


def layers_alone(bench: Bench, stack, batch: int, bptt: int, training: bool):
    """A copy of ``stack`` (an ``LSTMStack``) on a fixed input from a zero state: forward and backward (the input
    needs a gradient, as an embedding's output does) when ``training``, else forward without autograd. A step of a
    model built on these layers cannot take less time."""
    stack = bench.to(copy.deepcopy(stack)).train(training)
    x = torch.randn(batch, bptt, stack.input_size, device=bench.device, requires_grad=training)

    def run():
        with torch.set_grad_enabled(training), bench.autocast():
            out, _ = stack(x)
        if training:
            stack.zero_grad(set_to_none=True)
            x.grad = None
            out.float().sum().backward()

    return run


def step_flops(layers, proj, vocab: int, batch: int, bptt: int, training: bool) -> int:
    """FLOPs of the matrix products of one step: per layer ``(input, hidden)`` the input product over all N = batch x
    BPTT tokens and BPTT recurrent products; the projection ``proj = (in, out)`` (or None) and the ``out x vocab``
    output layer. Training does each product twice more (the input and the weight gradients)."""
    n = batch * bptt
    products = [(n, inp, 4 * h) for inp, h in layers] + [(n, h, 4 * h) for _, h in layers]
    fan_in = layers[-1][1] if proj is None else proj[1]
    products += ([(n, *proj)] if proj is not None else []) + [(n, fan_in, vocab)]
    return (3 if training else 1) * sum(2 * m * k * o for m, k, o in products)


def wt103(bench: Bench):
    """Table 1a's R3 against R2: (section, check)."""
    vocab, batch, bptt = (3000, 2, 8) if bench.args.quick else (267735, 60, 140)
    small = ["--adaptive-input-cutoff", "500,1000,2000", "--adaptive-softmax-cutoff", "500,1000,2000"]
    archs = {a: (a, small if bench.args.quick else []) for a in ("lstm_lm_adaptive_wt103", "lstm_lm_define_wt103_n3")}
    models = {a: (m, c) for a, (_, _, m, c) in bench.build(vocab, ADAPTIVE_LM, archs).items()}
    sample = bench.to(lm_sample(vocab, batch, bptt))
    sgd = {a: torch.optim.SGD(m.parameters(), lr=0.1) for a, (m, _) in models.items()}
    t = bench.time({a: bench.step(m.train(), c, sample, sgd[a], clip=0.25) for a, (m, c) in models.items()})
    params = {a: millions(count_params(m)) for a, (m, _) in models.items()}
    rows = [[f"`{a}`", params[a], t.ms(a), t.min_ms(a), t.per_s(a, batch * bptt)] for a in models]
    section = (
        f"## 1. Table 1a R3 vs R2 (V={vocab:,}, batch {batch} x BPTT {bptt})\n\n"
        + table("arch | parameters | step ms (median) | step ms (min) | tokens/s", rows)
        + "\nPaper (GTX 1080 Ti): R2 297 ms/batch, R3 298 ms/batch (1.00x).\n"
    )
    return section, bench.check("R3 step time over R2's", 1 / t.speedup(*models), 1.1, at_most=True)


def main(argv=None):
    parser = options(__doc__, rounds=3)
    parser.add_argument("--skip-wt103", action="store_true", help="only the comparison with fairseq's lstm_lm")
    bench = Bench("benchmarks.lstm_lm_speed", parser, argv)
    quick = bench.args.quick
    first = [] if bench.args.skip_wt103 else [wt103(bench)]  # (section, check)
    sections, checks = [section for section, _ in first], [check for _, check in first]
    vocab, bptt = (500, 8) if quick else (10000, 70)
    models = {n: (m, c) for n, (_, _, m, c) in bench.build(vocab, ["--task", "language_modeling"], VARIANTS).items()}
    decoder = models[SAME][0].decoder
    layers = [(layer.lstm.input_size, layer.lstm.hidden_size) for layer in decoder.lstm.layers]
    proj = decoder.project_out_dim
    proj = None if proj is None else (proj.in_features, proj.out_features)
    peak, rows = bench.peak_flops(), []
    scoring = "scoring (eval mode, no grad)"
    for kind, nominal, training in (("training", 20, True), (scoring, 10, False), (scoring, 1, False)):
        batch = 2 if quick else nominal
        label = f"{kind}, batch {batch}"
        sample = bench.to(lm_sample(vocab, batch, bptt))
        fns = {}
        for n, (m, c) in models.items():
            optimizer = torch.optim.SGD(m.parameters(), lr=0.1) if training else None
            fns[n] = bench.step(m.train(training), c, sample, optimizer, clip=0.25)
        fns[ALONE] = layers_alone(bench, decoder.lstm, batch, bptt, training)
        t = bench.time(fns, rounds=bench.args.rounds + 2)
        flops = step_flops(layers, proj, vocab, batch, bptt, training)
        for n in fns:
            params = millions(count_params(models[n][0])) if n in models else ""
            cells = [label if n == FAIRSEQ else "", n, params, t.ms(n), t.per_s(n, batch * bptt)]
            rows.append(cells + [ratio(t.speedup(FAIRSEQ, n)), ratio(t.paired(FAIRSEQ, n)), t.per_s(n, flops / 1e9)])
        floor = f"*the products' arithmetic ({flops / 1e9:.1f} GFLOP) at the peak rate: a floor*"
        cells = ["", floor, "", ms(flops / peak), f"{batch * bptt * peak / flops:.0f}"]
        rows.append(cells + [ratio(t.median(FAIRSEQ) * peak / flops), "", f"{peak / 1e9:.0f}"])
        what = f"lstm_lm_define vs fairseq's lstm_lm, same network, {label}: tokens/s"
        checks.append(bench.check(what, t.speedup(FAIRSEQ, SAME), 5.0 if bench.cuda else 3.0))
        if not training:
            what = f"lstm_lm_define (same network) vs its 3 LSTM layers alone, {label}: tokens/s"
            batch_text = f"{batch} x {bptt} tokens"
            checks.append(bench.check(what, t.speedup(ALONE, SAME), 0.95, f"lstm_scoring_b{nominal}", batch=batch_text))
    sections.append(
        f"## 2. lstm_lm_define vs fairseq's lstm_lm (V={vocab:,}, embedding 400, 3 layers of 1150, tied; "
        f"BPTT {bptt})\n\n"
        + table(COLUMNS, rows)
        + "\nThe layers alone and the floor bound what any implementation of the network can gain "
        "(benchmarks/README.md).\n"
    )
    notes = [
        "Step: forward, loss, backward, clip_grad_norm_(0.25), torch.optim.SGD; one fixed batch of "
        "Zipf-distributed tokens; models built by fairseq's parser from the registered archs"
    ]
    return bench.finish("Speed of the LSTM language models", notes, "\n".join(sections), checks)


if __name__ == "__main__":
    run_main(main)
