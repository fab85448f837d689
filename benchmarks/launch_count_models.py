"""What ``benchmarks.launch_count`` counts: the other benchmarks' models and batches, one row per model and mode.

Each ``*_rows(bench, quick, warmup)`` returns ``(rows, notes)``. A training step is forward, the model's fairseq
criterion, backward and ``torch.optim.Adam(foreach=True)`` (no clipping); ``--torch-compile`` is the model as that
flag builds it with ``--torch-compile-backend aot_eager`` (:func:`compiled`).
"""

import copy
import importlib
import os
from collections import Counter
from types import SimpleNamespace
from typing import Dict, NamedTuple

import torch

from benchmarks.launch_count import Counts, count_step

MOGRIFIER_CUDA_PATHS = (
    "define_fairseq.modules.mogrifier.fused:fused_mogrifier_layer,"
    "define_fairseq.modules.mogrifier.triton_step:triton_mogrifier_layer"
)
DEFINE_EAGER_GOAL, DEFINE_COMPILED_GOAL, MOGRIFIER_GOAL = 1.10, 1.0, 27  # issue 43's goals on a CPU


class Row(NamedTuple):
    model: str
    mode: str
    unit: str
    value: float
    syncs: float
    goal: str = ""  # the goal and whether it is met, beside the figure
    launches: str = ""  # the commonest launches
    sync_names: str = ""


def commonest(by_name: Dict[str, float], n: int = 6) -> str:
    return ", ".join(f"{k.replace('aten::', '')} {v:g}" for k, v in Counter(by_name).most_common(n) if v)


def row(model: str, mode: str, unit: str, counts: Counts, goal: str = "") -> Row:
    names = (commonest(counts.by_name), commonest(counts.syncs_by_name))
    return Row(model, mode, unit, counts.launches, counts.syncs, goal, *names)


def compiled(model, token_path=None):
    """A copy of ``model`` as ``--torch-compile --torch-compile-backend aot_eager [--define-token-path P]`` builds
    it (the same function, on the built model)."""
    from define_fairseq.models.compile import compile_static_parts

    cfg = SimpleNamespace(torch_compile=True, torch_compile_backend="aot_eager", define_token_path=token_path)
    return compile_static_parts(copy.deepcopy(model), cfg)


def with_token_path(model, path: str):
    """A copy of ``model`` whose DeFINE embeddings take token path ``path`` (``--define-token-path``)."""
    from define_fairseq.modules import DeFINEEmbedding

    model = copy.deepcopy(model)
    for module in model.modules():
        if isinstance(module, DeFINEEmbedding):
            module.token_path = path
    return model


def training_counts(bench, variants, criterion, samples, warmup):
    """``{key: Counts}`` of a training step of each model of ``variants`` on ``samples[0]``, and a note for each
    model whose step on ``samples[1]`` (another batch size), if given, counts otherwise."""
    counts, notes = {}, []
    for key, model in variants.items():
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)
        found = [count_step(bench.step(model, criterion, sample, optimizer), warmup) for sample in samples]
        counts[key] = found[0]
        if found[-1].launches != found[0].launches:
            notes.append(f"{' '.join(key)}: {found[-1].launches} launches at the other batch size")
    return counts, notes


def other_size(sizes, notes, what: str = "") -> str:
    """Whether the counts held at the other batch size (none in ``--quick``)."""
    if len(sizes) < 2:
        return ""
    return f" (counted at {what}{sizes[-1]} too: {'the same' if not notes else 'not the same, below'})"


def transformer_rows(bench, quick, warmup):
    from benchmarks.train_speed import translation_batch, translation_models

    layers, vocab, sentences = (1, 500, (4,)) if quick else (6, 32000, (16, 8))
    define, baseline, task, criterion = translation_models(layers, vocab)
    variants = {
        ("transformer", "eager"): baseline,
        ("transformer_define", "eager"): define,
        ("transformer_define", "eager, --define-token-path positions"): with_token_path(define, "positions"),
        ("transformer_define", "--torch-compile"): compiled(define),
    }
    if not quick:
        variants[("transformer_define", "--torch-compile --define-token-path positions")] = compiled(
            define, "positions"
        )
    samples = [bench.to(translation_batch(task, n, 20, 32)) for n in sentences]
    counts, notes = training_counts(bench, variants, criterion, samples, warmup)
    base, rows = counts[("transformer", "eager")].launches, []
    for (model, mode), c in counts.items():
        goal = ""
        if model == "transformer_define":
            limit = DEFINE_COMPILED_GOAL if "compile" in mode else DEFINE_EAGER_GOAL
            verdict = "met" if c.launches <= limit * base else "not met"
            goal = f"{c.launches / base:.3f}x transformer's; goal <= {limit:g}x: {verdict}"
        rows.append(row(model, mode, "launches per training step", c, goal))
    notes.insert(
        0,
        f"transformer, transformer_define: train_speed's models ({layers} + {layers} layers, V = {vocab:,}), "
        f"label-smoothed cross-entropy, {sentences[0]} sentences of 20-32 tokens"
        f"{other_size(sentences, notes)}; fairseq's transformer has no --torch-compile: eager only",
    )
    return rows, notes


def txl_rows(bench, quick, warmup):
    from benchmarks.txl_speed import DEFINE, STANDARD, txl_batch
    from benchmarks.workloads import build_model

    vocab, layers, cutoff, batches, tgt_len = (
        (3000, 1, "500,1000,2000", (4,), 8) if quick else (32000, 4, "2500,5000,25000", (8, 4), 64)
    )
    task = ["--task", "language_modeling", "--criterion", "lm_regularized_loss", "--ddp-backend", "legacy_ddp"]
    shape = ["--decoder-layers", str(layers), "--adaptive-softmax-cutoff", cutoff, "--txl-mem-len", str(tgt_len)]
    variants, criterion = {}, None
    for arch in (STANDARD, DEFINE):
        torch.manual_seed(1)
        _, _, model, criterion = build_model(arch, vocab, task, shape)
        variants[(arch, "eager")], variants[(arch, "--torch-compile")] = model, compiled(model)
    if not quick:
        variants[(DEFINE, "--torch-compile --define-token-path positions")] = compiled(model, "positions")
    samples = [bench.to(txl_batch(vocab, b, tgt_len, seed=0)) for b in batches]
    counts, notes = training_counts(bench, variants, criterion, samples, max(warmup, 2))  # the 2nd has a memory
    rows = [row(model, mode, "launches per training step", c) for (model, mode), c in counts.items()]
    notes.insert(
        0,
        f"Transformer-XL: txl_speed's archs at {layers} layers, V = {vocab:,}, adaptive softmax cutoffs {cutoff}, "
        f"lm_regularized_loss, batch {batches[0]} x {tgt_len} with the memory ({tgt_len}) of the step before"
        + other_size(batches, notes, "batch "),
    )
    return rows, notes


def mogrifier_entry(bench, entry: str):
    """The function ``entry`` (``MODULE:FUNCTION``) names, imported with Triton's interpreter on a CPU."""
    if not bench.cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # read when Triton defines a kernel, at its module's import
    module_name, _, function = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"--mogrifier-cuda-path {entry}: cannot import {module_name}: {error}") from error
    if not function or not hasattr(module, function):
        raise ValueError(f"--mogrifier-cuda-path {entry}: give MODULE:FUNCTION, a function of {module_name}")
    return getattr(module, function)


def mogrifier_rows(bench, quick, warmup, entries: str):
    """Launches per time step and layer of the ``mogrifier_lstm_lm_ptb`` stack as fairseq-train builds it (its
    dropouts; small width): forward and backward at T1 < T2 < T3, (c(T2) - c(T1)) / ((T2 - T1) x layers), where
    the per-sequence work cancels; the same from T2 to T3 or a note. The CPU path is the layers' torch fast path;
    each of ``entries`` (comma-separated ``MODULE:FUNCTION``) runs every layer as ``triton_mogrifier_layer`` does."""
    from benchmarks.mogrifier_speed import TritonSteps
    from benchmarks.workloads import build_model

    paths = {f"CUDA path ({e})": mogrifier_entry(bench, e) for e in entries.split(",") if e.strip()}
    hidden, batch, lengths = (8, 2, (2, 3, 4)) if quick else (32, 4, (4, 8, 12))
    task = ["--task", "language_modeling", "--criterion", "lm_regularized_loss"]
    size = ["--mogrifier-hidden-size", str(hidden), "--mogrifier-rank", "4"]
    torch.manual_seed(1)
    stack = build_model("mogrifier_lstm_lm_ptb", 100, task, size)[2].decoder.lstm.to(bench.device).train()
    for layer in stack.layers:
        layer.kernels = "torch"  # what a CPU runs; the CUDA paths below choose their own kernels
    layers, rows, notes = stack.num_layers, [], []
    runners = {"CPU path (MogrifierLSTM, kernels='torch')": lambda x: stack(x)[0]}
    for mode, run_layer in paths.items():
        runners[mode] = TritonSteps(stack)
        runners[mode].run_layer = run_layer
    for mode, runner in runners.items():
        counts = []
        for t in lengths:
            x = torch.randn(batch, t, stack.input_size, device=bench.device, requires_grad=True)
            counts.append(count_step(lambda: runner(x).sum().backward(), warmup))
        steps = [(b - a) * layers for a, b in zip(lengths, lengths[1:])]
        per = [(b.launches - a.launches) / n for a, b, n in zip(counts, counts[1:], steps)]
        names = {k: (v - counts[0].by_name.get(k, 0)) / steps[0] for k, v in counts[1].by_name.items()}
        goal = ""
        if mode.startswith("CUDA"):
            goal = f"goal <= {MOGRIFIER_GOAL}: {'met' if per[0] <= MOGRIFIER_GOAL else 'not met'}"
        syncs = (counts[1].syncs - counts[0].syncs) / steps[0]
        rows.append(Row("mogrifier_lstm_lm_ptb stack", mode, "launches per time step and layer", per[0], syncs, goal,
                        commonest(names)))  # fmt: skip
        if per[0] != per[1]:
            notes.append(f"Mogrifier {mode}: {per[1]:g} per time step and layer from T = {lengths[1]} to {lengths[2]}")
    notes.insert(
        0,
        f"Mogrifier: the mogrifier_lstm_lm_ptb stack as fairseq-train builds it ({layers} layers, rounds 5, its "
        f"dropouts) at input and hidden {hidden}, rank 4, batch {batch}; forward and backward at T = "
        f"{', '.join(map(str, lengths))}: per time step and layer from the first two (the same from the last two "
        f"unless said); a CUDA path runs each layer through its function (--mogrifier-cuda-path; Triton kernels "
        f"{'compiled' if bench.cuda else 'interpreted, TRITON_INTERPRET=1'}; the stack's dropout between layers "
        f"left out); on a GPU the default replays a BPTT window as CUDA graphs, which the host does not count",
    )
    return rows, notes


def lstm_rows(bench, quick, warmup):
    from benchmarks.lstm_lm_speed import layers_alone
    from benchmarks.workloads import build_model, lm_sample

    vocab, bptt, batches, hidden = (500, 8, (2,), 64) if quick else (10000, 70, (20, 10), 1150)
    flags = f"--decoder-embed-dim 400 --decoder-hidden-size {hidden} --decoder-layers 3 --dropout 0.4 "
    flags += f"--share-decoder-input-output-embed --decoder-output-dim {hidden} --define-n 128 --define-depth 7 "
    flags += "--define-k 1024"
    torch.manual_seed(1)
    _, _, model, criterion = build_model("lstm_lm_define", vocab, ["--task", "language_modeling"], flags.split())
    model, name, scoring = bench.to(model), "lstm_lm_define", "eager, scoring (eval, no grad)"
    train = [bench.to(lm_sample(vocab, b, bptt)) for b in batches]
    counts, notes = training_counts(bench, {(name, "eager, training"): model}, criterion, train, warmup)
    model.eval()
    sample = bench.to(lm_sample(vocab, batches[-1], bptt))
    counts[(name, scoring)] = count_step(bench.step(model, criterion, sample), warmup)
    alone = layers_alone(bench, model.decoder.lstm, batches[-1], bptt, training=False)
    counts[("its 3 LSTM layers alone", scoring)] = count_step(alone, warmup)
    rows = [row(model, mode, "launches per step", c) for (model, mode), c in counts.items()]
    notes.insert(
        0,
        f"lstm_lm_define: lstm_lm_speed's DeFINE model (n = 128, N = 7, k = 1024; V = {vocab:,}, embedding 400, 3 "
        f"LSTM layers of {hidden}, tied), cross-entropy, BPTT {bptt}; training at batch {batches[0]}"
        f"{other_size(batches, notes)}, scoring at batch {batches[-1]}",
    )
    return rows, notes
