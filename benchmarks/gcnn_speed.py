"""Speed of the gated convolutional LM (``gcnn_lm``) in four parts (``--parts``), all in one run: (1) layers:
forward + backward of GCNN-14's convolution shapes, ``F.conv1d``, ``torch.conv_tbc`` (fairseq's) and ``CausalConv1d``
(ours); (2) train: ``gcnn_lm_14`` against fairseq's ``fconv_lm_dauphin_wikitext103`` (V = 267,735, 1 x 1024 tokens),
a step as fairseq-train's; (3) generate: fairseq's ``SequenceGenerator``; (4) responsiveness (the paper's Table 4):
scoring one sentence and one long sequence at batch 1, ``gcnn_lm_8`` against ``lstm_lm_adaptive_wt103`` with its
total or its body matched. Targets: ours >= 1.0x fairseq's tokens/s in training and generation.
"""

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from benchmarks.common import ADAPTIVE_LM, Bench, listed, lm_sample, options, run_main, zipf_tokens
from benchmarks.targets import millions, ms, ratio, table

PARTS = ("layers", "train", "generate", "responsiveness")
OURS, FAIRSEQ = "gcnn_lm_14", "fconv_lm_dauphin_wikitext103"
# GCNN-14's convolutions: (input channels, output channels before the GLU halves them, kernel, layers of the kind)
LAYER_SHAPES = [(850, 1700, 6, 3), (850, 1700, 5, 4), (850, 1700, 4, 3), (850, 1700, 1, 2), (850, 2048, 4, 1)]
LAYER_SHAPES.append((1024, 4096, 4, 1))
CONVS = ("F.conv1d [B, C, T]", "torch.conv_tbc [T, B, C] (fairseq)", "CausalConv1d [B, T, C] (ours)")
VS = "vs fairseq (ratio of medians) | (median of per-round ratios)"
# the sizes of a run and of --quick
SIZES = dict(vocab=267735, cutoff="10000,20000,200000", small=False, layer_tokens=1024, train_tokens=1024, prefix=8)
SIZES.update(new_tokens=32, lstm_hidden=2434, lstm_hidden_body=1324)
QUICK = dict(vocab=3000, cutoff="500,1000,2000", small=True, layer_tokens=64, train_tokens=32, generate=[(1, 2)])
QUICK.update(prefix=2, new_tokens=2, long_tokens=40, lstm_hidden=64, lstm_hidden_body=32)


def conv_calls(bench: Bench, cin: int, cout: int, k: int, tokens: int):
    """Forward + backward of the three implementations of one causal convolution on ``tokens`` time steps."""
    from define_fairseq.modules.gated_conv import CausalConv1d

    g = torch.Generator().manual_seed(0)
    x, grad = torch.randn(1, tokens, cin, generator=g), torch.randn(1, tokens, cout, generator=g)
    w = torch.randn(cout, cin, k, generator=g) * (cin * k) ** -0.5  # [out, in, k], k: offset from the oldest input
    conv = CausalConv1d(cin, cout, k, weight_norm=False)
    with torch.no_grad():
        conv.weight.copy_(w.permute(0, 2, 1).reshape(cout, k * cin))
    conv = conv.to(bench.device, bench.dtype)
    # [B, C, T] for F.conv1d; [T, B, C] and weight [k, in, out] for conv_tbc; [B, T, C] for ours
    bias = torch.zeros(cout)
    inputs = ((x.transpose(1, 2), w, bias), (x.transpose(0, 1), w.permute(2, 1, 0), bias), (x, *conv.parameters()))
    leaves = [[v.contiguous().to(bench.device, bench.dtype).requires_grad_() for v in vs] for vs in inputs]
    grads = [v.contiguous().to(bench.device, bench.dtype) for v in (grad.transpose(1, 2), grad.transpose(0, 1), grad)]
    forwards = (
        lambda x, w, b: F.conv1d(F.pad(x, (k - 1, 0)), w, b),
        lambda x, w, b: torch.conv_tbc(x, w, b, k - 1)[:tokens],  # fairseq pads both sides, drops k - 1
        lambda x, *_: conv(x),
    )
    with torch.no_grad():
        outputs = [f(*v).float() for f, v in zip(forwards, leaves)]
        tolerance = 1e-4 if bench.dtype == torch.float32 else 5e-2
        assert torch.allclose(outputs[0].transpose(1, 2), outputs[1].transpose(0, 1), atol=tolerance)
        assert torch.allclose(outputs[0].transpose(1, 2), outputs[2], atol=tolerance)

    def call(forward, grad, leaves):
        def run():
            for v in leaves:
                v.grad = None
            forward(*leaves).backward(grad)

        return run

    return {name: call(*a) for name, a in zip(CONVS, zip(forwards, grads, leaves))}


def part_layers(bench: Bench, s):
    tokens, rows, totals = s.layer_tokens, [], dict.fromkeys(CONVS, 0.0)
    for cin, cout, k, count in LAYER_SHAPES:
        t = bench.time(conv_calls(bench, cin, cout, k, tokens), rounds=bench.args.rounds + 2)
        for v in CONVS:
            totals[v] += count * t.median(v)
            label = f"{cin} -> {cout} (= 2 x {cout // 2}), k={k}" if v == CONVS[0] else ""
            rows.append([label, f"`{v}`", *t.columns(v, CONVS[1], 6 * tokens * k * cin * cout / 1e9)])
    for v in CONVS:
        cells = [ms(totals[v]), "", "", ratio(totals[CONVS[1]] / totals[v]), ""]
        rows.append(["**GCNN-14's 14 layers** (sum of medians x layers)" if v == CONVS[0] else "", f"`{v}`", *cells])
    columns = "layer (in -> out channels) | implementation | ms (median) | ms (min) | GFLOP/s | speed vs conv_tbc "
    columns += "(ratio of medians) | (median of per-round ratios)"
    return (
        f"## 1. Causal convolution layers of GCNN-14, forward + backward, 1 x {tokens} tokens\n\nInput and weights "
        f"require gradients; plain weights; GFLOP/s counts 3 x 2 x T x k x in x out.\n\n" + table(columns, rows)
    ), []


def wt103_args(s):
    return ["--dropout", "0", "--adaptive-softmax-cutoff", s.cutoff, "--tokens-per-sample", "1024"]


def part_train(bench: Bench, s):
    from fairseq import optim

    flags = wt103_args(s) + "--optimizer nag --lr 1.0 --momentum 0.99 --weight-decay 5e-06 --clip-norm 0.1".split()
    built = bench.build(s.vocab, ADAPTIVE_LM, {FAIRSEQ: (FAIRSEQ, flags), OURS: (OURS, flags)})
    sample = bench.to(lm_sample(s.vocab, 1, s.train_tokens))
    losses = {name: [] for name in built}

    def step(name):
        cfg, _, model, criterion = built[name]
        opt = optim.build_optimizer(cfg.optimizer, [p for p in model.train().parameters() if p.requires_grad])

        def run():
            opt.zero_grad()
            with bench.autocast():
                loss, sample_size, _ = criterion(model, sample)
            opt.backward(loss)
            opt.multiply_grads(1.0 / sample_size)
            opt.clip_grad_norm(cfg.optimization.clip_norm)
            opt.step()
            losses[name].append(loss.detach() / sample_size)

        return run

    warmup, ntok = 1 if s.small else 3, s.train_tokens
    t = bench.time({name: step(name) for name in built}, rounds=2 * bench.args.rounds, warmup=warmup)
    params = {n: millions(sum(p.numel() for p in built[n][2].parameters())) for n in built}
    rows = [[f"`{n}`", params[n], *t.columns(n, FAIRSEQ, ntok, True)] for n in (FAIRSEQ, OURS)]
    loss = {n: " ".join(f"{v.item():.1f}" for v in losses[n]) for n in built}
    columns = "model | parameters | step ms (median) | step ms (min) | page faults per step (median) | tokens/s | " + VS
    text = (
        f"## 2. Training: `{OURS}` vs fairseq's `{FAIRSEQ}` (V = {s.vocab:,}, 1 x {ntok} tokens)\n\n"
        f"Adaptive softmax {s.cutoff}, `--dropout 0`, weight-normalised convolutions; step as fairseq-train "
        f"(criterion, backward, gradients / sample size, clip 0.1, NAG lr 1, momentum 0.99, weight decay 5e-6); "
        f"the same Zipf-distributed batch every step; {2 * bench.args.rounds} rounds after {warmup} warm-up rounds "
        f"(the heap grows in the first steps). Loss per token at every step, warm-up included (nats; at NAG's "
        f"momentum 0.99 and lr 1 on one repeated batch the loss can rise for some steps before it falls): fairseq "
        f"{loss[FAIRSEQ]}; ours {loss[OURS]}.\n\n" + table(columns, rows)
    )
    return text, [bench.check(f"{OURS} vs {FAIRSEQ}, training tokens/s", t.speedup(FAIRSEQ, OURS), 1.0)]


def part_generate(bench: Bench, s):
    from fairseq.sequence_generator import SequenceGenerator

    built = bench.build(s.vocab, ADAPTIVE_LM, {FAIRSEQ: (FAIRSEQ, wt103_args(s)), OURS: (OURS, wt103_args(s))})
    for cfg, _, model, _ in built.values():
        model.prepare_for_inference_(cfg)  # as fairseq-generate: removes weight-norm hooks, eval mode
        model.eval()
    prefix, new, rows, checks = s.prefix, s.new_tokens, [], []
    for batch, beam in s.generate:
        src = zipf_tokens(torch.Generator().manual_seed(batch * 100 + beam), (batch, prefix), s.vocab)
        net_input = {"src_tokens": src, "src_lengths": torch.full((batch,), prefix)}
        sample = bench.to(dict(id=torch.arange(batch), nsentences=batch, target=None, net_input=net_input))
        outputs = {}

        def gen(name):
            _, task, model, _ = built[name]
            limits = dict(max_len_a=0, max_len_b=prefix + new, min_len=prefix + new)
            generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, **limits)

            def run():
                with bench.autocast():
                    outputs[name] = task.inference_step(generator, [model], sample)

            return run

        t = bench.time({name: gen(name) for name in built})
        for name, hypos in outputs.items():
            assert all(
                len(h[0]["tokens"]) == prefix + new + 1 and torch.equal(h[0]["tokens"][:prefix].cpu(), src[i])
                for i, h in enumerate(hypos)
            ), f"{name}: hypotheses do not continue the prefix to its length"
        label = f"batch {batch}, beam {beam}"
        rows += [[label if n == FAIRSEQ else "", f"`{n}`", *t.columns(n, FAIRSEQ, batch * new)] for n in built]
        what = f"{OURS} vs {FAIRSEQ}, generation tokens/s, batch {batch}, beam {beam}"
        checks.append(bench.check(what, t.speedup(FAIRSEQ, OURS), 1.0))
    columns = "batch, beam | model | ms per batch (median) | ms (min) | new tokens/s | " + VS
    return (
        f"## 3. Generation: fairseq's SequenceGenerator, `{OURS}` vs `{FAIRSEQ}`\n\n"
        f"`LanguageModelingTask.inference_step` on random {prefix}-token prefixes (fed one token at a time), then "
        f"{new} new tokens and EOS (forced: `min_len = max_len_b`); eval mode after `prepare_for_inference_`; "
        f"new tokens/s = batch x {new} / time.\n\n" + table(columns, rows)
    ), checks


def part_responsiveness(bench: Bench, s):
    from define_fairseq.tools.params import parameter_breakdown

    lstm = "lstm_lm_adaptive_wt103"
    archs = {"gcnn_lm_8": ("gcnn_lm_8", ["--dropout", "0", "--adaptive-softmax-cutoff", s.cutoff])}
    small = ["--adaptive-input-cutoff", s.cutoff, "--adaptive-softmax-cutoff", s.cutoff] if s.small else []
    for hidden, why in ((s.lstm_hidden, "total matched"), (s.lstm_hidden_body, "body matched")):
        archs[f"{lstm}, hidden {hidden} ({why})"] = (lstm, ["--decoder-hidden-size", str(hidden)] + small)
    built = bench.build(s.vocab, ADAPTIVE_LM, archs)
    for cfg, _, model, _ in built.values():
        model.prepare_for_inference_(cfg)  # as fairseq-eval-lm
        model.eval()
    sentence, long = (bench.to(lm_sample(s.vocab, 1, n, seed=i + 1)) for i, n in enumerate((20, s.long_tokens)))
    short = bench.time({n: bench.step(b[2], b[3], sentence) for n, b in built.items()}, rounds=4 * bench.args.rounds)
    longer = bench.time({n: bench.step(b[2], b[3], long) for n, b in built.items()})
    rows = []
    for n in built:
        counts = parameter_breakdown(built[n][2])
        row = [f"`{n}`", millions(counts["context"]), millions(counts["total"]), short.ms(n), short.per_s(n, 20)]
        rows.append(row + [longer.ms(n), longer.per_s(n, s.long_tokens), ratio(longer.speedup(n, "gcnn_lm_8"))])
    columns = "model | body (context) | total | one 20-token sentence: ms (median) | tokens/s (sentence) | one "
    columns += f"{s.long_tokens:,}-token sequence: ms (median) | tokens/s (sequence) | gcnn_lm_8's speed over this "
    columns += "model's (sequence)"
    return (
        f"## 4. Responsiveness (the paper's Table 4): one sequence at batch 1, `gcnn_lm_8` vs the LSTM LM\n\n"
        f"Scoring = forward + fairseq's `adaptive_loss`, eval mode, no autograd, after `prepare_for_inference_`. "
        f"The long sequence has {s.long_tokens:,} tokens (the paper's 15,000 with `--long-tokens 15000`).\n\n"
        + table(columns, rows)
    ), []


def main(argv=None):
    parser = options(__doc__, rounds=3)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}")
    parser.add_argument("--generate", default="8/1,8/5,1/1", help="part 3: batch/beam configurations")
    parser.add_argument("--long-tokens", type=int, default=2000, help="part 4: length of the long sequence")
    bench = Bench("benchmarks.gcnn_speed", parser, argv)
    args = bench.args
    parts = listed(parser, "--parts", args.parts, PARTS)
    try:
        generate = [tuple(int(v) for v in c.split("/")) for c in args.generate.split(",")]
    except ValueError:
        parser.error(f"--generate {args.generate}: give batch/beam pairs, e.g. 8/1,8/5")
    sizes = {**SIZES, "generate": generate, "long_tokens": args.long_tokens, **(QUICK if args.quick else {})}
    s = SimpleNamespace(**sizes)
    functions = dict(layers=part_layers, train=part_train, generate=part_generate, responsiveness=part_responsiveness)
    done = [functions[part](bench, s) for part in parts]  # (text, checks) of each part
    sections, checks = [text for text, _ in done], [c for _, part_checks in done for c in part_checks]
    return bench.finish("Gated convolutional LM (gcnn_lm): speed", [], "\n".join(sections), checks)


if __name__ == "__main__":
    run_main(main)
