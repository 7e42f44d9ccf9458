#!/usr/bin/env bash
# Compiles CUDA sources to objects under /tmp with the flags of `make cuda-build` (read from its
# build.ninja), for a quick check while writing a kernel:
#   scripts/cuda_compile_one.sh csrc/kernels/cuda/activation.cu [...]
# `make cuda-build` must have run once (in this checkout or in the one whose build/ was copied
# here); the include path of csrc/ is rewritten to this checkout's.
set -euo pipefail
cd "$(dirname "$0")/.."
ninja=build/cuda/tmp/build.ninja
[ -f "$ninja" ] || { echo "[cuda-compile-one] no $ninja: run make cuda-build once" >&2; exit 1; }
nvcc=$(sed -n 's/^nvcc = //p' "$ninja")
cflags=$(sed -n 's/^cuda_cflags = //p' "$ninja")
post=$(sed -n 's/^cuda_post_cflags = //p' "$ninja")
# the first -I<root>/csrc is the checkout that wrote build.ninja
root=$(echo "$cflags" | grep -o -- '-I[^ ]*/csrc' | head -1 | sed 's/^-I//; s|/csrc$||')
cflags=${cflags//-I$root\/csrc/-I$PWD/csrc}
for src in "$@"; do
  obj=/tmp/cuda_compile_one.$$.$(basename "$src").o
  echo "[cuda-compile-one] $src" >&2
  eval "$nvcc $cflags $post -o $obj $src"
  rm -f "$obj"
done
