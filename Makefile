# The README's commands. `make test` and `make demo` prepare the environment themselves.
SHELL := /bin/bash
export MAX_JOBS ?= 2
# `make build` installs the checkout into the environment (editable); the PYTHONPATH makes every
# target use the checkout it runs in even where the environment's install is another checkout's
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
# inductor's parallel compile workers only compete for the 2 cores of the dev machines
export TORCHINDUCTOR_COMPILE_THREADS ?= 1

PY = $(shell ./scripts/python_env.sh)

.PHONY: build test demo demo-tp bench bench-report cuda-build clean

# Incremental build of transformer_engine_cpp/_C.so in place (ninja: only changed files, one
# progress line each; silent when nothing changed), then the editable install of the checkout
# into the environment (once: scripts/install_editable.sh).
build:
	@py=$(PY); $$py setup.py -q build_ext --inplace && ./scripts/install_editable.sh $$py

test: build
	@py=$(PY); $$py -m pytest -q $(PYTEST_ARGS)

# The demo draws its PNG with matplotlib: installed here when an index is reachable (without
# it the demo says so and skips the picture).
demo: build
	@py=$(PY); $$py -c "import matplotlib" 2>/dev/null || { \
		echo "[demo] installing matplotlib (for the plot) ..." >&2; \
		$$py -m pip install -q matplotlib >&2 \
		|| echo "[demo] could not install matplotlib: no PNG this time" >&2; }; \
		$$py examples/train_residual_mlp.py

# Tensor and sequence parallelism: examples/train_tensor_parallel.py on 2 CPU ranks (gloo),
# torchrun --standalone (a free local port), one OpenMP thread per rank, at most 10 minutes.
# DEMO_TP_ARGS=--compile runs the parallel block under torch.compile(fullgraph=True).
demo-tp: build
	@py=$(PY); OMP_NUM_THREADS=1 timeout 600 $$py -m torch.distributed.run --standalone \
		--nproc-per-node 2 examples/train_tensor_parallel.py $(DEMO_TP_ARGS)

# Benchmarks (never part of `make test`): the suite, bench/suite.py (matplotlib and Debian's
# libjemalloc2, the benchmarks' allocator (bench/allocator.py): installed here where the machine
# allows; without jemalloc the suite runs on glibc malloc and says so).
# `make bench`: the quick run (under 5 minutes once the compile cache is warm), into bench/out/
# only (suite.csv, suite.md, ratios.png). `make bench-report`: the full run, which also renders
# this CPU model's section of the committed report (bench/machines/<model>/) and bench/README.md
# from every model's section (as BENCH_ARGS=--full does).
BENCH_ARGS ?= --quick
bench: build
	@py=$(PY); $$py -c "import matplotlib" 2>/dev/null || $$py -m pip install -q matplotlib >&2; \
		ldconfig -p | grep -q libjemalloc.so.2 || ! command -v apt-get >/dev/null || { \
		echo "[bench] installing libjemalloc2 (the benchmarks' allocator) ..." >&2; \
		{ apt-get install -y -qq libjemalloc2 || { apt-get update -qq \
		&& apt-get install -y -qq libjemalloc2; }; } >/dev/null 2>&1 \
		|| echo "[bench] could not install libjemalloc2: glibc malloc this time" >&2; }; \
		OMP_NUM_THREADS=2 $$py bench/suite.py $(BENCH_ARGS)

bench-report: BENCH_ARGS = --full
bench-report: bench

# Compile-only CUDA build (no GPU needed): .venv-cuda's CUDA 13.0 torch (scripts/cuda_env.sh
# creates it and finds CUDA_HOME), sm_90 code plus PTX, into build/cuda/lib; never in place, so
# transformer_engine_cpp/_C.so stays the CPU build. Then scripts/check_cuda_build.py loads the
# .so and fails unless every op listed there reports a CUDA kernel.
CUDA_ARCH_LIST ?= 9.0+PTX
cuda-build:
	@set -e; env=$$(./scripts/cuda_env.sh); py=$${env%% *}; \
		export CUDA_HOME=$${env#* } TECPP_WITH_CUDA=1 TORCH_CUDA_ARCH_LIST="$(CUDA_ARCH_LIST)"; \
		echo "[cuda-build] $$py, CUDA_HOME=$$CUDA_HOME, TORCH_CUDA_ARCH_LIST=$$TORCH_CUDA_ARCH_LIST"; \
		$$py setup.py -q build_ext --build-lib build/cuda/lib --build-temp build/cuda/tmp; \
		$$py scripts/check_cuda_build.py build/cuda/lib/transformer_engine_cpp/_C.so

clean:
	rm -rf build transformer_engine_cpp/_C*.so
