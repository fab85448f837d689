"""Training speed of the LSTM language models, CPU. Two comparisons, each timed interleaved in one run:

1. The DeFINE paper's Table 1a R3 (``lstm_lm_define_wt103_n3``: adaptive input -> DeFINE N=3 -> LSTM) against
   R2 (``lstm_lm_adaptive_wt103``: adaptive input -> LSTM) at the paper's size and batch: vocabulary 267,735,
   4 LSTM layers of 1024, batch 60 x BPTT 140, adaptive softmax (fairseq's ``adaptive_loss``), SGD. The paper
   reports 298 against 297 ms/batch on a GTX 1080 Ti. Target: R3 step time at most 1.1x R2's.
2. ``lstm_lm_define`` (one fused ``nn.LSTM`` call per layer) against fairseq's ``lstm_lm`` (a Python loop over
   time steps of ``nn.LSTMCell``) at the same size, AWD-LSTM's PTB size: vocabulary 10,000, embedding 400,
   3 layers of 1150, output projected to 400 and tied, BPTT 70, cross-entropy. ``lstm_lm_define`` runs with
   ``--define-depth 0`` (no DeFINE unit), so the two are the same network (fairseq's projection 1150 -> 400 has
   a bias, ours not); a third row puts DeFINE (n=128, N=7, k=1024) under the LSTM instead. Three regimes:
   training at batch 20, and scoring (eval mode, no autograd, as fairseq-eval-lm) at batch 10 and 1.
   Target: >= 3x the tokens/s of fairseq's ``lstm_lm``.

Every step: forward, loss, backward, gradient clipping (0.25), SGD step. Dropout as each arch sets it.

    .venv/bin/python -m benchmarks.lstm_lm_speed [--rounds 3] [--threads 2] [--skip-wt103]
"""

import argparse
import copy
import tempfile

import torch

from benchmarks.common import (add_allocator_option, enter_allocator, fastest_mm_seconds, header, interleaved, median,
                               paired_ratio, peak_gflops, result_name, set_threads, table, write_result)


def build_lm(arch: str, vocab: int, task_args, extra):
    """``(model, task, criterion)`` of ``--arch arch`` built as fairseq-train builds it, on a made-up dictionary
    of ``vocab`` symbols."""
    import define_fairseq  # noqa: F401
    from define_fairseq.tools.params import setup_from_train_args, write_dictionaries

    with tempfile.TemporaryDirectory() as data:
        write_dictionaries(data, vocab)
        cfg, task, model = setup_from_train_args([data, "--user-dir", "define_fairseq", "--arch", arch, *task_args,
                                                  *extra, "--optimizer", "sgd", "--lr", "0.1", "--cpu"])
        criterion = task.build_criterion(cfg.criterion)
    return model, task, criterion


def lm_batch(vocab: int, batch: int, bptt: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ranks = torch.arange(1, vocab - 4 + 1, dtype=torch.float64)
    probs = ranks.reciprocal() / ranks.reciprocal().sum()  # Zipf-like tokens
    stream = torch.multinomial(probs, batch * (bptt + 1), replacement=True, generator=g).view(batch, bptt + 1) + 4
    return {"id": torch.arange(batch), "nsentences": batch, "ntokens": batch * bptt,
            "net_input": {"src_tokens": stream[:, :-1].contiguous(), "src_lengths": torch.full((batch,), bptt)},
            "target": stream[:, 1:].contiguous()}


def train_steps(models, sample, rounds, warmup, extra=None):
    """Interleaved training steps of ``{name: (model, criterion)}``, and the callables of ``extra`` timed in the
    same rounds; returns seconds per call per name."""
    optimizers = {name: torch.optim.SGD(model.parameters(), lr=0.1) for name, (model, _) in models.items()}

    def step(name):
        model, criterion = models[name]
        opt = optimizers[name]

        def run():
            opt.zero_grad(set_to_none=True)
            loss, _, _ = criterion(model, sample)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            opt.step()
        return run

    for model, _ in models.values():
        model.train()
    return interleaved({**{name: step(name) for name in models}, **(extra or {})}, rounds=rounds, warmup=warmup,
                       log=True)


def score_steps(models, sample, rounds, warmup, extra=None):
    """Interleaved scoring passes (eval mode, no autograd: forward and loss) of ``{name: (model, criterion)}``, and
    the callables of ``extra`` timed in the same rounds."""
    def step(name):
        model, criterion = models[name]

        def run():
            with torch.no_grad():
                criterion(model, sample)
        return run

    for model, _ in models.values():
        model.eval()
    return interleaved({**{name: step(name) for name in models}, **(extra or {})}, rounds=rounds, warmup=warmup,
                       log=True)


def lstm_layers_alone(stack, batch: int, bptt: int, training: bool):
    """A callable running a copy of ``stack`` (an ``LSTMStack``: the model's fused ``nn.LSTM`` layers, with the
    dropout between them) on a fixed input ``[batch, bptt, input_size]`` from a zero state: forward and backward
    (the input needs a gradient, as an embedding's output does) when ``training``, else forward in eval mode
    without autograd. A step of a model built on these layers cannot take less time."""
    stack = copy.deepcopy(stack).train(training)
    x = torch.randn(batch, bptt, stack.input_size, requires_grad=training)

    def run():
        if training:
            stack.zero_grad(set_to_none=True)
            x.grad = None
            out, _ = stack(x)
            out.sum().backward()
        else:
            with torch.no_grad():
                stack(x)
    return run


SAME = "`lstm_lm_define`, no DeFINE (same network)"
ALONE = "its 3 LSTM layers alone (fused nn.LSTM, on a fixed input)"
ALONE_NOTE = (
    "The row *its 3 LSTM layers alone* times the `LSTMStack` of `lstm_lm_define` (one fused `nn.LSTM` per layer, "
    "which PyTorch runs with oneDNN's LSTM kernels on this CPU, and the dropout between layers) on a fixed input "
    "from a zero state, in the same rounds as the models: forward and backward when training (the input needs a "
    "gradient, as the embedding's output does), forward without autograd when scoring. Every step of "
    "`lstm_lm_define` does this work and more (embedding, projection, output layer, loss, clipping, SGD), so "
    "fairseq's time divided by it is the most `lstm_lm_define` could gain with PyTorch's LSTM kernels.")


PRODUCTS_NOTE = (
    "With N = batch x BPTT tokens, the forward pass needs per layer the input product [N, in] @ [in, 4h] (all time "
    "steps at once) and BPTT recurrent products [batch, h] @ [h, 4h], one after the other since each needs the "
    "previous step's output; then the projection and the tied output layer. Training adds per layer BPTT recurrent "
    "products back in time and the batched products for dW_hh, dW_ih and the input's gradient, and two products for "
    "each of the projection and the output layer. Their arithmetic is the same for every implementation of the "
    "network; nothing else (gates, softmax, dropout, clipping, the optimizer) is counted. At the machine's peak "
    "matrix-multiply rate (a 2048 x 2048 x 2048 product, the fastest of 5 runs in the same process; it moves by a "
    "few percent from run to run) that arithmetic gives a floor on the step time, and fairseq's step time divided "
    "by it estimates the most any implementation could gain here. The products are also timed one by one through "
    "torch.mm (the fastest of 5 "
    "runs, into a preallocated output), which shows where the time goes but is no bound: oneDNN's fused LSTM runs "
    "small recurrent products faster than separate torch.mm calls.")


def step_products(layers, proj, vocab: int, batch: int, bptt: int, training: bool, reps: int = 5):
    """The matrix products of one step of an LSTM LM (:data:`PRODUCTS_NOTE` lists them), each timed alone at its
    shape through ``torch.mm``.

    ``layers``: ``(input, hidden)`` of every LSTM layer; ``proj``: ``(in, out)`` of the projection before the
    tied output layer, or None; the output layer is ``out x vocab``; ``training``: forward only, or forward and
    backward. Returns ``[(label, seconds, flops)]``, each product's time the fastest of ``reps`` runs (after one
    untimed run) and ``flops = 2 * M * K * N * calls``.
    """
    n = batch * bptt
    parts = []

    def timed(label, a_shape, b_shape, calls=1):
        parts.append((label, fastest_mm_seconds(a_shape, b_shape, calls, reps),
                      2 * a_shape[0] * a_shape[1] * b_shape[1] * calls))

    for i, (inp, h) in enumerate(layers):
        timed(f"layer {i + 1} input product [{n}, {inp}] @ [{inp}, {4 * h}]", (n, inp), (inp, 4 * h))
        timed(f"layer {i + 1} recurrent products, {bptt} x [{batch}, {h}] @ [{h}, {4 * h}]", (batch, h), (h, 4 * h),
              calls=bptt)
        if training:
            timed(f"layer {i + 1} recurrent products back in time, {bptt} x [{batch}, {4 * h}] @ [{4 * h}, {h}]",
                  (batch, 4 * h), (4 * h, h), calls=bptt)
            timed(f"layer {i + 1} dW_hh [{h}, {n}] @ [{n}, {4 * h}]", (h, n), (n, 4 * h))
            timed(f"layer {i + 1} dW_ih [{inp}, {n}] @ [{n}, {4 * h}]", (inp, n), (n, 4 * h))
            timed(f"layer {i + 1} input gradient [{n}, {4 * h}] @ [{4 * h}, {inp}]", (n, 4 * h), (4 * h, inp))
    dense = [("output layer", (proj[1] if proj else layers[-1][1], vocab))]
    if proj is not None:
        dense.insert(0, ("projection", proj))
    for label, (fan_in, fan_out) in dense:
        timed(f"{label} [{n}, {fan_in}] @ [{fan_in}, {fan_out}]", (n, fan_in), (fan_in, fan_out))
        if training:
            timed(f"{label} input gradient [{n}, {fan_out}] @ [{fan_out}, {fan_in}]", (n, fan_out), (fan_out, fan_in))
            timed(f"{label} weight gradient [{fan_out}, {n}] @ [{n}, {fan_in}]", (fan_out, n), (n, fan_in))
    return parts


def count(model):
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-wt103", action="store_true", help="only the comparison with fairseq's lstm_lm")
    add_allocator_option(parser, "lstm_lm_speed")
    args = parser.parse_args(argv)
    enter_allocator(parser, args.allocator, "lstm_lm_speed", argv)
    set_threads(args.threads)
    sections, notes = [], []

    if not args.skip_wt103:
        vocab, batch, bptt = 267735, 60, 140
        task_args = ["--task", "language_modeling", "--criterion", "adaptive_loss", "--ddp-backend", "legacy_ddp"]
        models = {}
        for name in ("lstm_lm_adaptive_wt103", "lstm_lm_define_wt103_n3"):
            torch.manual_seed(1)
            model, _, criterion = build_lm(name, vocab, task_args, [])
            models[name] = (model, criterion)
        sample = lm_batch(vocab, batch, bptt)
        times = train_steps(models, sample, args.rounds, args.warmup)
        r2, r3 = (median(times[n]) for n in models)
        rows = [[f"`{name}`", f"{count(m) / 1e6:.2f} M", f"{median(times[name]) * 1e3:.0f}",
                 f"{min(times[name]) * 1e3:.0f}", f"{batch * bptt / median(times[name]):.0f}"]
                for name, (m, _) in models.items()]
        ratio, paired = r3 / r2, 1 / paired_ratio(times, "lstm_lm_adaptive_wt103", "lstm_lm_define_wt103_n3")
        sections.append(f"## 1. Table 1a R3 vs R2 (V={vocab:,}, batch {batch} x BPTT {bptt})\n\n"
                        + table(["arch", "parameters", "step ms (median)", "step ms (min)", "tokens/s"], rows)
                        + "\nPaper (GTX 1080 Ti): R2 297 ms/batch, R3 298 ms/batch (1.00x).\n")
        notes.append(f"- {'PASS' if ratio <= 1.1 else 'FAIL'}: R3 step time <= 1.1x R2: {ratio:.2f}x (ratio of "
                     f"medians; median of per-round ratios {paired:.2f}x)")

    vocab, bptt = 10000, 70
    size = ["--decoder-embed-dim", "400", "--decoder-hidden-size", "1150", "--decoder-layers", "3",
            "--dropout", "0.4"]
    task_args = ["--task", "language_modeling", "--criterion", "cross_entropy"]
    variants = {
        "fairseq `lstm_lm`": ("lstm_lm", size + ["--decoder-out-embed-dim", "400",
                                                  "--share-decoder-input-output-embed"]),
        SAME: ("lstm_lm_define", size + ["--define-n", "400", "--define-depth", "0", "--decoder-output-dim", "1150",
                                         "--share-decoder-input-output-embed"]),
        "`lstm_lm_define`, DeFINE n=128, N=7, k=1024 (m=400)": (
            "lstm_lm_define", size + ["--define-n", "128", "--define-depth", "7", "--define-k", "1024",
                                      "--decoder-output-dim", "1150", "--share-decoder-input-output-embed"]),
    }
    models = {}
    for name, (arch, extra) in variants.items():
        torch.manual_seed(1)
        model, _, criterion = build_lm(arch, vocab, task_args, extra)
        models[name] = (model, criterion)
    base = "fairseq `lstm_lm`"
    regimes = [("training, batch 20 (AWD-LSTM's PTB training batch)", 20, True),
               ("scoring (eval mode, no grad), batch 10 (AWD-LSTM's validation batch)", 10, False),
               ("scoring (eval mode, no grad), batch 1 (AWD-LSTM's test batch)", 1, False)]
    decoder = models[SAME][0].decoder
    layer_shapes = [(layer.lstm.input_size, layer.lstm.hidden_size) for layer in decoder.lstm.layers]
    proj = decoder.project_out_dim
    proj_shape = None if proj is None else (proj.in_features, proj.out_features)
    rows, floor_sections = [], []
    for label, batch, training in regimes:
        sample = lm_batch(vocab, batch, bptt)
        extra = {ALONE: lstm_layers_alone(decoder.lstm, batch, bptt, training)}
        if training:
            times = train_steps(models, sample, args.rounds + 2, args.warmup, extra)
        else:
            times = score_steps(models, sample, args.rounds + 2, args.warmup, extra)
        parts = step_products(layer_shapes, proj_shape, vocab, batch, bptt, training)
        peak = peak_gflops()
        one_by_one = sum(t for _, t, _ in parts)
        flops = sum(f for _, _, f in parts)
        floor = flops / (peak * 1e9)
        for name, (m, _) in models.items():
            rows.append([label if name == base else "", name, f"{count(m) / 1e6:.2f} M",
                         f"{median(times[name]) * 1e3:.0f}", f"{batch * bptt / median(times[name]):.0f}",
                         f"{median(times[base]) / median(times[name]):.2f}x", f"{paired_ratio(times, base, name):.2f}x",
                         f"{flops / median(times[name]) / 1e9:.0f}"])
        alone = median(times[ALONE])
        rows.append(["", f"*{ALONE}*", "", f"{alone * 1e3:.0f}", f"{batch * bptt / alone:.0f}",
                     f"{median(times[base]) / alone:.2f}x", f"{paired_ratio(times, base, ALONE):.2f}x", ""])
        rows.append(["", f"*the products' arithmetic at the peak rate ({peak:.0f} GFLOP/s): a floor*", "",
                     f"{floor * 1e3:.0f}", f"{batch * bptt / floor:.0f}", f"{median(times[base]) / floor:.2f}x", "",
                     f"{peak:.0f}"])
        rows.append(["", "*the products one by one through torch.mm (no bound)*", "", f"{one_by_one * 1e3:.0f}",
                     f"{batch * bptt / one_by_one:.0f}", f"{median(times[base]) / one_by_one:.2f}x", "",
                     f"{flops / one_by_one / 1e9:.0f}"])
        speedup = median(times[base]) / median(times[SAME])
        bound = median(times[base]) / floor
        notes.append(f"- {'PASS' if speedup >= 3 else 'FAIL'} ({label}): lstm_lm_define tokens/s >= 3x fairseq's "
                     f"lstm_lm at the same size: {speedup:.2f}x (ratio of medians; median of per-round ratios "
                     f"{paired_ratio(times, base, SAME):.2f}x). The step's matrix products are {flops / 1e9:.1f} "
                     f"GFLOP: at the peak rate measured here ({peak:.0f} GFLOP/s) at least {floor * 1e3:.0f} ms, so "
                     f"no implementation could exceed about {bound:.2f}x on this machine; lstm_lm_define runs them at "
                     f"{flops / median(times[SAME]) / 1e9:.0f} GFLOP/s "
                     f"({flops / median(times[SAME]) / 1e9 / peak:.0%} of peak), fairseq's lstm_lm at "
                     f"{flops / median(times[base]) / 1e9:.0f}. 3x needs a step of at most "
                     f"{median(times[base]) / 3 * 1e3:.0f} ms; the model's LSTM layers alone, PyTorch's fused "
                     f"kernels, take {alone * 1e3:.0f} ms ({median(times[base]) / alone:.2f}x)")
        product_rows = [[p, f"{t * 1e3:.1f}", f"{f / 1e9:.2f}"] for p, t, f in parts]
        floor_sections.append(f"### {label}\n\n" + table(["product", "ms (torch.mm)", "GFLOP"], product_rows)
                              + f"| **total** | **{one_by_one * 1e3:.0f}** | **{flops / 1e9:.1f}** |\n")
    sections.append(f"## 2. lstm_lm_define vs fairseq's lstm_lm (AWD-LSTM's PTB size: V={vocab:,}, embedding 400, "
                    f"3 layers of 1150, tied; BPTT {bptt})\n\n"
                    + table(["regime", "model", "parameters", "ms per batch (median)", "tokens/s",
                             "vs lstm_lm (ratio of medians)", "vs lstm_lm (median of per-round ratios)",
                             "matrix-product GFLOP/s"], rows)
                    + "\n" + ALONE_NOTE + "\n"
                    + "\n### The matrix products of one step\n\n" + PRODUCTS_NOTE + "\n\n"
                    + "\n".join(floor_sections))

    text = header("Training speed of the LSTM language models", "benchmarks.lstm_lm_speed", [
        "Step: forward, loss, backward, clip_grad_norm_(0.25), torch.optim.SGD step; one fixed batch of Zipf-"
        "distributed tokens; models built by fairseq's parser from the registered archs"])
    text += "\n" + "\n".join(sections) + "\n## Targets\n\n" + "\n".join(notes) + "\n"
    write_result(result_name("lstm_lm_speed", args.allocator), text)


if __name__ == "__main__":
    main()
