# The two commands: `make demo` (train and evaluate transformer_define on the demo corpus) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.installed
TORCH := torch==2.13.0
FAIRSEQ := fairseq-fixed==0.12.3.1
# Test processes in parallel (pytest-xdist); each file's tests stay in one process (shared fixtures).
TEST_WORKERS ?= 2

.PHONY: install test demo bench clean

install: $(STAMP)

# Installing again does nothing: the stamp is newer than what it was made from.
$(STAMP): setup.py requirements.txt Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(TORCH) "numpy<2" cython==3.3.1
	@$(PIP) show fairseq-fixed >/dev/null 2>&1 || { \
	  echo "==> compiling $(FAIRSEQ) (about 3 minutes on 2 cores)"; \
	  $(PIP) install --no-build-isolation --no-deps $(FAIRSEQ); }
	$(PIP) install -r requirements.txt
	$(PIP) install --no-build-isolation --no-deps -e .
	@touch $(STAMP)

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

demo: install
	PATH="$(abspath $(VENV))/bin:$$PATH" bash examples/demo/run.sh

# The allocator of the benchmarks whose models allocate buffers of hundreds of MB per step (benchmarks/README.md);
# tcmalloc needs libtcmalloc (Debian, Ubuntu: apt-get install libtcmalloc-minimal4), e.g.
# `make bench BENCH_ALLOCATOR=glibc-retain` without it.
BENCH_ALLOCATOR ?= tcmalloc

bench: install
	$(PY) -m benchmarks.group_linear
	$(PY) -m benchmarks.train_speed --allocators glibc,$(BENCH_ALLOCATOR)
	$(PY) -m benchmarks.generate_speed
	$(PY) -m benchmarks.lstm_lm_speed --allocator $(BENCH_ALLOCATOR)
	$(PY) -m benchmarks.mogrifier_speed
	$(PY) -m benchmarks.gcnn_speed
	$(PY) -m benchmarks.txl_speed --allocator $(BENCH_ALLOCATOR)

clean:
	rm -rf $(VENV) demo_output
