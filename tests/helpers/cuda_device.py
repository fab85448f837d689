"""Where the CUDA tests run, and what they share: the device, the skip without one, fp32 arithmetic, counting
synchronising CUDA calls, and comparing a device's tensors with the CPU's.

The CUDA tests (marked ``cuda``; ``pytest -m cuda`` runs them alone) compare what the plugin computes on a CUDA
device with the CPU and run fairseq's programs on the GPU. ``DEFINE_FAIRSEQ_CUDA_TESTS`` says where:

* unset: on the GPU; without a CUDA device they are skipped;
* ``gpu``: on the GPU, which must be there (importing this module fails without one): nothing is skipped;
* ``cpu``: on the CPU, to check the harness on a machine without a GPU: "the device" is a second copy on the CPU
  and fairseq's programs run with ``--cpu``, so that the model building and copying, the training steps, the
  comparisons, the command lines and the parsing of their logs all run. What only a GPU can show is then vacuous
  (no synchronising call can be counted, no cuDNN kernel runs); the tests say where.
"""

import contextlib
import os
import warnings

import pytest
import torch

MODE_VARIABLE = "DEFINE_FAIRSEQ_CUDA_TESTS"
MODE = os.environ.get(MODE_VARIABLE, "").strip().lower()
if MODE not in ("", "gpu", "cpu"):
    raise ValueError(
        f"{MODE_VARIABLE}={MODE!r}: give gpu (run the CUDA tests, a GPU is required), cpu (run them on "
        f"the CPU to check their harness) or nothing (run them on a GPU, skip them without one)"
    )
if MODE == "gpu" and not torch.cuda.is_available():
    raise RuntimeError(
        f"{MODE_VARIABLE}=gpu but torch sees no CUDA device (torch {torch.__version__}, CUDA "
        f"{torch.version.cuda}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
    )
ON_CPU = MODE == "cpu"
DEVICE = torch.device("cpu" if ON_CPU else "cuda")

# pytestmark of every CUDA test module
CUDA_TESTS = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        MODE == "" and not torch.cuda.is_available(),
        reason=f"no CUDA device ({MODE_VARIABLE}=cpu runs these tests on the CPU)",
    ),
]

# fairseq's programs: on the GPU unless the tests run on the CPU
DEVICE_FLAGS = ["--cpu"] if ON_CPU else []

# the message of every synchronising call under torch.cuda.set_sync_debug_mode("warn")
SYNC_WARNING = "called a synchronizing CUDA operation"


@contextlib.contextmanager
def fp32_arithmetic():
    """Matrix products and cuDNN in true float32 (TF32 off) while inside; the previous settings afterwards.

    cuDNN allows TF32 by default (10 mantissa bits): an LSTM or convolution would then differ from the CPU by
    about 1e-3 relative, far more than float32's rounding."""
    if DEVICE.type != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@contextlib.contextmanager
def counted_syncs():
    """Counts the calls that make the host wait for the device while inside: yields a list that receives the Python
    line (``file:line``) of each synchronising call (``torch.cuda.set_sync_debug_mode("warn")``: a copy to the host
    such as ``.item()``, ``.cpu()`` or ``bool(tensor)``, an op whose output size depends on the data such as
    ``nonzero``, boolean-mask indexing or ``torch.unique``, a copy from pageable host memory). Nothing is counted on
    the CPU."""
    found = []
    if DEVICE.type != "cuda":
        yield found
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    found += [f"{w.filename}:{w.lineno}" for w in caught if SYNC_WARNING in str(w.message)]


def to_device(sample, device=DEVICE):
    """A fairseq batch with every tensor on ``device`` (the other values as they are)."""
    from fairseq import utils

    return utils.apply_to_sample(lambda t: t.to(device), sample)


def assert_close_at_scale(actual, expected, what: str, rel: float, floor: float = 0.0, slack: float = 0.0):
    """``max |actual - expected| <= rel * max(max |expected|, floor) + slack``, computed in float64 on the CPU.

    The tolerance follows the largest magnitude of the tensor (or ``floor``), not each element's: an element that is
    the small difference of large terms (a gradient summed over a batch) keeps the absolute rounding error of those
    terms."""
    actual = actual.detach().to("cpu", torch.float64)
    expected = expected.detach().to("cpu", torch.float64)
    assert actual.shape == expected.shape, f"{what}: shape {list(actual.shape)} != {list(expected.shape)}"
    assert torch.isfinite(actual).all(), f"{what}: not finite on {DEVICE}"
    scale = max(expected.abs().max().item() if expected.numel() else 0.0, floor)
    error = (actual - expected).abs().max().item() if expected.numel() else 0.0
    assert error <= rel * scale + slack, (
        f"{what}: differs from the CPU by up to {error:.3g}, more than {rel:g} x {scale:.3g} + {slack:.3g}"
    )
