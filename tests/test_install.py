"""The plugin as a user installs it: ``pip install`` (not editable) of the package into a folder of its own, then
fairseq's stock programs and the plugin's commands from a directory outside the repository, each in a new
interpreter that cannot import the repository's copy.

The interpreters are those of a new virtual environment that reaches this environment's site-packages (torch,
fairseq) through a ``.pth`` file of paths. Python runs the ``.pth`` files of its own site-packages only, so the
editable install of the development environment (a ``.pth`` file and an import hook that map ``define_fairseq`` to
the repository) is invisible there. A pip install and fresh interpreters (about 30 s): in make test-slow.
"""

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import fairseq
import pytest
from arch_cases import TRANSFORMER_LM
from conftest import BIN, REPO, TRAIN_FLAGS
from lm_helpers import last_float

import define_fairseq

pytestmark = pytest.mark.slow

SCRIPTS = [
    "define-fairseq-train",
    "define-fairseq-average-checkpoints",
    "define-fairseq-fold",
    "define-fairseq-params",
    "define-fairseq-last-checkpoint",
]
# this environment's site-packages (torch, fairseq), which the new environment reaches
SITE_DIRS = [
    d
    for d in [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    if os.path.isdir(d)
]
# a Python that cannot import fairseq, running the rest of its command line as a script
WITHOUT_FAIRSEQ = (
    "import runpy, sys; sys.modules['fairseq'] = sys.modules['fairseq_cli'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


# the repository's packages that setup.py leaves out of the installation, copied into the build's source all the same
NOT_INSTALLED = ["scripts", "benchmarks"]


class Installed:
    """The plugin installed with ``pip install --target SITE`` from a copy of the repository's package files (the
    build writes into its source folder), a virtual environment ``ENV`` that reaches this one's site-packages, and
    a working directory outside the repository."""

    def __init__(self, root: Path):
        self.site, self.env, self.work = root / "site", root / "env", root / "work"
        source = root / "source"
        source.mkdir()
        self.work.mkdir()
        for name in ("setup.py", "README.md", "LICENSE"):
            shutil.copy2(REPO / name, source / name)
        for package in ("define_fairseq", *NOT_INSTALLED):
            shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "--quiet", "--no-index"]
        pip += ["--no-deps", "--no-build-isolation", "--use-pep517", "--target", str(self.site), str(source)]
        proc = subprocess.run(pip, capture_output=True, text=True)
        assert proc.returncode == 0, f"pip install --target failed:\n{proc.stdout}\n{proc.stderr}"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(self.env)], check=True)
        env_site = self.python("-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip()
        (Path(env_site) / "stack.pth").write_text("".join(f"{d}\n" for d in SITE_DIRS))

    def python(self, *argv, path=(), check=True):
        """``python argv`` of the new environment in the working directory, with ``path`` on PYTHONPATH."""
        variables = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
        command = [str(self.env / "bin" / "python"), *map(str, argv)]
        proc = subprocess.run(command, cwd=self.work, env=variables, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{argv[:2]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
            )
        return proc

    def with_plugin(self, *argv, check=True):
        """``python argv`` with the installed plugin on PYTHONPATH."""
        return self.python(*argv, path=[self.site], check=check)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The installation, and what ``python -m define_fairseq`` prints there."""
    installed = Installed(tmp_path_factory.mktemp("install"))
    installed.printed = installed.with_plugin("-m", "define_fairseq")
    if "cannot import fairseq" in installed.printed.stderr:
        pytest.skip(
            f"fairseq is importable here only through a .pth file (an editable install): {installed.printed.stderr}"
        )
    return installed


def test_python_m_prints_the_installed_folder_and_the_repository_is_out_of_reach(installed):
    assert installed.printed.stdout == f"{installed.site / 'define_fairseq'}\n"  # nothing else, for "$(...)"
    find = "import importlib.util as u; spec = u.find_spec('define_fairseq'); print(spec and spec.origin)"
    assert installed.with_plugin("-c", find).stdout == f"{installed.site / 'define_fairseq' / '__init__.py'}\n"
    other = installed.python("-c", find).stdout.strip()  # another copy installed in this environment may be found
    assert other == "None" or REPO not in Path(other).parents, f"the repository's copy is in reach: {other}"
    assert (installed.site / f"define_fairseq-{define_fairseq.__version__}.dist-info").is_dir()
    packages = sorted(p.name for p in installed.site.iterdir() if (p / "__init__.py").is_file())
    assert packages == ["define_fairseq"], f"installed beside the plugin, out of {NOT_INSTALLED}: {packages}"


def test_the_hydra_configs_install_with_the_package(installed):
    shipped = sorted(
        p.relative_to(REPO / "define_fairseq") for p in (REPO / "define_fairseq" / "config").rglob("*.yaml")
    )
    assert shipped and all((installed.site / "define_fairseq" / p).is_file() for p in shipped), shipped


def test_help_and_console_scripts(installed):
    help = installed.with_plugin("-m", "define_fairseq", "--help").stdout
    assert '--user-dir "$(python -m define_fairseq)"' in help
    assert all(script in help for script in SCRIPTS), help
    assert all((installed.site / "bin" / script).is_file() for script in SCRIPTS), os.listdir(installed.site / "bin")
    train = installed.with_plugin(installed.site / "bin" / "define-fairseq-train", "--help")
    assert "usage:" in train.stdout and "--max-update" in train.stdout, train.stdout[:2000]


def test_without_fairseq_the_commands_say_how_to_install_it(installed):
    script = installed.site / "bin" / "define-fairseq-train"
    proc = installed.with_plugin("-c", WITHOUT_FAIRSEQ, script, "--help", check=False)
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert "define-fairseq-train: needs fairseq" in proc.stderr and "'define-fairseq[fairseq]'" in proc.stderr
    proc = installed.with_plugin("-c", WITHOUT_FAIRSEQ, installed.site / "define_fairseq" / "__main__.py")
    assert proc.stdout == f"{installed.site / 'define_fairseq'}\n"  # the folder is still right
    assert "cannot import fairseq" in proc.stderr and "'define-fairseq[fairseq]'" in proc.stderr


def link_tree(src: Path, dst: Path) -> None:
    """A copy of ``src`` at ``dst``, hard links where the file system allows them."""

    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link, ignore=shutil.ignore_patterns("__pycache__"))


def test_fairseq_programs_load_the_installed_plugin_from_any_directory(installed, lm_data):
    train = installed.with_plugin(
        BIN / "fairseq-train",
        lm_data,
        "--user-dir",
        installed.printed.stdout.strip(),
        "--task",
        "language_modeling",
        "--arch",
        "transformer_lm_define",
        *TRANSFORMER_LM,
        "--criterion",
        "cross_entropy",
        *TRAIN_FLAGS,
        "--ddp-backend",
        "legacy_ddp",
        "--data-buffer-size",
        "0",
        "--max-update",
        "2",
        "--save-dir",
        "checkpoints",
    )
    assert "num_updates 2" in train.stdout + train.stderr, train.stdout[-2000:]
    # Installed beside fairseq's own package, the plugin is found by its bare name (fairseq looks beside itself).
    beside = installed.work.parent / "beside"
    link_tree(Path(fairseq.__file__).parent, beside / "fairseq")
    shutil.copytree(installed.site / "define_fairseq", beside / "define_fairseq")
    evaluated = installed.python(
        BIN / "fairseq-eval-lm",
        lm_data,
        "--user-dir",
        "define_fairseq",
        "--path",
        "checkpoints/checkpoint_last.pt",
        "--gen-subset",
        "test",
        "--cpu",
        "--num-workers",
        "0",
        "--max-tokens",
        "256",
        "--tokens-per-sample",
        "16",
        path=[beside],
    )
    assert 1.0 < last_float(r"Perplexity: ([\d.]+)", evaluated.stdout + evaluated.stderr) < 1000
