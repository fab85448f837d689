"""``python -m define_fairseq.tools.train --cpu`` treats denormal floats as zero (an LSTM's CPU backward slows down
many times over on them); on GPUs it leaves the CPU's floating-point mode alone."""

import threading

import pytest
import torch

from define_fairseq.tools.train import flush_denormals

DENORMAL = 1e-39  # below float32's smallest normal number, 1.18e-38


@pytest.fixture(autouse=True)
def restore_the_mode():
    yield
    torch.set_flush_denormal(False)


def product() -> float:
    return (torch.tensor([DENORMAL], dtype=torch.float32) * 1.0).item()


def test_training_on_the_cpu_flushes_denormals_to_zero():
    torch.set_flush_denormal(False)
    assert product() != 0.0
    flush_denormals(cpu=True)
    assert product() == 0.0


def test_threads_started_afterwards_flush_them_too():
    flush_denormals(cpu=True)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(product()))
    thread.start()
    thread.join()
    assert seen == [0.0]


def test_training_on_a_gpu_leaves_the_mode_alone():
    torch.set_flush_denormal(False)
    flush_denormals(cpu=False)
    assert product() != 0.0
