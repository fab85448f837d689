"""Speed of Transformer-XL with DeFINE (n = 128) against the standard 384 model, CPU, the DeFINE paper's Table 2
sizes: vocabulary 267,735, 16 layers of d 384 (10 heads x 41, d_inner 1920), projected adaptive softmax with
cutoffs 20000, 40000, 200000 tied to the input table. Timed interleaved in one run:

1. Training: forward, ``lm_regularized_loss`` (the cross-entropy through the adaptive softmax), backward, Adam
   step, at Transformer-XL's training shape per GPU (the paper's 4 GPUs share batch 60: 15 streams here) x
   ``tgt_len`` 150 with a memory of 150 states (``--txl-mem-len``). The paper reports 855 ms/batch (standard 384)
   against 606 (DeFINE n = 128). Target: DeFINE >= 1.3x the training tokens/s.
2. Evaluation as fairseq-eval-lm scores: eval mode, no autograd, the full log-probabilities of every position,
   with Transformer-XL's evaluation settings (``tgt_len`` 64, memory 640, ``clamp_len`` 400, ``same_length``),
   batch 10 (Transformer-XL's eval batch). Three variants: the standard model, DeFINE unfolded (in eval mode it
   computes its V x 384 table once and looks rows up) and DeFINE folded (``fold_model``: the unit replaced by
   that table).

Tokens are drawn Zipf-like (exponent 1) over the vocabulary, so the clusters get a realistic share of them.

    .venv/bin/python -m benchmarks.txl_speed [--rounds 3] [--threads 2] [--batch 15] [--eval-batch 10]
"""

import argparse
import copy

import torch

from benchmarks.common import (add_allocator_option, count_params, counting_faults, enter_allocator, header,
                               interleaved, median, paired_ratio, peak_gflops, result_name, set_threads, table,
                               write_result)
from benchmarks.lstm_lm_speed import build_lm, lm_batch

VOCAB = 267735
STANDARD, DEFINE = "transformer_xl_wt103_d384", "transformer_xl_define_wt103_n128"


def txl_batch(batch: int, tgt_len: int, seed: int, vocab: int = VOCAB):
    sample = lm_batch(vocab, batch, tgt_len, seed=seed)
    sample["net_input"]["reset_state"] = False  # carry the memory from call to call, as the stateful task does
    return sample


def train_section(args, models, sections, notes):
    """1. Training: interleaved steps of the two models; appends the table and the verdict."""
    tgt_len = 150
    sample = txl_batch(args.batch, tgt_len, seed=0)
    optimizers = {name: torch.optim.Adam(model.parameters(), lr=2.5e-4) for name, (model, _) in models.items()}

    def train_step(name):
        model, criterion = models[name]

        def run():
            optimizers[name].zero_grad(set_to_none=True)
            loss, _, _ = criterion(model, sample)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            optimizers[name].step()
        return run

    for model, _ in models.values():
        model.train()
        model.decoder.memory.clear()
    calls = {name: train_step(name) for name in models}
    calls[CONTEXT_ALONE] = context_alone_step(models[DEFINE][0], args.batch, tgt_len)
    calls, faults = counting_faults(calls)
    times = interleaved(calls, rounds=args.rounds, warmup=args.warmup, log=True)
    tokens = args.batch * tgt_len
    params = {name: count_params(m) for name, (m, _) in models.items()}
    params[CONTEXT_ALONE] = count_params(models[DEFINE][0].decoder.stack)
    rows = [[f"`{name}`" if name in models else name, f"{params[name] / 1e6:.2f} M", f"{median(times[name]) * 1e3:.0f}",
             f"{median(faults[name][args.warmup:]):.0f}", f"{tokens / median(times[name]):.0f}",
             f"{median(times[STANDARD]) / median(times[name]):.2f}x"] for name in calls]
    speedup = median(times[STANDARD]) / median(times[DEFINE])
    paired = paired_ratio(times, STANDARD, DEFINE)
    bound = median(times[STANDARD]) / median(times[CONTEXT_ALONE])
    peak = peak_gflops()
    io = {name: io_training_flops(model, sample) for name, (model, _) in models.items()}
    io_floor = median(times[CONTEXT_ALONE]) + io[DEFINE] / (peak * 1e9)
    distinct = sample["net_input"]["src_tokens"].unique().numel()
    context_note = (
        f"The last row is the DeFINE model's context network alone (the 16 layers, the same in both models) on a "
        f"fixed input that needs a gradient, with its memory, dropout, clipping and Adam: a model with this network, "
        f"as it runs here, takes at least about this long per step, whatever its input and output layers, so the "
        f"standard model's step divided by it ({bound:.2f}x) is about the most any input/output layer could give "
        f"here. The matrix products of the input and output layers (for DeFINE, its unit on the batch's {distinct} "
        f"distinct tokens and the n = 128 adaptive softmax) take {io[STANDARD] / 1e9:.1f} GFLOP (standard) and "
        f"{io[DEFINE] / 1e9:.1f} GFLOP (DeFINE) a step, {io[DEFINE] / (peak * 1e9) * 1e3:.0f} ms for DeFINE's at "
        f"this machine's peak rate ({peak:.0f} GFLOP/s, a 2048-cubed product): with the context network as it runs "
        f"here, the DeFINE model's step takes at least about {io_floor * 1e3:.0f} ms, at most about "
        f"{median(times[STANDARD]) / io_floor:.2f}x faster than the standard model's.")
    sections.append(f"## 1. Training (batch {args.batch} x tgt_len {tgt_len}, memory 150, Adam)\n\n"
                    + table(["model", "parameters", "step ms (median)", "page faults per step (median)", "tokens/s",
                             "vs standard 384"], rows)
                    + "\n" + context_note + "\n"
                    + "\nPaper (4 x RTX 2080 Ti): standard 384 855 ms/batch, DeFINE n = 128 606 ms/batch (1.41x).\n")
    notes.append(f"{'PASS' if speedup >= 1.3 else 'FAIL'}: DeFINE n=128 training tokens/s >= 1.3x standard 384: "
                 f"{speedup:.2f}x (ratio of medians; median of per-round ratios {paired:.2f}x); the shared context "
                 f"network alone leaves at most about {bound:.2f}x on this machine, and with the arithmetic of "
                 f"DeFINE's input and output layers at the peak rate at {median(times[STANDARD]) / io_floor:.2f}x")


CONTEXT_ALONE = "context network alone (same in both)"


def io_training_flops(model, sample) -> int:
    """Floating-point operations of the matrix products of ``model``'s input and output layers in one training
    step on ``sample`` (forward plus the two backward products, so 3x the forward), for the Transformer-XL LM:

    * a ``DeFINEEmbedding`` input runs its unit once per distinct token of the batch (on every position when
      its ``unique_tokens`` is off, or with dropout inside the unit in training): its group-linear layers'
      weights hold the multiply-adds per token (a plain table or a projective one costs next to nothing and is
      not counted);
    * the projected adaptive softmax scores every position against the head (``c0`` words plus one entry per
      tail cluster) through its projection, and each position whose target lies in a tail cluster against that
      cluster's words through the cluster's projection (as the training loss does).
    """
    from define_fairseq.modules import DeFINEEmbedding

    emb, softmax = model.decoder.embed_tokens, model.decoder.adaptive_softmax
    tokens, target = sample["net_input"]["src_tokens"], sample["target"].reshape(-1)
    macs = 0
    if isinstance(emb, DeFINEEmbedding):
        unit = sum(layer.in_features * layer.out_features // layer.groups for layer in emb.define.layers)
        macs += (tokens.unique().numel() if emb.runs_per_distinct_token else tokens.numel()) * unit
    d, n, cut = softmax.input_dim, softmax.embed_dim, softmax.cutoff
    for c in range(softmax.num_clusters):
        lo, hi = (0, cut[0]) if c == 0 else (cut[c - 1], cut[c])
        rows = target.numel() if c == 0 else int(((target >= lo) & (target < hi)).sum())
        width = hi - lo + (softmax.num_clusters - 1 if c == 0 else 0)
        projection = getattr(softmax, f"projection_{c}")
        macs += rows * width * n + (rows * d * n if projection is not None else 0)
    return 3 * 2 * macs


def context_alone_step(model, batch: int, tgt_len: int):
    """A training step of a copy of ``model``'s Transformer-XL stack alone: a fixed input ``[batch, tgt_len, d]``
    that needs a gradient (as an embedding's output does), the memory carried from step to step, a cheap loss
    (the mean of the output), backward, gradient clipping (0.25) and Adam on the stack's parameters."""
    stack = copy.deepcopy(model.decoder.stack).train()
    x = torch.randn(batch, tgt_len, stack.d_model, requires_grad=True)
    params = list(stack.parameters())
    optimizer = torch.optim.Adam(params, lr=2.5e-4)
    memory = [None]

    def run():
        optimizer.zero_grad(set_to_none=True)
        x.grad = None
        out, memory[0] = stack(x, memory[0])
        out.mean().backward()
        torch.nn.utils.clip_grad_norm_(params, 0.25)
        optimizer.step()
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=15, help="training streams (default 15: batch 60 on 4 GPUs)")
    parser.add_argument("--eval-batch", type=int, default=10)
    parser.add_argument("--skip-training", action="store_true", help="only the evaluation comparison")
    add_allocator_option(parser, "txl_speed")
    args = parser.parse_args(argv)
    enter_allocator(parser, args.allocator, "txl_speed", argv)
    set_threads(args.threads)
    import define_fairseq  # noqa: F401
    from define_fairseq.tools.fold_define import fold_model

    task_args = ["--task", "language_modeling", "--criterion", "lm_regularized_loss", "--ddp-backend", "legacy_ddp"]
    models = {}
    for arch in (STANDARD, DEFINE):
        torch.manual_seed(1)
        model, _, criterion = build_lm(arch, VOCAB, task_args, ["--txl-mem-len", "150"])
        models[arch] = (model, criterion)
    sections, notes = [], []

    if not args.skip_training:
        train_section(args, models, sections, notes)

    # 2. evaluation
    folded = copy.deepcopy(models[DEFINE][0])
    fold_model(folded)
    variants = {STANDARD: models[STANDARD][0], DEFINE: models[DEFINE][0], f"{DEFINE}, folded": folded}
    eval_len, batch = 64, args.eval_batch
    eval_sample = txl_batch(batch, eval_len, seed=1)
    for model in variants.values():
        model.eval()
        model.decoder.memory.clear()
        stack = model.decoder.stack
        stack.mem_len, stack.clamp_len, stack.same_length = 640, 400, True
        with torch.no_grad():  # fill the memory: 10 segments of 64 = 640 states
            for _ in range(10):
                model(**eval_sample["net_input"])

    def score(name):
        model = variants[name]

        def run():
            with torch.no_grad():
                net_output = model(**eval_sample["net_input"])
                lprobs = model.get_normalized_probs(net_output, log_probs=True, sample=eval_sample)
                lprobs.gather(-1, eval_sample["target"].unsqueeze(-1))
        return run

    def stack_only(name):
        model = variants[name]

        def run():
            with torch.no_grad():
                model(**eval_sample["net_input"])
        return run

    calls = {name: score(name) for name in variants}
    calls.update({f"{name} (stack)": stack_only(name) for name in (STANDARD, DEFINE)})
    calls, faults = counting_faults(calls)
    times = interleaved(calls, rounds=args.rounds, warmup=args.warmup, log=True)
    tokens = batch * eval_len
    stack_ms = {name: median(times.get(f"{name} (stack)", times[f"{DEFINE} (stack)"])) * 1e3 for name in variants}
    rows = [[f"`{name}`", f"{median(times[name]) * 1e3:.0f}", f"{stack_ms[name]:.0f}",
             f"{median(times[name]) * 1e3 - stack_ms[name]:.0f}", f"{median(faults[name][args.warmup:]):.0f}",
             f"{tokens / median(times[name]):.0f}",
             f"{median(times[STANDARD]) / median(times[name]):.2f}x"] for name in variants]
    sections.append(f"## 2. Evaluation (batch {batch} x tgt_len {eval_len}, memory 640, clamp_len 400, same_length; "
                    f"full log-probabilities as fairseq-eval-lm)\n\n"
                    + table(["model", "ms per segment (median)", "of which input + stack (ms)",
                             "of which log-probabilities (ms, the difference)", "page faults per segment (median)",
                             "tokens/s", "vs standard 384"], rows)
                    + "\nThe input + stack column times the model's forward alone (the folded model's is taken as the "
                      "unfolded one's: the same stack, and both look rows up in a V x 384 table).\n"
                    + "\nPaper (Table 5, inference ms/batch): standard 384 202, projective 128 129, DeFINE 128 131.\n")
    for name in (DEFINE, f"{DEFINE}, folded"):
        ratio = median(times[STANDARD]) / median(times[name])
        notes.append(f"{'PASS' if ratio >= 1.3 else 'FAIL'}: {name} evaluation tokens/s >= 1.3x standard 384: "
                     f"{ratio:.2f}x (median of per-round ratios {paired_ratio(times, STANDARD, name):.2f}x)")

    text = header("Transformer-XL: DeFINE n=128 vs standard 384 (Table 2 sizes, V=267,735)", "benchmarks.txl_speed",
                  notes) + "\n" + "\n".join(sections)
    write_result(result_name("txl_speed", args.allocator), text)


if __name__ == "__main__":
    main()
