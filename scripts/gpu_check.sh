#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, build the extension from source with its CUDA
# kernels, then run the CUDA cases of the tests (the conformance suite: opcheck fake against
# real, eager against the float64 reference, compiled against eager; tests/test_cuda_backend.py:
# the same bits twice, no host synchronisation, CUDA graph replay, FP8 and dropout bit-identical
# to the CPU; tests/test_norm_widths.py: every row width's launch mode; the cuBLASLt epilogue,
# fp8_gemm, FP8 quantize and dropout tests), the GPU benchmark subset (bench/gpu.py) and the
# tensor-parallel example on NCCL with one rank (examples/train_tensor_parallel.py).
#
#   scripts/gpu_check.sh OUTDIR
#
# Writes OUTDIR/log.txt (everything printed), OUTDIR/conformance.xml (JUnit) and
# OUTDIR/bench.csv. Uses the machine's own python3 and torch (PYTHON overrides), nvcc from PATH
# (CUDA_HOME overrides) and every core. Each stage has its own time limit, so the whole check
# stays under 9 minutes; a stage that fails or times out is reported. The tests and the
# benchmark run after a successful build, the benchmark whatever the tests' outcome. GPU_CHECK_DRY_RUN=1 runs the same stages on a machine without a GPU: CPU build, the
# CPU cases of one family, the benchmark at tiny shapes on the CPU (run it in a copy of the
# tree: the build is in place). GPU_CHECK_BUILD_LIMIT overrides the build's limit (seconds).
set -uo pipefail

out="${1:?usage: scripts/gpu_check.sh OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
dry="${GPU_CHECK_DRY_RUN:-0}"
exec > >(tee "$out/log.txt") 2>&1

status=0
stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "==== $name (limit ${limit}s): $*"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "==== $name: exit $rc after $((SECONDS - start))s"
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}

echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  "$(git rev-parse --short HEAD 2>/dev/null || echo '?')"
"$py" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__,
      '| CUDA', torch.version.cuda, '| device',
      torch.cuda.get_device_name() if torch.cuda.is_available() else None)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader

export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
if [ "$dry" = 1 ]; then
  export TECPP_WITH_CUDA=0
  cases=(-k "cpu and gelu and not inplace")
  bench=(--device cpu --small --rounds 1 --repeat 1)
else
  if [ -z "${CUDA_HOME:-}" ]; then
    # the toolkit nvcc belongs to, from its dry run (nvcc may be a wrapper script elsewhere)
    CUDA_HOME="$(nvcc --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' \
      | head -n1)"
    export CUDA_HOME
  fi
  export TECPP_WITH_CUDA=1
  # the architecture of this GPU (sm_90 on an H200), plus PTX
  TORCH_CUDA_ARCH_LIST="$("$py" -c "import torch
print('%d.%d+PTX' % torch.cuda.get_device_capability())")"
  export TORCH_CUDA_ARCH_LIST
  echo "CUDA_HOME=$CUDA_HOME TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
  cases=(-k cuda)
  bench=()
fi

if stage build "${GPU_CHECK_BUILD_LIMIT:-210}" "$py" setup.py -q build_ext --inplace; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  # the inductor cases (marked slow) are left out: each compile costs the device's time
  stage conformance 150 "$py" -m pytest -q -p no:cacheprovider -m "not slow" \
    --junitxml="$out/conformance.xml" -rs tests/test_conformance.py tests/test_cuda_backend.py \
    tests/test_norm_widths.py tests/test_linear.py tests/test_fp8_ops.py tests/test_fp8_quantize.py \
    tests/test_dropout.py tests/test_transpose.py "${cases[@]}"
  stage bench 100 "$py" bench/gpu.py --out "$out/bench.csv" "${bench[@]}"
  # tensor parallelism's smoke test: the example on NCCL with one rank (TP turns itself off,
  # the collectives' code paths and the CUDA kernels run), 3 steps
  stage tp-smoke 60 "$py" -m torch.distributed.run --standalone --nproc-per-node 1 \
    examples/train_tensor_parallel.py --steps 3
fi
echo "gpu_check: $([ "$status" -eq 0 ] && echo passed || echo FAILED) ($SECONDS s); outputs in $out"
exit "$status"
