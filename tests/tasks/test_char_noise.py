"""Character noise for Char2Subword: determinism, measured rates, each edit type, BPE pieces, errors and the
noise_text command."""

import math
import os
import random
import re
import string
import subprocess
import sys

import pytest
from conftest import REPO, make_words

from define_fairseq.data.char_noise import (
    NOISE_TYPES,
    CharNoise,
    NoiseStats,
    parse_noise_types,
    sample_rng,
)

SP = "\u2581"


def levenshtein(a, b):
    """Edit distance with unit insert / delete / substitute (a swap of two characters costs 2)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def hamming(a, b):
    assert len(a) == len(b)
    return sum(x != y for x, y in zip(a, b))


def is_subsequence(short, long):
    letters = iter(long)
    return all(char in letters for char in short)


def noise_each(noise, words, seed=0):
    """[(word, noised, per-word NoiseStats)] with one generator for the whole list."""
    rng = sample_rng(seed, 0, 0)
    out = []
    for word in words:
        stats = NoiseStats()
        out.append((word, noise.noise_word(word, rng, stats), stats))
    return out


def total(stats_list):
    summed = NoiseStats()
    for stats in stats_list:
        summed.words += stats.words
        summed.words_changed += stats.words_changed
        summed.chars += stats.chars
        summed.edits += stats.edits
        for op, n in stats.ops.items():
            summed.ops[op] += n
    return summed


def editable_chars(words, min_chars=1):
    return sum(len(w) for w in words if len(w) >= min_chars)  # the test words have no whitespace or marks


# ---------------------------------------------------------------------------------------------- determinism


def test_sample_rng_is_stable_across_processes_and_distinct():
    first = sample_rng(3, 1, 7).random()
    assert sample_rng(3, 1, 7).random() == first
    draws = {sample_rng(*key).random() for key in [(3, 1, 7), (4, 1, 7), (3, 2, 7), (3, 1, 8), (7, 1, 3)]}
    assert len(draws) == 5
    # Another process with another hash salt, without site-packages: plain Python, and not Python's hash().
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import char_noise; "
        "print(repr(char_noise.sample_rng(3, 1, 7).random()))"
    )
    for salt in ("1", "2"):
        proc = subprocess.run(
            [sys.executable, "-S", "-c", code, str(REPO / "define_fairseq" / "data")],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": salt},
        )
        assert proc.returncode == 0, proc.stderr
        assert float(proc.stdout) == first


def test_noise_is_deterministic_for_a_seed():
    words = make_words(300)
    noise = CharNoise(0.2)

    def run(seed, epoch, index):
        rng = sample_rng(seed, epoch, index)
        return [noise.noise_word(w, rng) for w in words]

    reference = run(1, 0, 0)
    assert reference == run(1, 0, 0)
    assert reference != words
    for other in [(2, 0, 0), (1, 1, 0), (1, 0, 1)]:
        assert run(*other) != reference
    pieces = "the new@@ est car@@ s are here and there".split()
    assert noise.noise_tokens(pieces, sample_rng(5, 0, 3)) == noise.noise_tokens(pieces, sample_rng(5, 0, 3))


# ------------------------------------------------------------------------------------------------ the rate


@pytest.mark.parametrize("rate", [0.05, 0.1, 0.3])
def test_measured_edit_rate_matches_requested(rate):
    words = make_words(3000, seed=1)
    results = noise_each(CharNoise(rate), words, seed=2)
    stats = total(s for _, _, s in results)
    chars = editable_chars(words)
    assert stats.chars == chars and stats.words == len(words)
    # Each of the ~18,000 positions is edited with probability `rate`: 4 binomial standard deviations.
    tolerance = 4 * math.sqrt(rate * (1 - rate) / chars)
    assert abs(stats.edits / chars - rate) < tolerance, (stats.edits / chars, rate, tolerance)
    assert abs(stats.rate - rate) < tolerance
    assert all(stats.ops[op] > 0 for op in NOISE_TYPES)
    # The counted edits are real: a swap costs at most 2 plain edits, the others at most 1, so the edit
    # distance of each word is bounded by them; and few edits cancel or merge, so the total stays close.
    distances = [levenshtein(w, v) for w, v, _ in results]
    for (word, noised, s), distance in zip(results, distances):
        assert distance <= s.edits + s.ops["swap"], (word, noised, s)
    bound = stats.edits + stats.ops["swap"]
    assert 0.8 * bound <= sum(distances) <= bound
    # A word is changed exactly when it was edited.
    assert stats.words_changed == sum(w != v for w, v, _ in results) == sum(s.edits > 0 for _, _, s in results)


@pytest.mark.parametrize("rate", [0.05, 0.1, 0.3])
def test_substitution_rate_measured_without_the_counter(rate):
    """Substitutions keep the length and always change the character: the Hamming distance counts them."""
    words = make_words(3000, seed=3)
    results = noise_each(CharNoise(rate, types=["substitute"]), words, seed=4)
    changed = sum(hamming(w, v) for w, v, _ in results)
    chars = editable_chars(words)
    assert abs(changed / chars - rate) < 4 * math.sqrt(rate * (1 - rate) / chars)


def test_rate_zero_changes_nothing():
    words = make_words(500)
    stats = NoiseStats()
    noise = CharNoise(0.0)
    rng = sample_rng(0, 0, 0)
    assert [noise.noise_word(w, rng, stats) for w in words] == words
    assert stats.edits == 0 and stats.words_changed == 0 and stats.chars == editable_chars(words)
    pieces = f"{SP}the {SP}new est {SP}car s".split()
    assert noise.noise_tokens(pieces, rng) == pieces


@pytest.mark.parametrize("min_chars", [1, 3, 5])
def test_rate_one_changes_every_word_of_min_chars(min_chars):
    words = make_words(2000, seed=5) + ["a", "Z", "7", "?", "ab"]
    results = noise_each(CharNoise(1.0, min_chars=min_chars), words)
    for word, noised, stats in results:
        if len(word) >= min_chars:
            assert noised != word and noised and stats.edits > 0
        else:
            assert noised == word and stats.edits == 0 and stats.chars == 0
    assert total(s for _, _, s in results).chars == editable_chars(words, min_chars)


# ----------------------------------------------------------------------------------------- each edit type


@pytest.mark.parametrize("rate", [0.2, 1.0])
@pytest.mark.parametrize("kind", NOISE_TYPES)
def test_each_type_alone_does_what_it_says(kind, rate):
    words = make_words(800, seed=6)
    results = noise_each(CharNoise(rate, types=[kind]), words, seed=7)
    stats = total(s for _, _, s in results)
    assert stats.edits == stats.ops[kind] > 0
    assert all(n == 0 for op, n in stats.ops.items() if op != kind)
    for word, noised, s in results:
        n = s.edits
        assert noised
        if kind == "delete":  # each delete shortens by one; the last character is never deleted
            assert len(noised) == len(word) - n and is_subsequence(noised, word)
            if rate == 1.0:
                assert len(noised) == 1
        elif kind == "insert":  # each insert lengthens by one, by a letter
            assert len(noised) == len(word) + n and is_subsequence(word, noised)
            extra = list(noised)
            for char in word:
                extra.remove(char)
            assert all(c in string.ascii_letters for c in extra)
        elif kind == "substitute":  # same length, one position changed per edit
            assert hamming(word, noised) == n
        elif kind == "swap":  # same characters, moved
            assert sorted(noised) == sorted(word) and hamming(word, noised) <= 2 * n
            assert (noised != word) == (n > 0)
        else:  # case: same lowercase form, one position flipped per edit
            assert noised.lower() == word.lower() and hamming(word, noised) == n
            assert all(a == b for a, b in zip(word, noised) if not a.isalpha())


def test_substitute_and_insert_use_keyboard_neighbours():
    rng = sample_rng(0, 0, 0)
    substitute = CharNoise(1.0, types=["substitute"])
    assert set(substitute.noise_word("g" * 300, rng)) == set("tyfhvb")
    assert set(substitute.noise_word("G" * 300, rng)) == set("TYFHVB")
    assert set(substitute.noise_word("q" * 100, rng)) == set("wa")
    assert set(substitute.noise_word("5" * 500, rng)) == set(string.ascii_lowercase)
    insert = CharNoise(1.0, types=["insert"])
    noised = insert.noise_word("k" * 200, rng)
    assert noised[0::2] == "k" * 200 and set(noised[1::2]) == set("iojlm")
    noised = insert.noise_word("!" * 300, rng)
    assert noised[0::2] == "!" * 300 and set(noised[1::2]) == set(string.ascii_lowercase)


def test_case_skips_characters_without_case_and_whitespace_is_never_created():
    rng = sample_rng(0, 0, 0)
    stats = NoiseStats()
    assert CharNoise(1.0, types=["case"]).noise_word("123-45", rng, stats) == "123-45"
    assert stats.edits == 0 and stats.chars == 6 and stats.words_changed == 0
    assert CharNoise(1.0, types=["case"]).noise_word("ab1Cd", rng) == "AB1cD"
    # A string with whitespace inside: the whitespace is neither edited, moved, nor created.
    noise = CharNoise(1.0)
    for seed in range(50):
        noised = noise.noise_word("ab c\td  e", sample_rng(seed, 0, 0))
        assert re.findall(r"\s", noised) == [" ", "\t", " ", " "]


# -------------------------------------------------------------------------------------------------- BPE


def segment(words, rng, style):
    """Split each word into 1-3 pieces with subword-nmt (``@@``) or sentencepiece (``\u2581``) markers."""
    pieces = []
    for word in words:
        cuts = sorted(rng.sample(range(1, len(word)), min(len(word) - 1, rng.randint(0, 2))))
        parts = [word[a:b] for a, b in zip([0] + cuts, cuts + [len(word)])]
        if style == "subword-nmt":
            pieces += [p + "@@" for p in parts[:-1]] + [parts[-1]]
        else:
            pieces += [SP + parts[0]] + parts[1:]
    return pieces


def split_words(pieces, style):
    """Words as lists of piece texts (markers off), checking that the markers are where they belong."""
    words = []
    for k, piece in enumerate(pieces):
        if style == "subword-nmt":
            assert not piece.startswith(SP)
            if k == 0 or not pieces[k - 1].endswith("@@"):
                words.append([])
            words[-1].append(piece[:-2] if piece.endswith("@@") else piece)
        else:
            assert not piece.endswith("@@")
            if piece.startswith(SP):
                words.append([])
            words[-1].append(piece[1:] if piece.startswith(SP) else piece)
    assert not pieces or not pieces[-1].endswith("@@")
    return words


@pytest.mark.parametrize("style", ["subword-nmt", "sentencepiece"])
@pytest.mark.parametrize(
    "rate,types", [(0.3, NOISE_TYPES), (1.0, NOISE_TYPES), (1.0, ["delete"]), (0.5, ["delete", "swap"])]
)
def test_noise_tokens_keeps_markers_and_never_leaves_an_empty_piece(style, rate, types):
    noise = CharNoise(rate, types=types)
    rng = random.Random(8)
    for index in range(100):
        words = make_words(rng.randint(1, 12), seed=index)
        pieces = segment(words, rng, style)
        noised = noise.noise_tokens(pieces, sample_rng(1, 0, index))
        new_words = split_words(noised, style)
        assert len(new_words) == len(words)
        assert all(all(piece for piece in word) for word in new_words)  # no empty piece, no bare marker
        assert len(noised) <= len(pieces)
        if types == ["delete"] and rate == 1.0:
            assert all(len("".join(word)) == 1 for word in new_words)


@pytest.mark.parametrize("style", ["subword-nmt", "sentencepiece"])
def test_noise_tokens_is_noise_word_over_the_joined_word_keeping_the_cuts(style):
    words = make_words(400, seed=9)
    pieces = segment(words, random.Random(9), style)
    original_pieces = [len(p) for word in split_words(pieces, style) for p in word]
    for types in (NOISE_TYPES, ["substitute", "case", "swap"]):
        noise = CharNoise(0.3, types=types)
        noised = split_words(noise.noise_tokens(pieces, sample_rng(2, 0, 0)), style)
        rng = sample_rng(2, 0, 0)
        assert ["".join(word) for word in noised] == [noise.noise_word(w, rng) for w in words]
        if "insert" not in types:  # length-keeping edits: every piece keeps its length (the cuts stay)
            assert [len(p) for word in noised for p in word] == original_pieces


def test_noise_tokens_marker_edge_cases():
    delete_all = CharNoise(1.0, types=["delete"])
    rng = sample_rng(0, 0, 0)
    # The piece holding the word-start marker / the missing final @@ vanishes: the marker moves.
    assert delete_all.noise_tokens([f"{SP}ab", "c"], rng) == [f"{SP}c"]
    assert delete_all.noise_tokens(["ab@@", "c@@", "d", "xy"], rng) == ["d", "y"]
    # Marker-only pieces of the input stay; markers are never edited.
    noised = CharNoise(1.0).noise_tokens([f"{SP}", "(", "ab", f"{SP}cd"], rng)
    assert noised[0] == SP and sum(p.startswith(SP) for p in noised) == 2
    assert all(p for p in noised)
    with pytest.raises(ValueError, match="empty BPE piece"):
        CharNoise(0.1).noise_tokens(["a", "", "b"], rng)


# ----------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("rate", [-0.01, 1.01, float("nan"), "0.1", None])
def test_bad_rate_names_the_flag(rate):
    with pytest.raises(ValueError, match="--c2s-noise-rate"):
        CharNoise(rate)


def test_bad_types_name_the_flag_and_list_the_valid_ones():
    for bad in (["insert", "typo"], "insert,typo", []):
        with pytest.raises(ValueError, match="--c2s-noise-types") as error:
            CharNoise(0.1, types=bad)
        assert all(name in str(error.value) for name in NOISE_TYPES)
    with pytest.raises(ValueError, match="--c2s-noise-types.*'typo'"):
        parse_noise_types("swap,typo")
    with pytest.raises(ValueError, match="--c2s-noise-types"):
        parse_noise_types(" , ")
    assert parse_noise_types("swap, insert,swap") == ("insert", "swap")
    assert CharNoise(0.1, types="case,delete").types == ("delete", "case")
