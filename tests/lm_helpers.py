"""What the language-model tests share: random token batches, full log-probabilities, loading a checkpoint as
fairseq's programs do, a binarized split as one stream, and fairseq-eval-lm's loss and perplexity."""

import re

import torch

from conftest import USER_DIR, run_cli


def tokens_batch(vocab: int, batch: int = 3, length: int = 9, seed: int = 0, bos: bool = True) -> torch.Tensor:
    """``[batch, length]`` random word ids in ``4 ... vocab - 1``; with ``bos`` the first column is EOS (2), as
    fairseq's language-modelling samples begin."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, vocab, (batch, length), generator=g)
    if bos:
        tokens[:, 0] = 2
    return tokens


def log_probs(model, tokens: torch.Tensor, **kwargs) -> torch.Tensor:
    """``[batch, length, V]`` log-probabilities of ``model(tokens, **kwargs)``, without autograd."""
    with torch.no_grad():
        return model.get_normalized_probs(model(tokens, **kwargs), log_probs=True)


def load(path, **overrides):
    """``(model in eval mode, task)`` of a checkpoint, loaded as fairseq's programs load it (``overrides``: its
    ``arg_overrides``)."""
    from fairseq import checkpoint_utils

    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides=overrides or None)
    return model.eval(), task


def split_stream(data, dictionary, split: str = "test") -> torch.Tensor:
    """The split's tokens as one stream (every line ends in EOS), as read from the binarized files."""
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(str(data / split), dictionary)
    return torch.cat([dataset[i] for i in range(len(dataset))]).long()


def last_float(pattern: str, text: str) -> float:
    """The number captured by ``pattern`` at its last match in ``text``."""
    found = re.findall(pattern, text)
    assert found, f"no match for {pattern!r} in:\n{text[-3000:]}"
    return float(found[-1])


def eval_lm(data, checkpoint, *flags):
    """``(loss in bits per token, perplexity)`` that fairseq-eval-lm reports for the test split (CPU)."""
    proc = run_cli("fairseq-eval-lm", data, "--user-dir", USER_DIR, "--path", checkpoint, "--gen-subset", "test",
                   "--cpu", "--num-workers", "0", *flags)
    out = proc.stdout + proc.stderr
    return last_float(r"Loss \(base 2\): ([\d.]+)", out), last_float(r"Perplexity: ([\d.]+)", out)
