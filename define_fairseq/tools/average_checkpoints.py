"""Average the model weights of several fairseq checkpoints (the checkpoint averaging of Vaswani et al., 2017)::

    python -m define_fairseq.tools.average_checkpoints --inputs A.pt B.pt ... --output OUT.pt
    python -m define_fairseq.tools.average_checkpoints --dir SAVE_DIR --last N [--epochs] --output OUT.pt

``--dir SAVE_DIR --last N`` takes the N update checkpoints ``checkpoint_<epoch>_<updates>.pt`` with the highest
update numbers (``fairseq-train --save-interval-updates U --keep-interval-updates K`` writes them), or with
``--epochs`` the N epoch checkpoints ``checkpoint<epoch>.pt`` with the highest epochs (written at the end of
every epoch unless ``--no-epoch-checkpoints``). ``checkpoint_best.pt``, ``checkpoint_last.pt`` and
``checkpoint.best_*.pt`` never count.

All inputs must be checkpoints of the same arch with the same parameter names, shapes and dtypes. Every
floating-point tensor is averaged in float64 and cast back to its dtype (fp32, fp16 and bf16 weights keep
theirs); any other entry (integer buffers, ...) must be equal in all inputs and is copied. The modules' extra
states (keys ending in ``_extra_state``: the state the recurrent language models carry from batch to batch in
training) are left out: each belongs to one input's weights and position in the data, not to the average, and
those models load a checkpoint without it as holding none. The output is the newest input (the highest
``num_updates``, or the last one given when an input lacks it) with the averaged weights, without optimizer
state, and with ``averaged_from`` listing the inputs' file names. It loads in fairseq-generate,
fairseq-interactive and ``checkpoint_utils.load_model_ensemble`` like the inputs. OUT is written to ``OUT.tmp``
and renamed at the end.
"""

import argparse
import os
import pickle
import re
import zipfile
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import torch

if __package__:
    from .arguments import int_at_least
else:  # run as a script, as the recipes run it so that the package (and fairseq) is not loaded
    from arguments import int_at_least

EXTRA_STATE = "_extra_state"  # the last part of the key under which torch saves a module's get_extra_state()
UPDATE_CHECKPOINT = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")  # checkpoint_<epoch>_<updates>.pt
EPOCH_CHECKPOINT = re.compile(r"^checkpoint(\d+)\.pt$")  # checkpoint<epoch>.pt
LEGACY_MAGIC = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)  # how torch.save's pre-zip format begins


class CheckpointError(ValueError):
    """A file that is not a usable checkpoint, or checkpoints that cannot be averaged; the message names the file
    and says why. The tools of this package that read checkpoints report it as one ``error: ...`` line."""


@contextmanager
def exit_on_checkpoint_error() -> Iterator[None]:
    """Around a tool's work: a :class:`CheckpointError` ends the program with its one ``error: ...`` line."""
    try:
        yield
    except CheckpointError as e:
        raise SystemExit(f"error: {e}")


def _found(save_dir: Path, epochs: bool):
    """(sort key, path) of the update (or epoch) checkpoints in ``save_dir``, oldest first."""
    found = []
    for path in save_dir.iterdir():
        match = (EPOCH_CHECKPOINT if epochs else UPDATE_CHECKPOINT).match(path.name)
        if match and path.is_file():
            key = (int(match.group(1)),) if epochs else (int(match.group(2)), int(match.group(1)))
            found.append((key, path))
    return sorted(found)


def last_checkpoints(save_dir, n: int, epochs: bool = False) -> List[Path]:
    """The ``n`` newest update checkpoints ``checkpoint_<epoch>_<updates>.pt`` of ``save_dir`` by update number
    (with ``epochs``: epoch checkpoints ``checkpoint<epoch>.pt`` by epoch), oldest first."""
    save_dir = Path(save_dir)
    if not save_dir.is_dir():
        raise CheckpointError(f"--dir {save_dir} is not a directory")
    if n < 1:
        raise CheckpointError(f"--last must be at least 1, got {n}")
    found = _found(save_dir, epochs)
    if len(found) < n:
        names = ", ".join(path.name for _, path in found) or "none"
        if epochs:
            what = "epoch checkpoints checkpoint<epoch>.pt"
            how = (
                "fairseq-train writes one at the end of every epoch unless --no-epoch-checkpoints is given "
                f"(--keep-last-epochs M keeps the last M; it must be at least {n})"
            )
            other = "" if not _found(save_dir, False) else "; it has update checkpoints: drop --epochs to use those"
        else:
            what = "update checkpoints checkpoint_<epoch>_<updates>.pt"
            how = (
                "fairseq-train writes them with --save-interval-updates U, and --keep-interval-updates K "
                f"keeps the last K (K must be at least {n})"
            )
            other = "" if not _found(save_dir, True) else "; it has epoch checkpoints: add --epochs to use those"
        raise CheckpointError(
            f"--dir {save_dir} has {len(found)} {what} ({names}), fewer than --last {n}; {how}{other}"
        )
    return [path for _, path in found[-n:]]


def _format_problem(path) -> Optional[str]:
    """Why the file ``path`` cannot have been written by ``torch.save``, or None when it looks like it: a complete
    zip archive holding a pickle, or the legacy format. Reads only the file's start and the zip directory."""
    with open(path, "rb") as f:
        head = f.read(32)
    if not head:
        return "the file is empty"
    if head.startswith(LEGACY_MAGIC):
        return None
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            if any(name == "data.pkl" or name.endswith("/data.pkl") for name in archive.namelist()):
                return None
        return "it is a zip archive without the data.pkl that torch.save writes"
    if head.startswith(b"PK\x03\x04"):
        return "the zip archive is incomplete (truncated, e.g. by an interrupted write or copy)"
    return f"it is not in torch.save's format (it begins with {head[:24]!r})"


def _trusted_load(path):
    # fairseq checkpoints may hold configuration objects (argparse.Namespace), which weights_only refuses
    return torch.load(path, map_location="cpu", weights_only=False)


def read_torch_file(path, load: Optional[Callable] = None, what: str = "checkpoint"):
    """What ``load(path)`` (default: ``torch.load`` on the CPU, trusting the file) reads from the file ``path``
    that ``torch.save`` wrote. CheckpointError naming it (``what``: how messages call it, e.g. ``--checkpoint``)
    when it does not exist, is not such a file (text, empty, truncated) or cannot be unpickled."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{what} {path} does not exist")
    problem = _format_problem(path)
    if problem is not None:
        raise CheckpointError(f"{what} {path} cannot be read as a PyTorch checkpoint: {problem}")
    try:
        return (load or _trusted_load)(path)
    except (pickle.UnpicklingError, EOFError, RuntimeError) as e:  # what torch.load raises on a damaged file
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
        refused = next((line for line in lines if "Unsupported global" in line), None)
        if refused is not None:
            raise CheckpointError(
                f"{what} {path}: torch.load(weights_only=True) refused it ({refused}); if you "
                f"trust this file, rerun with the environment variable "
                f"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1"
            ) from e
        reason = next((line for line in lines if "WeightsUnpickler error" in line), lines[0])
        raise CheckpointError(f"{what} {path} cannot be read as a PyTorch checkpoint: {reason}") from e


def load_checkpoint(path, load: Optional[Callable] = None, what: str = "checkpoint") -> Dict:
    """The full state of the fairseq checkpoint ``path`` (see :func:`read_torch_file`; the default ``load`` gives
    it on the CPU as saved); CheckpointError naming it if it is not one."""
    state = read_torch_file(path, load, what)
    if not isinstance(state, Mapping) or not isinstance(state.get("model"), Mapping):
        raise CheckpointError(f"{what} {path} is not a fairseq checkpoint (it has no 'model' state dict)")
    return dict(state)


def _field(obj, key: str):
    """``obj[key]`` of a dict-like config, ``obj.key`` of a Namespace; None when absent."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def checkpoint_arch(state: Dict) -> Optional[str]:
    """The model arch a fairseq checkpoint records (``cfg.model._name``, ``cfg.model.arch`` or ``args.arch``)."""
    model_cfg = _field(state.get("cfg"), "model")
    return _field(model_cfg, "_name") or _field(model_cfg, "arch") or _field(state.get("args"), "arch")


def checkpoint_updates(state: Dict) -> Optional[int]:
    """The number of updates a fairseq checkpoint was saved after (``optimizer_history[-1]["num_updates"]``)."""
    history = state.get("optimizer_history")
    if isinstance(history, (list, tuple)) and history and isinstance(history[-1], Mapping):
        updates = history[-1].get("num_updates")
        if updates is not None:
            return int(updates)
    return None


class StateAverage:
    """Running average of model state dicts: float64 sums of the floating-point tensors, and the other entries,
    which must be equal in every state dict added; the modules' extra states are left out (see the module
    docstring)."""

    def __init__(self):
        self.count = 0
        self.first: Optional[str] = None
        self.reference: Dict = {}  # the first state dict's entries (floating tensors: only their shape and dtype)
        self.sums: Dict[str, torch.Tensor] = {}

    def add(self, model_state: Mapping, name: str) -> None:
        """Add one model state dict; ``name`` (its file) is what error messages call it."""
        model_state = {key: value for key, value in model_state.items() if key.split(".")[-1] != EXTRA_STATE}
        if self.first is None:
            self.first = name
            for key, value in model_state.items():
                if torch.is_tensor(value) and value.is_floating_point():
                    self.reference[key] = torch.empty(value.shape, dtype=value.dtype, device="meta")
                    self.sums[key] = value.detach().to(device="cpu", dtype=torch.float64, copy=True)
                else:
                    self.reference[key] = value
            self.count = 1
            return
        for key in self.reference:
            if key not in model_state:
                raise CheckpointError(f"{name} has no parameter {key!r}, which {self.first} has")
        for key in model_state:
            if key not in self.reference:
                raise CheckpointError(f"{name} has a parameter {key!r}, which {self.first} does not have")
        for key, expected in self.reference.items():
            value = model_state[key]
            if torch.is_tensor(expected) or torch.is_tensor(value):
                if not (torch.is_tensor(expected) and torch.is_tensor(value)):
                    raise CheckpointError(
                        f"{name}: {key!r} is a {type(value).__name__} but a {type(expected).__name__} in {self.first}"
                    )
                if tuple(value.shape) != tuple(expected.shape):
                    raise CheckpointError(
                        f"{name}: {key!r} has shape {tuple(value.shape)} but {tuple(expected.shape)} in {self.first}"
                    )
                if value.dtype != expected.dtype:
                    raise CheckpointError(
                        f"{name}: {key!r} has dtype {value.dtype} but {expected.dtype} in "
                        f"{self.first}; average checkpoints saved with the same precision"
                    )
                if key in self.sums:
                    self.sums[key].add_(value.detach().to(device="cpu", dtype=torch.float64))
                elif not torch.equal(value.cpu(), expected.cpu()):
                    raise CheckpointError(
                        f"{name}: {key!r} ({value.dtype}, not averaged) differs from its value "
                        f"in {self.first}; such entries must be equal in all inputs"
                    )
            elif value != expected:
                raise CheckpointError(f"{name}: {key!r} = {value!r} differs from {expected!r} in {self.first}")
        self.count += 1

    def result(self) -> Dict:
        """The averaged state dict, in the key order of the first one added."""
        if self.count == 0:
            raise CheckpointError("no state dicts to average")
        return {
            key: (self.sums[key] / self.count).to(expected.dtype) if key in self.sums else expected
            for key, expected in self.reference.items()
        }


def average_state_dicts(states: Sequence[Mapping], names: Optional[Sequence[str]] = None) -> Dict:
    """The average of model state dicts (parameter name -> tensor), as :class:`StateAverage` computes it;
    ``names`` (default: "state dict 1", ...) are used in error messages."""
    names = list(names) if names is not None else [f"state dict {i + 1}" for i in range(len(states))]
    average = StateAverage()
    for state, name in zip(states, names):
        average.add(state, name)
    return average.result()


def average_checkpoints(paths: Sequence, output) -> List[str]:
    """Write the average of the checkpoints ``paths`` to ``output``; returns the inputs' file names."""
    average = StateAverage()
    first_arch = first_arch_path = None
    newest = last = None  # (updates, state without "model") of the newest input, and that of the last one
    all_counted = True
    for path in paths:
        state = load_checkpoint(path)
        arch = checkpoint_arch(state)
        if arch is not None:
            if first_arch is None:
                first_arch, first_arch_path = arch, path
            elif arch != first_arch:
                raise CheckpointError(
                    f"{path} is a checkpoint of arch {arch!r} but {first_arch_path} of "
                    f"{first_arch!r}; average checkpoints of one training run"
                )
        average.add(state.pop("model"), str(path))
        state.pop("last_optimizer_state", None)  # the optimizer state of one input does not fit the average
        updates = checkpoint_updates(state)
        all_counted = all_counted and updates is not None
        if updates is not None and (newest is None or updates >= newest[0]):
            newest = (updates, state)
        last = state
    out = dict(newest[1] if all_counted else last)
    out["model"] = average.result()
    out["averaged_from"] = [os.path.basename(str(path)) for path in paths]
    tmp = str(output) + ".tmp"
    try:
        torch.save(out, tmp)
        os.replace(tmp, output)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return out["averaged_from"]


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m define_fairseq.tools.average_checkpoints",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--inputs", nargs="+", metavar="CHECKPOINT", help="the checkpoints to average")
    source.add_argument("--dir", metavar="SAVE_DIR", help="a fairseq-train --save-dir; use with --last N")
    parser.add_argument(
        "--last",
        type=int_at_least(1, "--last"),
        metavar="N",
        help="with --dir: average the N newest update checkpoints (checkpoint_<epoch>_<updates>.pt)",
    )
    parser.add_argument(
        "--epochs",
        action="store_true",
        help="with --dir: take the N newest epoch checkpoints (checkpoint<epoch>.pt) instead",
    )
    parser.add_argument("--output", required=True, metavar="OUT.pt", help="where to write the averaged checkpoint")
    args = parser.parse_args(argv)
    if args.dir is not None and args.last is None:
        parser.error("--dir needs --last N (how many of its newest checkpoints to average)")
    if args.dir is None and (args.last is not None or args.epochs):
        parser.error("--last and --epochs choose checkpoints of --dir SAVE_DIR; with --inputs, list the files")
    if args.inputs is not None:
        seen = {}
        for path in args.inputs:
            real = os.path.realpath(path)
            if real in seen:
                parser.error(f"--inputs: {path} is given twice (as {seen[real]} too); list each checkpoint once")
            seen[real] = path
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        parser.error(f"--output {args.output}: its directory {out_dir} does not exist")
    if os.path.isdir(args.output):
        parser.error(f"--output {args.output} is a directory; give a file name")
    try:
        paths = args.inputs if args.inputs is not None else last_checkpoints(args.dir, args.last, args.epochs)
        names = average_checkpoints(paths, args.output)
    except CheckpointError as e:
        raise SystemExit(f"error: {e}")
    except OSError as e:  # the message names the file
        raise SystemExit(f"error: {e}")
    print(f"averaged {len(names)} checkpoints: {', '.join(names)} -> {args.output}")


if __name__ == "__main__":
    main()
