"""Stateful truncated-BPTT language modelling (``--task stateful_lm``), as AWD-LSTM and the DeFINE LSTM LMs train.

A split is one token stream: the binarized lines concatenated (each ends in EOS), preceded by one EOS that serves
as the context of the first token. The tokens to predict are cut into ``R = batch_size x world_size`` contiguous
rows of ``L`` tokens; rank ``r`` keeps rows ``[r*B, (r+1)*B)``. The input of a row is its targets shifted right by
one (its first input is the token just before the row in the stream), so a row is a slice ``[L + 1]`` of the
stream and consecutive rows share one token. Batch ``i`` is the ``i``-th window of every row of the rank::

    src_tokens [B, T] = rows[:, s : s + T]        target [B, T] = rows[:, s + 1 : s + T + 1]

so nothing is lost at window ends: the target of a window's last position is the first input of the next one.
The last window may be shorter. Batches come in order (never shuffled); the first batch of every epoch and of
every evaluation pass has ``net_input["reset_state"] = True``, every other batch ``False``: a recurrent model
carries its state from one batch to the next (see the models of this plugin).

* Training split (``--train-subset``): ``L = N // R``, the remainder (fewer than R tokens) is dropped, as
  AWD-LSTM's ``batchify``; with ``--variable-bptt`` the window lengths follow AWD-LSTM's schedule,
  drawn afresh for every epoch and deterministic for (``--seed``, epoch).
* Every other split and ``fairseq-eval-lm``: ``L = ceil(N / R)``, the stream is padded at its end, so every token
  of the split is a target exactly once; pad targets are ignored by the criteria and by fairseq-eval-lm, and
  ``ntokens`` counts only real targets. Window length is always ``--tokens-per-sample``.
"""

import inspect
import logging
import os
from dataclasses import dataclass, field
from functools import partial
from typing import Optional

import numpy as np
import torch
from fairseq import utils
from fairseq.data import Dictionary, data_utils, iterators
from fairseq.data.indexed_dataset import get_available_dataset_impl
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

from define_fairseq.models.carried_state import CarriedState
from define_fairseq.tasks.bptt_windows import (  # noqa: F401 (window_schedule: imported from here too)
    MAX_LENGTH_FACTOR,
    BPTTWindows,
    TokenStream,
    schedule_batches,
    window_schedule,
)

logger = logging.getLogger(__name__)

TASK = "stateful_lm"


@dataclass
class StatefulLMConfig(FairseqDataclass):
    """Options of ``--task stateful_lm``.

    Taken from fairseq's own options (no new flag): ``--batch-size`` (number of parallel streams per GPU for the
    training split), ``--batch-size-valid`` (the same for every other split; defaults to ``--batch-size``),
    ``--seed`` (with the epoch, seeds ``--variable-bptt``), ``--train-subset`` (the split that gets the
    training layout), ``--dataset-impl`` and ``--data-buffer-size``.
    """

    data: Optional[str] = field(
        default=None,
        metadata={
            "help": "data directory written by fairseq-preprocess --only-source (dict.txt, <split>.bin/.idx); "
            "several directories separated by ':' are used one per epoch for the training split"
        },
    )
    tokens_per_sample: int = field(
        default=70,
        metadata={
            "help": "BPTT length T: tokens per stream in one batch (batches are batch size x T tokens; "
            "--max-tokens is not used by this task)"
        },
    )
    variable_bptt: bool = field(
        default=False,
        metadata={
            "help": "training split only: AWD-LSTM's variable BPTT length: base T (probability 0.95) or T/2, "
            "window max(5, int(normal(base, --bptt-std))) capped at 2T; the schedule is "
            "deterministic for (--seed, epoch)"
        },
    )
    bptt_std: float = field(
        default=5.0, metadata={"help": "standard deviation of the window length for --variable-bptt"}
    )
    # Interpolated from fairseq's dataset / common options (no help string: the flags exist there).
    batch_size: Optional[int] = II("dataset.batch_size")
    batch_size_valid: Optional[int] = II("dataset.batch_size_valid")
    seed: int = II("common.seed")
    train_subset: str = II("dataset.train_subset")
    dataset_impl: Optional[ChoiceEnum(get_available_dataset_impl())] = II("dataset.dataset_impl")
    data_buffer_size: int = II("dataset.data_buffer_size")


def _resolved(value):
    """``value``, or None for an option left unset or an interpolation that could not be resolved."""
    if isinstance(value, str) and value.startswith("${"):
        return None
    return value


def check_model_carries_state(model) -> None:
    """Raise if ``model`` (or its decoder) cannot take the ``reset_state`` argument of this task's batches."""
    decoder = getattr(model, "decoder", None)
    owner = decoder if decoder is not None else model
    params = inspect.signature(owner.forward).parameters
    if "reset_state" not in params:
        raise ValueError(
            f"--task {TASK} carries recurrent state across batches and passes net_input['reset_state'] to the model, "
            f"but {type(owner).__name__}.forward has no `reset_state` argument. Use a recurrent model of this plugin "
            f"(e.g. --arch lstm_lm_define or awd_lstm_lm); for non-recurrent models use --task language_modeling."
        )
    if decoder is not None:
        outer = inspect.signature(model.forward).parameters
        if "reset_state" not in outer and not any(p.kind is p.VAR_KEYWORD for p in outer.values()):
            raise ValueError(
                f"--task {TASK}: {type(model).__name__}.forward does not pass `reset_state` on to its "
                f"decoder; for non-recurrent models use --task language_modeling."
            )


@register_task(TASK, dataclass=StatefulLMConfig)
class StatefulLMTask(FairseqTask):
    """Truncated-BPTT language modelling with state carried across batches (see the module docstring).

    Works with fairseq-train and fairseq-eval-lm (``--batch-size B --tokens-per-sample T``: every token of the split
    scored once, in order, state carried). For generation / sampling use ``--task language_modeling``.
    """

    cfg: StatefulLMConfig

    def __init__(self, cfg: StatefulLMConfig, dictionary: Dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary
        if cfg.tokens_per_sample < 1:
            raise ValueError(
                f"--tokens-per-sample must be at least 1 (it is the BPTT length), got {cfg.tokens_per_sample}"
            )
        self.variable_bptt, self.bptt_std = bool(cfg.variable_bptt), cfg.bptt_std
        if self.bptt_std < 0:
            raise ValueError(f"--bptt-std must not be negative, got {self.bptt_std}")

    @classmethod
    def setup_task(cls, cfg: StatefulLMConfig, **kwargs):
        if not cfg.data:
            raise ValueError(
                f"--task {TASK} needs the data directory written by fairseq-preprocess --only-source "
                f"(the first positional argument)"
            )
        paths = utils.split_paths(cfg.data)
        for path in paths:
            if not os.path.isdir(path):
                raise FileNotFoundError(
                    f"--task {TASK}: data directory {path} does not exist; give the directory "
                    f"written by fairseq-preprocess --only-source"
                )
        dict_path = os.path.join(paths[0], "dict.txt")
        if not os.path.isfile(dict_path):
            raise FileNotFoundError(
                f"--task {TASK}: dictionary {dict_path} not found; binarize the corpus with "
                f"fairseq-preprocess --only-source --destdir {paths[0]}"
            )
        dictionary = Dictionary.load(dict_path)
        logger.info(f"dictionary: {len(dictionary)} types")
        return cls(cfg, dictionary)

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs):
        """Read ``<data>/<split>.bin/.idx`` into one :class:`TokenStream`."""
        paths = utils.split_paths(self.cfg.data)
        data_path = paths[(epoch - 1) % len(paths)]
        split_path = os.path.join(data_path, split)
        dataset = data_utils.load_indexed_dataset(
            split_path, self.dictionary, _resolved(self.cfg.dataset_impl), combine=combine
        )
        if dataset is None:
            raise FileNotFoundError(
                f"--task {TASK}: split '{split}' not found ({split_path}.bin/.idx); binarize it "
                f"with fairseq-preprocess --only-source (e.g. --{split}pref) or choose another "
                f"split (--train-subset / --valid-subset / --gen-subset)"
            )
        sizes = np.asarray(dataset.sizes, dtype=np.int64)
        stream = torch.empty(int(sizes.sum()) + 1, dtype=torch.int32)
        stream[0] = self.dictionary.eos()
        position = 1
        for index in range(len(dataset)):
            line = dataset[index]
            stream[position : position + line.numel()] = line
            position += line.numel()
        if position != stream.numel():
            raise ValueError(
                f"--task {TASK}: {split_path}: the index sizes ({int(sizes.sum())} tokens) do not match "
                f"the data ({position - 1} tokens); re-binarize the split"
            )
        logger.info(f"{split_path}: {len(dataset)} lines, {position - 1} tokens")
        self.datasets[split] = TokenStream(stream, split, split_path)

    def _is_training_split(self, dataset: TokenStream) -> bool:
        return dataset.split == _resolved(self.cfg.train_subset)

    def _rows_per_rank(self, dataset: TokenStream, requested: Optional[int], training: bool) -> int:
        flag = "--batch-size" if training else "--batch-size-valid"
        configured = _resolved(self.cfg.batch_size if training else self.cfg.batch_size_valid)
        rows = requested if requested is not None else configured
        if rows is None and not training:
            rows = _resolved(self.cfg.batch_size)
        if rows is None:
            flags = "--batch-size" if training else "--batch-size (fairseq-eval-lm) or --batch-size-valid"
            raise ValueError(
                f"--task {TASK} needs {flags}: the number of parallel token streams per GPU for split "
                f"'{dataset.split}' (--max-tokens is not used by this task)"
            )
        if rows < 1:
            raise ValueError(f"--task {TASK}: {flag} must be at least 1, got {rows}")
        return int(rows)

    def stateful_batches(
        self,
        dataset: TokenStream,
        rows_per_rank: int,
        num_shards: int = 1,
        shard_id: int = 0,
        training: bool = False,
        flag: str = "--batch-size",
    ) -> BPTTWindows:
        """The :class:`BPTTWindows` of rank ``shard_id`` of ``num_shards`` with ``rows_per_rank`` rows each."""
        if not 0 <= shard_id < num_shards:
            raise ValueError(f"{TASK}: shard {shard_id} out of range for {num_shards} shards")
        num_rows = rows_per_rank * num_shards
        if len(dataset) < num_rows:
            raise ValueError(
                f"--task {TASK}: split '{dataset.split}' ({dataset.path}) has {len(dataset)} tokens, fewer than the "
                f"{num_rows} streams it must be cut into ({flag} {rows_per_rank} x {num_shards} GPUs); lower {flag} "
                f"or use a longer split"
            )
        return BPTTWindows(
            dataset.stream,
            num_rows,
            (shard_id * rows_per_rank, (shard_id + 1) * rows_per_rank),
            keep_remainder=not training,
            pad=self.dictionary.pad(),
        )

    def _iterator(
        self,
        dataset,
        max_sentences,
        num_shards,
        shard_id,
        num_workers,
        epoch,
        data_buffer_size,
        training: bool,
        skip_remainder_batch=False,
    ) -> iterators.EpochBatchIterator:
        if not isinstance(dataset, TokenStream):
            raise TypeError(f"--task {TASK} batches the datasets it loads itself, got {type(dataset).__name__}")
        rows = self._rows_per_rank(dataset, max_sentences, training)
        windows = self.stateful_batches(
            dataset, rows, num_shards, shard_id, training, flag="--batch-size" if training else "--batch-size-valid"
        )
        if training and self.variable_bptt:
            batch_sampler = partial(
                schedule_batches, tokens_per_sample=self.cfg.tokens_per_sample, std=self.bptt_std, seed=self.cfg.seed
            )
        else:
            batch_sampler = [
                [windows.code(start, length)]
                for start, length in window_schedule(windows.row_length, self.cfg.tokens_per_sample)
            ]
        # The rows are already this rank's share: fairseq must not shard the batches again (every rank gets the
        # same number of batches), and must never shuffle them.
        return iterators.EpochBatchIterator(
            dataset=windows,
            collate_fn=windows.collater,
            batch_sampler=batch_sampler,
            seed=self.cfg.seed,
            num_shards=1,
            shard_id=0,
            num_workers=num_workers,
            epoch=epoch,
            buffer_size=data_buffer_size,
            disable_shuffling=True,
            skip_remainder_batch=skip_remainder_batch,
        )

    def get_batch_iterator(
        self,
        dataset,
        max_tokens=None,
        max_sentences=None,
        max_positions=None,
        ignore_invalid_inputs=False,
        required_batch_size_multiple=1,
        seed=1,
        num_shards=1,
        shard_id=0,
        num_workers=0,
        epoch=1,
        data_buffer_size=0,
        disable_iterator_cache=False,
        skip_remainder_batch=False,
        grouped_shuffling=False,
        update_epoch_batch_itr=False,
    ):
        """Batches of ``dataset`` in order (see the module docstring).

        ``max_sentences`` is the number of rows per rank (fairseq passes ``--batch-size`` for training and
        ``--batch-size-valid`` for validation); ``num_shards`` / ``shard_id`` are the data-parallel world size and
        rank. ``max_tokens``, ``max_positions``, ``seed`` (``--seed`` of the task is used) and the shuffling options
        do not apply.
        """
        return self._iterator(
            dataset,
            max_sentences,
            num_shards,
            shard_id,
            num_workers,
            epoch,
            data_buffer_size,
            training=self._is_training_split(dataset),
            skip_remainder_batch=skip_remainder_batch,
        )

    def eval_lm_dataloader(
        self,
        dataset,
        max_tokens: Optional[int] = 36000,
        batch_size: Optional[int] = None,
        max_positions: Optional[int] = None,
        num_shards: int = 1,
        shard_id: int = 0,
        num_workers: int = 1,
        data_buffer_size: int = 10,
        context_window: int = 0,
    ):
        """fairseq-eval-lm: every token of the split scored once, in order, with state carried across windows."""
        if context_window > 0:
            raise ValueError(
                f"--task {TASK} carries the recurrent state across windows, so every token already sees "
                f"all the text before it; drop --context-window (got {context_window})"
            )
        return self._iterator(
            dataset, batch_size, num_shards, shard_id, num_workers, 1, data_buffer_size, training=False
        ).next_epoch_itr(shuffle=False)

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        check_model_carries_state(model)
        return model

    def begin_valid_epoch(self, epoch, model):
        """Every rank's carried training state to rank 0, which writes the checkpoints: fairseq-train validates
        on every rank before each mid-epoch checkpoint (see :mod:`define_fairseq.models.carried_state`)."""
        super().begin_valid_epoch(epoch, model)
        for module in model.modules():
            if isinstance(module, CarriedState):
                module.gather_training_state()

    def max_positions(self):
        """The longest window this task makes."""
        factor = MAX_LENGTH_FACTOR if self.variable_bptt else 1
        return factor * self.cfg.tokens_per_sample

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
