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
from c2s_teacher import SMALL_C2S, SYMBOLS, write_teacher_checkpoint
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
    return write_teacher_checkpoint(tmp_path_factory.mktemp("c2s-dict"))


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
