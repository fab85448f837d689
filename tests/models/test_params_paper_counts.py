"""The parameter report reproduces the DeFINE paper's Table 1a counts at V = 267,735."""

import pytest
from conftest import USER_DIR, run_module

# arch -> (context, input/output) in millions, Table 1a: R1 standard, R5 adaptive + DeFINE (every row's counts in
# process: test_lstm_lm.test_paper_parameter_counts; here the report, without and with a DeFINE unit)
TABLE_1A = {"lstm_lm_standard_wt103": (23.36, 68.81), "lstm_lm_define_wt103_n11": (26.24, 18.55)}


def report(*args):
    out = run_module("define_fairseq.tools.params", *args).stdout
    return {
        line.rsplit(None, 1)[0]: float(line.rsplit(None, 1)[1].rstrip("M"))
        for line in out.splitlines()
        if line.strip() and line.rstrip().endswith("M")
    }


@pytest.mark.parametrize("arch", list(TABLE_1A))
def test_table_1a_counts(arch):
    counts = report("--vocab-size", "267735", "--user-dir", USER_DIR, "--task", "language_modeling", "--arch", arch)
    assert (counts["context"], counts["input/output"]) == TABLE_1A[arch]
    assert counts["DeFINE"] == (0.0 if "define" not in arch else counts["DeFINE"]) and (counts["DeFINE"] > 0) == (
        "define" in arch
    )
    assert counts["total"] == pytest.approx(counts["DeFINE"] + counts["context"] + counts["input/output"], abs=0.011)


def test_vocab_size_flag_is_checked():
    proc = run_module(
        "define_fairseq.tools.params",
        "--vocab-size",
        "3",
        "--user-dir",
        USER_DIR,
        "--task",
        "language_modeling",
        "--arch",
        "lstm_lm_adaptive_wt103",
        check=False,
    )
    assert proc.returncode != 0 and "--vocab-size" in proc.stderr
