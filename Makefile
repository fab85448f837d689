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

# tcmalloc (keeping freed memory) for the benchmarks whose models allocate buffers of hundreds of MB per step
# (benchmarks/README.md); Debian, Ubuntu: apt-get install libtcmalloc-minimal4. `make bench TCMALLOC=` runs them under
# glibc's malloc. gcnn_speed runs with glibc's malloc told to keep freed memory.
TCMALLOC ?= /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
WITH_TCMALLOC = $(if $(TCMALLOC),LD_PRELOAD=$(TCMALLOC) TCMALLOC_RELEASE_RATE=0)
GLIBC_RETAIN = MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824

bench: install
	@test -z "$(TCMALLOC)" -o -f "$(TCMALLOC)" || { echo "bench: $(TCMALLOC) not found: install libtcmalloc-minimal4, \
	  or give its path with make bench TCMALLOC=..., or run without it: make bench TCMALLOC="; exit 1; }
	$(PY) -m benchmarks.group_linear
	$(PY) -m benchmarks.train_speed
	$(if $(TCMALLOC),$(WITH_TCMALLOC) $(PY) -m benchmarks.train_speed)
	$(PY) -m benchmarks.generate_speed
	$(WITH_TCMALLOC) $(PY) -m benchmarks.lstm_lm_speed
	$(PY) -m benchmarks.mogrifier_speed
	$(GLIBC_RETAIN) $(PY) -m benchmarks.gcnn_speed
	$(WITH_TCMALLOC) $(PY) -m benchmarks.txl_speed

clean:
	rm -rf $(VENV) demo_output
