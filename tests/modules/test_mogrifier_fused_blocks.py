"""The blocks and the 16-bit products of the fused Mogrifier kernels (mogrifier/fused.py), under Triton's CPU
interpreter: the block of the rank chosen for each GPU's shared memory (every rank gets one that fits, the whole
rank wherever it fits), a window with the rank in several chunks against the float64 reference path, and the
branch of the products that CUDA runs for bfloat16 and float16 (the tensor cores'), which the interpreter runs on
float16 when told to (its float16 products are exact, as its float32 branch's). What the compiler makes of them
(shared memory, tensor-core instructions): test_mogrifier_fused_compile.py."""

import pytest
import torch
from cuda_device import assert_close_at_scale
from test_mogrifier_fused import (  # noqa: F401 (poisoned_small_blocks: an autouse fixture, here too)
    REL,
    float64_layer,
    inputs,
    poisoned_small_blocks,
    run,
)
from triton_interpreter import import_interpreted

triton = pytest.importorskip("triton", reason="Triton is not installed: pip install -r requirements-dev.txt")
mt, mf = import_interpreted()
BLOCK_COLS = mf.BLOCK_COLS  # the kernels' own, before the fixture narrows it
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# float16 against float64: every buffer the kernels store is rounded to float16 (within eps / 2 of it), each value
# of a window about a dozen such roundings deep (the rounds' u, th and output, the gates, c and h, over 4 steps)
FLOAT16_REL = 8 * torch.finfo(torch.float16).eps

pytestmark = pytest.mark.usefixtures("kernels_interpreted")


def built(monkeypatch):
    """Every :class:`FusedRecurrence` built from now on, a list that fills (to read its ``block_k``, ``f32``)."""
    runs = []
    init = mf.FusedRecurrence.__init__

    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        runs.append(self)

    monkeypatch.setattr(mf.FusedRecurrence, "__init__", recorded)
    return runs


@pytest.mark.parametrize("arch", [(9, 0), (8, 0)], ids=["sm90", "sm80"])
def test_every_rank_gets_a_block_that_fits(monkeypatch, arch):
    """Ranks 1 to 4096 in float32, bfloat16 and float16, each round kernel: the block fits the GPU (by fused.py's
    estimate, which the compile test holds the compiled kernels to); the whole rank in one block wherever it
    fits (the kernels as they were), else the widest power of two that fits; the shipped ranks whole."""
    monkeypatch.setattr(mf, "BLOCK_COLS", BLOCK_COLS)
    limit = mf.SHARED_KB[arch] << 10
    for dtype in DTYPES:
        size = torch.finfo(dtype).bits // 8
        for backward in (False, True):
            fits = lambda block: mf.round_shared_memory(backward, size, block) <= limit  # noqa: E731
            for rank in range(1, 4097):
                block, whole = mf.rank_block(rank, dtype, limit, backward), max(16, triton.next_power_of_2(rank))
                assert fits(block) and (block == whole or (block < whole and not fits(2 * block))), (rank, block)
            for rank, block in ((48, 64), (84, 128)):  # the WikiText-2 and PTB archs'
                assert mf.rank_block(rank, dtype, limit, backward) == block
    expected = {  # rank 271 (the widest rank of the WikiText-2 widths), rank 911 (of the PTB widths)
        (9, 0): {torch.float32: ([256, 256], [256, 256]), torch.bfloat16: ([512, 512], [512, 512])},
        (8, 0): {torch.float32: ([256, 128], [256, 128]), torch.bfloat16: ([512, 512], [512, 512])},
    }
    for dtype, blocks in expected[arch].items():
        got = tuple([mf.rank_block(rank, dtype, limit, backward) for backward in (False, True)] for rank in (271, 911))
        assert got == blocks, dtype


def test_the_interpreter_chooses_blocks_as_an_h100():
    """The interpreter (CPU tensors) chooses blocks as an H100 would: 227 KB."""
    assert mf.shared_memory_limit(torch.device("cpu")) == 227 << 10


@pytest.mark.parametrize(
    "rounds, cap, mask_kind",
    # make test keeps the smallest case; CI runs the others once (make test-slow)
    [pytest.param(5, True, "step", marks=pytest.mark.slow), (2, False, "window")],
)
def test_rank_in_chunks_matches_the_float64_reference_path(monkeypatch, rounds, cap, mask_kind):
    """Rank 19 (m = 20, n = 37) where only 16 of it fit a block: two chunks, the second partly masked; the output,
    the state and every gradient as test_mogrifier_fused.py holds the whole rank in one block to."""
    layer = float64_layer(rounds, 19, cap)
    data = inputs(mask_kind)
    expected = run(layer, *data, reference=True)
    monkeypatch.setattr(mf, "shared_memory_limit", lambda device: mf.round_shared_memory(False, 4, 16))
    runs = built(monkeypatch)
    layer.float().kernels = "triton"
    got = run(layer, *data)
    assert runs and all(r.block_k == [16, 16] for r in runs), [r.block_k for r in runs]
    names = ["y", "h_T", "c_T", "dx", "dh0", "dc0"] + [f"d {name}" for name, _ in layer.named_parameters()]
    for a, b, name in zip(got, expected, names):
        assert_close_at_scale(a, b, name, REL)


# rank 19 in two chunks: its gradients in float16 are 10-25% off float64 at their scale (the torch fast path's too)
@pytest.mark.parametrize(
    "rounds, rank, mask_kind, against_float64",
    [
        pytest.param(5, 3, "step", True, marks=pytest.mark.slow),
        pytest.param(4, 0, "none", True, marks=pytest.mark.slow),
        (3, 19, "window", False),
    ],  # make test keeps the smallest case; CI runs the others once (make test-slow)
)
def test_float16_products_of_the_tensor_core_branch(monkeypatch, rounds, rank, mask_kind, against_float64):
    """float16 with the kernels' 16-bit branch of the products (``_dot`` with F32 false, what CUDA runs on the
    tensor cores): every output and gradient equal to the float32 branch's (the interpreter's float16 products
    are exact, its sums float32, as the tensor cores'), and within 8 float16 epsilons of the float64 reference
    path at each tensor's scale; low rank, full rank, and rank 19 in two chunks (no float64 check)."""
    layer = float64_layer(rounds, rank, True)
    data = inputs(mask_kind)
    expected = run(layer, *data, reference=True)
    monkeypatch.setattr(mf, "shared_memory_limit", lambda device: mf.round_shared_memory(False, 4, 16))
    layer.half().kernels = "triton"
    float32_branch = run(layer, *data)
    runs = built(monkeypatch)
    init = mf.FusedRecurrence.__init__

    def sixteen_bits(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.f32 = False

    monkeypatch.setattr(mf.FusedRecurrence, "__init__", sixteen_bits)
    got = run(layer, *data)
    assert runs and not any(r.f32 for r in runs)
    names = ["y", "h_T", "c_T", "dx", "dh0", "dc0"] + [f"d {name}" for name, _ in layer.named_parameters()]
    for a, b, c, name in zip(got, float32_branch, expected, names):
        assert a.dtype == torch.float16 and torch.equal(a, b), name
        if against_float64:
            assert_close_at_scale(a, c, name, FLOAT16_REL)
