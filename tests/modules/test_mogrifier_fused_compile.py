"""The fused Mogrifier kernels (mogrifier_fused.py) compiled by Triton for an H100/H200 (sm_90) on a machine without
a GPU: the branches that Triton's interpreter never runs (bfloat16 products on the tensor cores) and the compiler's
type checks, which the interpreter does not make. In a child process: Triton fixes at import whether the kernels
are compiled or interpreted, and the other tests import them interpreted."""

import os
import subprocess
import sys

import pytest

CHECK = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from define_fairseq.modules.mogrifier import fused as mf

cases = [
    (mf._round_forward_kernel, "bf16", dict(LOW_RANK=True, F32=False, BB=16, BN=64, BK=128)),
    (mf._round_backward_kernel, "bf16", dict(LOW_RANK=True, F32=False, BB=16, BN=64, BK=128)),
    (mf._round_forward_kernel, "fp32", dict(LOW_RANK=False, F32=True, BB=16, BN=64, BK=16)),
    (mf._round_backward_kernel, "fp32", dict(LOW_RANK=False, F32=True, BB=16, BN=64, BK=16)),
    (mf._cell_forward_kernel, "bf16", dict(NEXT=True, MASK=True, CAP=True, BLOCK=1024)),
    (mf._cell_backward_kernel, "bf16", dict(NEXT=True, MASK=True, CAP=True, BLOCK=1024)),
]
for kernel, dtype, constants in cases:
    names = kernel.arg_names
    signature = {
        name: "constexpr" if name in constants else "*" + dtype if name.endswith("_ptr") else "i32" for name in names
    }
    source = ASTSource(kernel, signature, {(names.index(k),): v for k, v in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    assert compiled.asm["cubin"], (kernel.fn.__name__, dtype)
print("ok")
"""


def test_kernels_compile_for_sm90(tmp_path):
    """Six kernels (each round kernel in bfloat16 at low rank and in float32 at full rank, each cell kernel in
    bfloat16 with every option) through Triton's compiler to an sm_90 cubin, from a fresh cache."""
    pytest.importorskip("triton", reason="Triton is not installed: pip install -r requirements-dev.txt")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr
