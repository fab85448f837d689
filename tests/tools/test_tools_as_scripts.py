"""The recipes run the text and checkpoint tools as scripts (``python define_fairseq/tools/TOOL.py``, recipes/lib.sh
``lib_tool``), once per file of a corpus: run so, a tool works and loads neither the plugin package nor fairseq
(whose import alone takes seconds)."""

import subprocess
import sys

import pytest
from conftest import REPO

TOOLS = REPO / "define_fairseq" / "tools"


def run_script(tool, *args, stdin=""):
    """Run TOOL.py as a script with -X importtime: (exit code, stdout, the names of the modules it imported)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(TOOLS / f"{tool}.py"), *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return proc.returncode, proc.stdout, imported


def test_the_tokenizer_runs_as_a_script_without_fairseq():
    code, out, imported = run_script(
        "moses_text", "tokenize", "-l", "en", "-j", "2", stdin="Hello, well-known world!\n"
    )
    assert code == 0
    assert out == "Hello , well @-@ known world !\n"
    assert "sacremoses" in imported  # the check sees the imports ...
    assert not {name for name in imported if name.split(".")[0] in ("fairseq", "define_fairseq")}  # ... and not these


@pytest.mark.parametrize("tool", ["clean_parallel", "sgm_text", "average_checkpoints"])
def test_the_other_recipe_tools_start_without_fairseq(tool):
    code, out, imported = run_script(tool, "--help")
    assert code == 0 and out.startswith("usage:")
    assert "argparse" in imported
    assert not {name for name in imported if name.split(".")[0] in ("fairseq", "define_fairseq")}
