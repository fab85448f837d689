"""Every registered arch of the plugin on tiny sizes, with the task and flags each needs; shared by the tests that
run every arch (bfloat16 on the CPU, the CUDA tests).

The flags keep each arch's own structure (DeFINE units, adaptive input and softmax, Transformer-XL memory, mixture
of softmaxes, Char2Subword) and shrink only its sizes. ``family(arch)`` is the registered model an arch belongs to;
``FAMILIES`` names one representative arch per family, the one with the most of the family's structure.

The other tests that train or build these models take their tiny flags from here too (``TRANSLATION`` is the
tests' small transformer_define; ``GCNN_TINY``, ``TXL_TINY`` and ``C2S_TINY`` are the gcnn_lm, transformer_xl_lm
and Char2Subword sizes without their cases' criterion, memory and noise flags): the suite has one source of tiny
configurations.
"""

from conftest import RUN_FLAGS, plugin_args

LM_ADAPTIVE = ["--adaptive-input-cutoff", "10,30", "--adaptive-softmax-cutoff", "10,30"]
ADAPTIVE_LOSS = ["--criterion", "adaptive_loss", "--ddp-backend", "legacy_ddp"]
LSTM = ["--define-n", "16", "--define-k", "32", "--decoder-hidden-size", "24", "--decoder-layers", "2"]
AWD = ["--decoder-embed-dim", "24", "--decoder-hidden-size", "32"]
AWD_DEFINE = AWD + ["--define-n", "16", "--define-k", "32"]
GCNN_TINY = ["--decoder-embed-dim", "16", "--gcnn-layers", "[(16, 3)] * 2 + [[(8, 1), (8, 3), (24, 1)]]"]
GCNN = [*GCNN_TINY, "--adaptive-softmax-cutoff", "20,40", *ADAPTIVE_LOSS]
TRANSFORMER_LM = ["--decoder-layers", "1", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64"]
TRANSFORMER_LM += ["--decoder-attention-heads", "2", "--define-n", "16", "--define-k", "64"]
TRANSFORMER_LM += ["--tokens-per-sample", "16"]
MOGRIFIER = ["--mogrifier-hidden-size", "16", "--mogrifier-embed-dim", "8", "--mogrifier-rank", "4"]
# a 1+1-layer Transformer of width 32, and with a small DeFINE unit the small transformer_define; arch-specific
# defaults are checked separately
TRANSFORMER = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32"]
TRANSFORMER += ["--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64"]
TRANSFORMER += ["--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
DEFINE_SMALL = ["--define-n", "16", "--define-k", "64"]
TRANSLATION = TRANSFORMER + DEFINE_SMALL
C2S_TINY = ["--c2s-char-dim", "16", "--c2s-ffn-dim", "32", "--c2s-heads", "2", "--c2s-max-chars", "12"]
C2S = [*TRANSLATION, *C2S_TINY, "--c2s-noise-rate", "0.1"]

LM, MT, MT_C2S = "language_modeling", "translation", "translation_c2s"
REGULARIZED = ["--criterion", "lm_regularized_loss"]
MOGRIFIER_LSTM = MOGRIFIER[:4]  # the plain LSTM baselines: no --mogrifier-rank
TXL_TINY = ["--decoder-layers", "2", "--decoder-embed-dim", "16", "--decoder-attention-heads", "2"]
TXL_TINY += ["--txl-head-dim", "6", "--decoder-ffn-embed-dim", "24", "--adaptive-softmax-cutoff", "20,40"]
TXL_TINY += ["--define-n", "8", "--define-k", "32"]
TRANSFORMER_XL = [*TXL_TINY, "--txl-mem-len", "8", *REGULARIZED, "--ddp-backend", "legacy_ddp"]
TXL_ARCHS = [
    "transformer_xl_lm",
    "transformer_xl_wt103",
    "transformer_xl_wt103_d384",
    *[f"transformer_xl_projective_wt103_n{n}" for n in (64, 128, 256)],
    *[f"transformer_xl_define_wt103_n{n}" for n in (64, 128, 256, 384)],
]

# arch -> (task, flags): each registered arch on tiny sizes, with a criterion that fits its output layer
CASES = {
    "awd_lstm_lm": (LM, AWD + REGULARIZED),
    "awd_lstm_lm_define": (LM, AWD_DEFINE + REGULARIZED),
    **{arch: (LM, GCNN) for arch in ("gcnn_lm", "gcnn_lm_8", "gcnn_lm_8b", "gcnn_lm_13", "gcnn_lm_14", "gcnn_lm_14b")},
    "lstm_lm_define": (
        LM,
        LSTM + ["--decoder-embed-dim", "24", "--decoder-output-dim", "12", "--share-decoder-input-output-embed"],
    ),
    "lstm_lm_standard_wt103": (LM, LSTM + REGULARIZED),
    "lstm_lm_adaptive_wt103": (LM, LSTM + LM_ADAPTIVE + ADAPTIVE_LOSS),
    "lstm_lm_define_wt103_n3": (LM, LSTM + LM_ADAPTIVE + REGULARIZED),
    "lstm_lm_define_wt103_n7": (LM, LSTM + LM_ADAPTIVE + ADAPTIVE_LOSS),
    "lstm_lm_define_wt103_n11": (LM, LSTM + LM_ADAPTIVE + ADAPTIVE_LOSS),
    **{arch: (LM, MOGRIFIER) for arch in ("mogrifier_lstm_lm", "mogrifier_lstm_lm_ptb", "mogrifier_lstm_lm_wt2")},
    "mogrifier_lstm_lm_baseline_ptb": (LM, MOGRIFIER_LSTM),
    "mogrifier_lstm_lm_baseline_wt2": (LM, MOGRIFIER_LSTM),
    "transformer_lm_define": (LM, TRANSFORMER_LM),
    "transformer_lm_define_wiki103": (LM, TRANSFORMER_LM + LM_ADAPTIVE + ADAPTIVE_LOSS),
    **{
        arch: (MT, TRANSLATION)
        for arch in ("transformer_define", "transformer_define_iwslt_de_en", "transformer_define_wmt_en_de_big")
    },
    **{arch: (MT_C2S, C2S) for arch in ("transformer_c2s", "transformer_c2s_iwslt_de_en", "transformer_c2s_small")},
    **{arch: (LM, TRANSFORMER_XL) for arch in TXL_ARCHS},
}

# family (registered model) -> its representative arch
FAMILIES = {
    "awd_lstm_lm": "awd_lstm_lm_define",  # DeFINE input, AWD-LSTM regularisers, AR/TAR
    "lstm_lm_define": "lstm_lm_define_wt103_n3",  # adaptive input, DeFINE, tied adaptive softmax
    "gcnn_lm": "gcnn_lm",  # the flags give every gcnn arch the same tiny stack
    "mogrifier_lstm_lm": "mogrifier_lstm_lm_wt2",  # 6 low-rank rounds, summed layers, mixture of softmaxes
    "transformer_lm_define": "transformer_lm_define_wiki103",  # adaptive input, DeFINE, adaptive softmax
    "transformer_define": "transformer_define",
    "transformer_c2s": "transformer_c2s",
    "transformer_xl_lm": "transformer_xl_define_wt103_n64",  # DeFINE input, memory, projected adaptive softmax
}

# the families whose state (LSTM state, Transformer-XL memory) --task stateful_lm carries from batch to batch
STATEFUL = {"awd_lstm_lm", "lstm_lm_define", "mogrifier_lstm_lm", "transformer_xl_lm"}


def zeros(*flags):
    """``flag 0`` for each of ``flags``."""
    return [arg for flag in flags for arg in (flag, "0")]


# family -> the flags that turn off every dropout of its models (--c2s-noise-rate is no dropout: it noises the
# batches on the CPU)
AWD_DROPOUTS = ["--dropout", "--awd-input-dropout", "--awd-hidden-dropout", "--awd-output-dropout"]
AWD_DROPOUTS += ["--awd-embed-dropout", "--awd-weight-drop", "--define-dropout"]
MOGRIFIER_DROPOUTS = ["--mogrifier-input-dropout", "--mogrifier-inter-layer-dropout", "--mogrifier-state-dropout"]
MOGRIFIER_DROPOUTS += ["--mogrifier-output-dropout", "--mogrifier-projection-dropout"]
MOGRIFIER_DROPOUTS += ["--mogrifier-drop-state-probability", "--define-dropout"]
TRANSFORMER_DROPOUTS = ["--dropout", "--attention-dropout", "--activation-dropout", "--define-dropout"]
NO_DROPOUT = {
    "awd_lstm_lm": zeros(*AWD_DROPOUTS),
    "lstm_lm_define": zeros(*AWD_DROPOUTS, "--adaptive-softmax-dropout"),
    "gcnn_lm": zeros("--dropout", "--adaptive-softmax-dropout"),
    "mogrifier_lstm_lm": zeros(*MOGRIFIER_DROPOUTS),
    "transformer_lm_define": zeros(*TRANSFORMER_DROPOUTS, "--adaptive-softmax-dropout"),
    "transformer_define": zeros(*TRANSFORMER_DROPOUTS),
    "transformer_c2s": zeros(*TRANSFORMER_DROPOUTS, "--c2s-dropout"),
    "transformer_xl_lm": zeros("--dropout", "--attention-dropout", "--adaptive-softmax-dropout", "--define-dropout"),
}

# family -> the flags that give its case one layer more in every stack the plugin runs (a DeFINE unit's depth is
# separate). Not in a translation encoder's Transformer layers: fairseq's TransformerEncoder reads a tensor
# (``has_pads``) as a bool in each of its layers, a synchronisation per layer that is fairseq's own.
ONE_MORE_LAYER = {
    "awd_lstm_lm": ["--decoder-layers", "4"],  # AWD-LSTM's 3 by default
    "lstm_lm_define": ["--decoder-layers", "3"],
    "gcnn_lm": ["--gcnn-layers", "[(16, 3)] * 3 + [[(8, 1), (8, 3), (24, 1)]]"],
    "mogrifier_lstm_lm": ["--mogrifier-layers", "3"],
    "transformer_lm_define": ["--decoder-layers", "2"],
    "transformer_define": ["--decoder-layers", "2"],
    "transformer_c2s": ["--decoder-layers", "2", "--c2s-layers", "3"],
    "transformer_xl_lm": ["--decoder-layers", "3"],
}


def registered_archs():
    from fairseq.models import ARCH_MODEL_REGISTRY

    return {arch for arch, model in ARCH_MODEL_REGISTRY.items() if model.__module__.startswith("define_fairseq.")}


def family(arch: str) -> str:
    """The registered model (``--arch`` family) of ``arch``."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    return ARCH_MODEL_NAME_REGISTRY[arch]


def case_argv(data, arch: str, *flags: str, stateful: bool = False):
    """fairseq-train's arguments for ``arch``'s case on ``data`` (before ``flags``): its task and tiny flags, and
    32 tokens per sample for a language model that does not set it. ``stateful``: ``--task stateful_lm`` with 4
    streams of 16 tokens instead of the case's language-modelling task (for a family in ``STATEFUL``)."""
    task, case_flags = CASES[arch]
    if stateful:
        if task != LM:
            raise ValueError(f"{arch} is not a language model: it has no stateful case")
        task, case_flags = "stateful_lm", [*case_flags, "--batch-size", "4", "--tokens-per-sample", "16"]
    elif task == LM and "--tokens-per-sample" not in case_flags:
        case_flags = [*case_flags, "--tokens-per-sample", "32"]
    return plugin_args(data, arch, *case_flags, *flags, task=task)


def build_case(data, arch: str, *flags: str, dropout: bool = True, optimizer=("adam", "0.001")):
    """``(cfg, task, model)`` of ``arch``'s case on ``data`` as fairseq-train builds them, on the CPU, with the
    training split loaded. Families in ``STATEFUL`` train with ``--task stateful_lm`` (the state or memory of one
    batch starts the next), the others with their case's task and 256 tokens per batch. ``dropout=False`` adds
    ``NO_DROPOUT``; ``optimizer`` is ``(name, learning rate)``; ``flags`` come last."""
    from define_fairseq.tools.params import setup_from_train_args

    fam = family(arch)
    stateful = fam in STATEFUL
    batch = [] if stateful else ["--max-tokens", "256"]
    name, lr = optimizer
    cfg, task, model = setup_from_train_args(
        case_argv(
            data,
            arch,
            *([] if dropout else NO_DROPOUT[fam]),
            *batch,
            "--optimizer",
            name,
            "--lr",
            str(lr),
            *RUN_FLAGS,
            *flags,
            stateful=stateful,
        )
    )
    task.load_dataset("train")
    return cfg, task, model
