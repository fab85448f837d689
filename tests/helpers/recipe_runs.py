"""Running the recipes' shell scripts (recipes/) from the tests, and what a run must leave behind.

A script runs with this environment's fairseq programs first on PATH (forked with fairseq imported:
``script_programs``) and one thread a process; the variables the recipes read come from the test only, never from
the caller's environment."""

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO
from script_programs import script_path

RECIPES = REPO / "recipes"


# What the recipes read from the environment: a caller's value would change what a test runs.
RECIPE_VARIABLES = (
    "DATA_DIR",
    "SAVE_ROOT",
    "FORCE",
    "TEMPERATURES",
    "PREPROCESS_WORKERS",
    "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
)


def run_recipe(script, *args, env=None, popen=False):
    """Run ``bash recipes/<script> args...`` with fairseq-preprocess on one worker. The caller's recipe variables
    (``RECIPE_VARIABLES``, ``WMT14_*``, ``*_URL``, ``*_MD5``) are left out; ``env`` adds the test's. With ``popen``:
    a ``Popen`` in its own process group, its output on ``stdout``, so that a test can kill the script and every
    program it started."""

    def recipe_variable(name):
        return name in RECIPE_VARIABLES or name.startswith("WMT14_") or name.endswith(("_URL", "_MD5"))

    full_env = {name: value for name, value in os.environ.items() if not recipe_variable(name)}
    full_env.update(PATH=script_path(), OMP_NUM_THREADS="1", PREPROCESS_WORKERS="1")
    full_env.update(env or {})
    command = ["bash", str(RECIPES / script), *map(str, args)]
    if popen:
        return subprocess.Popen(
            command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    return subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=600)


def ok(proc):
    """``proc``, after asserting that it succeeded (its output's end in the message when not)."""
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def parse_commands(program, commands, timeout=300):
    """What the Python ``program`` prints last (JSON) when given ``commands`` (JSON) on its standard input: the
    recipes' fairseq commands parsed by fairseq's own parser, in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-c", program],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def md5(path):
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


def leftovers(directory):
    """Temporary names a run must not leave behind."""
    return [p for p in Path(directory).rglob("*") if re.search(r"\.(tmp|part|err)$", p.name)]
