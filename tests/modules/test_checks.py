"""modules/checks.py: each check returns the value it accepts and raises a ParameterError naming the parameter,
which a model's resolver names by its flag (the same message, with the flag as the name) before it builds."""

import math

import pytest

from define_fairseq.modules.checks import ParameterError, check_nonnegative, check_positive, check_probability


@pytest.mark.parametrize(
    "check,value,name,message",
    [
        (check_positive, 0, "num_layers", "num_layers=0 must be at least 1"),
        (check_positive, -3, "--decoder-layers", "--decoder-layers=-3 must be at least 1"),
        (check_nonnegative, -1, "--txl-mem-len", "--txl-mem-len=-1 must be >= 0"),
        (check_nonnegative, math.inf, "l2_penalty", "l2_penalty=inf must be >= 0"),
        (check_nonnegative, math.nan, "--awd-ar-alpha", "--awd-ar-alpha=nan must be >= 0"),
        (check_probability, 1.0, "--dropout", "--dropout=1.0: a dropout probability must be in [0, 1)"),
    ],
)
def test_a_bad_value_raises_naming_the_parameter(check, value, name, message):
    with pytest.raises(ParameterError) as error:
        check(value, name)
    assert str(error.value) == message
    assert isinstance(error.value, ValueError)  # what a model's build raises to fairseq


@pytest.mark.parametrize(
    "check,value,expected",
    [(check_positive, 3, 3), (check_nonnegative, 0, 0), (check_nonnegative, 0.5, 0.5), (check_probability, 0, 0.0)],
)
def test_a_good_value_is_returned(check, value, expected):
    assert check(value, "x") == expected


def test_a_note_follows_the_requirement_and_a_renamed_error_keeps_its_form():
    with pytest.raises(ParameterError) as error:
        check_nonnegative(-1, "rounds", "0: a plain LSTM")
    assert str(error.value) == "rounds=-1 must be >= 0 (0: a plain LSTM)"
    renamed = error.value.renamed({"rounds": "--mogrifier-rounds"})
    assert str(renamed) == "--mogrifier-rounds=-1 must be >= 0 (0: a plain LSTM)"
