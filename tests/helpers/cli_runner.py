"""fairseq's console programs, each run in a new process that starts with fairseq already imported.

A short fairseq run spends most of its time importing torch and fairseq (every task and criterion, scikit-learn
among them), and the tests run many short runs. So each test worker keeps one process that has imported them
(multiprocessing's fork server, started on the first run) and forks a child of it per program: the child is a new
process with the program's command line, working directory and environment, runs the console script's
``cli_main`` and exits with its status, as the script would. The plugin itself is not imported beforehand, so
``--user-dir`` does what it does on the command line.
"""

import importlib
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from typing import Dict, List, Optional

# the console scripts of fairseq's entry points that the tests run (a forked child's stdin is /dev/null:
# fairseq-interactive reads the file of its --input)
PROGRAMS = {
    "fairseq-train": "fairseq_cli.train",
    "fairseq-generate": "fairseq_cli.generate",
    "fairseq-eval-lm": "fairseq_cli.eval_lm",
    "fairseq-preprocess": "fairseq_cli.preprocess",
    "fairseq-interactive": "fairseq_cli.interactive",
    "fairseq-hydra-train": "fairseq_cli.hydra_train",
    "fairseq-score": "fairseq_cli.score",
}
# torch._dynamo: imported by the first optimizer a program builds, another second of every training run
PRELOAD = [*PROGRAMS.values(), "torch._dynamo"]
_CONTEXT = None


def context():
    """The forkserver context whose server has imported ``PRELOAD`` (started on first use)."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def _main(module: str, argv: List[str], cwd: str, env: Dict[str, str], stdout: str, stderr: str) -> None:
    """The child: the program's streams, directory and environment, then the program (:func:`execute`)."""
    for fd, path in ((1, stdout), (2, stderr)):
        file = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(file, fd)
        os.close(file)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.exit(execute(module, argv))


def execute(module: str, argv: List[str]):
    """Run the program (a console script's ``cli_main``, or ``python -m module`` where argv[0] is ``-m``) as this
    process's ``sys.argv`` and return its exit status as ``sys.exit`` takes it (``SystemExit`` is caught)."""
    sys.argv = argv
    # a descendant of the fork server inherits its start method; a program started fresh has the platform's default
    # (fork on Linux), so that a pool it starts (fairseq-preprocess --workers, a DataLoader's workers) forks this
    # process, imports done, rather than starting a fork server of its own that imports them again for each worker
    multiprocessing.set_start_method(None, force=True)
    try:
        if argv[0] == "-m":
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            return 0
        return importlib.import_module(module).cli_main()
    except SystemExit as exit:
        return exit.code
    except BaseException:  # as the interpreter reports an uncaught exception: its traceback and status 1
        traceback.print_exc()
        return 1


def _run(module: str, argv: List[str], cwd: Optional[str]) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as tmp:
        stdout, stderr = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        for path in (stdout, stderr):
            open(path, "w").close()
        child = context().Process(
            target=_main, args=(module, argv, cwd or os.getcwd(), dict(os.environ), stdout, stderr)
        )
        child.start()
        child.join()
        with open(stdout, encoding="utf-8", errors="replace") as out:
            output = out.read()
        with open(stderr, encoding="utf-8", errors="replace") as err:
            errors = err.read()
    return subprocess.CompletedProcess(argv, child.exitcode, output, errors)


def run(program: str, args: List[str], cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run ``program args`` (a key of PROGRAMS) and return what ``subprocess.run(..., capture_output=True,
    text=True)`` would: its status (minus the signal's number when a signal ended it), stdout and stderr."""
    return _run(PROGRAMS[program], [program, *args], cwd)


def run_module(module: str, args: List[str]) -> subprocess.CompletedProcess:
    """``python -m module args``, as ``run`` runs a program."""
    return _run(module, ["-m", *args], None)
