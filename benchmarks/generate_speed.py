"""Generation speed (beam search with fairseq's ``SequenceGenerator``) of ``transformer_define``, unfolded and
folded, vs fairseq's ``transformer``, CPU.

Models: as in ``benchmarks.train_speed`` (d_model 512, 6 + 6 layers, FFN 2048, vocabulary 32k per side, tied
decoder output), random weights, eval mode. Variants:

* ``transformer``: the baseline.
* ``transformer_define`` (unfolded, eval mode): in eval mode without autograd a ``DeFINEEmbedding`` computes its
  ``V x m`` table on the first call and then looks rows up; the table is built in the warm-up round, so this is
  the steady state of fairseq-generate over a test set.
* ``transformer_define``, tables rebuilt every batch: the same model with ``model.eval()`` called inside the
  timed call, which drops the cached tables, so each batch pays for running DeFINE over the whole vocabulary
  (the cost of the first batch).
* ``transformer_define`` folded: a copy after ``define_fairseq.tools.fold_define.fold_model``.

Random weights would not emit EOS sensibly, so every hypothesis is forced to the same length with
``min_len = max_len_b`` (``max_len_a = 0``): every model decodes the same number of steps. Generated tokens =
tokens of the best hypothesis of each sentence (EOS included), as fairseq-generate counts them.

The folded model's generations (tokens and scores of every beam hypothesis) are checked against the unfolded
model's.

Target: folded transformer_define >= 1.0x the tokens/s of transformer.

    .venv/bin/python -m benchmarks.generate_speed [--sentences 32] [--beam 4] [--out-len 30] [--rounds 5]
"""

import argparse
import copy

import torch

from benchmarks.common import (
    build_define_and_baseline,
    count_params,
    fmt_params,
    header,
    interleaved,
    median,
    paired_ratio,
    set_threads,
    table,
    write_result,
    zipf_tokens,
)


def make_sources(task, sentences: int, min_len: int, max_len: int, exponent: float, seed: int = 0):
    """Left-padded random source sentences ending in EOS, as a fairseq sample."""
    d = task.source_dictionary
    pad, eos = d.pad(), d.eos()
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, max_len + 1, (sentences,), generator=g)
    words = zipf_tokens(g, (sentences, max_len), len(d), d.nspecial, exponent)
    width = max_len + 1
    src = torch.full((sentences, width), pad, dtype=torch.long)
    for b in range(sentences):
        n = int(lens[b])
        src[b, width - n - 1:width - 1] = words[b, :n]
        src[b, width - 1] = eos
    return {"id": torch.arange(sentences), "net_input": {"src_tokens": src, "src_lengths": lens + 1}}


def same_generations(a, b) -> bool:
    """Every beam hypothesis of every sentence: same tokens, same scores."""
    for hyps_a, hyps_b in zip(a, b):
        if len(hyps_a) != len(hyps_b):
            return False
        for ha, hb in zip(hyps_a, hyps_b):
            if not torch.equal(ha["tokens"], hb["tokens"]):
                return False
            if not torch.allclose(ha["positional_scores"], hb["positional_scores"], rtol=1e-5, atol=1e-5):
                return False
    return len(a) == len(b)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers (all models)")
    parser.add_argument("--sentences", type=int, default=32, help="source sentences per batch")
    parser.add_argument("--min-len", type=int, default=18, help="shortest source sentence (before EOS)")
    parser.add_argument("--max-len", type=int, default=22, help="longest source sentence (before EOS)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--out-len", type=int, default=30, help="forced output length (min_len = max_len_b)")
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of the source tokens")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    set_threads(args.threads)

    from fairseq.sequence_generator import SequenceGenerator

    from define_fairseq.modules import FoldedDeFINEEmbedding
    from define_fairseq.tools.fold_define import fold_model

    define, baseline, task = build_define_and_baseline(args.layers)
    define.eval()
    baseline.eval()
    define_cold = copy.deepcopy(define)
    folded = fold_model(copy.deepcopy(define)).eval()
    assert sum(isinstance(m, FoldedDeFINEEmbedding) for m in folded.modules()) == 2

    sample = make_sources(task, args.sentences, args.min_len, args.max_len, args.zipf)
    tgt_dict = task.target_dictionary

    def generator(model):
        return SequenceGenerator([model], tgt_dict, beam_size=args.beam, max_len_a=0, max_len_b=args.out_len,
                                 min_len=args.out_len)

    generators = {
        "transformer": (baseline, generator(baseline)),
        "transformer_define (unfolded, eval)": (define, generator(define)),
        "transformer_define (unfolded, tables rebuilt every batch)": (define_cold, generator(define_cold)),
        "transformer_define (folded)": (folded, generator(folded)),
    }
    outputs = {}

    def gen(name):
        model, g = generators[name]

        def run():
            if name.endswith("rebuilt every batch)"):
                model.eval()  # drops the cached V x m tables: this batch rebuilds them
            outputs[name] = g.generate([model], sample)
        return run

    times = interleaved({name: gen(name) for name in generators}, rounds=args.rounds, warmup=1, log=True)

    hypos = outputs["transformer"]
    ntok = sum(len(h[0]["tokens"]) for h in hypos)
    for name, out in outputs.items():
        got = sum(len(h[0]["tokens"]) for h in out)
        assert got == ntok, f"{name} generated {got} tokens, the baseline {ntok}"
    equal = same_generations(outputs["transformer_define (folded)"], outputs["transformer_define (unfolded, eval)"])
    equal_cold = same_generations(outputs["transformer_define (folded)"],
                                  outputs["transformer_define (unfolded, tables rebuilt every batch)"])

    base_tps = ntok / median(times["transformer"])
    rows = []
    for name, (model, _) in generators.items():
        t = median(times[name])
        rows.append([f"`{name}`", fmt_params(count_params(model)), f"{t * 1e3:.0f}",
                     f"{min(times[name]) * 1e3:.0f}", f"{ntok / t:.0f}", f"{ntok / t / base_tps:.2f}x",
                     f"{paired_ratio(times, 'transformer', name):.2f}x"])
    ratio = median(times["transformer"]) / median(times["transformer_define (folded)"])
    paired = paired_ratio(times, "transformer", "transformer_define (folded)")

    title = "Generation speed: transformer_define (unfolded / folded) vs transformer"
    text = header(title, "benchmarks.generate_speed", [
        f"Models: d_model 512, FFN 2048, 8 heads, {args.layers} + {args.layers} layers, vocabulary 32000 per side, "
        f"decoder output tied; transformer_define: DeFINE n=128, k=1024, depth 3, 4 groups at most; random "
        f"weights, eval mode, torch.no_grad (SequenceGenerator.generate)",
        f"Batch: {args.sentences} source sentences of {args.min_len}-{args.max_len} tokens + EOS (Zipf tokens); "
        f"beam {args.beam}; output length forced to {args.out_len} + EOS (max_len_a=0, max_len_b=min_len="
        f"{args.out_len}); {ntok} generated tokens per batch (best hypothesis per sentence, EOS included)",
        f"{args.rounds} interleaved rounds after 1 warm-up round (the warm-up builds the unfolded model's cached "
        f"V x m tables)",
    ])
    text += "\n" + table(["model", "parameters", "batch ms (median)", "batch ms (min)", "generated tokens/s",
                          "vs transformer (ratio of medians)", "vs transformer (median of per-round ratios)"], rows)
    text += ("\nParameters are counted as stored: the folded model keeps each V x n table (the decoder's is its tied "
             "output layer) and adds the V x m folded tables as parameters, hence more than the unfolded model.\n")
    text += (f"\nFolded generations equal the unfolded ones (tokens and scores of all {args.beam} hypotheses of "
             f"every sentence): **{'yes' if equal and equal_cold else 'NO'}**.\n\n## Target\n\n")
    text += (f"- {'PASS' if ratio >= 1.0 else 'FAIL'}: folded transformer_define tokens/s >= 1.0x transformer: "
             f"{ratio:.2f}x (ratio of medians; median of per-round ratios: {paired:.2f}x)\n")
    write_result("generate_speed", text)


if __name__ == "__main__":
    main()
