"""What the language-model tests share: random token batches, full log-probabilities, a checkpoint trained by
fairseq-train and loading it as fairseq's programs do, a recurrent LM saved and loaded with its carried state, a
binarized split as one stream and its NLL scored in process, fairseq-eval-lm's loss and perplexity,
fairseq-generate's hypotheses, and the checks of incremental decoding, beam search and fairseq-generate against the
full pass."""

import math
import re

import torch
from conftest import USER_DIR, fairseq_train, run_cli


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


def saved_and_loaded(cfg, task, model, path) -> tuple:
    """A recurrent LM after one training forward (so that it carries a state), saved to ``path`` by fairseq's
    ``Trainer`` and loaded back as fairseq's programs load it: the state is in the checkpoint with its batch size,
    and the loaded model's log-probabilities equal the original's exactly. Returns ``(loaded model, tokens)``."""
    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    tokens = tokens_batch(len(task.target_dictionary))
    model.decoder(tokens, reset_state=True)  # a training state is carried, and saved with the weights
    Trainer(cfg, task, model, task.build_criterion(cfg.criterion)).save_checkpoint(str(path), {})
    state = torch.load(path, map_location="cpu", weights_only=False)
    assert state["model"]["decoder.carried_state._extra_state"]["ranks"][0]["batch_size"] == len(tokens)
    (loaded,), _ = checkpoint_utils.load_model_ensemble([str(path)])
    torch.testing.assert_close(log_probs(loaded.eval(), tokens), log_probs(model.eval(), tokens), rtol=0, atol=0)
    return loaded, tokens


def trained_checkpoint(data, save_dir, arch, *flags, task="language_modeling", updates=3):
    """``checkpoint_last.pt`` of a fairseq-train run of ``arch`` for ``updates`` updates (``conftest.fairseq_train``;
    the checkpoint without the optimizer state) whose last validation loss is finite."""
    proc = fairseq_train(data, save_dir, arch, *flags, "--max-update", updates, "--no-save-optimizer-state", task=task)
    assert math.isfinite(last_float(r"valid on 'valid' subset \| loss ([\d.]+)", proc.stdout + proc.stderr))
    return save_dir / "checkpoint_last.pt"


def split_stream(data, dictionary, split: str = "test") -> torch.Tensor:
    """The split's tokens as one stream (every line ends in EOS), as read from the binarized files."""
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(str(data / split), dictionary)
    return torch.cat([dataset[i] for i in range(len(dataset))]).long()


def split_nll_bits(model, data, dictionary, block=None, carry=False) -> float:
    """Mean NLL (bits per token) of the test split scored in process as fairseq-eval-lm scores it: the split as one
    stream (its inputs shifted right, EOS first) in blocks of ``block`` tokens (``None``: one block), each from a
    fresh start, or with ``carry`` the state carried from one block to the next."""
    stream = split_stream(data, dictionary)
    inputs = torch.cat([stream.new_tensor([dictionary.eos()]), stream[:-1]])
    block = block or len(stream)
    nll = 0.0
    for start in range(0, len(stream), block):
        kwargs = {"reset_state": start == 0} if carry else {}
        target = stream[None, start : start + block]
        lp = log_probs(model, inputs[None, start : start + block], **kwargs)
        nll -= lp.gather(-1, target[..., None]).sum().item()
    return nll / len(stream) / math.log(2)


def last_float(pattern: str, text: str) -> float:
    """The number captured by ``pattern`` at its last match in ``text``."""
    found = re.findall(pattern, text)
    assert found, f"no match for {pattern!r} in:\n{text[-3000:]}"
    return float(found[-1])


def eval_lm(data, checkpoint, *flags, cpu: bool = True):
    """``(loss in bits per token, perplexity)`` that fairseq-eval-lm reports for the test split (on the CPU; with
    ``cpu=False`` on the GPU)."""
    proc = run_cli(
        "fairseq-eval-lm",
        data,
        "--user-dir",
        USER_DIR,
        "--path",
        checkpoint,
        "--gen-subset",
        "test",
        *(["--cpu"] if cpu else []),
        "--num-workers",
        "0",
        *flags,
    )
    out = proc.stdout + proc.stderr
    return last_float(r"Loss \(base 2\): ([\d.]+)", out), last_float(r"Perplexity: ([\d.]+)", out)


def check_incremental_decoding(
    model,
    tokens: torch.Tensor,
    encoder_out=None,
    split: int = 5,
    first: int = 1,
    rtol: float = 1e-5,
    atol: float = 1e-5,
):
    """The decoder of ``model`` (in eval mode) fed ``tokens [B, T]`` (B >= 3) incrementally, as beam search feeds
    it: the first ``first`` positions in one call, then one position per call; after ``split`` positions the rows are
    reordered (``[2, 0, 0, 1]``: one dropped, one duplicated) with ``reorder_incremental_state_scripting`` (and
    ``encoder_out`` with the encoder's ``reorder_encoder_out``). Every step's log-probabilities equal those of
    the full pass over the (reordered) rows."""
    model.eval()
    decode = {} if encoder_out is None else {"encoder_out": encoder_out}

    def scores(prefix, **kwargs):
        return model.get_normalized_probs(model.decoder(prefix, **decode, **kwargs), log_probs=True)

    order = torch.tensor([2, 0, 0, 1], device=tokens.device)
    state = {}
    with torch.no_grad():
        full = scores(tokens)
        steps = [scores(tokens[:, : t + 1], incremental_state=state) for t in range(first - 1, split)]
        model.decoder.reorder_incremental_state_scripting(state, order)
        if encoder_out is not None:
            decode["encoder_out"] = model.encoder.reorder_encoder_out(encoder_out, order)
        reordered = tokens[order]
        more = [scores(reordered[:, : t + 1], incremental_state=state) for t in range(split, tokens.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full[:, :split], rtol=rtol, atol=atol)
    torch.testing.assert_close(torch.cat(more, dim=1), full[order, split:], rtol=rtol, atol=atol)


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


def check_generate_continues_a_prefix(data, checkpoint, *flags, cpu: bool = True):
    """fairseq-generate on the valid split with the first 2 words of each sentence forced (``--prefix-size 2``),
    2 hypotheses per sentence (``flags`` choose beam or sampling): every hypothesis starts with its sentence's
    first 2 words and has a finite score. On the CPU; with ``cpu=False`` on the GPU."""
    proc = run_cli(
        "fairseq-generate",
        data,
        "--user-dir",
        USER_DIR,
        "--task",
        "language_modeling",
        "--path",
        checkpoint,
        "--gen-subset",
        "valid",
        *(["--cpu"] if cpu else []),
        "--nbest",
        "2",
        "--prefix-size",
        "2",
        "--max-len-b",
        "6",
        "--batch-size",
        "4",
        "--sample-break-mode",
        "eos",  # one sentence per sample: no EOS inside the prefix
        *flags,
    )
    targets = dict(re.findall(r"^T-(\d+)\t(.*)$", proc.stdout, re.M))
    hypotheses = re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", proc.stdout, re.M)
    assert targets and len(hypotheses) == 2 * len(targets)
    for index, score, text in hypotheses:
        assert text.split()[:2] == targets[index].split()[:2]
        assert math.isfinite(float(score))


def hypotheses(output: str):
    """H and P lines of fairseq-generate, in sentence order."""
    lines = [l for l in output.splitlines() if re.match(r"^[HP]-\d+\t", l)]
    return sorted(lines, key=lambda l: (int(l.split("\t")[0][2:]), l[0]))


def generate(data, checkpoint, *extra, full_output=False):
    # --required-batch-size-multiple 1: with the default 8, fairseq-generate drops a last partial batch
    out = run_cli(
        "fairseq-generate",
        data,
        "--user-dir",
        USER_DIR,
        "--path",
        checkpoint,
        "--beam",
        "3",
        "--cpu",
        "--max-tokens",
        "400",
        "--gen-subset",
        "test",
        "--required-batch-size-multiple",
        "1",
        *extra,
    ).stdout
    return out if full_output else hypotheses(out)
