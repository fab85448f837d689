"""Shared fixtures: a tiny parallel corpus binarized with the real fairseq-preprocess."""

import os
import random
import shlex
import string
import subprocess
import sys
from pathlib import Path

import cli_runner
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "define_fairseq")
BIN = Path(sys.executable).parent
# the shared test modules, importable by their bare names (pytest.ini's pythonpath)
HELPERS = Path(__file__).resolve().parent / "helpers"
# the recipe tests' fixtures (a served mirror of each corpus, and the data its prepare.sh makes of it), and the
# Triton kernels interpreted for the tests that run them on the CPU
pytest_plugins = ["lm_recipe", "wmt14_recipe", "triton_interpreter"]


@pytest.fixture(autouse=True, scope="session")
def one_thread_per_process():
    """The test models are tiny: one OpenMP thread per process (here and in the programs the tests start) is
    faster than two, and keeps a 2-core machine responsive while fairseq-train runs beside pytest."""
    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(threads)
    if env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = env


# fairseq's training iterator collates batches in a daemon thread (BufferedIterator). A run that stops after a
# couple of updates exits while that thread may still be collating, and PyTorch's shutdown can then abort the
# finished process: SIGABRT with the line below as the last output (seen with gcnn runs of 2 updates under the full
# load of the parallel test run; test_train_exit.py makes it happen every time). python -m
# define_fairseq.tools.train, which the recipes run, exits cleanly instead; the tests run the stock fairseq-train,
# so its runs collate in the main thread (--data-buffer-size 0), and a program started as a subprocess that still
# aborts that way is run once more; a second abort fails. (cli_runner's children end with os._exit, which skips
# that shutdown.)
SHUTDOWN_ABORT = "terminate called without an active exception"


def _shutdown_abort(proc) -> bool:
    return proc.returncode == -6 and proc.stderr.rstrip().endswith(SHUTDOWN_ABORT)


def _fairseq_eos_blocks_break() -> bool:
    """Whether fairseq fails to cut language-model data into sentences (``--sample-break-mode eos``).

    fairseq's ``TokenBlockDataset._build_slice_indices`` (fairseq/data/token_block_dataset.py) asks for
    ``np.compat.long`` in that mode, and numpy 2 has no ``numpy.compat``: fairseq-generate on a language model and
    every run with that break mode stop with an AttributeError there (docs/development.md, "Tested stacks")."""
    from fairseq.data import TokenBlockDataset

    try:
        TokenBlockDataset([torch.tensor([4, 2])], [2], block_size=None, pad=1, eos=2, break_mode="eos")
    except AttributeError as error:
        if "compat" in str(error):
            return True
        raise
    return False


# The tests that need fairseq's eos break mode are expected to fail where fairseq has that fault (numpy 2), and to
# pass where it does not (strict: an unexpected pass fails the run, so the mark cannot outlive the fault).
needs_fairseq_eos_blocks = pytest.mark.xfail(
    _fairseq_eos_blocks_break(),
    strict=True,
    reason="fairseq's TokenBlockDataset(break_mode='eos') uses np.compat.long, which numpy 2 removed",
)


def run_cli(program, *args, cwd=None, check=True):
    """Run a fairseq console script of this environment; fail with its output when it fails."""
    args = [str(a) for a in args]
    if program == "fairseq-train" and "--data-buffer-size" not in args:
        args += ["--data-buffer-size", "0"]
    if program in cli_runner.PROGRAMS:  # a new process, forked with fairseq imported
        proc = cli_runner.run(program, args, cwd=cwd)
    else:
        command = [str(BIN / program), *args]
        proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
        if _shutdown_abort(proc):
            proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{program} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def training_arguments(command_line: str):
    """The fairseq-train arguments of a recipe's training command (what ``train.sh -n`` prints): the recipes train
    with ``python -m define_fairseq.tools.train``."""
    argv = shlex.split(command_line.strip())
    assert argv[1:3] == ["-m", "define_fairseq.tools.train"], argv[:3]
    return argv[3:]


def run_module(module, *args, check=True):
    """``python -m module args`` with this environment's Python (the plugin's own command-line tools)."""
    proc = cli_runner.run_module(module, [str(a) for a in args])
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def write_tiny_corpus(directory: Path, seed: int = 0):
    """A toy En->De task (German side = reversed English words) with a 40-word vocabulary."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(40)]
    for split, size in (("train", 300), ("valid", 30), ("test", 20)):
        src = [[rng.choice(words) for _ in range(rng.randint(3, 9))] for _ in range(size)]
        (directory / f"{split}.en").write_text("".join(" ".join(s) + "\n" for s in src))
        (directory / f"{split}.de").write_text("".join(" ".join(reversed(s)) + "\n" for s in src))


def make_words(count, seed=0):
    """Word-like strings: mostly lowercase letters, some capitalised, some with digits or punctuation."""
    rng = random.Random(seed)
    words = []
    for _ in range(count):
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 11)))
        roll = rng.random()
        if roll < 0.15:
            word = word.capitalize()
        elif roll < 0.25:
            word += rng.choice(string.digits + ".,;!?-'")
        elif roll < 0.3:
            word = rng.choice("äéßñ") + word
        words.append(word)
    return words


@pytest.fixture(scope="session")
def translation_data(tmp_path_factory) -> Path:
    raw = tmp_path_factory.mktemp("raw")
    write_tiny_corpus(raw)
    flags = ("--source-lang", "en", "--target-lang", "de", "--joined-dictionary")
    return binarize(raw, "", tmp_path_factory.mktemp("data-bin"), *flags)


# What every fairseq-train run of the tests shares: the CPU, batches loaded in the main process, plain logs, seed 1.
RUN_FLAGS = ["--cpu", "--num-workers", "0", "--no-progress-bar", "--log-format", "simple", "--seed", "1"]
ADAM = ["--optimizer", "adam", "--lr", "0.005"]
# the translation runs: Adam, batches of 400 tokens, no dropout
TRAIN_FLAGS = [*ADAM, "--max-tokens", "400", *RUN_FLAGS, "--dropout", "0.0"]


def plugin_args(data, arch, *flags, task=None):
    """fairseq's arguments for the plugin's ``arch`` on ``data`` (``arch`` None: ``flags`` name it), with ``--task
    task`` where given, then ``flags``."""
    named = (["--task", task] if task else []) + (["--arch", arch] if arch else [])
    return [str(arg) for arg in (data, "--user-dir", USER_DIR, *named, *flags)]


def setup_model(data, arch, *flags, task="language_modeling"):
    """``(cfg, task, model)`` of ``arch`` on ``data`` as fairseq-train builds them on the CPU, without training;
    ``flags`` come last."""
    from define_fairseq.tools.params import setup_from_train_args

    return setup_from_train_args(
        plugin_args(data, arch, "--optimizer", "adam", "--lr", "0.001", "--cpu", *flags, task=task)
    )


def fairseq_train(data, save_dir, arch, *flags, task=None, check=True):
    """fairseq-train of the plugin's ``arch`` on ``data`` into ``save_dir`` with ``RUN_FLAGS``, then ``flags``."""
    return run_cli(
        "fairseq-train", *plugin_args(data, arch, *RUN_FLAGS, *flags, task=task), "--save-dir", save_dir, check=check
    )


def binarize(raw: Path, suffix: str, dest: Path, *flags, splits=("train", "valid", "test")):
    """fairseq-preprocess of the ``splits`` of ``raw`` (the files ``{split}{suffix}``) into ``dest``."""
    prefixes = [arg for split in splits for arg in (f"--{split}pref", f"{raw / split}{suffix}")]
    run_cli("fairseq-preprocess", *flags, *prefixes, "--destdir", dest, "--workers", "1")
    return dest


def write_tiny_lm_corpus(directory: Path, seed: int = 0, vocab: int = 60):
    """A toy monolingual corpus: sentences of Zipf-distributed words ``w0 .. w{vocab-1}`` with a little structure
    (every ``w0`` is followed by ``w1``), so a language model has something to learn."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    weights = [1.0 / (i + 1) for i in range(vocab)]
    for split, size in (("train", 400), ("valid", 40), ("test", 40)):
        lines = []
        for _ in range(size):
            sentence = []
            while len(sentence) < rng.randint(4, 12):
                word = rng.choices(words, weights)[0]
                sentence += [word, "w1"] if word == "w0" else [word]
            lines.append(" ".join(sentence))
        (directory / f"{split}.txt").write_text("".join(line + "\n" for line in lines))


@pytest.fixture(scope="session")
def lm_data(tmp_path_factory) -> Path:
    """A binarized toy LM corpus (``fairseq-preprocess --only-source``): train/valid/test, ~64 symbols."""
    raw = tmp_path_factory.mktemp("lm-raw")
    write_tiny_lm_corpus(raw)
    return binarize(raw, ".txt", tmp_path_factory.mktemp("lm-data-bin"), "--only-source")
