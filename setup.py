import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
# The version is written once, in the package; it is read as text because importing the package imports fairseq.
VERSION = re.search(
    r'^__version__ = "([^"]+)"$', (HERE / "define_fairseq" / "__init__.py").read_text(encoding="utf-8"), re.M
).group(1)

setup(
    name="define-fairseq",
    version=VERSION,
    description="DeFINE, Mogrifier LSTM, gated convolutional LMs and Char2Subword as a fairseq --user-dir plugin",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.8",
    # The plugin alone: scripts/, benchmarks/ and tests/ are the repository's own (docs/development.md, "Layout").
    packages=find_packages(include=["define_fairseq", "define_fairseq.*"]),
    # the fairseq-hydra-train configs of the papers' settings (--config-dir <plugin>/config/RECIPE)
    package_data={"define_fairseq": ["config/*/*.yaml"]},
    # What the plugin itself imports, as ranges. torch 2.4 brought torch.serialization.add_safe_globals, which the
    # plugin calls when it is imported with fairseq; omegaconf 2.0.5 is the oldest that fairseq 0.12.2 accepts.
    # Tested: torch 2.11 to 2.15, numpy 1.26 and 2.4, omegaconf 2.3 (docs/development.md, "Tested stacks").
    install_requires=["torch>=2.4", "numpy>=1.21", "omegaconf>=2.0.5"],
    extras_require={
        # Two distributions provide the fairseq package and pip cannot require "either", so fairseq is an extra
        # that names one per Python: the official fairseq 0.12.2 installs only below Python 3.11, fairseq-fixed
        # (fairseq main with the Python 3.11 fixes) from 3.11 on. Left out of install_requires, it keeps a fairseq
        # that an environment already has (a clone installed editable, a build against its own torch).
        "fairseq": [
            'fairseq>=0.12.2; python_version < "3.11"',
            'fairseq-fixed>=0.12.3.1; python_version >= "3.11"',
        ],
        # make demo: the joint BPE and the BLEU score
        "demo": ["subword-nmt>=0.3.8", "sacrebleu>=2.0"],
        # recipes/ (Moses tokenisation, BPE or SentencePiece, sacreBLEU) and the examples' learning-curve plots
        "recipes": [
            "subword-nmt>=0.3.8",
            "sacrebleu>=2.0",
            "sacremoses>=0.0.53",
            "regex",
            "sentencepiece>=0.1.97",
            "matplotlib>=3.5",
        ],
    },
    entry_points={
        "console_scripts": [
            "define-fairseq-train = define_fairseq.__main__:train",
            "define-fairseq-average-checkpoints = define_fairseq.__main__:average_checkpoints",
            "define-fairseq-fold = define_fairseq.__main__:fold",
            "define-fairseq-params = define_fairseq.__main__:params",
            "define-fairseq-last-checkpoint = define_fairseq.__main__:last_checkpoint",
        ]
    },
)
