"""Loading the plugin costs a fairseq command little: ``torch._dynamo``, inductor and Triton (about a second and
900 modules) are imported only when a model compiles or launches a Triton kernel, never by ``--user-dir`` or by
an eager forward; ``transformers``, a test dependency, never. Each check runs in a new interpreter, whose
``sys.modules`` holds only what it imported."""

import json
import subprocess
import sys

import pytest
from conftest import REPO

HEAVY = ("torch._dynamo", "torch._inductor", "triton", "sympy")

LOAD_PLUGIN = f"""
import json, sys
from argparse import Namespace
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.utils import import_user_module
import_user_module(Namespace(user_dir={str(REPO / "define_fairseq")!r}))
"""

REPORT = """
print(json.dumps({
    "heavy": [m for m in %r if m in sys.modules],
    "transformers": sorted(m for m in sys.modules if m.split(".")[0] == "transformers"),
    "archs": sorted(ARCH_MODEL_REGISTRY),
}))
""" % (HEAVY,)

EAGER_FORWARDS = """
import torch
from define_fairseq.modules.define.embedding import DeFINEEmbedding
from define_fairseq.modules.mogrifier.layer import MogrifierLSTMLayer
emb = DeFINEEmbedding(50, 8, 16, 12, padding_idx=1)
tokens = torch.randint(2, 50, (3, 4))
emb(tokens).sum().backward()
with torch.no_grad():
    emb.eval()(tokens)  # the cached table's lookup, which compiled graphs keep out
layer = MogrifierLSTMLayer(8, 8, rounds=5, rank=4)
out, _ = layer(torch.randn(4, 3, 8, requires_grad=True), torch.zeros(3, 8), torch.zeros(3, 8))
out.sum().backward()
"""


def run_python(source: str) -> dict:
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def loaded():
    return run_python(LOAD_PLUGIN + REPORT)


def test_loading_the_plugin_as_a_user_dir_imports_no_compiler_and_no_triton(loaded):
    assert loaded["heavy"] == []


def test_loading_the_plugin_leaves_transformers_unimported(loaded):
    """``transformers`` is a test dependency only (tests/models/test_transformer_xl_hf.py compares against it)."""
    assert loaded["transformers"] == []


def test_the_check_sees_the_plugin_loaded(loaded):
    assert {"transformer_define", "mogrifier_lstm_lm", "gcnn_lm", "transformer_c2s"} <= set(loaded["archs"])


def test_eager_training_and_evaluation_forwards_import_no_compiler_and_no_triton():
    assert run_python(LOAD_PLUGIN + EAGER_FORWARDS + REPORT)["heavy"] == []
