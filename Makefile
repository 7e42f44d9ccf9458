# The README's commands. `make test` and `make demo` prepare the environment themselves.
SHELL := /bin/bash
export MAX_JOBS ?= 2
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
# inductor's parallel compile workers only compete for the 2 cores of the dev machines
export TORCHINDUCTOR_COMPILE_THREADS ?= 1

PY = $(shell ./scripts/python_env.sh)

.PHONY: build test demo bench clean

# Incremental build of transformer_engine_cpp/_C.so in place (ninja: only changed files).
build:
	@py=$(PY); $$py setup.py -q build_ext --inplace

test: build
	@py=$(PY); $$py -m pytest -q $(PYTEST_ARGS)

demo: build
	@py=$(PY); $$py examples/train_residual_mlp.py

# Benchmarks (never part of `make test`): the suite, bench/suite.py. Quick by default (under 5
# minutes once the compile cache is warm); BENCH_ARGS=--full for the full run. It writes
# bench/out/suite.csv and renders bench/README.md + bench/ratios.png (matplotlib: installed here).
BENCH_ARGS ?= --quick
bench: build
	@py=$(PY); $$py -c "import matplotlib" 2>/dev/null || $$py -m pip install -q matplotlib >&2; \
		OMP_NUM_THREADS=2 $$py bench/suite.py $(BENCH_ARGS)

clean:
	rm -rf build transformer_engine_cpp/_C*.so
