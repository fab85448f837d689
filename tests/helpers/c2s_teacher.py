"""A tiny fairseq ``transformer`` translation checkpoint whose encoder table a Char2Subword module can learn: the
teacher of the distill_c2s and c2s_checkpoint tests, and the flags of their small models."""

from pathlib import Path

import torch

PREFIXES = ["con", "pre", "trans", "inter", "re", "un"]
STEMS = ["act", "form", "port", "view", "duct", "fer", "mit", "tend"]
# 48 words with shared prefixes and stems, and the 8 stems as word-initial subword-nmt pieces: 56 + 4 specials
SYMBOLS = [p + s for p in PREFIXES for s in STEMS] + [s + "@@" for s in STEMS]
DIM = 16
# the teacher transformer's and the student transformer_c2s's 1+1 layers of width DIM
TINY_TRANSFORMER = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", str(DIM)]
TINY_TRANSFORMER += ["--decoder-embed-dim", str(DIM), "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32"]
TINY_TRANSFORMER += ["--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
ADAM_CPU = ["--optimizer", "adam", "--lr", "0.001", "--cpu"]
SMALL_C2S = [
    "--c2s-char-dim",
    "32",
    "--c2s-layers",
    "1",
    "--c2s-heads",
    "2",
    "--c2s-ffn-dim",
    "64",
    "--c2s-max-chars",
    "12",
]


def write_teacher_checkpoint(data: Path) -> Path:
    """A fairseq ``transformer`` translation checkpoint (d=16) saved as fairseq's trainer saves one. Its
    encoder table is built from the letters (a sum of letter vectors plus a per-entry part), so that spelling
    predicts the vector as in a trained model; rows have fairseq's scale (norm about 1)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    lines = "".join(f"{symbol} {100 - i}\n" for i, symbol in enumerate(SYMBOLS))
    (data / "dict.en.txt").write_text(lines)
    (data / "dict.de.txt").write_text(lines)
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            str(data),
            "--task",
            "translation",
            "-s",
            "en",
            "-t",
            "de",
            "--arch",
            "transformer",
            *TINY_TRANSFORMER,
            *ADAM_CPU,
        ],
    )
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    dictionary = task.source_dictionary
    gen = torch.Generator().manual_seed(0)
    letters = {c: torch.randn(DIM, generator=gen) for c in "abcdefghijklmnopqrstuvwxyz@"}
    with torch.no_grad():
        weight = model.encoder.embed_tokens.weight
        for i in range(dictionary.nspecial, len(dictionary)):
            row = sum(letters[c] for c in dictionary[i]) + 0.5 * torch.randn(DIM, generator=gen)
            weight[i] = row / row.norm()
    state = {
        "args": None,
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [
            {
                "criterion_name": "CrossEntropyCriterion",
                "optimizer_name": "FairseqAdam",
                "lr_scheduler_state": {"best": None},
                "num_updates": 2,
            }
        ],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": 1}},
        "last_optimizer_state": None,
    }
    path = data / "checkpoint_last.pt"
    torch.save(state, path)
    return path
