"""The noise_text command (define_fairseq.tools.noise_text): the noised copy and its measured rate, segmented text
whose cuts are kept as in training, bad flags, and a failure that keeps the old output."""

import re

import pytest
from conftest import make_words, run_module

from define_fairseq.data.char_noise import CharNoise, NoiseStats, sample_rng
from define_fairseq.tools import noise_text


def test_noise_text_writes_the_noised_copy_and_prints_the_rate(tmp_path, capsys):
    lines = [" ".join(make_words(12, seed=i)) for i in range(150)]
    lines[3] = ""
    lines[7] = "tab\tseparated  words "
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    target = tmp_path / "out.txt"
    noise_text.main(["--rate", "0.1", "--seed", "3", "--min-chars", "2", str(source), str(target)])
    out = capsys.readouterr().out
    assert target.exists() and not (tmp_path / "out.txt.tmp").exists()

    # Plain re-computation: line i, word by word, with sample_rng(3, 0, i).
    noise, stats, expected = CharNoise(0.1, min_chars=2), NoiseStats(), []
    for i, line in enumerate(lines):
        rng = sample_rng(3, 0, i)
        expected.append(
            "".join(p if p.isspace() or not p else noise.noise_word(p, rng, stats) for p in re.split(r"(\s+)", line))
        )
    got = target.read_text(encoding="utf-8").split("\n")
    assert got == expected + [""]
    assert got[3] == "" and re.findall(r"\s+", got[7]) == ["\t", "  ", " "]
    assert got != lines
    rate = float(re.search(r"character edit rate: ([0-9.]+)", out).group(1))
    assert rate == pytest.approx(stats.rate, abs=1e-4) and abs(rate - 0.1) < 0.03
    assert f"words changed: {stats.words_changed} of {stats.words}" in out
    assert stats.words_changed == sum(a != b for x, y in zip(lines, got) for a, b in zip(x.split(), y.split()))


def test_noise_text_segmented_keeps_the_cuts_and_matches_the_training_noise(tmp_path, capsys):
    """--segmented: a BPE-segmented file noised as translation_c2s noises its training source (noise_tokens with
    sample_rng(seed, 0, line)); each word gets the same edits as noising the unsegmented line."""
    words = [make_words(8, seed=i) for i in range(60)]
    plain = [" ".join(w) for w in words]
    # subword-nmt style: every word longer than 3 characters cut after its third character
    pieces = [[p for word in w for p in ([word[:3] + "@@", word[3:]] if len(word) > 3 else [word])] for w in words]
    segmented = [" ".join(p) for p in pieces]
    segmented[5] = ""
    plain[5] = ""
    source, target = tmp_path / "in.bpe", tmp_path / "out.bpe"
    source.write_text("".join(line + "\n" for line in segmented), encoding="utf-8")
    noise_text.main(["--segmented", "--rate", "0.1", "--seed", "3", str(source), str(target)])
    out = capsys.readouterr().out
    got = target.read_text(encoding="utf-8").split("\n")[:-1]
    noise, stats = CharNoise(0.1), NoiseStats()
    expected = [
        " ".join(noise.noise_tokens(line.split(), sample_rng(3, 0, i), stats)) if line else ""
        for i, line in enumerate(segmented)
    ]
    assert got == expected and got != segmented and got[5] == ""
    assert f"words changed: {stats.words_changed} of {stats.words}" in out
    # the same edits as on the unsegmented text: joining the pieces gives the plain run's output
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in plain), encoding="utf-8")
    noise_text.main(["--rate", "0.1", "--seed", "3", str(tmp_path / "in.txt"), str(tmp_path / "out.txt")])
    joined = [line.replace("@@ ", "") for line in got]
    assert joined == (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")[:-1]
    # while a cut word keeps a cut wherever both its pieces kept characters
    assert sum(line.count("@@") for line in got) >= 0.8 * sum(line.count("@@") for line in segmented)


def test_noise_text_rejects_bad_flags(tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("hello world\n")
    for flags, message in (
        (["--rate", "1.5"], "--rate"),
        (["--rate", "0.1", "--types", "typo"], "substitute"),
        (["--rate", "0.1", "--min-chars", "0"], "--min-chars"),
    ):
        with pytest.raises(SystemExit) as error:
            noise_text.main(flags + ["--seed", "1", str(source), str(tmp_path / "out.txt")])
        assert error.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out.txt").exists()


def test_noise_text_fails_cleanly_and_keeps_the_old_output(tmp_path):
    target = tmp_path / "out.txt"
    missing = tmp_path / "no-such-file.txt"
    proc = run_module("define_fairseq.tools.noise_text", "--rate", "0.1", "--seed", "1", missing, target, check=False)
    assert proc.returncode != 0 and str(missing) in proc.stderr and "Traceback" not in proc.stderr
    assert not target.exists() and not (tmp_path / "out.txt.tmp").exists()
    # A failure half-way (invalid UTF-8 after good lines) leaves an existing OUTPUT as it was.
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good line\n" * 50 + b"\xff\xfe broken\n")
    target.write_text("old\n")
    with pytest.raises(SystemExit) as error:
        noise_text.main(["--rate", "0.5", "--seed", "1", str(bad), str(target)])
    assert str(bad) in str(error.value.code)
    assert target.read_text() == "old\n" and not (tmp_path / "out.txt.tmp").exists()
