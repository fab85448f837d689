"""``lm_regularized_loss``: language-model cross-entropy plus the model's regularisation term (AWD-LSTM's AR/TAR).

The cross-entropy is taken over the full softmax, or over the decoder's adaptive softmax when it has one
(``model.decoder.adaptive_softmax``). Every non-padding target counts, each exactly once (fairseq's
``adaptive_loss`` ignores, inside each tail cluster, the word whose index in the cluster equals the padding
index; here padding positions are removed before the softmax instead).

A decoder may return ``extra["regularization"]``: a scalar that is already a mean per token (AWD-LSTM's
``alpha * mean(dropped^2) + beta * mean(diff(raw)^2)``). It is added ``sample_size`` times (the number of target
tokens, or of sentences with ``--sentence-avg``), so after fairseq divides the loss by ``sample_size`` the
penalty is exactly the model's mean. The logged ``loss`` includes it; ``nll_loss`` (and ``ppl``, computed from
it) does not.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.dataclass.constants import DDP_BACKEND_CHOICES
from fairseq.logging import metrics
from omegaconf import II


@dataclass
class LMRegularizedLossConfig(FairseqDataclass):
    sentence_avg: bool = II("optimization.sentence_avg")
    ddp_backend: DDP_BACKEND_CHOICES = II("distributed_training.ddp_backend")


@register_criterion("lm_regularized_loss", dataclass=LMRegularizedLossConfig)
class LMRegularizedLoss(FairseqCriterion):
    """Sum of the target tokens' negative log-likelihood plus ``regularization * sample_size``."""

    def __init__(self, task, sentence_avg: bool, ddp_backend: str = "legacy_ddp"):
        super().__init__(task)
        self.sentence_avg = sentence_avg
        self.ddp_backend = str(ddp_backend)

    def forward(self, model, sample, reduce=True):
        if not reduce:
            raise ValueError("lm_regularized_loss computes summed losses only (reduce=True)")
        net_output = model(**sample["net_input"])
        target = model.get_targets(sample, net_output)
        nll = self.nll_loss(model, net_output, target)
        ntokens = sample["ntokens"]
        nsentences = target.size(0)
        sample_size = nsentences if self.sentence_avg else ntokens
        loss = nll
        extra = net_output[1] if len(net_output) > 1 and isinstance(net_output[1], dict) else {}
        regularization = extra.get("regularization")
        if regularization is not None:
            loss = nll + regularization.float() * sample_size
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll.data,
            "ntokens": ntokens,
            "nsentences": nsentences,
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output

    def nll_loss(self, model, net_output, target: torch.Tensor) -> torch.Tensor:
        """Summed negative log-likelihood of the non-padding ``target [B, T]`` tokens."""
        adaptive_softmax = getattr(model.decoder, "adaptive_softmax", None)
        if adaptive_softmax is None:
            lprobs = model.get_normalized_probs(net_output, log_probs=True)
            return F.nll_loss(
                lprobs.view(-1, lprobs.size(-1)), target.reshape(-1), ignore_index=self.padding_idx, reduction="sum"
            )
        if (
            self.ddp_backend in {"c10d", "pytorch_ddp"}
            and torch.distributed.is_available()
            and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1
        ):
            raise ValueError(
                "an adaptive softmax leaves clusters without gradient in some batches, which PyTorch's "
                "DistributedDataParallel rejects: train with --ddp-backend legacy_ddp"
            )
        features = net_output[0]
        keep = target.reshape(-1).ne(self.padding_idx)
        features = features.reshape(-1, features.size(-1))[keep]
        logits, targets = adaptive_softmax(features, target.reshape(-1)[keep])
        nll = features.new_zeros((), dtype=torch.float32)
        for cluster_logits, cluster_target in zip(logits, targets):
            if cluster_target is not None:
                nll = nll + F.cross_entropy(cluster_logits.float(), cluster_target, reduction="sum")
        return nll

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss_sum = utils.item(sum(log.get("loss", 0) for log in logging_outputs))
        nll_sum = utils.item(sum(log.get("nll_loss", 0) for log in logging_outputs))
        ntokens = utils.item(sum(log.get("ntokens", 0) for log in logging_outputs))
        sample_size = utils.item(sum(log.get("sample_size", 0) for log in logging_outputs))
        metrics.log_scalar("loss", loss_sum / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", nll_sum / max(ntokens, 1) / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
