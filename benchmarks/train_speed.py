"""Training speed (forward, backward, Adam step) of ``transformer_define`` vs fairseq's ``transformer``, CPU.

Both models are the registered fairseq archs built through fairseq's parser: d_model 512, FFN 2048, 8 heads,
dropout 0.1, vocabulary 32k per side, decoder output tied to its input embedding (``transformer`` with
``--share-decoder-input-output-embed``; ``transformer_define`` ties it to the ``V x n`` table by default).
A third variant is ``transformer_define`` with ``unique_tokens=False`` on its embeddings (DeFINE run on every
position instead of once per distinct token of the batch), to show whether the unique-token path pays off.

The batch is one fixed batch of random sentences (lengths drawn uniformly in a realistic range, tokens drawn
Zipf-like so the batch has a realistic count of distinct tokens), loss = fairseq's label-smoothed cross-entropy
(0.1). Every step is: forward, loss, backward, ``torch.optim.Adam`` step. Steps are timed interleaved.

The comparison runs once per allocator (``--allocators``), each time in a fresh child process:

* ``glibc``: glibc's defaults. Every buffer over the (dynamic) mmap threshold, i.e. each of the
  3000 x 32000 logits-sized buffers of 384 MB, is a fresh ``mmap`` that the kernel fills page by page with
  minor page faults on first touch, and is unmapped again when freed.
* ``glibc-retain``: ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_TOP_PAD_`` raised, so
  malloc keeps freed memory in its heap and reuses it, as far as its fragmentation allows.
* ``tcmalloc``: gperftools' tcmalloc preloaded (PyTorch's CPU performance guide recommends it or jemalloc), with
  ``TCMALLOC_RELEASE_RATE=0`` so that freed memory is kept for the next step. Its steps take (almost) no page
  faults: this is the steady-state cost of the two models.

Both models run under the same allocator in a run; the table also gives the minor page faults per step.

Target: transformer_define >= 1.1x the tokens/s of transformer.

    .venv/bin/python -m benchmarks.train_speed [--layers 6] [--sentences 112] [--rounds 5] [--threads 2]
        [--allocators glibc,tcmalloc]
"""

import argparse
import copy
import json
import sys

import torch

from benchmarks.common import (
    ALLOCATORS,
    allocator_note,
    check_allocator_loaded,
    build_define_and_baseline,
    count_params,
    counting_faults,
    current_allocator,
    fmt_params,
    header,
    interleaved,
    median,
    paired_ratio,
    parse_choices,
    require_allocators,
    run_child_json,
    set_threads,
    strip_option,
    table,
    write_result,
    zipf_tokens,
)


def make_batch(task, sentences: int, min_len: int, max_len: int, exponent: float, seed: int = 0):
    """A fairseq translation sample: left-padded source, right-padded target, each sentence ending in EOS."""
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    pad, eos = tgt_dict.pad(), tgt_dict.eos()
    g = torch.Generator().manual_seed(seed)
    src_lens = torch.randint(min_len, max_len + 1, (sentences,), generator=g)
    tgt_lens = torch.randint(min_len, max_len + 1, (sentences,), generator=g)
    src_words = zipf_tokens(g, (sentences, max_len), len(src_dict), src_dict.nspecial, exponent)
    tgt_words = zipf_tokens(g, (sentences, max_len), len(tgt_dict), tgt_dict.nspecial, exponent)
    width = max_len + 1
    src = torch.full((sentences, width), pad, dtype=torch.long)
    target = torch.full((sentences, width), pad, dtype=torch.long)
    prev = torch.full((sentences, width), pad, dtype=torch.long)
    for b in range(sentences):
        s, t = int(src_lens[b]), int(tgt_lens[b])
        src[b, width - s - 1:width - 1] = src_words[b, :s]  # left padding, as fairseq's default
        src[b, width - 1] = eos
        target[b, :t] = tgt_words[b, :t]
        target[b, t] = eos
        prev[b, 0] = eos  # decoder input: EOS moved to the front
        prev[b, 1:t + 1] = tgt_words[b, :t]
    ntokens = int(target.ne(pad).sum())
    sample = {
        "id": torch.arange(sentences),
        "nsentences": sentences,
        "ntokens": ntokens,
        "net_input": {"src_tokens": src, "src_lengths": src_lens + 1, "prev_output_tokens": prev},
        "target": target,
    }
    return sample


def define_embeddings(model):
    from define_fairseq.modules import DeFINEEmbedding

    return [m for m in model.modules() if isinstance(m, DeFINEEmbedding)]


MODELS = ("transformer", "transformer_define", "transformer_define, unique_tokens=False")


def measure(args) -> dict:
    """Time the three models interleaved in this process; returns times, page faults and the batch's figures."""
    set_threads(args.threads)
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    define, baseline, task = build_define_and_baseline(args.layers)
    per_position = copy.deepcopy(define)
    for emb in define_embeddings(per_position):
        emb.unique_tokens = False
    assert all(emb.unique_tokens for emb in define_embeddings(define)) and define_embeddings(define)
    models = dict(zip(MODELS, (baseline, define, per_position)))

    criterion = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    sample = make_batch(task, args.sentences, args.min_len, args.max_len, args.zipf)
    src, tgt = sample["net_input"]["src_tokens"], sample["target"]
    pad = task.target_dictionary.pad()

    optimizers = {}
    for name, model in models.items():
        model.train()
        optimizers[name] = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-8)

    def step(name):
        model, opt = models[name], optimizers[name]

        def run():
            opt.zero_grad(set_to_none=True)
            loss, _, _ = criterion(model, sample)
            loss.backward()
            opt.step()
        return run

    calls, faults = counting_faults({name: step(name) for name in models})
    times = interleaved(calls, rounds=args.rounds, warmup=args.warmup, log=True)
    return {
        "times": times,
        "faults": {name: f[args.warmup:] for name, f in faults.items()},
        "params": {name: count_params(m) for name, m in models.items()},
        "embed_params": {name: sum(p.numel() for n, p in m.named_parameters() if "embed_tokens" in n)
                         for name, m in models.items()},
        "ntokens": sample["ntokens"],
        "src_tokens": int(src.ne(pad).sum()),
        "distinct_src": int(src[src.ne(pad)].unique().numel()),
        "distinct_tgt": int(tgt[tgt.ne(pad)].unique().numel()),
    }


def measure_in_child(allocator: str, argv) -> dict:
    """Run :func:`measure` in a fresh interpreter whose environment carries the allocator's settings."""
    print(f"[{allocator_note(allocator)}]", file=sys.stderr, flush=True)
    return run_child_json("benchmarks.train_speed", argv, allocator)


def render(args, results: dict) -> str:
    first = next(iter(results.values()))
    ntok = first["ntokens"]
    layer_note = ("6 + 6 layers (Transformer base)" if args.layers == 6 else
                  f"**{args.layers} + {args.layers} layers (reduced from base's 6 + 6 to keep the run short on 2 "
                  f"cores; both models use the same)**")
    allocator_notes = [allocator_note(name) for name in results]
    text = header("Training speed: transformer_define vs transformer", "benchmarks.train_speed", [
        f"Models: d_model 512, FFN 2048, 8 heads, {layer_note}, dropout 0.1, vocabulary 32000 per side (separate "
        f"source/target dictionaries), decoder output tied to the decoder input embedding; transformer_define: "
        f"DeFINE n=128, k=1024, depth 3, 4 groups at most, output tied to the V x n table via a 512 -> 128 "
        f"projection",
        f"Batch (fixed): {args.sentences} sentences, lengths uniform in [{args.min_len}, {args.max_len}] + EOS; "
        f"{first['src_tokens']} source and {ntok} target tokens (non-pad); tokens Zipf-distributed (exponent "
        f"{args.zipf}): {first['distinct_src']} distinct source and {first['distinct_tgt']} distinct target tokens",
        "Step: forward, label-smoothed cross-entropy (0.1, fairseq's criterion), backward, torch.optim.Adam step; "
        f"{args.rounds} interleaved rounds after {args.warmup} warm-up round(s)",
        "tokens/s = target tokens per step / median step time; page faults = minor page faults of the process "
        "during the step (median)",
        "Allocators (one child process each, run one after the other): " + "; ".join(allocator_notes),
    ])
    rows, verdicts = [], []
    for allocator, res in results.items():
        times = res["times"]
        base_tps = ntok / median(times["transformer"])
        for name in MODELS:
            t = median(times[name])
            rows.append([f"`{allocator}`", f"`{name}`", fmt_params(res["params"][name]),
                         fmt_params(res["embed_params"][name]), f"{t * 1e3:.0f}", f"{min(times[name]) * 1e3:.0f}",
                         f"{median(res['faults'][name]):.0f}", f"{ntok / t:.0f}", f"{ntok / t / base_tps:.2f}x",
                         f"{paired_ratio(times, 'transformer', name):.2f}x"])
        ratio = median(times["transformer"]) / median(times["transformer_define"])
        paired = paired_ratio(times, "transformer", "transformer_define")
        unique_gain = paired_ratio(times, "transformer_define, unique_tokens=False", "transformer_define")
        verdicts.append(
            f"- {'PASS' if ratio >= 1.1 else 'FAIL'} under `{allocator}`: transformer_define tokens/s >= 1.1x "
            f"transformer: {ratio:.2f}x (ratio of median step times; median of per-round ratios: {paired:.2f}x). "
            f"Unique-token path vs DeFINE on every position: {unique_gain:.2f}x (median of per-round ratios).")
    text += "\n" + table(["allocator", "model", "parameters", "of which embeddings", "step ms (median)",
                          "step ms (min)", "page faults per step", "target tokens/s",
                          "vs transformer (ratio of medians)", "vs transformer (median of per-round ratios)"], rows)
    text += "\n## Target\n\n" + "\n".join(verdicts) + "\n"
    return text


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers (both models)")
    parser.add_argument("--sentences", type=int, default=112, help="sentences per batch")
    parser.add_argument("--min-len", type=int, default=20, help="shortest sentence (tokens, before EOS)")
    parser.add_argument("--max-len", type=int, default=32, help="longest sentence (tokens, before EOS)")
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of the token distribution")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--allocators", default="glibc,tcmalloc",
                        help=f"comma-separated allocator configurations to run, of: {', '.join(ALLOCATORS)}")
    parser.add_argument("--child-json", help=argparse.SUPPRESS)  # internal: measure here, write JSON, exit
    args = parser.parse_args(argv)

    if args.child_json:
        check_allocator_loaded(current_allocator())
        result = measure(args)
        with open(args.child_json, "w", encoding="utf-8") as f:
            json.dump(result, f)
        return

    allocators = parse_choices(parser, "--allocators", args.allocators, list(ALLOCATORS))
    require_allocators(parser, allocators)
    child_argv = strip_option(argv, "--allocators")
    results = {name: measure_in_child(name, child_argv) for name in allocators}
    write_result("train_speed", render(args, results))


if __name__ == "__main__":
    main()
