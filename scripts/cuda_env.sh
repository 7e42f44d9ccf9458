#!/usr/bin/env bash
# Prepares the environment of the compile-only CUDA build (`make cuda-build`) and prints, on one
# line of stdout, the python interpreter to build with and the CUDA toolkit folder for CUDA_HOME:
#   <python> <cuda_home>
#
# * .venv-cuda: a virtual environment with torch==2.14.1, the CUDA 13.0 build of torch (with its
#   nvidia-* packages: cuBLASLt's headers and library), ninja, setuptools and numpy. It is kept
#   apart from .venv (the CPU build of torch that `make test` uses). Created once, reused after.
# * CUDA_HOME: the toolkit that `nvcc` belongs to. nvcc may be reached through a wrapper script
#   (e.g. /usr/local/bin/nvcc), from which torch's own guess of CUDA_HOME is wrong; nvcc's dry
#   run names the real toolkit folder (its `TOP`). An exported CUDA_HOME is used as it is.
# Fails, with a message saying why, when either cannot be had. Progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.14.1   # pinned: the CUDA 13.0 build; never install an unpinned torch here
VENV=.venv-cuda

die() {
  echo "[cuda-env] error: $*" >&2
  exit 1
}

torch_ok() {
  "$1" - "$TORCH_VERSION" <<'PY' 2>/dev/null
import sys, torch
ok = torch.__version__.split("+")[0] == sys.argv[1] and (torch.version.cuda or "").startswith("13.")
sys.exit(0 if ok else 1)
PY
}

py="$VENV/bin/python"
if [ ! -x "$py" ] || ! torch_ok "$py"; then
  echo "[cuda-env] creating $VENV with torch==$TORCH_VERSION (CUDA 13.0 build, ~5.5 GB)" >&2
  python3 -m venv "$VENV" >&2 || die "python3 -m venv $VENV failed"
  "$py" -m pip install -q "torch==$TORCH_VERSION" ninja setuptools numpy >&2 || \
    die "could not install torch==$TORCH_VERSION into $VENV (is the wheel available to pip" \
        "on this machine?); the CUDA build needs exactly this torch"
  torch_ok "$py" || die "$VENV has torch $("$py" -c 'import torch; print(torch.__version__,
    torch.version.cuda)' 2>&1), expected $TORCH_VERSION built for CUDA 13.x"
fi
"$py" -c "import ninja, setuptools, numpy" 2>/dev/null || \
  "$py" -m pip install -q ninja setuptools numpy >&2 || die "could not install ninja/setuptools"

cuda_home="${CUDA_HOME:-}"
if [ -z "$cuda_home" ]; then
  command -v nvcc >/dev/null || die "nvcc not found on PATH (the CUDA 13.0 toolkit is needed)"
  top=$(nvcc --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n1)
  [ -n "$top" ] || die "could not find the toolkit folder of $(command -v nvcc) (nvcc --dryrun)"
  cuda_home=$(cd "$top" && pwd -P)
fi
[ -x "$cuda_home/bin/nvcc" ] || die "CUDA_HOME=$cuda_home has no bin/nvcc"
release=$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
[ "${release%%.*}" = 13 ] || die "$cuda_home/bin/nvcc is CUDA $release; torch $TORCH_VERSION" \
                                 "needs a CUDA 13 toolkit"
echo "$py $cuda_home"
