"""Training speed of ``transformer_define`` against fairseq's ``transformer`` (both at base size, vocabulary 32k per
side): target tokens/s of a step (forward, label-smoothed cross-entropy, backward, Adam) on one fixed batch, with each
of the DeFINE embedding's token paths (``unique``: the unit once per distinct token; ``table``: on all V rows;
``positions``: on every position). ``--model-args``: fairseq flags for ``transformer_define`` (e.g. ``"--torch-compile
--define-token-path positions"``). Target: the fastest ``transformer_define`` >= 1.1x ``transformer`` on a CPU, >= 1.0x
on a GPU at 4k and at 26k target tokens a step.
"""

import copy
import shlex
from typing import List

import torch

from benchmarks.common import LOSS_SCALE, Bench, build_model, count_params, listed, options, run_main, zipf_tokens
from benchmarks.targets import define_train_goal, millions, ratio, table
from define_fairseq.modules.define.embedding import TOKEN_PATHS

BASELINE, DEFINE = "transformer", "transformer_define"
COLUMNS = "model | parameters | of which embeddings | step ms (median) | step ms (min) | page faults per step | "
COLUMNS += "target tokens/s | vs transformer (ratio of medians) | vs transformer (median of per-round ratios)"


class MasterWeights:
    """float32 masters of ``optimizer``'s float16 parameters, as fairseq's ``--fp16`` trains (its ``FP16Optimizer``):
    the loss is scaled by a fixed ``scale`` before backward, the float16 gradients are copied to the masters divided
    by it, the optimizer steps the masters and they are copied back. fairseq's dynamic scaling also checks the
    gradients for overflow every step (a host synchronisation); a speed benchmark leaves the check out.

    Shapes: each master has its parameter's shape.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, scale: float = LOSS_SCALE):
        self.scale, self.half, self.master = scale, [], []
        for group in optimizer.param_groups:
            masters = [torch.nn.Parameter(p.detach().float()) for p in group["params"]]
            self.half += group["params"]
            self.master += masters
            group["params"] = masters

    def unscale_gradients(self) -> None:
        """Each master's gradient: its parameter's, in float32, divided by the loss scale."""
        for half, master in zip(self.half, self.master):
            master.grad = None if half.grad is None else half.grad.float().mul_(1.0 / self.scale)
            half.grad = None

    @torch.no_grad()
    def copy_back(self) -> None:
        torch._foreach_copy_(self.half, self.master)


def translation_models(layers: int, vocab: int = 32000, define_args=()):
    """``(transformer_define, transformer, task, criterion)``, same size and seed, decoder outputs tied;
    ``define_args``: more fairseq flags for ``transformer_define``."""
    _, task, define, criterion = build_model(DEFINE, vocab, task_args(layers), list(define_args), ("src", "tgt"))
    baseline = build_model(BASELINE, vocab, task_args(layers), ["--share-decoder-input-output-embed"], ("src", "tgt"))
    return define, baseline[2], task, criterion


def task_args(layers: int) -> List[str]:
    """fairseq-train's flags of the translation task and criterion, and the models' layers."""
    task = "--task translation -s src -t tgt --criterion label_smoothed_cross_entropy --label-smoothing 0.1"
    return task.split() + ["--encoder-layers", str(layers), "--decoder-layers", str(layers)]


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
    net_input = {"src_tokens": src, "src_lengths": src_lens + 1, "prev_output_tokens": prev}
    ntokens = int(target.ne(pad).sum())
    return dict(id=torch.arange(sentences), nsentences=sentences, ntokens=ntokens, net_input=net_input, target=target)


def with_token_path(model, path: str):
    """A copy of ``model`` whose DeFINE embeddings take token path ``path`` (``--define-token-path``)."""
    from define_fairseq.modules import DeFINEEmbedding

    model = copy.deepcopy(model)
    for module in model.modules():
        if isinstance(module, DeFINEEmbedding):
            module.token_path = path
    return model


def main(argv=None):
    parser = options(__doc__, rounds=5, fp16=True)
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers (both models)")
    parser.add_argument("--sentences", type=int, help="sentences per batch (default 112)")
    parser.add_argument("--tokens", type=int, help="target tokens per batch, about: picks --sentences")
    parser.add_argument("--min-len", type=int, default=20, help="shortest sentence (tokens, before EOS)")
    parser.add_argument("--max-len", type=int, default=32, help="longest sentence (tokens, before EOS)")
    more = "more DeFINE token paths to time (copies of the model built, each on one path), comma-separated; default: "
    parser.add_argument("--token-paths", help=more + f"{','.join(TOKEN_PATHS)}, none under --torch-compile")
    parser.add_argument("--model-args", default="", help='fairseq flags for transformer_define, e.g. "--torch-compile"')
    bench = Bench("benchmarks.train_speed", parser, argv)
    args = bench.args
    compiled = "--torch-compile" in shlex.split(args.model_args)
    value = args.token_paths if args.token_paths is not None else "" if compiled else None  # None: all of them
    paths = listed(parser, "--token-paths", value, TOKEN_PATHS, empty=True)
    if args.tokens is not None and args.sentences is not None:
        parser.error("--tokens and --sentences both set the batch size: give one of them")
    sentences = args.sentences or 112
    if args.tokens is not None:  # sentences of (min_len + max_len) / 2 tokens and EOS
        sentences = max(1, round(args.tokens / ((args.min_len + args.max_len) / 2 + 1)))
    layers, sentences, vocab = (1, 4, 500) if args.quick else (args.layers, sentences, 32000)
    define, baseline, task, criterion = translation_models(layers, vocab, shlex.split(args.model_args))
    from define_fairseq.modules import DeFINEEmbedding

    embeddings = [m for m in define.modules() if isinstance(m, DeFINEEmbedding)]
    built_path = embeddings[0].token_path or ("auto" if bench.device.type == "cuda" else "unique")
    if compiled and set(paths) - {built_path}:
        why = f"a compiled model keeps the token path its flags chose ({built_path}); give it with --define-token-path"
        parser.error(f"--token-paths {args.token_paths} with --torch-compile: {why} in --model-args")
    built_name = " ".join([DEFINE, args.model_args.strip()]).strip() + f" (token_path={built_path})"
    built = {BASELINE: baseline, built_name: define}
    built.update({f"{DEFINE}, token_path={p}": with_token_path(define, p) for p in paths if p != built_path})
    models = {name: bench.to(m).train() for name, m in built.items()}
    sample = translation_batch(task, sentences, args.min_len, args.max_len)
    src, pad, ntok = sample["net_input"]["src_tokens"], task.target_dictionary.pad(), sample["ntokens"]
    sample, fns = bench.to(sample), {}
    for name, model in models.items():
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-8)
        master = MasterWeights(optimizer) if bench.half else None
        fns[name] = bench.step(model, criterion, sample, optimizer, master=master)
    t = bench.time(fns)
    rows = []
    for n, m in models.items():
        embeddings = sum(p.numel() for k, p in m.named_parameters() if "embed_tokens" in k)
        rows.append([f"`{n}`", millions(count_params(m)), millions(embeddings), *t.columns(n, BASELINE, ntok, True)])
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
    others = [n for n in built if n not in (BASELINE, built_name)]
    ratios = [f"\nToken path {n.split('=')[-1]} vs the model built: {ratio(t.paired(built_name, n))}" for n in others]
    body = table(COLUMNS, rows) + "".join(f"{r} (median of per-round ratios).\n" for r in ratios)
    # each side in its fastest mode: transformer has one, transformer_define the fastest of its variants timed
    speeds = {n: t.speedup(BASELINE, n) for n in built if n != BASELINE}
    fastest = max(speeds, key=lambda n: speeds[n] if speeds[n] == speeds[n] else -1.0)
    what = f"{fastest} vs transformer, training tokens/s, {ntok} target tokens a step, {args.dtype}"
    goal, batch = define_train_goal(args.tokens), f"{sentences} sentences, {ntok} target tokens"
    checks = [bench.check(what, speeds[fastest], 1.0 if bench.cuda else 1.1, goal, batch=batch)]
    return bench.finish("Training speed: transformer_define vs transformer", notes, body, checks)


if __name__ == "__main__":
    run_main(main)
