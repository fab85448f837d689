"""The Triton Mogrifier step and the fast path's fused kernels (``MogrifierLSTMLayer.kernels``) compiled for the CUDA
device: a sequence against the layer's reference path in float64 (outputs, state, every gradient) at sizes that span
several programs, and in bfloat16 no further from it than the torch fast path in bfloat16. In a child process: Triton
fixes at import whether the kernels are compiled or interpreted, and test_mogrifier_triton.py imports them
interpreted.

Marked ``cuda``; skipped without a CUDA device; ``DEFINE_FAIRSEQ_CUDA_TESTS=cpu`` runs the child in Triton's
interpreter on the CPU (see ``cuda_device``).
"""

import os
import subprocess
import sys

import pytest
from cuda_device import CUDA_TESTS, DEVICE, ON_CPU

pytestmark = CUDA_TESTS

CHECK = """
import sys
import torch
from define_fairseq.modules.mogrifier import fused as mf
from define_fairseq.modules.mogrifier import triton_step as mt
from define_fairseq.modules.mogrifier.layer import MogrifierLSTMLayer

device = torch.device(sys.argv[1])
torch.backends.cuda.matmul.allow_tf32 = False
mt._new = lambda like, *shape: torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)
new = mf.LayerRecurrence.new
mf.LayerRecurrence.new = lambda self, *shape: new(self, *shape).fill_(float("nan"))
T, B, m, n = 6, 5, 200, 300  # B * n = 1500 elements: two programs of 1024, the second partly masked


def run(forward, layer, dtype):
    inputs = [t.detach().to(dtype).requires_grad_(True) for t in (x, h0, c0)]
    y, (h, c) = forward(layer.to(dtype), *inputs, mask.to(dtype))
    grads = torch.autograd.grad([y, c], inputs + list(layer.parameters()), [dy.to(dtype), dc.to(dtype)])
    return [t.double() for t in (y, h, c, *grads)]


for rounds, rank, cap in [(5, 16, True), (4, 0, False), (0, 0, True)]:
    torch.manual_seed(0)
    layer = MogrifierLSTMLayer(m, n, rounds=rounds, rank=rank, cap_input_gate=cap).to(device)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.1)
    x, h0, c0 = torch.randn(T, B, m, device=device), torch.randn(B, n, device=device), torch.randn(B, n, device=device)
    mask = (torch.rand(T, B, n, device=device) > 0.3).float() / 0.7
    dy, dc = torch.randn(T, B, n, device=device), torch.randn(B, n, device=device)
    reference = run(lambda layer, *a: layer(*a, reference=True), layer, torch.float64)
    layer.kernels = "triton"  # the fused kernels (what "auto" runs on CUDA)
    paths = {"step": mt.triton_mogrifier_layer}
    if rounds:  # the fused kernels run layers with rounds
        paths["fused"] = lambda layer, *a: layer(*a)
    for name, forward in paths.items():
        got = run(forward, layer, torch.float32)
        # float32 through 200- and 300-wide products and 6 steps back: within 1e-5 of each tensor's largest element
        # (the float32 reference path is off from float64 by up to 2e-6 of it)
        for i, (a, b) in enumerate(zip(got, reference)):
            scale = b.abs().max().item()
            what = (name, rounds, rank, i)
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * scale, msg=lambda text: f"{what}: {text}")
    layer.kernels = "torch"
    fast16 = run(lambda layer, *a: layer(*a), layer, torch.bfloat16)[0]
    layer.kernels = "triton"
    for name, forward in paths.items():
        y16 = run(forward, layer, torch.bfloat16)[0]
        error, fast_error = (y16 - reference[0]).abs().mean(), (fast16 - reference[0]).abs().mean()
        # Triton's interpreter rounds float32 to bfloat16 by truncation (up to 2x the fast path's error there), the
        # compiled kernels to nearest
        bound = 2.0 if mt.INTERPRETED else 1.5
        assert error < bound * fast_error, (name, rounds, rank, error.item(), fast_error.item())
print("ok")
"""


def test_compiled_kernels_match_the_reference_path():
    pytest.importorskip("triton", reason="Triton is not installed: pip install -r requirements-dev.txt")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if ON_CPU:
        env["TRITON_INTERPRET"] = "1"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run(
        [sys.executable, "-c", CHECK, str(DEVICE)], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr
