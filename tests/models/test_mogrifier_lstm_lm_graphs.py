"""``mogrifier_lstm_lm`` runs its BPTT windows on a GPU as CUDA graphs unless ``--mogrifier-no-cuda-graphs``: the
flag, and (marked ``cuda``) the model's windows with the state carried, graphs against eager (the graphs themselves:
tests/modules/test_mogrifier_graphs.py)."""

import torch
from arch_cases import NO_DROPOUT
from conftest import setup_model
from cuda_device import CUDA_TESTS, DEVICE, fp32_arithmetic
from test_mogrifier_lstm_lm import TINY

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)

ARCH = "mogrifier_lstm_lm_ptb"
cuda_mark, skip_without_cuda = CUDA_TESTS


def test_cuda_graphs_are_the_default_and_the_flag_turns_them_off(lm_data):
    for flags, on in (([], True), (["--mogrifier-no-cuda-graphs"], False)):
        _, _, model = setup_model(lm_data, ARCH, *TINY[ARCH], *flags)
        assert model.decoder.lstm.cuda_graphs is on


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
                got += [logits.detach(), *grads]
                state = [(h.detach(), c.detach()) for h, c in state]
            with torch.no_grad():
                got.append(decoder.eval().output_layer(decoder.recur(tokens[0], state)[0]))
        results.append(got)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
