"""``translation_c2s``: translation whose batches carry the characters of every source token.

For each source token the batch holds its character ids (``net_input["src_chars"] [B, T, M]``, aligned with
``src_tokens``, zeros for padding, EOS and the dictionary's special symbols), which
:class:`~define_fairseq.modules.char2subword.Char2SubwordEmbedding` embeds instead of the token id. Two
things need that:

* **Character noise while training** (``--c2s-noise-rate``, ``--c2s-noise-types``): each training source
  sentence is noised on the fly (insertions, deletions, substitutions, swaps, case changes; the BPE
  segmentation points kept), differently every epoch and deterministically for ``(--seed, epoch, sentence)``.
  A noised piece that the dictionary lacks becomes ``<unk>`` as a token id but keeps its characters.
* **Text the dictionary does not cover** at test time: with ``--dataset-impl raw`` (plain-text splits, e.g. a
  noised copy of the test set made with ``python -m define_fairseq.tools.noise_text`` and BPE) the characters come
  from the text itself, so an unknown subword is embedded from its letters instead of as ``<unk>``. From
  binarized splits they come from the dictionary entries.

Everything else is fairseq's ``translation`` task.
"""

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from fairseq.data import BaseWrapperDataset
from fairseq.data.indexed_dataset import IndexedRawTextDataset
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II

from define_fairseq.data.char_noise import NOISE_TYPES, CharNoise, parse_noise_types, sample_rng
from define_fairseq.modules.char2subword import encode_characters

logger = logging.getLogger(__name__)


@dataclass
class TranslationC2SConfig(TranslationConfig):
    c2s_noise_rate: float = field(
        default=0.0, metadata={"help": "probability that a character of a training source word is edited (0: no noise)"}
    )
    c2s_noise_types: str = field(
        default=",".join(NOISE_TYPES),
        metadata={"help": "comma separated edits to draw from: " + ", ".join(NOISE_TYPES)},
    )
    seed: int = II("common.seed")


class CharacterSourceDataset(BaseWrapperDataset):
    """A ``LanguagePairDataset`` whose samples also hold ``source_chars`` (one list of character ids per source
    token) and whose batches hold ``net_input["src_chars"] [B, T, M]``; with ``noise`` the source is noised
    per ``(seed, epoch, index)`` first."""

    def __init__(self, dataset, src_dict, noise: Optional[CharNoise] = None, seed: int = 1):
        super().__init__(dataset)
        self.src_dict = src_dict
        self.noise = noise
        self.seed = seed
        self.epoch = 1
        source = getattr(dataset, "src", None)
        self.raw_lines = source.lines if isinstance(source, IndexedRawTextDataset) else None

    def set_epoch(self, epoch):
        self.epoch = epoch
        super().set_epoch(epoch)

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return False

    def _pieces(self, index: int, source: torch.Tensor) -> List[str]:
        """The source tokens of sample ``index`` as strings, EOS excluded."""
        body = source[:-1] if len(source) and source[-1] == self.src_dict.eos() else source
        if self.raw_lines is not None:
            pieces = self.raw_lines[index].split()
            if len(pieces) == len(body):
                return pieces
        return [self.src_dict[int(t)] for t in body]

    def _is_special(self, piece: str) -> bool:
        token = self.src_dict.index(piece)
        return token < self.src_dict.nspecial and piece == self.src_dict[token]

    def _noised(self, pieces: List[str], rng) -> List[str]:
        """``pieces`` with character noise; special symbols (e.g. ``<unk>``) are kept and never edited."""
        out: List[str] = []
        run: List[str] = []
        for piece in pieces + [None]:
            if piece is None or self._is_special(piece):
                if run:
                    out.extend(self.noise.noise_tokens(run, rng))
                    run = []
                if piece is not None:
                    out.append(piece)
            else:
                run.append(piece)
        return out

    def __getitem__(self, index):
        item = dict(self.dataset[index])
        source = item["source"]
        pieces = self._pieces(index, source)
        has_eos = len(source) and source[-1] == self.src_dict.eos()
        if self.noise is not None:
            pieces = self._noised(pieces, sample_rng(self.seed, self.epoch, index))
            ids = [self.src_dict.index(p) for p in pieces] + ([self.src_dict.eos()] if has_eos else [])
            item["source"] = torch.tensor(ids, dtype=source.dtype)
        chars = [[] if self._is_special(piece) else encode_characters(piece) for piece in pieces]
        if has_eos:
            chars.append([])
        item["source_chars"] = chars
        return item

    def collater(self, samples):
        batch = self.dataset.collater(samples)
        if not batch:
            return batch
        src_tokens = batch["net_input"]["src_tokens"]
        by_id: Dict[int, dict] = {int(s["id"]): s for s in samples}
        width = max([len(c) for s in samples for c in s["source_chars"]] + [1])
        chars = torch.zeros(*src_tokens.shape, width, dtype=torch.long)
        left_pad = getattr(self.dataset, "left_pad_source", True)
        for row, sample_id in enumerate(batch["id"].tolist()):
            sample_chars = by_id[sample_id]["source_chars"]
            offset = src_tokens.size(1) - len(sample_chars) if left_pad else 0
            for t, ids in enumerate(sample_chars):
                if ids:
                    chars[row, offset + t, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        batch["net_input"]["src_chars"] = chars
        return batch


@register_task("translation_c2s", dataclass=TranslationC2SConfig)
class TranslationC2STask(TranslationTask):
    """fairseq's translation task with the source tokens' characters in every batch (see the module docstring)."""

    def __init__(self, cfg: TranslationC2SConfig, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        self.noise = None
        if cfg.c2s_noise_rate:
            self.noise = CharNoise(cfg.c2s_noise_rate, parse_noise_types(cfg.c2s_noise_types))
        else:
            CharNoise(0.0, parse_noise_types(cfg.c2s_noise_types))  # check the flag even when it is unused

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        noise = self.noise if split == self.cfg.train_subset else None
        self.datasets[split] = CharacterSourceDataset(
            self.datasets[split], self.src_dict, noise=noise, seed=self.cfg.seed
        )
        if noise is not None:
            logger.info(
                f"{split}: source characters noised with rate {self.cfg.c2s_noise_rate} "
                f"({self.cfg.c2s_noise_types}), new noise every epoch"
            )

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        return CharacterSourceDataset(
            super().build_dataset_for_inference(src_tokens, src_lengths, constraints), self.src_dict
        )
