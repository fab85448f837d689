"""Training speed of ``transformer_define`` against fairseq's ``transformer``: target tokens/s of a step (forward,
label-smoothed cross-entropy, backward, Adam) on one fixed batch. Both are the registered archs at base size
(d_model 512, FFN 2048, vocabulary 32k per side, decoder output tied); ``transformer_define`` is timed with each of
the DeFINE embedding's token paths (``DeFINEEmbedding.token_path``: ``unique``, the default, runs the unit once per
distinct token of the batch; ``table`` on all V rows, static shapes and no host synchronisation; ``positions`` on
every position). ``--model-args`` passes fairseq flags to ``transformer_define`` (e.g. ``"--torch-compile
--define-token-path positions"``); fairseq's ``transformer`` has no such flags and runs eager, its fastest mode.
Target (``benchmarks/targets.py``): the fastest ``transformer_define`` variant timed >= 1.1x the tokens/s of
``transformer`` on a CPU; on a GPU >= 1.0x at 4k and at 26k target tokens a step.

    .venv/bin/python -m benchmarks.train_speed [--device cuda] [--dtype fp32|bf16|fp16] [--tokens 4000]
        [--sentences 112] [--token-paths unique,table,positions] [--layers 6] [--rounds 5] [--model-args "..."]
"""

import copy
import shlex

import torch

from benchmarks.common import Bench, Check, millions, options, ratio, run_main, table
from benchmarks.targets import define_train_goal as goal_key
from benchmarks.workloads import build_model, count_params, zipf_tokens
from define_fairseq.modules.define.embedding import TOKEN_PATHS

BASELINE, DEFINE = "transformer", "transformer_define"


def variant(path: str) -> str:
    return f"{DEFINE}, token_path={path}"


def translation_models(layers: int, vocab: int = 32000, define_args=()):
    """``(transformer_define, transformer, task, criterion)``, same size and seed, decoder outputs tied;
    ``define_args``: more fairseq flags for ``transformer_define``."""
    task_args = [
        "--task",
        "translation",
        "-s",
        "src",
        "-t",
        "tgt",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--encoder-layers",
        str(layers),
        "--decoder-layers",
        str(layers),
    ]
    built = []
    for arch, extra in (
        ("transformer_define", list(define_args)),
        ("transformer", ["--share-decoder-input-output-embed"]),
    ):
        torch.manual_seed(1)
        built.append(build_model(arch, vocab, task_args, extra, langs=("src", "tgt")))
    return built[0][2], built[1][2], built[0][1], built[0][3]


def translation_batch(task, sentences: int, min_len: int, max_len: int, exponent: float = 1.0, seed: int = 0):
    """Random sentences as a fairseq translation sample: source left-padded, target right-padded, EOS-ended."""
    d = task.target_dictionary
    pad, eos, width = d.pad(), d.eos(), max_len + 1
    g = torch.Generator().manual_seed(seed)
    src_lens, tgt_lens = (torch.randint(min_len, max_len + 1, (sentences,), generator=g) for _ in range(2))
    src_words, tgt_words = (zipf_tokens(g, (sentences, max_len), len(d), d.nspecial, exponent) for _ in range(2))
    src, target, prev = (torch.full((sentences, width), pad, dtype=torch.long) for _ in range(3))
    for b in range(sentences):
        s, t = int(src_lens[b]), int(tgt_lens[b])
        src[b, width - s - 1 : width - 1], src[b, -1] = src_words[b, :s], eos
        target[b, :t], target[b, t] = tgt_words[b, :t], eos
        prev[b, 0], prev[b, 1 : t + 1] = eos, tgt_words[b, :t]
    return {
        "id": torch.arange(sentences),
        "nsentences": sentences,
        "ntokens": int(target.ne(pad).sum()),
        "net_input": {"src_tokens": src, "src_lengths": src_lens + 1, "prev_output_tokens": prev},
        "target": target,
    }


def main(argv=None):
    parser = options(__doc__, rounds=5, fp16=True)
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers (both models)")
    parser.add_argument("--sentences", type=int, help="sentences per batch (default 112)")
    parser.add_argument(
        "--tokens",
        type=int,
        help="target tokens per batch, about: picks --sentences (sentences of (min_len + max_len) / 2 tokens + EOS)",
    )
    parser.add_argument("--min-len", type=int, default=20, help="shortest sentence (tokens, before EOS)")
    parser.add_argument("--max-len", type=int, default=32, help="longest sentence (tokens, before EOS)")
    parser.add_argument(
        "--token-paths",
        help="more DeFINE token paths to time (copies of the model built, each on one path), comma-separated; "
        f"default: {','.join(TOKEN_PATHS)}, none under --torch-compile",
    )
    parser.add_argument("--model-args", default="", help='fairseq flags for transformer_define, e.g. "--torch-compile"')
    bench = Bench("benchmarks.train_speed", parser, argv)
    args = bench.args
    compiled = "--torch-compile" in shlex.split(args.model_args)
    default_paths = "" if compiled else ",".join(TOKEN_PATHS)
    paths = [p.strip() for p in (args.token_paths or default_paths).split(",") if p.strip()]
    if set(paths) - set(TOKEN_PATHS):
        parser.error(f"--token-paths {args.token_paths}: choose from {', '.join(TOKEN_PATHS)}")
    if args.tokens is not None and args.sentences is not None:
        parser.error("--tokens and --sentences both set the batch size: give one of them")
    sentences = args.sentences or 112
    if args.tokens is not None:
        sentences = max(1, round(args.tokens / ((args.min_len + args.max_len) / 2 + 1)))
    layers, sentences = (1, 4) if args.quick else (args.layers, sentences)
    define, baseline, task, criterion = translation_models(
        layers, 500 if args.quick else 32000, shlex.split(args.model_args)
    )
    from define_fairseq.modules import DeFINEEmbedding

    embeddings = [m for m in define.modules() if isinstance(m, DeFINEEmbedding)]
    built_path = embeddings[0].token_path or ("auto" if bench.device.type == "cuda" else "unique")
    if compiled and set(paths) - {built_path}:
        parser.error(
            f"--token-paths {args.token_paths} with --torch-compile: a compiled model keeps the token path its "
            f"flags chose ({built_path}); give it with --define-token-path in --model-args"
        )
    built_name = " ".join([DEFINE, args.model_args.strip()]).strip() + f" (token_path={built_path})"
    built = {BASELINE: baseline, built_name: define}
    for path in paths:
        if path == built_path:
            continue
        model = copy.deepcopy(define)
        for emb in model.modules():
            if isinstance(emb, DeFINEEmbedding):
                emb.token_path = path
        built[variant(path)] = model
    models = {name: bench.to(m).train() for name, m in built.items()}
    sample = translation_batch(task, sentences, args.min_len, args.max_len)
    src, pad, ntok = sample["net_input"]["src_tokens"], task.target_dictionary.pad(), sample["ntokens"]
    sample = bench.to(sample)
    t = bench.time(
        {
            n: bench.step(m, criterion, sample, torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-8))
            for n, m in models.items()
        }
    )
    rows = [
        [
            f"`{n}`",
            millions(count_params(m)),
            millions(sum(p.numel() for k, p in m.named_parameters() if "embed_tokens" in k)),
            *t.columns(n, BASELINE, ntok, faults=True),
        ]
        for n, m in models.items()
    ]
    notes = [
        f"Models: d_model 512, FFN 2048, 8 heads, {layers} + {layers} layers, dropout 0.1, decoder output tied to "
        f"its input embedding; transformer_define: DeFINE n=128, k=1024, depth 3, 4 groups at most, output tied "
        f"to the V x n table via a 512 -> 128 projection",
        f"Batch (fixed): {sentences} sentences of {args.min_len}-{args.max_len} tokens + EOS; "
        f"{int(src.ne(pad).sum())} source and {ntok} target tokens; Zipf-distributed tokens (exponent 1): "
        f"{src[src.ne(pad)].unique().numel()} distinct source tokens",
        "Step: forward, label-smoothed cross-entropy (0.1, fairseq's criterion), backward, torch.optim.Adam; "
        "page faults = minor page faults of the process during a step (median)",
    ]
    body = table(
        [
            "model",
            "parameters",
            "of which embeddings",
            "step ms (median)",
            "step ms (min)",
            "page faults per step",
            "target tokens/s",
            "vs transformer (ratio of medians)",
            "vs transformer (median of per-round ratios)",
        ],
        rows,
    )
    body += "".join(
        f"\nToken path {name.split('=')[-1]} vs the model built: {ratio(t.paired(built_name, name))} (median of "
        f"per-round ratios).\n"
        for name in built
        if name not in (BASELINE, built_name)
    )
    # each side in its fastest mode: transformer has one, transformer_define the fastest of its variants timed
    speeds = {n: t.speedup(BASELINE, n) for n in built if n != BASELINE}
    fastest = max(speeds, key=lambda n: speeds[n] if speeds[n] == speeds[n] else -1.0)
    goal = goal_key(args.tokens)
    checks = [
        Check.of_goal(
            goal,
            f"{fastest} vs transformer, training tokens/s, {ntok} target tokens a step, {bench.args.dtype}",
            t.speedup(BASELINE, fastest),
            bench.cuda,
            1.0 if bench.cuda else 1.1,
            batch=f"{sentences} sentences, {ntok} target tokens",
        )
    ]
    return bench.finish("Training speed: transformer_define vs transformer", notes, body, checks)


if __name__ == "__main__":
    run_main(main)
