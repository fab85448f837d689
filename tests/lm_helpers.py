"""What the language-model tests share: random token batches, full log-probabilities, loading a checkpoint as
fairseq's programs do, a binarized split as one stream, and fairseq-eval-lm's loss and perplexity."""

import math
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


def check_beam_search_scores(model, dictionary, max_len_b: int = 7, seed: int = 1):
    """Beam search (fairseq's ``SequenceGenerator``, beam 3, incremental decoding) from a 2-word prefix for each of
    2 sentences: every hypothesis keeps its prefix, and the score of each of its positions equals the
    log-probability that the full forward pass gives that word after the hypothesis' earlier words."""
    from fairseq.sequence_generator import SequenceGenerator

    model.eval()
    generator = SequenceGenerator([model], dictionary, beam_size=3, max_len_b=max_len_b)
    prefix = tokens_batch(len(dictionary), batch=2, length=3, seed=seed)[:, 1:]
    sample = {"net_input": {"src_tokens": prefix, "src_lengths": torch.tensor([2, 2])}}
    with torch.no_grad():
        hypotheses = generator.generate([model], sample, prefix_tokens=prefix)
    for i, beam in enumerate(hypotheses):
        assert len(beam) == 3
        for hypo in beam:
            out = hypo["tokens"]
            assert torch.equal(out[:2], prefix[i])
            inputs = torch.cat([out.new_tensor([dictionary.eos()]), out[:-1]])[None]
            expected = log_probs(model, inputs)[0].gather(-1, out[:, None])[:, 0]
            torch.testing.assert_close(hypo["positional_scores"], expected, rtol=1e-4, atol=1e-4)


def check_generate_continues_a_prefix(data, checkpoint, *flags):
    """fairseq-generate on the valid split with the first 2 words of each sentence forced (``--prefix-size 2``),
    2 hypotheses per sentence (``flags`` choose beam or sampling): every hypothesis starts with its sentence's
    first 2 words and has a finite score."""
    proc = run_cli("fairseq-generate", data, "--user-dir", USER_DIR, "--task", "language_modeling",
                   "--path", checkpoint, "--gen-subset", "valid", "--cpu", "--nbest", "2", "--prefix-size", "2",
                   "--max-len-b", "6", "--batch-size", "4",
                   "--sample-break-mode", "eos",  # one sentence per sample: no EOS inside the prefix
                   *flags)
    targets = dict(re.findall(r"^T-(\d+)\t(.*)$", proc.stdout, re.M))
    hypotheses = re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", proc.stdout, re.M)
    assert targets and len(hypotheses) == 2 * len(targets)
    for index, score, text in hypotheses:
        assert text.split()[:2] == targets[index].split()[:2]
        assert math.isfinite(float(score))
