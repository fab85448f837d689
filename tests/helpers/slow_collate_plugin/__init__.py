"""A fairseq plugin for tests: ``--task slow_collate_lm`` is fairseq's ``language_modeling`` whose batches take a
few large matrix products each to collate, so that fairseq's collating thread (``--data-buffer-size`` > 0) is
almost always inside a PyTorch operation, as it is at times with real data, when training stops."""

import torch
from fairseq.data import BaseWrapperDataset
from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask


class SlowCollater(BaseWrapperDataset):
    def collater(self, samples):
        busy = torch.ones(768, 768)
        for _ in range(4):
            busy = busy @ busy / 768
        return self.dataset.collater(samples)


@register_task("slow_collate_lm", dataclass=LanguageModelingConfig)
class SlowCollateLMTask(LanguageModelingTask):
    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        self.datasets[split] = SlowCollater(self.datasets[split])
