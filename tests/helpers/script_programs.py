"""The programs that a script run by a test starts (the examples' and recipes' shell scripts), each forked from one
process of this test worker that has imported torch and fairseq, as ``cli_runner`` forks the tests' own.

A script's programs are its children, not the test's, so they reach the fork through their names on PATH:
:func:`script_path` puts first a folder of small programs named ``fairseq-train``, ``fairseq-eval-lm``, ... and
``python``. Each sends its command line, working directory, environment and standard streams (the file descriptors
themselves) to a server (one per test worker, forked from ``cli_runner``'s on first use) over a Unix socket;
the server forks a child that takes them over and runs the program, and sends back the child's process id, then
its exit status. The small program forwards the signals that end a process (SIGTERM, SIGINT, SIGHUP) to the child
and ends as the child ended (the same status, or killed by the same signal); the child kills itself when the small
program is gone (killed with its script's process group). ``python`` serves ``python -m`` of the plugin's and the
repository's modules (``SERVED``) and runs any other command line as this environment's Python does.

What differs from a program started fresh: the imports happened before the child's environment was set (torch's
thread count is set again from ``OMP_NUM_THREADS``), ``sys.path`` keeps the test worker's entries after the
program's own, its output is line-buffered, and its ``atexit`` functions do not run (as in ``cli_runner``'s
children: a worker pool a program leaves, such as inductor's, is not shut down).
"""

import atexit
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import cli_runner

SERVED = ("define_fairseq.", "scripts.")  # python -m of these is forked; other python command lines run as usual
SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")
# The small programs: stdlib only, started with -I -S (no site, no user paths) in about 20 ms.
CLIENT = r"""#!{python} -IS
import json, os, signal, socket, sys
PYTHON, SOCKET, SERVED, PROGRAM = {python!r}, {socket!r}, {served!r}, {program!r}
args = sys.argv[1:]
if PROGRAM is None:  # python: only -m of a served module goes to the server
    if len(args) < 2 or args[0] != "-m" or not args[1].startswith(SERVED):
        os.execv(PYTHON, [PYTHON, *args])
    module, argv = args[1], ["-m", *args[2:]]
else:
    module, argv = PROGRAM, [os.path.basename(sys.argv[0]), *args]
conn = socket.socket(socket.AF_UNIX)
conn.connect(SOCKET)
request = json.dumps([module, argv, os.getcwd(), dict(os.environ)]).encode()
socket.send_fds(conn, [len(request).to_bytes(8, "big")], [0, 1, 2])
conn.sendall(request)
replies = conn.makefile("rb")
child = replies.readline()
if not child:
    sys.exit(f"{{sys.argv[0]}}: the test's program server refused the request (its output says why)")
child = int(child)
for name in {signals!r}:
    signal.signal(getattr(signal, name), lambda number, frame: os.kill(child, number))
status = replies.readline()
if not status:
    sys.exit(f"{{sys.argv[0]}}: the test's program server ended before the program did")
status = int(status)
if status < 0:  # ended by a signal: end by the same one
    signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
sys.exit(status)
"""

_SERVER = None  # (process, folder of the small programs) of this test worker


def script_path() -> str:
    """The PATH for a script run by a test: the small programs first, then this environment's ``bin`` (its other
    programs), then the caller's PATH. Starts this worker's server on first use."""
    global _SERVER
    if _SERVER is None:
        folder = Path(tempfile.mkdtemp(prefix="programs-"))
        path = folder / "socket"
        # a child of cli_runner's fork server, which has the imports already; not daemonic, so that its programs
        # may start processes of their own (multiprocessing refuses a daemon's), and killed when this process ends
        server = cli_runner.context().Process(target=serve, args=(str(path),))
        server.start()
        atexit.register(shutil.rmtree, folder, True)
        atexit.register(server.kill)  # before multiprocessing's own exit handler, which would wait for it
        deadline = time.monotonic() + 300
        while not path.exists():  # the server renames its socket into place once it listens
            if server.exitcode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the program server did not start (exit status {server.exitcode})")
            time.sleep(0.05)
        python = str(Path(sys.executable).parent / "python")  # the venv's own name: its site-packages
        # fairseq-hydra-train starts fresh, as the tests' own runs of it do (tests/conftest.py)
        programs = {name: module for name, module in cli_runner.PROGRAMS.items() if "hydra" not in name}
        programs["python"] = None
        for name, module in programs.items():
            text = CLIENT.format(python=python, socket=str(path), served=SERVED, program=module, signals=SIGNALS)
            (folder / name).write_text(text)
            (folder / name).chmod(0o755)
        _SERVER = server, folder
    return os.pathsep.join([str(_SERVER[1]), str(Path(sys.executable).parent), os.environ["PATH"]])


def program(name: str) -> str:
    """The small program ``name`` (a key of ``cli_runner.PROGRAMS``, or ``python``): for a test that starts a
    program itself, as a script would (several at once, killed at will)."""
    script_path()
    return str(_SERVER[1] / name)


def server_pid() -> int:
    """The process id of this worker's server (started by :func:`script_path`)."""
    return _SERVER[0].pid


# ---- the server


def _read(conn, size):
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the request ended early")
        data += chunk
    return data


def _report(conn, pid):
    """Send the child's exit status (minus the signal's number when a signal ended it) once it has ended."""
    _, status = os.waitpid(pid, 0)
    try:
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    except OSError:  # the small program is gone
        pass
    conn.close()


def _die_with(conn):
    """In the child: wait for the small program to close its end (it was killed), then end the same way."""
    while conn.recv(1):
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _child(conn, fds, module, argv, cwd, env):
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # multiprocessing gave the server a stdin of its own (/dev/null)
    conn.sendall(f"{os.getpid()}\n".encode())
    threading.Thread(target=_die_with, args=(conn,), daemon=True).start()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if argv[0] == "-m":  # as python -m: the working directory, then PYTHONPATH, before the rest
        extra = [cwd, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        sys.path[:0] = [p for p in extra if p not in sys.path]
    if env.get("OMP_NUM_THREADS", "").isdigit():
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    status = cli_runner.execute(module, argv)
    if status is not None and not isinstance(status, int):  # sys.exit("message"), as the interpreter does it
        print(status, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status or 0)


def serve(path: str):
    """The server: accept each small program's request on the Unix socket ``path`` and fork its program."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path + ".part")
    listener.listen(64)
    os.rename(path + ".part", path)  # in place only once it listens
    while True:
        conn, _ = listener.accept()
        try:
            head, fds, _, _ = socket.recv_fds(conn, 8, 3)
            module, argv, cwd, env = json.loads(_read(conn, int.from_bytes(head, "big")))
        except (OSError, EOFError, ValueError):
            traceback.print_exc()
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            try:
                _child(conn, fds, module, argv, cwd, env)
            except BaseException:
                traceback.print_exc()
            os._exit(1)
        for fd in fds:
            os.close(fd)
        threading.Thread(target=_report, args=(conn, pid), daemon=True).start()
