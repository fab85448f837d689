"""The data side of ``--task stateful_lm``: a split as one token stream (:class:`TokenStream`), its contiguous rows
cut into BPTT windows (:class:`BPTTWindows`) and AWD-LSTM's variable window lengths (:func:`window_schedule`).
See :mod:`define_fairseq.tasks.stateful_lm` for how the task batches them."""

from typing import List, Tuple

import numpy as np
import torch
from fairseq.data import FairseqDataset

# AWD-LSTM's variable-length BPTT: with this probability the base length is T, otherwise T / 2 ...
FULL_LENGTH_PROBABILITY = 0.95
# ... and no window is shorter than this (unless the row ends) ...
MIN_VARIABLE_LENGTH = 5
# ... nor longer than this many times T.
MAX_LENGTH_FACTOR = 2


class TokenStream(FairseqDataset):
    """One split as a single stream of token ids.

    ``stream`` is ``[N + 1]`` (int32): the context token (EOS) followed by the split's ``N`` tokens; ``len()`` is
    ``N`` and item ``i`` is token ``i`` of the split. Batches are made by :class:`BPTTWindows`.
    """

    def __init__(self, stream: torch.Tensor, split: str, path: str):
        super().__init__()
        self.stream = stream
        self.split = split
        self.path = path

    def __len__(self):
        return self.stream.numel() - 1

    def __getitem__(self, index):
        return self.stream[index + 1].long()


def window_schedule(
    row_length: int, tokens_per_sample: int, variable: bool = False, std: float = 5.0, seed: int = 1, epoch: int = 1
) -> List[Tuple[int, int]]:
    """The windows ``(start, length)`` that tile positions ``[0, row_length)`` of every row, in order.

    Fixed: windows of ``tokens_per_sample``, the last one shorter if needed. Variable (AWD-LSTM): each length is
    ``max(5, int(normal(base, std)))`` with base ``T`` (probability 0.95) or ``T / 2``, capped at ``2 T`` and at the
    rest of the row; drawn from a generator seeded with ``(seed, epoch)``.
    """
    windows = []
    if not variable:
        for start in range(0, row_length, tokens_per_sample):
            windows.append((start, min(tokens_per_sample, row_length - start)))
        return windows
    rng = np.random.default_rng([seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF])
    longest = MAX_LENGTH_FACTOR * tokens_per_sample
    start = 0
    while start < row_length:
        base = tokens_per_sample if rng.random() < FULL_LENGTH_PROBABILITY else tokens_per_sample / 2
        length = max(MIN_VARIABLE_LENGTH, int(rng.normal(base, std)))
        length = min(length, longest, row_length - start)
        windows.append((start, length))
        start += length
    return windows


class BPTTWindows(FairseqDataset):
    """The rows of one rank and their windows; the batches of :class:`StatefulLMTask`.

    Args:
        stream: ``[N + 1]`` context token + the split's tokens (see :class:`TokenStream`).
        num_rows: ``R``, the rows of all ranks together (batch size x world size).
        rank_rows: ``(first, end)``: the rows this rank keeps.
        keep_remainder: False: ``L = N // R`` and the last ``N - R L`` tokens are dropped; True: ``L = ceil(N / R)``
            and the stream is padded with ``pad`` so every token is a target once.
        pad: the padding index.

    Attributes:
        rows: ``[B, L + 1]`` (int32) this rank's rows: positions ``0 .. L-1`` are inputs, ``1 .. L`` targets.
        row_length: ``L``, the number of targets per row.

    Items are addressed by window codes ``start * (L + 1) + length`` (see :meth:`code`), so that a per-epoch
    schedule of windows is just a list of indices and the dataset keeps no per-epoch state.
    """

    def __init__(self, stream: torch.Tensor, num_rows: int, rank_rows: Tuple[int, int], keep_remainder: bool, pad: int):
        super().__init__()
        num_targets = stream.numel() - 1
        row_length = (num_targets + num_rows - 1) // num_rows if keep_remainder else num_targets // num_rows
        needed = num_rows * row_length + 1
        if needed > stream.numel():
            stream = torch.cat([stream, stream.new_full((needed - stream.numel(),), pad)])
        all_rows = stream[:needed].unfold(0, row_length + 1, row_length)  # [R, L + 1], rows share one token
        first, end = rank_rows
        self.rows = all_rows[first:end].clone()
        self.row_ids = torch.arange(first, end)
        self.row_length = row_length
        self.pad = pad

    def code(self, start: int, length: int) -> int:
        return start * (self.row_length + 1) + length

    def decode(self, code: int) -> Tuple[int, int]:
        return divmod(code, self.row_length + 1)

    def __len__(self):
        return self.row_length

    def __getitem__(self, code):
        return self.decode(int(code))

    def window(self, start: int, length: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(src_tokens, target)``, both ``[B, length]`` (int64)."""
        inputs = self.rows[:, start : start + length].long()
        targets = self.rows[:, start + 1 : start + length + 1].long()
        return inputs, targets

    def collater(self, samples):
        if len(samples) != 1:
            raise ValueError(
                f"--task stateful_lm: every batch is one window of all rows, got {len(samples)} windows "
                "(the task's batch sampler gives each batch one window)"
            )
        start, length = samples[0]
        inputs, targets = self.window(start, length)
        bsz = inputs.size(0)
        return {
            "id": self.row_ids.clone(),
            "nsentences": bsz,
            "ntokens": int(targets.ne(self.pad).sum()),
            "net_input": {
                "src_tokens": inputs,
                "src_lengths": torch.full((bsz,), length, dtype=torch.long),
                "reset_state": start == 0,
            },
            "target": targets,
        }

    def num_tokens(self, index):
        return self.rows.size(0) * self.decode(int(index))[1]

    def size(self, index):
        return self.decode(int(index))[1]


def schedule_batches(dataset: BPTTWindows, epoch: int, tokens_per_sample: int, std: float, seed: int):
    """Callable batch sampler of fairseq's EpochBatchIterator: a fresh variable schedule for every epoch."""
    windows = window_schedule(dataset.row_length, tokens_per_sample, variable=True, std=std, seed=seed, epoch=epoch)
    return [[dataset.code(start, length)] for start, length in windows]
