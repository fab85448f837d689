"""equal_params: the largest size within another model's parameter count."""

import pytest
from arch_cases import TRANSLATION as TINY_MODEL

import define_fairseq  # noqa: F401  (registers the models)
from scripts.equal_params import count, largest_within, main


def test_largest_within_is_the_last_size_inside_the_budget():
    assert largest_within(50, lambda s: s * s, 1, 100) == (7, 49)
    assert largest_within(49, lambda s: s * s, 1, 100) == (7, 49)
    assert largest_within(48, lambda s: s * s, 1, 100) == (6, 36)
    assert largest_within(50, lambda s: s * s, 1, 100, step=4) == (4, 16)  # multiples of 4 only
    assert largest_within(80, lambda s: s * s, 3, 100, step=4) == (8, 64)


@pytest.mark.parametrize("low,high,flag", [(8, 100, "--low"), (1, 7, "--high")])
def test_a_range_that_misses_the_answer_names_the_bound(low, high, flag):
    with pytest.raises(ValueError, match=flag):
        largest_within(50, lambda s: s * s, low, high)


def test_projective_n_at_defines_count(translation_data, capsys):
    common = [
        str(translation_data),
        "--user-dir",
        "define_fairseq",
        "--arch",
        "transformer_define_iwslt_de_en",
        *TINY_MODEL,
        "--share-all-embeddings",
        "--optimizer",
        "adam",
        "--lr",
        "0.001",
        "--cpu",
    ]
    # --low/--high around d = 32: half the builds of the default range's search (largest_within is tested above)
    size = ["--size", "--define-variant projective --define-n {}", "--low", "8", "--high", "64"]
    main(["--budget", "--define-n 16", *size, "--", *common])
    n, total, budget = map(int, capsys.readouterr().out.split("\t"))
    assert budget == count(common + ["--define-n", "16"])
    assert total == count(common + ["--define-variant", "projective", "--define-n", str(n)]) <= budget
    assert count(common + ["--define-variant", "projective", "--define-n", str(n + 1)]) > budget
    assert n > 16  # the unit's parameters buy the projective input more table columns
