"""``python -m define_fairseq`` prints the folder of the installed plugin, for fairseq's ``--user-dir``::

    fairseq-train DATA --user-dir "$(python -m define_fairseq)" --arch transformer_define ...

fairseq's programs import a ``--user-dir`` given as a path from any directory. The bare name ``--user-dir
define_fairseq`` is found only in the current directory (at the repository's root) or beside fairseq's own package
(the plugin installed, not editable, into the site-packages that holds fairseq).

This module also holds the plugin's console scripts (setup.py's ``entry_points``): each runs one tool's ``main``
and, where fairseq cannot be imported, stops with a message that says how to install it.
"""

import argparse
import importlib
import os
import sys

import define_fairseq

INSTALL_FAIRSEQ = (
    "install it with pip install 'define-fairseq[fairseq]' (fairseq 0.12.2 below Python 3.11, fairseq-fixed "
    "0.12.3.1 or newer from 3.11 on), or as the README's Install section does"
)
DESCRIPTION = """Print the folder of the define_fairseq plugin that this Python imports, and nothing else, so
that fairseq's programs load the plugin from any directory:

  fairseq-train DATA --user-dir "$(python -m define_fairseq)" --arch transformer_define ...
  fairseq-eval-lm DATA --user-dir "$(python -m define_fairseq)" --path checkpoints/checkpoint_best.pt

Run it with the Python of the environment whose fairseq programs you run."""
# the console scripts that setup.py installs, listed here so that a user finds them from the command line
COMMANDS = """the plugin's commands (each takes --help):
  define-fairseq-train                fairseq-train with a working --bf16 and resumable killed runs
  define-fairseq-average-checkpoints  average a run's last checkpoints
  define-fairseq-fold                 fold a checkpoint's DeFINE units into lookup tables
  define-fairseq-params               a model's parameter breakdown, from fairseq-train's arguments
  define-fairseq-last-checkpoint      put back a checkpoint_last.pt that a kill left truncated"""


def package_dir() -> str:
    """The folder that fairseq's ``--user-dir`` imports the plugin from (the one this Python imports)."""
    return os.path.dirname(os.path.abspath(define_fairseq.__file__))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m define_fairseq",
        description=DESCRIPTION,
        epilog=COMMANDS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"define-fairseq {define_fairseq.__version__}")
    parser.parse_args(argv)
    # The package imports fairseq when it can; without it the folder is still right, but fairseq's programs
    # cannot run here.
    if sys.modules.get("fairseq") is None:
        print(
            f"python -m define_fairseq: note: {sys.executable} cannot import fairseq; {INSTALL_FAIRSEQ}",
            file=sys.stderr,
        )
    print(package_dir())


def _run_tool(module: str) -> None:
    """Run ``define_fairseq.tools.<module>.main()``; name the fix when the tool needs fairseq and it is missing."""
    try:
        importlib.import_module(f"define_fairseq.tools.{module}").main()
    except ModuleNotFoundError as error:
        if error.name not in ("fairseq", "fairseq_cli"):
            raise
        prog = os.path.basename(sys.argv[0])
        raise SystemExit(f"{prog}: needs fairseq, which {sys.executable} cannot import; {INSTALL_FAIRSEQ}") from None


def train() -> None:
    _run_tool("train")


def average_checkpoints() -> None:
    _run_tool("average_checkpoints")


def fold() -> None:
    _run_tool("fold_define")


def params() -> None:
    _run_tool("params")


def last_checkpoint() -> None:
    _run_tool("last_checkpoint")


if __name__ == "__main__":
    main()
