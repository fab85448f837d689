# The two commands: `make demo` (train and evaluate transformer_define on the demo corpus) and `make test`.
# Other stacks (docs/development.md, "Tested stacks"): `make test-stack STACK=NAME`, `make test-matrix`. A GPU node
# without a registry: `make wheelhouse PY=3.12` where there is one, then `make install-offline` on the node.
# bash: recipes use pipefail, which a POSIX sh (dash, on Debian and Ubuntu) lacks
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
VENV_PY := $(VENV)/bin/python
PIP := $(VENV_PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.installed
TORCH ?= torch==2.13.0
NUMPY ?= numpy<2
CYTHON := cython==3.3.1
# fairseq is built without isolation, by the environment's setuptools: from 70.1 on it makes wheels itself (an older
# one needs the wheel package), and torch 2.11 keeps the 65.5 of a new Python 3.11 venv.
SETUPTOOLS := setuptools>=70.1
FAIRSEQ := fairseq-fixed==0.12.3.1
# The tested stack's exact versions: fairseq's dependencies and the recipes' tools, then the test and lint tools
# (setup.py holds the plugin's own requirements, as ranges).
REQUIREMENTS := requirements.txt requirements-dev.txt
# Test processes in parallel (pytest-xdist); worksteal balances the tail better than loadfile (one file per process)
# for the same CPU time (fresh clone, 2 idle cores: 7:59 against 8:16).
TEST_WORKERS ?= 2
TEST_DIST ?= worksteal
TESTS ?= tests
# `make test` leaves out the tests marked slow (the example scripts and the recipes' train -> eval chains end to end;
# the times measured on a 2-core AMD EPYC: docs/development.md); `make test-all` runs them too.
MARKS ?= not slow

.PHONY: install lint format test test-all test-slow test-stack test-matrix wheelhouse install-offline install-env gpu-check gpu-round \
  demo bench results clean

install: $(STAMP)

# Installing again does nothing: the stamp is newer than what it was made from. fairseq is compiled against the
# torch and numpy installed just before it (its Cython and C++ extensions); --no-cache-dir because pip would
# otherwise reuse a wheel it built for another stack's torch or numpy.
$(STAMP): setup.py $(REQUIREMENTS) Makefile
	@test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(TORCH) "$(NUMPY)" $(CYTHON) "$(SETUPTOOLS)"
	@$(PIP) show fairseq-fixed >/dev/null 2>&1 || { \
	  echo "==> compiling $(FAIRSEQ) (about 3 minutes on 2 cores)"; \
	  $(PIP) install --no-cache-dir --no-build-isolation --no-deps $(FAIRSEQ); }
	$(PIP) install $(REQUIREMENTS:%=-r %)
	$(PIP) install --no-build-isolation --no-deps --use-pep517 -e .
	@touch $(STAMP)

test: install
	$(VENV_PY) -m pytest -q -n $(TEST_WORKERS) --dist $(TEST_DIST) $(if $(MARKS),-m "$(MARKS)") $(TESTS)

test-all:
	$(MAKE) test MARKS=

# The end-to-end tests alone (the example scripts, the recipes' chains, multi-rank runs): CI runs them once.
test-slow:
	$(MAKE) test MARKS=slow

# ruff (ruff.toml): pyflakes, pycodestyle and isort's order, and black's layout; `make format` rewrites the files.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix --select I .
	$(VENV)/bin/ruff format .

# ---- Other stacks: each in its own .venv-NAME, made and tested like .venv (`make test` is torch 2.13 CPU with
# numpy 1.26). torch==2.13.0 resolves to the local CPU wheel where pip's find-links has it (2.13.0+cpu sorts
# above 2.13.0); the registry's other Linux torch wheels are CUDA builds (about 4 GB with their nvidia-*
# packages) that run on a CPU too. numpy 2.4 is the newest numpy 2 for Python 3.11.
STACKS := torch2.13-numpy2 torch2.11-numpy2 torch2.15-numpy2
STACK_torch2.13-numpy2 := torch==2.13.0 numpy==2.4.6
STACK_torch2.11-numpy2 := torch==2.11.0 numpy==2.4.6
STACK_torch2.15-numpy2 := torch==2.15.0 numpy==2.4.6
# The files whose outcome can depend on the stack's versions, each with its reason (tests/stack_tests.txt), without the
# slow tests, which `make test-slow` runs once on the default stack. STACK_TESTS=tests STACK_MARKS= for everything.
STACK_TESTS ?= $(shell sed -e 's/\#.*//' tests/stack_tests.txt)
STACK_MARKS ?= not slow

test-stack:
	@test -n "$(STACK_$(STACK))" || { echo "make test-stack: STACK=NAME, one of: $(STACKS)" >&2; exit 2; }
	$(MAKE) test VENV=.venv-$(STACK) TORCH=$(word 1,$(STACK_$(STACK))) NUMPY=$(word 2,$(STACK_$(STACK))) \
	  TESTS="$(STACK_TESTS)" MARKS="$(STACK_MARKS)"

# The default stack and every other one; a failing stack does not stop the others, and the summary names it.
test-matrix:
	@failed=; for s in default $(STACKS); do \
	  if [ $$s = default ]; then $(MAKE) test || failed="$$failed $$s"; \
	  else $(MAKE) test-stack STACK=$$s || failed="$$failed $$s"; fi; done; \
	  if [ -n "$$failed" ]; then echo "test-matrix: failed:$$failed" >&2; exit 1; fi; \
	  echo "test-matrix: default $(STACKS) passed"

# ---- Offline install (docs/development.md, "Offline install on a GPU node").
# `make wheelhouse PY=3.12` downloads into $(WHEELHOUSE) the Linux x86-64 wheels that the plugin, fairseq and
# the tests need on that Python, and the fairseq-fixed sdist (compiled on the node, against its torch and numpy),
# less what the target already has: torch always; for PY=3.12 also what the GPU image has (the node: Python
# 3.12.3, torch 2.11.0+cu130, numpy 2.5.2).
WHEELHOUSE ?= wheelhouse
PY ?= 3.11
# The GPU image's packages among those the wheelhouse would otherwise hold (from the image's package list);
# setuptools stays in: fairseq's build needs 70.1 or newer, and the image's version is not known.
GPU_IMAGE_HAS := click cloudpickle colorama contourpy cycler cython execnet fonttools iniconfig joblib kiwisolver lxml \
  matplotlib narwhals numpy packaging pillow pluggy portalocker pygments pyparsing pytest pytest-xdist \
  python-dateutil pyyaml regex sacrebleu scikit-learn scipy sentencepiece six tabulate threadpoolctl tqdm \
  typing-extensions wheel
# triton (requirements-dev.txt: its CPU interpreter runs the Triton kernels' tests) is left out too: a CUDA torch
# brings its own, and without it those tests skip.
WHEELHOUSE_SKIP ?= torch triton $(if $(filter 3.12,$(PY)),$(GPU_IMAGE_HAS))
# Requirements the GPU node does not run, left out of its wheelhouse (PY=3.12) with whatever only they need: ruff
# (`make lint`, 10 MB) and transformers with the dependencies requirements-dev.txt pins for it (a test dependency of
# the CPU suite; the GPU image has its own).
NODE_UNUSED := ruff transformers tokenizers huggingface-hub hf-xet safetensors pyyaml requests certifi \
  charset-normalizer idna urllib3
NODE_UNUSED_RE := $(subst $(eval) ,|,$(strip $(NODE_UNUSED)))
WHEELHOUSE_REQUIREMENTS = $(if $(filter 3.12,$(PY)),$(WHEELHOUSE)/.build/requirements.txt,$(REQUIREMENTS))
# What install-offline installs by name (a version already there is kept): build tools, then $(REQUIREMENTS).
OFFLINE_BASE := "$(SETUPTOOLS)" numpy cython
PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
  manylinux_2_5_x86_64 manylinux1_x86_64,--platform $(p))
FOR_TARGET = --python-version $(PY) --implementation cp $(PLATFORMS) --only-binary :all:
# The GPU node's wheelhouse stays under 25 MB (14 MB); one for an environment that has only torch also carries
# numpy, scipy and scikit-learn (fairseq imports them on start-up) and matplotlib (the compare scripts' plots): 122 MB.
WHEELHOUSE_MAX_MB ?= $(if $(filter 3.12,$(PY)),25,140)

# Runs pip from .venv (fairseq's sdist metadata imports torch); antlr4-python3-runtime (hydra-core's) has no
# wheel on the registry: it is pure Python, and its wheel is built here.
wheelhouse: install
	rm -rf $(WHEELHOUSE) && mkdir -p $(WHEELHOUSE)/.build
	$(PIP) wheel --no-deps -w $(WHEELHOUSE) antlr4-python3-runtime==4.9.3
	$(if $(filter 3.12,$(PY)),grep -hviE '^($(NODE_UNUSED_RE))([^a-z0-9._-]|$$)' $(REQUIREMENTS) \
	  >$(WHEELHOUSE)/.build/requirements.txt)
	$(PIP) install $(FOR_TARGET) --dry-run --target $(WHEELHOUSE)/.build/target --ignore-installed --quiet \
	  --find-links $(WHEELHOUSE) \
	  --report $(WHEELHOUSE)/.build/report.json "$(SETUPTOOLS)" "$(NUMPY)" $(CYTHON) $(WHEELHOUSE_REQUIREMENTS:%=-r %)
	$(VENV_PY) -c 'import json, re, sys; skip = {re.sub("[-_.]+", "-", n).lower() for n in sys.argv[2:]}; \
	  wanted = [(i["metadata"]["name"], i["metadata"]["version"]) for i in json.load(open(sys.argv[1]))["install"]]; \
	  print("\n".join(f"{n}=={v}" for n, v in wanted if re.sub("[-_.]+", "-", n).lower() not in skip))' \
	  $(WHEELHOUSE)/.build/report.json antlr4-python3-runtime $(WHEELHOUSE_SKIP) >$(WHEELHOUSE)/.build/wanted.txt
	$(PIP) download $(FOR_TARGET) --no-deps -d $(WHEELHOUSE) -r $(WHEELHOUSE)/.build/wanted.txt
	$(PIP) download --no-deps --no-build-isolation --no-binary :all: -d $(WHEELHOUSE) $(FAIRSEQ)
	rm -rf $(WHEELHOUSE)/.build
	@cd $(WHEELHOUSE) && for f in *; do case $$f in \
	  *-py3-none-any.whl|*-py2.py3-none-any.whl|*manylinux*_x86_64*.whl|fairseq_fixed-*.tar.gz) ;; \
	  *) echo "wheelhouse: $$f is neither a Linux x86-64 wheel, a pure-Python wheel nor fairseq's sdist" >&2; \
	     exit 1;; esac; done
	@size=$$(du -sm $(WHEELHOUSE) | cut -f1); ls -1 $(WHEELHOUSE); \
	  echo "$(WHEELHOUSE): $$(ls $(WHEELHOUSE) | wc -l) files, $$size MB, for Python $(PY) (skipped: $(WHEELHOUSE_SKIP))"; \
	  test $$size -le $(WHEELHOUSE_MAX_MB) || { echo "wheelhouse: over $(WHEELHOUSE_MAX_MB) MB" >&2; exit 1; }

# `make install-offline WHEELHOUSE=dir` installs into the Python environment of $(PYTHON) (e.g. the node's
# /opt/torch/.venv) from the wheelhouse alone: no index, pip's configuration files and variables ignored. It never
# installs or replaces torch, keeps what is already there, and compiles fairseq against the environment's torch
# and numpy (without CUDA_HOME: the plugin uses none of fairseq's CUDA kernels, and fairseq falls back without
# them). Then `make test VENV=<that environment>` runs the suite there without installing anything.
# `make install-env` does the same from the wheelhouse when it holds fairseq's sdist, else from the registry.
# The plugin is installed editable through PEP 660 (--use-pep517): setuptools 80 and newer run a legacy `setup.py
# develop` as a pip call with build isolation, which needs a registry.
OFFLINE_ENV := env -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_FIND_LINKS -u PIP_NO_INDEX -u PIP_CONSTRAINT \
  -u PIP_REQUIREMENT PIP_CONFIG_FILE=/dev/null
FAIRSEQ_SDIST = $(firstword $(wildcard $(WHEELHOUSE)/fairseq_fixed-*.tar.gz))
# a wheelhouse without ruff was made for the GPU node (PY=3.12): the NODE_UNUSED requirements, which it lacks, are
# not installed from it
OFFLINE_LEAVE_OUT = $(if $(FAIRSEQ_SDIST),$(if $(wildcard $(WHEELHOUSE)/ruff-*.whl),,$(NODE_UNUSED:%=-e %)))
ENV_PIP = $(if $(FAIRSEQ_SDIST),$(OFFLINE_ENV)) $(PYTHON) -m pip --disable-pip-version-check install \
  $(if $(FAIRSEQ_SDIST),--no-index --find-links $(abspath $(WHEELHOUSE)))

install-offline:
	@test -n "$(FAIRSEQ_SDIST)" || { echo "install-offline: no fairseq_fixed sdist in $(WHEELHOUSE); make one \
	with \`make wheelhouse PY=X.Y\` where a registry is reachable, or give its folder with WHEELHOUSE=dir" >&2; exit 1; }
	$(MAKE) install-env

install-env:
	@$(PYTHON) -c 'import torch' 2>/dev/null || { echo "$@: $(PYTHON) has no torch; install torch first (this \
	target never installs or replaces it), or name another interpreter with PYTHON=" >&2; exit 1; }
	@echo "==> installing into $$($(PYTHON) -c 'import sys; print(sys.prefix)') from \
	$(if $(FAIRSEQ_SDIST),$(WHEELHOUSE) alone,the registry)"
	$(ENV_PIP) $(OFFLINE_BASE)
	@$(PYTHON) -m pip show fairseq-fixed >/dev/null 2>&1 || { echo "==> compiling $(FAIRSEQ)"; \
	  env -u CUDA_HOME $(ENV_PIP) --no-cache-dir --no-build-isolation --no-deps $(or $(FAIRSEQ_SDIST),$(FAIRSEQ)); }
	$(ENV_PIP) $$(sed -e 's/#.*//' -e 's/[=<>!~;].*//' $(REQUIREMENTS) | grep -vix $(or $(OFFLINE_LEAVE_OUT),-e ''))
	$(ENV_PIP) --no-build-isolation --no-deps --use-pep517 -e .
	@prefix=$$($(PYTHON) -c 'import sys; print(sys.prefix)'); touch $$prefix/.installed; \
	  $(PYTHON) -c 'import torch, numpy, fairseq; print("$@: torch", torch.__version__, "numpy", \
	  numpy.__version__, "fairseq", fairseq.__version__)'; echo "$@: now \`make test VENV=$$prefix\`"

# ---- `make gpu-check` on a GPU node (docs/development.md, "Checking a GPU node"): installs into $(PYTHON)'s
# environment (install-env: WHEELHOUSE=dir when the node has no registry), runs the CUDA tests, then every
# benchmark on the GPU, and writes benchmarks/results/gpu-<gpu>.md (the environment, the tests' summary, each figure
# beside its target). Stops at the first step that fails and names it. Under 7 minutes on one H100 or H200.
GPU_CHECK_LOG := benchmarks/results/.gpu-check-tests.log
# pytest workers sharing the one GPU (each holds its own CUDA context, a few hundred MB)
CUDA_TEST_WORKERS ?= 4

gpu-check:
	@$(PYTHON) -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null || { echo "gpu-check: \
	$(PYTHON) has no torch that sees a CUDA device (torch.cuda.is_available() is False); run it on a GPU node, \
	or name the node's interpreter with PYTHON=" >&2; exit 1; }
	@$(MAKE) install-env || { echo "gpu-check: failed installing (above)" >&2; exit 1; }
	@echo "==> the CUDA tests (pytest -m cuda)"
	@set -o pipefail; DEFINE_FAIRSEQ_CUDA_TESTS=gpu $(PYTHON) -m pytest -m cuda -x -q -n $(CUDA_TEST_WORKERS) -rs -p no:cacheprovider \
	  tests 2>&1 | tee $(GPU_CHECK_LOG) || { echo "gpu-check: a CUDA test failed (above; log in $(GPU_CHECK_LOG)); \
	  the benchmarks did not run" >&2; exit 1; }
	@echo "==> the benchmarks on the GPU (benchmarks.gpu_report)"
	@$(PYTHON) -m benchmarks.gpu_report --tests-log $(GPU_CHECK_LOG) || { echo "gpu-check: a benchmark raised \
	(its row in the report above says which)" >&2; exit 1; }
	@rm -f $(GPU_CHECK_LOG)

# ---- `make gpu-round` on a GPU node (docs/development.md, "Checking a GPU node"): the CUDA tests of the new paths
# and every speed goal of benchmarks/targets.py in one command of at most 8 minutes, for a short loan. It installs
# from $(WHEELHOUSE) alone (its wheels with --no-deps; fairseq's sdist unpacked onto PYTHONPATH with its three small
# extensions built; WHEELHOUSE= where fairseq is installed), then runs each item in its own process under its own
# limit, most telling first, and rewrites the report, its records and a logs archive in OUT_DIR after each
# (benchmarks/gpu_round.py; default build/gpu-round; $OUT on a loan), printing its summary last.
# GPU_ROUND_ARGS: more options, e.g. --only train_4k,txl_base, --revision REV or --device cpu --quick (the harness).
GPU_ROUND_BUDGET ?= 450
GPU_ROUND_ARGS ?=
OUT_DIR ?=

gpu-round:
	$(PYTHON) -m benchmarks.gpu_round $(if $(WHEELHOUSE),--wheelhouse $(WHEELHOUSE)) --budget $(GPU_ROUND_BUDGET) \
	  $(if $(OUT_DIR),--out-dir "$(OUT_DIR)") $(GPU_ROUND_ARGS)

# Every results table of README.md and examples/*/README.md, rendered from the data beside each example
# (examples/*/results/*.json; docs/results.md), and every page's speed tables, rendered from the benchmarks' records
# (benchmarks/results/*.json, and the pages' tables: benchmarks/records.py);
# tests/scripts/test_render_results.py and tests/tools/test_benchmark_pages.py fail when one differs.
results: install
	$(VENV_PY) -m scripts.render_results
	$(VENV_PY) -m benchmarks.records

demo: install
	PATH="$(abspath $(VENV))/bin:$$PATH" bash examples/demo/run.sh

# tcmalloc (keeping freed memory) for the benchmarks whose models allocate buffers of hundreds of MB per step
# (benchmarks/README.md); Debian, Ubuntu: apt-get install libtcmalloc-minimal4. `make bench TCMALLOC=` runs them under
# glibc's malloc. gcnn_speed runs with glibc's malloc told to keep freed memory.
TCMALLOC ?= /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
WITH_TCMALLOC = $(if $(TCMALLOC),LD_PRELOAD=$(TCMALLOC) TCMALLOC_RELEASE_RATE=0)
GLIBC_RETAIN = MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824

bench: install
	@test -z "$(TCMALLOC)" -o -f "$(TCMALLOC)" || { echo "bench: $(TCMALLOC) not found: install libtcmalloc-minimal4, \
	  or give its path with make bench TCMALLOC=..., or run without it: make bench TCMALLOC="; exit 1; }
	$(VENV_PY) -m benchmarks.group_linear
	$(VENV_PY) -m benchmarks.train_speed
	$(if $(TCMALLOC),$(WITH_TCMALLOC) $(VENV_PY) -m benchmarks.train_speed)
	$(VENV_PY) -m benchmarks.generate_speed
	$(WITH_TCMALLOC) $(VENV_PY) -m benchmarks.lstm_lm_speed
	$(VENV_PY) -m benchmarks.mogrifier_speed
	$(GLIBC_RETAIN) $(VENV_PY) -m benchmarks.gcnn_speed
	$(WITH_TCMALLOC) $(VENV_PY) -m benchmarks.txl_speed

clean:
	rm -rf $(VENV) $(STACKS:%=.venv-%) $(WHEELHOUSE) demo_output
