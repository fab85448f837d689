"""Generation speed (beam search, fairseq's ``SequenceGenerator``, output length forced) of ``transformer``,
``transformer_define`` unfolded (its V x m tables cached: the steady state; and rebuilt every batch: the first batch's
cost) and after ``fold_model``, whose generations are checked against the unfolded one's; models as in
``benchmarks.train_speed``, random weights, eval mode. Target: folded ``transformer_define`` >= 1.0x ``transformer``.
"""

import copy

import torch

from benchmarks.common import Bench, count_params, options, run_main
from benchmarks.targets import millions, table
from benchmarks.train_speed import translation_batch, translation_models

VARIANTS = (
    "transformer",
    "transformer_define (unfolded, eval)",
    "transformer_define (unfolded, tables rebuilt every batch)",
    "transformer_define (folded)",
)
COLUMNS = "model | parameters | batch ms (median) | batch ms (min) | generated tokens/s | "
COLUMNS += "vs transformer (ratio of medians) | vs transformer (median of per-round ratios)"


def same_generations(a, b, tolerance: float) -> bool:
    """Every beam hypothesis of every sentence: the same tokens, scores within ``tolerance``."""

    def same(x, y):
        close = torch.allclose(x["positional_scores"], y["positional_scores"], rtol=tolerance, atol=tolerance)
        return torch.equal(x["tokens"], y["tokens"]) and close

    return len(a) == len(b) and all(len(ha) == len(hb) and all(map(same, ha, hb)) for ha, hb in zip(a, b))


def main(argv=None):
    parser = options(__doc__, rounds=5)
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers (all models)")
    parser.add_argument("--sentences", type=int, default=32, help="source sentences per batch")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--out-len", type=int, default=30, help="forced output length (min_len = max_len_b)")
    bench = Bench("benchmarks.generate_speed", parser, argv)
    args = bench.args
    from fairseq.sequence_generator import SequenceGenerator

    from define_fairseq.tools.fold_define import fold_model

    layers, sentences, out_len = (1, 2, 3) if args.quick else (args.layers, args.sentences, args.out_len)
    define, baseline, task, _ = translation_models(layers, 500 if args.quick else 32000)
    models = [baseline, define, copy.deepcopy(define), fold_model(copy.deepcopy(define))]
    models = dict(zip(VARIANTS, (bench.to(m).eval() for m in models)))
    sample = translation_batch(task, sentences, 18, 22)
    net_input = {k: sample["net_input"][k] for k in ("src_tokens", "src_lengths")}
    sample, outputs = bench.to({"id": sample["id"], "net_input": net_input}), {}

    def gen(name):
        model = models[name]
        limits = dict(max_len_a=0, max_len_b=out_len, min_len=out_len)
        generator = SequenceGenerator([model], task.target_dictionary, beam_size=args.beam, **limits)

        def run():
            if name == VARIANTS[2]:
                model.eval()  # drops the cached V x m tables: this batch rebuilds them
            with bench.autocast():
                outputs[name] = generator.generate([model], sample)

        return run

    t = bench.time({name: gen(name) for name in models})
    ntok = sum(len(h[0]["tokens"]) for h in outputs.get(VARIANTS[0], []))
    tolerance = 1e-5 if bench.dtype == torch.float32 else 2e-2
    done = all(v in outputs for v in VARIANTS)
    equal = done and all(same_generations(outputs[VARIANTS[3]], outputs[v], tolerance) for v in VARIANTS[1:3])
    rows = [[f"`{n}`", millions(count_params(m)), *t.columns(n, VARIANTS[0], ntok)] for n, m in models.items()]
    notes = [
        f"Models: d_model 512, FFN 2048, 8 heads, {layers} + {layers} layers, vocabulary 32000 per side, decoder "
        f"output tied; transformer_define: DeFINE n=128, k=1024, depth 3; random weights, eval mode",
        f"Batch: {sentences} source sentences of 18-22 tokens + EOS (Zipf tokens); beam {args.beam}; output "
        f"forced to {out_len} tokens + EOS; {ntok} generated tokens per batch (best hypothesis of each "
        f"sentence, EOS included)",
    ]
    rounding = " (the unfolded model computes its V x m tables under autocast, the folded tables were computed in "
    rounding += "float32: rounding can change a beam)"
    body = table(COLUMNS, rows) + (
        "\nParameters as stored (the folded model keeps each V x n table and adds the V x m folded tables). "
        "Folded generations equal the unfolded ones (tokens of every hypothesis, scores within "
        f"{tolerance:g}): **{'yes' if equal else 'NO'}**{'' if bench.dtype == torch.float32 else rounding}.\n"
    )
    what = "folded transformer_define vs transformer, generated tokens/s"
    checks = [bench.check(what, t.speedup(VARIANTS[0], VARIANTS[3]), 1.0)]
    return bench.finish("Generation speed: transformer_define (unfolded / folded) vs transformer", notes, body, checks)


if __name__ == "__main__":
    run_main(main)
