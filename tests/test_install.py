"""The package as a user meets it after `make build`: installed into the environment (editable,
scripts/install_editable.sh), so that `import transformer_engine_cpp` works from any directory
with no PYTHONPATH, and the README's scripts run as written (`python bench/suite.py ...`).

Each check is a subprocess of this environment's interpreter with PYTHONPATH removed (the
Makefile's and the shell's), so that only the installed package can be found.
"""

import importlib.metadata
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _installed(distribution: str) -> bool:
    # importlib.metadata, not importlib.util.find_spec: setuptools' distutils hack answers a
    # find_spec("pip") by removing distutils from sys.modules, which breaks inductor's next
    # C++ compile in this process
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# without pip and setuptools the environment cannot hold an editable install
pytestmark = pytest.mark.skipif(
    not (_installed("pip") and _installed("setuptools")),
    reason="pip or setuptools missing: `make build` cannot install the package here")

INSTALL_HINT = (f"not installed in {sys.executable}'s environment: `make build` installs it, "
                f"or {sys.executable} -m pip install --no-build-isolation --no-deps -e {ROOT}")


def _run(args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _checkout_of(package_init: str) -> str:
    return os.path.dirname(os.path.dirname(package_init))


def test_import_from_outside_the_checkout(tmp_path):
    code = ("import torch, transformer_engine_cpp as te\n"
            "y = te.ops.Sequential(te.ops.Bias(4), te.ops.GELU())(torch.zeros(2, 4))\n"
            "print(te.__file__)")
    res = _run(["-c", code], cwd=tmp_path)
    assert res.returncode == 0, f"{INSTALL_HINT}\n{res.stderr[-3000:]}"
    checkout = _checkout_of(res.stdout.strip().splitlines()[-1])
    if os.path.realpath(checkout) != os.path.realpath(ROOT):
        if os.path.exists(os.path.join(checkout, "setup.py")):
            pytest.skip(f"the environment's editable install is another checkout, {checkout} "
                        "(scripts/install_editable.sh leaves it in place)")
        pytest.fail(f"the environment imports transformer_engine_cpp from {checkout}, not "
                    f"this checkout: {INSTALL_HINT}")


# the README's commands, run from the checkout's root as written; --help imports the package
# (and, for bench/suite.py, first re-executes itself with the benchmark allocator settings)
SCRIPTS = ["bench/suite.py", "bench/callgrind.py", "bench/memory.py", "bench/tp.py",
           "bench/bench_fp8.py", "examples/train_residual_mlp.py",
           "examples/train_tensor_parallel.py"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_runs_as_written(script):
    res = _run([script, "--help"], cwd=ROOT)
    assert res.returncode == 0, f"python {script} --help: {INSTALL_HINT}\n{res.stderr[-3000:]}"
    assert "usage:" in res.stdout
