#!/usr/bin/env bash
# Installs this checkout into the environment of the interpreter given (default: the one
# scripts/python_env.sh picks) as an editable install, `pip install --no-build-isolation --no-deps
# -e .`: `import transformer_engine_cpp` then works in that environment from any directory with
# no PYTHONPATH (the examples, bench/, a user's own scripts), and edits of the Python sources
# take effect without reinstalling. `make build` runs it after the in-place build; the install
# compiles in the same build/temp.* folder (setup.py), so it finds nothing to compile, and it
# needs no package index (torch, setuptools and ninja are in the environment already).
#
# Nothing is done (and nothing printed) when the environment already imports the package from
# this checkout. When it imports it from another checkout (an editable install of a clone that
# still exists), that install is left in place and one line says so: checkouts that share one
# environment do not take it from each other; `make` uses the checkout it runs in either way
# (its PYTHONPATH). A failed install (e.g. a system python that pip may not change) warns and
# leaves the build as it is.
set -euo pipefail
# the interpreter as an absolute path: the check below runs in another directory
absolute() {
  case $1 in
    /*) echo "$1" ;;
    */*) echo "$PWD/$1" ;;
    *) command -v "$1" ;;
  esac
}
py=${1:+$(absolute "$1")}
cd "$(dirname "$0")/.."
py=${py:-$(absolute "$(./scripts/python_env.sh)")}

# where the environment imports the package from, seen from outside the checkout, no PYTHONPATH
found=$(cd / && env -u PYTHONPATH "$py" -c '
import importlib.util
spec = importlib.util.find_spec("transformer_engine_cpp")
print(spec.origin if spec and spec.origin else "")' 2>/dev/null || true)
here="$PWD/transformer_engine_cpp/__init__.py"

if [ "$found" = "$here" ]; then
  exit 0
fi
if [ -n "$found" ] && [ -f "$found" ] && [ -f "$(dirname "$(dirname "$found")")/setup.py" ]; then
  echo "[install] $py imports transformer_engine_cpp from $(dirname "$(dirname "$found")")" \
    "(left as it is; to use this checkout outside make: $py -m pip install" \
    "--no-build-isolation --no-deps -e $PWD)" >&2
  exit 0
fi
echo "[install] pip install --no-build-isolation --no-deps -e . into $py's environment" >&2
# (setuptools' banner about editable installs and same-named folders says nothing actionable)
if ! PYTHONWARNINGS="ignore:Editable installation" \
    "$py" -m pip install -q --no-build-isolation --no-deps -e . >&2; then
  echo "[install] warning: the editable install failed; make still uses this checkout" \
    "(PYTHONPATH), other commands need PYTHONPATH=$PWD" >&2
fi
