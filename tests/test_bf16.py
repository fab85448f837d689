"""bfloat16: one training step of every registered arch on the CPU, through fairseq's own Trainer.

fairseq-train's argparse path turns ``--bf16`` into ``--tpu`` (``fairseq/options.py``), which needs torch_xla.
The Trainer itself trains in bfloat16 on any device when ``common.bf16`` is set without ``common.tpu``, as
``fairseq-hydra-train ... common.bf16=true`` runs it: the model and the batch are cast to bfloat16 and the
optimizer keeps fp32 master weights (fairseq's FP16Optimizer in its bf16 mode).
"""

import math

import pytest
import torch

import define_fairseq  # noqa: F401  (registers the models, tasks and criteria)
from conftest import USER_DIR

LM_ADAPTIVE = ["--adaptive-input-cutoff", "10,30", "--adaptive-softmax-cutoff", "10,30"]
ADAPTIVE_LOSS = ["--criterion", "adaptive_loss", "--ddp-backend", "legacy_ddp"]
LSTM = ["--define-n", "16", "--define-k", "32", "--decoder-hidden-size", "24", "--decoder-layers", "2"]
AWD = ["--decoder-embed-dim", "24", "--decoder-hidden-size", "32", "--define-n", "24"]
AWD_DEFINE = AWD + ["--define-n", "16", "--define-k", "32"]
GCNN = ["--decoder-embed-dim", "16", "--gcnn-layers", "[(16, 3)] * 2 + [[(8, 1), (8, 3), (24, 1)]]",
        "--adaptive-softmax-cutoff", "20,40", *ADAPTIVE_LOSS]
TRANSFORMER_LM = ["--decoder-layers", "1", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
                  "--decoder-attention-heads", "2", "--define-n", "16", "--define-k", "64", "--tokens-per-sample", "16"]
MOGRIFIER = ["--mogrifier-hidden-size", "16", "--mogrifier-embed-dim", "8", "--mogrifier-rank", "4"]
TRANSLATION = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim",
               "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads",
               "2", "--decoder-attention-heads", "2", "--define-n", "16", "--define-k", "64"]
C2S = TRANSLATION + ["--c2s-char-dim", "16", "--c2s-ffn-dim", "32", "--c2s-heads", "2", "--c2s-max-chars", "12",
                     "--c2s-noise-rate", "0.1"]

LM, MT, MT_C2S = "language_modeling", "translation", "translation_c2s"
REGULARIZED = ["--criterion", "lm_regularized_loss"]
MOGRIFIER_LSTM = MOGRIFIER[:4]  # the plain LSTM baselines: no --mogrifier-rank
TRANSFORMER_XL = ["--decoder-layers", "2", "--decoder-embed-dim", "16", "--decoder-attention-heads", "2",
                  "--txl-head-dim", "6", "--decoder-ffn-embed-dim", "24", "--adaptive-softmax-cutoff", "20,40",
                  "--define-n", "8", "--define-k", "32", "--txl-mem-len", "8", *REGULARIZED, "--ddp-backend",
                  "legacy_ddp"]
TXL_ARCHS = ["transformer_xl_lm", "transformer_xl_wt103", "transformer_xl_wt103_d384",
             *[f"transformer_xl_projective_wt103_n{n}" for n in (64, 128, 256)],
             *[f"transformer_xl_define_wt103_n{n}" for n in (64, 128, 256, 384)]]

# arch -> (task, flags): each registered arch on tiny sizes, with a criterion that fits its output layer
CASES = {
    "awd_lstm_lm": (LM, AWD + REGULARIZED),
    "awd_lstm_lm_define": (LM, AWD_DEFINE + REGULARIZED),
    **{arch: (LM, GCNN) for arch in ("gcnn_lm", "gcnn_lm_8", "gcnn_lm_8b", "gcnn_lm_13", "gcnn_lm_14", "gcnn_lm_14b")},
    "lstm_lm_define": (LM, LSTM + ["--decoder-embed-dim", "24", "--decoder-output-dim", "12",
                                   "--share-decoder-input-output-embed"]),
    "lstm_lm_standard_wt103": (LM, LSTM + REGULARIZED),
    "lstm_lm_adaptive_wt103": (LM, LSTM + LM_ADAPTIVE + ADAPTIVE_LOSS),
    "lstm_lm_define_wt103_n3": (LM, LSTM + LM_ADAPTIVE + REGULARIZED),
    "lstm_lm_define_wt103_n7": (LM, LSTM + LM_ADAPTIVE + ADAPTIVE_LOSS),
    "lstm_lm_define_wt103_n11": (LM, LSTM + LM_ADAPTIVE + ADAPTIVE_LOSS),
    **{arch: (LM, MOGRIFIER) for arch in ("mogrifier_lstm_lm", "mogrifier_lstm_lm_ptb", "mogrifier_lstm_lm_wt2")},
    "lstm_lm_ptb": (LM, MOGRIFIER_LSTM),
    "lstm_lm_wt2": (LM, MOGRIFIER_LSTM),
    "transformer_lm_define": (LM, TRANSFORMER_LM),
    "transformer_lm_define_wiki103": (LM, TRANSFORMER_LM + LM_ADAPTIVE + ADAPTIVE_LOSS),
    **{arch: (MT, TRANSLATION) for arch in ("transformer_define", "transformer_define_iwslt_de_en",
                                            "transformer_define_wmt_en_de_big")},
    **{arch: (MT_C2S, C2S) for arch in ("transformer_c2s", "transformer_c2s_iwslt_de_en", "transformer_c2s_small")},
    **{arch: (LM, TRANSFORMER_XL) for arch in TXL_ARCHS},
}


def registered_archs():
    from fairseq.models import ARCH_MODEL_REGISTRY

    return {arch for arch, model in ARCH_MODEL_REGISTRY.items() if model.__module__.startswith("define_fairseq.")}


def test_every_registered_arch_has_a_case():
    assert set(CASES) == registered_archs()


def bf16_trainer(data, arch, task_name, flags):
    """fairseq's Trainer for ``arch`` with ``common.bf16`` (and without the ``tpu`` that argparse adds)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    if task_name == LM and "--tokens-per-sample" not in flags:
        flags = [*flags, "--tokens-per-sample", "32"]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(data), "--user-dir", USER_DIR, "--task", task_name, "--arch", arch, *flags, "--optimizer", "adam",
        "--lr", "0.001", "--max-tokens", "256", "--cpu", "--bf16", "--seed", "1", "--num-workers", "0"])
    cfg = convert_namespace_to_omegaconf(args)
    assert cfg.common.tpu  # fairseq's argparse path: --bf16 implies --tpu
    cfg.common.tpu = False
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return Trainer(cfg, task, model, criterion), task


@pytest.mark.parametrize("arch", sorted(CASES))
def test_a_bf16_training_step(arch, lm_data, translation_data):
    task_name, flags = CASES[arch]
    trainer, task = bf16_trainer(lm_data if task_name == LM else translation_data, arch, task_name, flags)
    model = trainer.model
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    batches = task.get_batch_iterator(dataset=task.dataset("train"), max_tokens=256, seed=1).next_epoch_itr(
        shuffle=False)
    sample = next(batches)
    log = trainer.train_step([sample])
    assert log is not None and math.isfinite(log["loss"]), log
    changed = 0
    for name, p in model.named_parameters():
        assert p.dtype == torch.bfloat16, name
        assert torch.isfinite(p).all(), f"{arch}: {name} is not finite after the step"
        changed += not torch.equal(p.detach(), before[name])
    assert changed > len(before) // 2, f"{arch}: only {changed} of {len(before)} parameters moved"
