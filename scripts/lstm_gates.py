"""How far the first LSTM layer's gates of a comparison's LSTM language models saturate: for every kept checkpoint under
``OUT/runs/train`` (or ``OUT/runs/train-cosine-BUDGET``, ``compare.sh -S cosine``'s; ``checkpoint_E_U.pt``: a point's),
the root mean square of the LSTM's input and the share of the first layer's gate pre-activations beyond +-6 (where a
sigmoid's slope is below 0.0025, a hundredth of its largest, and a tanh's lower still, so little gradient passes), on
the first tokens of the validation split::

    python -m scripts.lstm_gates OUT [--models A,B] [--updates 3000,30000] [--tokens 7000] [--rows 20] > gates.tsv

The tokens are laid out as ``--rows`` contiguous streams, read from a zero state in eval mode, in float64. Prints a
tab-separated table: model, seed, updates, input_rms, then the share for the input, forget, cell and output gates
and for all four. Measures the models whose decoder reads an :class:`LSTMStack` (``lstm_lm_define``,
``awd_lstm_lm``); says on stderr which checkpoints it skips.
"""

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Tuple

import torch
import torch.nn as nn

from define_fairseq.tools.average_checkpoints import UPDATE_CHECKPOINT
from scripts.results_io import RUN_NAME

THRESHOLD = 6.0
GATES = ("i", "f", "g", "o")


def gate_preactivations(lstm: nn.LSTM, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(pre, h)``: the gates' pre-activations of a one-layer, batch-first ``lstm`` over ``x`` from a zero state,
    recomputed step by step in ``x``'s dtype, in PyTorch's gate order (input, forget, cell, output), and the hidden
    states the recurrence gives (equal to ``lstm(x)[0]``).

    Shapes: ``x [B, T, d]`` -> ``pre [B, T, 4, H]``, ``h [B, T, H]``."""
    if lstm.num_layers != 1 or not lstm.batch_first or lstm.bidirectional or lstm.proj_size:
        raise ValueError("gate_preactivations needs a one-layer, one-way, batch-first nn.LSTM without projection")
    w_ih, w_hh = lstm.weight_ih_l0.to(x.dtype), lstm.weight_hh_l0.to(x.dtype)
    bias = (lstm.bias_ih_l0 + lstm.bias_hh_l0).to(x.dtype) if lstm.bias else 0
    batch, steps, _ = x.shape
    h = x.new_zeros(batch, lstm.hidden_size)
    c = x.new_zeros(batch, lstm.hidden_size)
    from_input = x @ w_ih.T + bias
    pres, hs = [], []
    for t in range(steps):
        pre = from_input[:, t] + h @ w_hh.T
        i, f, g, o = pre.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        pres.append(pre.view(batch, 4, lstm.hidden_size))
        hs.append(h)
    return torch.stack(pres, dim=1), torch.stack(hs, dim=1)


def saturation(pre: torch.Tensor, threshold: float = THRESHOLD) -> List[float]:
    """The share of ``pre`` beyond +-``threshold``, for each gate and then for all four.

    Shapes: ``pre [..., 4, H]`` -> 5 floats."""
    beyond = (pre.abs() > threshold).to(torch.float64)
    per_gate = beyond.transpose(0, -2).reshape(4, -1).mean(dim=1)
    return [*per_gate.tolist(), beyond.mean().item()]


def checkpoints(out: Path) -> List[Tuple[str, int, int, Path]]:
    """``(model, seed, updates, path)`` of every ``runs/train*/MODEL.sSEED/checkpoint_E_U.pt`` under ``out``, by
    model, seed and updates."""
    found = []
    for path in (out / "runs").glob("train*/*.s*/checkpoint_*_*.pt"):
        run, name = RUN_NAME.match(path.parent.name), UPDATE_CHECKPOINT.match(path.name)
        if run and name:
            found.append((run["model"], int(run["seed"]), int(name.group(2)), path))
    return sorted(found)


def validation_stream(data: Path, dictionary, tokens: int, rows: int) -> torch.Tensor:
    """The first ``tokens`` tokens (fewer where the split is shorter) of ``data``'s validation split, every line
    ending in EOS as binarized, as ``rows`` contiguous streams.

    Shapes: ``-> [rows, T]``."""
    from fairseq.data import data_utils

    split = data_utils.load_indexed_dataset(str(data / "valid"), dictionary)
    if split is None:
        raise ValueError(f"{data}/valid.bin: no validation split to read (fairseq-preprocess --validpref)")
    stream = torch.cat([split[i] for i in range(len(split))])
    kept = min(tokens, len(stream))
    if kept < rows:
        raise ValueError(f"{data}/valid.bin: {len(stream)} tokens, fewer than --rows {rows}")
    return stream[: kept - kept % rows].view(rows, -1)


def measure(path: Path, data: Path, tokens: int, rows: int, threshold: float) -> Optional[List[float]]:
    """``[input_rms, shares...]`` of the checkpoint at ``path`` on ``data``'s validation split, or None when its
    decoder reads no :class:`LSTMStack`."""
    from fairseq import checkpoint_utils

    from define_fairseq.modules.awd_lstm.lstm_stack import LSTMStack

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides={"data": str(data)})
    model = models[0].eval().double()
    stack = getattr(model.decoder, "lstm", None)
    if not isinstance(stack, LSTMStack):
        return None
    seen = []
    hook = stack.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        model(validation_stream(data, task.target_dictionary, tokens, rows))
        hook.remove()
        pre, _ = gate_preactivations(stack.layers[0].lstm, seen[0])
    return [seen[0].pow(2).mean().sqrt().item(), *saturation(pre, threshold)]


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a comparison's output directory (with runs/train and data-bin)")
    parser.add_argument("--models", help="comma separated models to measure (default: every one)")
    parser.add_argument("--updates", help="comma separated update counts to measure (default: every kept one)")
    parser.add_argument("--tokens", type=int, default=7000, help="validation tokens to read (default 7000)")
    parser.add_argument("--rows", type=int, default=20, help="contiguous streams they are laid out in (default 20)")
    parser.add_argument("--threshold", type=float, default=THRESHOLD, help="|pre-activation| counted (default 6)")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.tokens < args.rows:
        parser.error(f"--rows {args.rows} must be at least 1 and --tokens {args.tokens} at least --rows")
    found = checkpoints(args.out)
    if not found:
        parser.error(f"{args.out}/runs/train* holds no checkpoint_E_U.pt; give a comparison's OUT")
    for flag, column, given in (("--models", 0, args.models), ("--updates", 2, args.updates)):
        if given:
            wanted = given.split(",")
            missing = sorted(set(wanted) - {str(c[column]) for c in found})
            if missing:
                parser.error(f"{flag}: no kept checkpoint under {args.out}/runs/train* has {', '.join(missing)}")
            found = [c for c in found if str(c[column]) in wanted]
    from fairseq import utils

    utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "define_fairseq")))
    print("\t".join(["model", "seed", "updates", "input_rms", *(f"share_{g}" for g in GATES), "share"]))
    for model, seed, updates, path in found:
        try:
            values = measure(path, args.out / "data-bin", args.tokens, args.rows, args.threshold)
        except ValueError as error:
            parser.error(str(error))
        if values is None:
            print(f"skipped {path}: its decoder reads no LSTM stack", file=sys.stderr)
            continue
        print("\t".join([model, str(seed), str(updates), *(f"{v:.4f}" for v in values)]), flush=True)


if __name__ == "__main__":
    main()
