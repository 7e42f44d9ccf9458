#!/usr/bin/env bash
# Prints the python interpreter the Makefile should use, preparing it first.
#
# * A python3 that already has torch >= 2.11 (an activated venv, or the GPU machine's system
#   python) is used as it is; only missing test tools are installed, when pip can reach an index.
# * Otherwise a virtual environment is created in .venv with the CPU build of torch==2.13.0.
# All progress goes to stderr; stdout carries only the interpreter path. `make build` then
# installs the checkout into that interpreter's environment (scripts/install_editable.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

has_torch() {
  "$1" - <<'PY' 2>/dev/null
import sys, torch
v = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if v >= (2, 11) else 1)
PY
}

tools_missing() {
  "$1" -c "import pytest, ninja, numpy, setuptools" 2>/dev/null && return 1 || return 0
}

if [ -x .venv/bin/python ] && has_torch .venv/bin/python; then
  py=.venv/bin/python
elif has_torch python3; then
  py=$(command -v python3)
else
  echo "[env] creating .venv with torch==2.13.0 (CPU build)" >&2
  python3 -m venv .venv >&2
  py=.venv/bin/python
  "$py" -m pip install -q --upgrade pip >&2 || true
  "$py" -m pip install -q torch==2.13.0 >&2
fi

if tools_missing "$py"; then
  echo "[env] installing test tools into $py" >&2
  "$py" -m pip install -q pytest ninja numpy setuptools wheel >&2 || \
    echo "[env] warning: could not install pytest/ninja/numpy (no index?)" >&2
fi
echo "$py"
