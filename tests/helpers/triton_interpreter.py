"""The Triton Mogrifier modules with their kernels interpreted (Triton's CPU interpreter), for the tests that run
them on CPU tensors. Triton fixes at a kernel's definition whether it is compiled or interpreted, so the modules are
imported again under ``TRITON_INTERPRET=1``, and again without it afterwards where a CUDA device may run later tests
in the same process."""

import contextlib
import importlib
import os

import pytest
import torch

MODULES = ("define_fairseq.modules.mogrifier.triton_step", "define_fairseq.modules.mogrifier.fused")


@contextlib.contextmanager
def interpreted():
    """TRITON_INTERPRET=1 while Triton decorates kernels (it decides at definition), as before after."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before


def import_interpreted():
    """``(mogrifier_triton, mogrifier_fused)`` with interpreted kernels (the same module objects from then on)."""
    with interpreted():
        modules = [importlib.import_module(name) for name in MODULES]
        if not modules[0].INTERPRETED:  # imported earlier without the interpreter: define the kernels again
            modules = [importlib.reload(module) for module in modules]
    return modules


@pytest.fixture(scope="module")
def kernels_interpreted():
    """The kernels interpreted in a test file that marks itself with ``pytest.mark.usefixtures`` of this fixture,
    compiled again after it when a CUDA device is there."""
    import_interpreted()
    yield
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        for name in MODULES:
            importlib.reload(importlib.import_module(name))
