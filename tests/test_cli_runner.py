"""The tests' way of running fairseq's programs (tests/helpers/cli_runner.py) behaves as the console scripts do."""

from conftest import USER_DIR, run_cli


def test_a_program_sees_the_plugin_only_through_user_dir(lm_data):
    flags = [lm_data, "--task", "language_modeling", "--arch", "gcnn_lm", "--cpu", "--no-such-flag"]
    without = run_cli("fairseq-train", *flags, check=False)
    assert without.returncode == 2 and "invalid choice: 'gcnn_lm'" in without.stderr
    parsed = run_cli("fairseq-train", *flags, "--user-dir", USER_DIR, check=False)  # the arch known, one flag not
    assert parsed.returncode == 2 and "unrecognized arguments: --no-such-flag" in parsed.stderr
    assert "invalid choice" not in parsed.stderr


def test_a_program_runs_in_the_given_directory_and_reports_its_failure(tmp_path):
    (tmp_path / "train.txt").write_text("a b c\nb c\n")
    run_cli("fairseq-preprocess", "--only-source", "--trainpref", "train.txt", "--destdir", "bin", cwd=tmp_path)
    assert (tmp_path / "bin" / "dict.txt").read_text().split()[:6] == ["b", "2", "c", "2", "a", "1"]
    failed = run_cli(
        "fairseq-train",
        tmp_path / "missing",
        "--task",
        "language_modeling",
        "--arch",
        "transformer_lm",
        "--max-tokens",
        64,
        "--cpu",
        check=False,
    )
    assert failed.returncode == 1 and "Traceback" in failed.stderr and str(tmp_path / "missing") in failed.stderr
