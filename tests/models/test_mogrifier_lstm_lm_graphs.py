"""``mogrifier_lstm_lm`` runs its BPTT windows on a GPU as CUDA graphs unless ``--mogrifier-no-cuda-graphs``: the
flags, gradient accumulation over two batches (``--update-freq 2``) through graphs that hand out static buffers (a
stand-in on the CPU, the real graphs marked ``cuda``) against the eager path, and (marked ``cuda``) the model's
windows with the state carried, graphs against eager (the graphs themselves: tests/modules/test_mogrifier_graphs.py).
"""

import re

import pytest
import torch
from arch_cases import NO_DROPOUT
from conftest import plugin_args, run_cli, setup_model
from cuda_device import CUDA_TESTS, DEVICE, DEVICE_FLAGS, fp32_arithmetic
from static_graphs import static_buffer_capture
from test_mogrifier_lstm_lm import TINY

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)
from define_fairseq.modules.mogrifier import graphs as mogrifier_graphs

ARCH = "mogrifier_lstm_lm_ptb"
TRAIN_INNER = re.compile(r"\| train_inner \| .*?\bloss=([^,\s]+)")
cuda_mark, skip_without_cuda = CUDA_TESTS


def test_cuda_graphs_are_the_default_and_the_flag_turns_them_off(lm_data):
    for flags, on in (([], True), (["--mogrifier-no-cuda-graphs"], False)):
        _, _, model = setup_model(lm_data, ARCH, *TINY[ARCH], *flags)
        assert model.decoder.lstm.cuda_graphs is on


@pytest.mark.parametrize("kernels", ["auto", "triton", "torch"])
def test_the_kernels_flag_reaches_every_layer(lm_data, kernels):
    _, _, model = setup_model(lm_data, ARCH, *TINY[ARCH], "--mogrifier-kernels", kernels)
    assert [layer.kernels for layer in model.decoder.lstm.layers] == [kernels] * 2


def accumulated_gradients(decoder, batches, device="cpu"):
    """``.grad`` of every parameter after one backward per batch (fairseq's ``--update-freq``: from None, the state
    carried detached from one batch to the next)."""
    state = None
    for tokens in batches:
        x, state, _ = decoder.recur(tokens.to(device), state)
        decoder.output_layer(x).log_softmax(-1)[..., 4].sum().backward()
        state = [(h.detach(), c.detach()) for h, c in state]
    return [p.grad.clone() for p in decoder.parameters()]


def decoders(lm_data, device="cpu", dtype=torch.float64):
    """The tiny model's decoder twice, the same weights, without dropout: with graphs and with the eager path."""
    pair = []
    for flags in ([], ["--mogrifier-no-cuda-graphs"]):
        torch.manual_seed(0)
        _, task, model = setup_model(lm_data, ARCH, *TINY[ARCH], *NO_DROPOUT["mogrifier_lstm_lm"], *flags)
        pair.append(model.decoder.to(device=device, dtype=dtype).train())
    batches = torch.randint(4, len(task.target_dictionary), (2, 4, 6), generator=torch.Generator().manual_seed(1))
    return pair, batches


def test_update_freq_2_through_static_buffers_equals_the_eager_path(lm_data, monkeypatch):
    """The decoder's two batches through a capture that hands out static buffers as CUDA graphs do: every
    accumulated gradient equals the eager path's, float64, to 1e-12."""
    monkeypatch.setattr(mogrifier_graphs.WindowGraphs, "capture_training", staticmethod(static_buffer_capture))
    monkeypatch.setattr(mogrifier_graphs.WindowGraphs, "usable", lambda self, x, masks: masks is None)
    (graphed, eager), batches = decoders(lm_data)
    got, want = accumulated_gradients(graphed, batches), accumulated_gradients(eager, batches)
    assert graphed.lstm.graphs.graphs  # the windows ran through the stand-in
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@cuda_mark
@skip_without_cuda
def test_windows_with_carried_state_equal_the_eager_path(lm_data):
    """Three training windows of the decoder (no dropout), the state carried from one to the next, then one
    evaluation window: the logits and every gradient with graphs equal those without, to float32 rounding."""
    results = []
    for flags in ([], ["--mogrifier-no-cuda-graphs"]):
        torch.manual_seed(0)
        _, task, model = setup_model(lm_data, ARCH, *TINY[ARCH], *NO_DROPOUT["mogrifier_lstm_lm"], *flags)
        decoder = model.decoder.to(DEVICE).train()
        vocab = len(task.target_dictionary)
        tokens = torch.randint(4, vocab, (3, 4, 6), generator=torch.Generator().manual_seed(1)).to(DEVICE)
        state, got = None, []
        with fp32_arithmetic():
            for window in tokens:
                x, state, _ = decoder.recur(window, state)
                logits = decoder.output_layer(x)
                grads = torch.autograd.grad(logits.logsumexp(-1).sum(), list(decoder.parameters()))
                got += [logits.detach(), *[g.clone() for g in grads]]  # a replay's gradients are its buffers
                state = [(h.detach(), c.detach()) for h, c in state]
            with torch.no_grad():
                got.append(decoder.eval().output_layer(decoder.recur(tokens[0], state)[0]))
        results.append(got)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@cuda_mark
@skip_without_cuda
def test_update_freq_2_on_the_device_equals_the_eager_path(lm_data):
    """The decoder's two batches on the device with real CUDA graphs, float32 with TF32 off: the accumulated
    gradients equal the eager path's to float32 rounding of the same kernels."""
    with fp32_arithmetic():
        (graphed, eager), batches = decoders(lm_data, DEVICE, torch.float32)
        got, want = accumulated_gradients(graphed, batches, DEVICE), accumulated_gradients(eager, batches, DEVICE)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@cuda_mark
@skip_without_cuda
def test_fairseq_train_with_update_freq_2_matches_the_eager_path(lm_data, tmp_path):
    """``fairseq-train --update-freq 2`` for three updates without dropout, graphs against
    ``--mogrifier-no-cuda-graphs``: the same losses at every logged update (to float32 rounding), and no fallback."""
    losses = []
    for name, flags in (("graphs", []), ("eager", ["--mogrifier-no-cuda-graphs"])):
        argv = plugin_args(
            lm_data, ARCH, *TINY[ARCH], *NO_DROPOUT["mogrifier_lstm_lm"], *DEVICE_FLAGS, *flags, "--optimizer", "adam",
            "--lr", "0.005", "--update-freq", "2", "--max-update", "3", "--batch-size", "4", "--tokens-per-sample", "8",
            "--no-save", "--disable-validation",
            "--save-dir", tmp_path / name, "--log-format", "simple", "--log-interval", "1", "--num-workers", "0",
            "--seed", "3", task="stateful_lm",
        )  # fmt: skip
        output = run_cli("fairseq-train", *argv).stdout
        assert "failed its check" not in output
        losses.append([float(loss) for loss in TRAIN_INNER.findall(output)])
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], rel=1e-4)
