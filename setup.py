from setuptools import find_packages, setup

setup(
    name="define-fairseq",
    version="0.1.0",
    description="DeFINE, Mogrifier LSTM, gated convolutional LMs and Char2Subword as a fairseq --user-dir plugin",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.8",
    packages=find_packages(include=["define_fairseq", "define_fairseq.*"]),
    # fairseq itself is not listed: users bring fairseq 0.12.2 or main (on Python 3.11, the
    # fairseq-fixed package); `make install` sets up a tested environment.
    install_requires=["torch>=1.13", "numpy"],
    extras_require={"demo": ["subword-nmt", "sacrebleu"]},
)
