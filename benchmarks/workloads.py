"""What the benchmarks time: the registered fairseq archs, built as fairseq-train builds them without data files,
their parameter counts, and batches of Zipf-distributed tokens."""

from typing import Sequence

import torch


def count_params(module: torch.nn.Module) -> int:
    """Distinct parameters (a tied weight counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def build_model(arch: str, vocab: int, task_args: Sequence[str], extra: Sequence[str] = (), langs=()):
    """``(cfg, task, model, criterion)`` of ``--arch arch`` on made-up dictionaries of ``vocab`` symbols
    (``dict.txt``, and ``dict.<lang>.txt`` for each of ``langs``)."""
    import tempfile

    import define_fairseq  # noqa: F401  (registers the plugin's models)
    from define_fairseq.tools.params import setup_from_train_args, write_dictionaries

    with tempfile.TemporaryDirectory() as data:
        write_dictionaries(data, vocab, langs)
        cfg, task, model = setup_from_train_args(
            [data, "--user-dir", "define_fairseq", "--arch", arch, *task_args, *extra, "--cpu"]
        )
    return cfg, task, model, task.build_criterion(cfg.criterion)


def zipf_tokens(generator: torch.Generator, shape, vocab: int, nspecial: int = 4, exponent: float = 1.0):
    """Token ids drawn Zipf-like over the ``vocab - nspecial`` ordinary symbols: P(rank r) ~ 1 / r**exponent."""
    probs = torch.arange(1, vocab - nspecial + 1, dtype=torch.float64).pow(-exponent)
    flat = torch.multinomial(
        probs / probs.sum(), int(torch.tensor(shape).prod()), replacement=True, generator=generator
    )
    return (flat + nspecial).view(*shape)


def lm_sample(vocab: int, batch: int, length: int, seed: int = 0) -> dict:
    """A language-modelling batch of Zipf-distributed tokens: ``src_tokens [batch, length]``, targets shifted."""
    stream = zipf_tokens(torch.Generator().manual_seed(seed), (batch, length + 1), vocab)
    return {
        "id": torch.arange(batch),
        "nsentences": batch,
        "ntokens": batch * length,
        "net_input": {"src_tokens": stream[:, :-1].contiguous(), "src_lengths": torch.full((batch,), length)},
        "target": stream[:, 1:].contiguous(),
    }
