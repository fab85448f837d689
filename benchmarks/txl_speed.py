"""Transformer-XL with DeFINE (n = 128) against the standard 384 model at the DeFINE paper's Table 2 sizes (V =
267,735, 16 layers of d 384, projected adaptive softmax tied to the input table), timed interleaved: (1) training,
batch 15 x 150 with a memory of 150, beside the context network alone and the input and output layers' arithmetic at
the peak rate (what bounds any input layer's gain); (2) evaluation as fairseq-eval-lm scores, batch 10 x 64, memory
640, standard, DeFINE and DeFINE folded. ``--shape nvidia-base``: instead, training at NVIDIA DeepLearningExamples'
base shape, absolute tokens/s beside its published figure. ``--model-args``: fairseq flags for every model (e.g.
``"--torch-compile"``). Targets (``benchmarks/targets.py``): DeFINE >= 1.15x in training on a GPU, >= 1.3x on a CPU
and in evaluation; 120,000 tokens/s at NVIDIA's base shape on one H100 or H200.
"""

import copy
import shlex

import torch

from benchmarks.common import Bench, build_model, count_params, lm_sample, options, run_main
from benchmarks.targets import GOALS, millions, ms, ratio, table

STANDARD, DEFINE = "transformer_xl_wt103_d384", "transformer_xl_define_wt103_n128"
ALONE = "context network alone (same in both)"
TASK = "--task language_modeling --criterion lm_regularized_loss --ddp-backend legacy_ddp".split()
NVIDIA_BASE = "--decoder-layers 16 --decoder-embed-dim 512 --decoder-attention-heads 8 --txl-head-dim 64 "
NVIDIA_BASE += "--decoder-ffn-embed-dim 2048 --adaptive-softmax-cutoff 19997,39997,199997"
NVIDIA_ANCHOR = 60000  # tokens/s, about: one A100 40GB, mixed precision, the DeepLearningExamples README's base model
QUICK = ["--decoder-layers", "2", "--adaptive-softmax-cutoff", "500,1000,2000"]


def txl_batch(vocab: int, batch: int, tgt_len: int, seed: int):
    sample = lm_sample(vocab, batch, tgt_len, seed=seed)
    sample["net_input"]["reset_state"] = False  # carry the memory from call to call, as the stateful task does
    return sample


def io_training_flops(model, sample) -> int:
    """FLOPs of the matrix products of ``model``'s input and output layers in one training step on ``sample``
    (forward and the two backward products): a ``DeFINEEmbedding``'s group-linear layers per distinct token, per
    position or per vocabulary row (the path it takes for the batch, ``path_for``); the projected adaptive softmax
    scores every position against the head (``c0`` words and one entry per tail cluster) and each position whose
    target lies in a tail cluster against that cluster's words, each through its projection."""
    from define_fairseq.modules import DeFINEEmbedding

    emb, softmax = model.decoder.embed_tokens, model.decoder.adaptive_softmax
    tokens, target = sample["net_input"]["src_tokens"], sample["target"].reshape(-1)
    macs = 0
    if isinstance(emb, DeFINEEmbedding):
        unit = sum(layer.in_features * layer.out_features // layer.groups for layer in emb.define.layers)
        rows = {"unique": tokens.unique().numel(), "table": emb.num_embeddings, "positions": tokens.numel()}
        macs += rows[emb.path_for(tokens)] * unit
    d, n, cut = softmax.input_dim, softmax.embed_dim, softmax.cutoff
    for c in range(softmax.num_clusters):
        lo, hi = (0, cut[0]) if c == 0 else (cut[c - 1], cut[c])
        rows = target.numel() if c == 0 else int(((target >= lo) & (target < hi)).sum())
        width = hi - lo + (softmax.num_clusters - 1 if c == 0 else 0)
        macs += rows * width * n + (rows * d * n if getattr(softmax, f"projection_{c}") is not None else 0)
    return 3 * 2 * macs


def context_alone(bench: Bench, model, batch: int, tgt_len: int):
    """A training step of a copy of ``model``'s Transformer-XL stack alone: a fixed input that needs a gradient, the
    memory carried from step to step, the output's mean as the loss, clipping (0.25), Adam."""
    stack = bench.to(copy.deepcopy(model.decoder.stack)).train()
    x = torch.randn(batch, tgt_len, stack.d_model, device=bench.device, requires_grad=True)
    params = list(stack.parameters())
    optimizer, memory = torch.optim.Adam(params, lr=2.5e-4), [None]

    def run():
        optimizer.zero_grad(set_to_none=True)
        x.grad = None
        with bench.autocast():
            out, memory[0] = stack(x, memory[0])
        out.float().mean().backward()
        torch.nn.utils.clip_grad_norm_(params, 0.25)
        optimizer.step()

    return run


def training_step(bench: Bench, model, criterion, sample):
    return bench.step(model, criterion, sample, torch.optim.Adam(model.parameters(), lr=2.5e-4), clip=0.25)


def nvidia_base(bench: Bench, batch: int, flags: str):
    """Training at NVIDIA DeepLearningExamples' base shape: the standard model and its context network alone."""
    args = bench.args
    vocab, tgt_len = (3000, 8) if args.quick else (267735, 192)
    shape = NVIDIA_BASE.split() + ["--txl-mem-len", str(tgt_len)] + (QUICK if args.quick else [])
    _, _, model, criterion = build_model("transformer_xl_lm", vocab, TASK, shape + shlex.split(args.model_args))
    model, name = bench.to(model).train(), "transformer_xl_lm at the base shape"
    fns = {name: training_step(bench, model, criterion, bench.to(txl_batch(vocab, batch, tgt_len, seed=0)))}
    fns["context network alone"] = context_alone(bench, model, batch, tgt_len)
    t = bench.time(fns)
    rows = [[n, t.ms(n), t.per_s(n, batch * tgt_len)] for n in fns]
    what = f"Transformer-XL at NVIDIA's base shape{flags}, training tokens/s, {args.dtype} (twice NVIDIA's A100 "
    what += "figure)"
    streams, goal = f"{batch} x {tgt_len} tokens, memory {tgt_len}", GOALS["txl_nvidia_base"].gpu
    check = bench.check(what, batch * tgt_len / t.median(name), goal, "txl_nvidia_base", unit="tokens/s", batch=streams)
    rows.append(["NVIDIA DeepLearningExamples, 1x A100 40GB, mixed precision (published)", "", f"{NVIDIA_ANCHOR}"])
    return check, (
        f"## Training at NVIDIA's Transformer-XL base shape (batch {batch} x tgt_len {tgt_len}, memory {tgt_len}, "
        f"{count_params(model) / 1e6:.1f} M parameters, Adam, clipping 0.25)\n\n"
        + table("model | step ms (median) | tokens/s", rows)
        + "\nNVIDIA's recipe trains with LAMB; Adam's step costs the same order (an elementwise pass over the "
        "parameters). Its figure is per GPU, from its README's training performance table.\n"
    )


def main(argv=None):
    parser = options(__doc__, rounds=3)
    parser.add_argument("--batch", type=int, help="training streams (default 15: batch 60 on 4 GPUs; nvidia-base 32)")
    parser.add_argument("--eval-batch", type=int, default=10)
    parser.add_argument("--skip-training", action="store_true", help="only the evaluation comparison")
    shapes = "paper: the DeFINE paper's Table 2 comparison (training and evaluation); nvidia-base: training at "
    shapes += "NVIDIA DeepLearningExamples' base shape, absolute tokens/s beside its published figure"
    parser.add_argument("--shape", choices=("paper", "nvidia-base"), default="paper", help=shapes)
    parser.add_argument("--model-args", default="", help='fairseq flags for every model, e.g. "--torch-compile"')
    bench = Bench("benchmarks.txl_speed", parser, argv)
    args, quick = bench.args, bench.args.quick
    flags = f" ({args.model_args.strip()})" if args.model_args.strip() else ""  # the figures name --model-args
    if args.shape == "nvidia-base":
        check, body = nvidia_base(bench, 2 if quick else args.batch or 32, flags)
        return bench.finish("Transformer-XL at NVIDIA's base shape: training tokens/s", [], body, [check])
    args.batch = args.batch or 15
    sizes = (3000, 2, 8, 2, 4) if quick else (267735, args.batch, 150, args.eval_batch, 64)
    vocab, batch, tgt_len, eval_batch, eval_len = sizes
    extra = ["--txl-mem-len", str(tgt_len)] + (QUICK if quick else []) + shlex.split(args.model_args)
    built = bench.build(vocab, TASK, {arch: (arch, extra) for arch in (STANDARD, DEFINE)})
    models = {arch: (model, criterion) for arch, (_, _, model, criterion) in built.items()}
    sections, checks = [], []

    def vs_standard(goal: str, who: str, regime: str, name: str, t, batch: str):
        """Goal ``goal``'s check: ``name``'s tokens/s over the standard 384 model's (1.3x where it has no target)."""
        what = f"{who} vs standard 384{flags}, {regime} tokens/s, {args.dtype}"
        return bench.check(what, t.speedup(STANDARD, name), 1.3, goal, batch=batch)

    if not args.skip_training:
        sample = bench.to(txl_batch(vocab, batch, tgt_len, seed=0))
        for model, _ in models.values():
            model.train().decoder.memory.clear()
        fns = {n: training_step(bench, m, c, sample) for n, (m, c) in models.items()}
        fns[ALONE] = context_alone(bench, models[DEFINE][0], batch, tgt_len)
        t = bench.time(fns)
        params = {n: count_params(m) for n, (m, _) in models.items()}
        params[ALONE] = count_params(models[DEFINE][0].decoder.stack)
        cells = {n: [f"`{n}`" if n in models else n, millions(params[n]), t.ms(n), t.page_faults(n)] for n in fns}
        rows = [cells[n] + [t.per_s(n, batch * tgt_len), ratio(t.speedup(STANDARD, n))] for n in fns]
        peak = bench.peak_flops()
        io = {name: io_training_flops(m, sample) for name, (m, _) in models.items()}
        distinct = sample["net_input"]["src_tokens"].unique().numel()
        floor = t.median(ALONE) + io[DEFINE] / peak
        label = "context network alone + DeFINE's input/output products at the peak rate"
        rows.append([label, "", ms(floor), "", f"{batch * tgt_len / floor:.0f}", ratio(t.median(STANDARD) / floor)])
        columns = "model | parameters | step ms (median) | page faults per step (median) | tokens/s | vs standard 384"
        sections.append(
            f"## 1. Training (batch {batch} x tgt_len {tgt_len}, memory {tgt_len}, Adam)\n\n"
            + table(columns, rows)
            + f"\nInput and output layers' matrix products per step ({distinct} distinct tokens): standard "
            f"{io[STANDARD] / 1e9:.1f} GFLOP, DeFINE {io[DEFINE] / 1e9:.1f} GFLOP; peak rate {peak / 1e9:.0f} "
            f"GFLOP/s. Paper (4 x RTX 2080 Ti): standard 384 855 ms/batch, DeFINE n = 128 606 (1.41x).\n"
        )
        shape = f"{batch} x {tgt_len} tokens, memory {tgt_len}"
        checks.append(vs_standard("txl_define_train", "Transformer-XL DeFINE n=128", "training", DEFINE, t, shape))

    from define_fairseq.tools.fold_define import fold_model

    folded = f"{DEFINE}, folded"
    variants = {STANDARD: models[STANDARD][0], DEFINE: models[DEFINE][0]}
    variants[folded] = fold_model(copy.deepcopy(models[DEFINE][0]))
    sample = bench.to(txl_batch(vocab, eval_batch, eval_len, seed=1))
    for model in variants.values():
        model.eval()
        model.decoder.memory.clear()
        stack = model.decoder.stack
        stack.mem_len, stack.clamp_len, stack.same_length = 10 * eval_len, 400, True
        with torch.no_grad(), bench.autocast():  # fill the memory: 10 segments
            for _ in range(10):
                model(**sample["net_input"])

    def score(name, log_probs=True):
        def run():
            with torch.no_grad(), bench.autocast():
                out = variants[name](**sample["net_input"])
                if log_probs:
                    probs = variants[name].get_normalized_probs(out, log_probs=True, sample=sample)
                    probs.gather(-1, sample["target"].unsqueeze(-1))

        return run

    fns = {name: score(name) for name in variants}
    fns.update({f"{name} (stack)": score(name, log_probs=False) for name in (STANDARD, DEFINE)})
    t = bench.time(fns)
    stack = {name: t.median(f"{DEFINE if name == folded else name} (stack)") for name in variants}
    cells = {n: [f"`{n}`", t.ms(n), ms(stack[n]), ms(t.median(n) - stack[n]), t.page_faults(n)] for n in variants}
    rows = [cells[n] + [t.per_s(n, eval_batch * eval_len), ratio(t.speedup(STANDARD, n))] for n in variants]
    columns = "model | ms per segment (median) | of which input + stack (ms) | of which log-probabilities (ms, the "
    columns += "difference) | page faults per segment (median) | tokens/s | vs standard 384"
    sections.append(
        f"## 2. Evaluation (batch {eval_batch} x tgt_len {eval_len}, memory {10 * eval_len}, clamp_len 400, "
        f"same_length; full log-probabilities as fairseq-eval-lm)\n\n"
        + table(columns, rows)
        + "\nInput + stack: the forward alone (the folded model's taken as the unfolded one's). Paper (Table 5, "
        "inference ms/batch): standard 384 202, projective 128 129, DeFINE 128 131.\n"
    )
    shape = f"{eval_batch} x {eval_len} tokens, memory {10 * eval_len}"
    checks += [vs_standard("txl_define_eval", n, "evaluation", n, t, shape) for n in (DEFINE, folded)]
    return bench.finish("Transformer-XL: DeFINE n=128 vs standard 384 (Table 2 sizes)", [], "\n".join(sections), checks)


if __name__ == "__main__":
    run_main(main)
