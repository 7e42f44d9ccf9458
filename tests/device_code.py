"""Compiling C++ headers shared with the CUDA kernels as CUDA device code, without a GPU."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest
from torch.utils import cpp_extension

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _nvcc():
    home = os.environ.get("CUDA_HOME")
    if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def compile_ptx(source: str, out_dir: pathlib.Path) -> str:
    """PTX of tests/cpp/<source> from nvcc -ptx (device code only: a call to a host-only
    function fails it; -Werror all-warnings, any warning). Skips the test without nvcc."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (CUDA_HOME/bin/nvcc or PATH)")
    includes = [arg for p in cpp_extension.include_paths() for arg in ("-isystem", p)]
    out = out_dir / "device.ptx"
    cmd = [nvcc, "-std=c++20", "--expt-relaxed-constexpr", "-O1", "-ptx", "-Werror",
           "all-warnings", *includes, f"-I{ROOT / 'csrc'}", str(ROOT / "tests/cpp" / source),
           "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return out.read_text()
