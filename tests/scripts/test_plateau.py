"""scripts.plateau: the rule that says when a run's validation perplexity has levelled off."""

import json

import pytest

from scripts.plateau import first_plateau, gain, main

# (updates, validation loss in base 2): falling fast, then by 0.01 bits (0.69% in perplexity) over the last fifth
CURVE = [(1000, 9.0), (2000, 8.0), (3000, 7.5), (4000, 7.2), (5000, 7.1), (6000, 7.09), (7000, 7.08), (8000, 7.08)]


def test_the_gain_is_the_fall_of_the_best_perplexity_over_the_last_fifth():
    # at 5,000 the last fifth starts at 4,000: 2^7.2 -> 2^7.1
    assert gain(CURVE, 5000) == pytest.approx(1 - 2**7.1 / 2**7.2)
    # at 6,000 it starts at 4,800: the best up to then is 4,000's
    assert gain(CURVE, 6000) == pytest.approx(1 - 2 ** (7.09 - 7.2))
    assert gain(CURVE, 7000) == pytest.approx(1 - 2 ** (7.08 - 7.1))  # from 5,600: 5,000's
    assert gain(CURVE, 8000) == pytest.approx(1 - 2 ** (7.08 - 7.09))  # from 6,400: 6,000's


def test_a_rise_between_validations_is_no_gain_and_no_loss():
    """A stream's validation perplexity rises where an epoch starts the streams again and falls back: only a new best
    counts, so neither the rise nor the fall back to the old best moves the gain."""
    bumpy = [(1000, 8.0), (2000, 7.0), (3000, 7.3), (4000, 7.0), (5000, 7.2)]
    assert gain(bumpy, 5000) == 0.0  # best 7.0 at 2,000 and still 7.0
    assert gain(bumpy + [(6000, 6.99)], 6000) == pytest.approx(1 - 2 ** (6.99 - 7.0))
    assert first_plateau(bumpy) == 3000  # from 2,400 (the best, 7.0 at 2,000) to 7.0: the rise is no gain


def test_no_gain_where_the_count_was_not_validated_or_nothing_comes_before_its_last_fifth():
    assert gain(CURVE, 4500) is None
    assert gain(CURVE, 1000) is None  # 800 updates: no validation yet


def test_the_first_plateau_is_the_first_validation_with_a_gain_under_one_percent():
    # 5,000: 6.7%; 6,000: 7.3%; 7,000: 1.4%; 8,000: 0.69%
    gains = {u: gain(CURVE, u) for u, _ in CURVE}
    expected = next(u for u, g in gains.items() if g is not None and g < 0.01)
    assert first_plateau(CURVE) == expected == 8000
    assert first_plateau(CURVE, threshold=0.001) is None
    assert first_plateau(CURVE[:6]) is None


def test_a_rise_at_an_unstable_start_is_no_plateau_once_the_run_falls_again():
    """A validation perplexity that rises early gives no gain over that window, but the run is far from level: the
    plateau is where the rule holds at every validation since, and none while the last one fails it."""
    unstable = [(1000, 11.0), (2000, 12.3), (3000, 7.2), (4000, 6.9), (5000, 6.6)]
    assert gain(unstable, 2000) == 0.0
    assert first_plateau(unstable) is None
    # 6,000: from 4,800's best (6.9 at 4,000) to 6.6, 19%; 7,000: from 5,600's (6.6), none
    assert first_plateau(unstable + [(6000, 6.6), (7000, 6.6)]) == 7000


def write_log(path, curve, finished):
    lines = [
        f"2026-01-01 00:00:00 | INFO | valid | {json.dumps({'valid_loss': str(loss), 'valid_num_updates': str(u)})}"
        for u, loss in curve
    ]
    if finished:
        lines.append("2026-01-01 00:00:00 | INFO | fairseq_cli.train | done training in 10.0 seconds")
    path.mkdir(parents=True)
    (path / ("train.log" if finished else "train.log.tmp")).write_text("\n".join(lines) + "\n")


def test_the_report_reads_finished_and_running_runs_and_gives_the_count_every_run_met_it_since(tmp_path, capsys):
    write_log(tmp_path / "runs" / "train" / "a.s1", CURVE, finished=True)
    write_log(tmp_path / "runs" / "train" / "b.s1", CURVE[:6], finished=False)  # still training
    main([str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "a.s1 | 8000 | 0.69% | 8000"  # 1 - 2^(7.08 - 7.09)
    assert lines[2] == "b.s1 | 6000 | 7.34% | not yet"
    assert "not levelled off yet: b.s1" in lines[3]
    main([str(tmp_path), "--threshold", "0.08"])
    assert capsys.readouterr().out.splitlines()[-1] == "every run has met the rule since 5000 updates (-L 5000)"


def test_an_out_without_runs_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="holds no run; give the comparison's OUT"):
        main([str(tmp_path)])


@pytest.mark.parametrize("flag", ["--window", "--threshold"])
def test_a_window_or_threshold_outside_0_to_1_is_refused(tmp_path, flag):
    with pytest.raises(SystemExit, match="--window and --threshold are fractions between 0 and 1"):
        main([str(tmp_path), flag, "1.5"])
