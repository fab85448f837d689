"""distill_c2s: the four loss terms and the metrics against plain re-computations, single-edit noise, and the
command on a small fairseq translation checkpoint (the loss goes down, the written module reloads and
reproduces the reported numbers, clear errors)."""

import argparse
import math
import random
import re
from pathlib import Path

import pytest
import torch
from conftest import run_module

from define_fairseq.modules.char2subword import CONTINUES_CHAR, WORD_START_CHAR
from define_fairseq.tools.distill_c2s import load_distilled, main
from define_fairseq.tools.distill_c2s_data import noisy_samples, single_edit, symbols_md5
from define_fairseq.tools.distill_c2s_losses import (
    LOSS_TERMS,
    approximation_losses,
    approximation_metrics,
    nearest_neighbours,
)

TOOL = "define_fairseq.tools.distill_c2s"
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


# -- plain re-computations -------------------------------------------------------------------------------------


def _cos(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_each_loss_term_matches_a_plain_recomputation():
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(6, 4, generator=gen)
    labels = torch.tensor([1, 4, 2])
    target = table[labels]
    pred = torch.randn(3, 4, generator=gen)
    neighbour_ids = [[0, 3], [5, 1], [4, 0]]
    neighbours = table[torch.tensor(neighbour_ids)]
    got = approximation_losses(pred, target, neighbours, table, labels)
    assert set(got) == set(LOSS_TERMS)

    P, T, E = pred.tolist(), target.tolist(), table.tolist()
    cos = sum(1 - _cos(p, t) for p, t in zip(P, T)) / 3
    l2 = sum(math.sqrt(sum((x - y) ** 2 for x, y in zip(p, t))) for p, t in zip(P, T)) / 3  # not squared
    nbr = (
        sum(
            sum(((1 - _cos(t, E[j])) - (1 - _cos(p, E[j]))) ** 2 for j in ids) / len(ids)
            for p, t, ids in zip(P, T, neighbour_ids)
        )
        / 3
    )
    ce = 0.0
    for p, y in zip(P, labels.tolist()):
        logits = [sum(a * b for a, b in zip(p, row)) for row in E]
        ce += math.log(sum(math.exp(v) for v in logits)) - logits[y]
    ce /= 3
    for name, expected in (("cos", cos), ("l2", l2), ("nbr", nbr), ("ce", ce)):
        assert got[name].item() == pytest.approx(expected, rel=1e-5, abs=1e-6), name
    assert min(cos, l2, nbr, ce) > 0
    # a perfect prediction zeroes the first three terms
    exact = approximation_losses(target, target, neighbours, table, labels)
    assert exact["cos"].abs() < 1e-6 and exact["l2"] < 1e-6 and exact["nbr"] < 1e-10


def test_neighbours_and_metrics_match_a_brute_force():
    gen = torch.Generator().manual_seed(1)
    table = torch.randn(9, 5, generator=gen)
    found = nearest_neighbours(table, 3, chunk=4)
    rows = table.tolist()
    for i in range(9):
        others = sorted((j for j in range(9) if j != i), key=lambda j: -_cos(rows[i], rows[j]))
        assert found[i].tolist() == others[:3]
    assert approximation_metrics(table, table, found, chunk=4) == {"accuracy": 1.0, "precision": 1.0}
    # predictions that are another entry's vector: no hit; precision as counted by hand
    shifted = table.roll(1, dims=0)
    metrics = approximation_metrics(shifted, table, found, chunk=4)
    assert metrics["accuracy"] == 0.0
    shared = 0
    for i in range(9):
        pred = shifted[i].tolist()
        others = sorted((j for j in range(9) if j != i), key=lambda j: -_cos(pred, rows[j]))
        shared += len(set(others[:3]) & set(found[i].tolist()))
    assert metrics["precision"] == pytest.approx(shared / 27)


def _edit_distance(a, b):
    """Optimal string alignment distance (insert, delete, substitute, swap of neighbours)."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def test_noise_is_one_edit_on_entries_longer_than_four_characters():
    rng = random.Random(0)
    for word in ["transform", "inter", "Straße"] * 20:
        noised = single_edit(word, ("insert", "delete", "substitute", "swap", "case"), rng)
        assert _edit_distance(word, noised) == 1
    assert single_edit("form", ("insert",), rng) is None  # four characters: never noised
    assert single_edit("12345", ("case",), rng) is None  # no edit of that type applies
    symbols = ["transact", "transfer@@", "\u2581interport", "form@@", "duct"]
    positions, chars = noisy_samples(symbols, 1.0, ("substitute",), seed=3, epoch=1, max_chars=12)
    assert positions.tolist() == [0, 1, 2]  # every long entry once (rate 1), "form@@" and "duct" never
    assert chars[1, 8].item() == CONTINUES_CHAR and chars[2, 0].item() == WORD_START_CHAR  # markers kept
    again = noisy_samples(symbols, 1.0, ("substitute",), seed=3, epoch=1, max_chars=12)
    assert torch.equal(again[1], chars)  # deterministic per (seed, epoch, entry)
    none = noisy_samples(symbols, 0.0, ("substitute",), seed=3, epoch=1, max_chars=12)
    assert none[0].numel() == 0 and none[1].shape == (0, 12)


# -- the command -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A fairseq ``transformer`` translation checkpoint (d=16) saved as fairseq's trainer saves one. Its
    encoder table is built from the letters (a sum of letter vectors plus a per-entry part), so that spelling
    predicts the vector as in a trained model; rows have fairseq's scale (norm about 1)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    data = tmp_path_factory.mktemp("c2s-dict")
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


def _dictionary(checkpoint):
    from fairseq.data import Dictionary

    return Dictionary.load(str(checkpoint.parent / "dict.en.txt"))


def _terms(line):
    return {key: float(value) for key, value in re.findall(r"(\S+) (-?\d+\.\d+)", line)}


def _near_ties(pred, table, k, eps=1e-5):
    """``(top-1, top-k)``: how many of ``approximation_metrics``' decisions on ``pred`` lie within ``eps`` (in cosine)
    of a tie, and so may go either way with a forward that rounds differently (the command predicts in batches,
    the eval-mode table all at once: float32 cosines a few 1e-8 apart). Top-1: rows whose own entry and best other
    entry are that close; top-k: per row, the other entries that close to the k-th best other one."""
    sim = (
        torch.nn.functional.normalize(pred.double(), dim=-1) @ torch.nn.functional.normalize(table.double(), dim=-1).t()
    )
    own = sim.diagonal().clone()
    sim.fill_diagonal_(float("-inf"))
    top1 = int(((own - sim.max(dim=1).values).abs() < eps).sum())
    kth = sim.topk(k, dim=1).values[:, -1:]
    topk = int(((sim - kth).abs() < eps).sum(dim=1).sub(1).sum())
    return top1, topk


def test_distill_lowers_the_loss_and_the_output_reloads(checkpoint, tmp_path):
    out = tmp_path / "c2s.pt"
    proc = run_module(
        TOOL,
        "--checkpoint",
        checkpoint,
        "--output",
        out,
        "--neighbours",
        "5",
        "--epochs",
        "40",
        "--batch-size",
        "32",
        "--lr",
        "0.01",
        "--noise-rate",
        "0.3",
        "--cpu",
        *SMALL_C2S,
    )
    lines = proc.stdout.splitlines()
    epochs = [_terms(line) for line in lines if line.startswith("epoch ")]
    before = _terms(next(line for line in lines if line.startswith("before |")))
    after = _terms(next(line for line in lines if line.startswith("after |")))
    assert len(epochs) == 40
    for terms in epochs + [before, after]:
        assert terms["loss"] == pytest.approx(sum(terms[t] for t in LOSS_TERMS), abs=3e-4)
    assert epochs[-1]["loss"] < epochs[0]["loss"] - 0.3
    assert after["loss"] < before["loss"] - 0.3
    assert after["accuracy"] >= before["accuracy"] and after["accuracy"] > 0.2
    assert after["precision@5"] >= before["precision@5"]
    assert re.search(r"samples \d+ \| noisy [1-9]", proc.stdout)  # noisy copies were trained on
    assert not Path(str(out) + ".tmp").exists()

    dictionary = _dictionary(checkpoint)
    module = load_distilled(str(out), dictionary).eval()
    saved = torch.load(out, weights_only=True)
    assert saved["side"] == "encoder" and saved["symbols_md5"] == symbols_md5(dictionary.symbols)
    # re-compute the reported "after" numbers from the reloaded module and the checkpoint's table
    from fairseq import checkpoint_utils

    with torch.serialization.safe_globals([argparse.Namespace]):
        table = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))["model"]["encoder.embed_tokens.weight"]
    regular = torch.arange(dictionary.nspecial, len(dictionary))
    with torch.no_grad():
        pred = module(regular)
        specials = module(torch.arange(dictionary.nspecial))
    torch.testing.assert_close(specials, table[: dictionary.nspecial])  # specials: E's rows, pad zero
    assert specials[dictionary.pad()].eq(0).all()
    neighbours = nearest_neighbours(table[regular], 5)
    losses = approximation_losses(pred, table[regular], table[regular][neighbours], table, regular)
    for name in LOSS_TERMS:
        assert losses[name].item() == pytest.approx(after[name], abs=2e-4), name
        assert losses[name].item() == pytest.approx(saved["metrics"]["after"][name], rel=1e-4, abs=1e-6), name
    metrics = approximation_metrics(pred, table[regular], neighbours)
    ties_top1, ties_top5 = _near_ties(pred, table[regular], 5)  # almost always none: then an exact match
    assert metrics["accuracy"] == pytest.approx(after["accuracy"], abs=1e-4 + ties_top1 / len(regular))
    assert metrics["precision"] == pytest.approx(after["precision@5"], abs=1e-4 + ties_top5 / (5 * len(regular)))

    other = _dictionary(checkpoint)
    other.add_symbol("transview2")
    with pytest.raises(ValueError, match="another dictionary"):
        load_distilled(str(out), other)


def test_missing_checkpoint_is_named(tmp_path):
    missing = tmp_path / "no_such_checkpoint.pt"
    proc = run_module(TOOL, "--checkpoint", missing, "--output", tmp_path / "out.pt", check=False)
    assert proc.returncode != 0
    assert f"--checkpoint {missing}: no such file" in proc.stderr
    assert not (tmp_path / "out.pt").exists()


def test_bad_neighbours_and_a_side_without_table(checkpoint, tmp_path):
    out = str(tmp_path / "out.pt")
    regular = len(SYMBOLS)
    with pytest.raises(ValueError, match=f"--neighbours {regular}: must be between 1 and {regular - 1}"):
        main(
            [
                "--checkpoint",
                str(checkpoint),
                "--output",
                out,
                "--neighbours",
                str(regular),
                "--epochs",
                "0",
                *SMALL_C2S,
            ]
        )
    with torch.serialization.safe_globals([argparse.Namespace]):
        state = torch.load(checkpoint, weights_only=True)
    del state["model"]["decoder.embed_tokens.weight"]
    stripped = tmp_path / "no_decoder_table.pt"
    torch.save(state, stripped)
    with pytest.raises(ValueError, match="no decoder embedding table"):
        main(["--checkpoint", str(stripped), "--output", out, "--side", "decoder", *SMALL_C2S])
    assert not Path(out).exists()


# -- the distilled module swapped into the trained model (tools/c2s_checkpoint) --------------------------------


def test_c2s_checkpoint_gives_transformer_c2s_the_model_with_the_module_for_the_table(checkpoint, tmp_path):
    from conftest import USER_DIR
    from fairseq import checkpoint_utils, tasks

    from define_fairseq.tools import c2s_checkpoint
    from define_fairseq.tools.params import setup_from_train_args

    # the fixture's table rows have norm 1 (RMS d^-0.5, the scale transformer_c2s builds with): a table three
    # times larger, so that the module must be rescaled when it is swapped in
    with torch.serialization.safe_globals([argparse.Namespace]):
        saved = torch.load(checkpoint, weights_only=True)
    saved["model"]["encoder.embed_tokens.weight"] *= 3
    data, checkpoint = checkpoint.parent, tmp_path / checkpoint.name
    torch.save(saved, checkpoint)
    module_path, start = tmp_path / "c2s.pt", tmp_path / "start.pt"
    main(
        [
            "--checkpoint",
            str(checkpoint),
            "--output",
            str(module_path),
            "--epochs",
            "2",
            "--batch-size",
            "16",
            "--lr",
            "0.01",
            "--cpu",
            *SMALL_C2S,
        ]
    )
    c2s_checkpoint.main(["--checkpoint", str(checkpoint), "--c2s", str(module_path), "--output", str(start)])
    assert not Path(str(start) + ".tmp").exists()

    # the reference: the checkpoint's own Transformer with its encoder table replaced by the distilled module
    with torch.serialization.safe_globals([argparse.Namespace]):
        state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    task = tasks.setup_task(state["cfg"].task)
    reference = task.build_model(state["cfg"].model)
    reference.load_state_dict(state["model"])
    reference.encoder.embed_tokens = load_distilled(str(module_path), task.source_dictionary)
    assert reference.encoder.embed_tokens.output_scale == pytest.approx(3 * DIM**-0.5, rel=1e-3)  # E's scale

    # transformer_c2s as fairseq-train builds it, loaded (strictly) from the written start
    _, _, model = setup_from_train_args(
        [
            str(data),
            "--user-dir",
            USER_DIR,
            "--task",
            "translation_c2s",
            "-s",
            "en",
            "-t",
            "de",
            "--arch",
            "transformer_c2s",
            *TINY_TRANSFORMER,
            *SMALL_C2S,
            *ADAM_CPU,
        ]
    )
    model.load_state_dict(checkpoint_utils.load_checkpoint_to_cpu(str(start))["model"], strict=True)
    assert model.encoder.embed_tokens.output_scale == pytest.approx(DIM**-0.5)

    reference.eval()
    model.eval()
    gen = torch.Generator().manual_seed(3)
    dictionary = task.source_dictionary
    src = torch.randint(dictionary.nspecial, len(dictionary), (3, 6), generator=gen)
    src[:, -1] = dictionary.eos()
    prev = torch.randint(dictionary.nspecial, len(dictionary), (3, 4), generator=gen)
    lengths = torch.full((3,), 6)
    with torch.no_grad():
        expected = reference(src, lengths, prev)[0]
        torch.testing.assert_close(model(src, lengths, prev)[0], expected, rtol=1e-4, atol=1e-5)
        # and it is not the table's model
        original = task.build_model(state["cfg"].model)
        original.load_state_dict(state["model"])
        assert not torch.allclose(original.eval()(src, lengths, prev)[0], expected, atol=1e-3)


def test_c2s_checkpoint_refuses_a_decoder_module_and_names_missing_files(checkpoint, tmp_path):
    from define_fairseq.tools import c2s_checkpoint

    decoder_module = tmp_path / "decoder.pt"
    main(
        [
            "--checkpoint",
            str(checkpoint),
            "--output",
            str(decoder_module),
            "--side",
            "decoder",
            "--epochs",
            "0",
            "--cpu",
            *SMALL_C2S,
        ]
    )
    out = tmp_path / "start.pt"
    with pytest.raises(ValueError, match="distilled from a decoder table"):
        c2s_checkpoint.main(["--checkpoint", str(checkpoint), "--c2s", str(decoder_module), "--output", str(out)])
    with pytest.raises(FileNotFoundError, match="no_such.pt: no such file"):
        c2s_checkpoint.main(
            ["--checkpoint", str(checkpoint), "--c2s", str(tmp_path / "no_such.pt"), "--output", str(out)]
        )
    with pytest.raises(FileNotFoundError, match="--output .*the directory .* does not exist"):
        c2s_checkpoint.main(
            [
                "--checkpoint",
                str(checkpoint),
                "--c2s",
                str(decoder_module),
                "--output",
                str(tmp_path / "no_such_dir" / "start.pt"),
            ]
        )
    assert not out.exists()
    # a table whose shape is not the module's: the swap is refused, naming the checkpoint
    module = load_distilled(str(decoder_module), _dictionary(checkpoint))
    state = {"model": {c2s_checkpoint.TABLE_KEY: torch.zeros(module.num_embeddings, module.embedding_dim + 1)}}
    with pytest.raises(
        ValueError,
        match=r"--checkpoint ck\.pt: encoder\.embed_tokens\.weight is \(.*\) but the "
        r"module embeds",
    ):
        c2s_checkpoint.swap_in(state, module, "ck.pt")
