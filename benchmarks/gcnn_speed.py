"""Speed of the gated convolutional LM (``gcnn_lm``) on CPU, in four parts, all from one run:

1. **Convolution layer**, forward + backward, at the layer shapes of GCNN-14 (in -> 2 x out channels: 850 ->
   2 x 850 with k = 6, 5, 4, 1; 850 -> 2 x 1024, k = 4; 1024 -> 2 x 2048, k = 4) on one block of 1024 tokens:
   ``F.conv1d`` in the ``[B, C, T]`` layout (oneDNN), ``torch.conv_tbc`` in ``[T, B, C]`` as fairseq's ``fconv``
   calls it (padded by k - 1 on both sides, the k - 1 future steps cut off), and the plugin's
   :class:`~define_fairseq.modules.gated_conv.CausalConv1d` (one GEMM over k stacked time steps, im2col, in
   ``[B, T, C]``). Plain weights for all three (no weight normalisation), input and weights require gradients.
2. **Training** tokens/s of ``gcnn_lm_14`` against fairseq's ``fconv_lm_dauphin_wikitext103`` (the same layer
   table) at the WikiText-103 size: a made-up dictionary of 267,735 symbols, adaptive softmax 10000,20000,200000
   with ``--criterion adaptive_loss``, ``--dropout 0`` for both (the arch default is 0 for ours, 0.1 for
   fairseq's), fairseq's recipe batch of one block of 1024 tokens (``--train-batches``). A step is what
   fairseq-train does: ``zero_grad``, fairseq's ``adaptive_loss`` criterion (forward and loss), backward, gradients
   divided by the sample size, clipped to norm 0.1, fairseq's NAG step (its conv LM recipe: lr 1, momentum 0.99,
   weight decay 5e-6). 2 x ``--rounds`` rounds after 3 warm-up rounds. Target: ours >= 1.0x fairseq's tokens/s.
3. **Generation** tokens/s with fairseq's ``SequenceGenerator`` through ``LanguageModelingTask.inference_step``
   (as fairseq-generate / fairseq-interactive run it: the prefix is fed one token at a time, then new tokens are
   decoded), greedy (beam 1) and beam 5, from batches of random prefixes, for the same two models in eval mode
   after ``prepare_for_inference_`` (which, as in fairseq-generate, removes fairseq's weight normalisation
   hooks). Ours keeps each layer's last k - 1 inputs; fairseq's ``LinearizedConvolution`` its input buffer.
   The length is forced (``min_len = max_len_b``), so both decode the same number of steps.
   Target: ours >= 1.0x fairseq's tokens/s.
4. **Responsiveness** as in the paper's Table 4 (one sequence at batch 1: a GCNN processes it in parallel over
   time, an LSTM step by step): ``gcnn_lm_8`` against the project's LSTM LM (``lstm_lm_adaptive_wt103``: adaptive
   input, 4 LSTM layers, tied adaptive softmax) with ``--decoder-hidden-size`` set so that the total parameter
   counts are close (and a second LSTM whose body matches the GCNN's body). Scoring = forward pass + fairseq's
   ``adaptive_loss`` (the negative log-probabilities of the targets, summed), eval mode, ``torch.no_grad``:
   (a) one 20-token sentence, (b) one long contiguous sequence (2,000 tokens by default instead of the paper's
   15,000, to keep the run short: per token, both models cost the same at either length).

Every part runs in a fresh child process (its own heap), with glibc's malloc told to keep and reuse freed memory
(``--allocator glibc-retain``, as ``benchmarks.train_speed`` describes); ``--allocator glibc`` turns that
off, ``--allocator tcmalloc`` preloads tcmalloc instead. Variants are timed interleaved
(``benchmarks.common.interleaved``); figures are medians over rounds.

    .venv/bin/python -m benchmarks.gcnn_speed [--rounds 3] [--threads 2] [--quick]

``--quick`` is a smoke test (tiny batches and sequences, one round; under a minute): it prints its tables but
does not write ``benchmarks/results/gcnn_speed.md``; neither does a run of only some ``--parts``.
"""

import argparse
import json
import sys
import tempfile
import time
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F

from benchmarks.common import (ALLOCATORS, allocator_note, check_allocator_loaded, counting_faults, current_allocator,
                               header, interleaved, median, paired_ratio, parse_choices, require_allocators,
                               run_child_json, set_threads, strip_option, table, write_result, zipf_tokens)

PARTS = ("layers", "train", "generate", "responsiveness")
WT103_VOCAB = 267735
WT103_CUTOFF = "10000,20000,200000"
OURS, FAIRSEQ = "gcnn_lm_14", "fconv_lm_dauphin_wikitext103"
LABELS = {OURS: f"`{OURS}` (ours)", FAIRSEQ: f"fairseq `{FAIRSEQ}`"}

# GCNN-14's convolutions: (input channels, output channels before the GLU halves them, kernel, layers of the kind)
LAYER_SHAPES = [(850, 1700, 6, 3), (850, 1700, 5, 4), (850, 1700, 4, 3), (850, 1700, 1, 2), (850, 2048, 4, 1),
                (1024, 4096, 4, 1)]
CONV_VARIANTS = ("F.conv1d [B, C, T]", "torch.conv_tbc [T, B, C] (fairseq)", "CausalConv1d [B, T, C] (ours)")


def settings(args) -> dict:
    """Sizes of every part, full run or ``--quick``."""
    if args.quick:
        return {"layer_tokens": 128, "train_batches": [(1, 32)], "gen_configs": [(1, 2)], "prefix": 2,
                "new_tokens": 2, "sentence": 20, "long_tokens": 50, "rounds": 1, "sentence_rounds": 1, "warmup": 0,
                "train_rounds": 1, "train_warmup": 0}
    batches = [tuple(int(v) for v in shape.lower().split("x")) for shape in args.train_batches.split(",")]
    configs = [tuple(int(v) for v in c.lower().split("/")) for c in args.generate.split(",")]
    return {"layer_tokens": args.layer_tokens, "train_batches": batches, "gen_configs": configs,
            "prefix": args.prefix, "new_tokens": args.new_tokens, "sentence": 20, "long_tokens": args.long_tokens,
            "rounds": args.rounds, "sentence_rounds": 4 * args.rounds, "warmup": 1,
            "train_rounds": 2 * args.rounds, "train_warmup": 3}


# -- models --------------------------------------------------------------------------------------------------

def build_lm(data: str, arch: str, extra: Sequence[str]):
    """``(cfg, task, model, criterion)`` of ``--arch arch`` as fairseq-train builds them (``adaptive_loss``)."""
    import define_fairseq  # noqa: F401  (registers the plugin's models)
    from define_fairseq.tools.params import setup_from_train_args

    cfg, task, model = setup_from_train_args([
        data, "--user-dir", "define_fairseq", "--task", "language_modeling", "--arch", arch,
        "--criterion", "adaptive_loss", "--ddp-backend", "legacy_ddp", "--cpu", *extra])
    return cfg, task, model, task.build_criterion(cfg.criterion)


def breakdown(model) -> Dict[str, int]:
    from define_fairseq.tools.params import parameter_breakdown

    return parameter_breakdown(model)


def lm_sample(vocab: int, batch: int, length: int, seed: int = 0) -> dict:
    """A language-modelling batch of Zipf-distributed tokens: ``src_tokens [batch, length]`` and the targets, the
    same streams shifted by one."""
    g = torch.Generator().manual_seed(seed)
    stream = zipf_tokens(g, (batch, length + 1), vocab)
    return {"id": torch.arange(batch), "nsentences": batch, "ntokens": batch * length,
            "net_input": {"src_tokens": stream[:, :-1].contiguous(), "src_lengths": torch.full((batch,), length)},
            "target": stream[:, 1:].contiguous()}


def wt103_models(data: str, arch_extra: Dict[str, Tuple[str, List[str]]]):
    """``{name: (cfg, task, model, criterion)}``, each built from the same seed."""
    built = {}
    for name, (arch, extra) in arch_extra.items():
        torch.manual_seed(1)
        built[name] = build_lm(data, arch, extra)
    return built


def comparison_args() -> List[str]:
    return ["--dropout", "0", "--adaptive-softmax-cutoff", WT103_CUTOFF, "--tokens-per-sample", "1024"]


# -- 1. convolution layers -----------------------------------------------------------------------------------

def conv_callables(cin: int, cout: int, k: int, tokens: int):
    """Forward + backward of the three implementations of one causal convolution on ``tokens`` time steps."""
    from define_fairseq.modules.gated_conv import CausalConv1d

    g = torch.Generator().manual_seed(0)
    scale = (cin * k) ** -0.5
    x_btc = torch.randn(1, tokens, cin, generator=g)
    grad_btc = torch.randn(1, tokens, cout, generator=g)
    w = torch.randn(cout, cin, k, generator=g) * scale  # [out, in, k], k = time offset from the oldest input
    bias = torch.zeros(cout)

    # F.conv1d, [B, C, T]
    x1 = x_btc.transpose(1, 2).contiguous().requires_grad_()
    w1, b1 = w.clone().requires_grad_(), bias.clone().requires_grad_()
    grad1 = grad_btc.transpose(1, 2).contiguous()

    # torch.conv_tbc, [T, B, C], weight [k, in, out]: fairseq pads both sides and drops the last k - 1 outputs
    x2 = x_btc.transpose(0, 1).contiguous().requires_grad_()
    w2, b2 = w.permute(2, 1, 0).contiguous().requires_grad_(), bias.clone().requires_grad_()
    grad2 = grad_btc.transpose(0, 1).contiguous()

    # CausalConv1d, [B, T, C], weight [out, k * in], column block j = input k - 1 - j steps back
    conv = CausalConv1d(cin, cout, k, weight_norm=False)
    with torch.no_grad():
        conv.weight.copy_(w.permute(0, 2, 1).reshape(cout, k * cin))
    x3 = x_btc.clone().requires_grad_()

    def conv1d():
        x1.grad = w1.grad = b1.grad = None
        y = F.conv1d(F.pad(x1, (k - 1, 0)), w1, b1)
        y.backward(grad1)

    def conv_tbc():
        x2.grad = w2.grad = b2.grad = None
        y = torch.conv_tbc(x2, w2, b2, k - 1)
        if k > 1:
            y = y[:-(k - 1)]
        y.backward(grad2)

    def ours():
        x3.grad = None
        conv.zero_grad(set_to_none=True)
        conv(x3).backward(grad_btc)

    with torch.no_grad():  # the three compute the same convolution
        ref = F.conv1d(F.pad(x1, (k - 1, 0)), w1, b1).transpose(1, 2)
        tbc = torch.conv_tbc(x2, w2, b2, k - 1)[:tokens].transpose(0, 1)
        assert torch.allclose(ref, tbc, atol=1e-4) and torch.allclose(ref, conv(x3), atol=1e-4)
    return dict(zip(CONV_VARIANTS, (conv1d, conv_tbc, ours)))


def part_layers(args, s) -> dict:
    tokens, rows = s["layer_tokens"], []
    for cin, cout, k, count in LAYER_SHAPES:
        print(f"[layers] {cin} -> {cout}, k={k}", file=sys.stderr, flush=True)
        times = interleaved(conv_callables(cin, cout, k, tokens), rounds=s["rounds"] + 2, warmup=s["warmup"], log=True)
        rows.append({"shape": [cin, cout, k, count], "times": times})
    return {"tokens": tokens, "rows": rows}


# -- 2. training --------------------------------------------------------------------------------------------------

def part_train(args, s) -> dict:
    from fairseq import optim

    with tempfile.TemporaryDirectory() as data:
        from define_fairseq.tools.params import write_dictionaries

        write_dictionaries(data, WT103_VOCAB)
        train_args = comparison_args() + ["--optimizer", "nag", "--lr", "1.0", "--momentum", "0.99",
                                          "--weight-decay", "5e-06", "--clip-norm", "0.1"]
        built = wt103_models(data, {FAIRSEQ: (FAIRSEQ, train_args), OURS: (OURS, train_args)})
    optimizers, losses, at_init = {}, {name: [] for name in built}, {}
    probe = lm_sample(WT103_VOCAB, *s["train_batches"][0], seed=3)
    for name, (cfg, _, model, criterion) in built.items():
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizers[name] = optim.build_optimizer(cfg.optimizer, params)
        clip = cfg.optimization.clip_norm
        with torch.no_grad():  # the scale of the model's output and its loss before any update
            features = model(**probe["net_input"])[0]
            loss, sample_size, _ = criterion(model, probe)
        at_init[name] = {"features_std": features.std().item(), "loss": loss.item() / sample_size}

    def step(name, sample):
        _, _, model, criterion = built[name]
        opt = optimizers[name]

        def run():
            opt.zero_grad()
            loss, sample_size, _ = criterion(model, sample)
            opt.backward(loss)
            opt.multiply_grads(1.0 / sample_size)
            opt.clip_grad_norm(clip)
            opt.step()
            losses[name].append(loss.item() / sample_size)
        return run

    results = []
    for batch, length in s["train_batches"]:
        print(f"[train] batch {batch} x {length}", file=sys.stderr, flush=True)
        sample = lm_sample(WT103_VOCAB, batch, length)
        calls, faults = counting_faults({name: step(name, sample) for name in built})
        times = interleaved(calls, rounds=s["train_rounds"], warmup=s["train_warmup"], log=True)
        results.append({"batch": [batch, length], "times": times,
                        "faults": {name: f[s["train_warmup"]:] for name, f in faults.items()}})
    return {"results": results, "params": {name: breakdown(b[2]) for name, b in built.items()},
            "losses": losses, "at_init": at_init, "clip": clip, "probe": list(s["train_batches"][0]),
            "rounds": s["train_rounds"], "warmup": s["train_warmup"],
            "lr": float(built[OURS][0].optimization.lr[0])}


# -- 3. generation ------------------------------------------------------------------------------------------------

def part_generate(args, s) -> dict:
    from fairseq.sequence_generator import SequenceGenerator

    with tempfile.TemporaryDirectory() as data:
        from define_fairseq.tools.params import write_dictionaries

        write_dictionaries(data, WT103_VOCAB)
        built = wt103_models(data, {OURS: (OURS, comparison_args()), FAIRSEQ: (FAIRSEQ, comparison_args())})
    for cfg, _, model, _ in built.values():
        model.prepare_for_inference_(cfg)  # as fairseq-generate: removes weight-norm hooks, eval mode
        model.eval()
    prefix, new = s["prefix"], s["new_tokens"]
    length = prefix + new
    results = []
    for batch, beam in s["gen_configs"]:
        print(f"[generate] batch {batch}, beam {beam}", file=sys.stderr, flush=True)
        g = torch.Generator().manual_seed(batch * 100 + beam)
        src = zipf_tokens(g, (batch, prefix), WT103_VOCAB)
        sample = {"id": torch.arange(batch), "nsentences": batch,
                  "net_input": {"src_tokens": src, "src_lengths": torch.full((batch,), prefix)}, "target": None}
        outputs = {}

        def gen(name):
            _, task, model, _ = built[name]
            generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=0,
                                          max_len_b=length, min_len=length)

            def run():
                outputs[name] = task.inference_step(generator, [model], sample)
            return run

        times = interleaved({name: gen(name) for name in built}, rounds=s["rounds"], warmup=s["warmup"], log=True)
        for name, hypos in outputs.items():
            got = [len(h[0]["tokens"]) for h in hypos]
            assert got == [length + 1] * batch, f"{name}: hypotheses of {got} tokens, expected {length + 1}"
            assert all(torch.equal(h[0]["tokens"][:prefix], src[i]) for i, h in enumerate(hypos)), name
        results.append({"batch": batch, "beam": beam, "times": times})
    return {"results": results, "prefix": prefix, "new_tokens": new}


# -- 4. responsiveness --------------------------------------------------------------------------------------------

def part_responsiveness(args, s) -> dict:
    lstm = "lstm_lm_adaptive_wt103"
    variants = {"gcnn_lm_8": ("gcnn_lm_8", ["--dropout", "0"])}
    for hidden, why in ((args.lstm_hidden, "total matched"), (args.lstm_hidden_body, "body matched")):
        variants[f"{lstm}, hidden {hidden} ({why})"] = (lstm, ["--decoder-hidden-size", str(hidden)])
    with tempfile.TemporaryDirectory() as data:
        from define_fairseq.tools.params import write_dictionaries

        write_dictionaries(data, WT103_VOCAB)
        built = wt103_models(data, variants)
    for cfg, _, model, _ in built.values():
        model.prepare_for_inference_(cfg)  # as fairseq-eval-lm
        model.eval()

    def score(name, sample):
        _, _, model, criterion = built[name]

        def run():
            with torch.no_grad():
                loss, _, _ = criterion(model, sample)
            assert torch.isfinite(loss)
        return run

    sentence = lm_sample(WT103_VOCAB, 1, s["sentence"], seed=1)
    long = lm_sample(WT103_VOCAB, 1, s["long_tokens"], seed=2)
    print(f"[responsiveness] one {s['sentence']}-token sentence", file=sys.stderr, flush=True)
    short_times = interleaved({n: score(n, sentence) for n in built}, rounds=s["sentence_rounds"], warmup=s["warmup"])
    print(f"[responsiveness] one {s['long_tokens']}-token sequence", file=sys.stderr, flush=True)
    long_times = interleaved({n: score(n, long) for n in built}, rounds=s["rounds"], warmup=s["warmup"], log=True)
    return {"sentence": s["sentence"], "long_tokens": s["long_tokens"], "short": short_times, "long": long_times,
            "params": {name: breakdown(b[2]) for name, b in built.items()},
            "args": {name: " ".join(extra) for name, (_, extra) in variants.items()}}


PART_FUNCTIONS = {"layers": part_layers, "train": part_train, "generate": part_generate,
                  "responsiveness": part_responsiveness}


# -- running the parts in child processes -------------------------------------------------------------------------

def run_part_in_child(part: str, allocator: str, argv: List[str]) -> dict:
    return run_child_json("benchmarks.gcnn_speed", [*argv, "--child-part", part], allocator)


# -- rendering ----------------------------------------------------------------------------------------------------

def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f}" if seconds >= 0.1 else f"{seconds * 1e3:.1f}"


def millions(n: int) -> str:
    return f"{n / 1e6:.2f} M"


def render_layers(res) -> Tuple[str, List[str]]:
    tokens, rows = res["tokens"], []
    base = CONV_VARIANTS[1]
    totals = {v: 0.0 for v in CONV_VARIANTS}
    for row in res["rows"]:
        cin, cout, k, count = row["shape"]
        times = row["times"]
        flops = 3 * 2 * tokens * k * cin * cout  # forward, input gradient, weight gradient
        for v in CONV_VARIANTS:
            t = median(times[v])
            totals[v] += count * t
            rows.append([f"{cin} -> {cout} (= 2 x {cout // 2}), k={k}" if v == CONV_VARIANTS[0] else "", f"`{v}`",
                         ms(t), ms(min(times[v])), f"{flops / t / 1e9:.0f}", f"{median(times[base]) / t:.2f}x",
                         f"{paired_ratio(times, base, v):.2f}x"])
    for v in CONV_VARIANTS:
        rows.append(["**GCNN-14's 14 layers** (sum of medians x layers of each shape)" if v == CONV_VARIANTS[0]
                     else "", f"`{v}`", ms(totals[v]), "", "", f"{totals[base] / totals[v]:.2f}x", ""])
    text = (f"## 1. Causal convolution layers of GCNN-14, forward + backward, 1 x {tokens} tokens\n\n"
            "Input and weights require gradients; the output gradient is given; plain weights (no weight "
            "normalisation) for all three; the three outputs are checked equal. GFLOP/s counts 3 x 2 x T x k x "
            "in x out (forward, input and weight gradients).\n\n"
            + table(["layer (in -> out channels)", "implementation", "ms (median)", "ms (min)", "GFLOP/s",
                     "speed vs conv_tbc (ratio of medians)", "(median of per-round ratios)"], rows))
    ours, conv1d = totals[base] / totals[CONV_VARIANTS[2]], totals[base] / totals[CONV_VARIANTS[0]]
    notes = [f"- Layers (no target): over GCNN-14's 14 convolutions, CausalConv1d runs at {ours:.2f}x the speed of "
             f"torch.conv_tbc, F.conv1d at {conv1d:.2f}x."]
    return text, notes


def render_train(res) -> Tuple[str, List[str]]:
    names = [FAIRSEQ, OURS]
    rows, notes = [], []
    for r in res["results"]:
        batch, length = r["batch"]
        times, ntok = r["times"], batch * length
        for name in names:
            t = median(times[name])
            faults = r["faults"][name]
            rows.append([f"{batch} x {length}" if name == names[0] else "", LABELS[name], ms(t), ms(min(times[name])),
                         ms(max(times[name])), f"{median(faults):.0f} ({max(faults)})", f"{ntok / t:.0f}",
                         f"{median(times[FAIRSEQ]) / t:.2f}x", f"{paired_ratio(times, FAIRSEQ, name):.2f}x"])
        ratio = median(times[FAIRSEQ]) / median(times[OURS])
        notes.append(f"- {'PASS' if ratio >= 1.0 else 'FAIL'} (training, batch {batch} x {length}): gcnn_lm_14 "
                     f"tokens/s >= 1.0x fconv_lm_dauphin_wikitext103: {ratio:.2f}x (ratio of medians; median of "
                     f"per-round ratios {paired_ratio(times, FAIRSEQ, OURS):.2f}x)")
    finite = all(all(v == v and abs(v) != float("inf") for v in losses) for losses in res["losses"].values())
    init_rows = [[LABELS[n], f"{res['at_init'][n]['features_std']:.2f}", f"{res['at_init'][n]['loss']:.1f}",
                  f"{res['losses'][n][-1]:.1f}" if res["losses"][n] else ""] for n in names]
    param_rows = [[LABELS[n], millions(c["context"]), millions(c["input/output"]), millions(c["total"])]
                  for n, c in ((n, res["params"][n]) for n in names)]
    probe = res["probe"]
    text = (f"## 2. Training: `{OURS}` vs fairseq's `{FAIRSEQ}` (V = {WT103_VOCAB:,})\n\n"
            f"Both: adaptive softmax {WT103_CUTOFF} (`--criterion adaptive_loss`), `--dropout 0` (ours' default; "
            f"fairseq's arch default is 0.1 and its recipe uses 0.2: overridden), weight-normalised convolutions. "
            f"Step as fairseq-train: `zero_grad`, criterion (forward + adaptive loss), backward, gradients / sample "
            f"size, clip to norm {res['clip']}, fairseq's NAG (fairseq's conv LM recipe: lr {res['lr']}, momentum "
            f"0.99, weight decay 5e-6). Random Zipf-distributed tokens, the same batch every step. "
            f"{res['rounds']} interleaved rounds after {res['warmup']} warm-up rounds (the heap keeps growing for the "
            f"first steps: the page faults of a step, i.e. memory touched for the first time, are listed).\n\n"
            + table(["model", "body (context)", "input/output", "total"], param_rows)
            + "\nfairseq's body includes its `fc1` (280 -> 850 before the first convolution, whose input is 850); "
              "ours convolves the 280-wide lookup directly and puts a 280 -> 850 projection on the first block's "
              "skip instead.\n\n"
            + f"Scale of each model before training (a fresh {probe[0]} x {probe[1]} batch, no update; a uniform "
              f"prediction scores ln {WT103_VOCAB:,} = 12.5 nats) and after the timed steps "
              f"({'all losses finite' if finite else '**a loss was not finite**'}). Both start at the same scale, so "
              f"neither pays for denormal floats in its softmax gradients:\n\n"
            + table(["model", "std of the features given to the softmax, at init", "loss per token at init (nats)",
                     "loss per token after the last timed step"], init_rows)
            + "\n"
            + table(["batch", "model", "step ms (median)", "step ms (min)", "step ms (max)",
                     "page faults per step: median (max)", "tokens/s", "vs fairseq (ratio of medians)",
                     "(median of per-round ratios)"], rows))
    return text, notes


def render_generate(res) -> Tuple[str, List[str]]:
    labels = LABELS
    prefix, new = res["prefix"], res["new_tokens"]
    rows, notes = [], []
    for r in res["results"]:
        batch, beam, times = r["batch"], r["beam"], r["times"]
        for name in (FAIRSEQ, OURS):
            t = median(times[name])
            rows.append([f"batch {batch}, beam {beam}" if name == FAIRSEQ else "", labels[name], ms(t),
                         ms(min(times[name])), f"{batch * new / t:.0f}", f"{batch * (prefix + new + 1) / t:.0f}",
                         f"{median(times[FAIRSEQ]) / t:.2f}x", f"{paired_ratio(times, FAIRSEQ, name):.2f}x"])
        ratio = median(times[FAIRSEQ]) / median(times[OURS])
        notes.append(f"- {'PASS' if ratio >= 1.0 else 'FAIL'} (generation, batch {batch}, beam {beam}): gcnn_lm_14 "
                     f"tokens/s >= 1.0x fconv_lm_dauphin_wikitext103: {ratio:.2f}x (ratio of medians; median of "
                     f"per-round ratios {paired_ratio(times, FAIRSEQ, OURS):.2f}x)")
    text = (f"## 3. Generation: fairseq's SequenceGenerator, `{OURS}` vs `{FAIRSEQ}`\n\n"
            f"`LanguageModelingTask.inference_step` on a batch of random {prefix}-token prefixes (fed one token at a "
            f"time, as fairseq does), then {new} new tokens and EOS, forced with `min_len = max_len_b = "
            f"{prefix + new}`: {prefix + new + 1} decoder steps per batch, each with the full adaptive-softmax "
            f"log-probabilities over the {WT103_VOCAB:,} words. Models as in part 2, in eval mode after "
            f"`prepare_for_inference_` (fairseq-generate's call; it removes fairseq's weight-norm hooks). "
            f"new tokens/s = batch x {new} / time; decoded positions/s counts every decoded position (prefix, new "
            f"tokens, EOS) of every sentence.\n\n"
            + table(["batch, beam", "model", "ms per batch (median)", "ms (min)", "new tokens/s",
                     "decoded positions/s", "vs fairseq (ratio of medians)", "(median of per-round ratios)"], rows))
    return text, notes


def render_responsiveness(res, args) -> Tuple[str, List[str]]:
    names = list(res["params"])
    gcnn = names[0]
    labels = {n: f"`{n}`" for n in names}
    n_short, n_long = res["sentence"], res["long_tokens"]
    rows = []
    for name in names:
        ts, tl = median(res["short"][name]), median(res["long"][name])
        rows.append([labels[name], f"`{res['args'][name]}`", millions(res["params"][name]["context"]),
                     millions(res["params"][name]["total"]), ms(ts), f"{n_short / ts:.0f}", ms(tl),
                     f"{n_long / tl:.0f}", f"{tl / median(res['long'][gcnn]):.1f}x"])
    long_note = ("" if n_long >= 15000 else
                 f" The paper's long sequence has 15,000 tokens; this run uses {n_long:,} (`--long-tokens`) to keep "
                 f"it short: the cost per token of both models does not depend on the length at these lengths (the "
                 f"LSTM runs one step per token, the GCNN's matrix products are large already).")
    text = (f"## 4. Responsiveness (the paper's Table 4): one sequence at batch 1, `gcnn_lm_8` vs the LSTM LM\n\n"
            f"Scoring = forward + fairseq's `adaptive_loss` (negative log-probabilities of the targets, summed), "
            f"eval mode, `torch.no_grad`, after `prepare_for_inference_`; V = {WT103_VOCAB:,}. The LSTM is "
            f"`lstm_lm_adaptive_wt103` (adaptive input 256, 4 LSTM layers, the last of 256, tied adaptive softmax "
            f"20000,40000,200000) with `--decoder-hidden-size` set so that its total parameter count is close to "
            f"gcnn_lm_8's (`--lstm-hidden`), and once so that its body is (`--lstm-hidden-body`); gcnn_lm_8 has most "
            f"of its parameters in its 267,735 x 280 lookup and its adaptive softmax, the LSTM in its body.{long_note}"
            f"\n\n"
            + table(["model", "flags", "body (context)", "total", f"one {n_short}-token sentence: ms (median)",
                     f"tokens/s ({n_short}-token sentence)", f"one {n_long:,}-token sequence: ms (median)",
                     f"tokens/s ({n_long:,} tokens)", f"time vs gcnn_lm_8 ({n_long:,} tokens)"], rows))
    notes = []
    for name in names[1:]:
        short = median(res["short"][name]) / median(res["short"][gcnn])
        longr = median(res["long"][name]) / median(res["long"][gcnn])
        notes.append(f"- Responsiveness (no target): gcnn_lm_8 scores a {n_short}-token sentence {short:.1f}x and a "
                     f"{n_long:,}-token sequence {longr:.1f}x as fast as {name}.")
    return text, notes


def render(args, results: dict, s: dict) -> str:
    sections, notes = [], []
    for part in PARTS:
        if part not in results:
            continue
        if part == "layers":
            text, n = render_layers(results[part])
        elif part == "train":
            text, n = render_train(results[part])
        elif part == "generate":
            text, n = render_generate(results[part])
        else:
            text, n = render_responsiveness(results[part], args)
        sections.append(text)
        notes += n
    alloc = allocator_note(args.allocator)
    head = header("Gated convolutional LM (gcnn_lm): speed on CPU", "benchmarks.gcnn_speed", [
        f"Each part runs in a fresh child process, one after the other; allocator {alloc}",
        f"Interleaved rounds after warm-up rounds: layers {s['rounds'] + 2} after {s['warmup']}; training "
        f"{s['train_rounds']} after {s['train_warmup']}; generation and the long sequence {s['rounds']} after "
        f"{s['warmup']}; the 20-token sentence {s['sentence_rounds']} after {s['warmup']}"
        + (" (**--quick smoke test: tiny sizes, not a measurement**)" if args.quick else ""),
    ])
    return head + "\n" + "\n".join(sections) + "\n## Targets and findings\n\n" + "\n".join(notes) + "\n"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per comparison (median reported)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smoke test: tiny sizes, one round, no results file")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated parts to run, of {', '.join(PARTS)} (a subset writes no results file)")
    parser.add_argument("--allocator", default="glibc-retain", choices=ALLOCATORS)
    parser.add_argument("--layer-tokens", type=int, default=1024, help="part 1: time steps (batch 1)")
    parser.add_argument("--train-batches", default="1x1024", help="part 2: batches, BxT, comma-separated")
    parser.add_argument("--generate", default="8/1,8/5,1/1",
                        help="part 3: batch/beam configurations, comma-separated")
    parser.add_argument("--prefix", type=int, default=8, help="part 3: prefix tokens")
    parser.add_argument("--new-tokens", type=int, default=32, help="part 3: tokens generated after the prefix")
    parser.add_argument("--long-tokens", type=int, default=2000, help="part 4: length of the long sequence")
    parser.add_argument("--lstm-hidden", type=int, default=2434,
                        help="part 4: LSTM hidden size (2434: total parameters close to gcnn_lm_8's)")
    parser.add_argument("--lstm-hidden-body", type=int, default=1324,
                        help="part 4: hidden size of the second LSTM (1324: body close to gcnn_lm_8's)")
    parser.add_argument("--child-part", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--child-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    s = settings(args)

    if args.child_part:
        check_allocator_loaded(current_allocator())
        set_threads(args.threads)
        import logging
        import warnings

        logging.disable(logging.WARNING)  # fairseq's model-building chatter
        warnings.filterwarnings("ignore", category=FutureWarning)  # torch.nn.utils.weight_norm in fairseq's fconv
        result = PART_FUNCTIONS[args.child_part](args, s)
        with open(args.child_json, "w", encoding="utf-8") as f:
            json.dump(result, f)
        return

    parts = parse_choices(parser, "--parts", args.parts, PARTS)
    require_allocators(parser, [args.allocator])  # a missing library stops the run before any measuring
    child_argv = strip_option(strip_option(argv, "--parts"), "--allocator")
    results = {}
    for part in parts:
        print(f"== part {part} (fresh process, allocator {args.allocator})", file=sys.stderr, flush=True)
        start = time.perf_counter()
        results[part] = run_part_in_child(part, args.allocator, child_argv)
        print(f"== part {part}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    set_threads(args.threads)  # for the header
    text = render(args, results, s)
    if args.quick or len(parts) < len(PARTS):
        print(text)
        print("(--quick or a subset of --parts: benchmarks/results/gcnn_speed.md not written)")
    else:
        write_result("gcnn_speed", text)


if __name__ == "__main__":
    main()
