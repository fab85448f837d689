"""A file that is not a checkpoint, given to the checkpoint tools (average_checkpoints, fold_define, distill_c2s,
c2s_checkpoint), stops them with one ``error: ...`` line naming the file and saying what is wrong, not a traceback
from the unpickler."""

import datetime
import io
import re

import pytest
import torch
from conftest import run_module

from define_fairseq.tools import average_checkpoints, c2s_checkpoint, distill_c2s, fold_define

TOOLS = {
    "average_checkpoints": lambda path, out: average_checkpoints.main(["--inputs", str(path), "--output", str(out)]),
    "fold_define": lambda path, out: fold_define.main([str(path), str(out)]),
    "distill_c2s": lambda path, out: distill_c2s.main(["--checkpoint", str(path), "--output", str(out)]),
    "c2s_checkpoint": lambda path, out: c2s_checkpoint.main(
        ["--checkpoint", str(path), "--c2s", str(path), "--output", str(out)]
    ),
}
# the command line of each tool for the same call
ARGV = {
    "average_checkpoints": lambda path, out: ["--inputs", path, "--output", out],
    "fold_define": lambda path, out: [path, out],
    "distill_c2s": lambda path, out: ["--checkpoint", path, "--output", out],
    "c2s_checkpoint": lambda path, out: ["--checkpoint", path, "--c2s", path, "--output", out],
}


def checkpoint_bytes(legacy=False) -> bytes:
    """A small file in the form fairseq-train writes (torch.save's zip format, or its legacy format)."""
    state = {"model": {"decoder.weight": torch.randn(64, 32)}, "cfg": None, "optimizer_history": []}
    buffer = io.BytesIO()
    torch.save(state, buffer, _use_new_zipfile_serialization=not legacy)
    return buffer.getvalue()


BAD_FILES = {  # name -> (contents, what the message says)
    "text.pt": (b"not a checkpoint\n", r"not in torch.save's format \(it begins with b'not a checkpoint"),
    "empty.pt": (b"", "the file is empty"),
    "truncated.pt": (checkpoint_bytes()[:3000], "the zip archive is incomplete"),
}


@pytest.mark.parametrize("tool", list(TOOLS))
@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_file_that_is_not_a_checkpoint_is_one_error_line(tool, name, tmp_path):
    contents, says = BAD_FILES[name]
    path, out = tmp_path / name, tmp_path / "out.pt"
    path.write_bytes(contents)
    with pytest.raises(SystemExit) as error:
        TOOLS[tool](path, out)
    message = str(error.value.code)
    assert message.startswith("error: ") and "\n" not in message
    assert str(path) in message and "cannot be read as a PyTorch checkpoint" in message
    assert re.search(says, message), message
    assert not out.exists()


@pytest.mark.parametrize("tool", list(TOOLS))
def test_the_command_prints_only_the_error_line(tool, tmp_path):
    path = tmp_path / "truncated.pt"
    path.write_bytes(BAD_FILES["truncated.pt"][0])
    proc = run_module(f"define_fairseq.tools.{tool}", *ARGV[tool](path, tmp_path / "out.pt"), check=False)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ") or "Traceback" in line]
    assert lines == [
        f"error: {'--checkpoint' if 'c2s' in tool else 'checkpoint'} {path} cannot be read as a "
        f"PyTorch checkpoint: the zip archive is incomplete (truncated, e.g. by an interrupted write "
        f"or copy)"
    ], proc.stderr[-3000:]


def test_a_truncated_legacy_file_and_a_refused_object(tmp_path):
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(checkpoint_bytes(legacy=True)[:-200])  # the header is fine, the tensor data stops early
    for tool in ("average_checkpoints", "fold_define"):
        with pytest.raises(
            SystemExit,
            match=rf"^error: checkpoint {legacy} cannot be read as a PyTorch checkpoint: "
            rf"unexpected EOF",
        ):
            TOOLS[tool](legacy, tmp_path / "out.pt")
    # a complete checkpoint holding an object torch.load(weights_only=True) does not allow: named, with the way out
    refused = tmp_path / "refused.pt"
    torch.save({"model": {}, "cfg": None, "when": datetime.date(2020, 1, 1)}, refused)
    with pytest.raises(SystemExit, match=r"refused.*datetime.*TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1"):
        TOOLS["fold_define"](refused, tmp_path / "out.pt")


def test_a_bad_c2s_module_file_is_named(tmp_path):
    path = tmp_path / "module.pt"
    path.write_bytes(b"")
    with pytest.raises(average_checkpoints.CheckpointError, match=rf"^--c2s {path} cannot be read .*empty"):
        distill_c2s.read_distilled(str(path))
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(average_checkpoints.CheckpointError, match="is not a file written by"):
        distill_c2s.read_distilled(str(path))
