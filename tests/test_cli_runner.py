"""The tests' way of running fairseq's programs (tests/helpers/cli_runner.py), and the programs of the scripts they
run (tests/helpers/script_programs.py), behave as the console scripts do."""

import multiprocessing
import os
import signal
import subprocess
import time

from conftest import USER_DIR, run_cli
from script_programs import script_path, server_pid


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


# a served module of the repository's kind (python -m scripts.NAME), found through the working directory
PROBE = """import os, sys, time
print(os.getcwd(), os.environ["PROBE"], sys.stdin.read().strip(), flush=True)
print("to stderr", file=sys.stderr)
if sys.argv[1:] == ["pool"]:  # processes of its own, as a fresh program starts them (a daemon may not)
    import multiprocessing
    print("start method", multiprocessing.get_start_method(), flush=True)
    with multiprocessing.Pool(1) as pool:
        sys.exit(pool.apply(abs, (-4,)))
if sys.argv[1:] == ["wait"]:
    open("pid", "w").write(str(os.getpid()))
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


def write_probe(folder):
    """``folder/scripts``: a regular package (a namespace one would lose to the repository's scripts/ on the path)."""
    (folder / "scripts").mkdir()
    (folder / "scripts" / "__init__.py").write_text("")
    (folder / "scripts" / "probe.py").write_text(PROBE)


def script(command, cwd, **popen):
    env = dict(os.environ, PATH=script_path(), PROBE="probed")
    return subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, text=True, **popen)


def served_children():
    """The processes the server has forked that are still running."""
    path = f"/proc/{server_pid()}/task/{server_pid()}/children"
    return open(path).read().split()


def test_a_scripts_program_gets_its_directory_environment_streams_and_arguments_and_returns_its_status(tmp_path):
    write_probe(tmp_path)
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc = script("echo input | python -m scripts.probe 3; echo status $?", tmp_path, **pipes)
    out, err = proc.communicate(timeout=60)
    assert out.splitlines() == [f"{tmp_path} probed input", "status 3"] and err == "to stderr\n", err
    proc = script("python -m scripts.probe pool < /dev/null", tmp_path, **pipes)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 4 and out.startswith(f"{tmp_path} probed \n"), err
    # the platform's default (the first listed: fork on Linux up to Python 3.13), not the fork server's it inherited,
    # whose pools would start a fork server of their own and import everything again
    assert f"start method {multiprocessing.get_all_start_methods()[0]}\n" in out
    # fairseq's programs, served: the arguments, the directory, and fairseq's own failure (argparse: status 2)
    (tmp_path / "train.txt").write_text("a b c\nb c\n")
    command = "fairseq-preprocess --only-source --trainpref train.txt --destdir bin && fairseq-train bin "
    proc = script(command + "--arch lstm_lm --no-such-flag", tmp_path, **pipes)
    out, err = proc.communicate(timeout=60)
    assert (tmp_path / "bin" / "dict.txt").read_text().split()[:2] == ["b", "2"]
    assert proc.returncode == 2 and "unrecognized arguments: --no-such-flag" in err
    # any other python command line runs as this environment's Python does
    proc = script("python -c 'import sys; print(sys.prefix != sys.base_prefix)'", tmp_path, stdout=subprocess.PIPE)
    assert proc.communicate(timeout=60)[0] == "True\n"


def test_a_signal_to_a_scripts_program_reaches_it_and_killing_the_script_ends_it(tmp_path):
    write_probe(tmp_path)

    def started():
        proc = script("python -m scripts.probe wait", tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                      start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = (tmp_path / "pid").read_text()
        (tmp_path / "pid").unlink()
        assert pid in served_children()
        return proc, pid

    def ends(pid):
        deadline = time.monotonic() + 10
        while pid in served_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        return pid not in served_children()

    proc, pid = started()
    os.killpg(proc.pid, signal.SIGTERM)  # the script and its program (the small one) get it: the served one too
    assert proc.wait(timeout=30) == -signal.SIGTERM and ends(pid)
    proc, pid = started()
    os.killpg(proc.pid, signal.SIGKILL)  # cannot be forwarded: the served program sees its caller gone
    assert proc.wait(timeout=30) == -signal.SIGKILL and ends(pid)
