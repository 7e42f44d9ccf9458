"""The demo (examples/train_residual_mlp.py, `make demo`) as a user runs it: a short run in a
subprocess (5 steps, the aot_eager backend) prints the plain-PyTorch columns and step times,
the fusion plan and where the PNG went, and passes its own checks."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "train_residual_mlp.py"
#: a short run must stay a fast test; past this (a very busy machine) it is skipped
TIMEOUT_S = 60


def run_demo(tmp_path: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(DEMO), "--steps", "5", "--print-every", "1",
           "--backend", "aot_eager", "--plot", str(tmp_path / "demo.png"), *args]
    try:
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.skip(f"the 5-step demo took over {TIMEOUT_S} s (a busy machine)")


def test_demo_prints_plain_pytorch_plan_and_plot(tmp_path):
    res = run_demo(tmp_path)
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    # progress before the compiles, which are the long silent parts
    assert "compiling our te.ops model (torch.compile, backend aot_eager" in out
    assert "compiling the PyTorch model (torch.compile, backend aot_eager" in out
    # the plain-PyTorch columns beside ours, from the same weights: step 1's losses agree
    header = next(line for line in out.splitlines() if line.lstrip().startswith("step "))
    for column in ("ours eager", "ours compiled", "torch eager", "torch compiled", "ours bf16",
                   "current"):
        assert column in header
    step1 = next(line.split() for line in out.splitlines() if line.split()[:1] == ["1"])
    ours, ours_c, _, plain, plain_c = (float(v) for v in step1[1:6])
    assert ours == ours_c and abs(ours - plain) < 1e-5 and abs(plain - plain_c) < 1e-5
    # the step times side by side
    assert "mean step time, ms" in out
    assert any(line.split()[:2] == ["plain", "PyTorch"] and len(line.split()) == 4
               for line in out.splitlines())
    # the plan through the public API
    assert "fusion plan of a block (Sequential.fusion_plan):" in out
    assert "'ForwardLinearBiasActivation', 'ForwardLinearScaleAdd'" in out
    assert "'BackwardActivationBias', 'BackwardLinearScale'" in out
    # the picture, or why there is none
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError:
        assert "plot: skipped, matplotlib is not installed" in out
    else:
        assert "plot: demo.png (loss curves and step times)" in out
        assert (tmp_path / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
