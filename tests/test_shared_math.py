"""The shared math of csrc/common/activation_math.h and csrc/common/norm_math.h.

The activation and norm formulas are written once, over a value type: the CPU kernels run them
on at::vec vectors, the CUDA kernels on float. Here

* the shared headers compile as CUDA device code (where nvcc is found;
  tests/cpp/shared_math_device.cu);
* the float and double instantiations, compiled as a small host program
  (tests/cpp/shared_math_scalar.cpp: one element at a time with the math library's exp and tanh,
  as a CUDA kernel runs them), agree with the CPU kernels: within a few ulp (the vector exp,
  tanh and reciprocal differ from the math library's, and the norms' row sums are added in
  another order), with NaN and inf in the same places;
* every CPU kernel gives the same value for the same input wherever the element sits in the
  row: a row tail (partial vector loads) computes exactly what the vector body computes.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest
import torch
from torch.utils import cpp_extension

import activations
from device_code import compile_ptx
from activations import SCALED, op_params
from tolerances import tols
import transformer_engine_cpp as te
from transformer_engine_cpp.ops.basic import ACTIVATIONS

ops = torch.ops.te_cpp
ROOT = pathlib.Path(__file__).resolve().parents[1]

# the order of tests/cpp/shared_math_scalar.cpp, and the parameters it uses
UNARY = ["gelu", "relu", "silu", "qgelu", "srelu"]
GATED = ["glu", "geglu", "qgeglu", "reglu", "sreglu", "swiglu", "clamped_swiglu", "situglu"]
PARAMS = {"clamped_swiglu": (7.0, 1.702, 1.0), "situglu": (1.5, 0.75)}
NORM_EPS = (1e-5, 0.0)
L2_EPS = (1e-6, 0.0)
# the exp's edges: 88.72283935546875 is the first fp32 whose exp overflows (sigmoid(-x) is 0
# from there: SiLU's x sigmoid(x) is -0, not NaN), 88.72283172607422 the last that does not;
# below -87.34 exp is subnormal, below -103.98 it is 0
EXP_EDGES = [88.72283935546875, 88.72283172607422, 87.5, 103.9, 150.0]
SPECIALS = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-39, -1e-39, 88.8, -88.8,
            1e4, -1e4, 7.0, -7.0, 7.000001, -7.000001, 20.0, -20.0,
            *EXP_EDGES, *[-v for v in EXP_EDGES]]
# scalar (math library) against the CPU kernel (at::vec), per precision: (rtol, atol)
TOL = {torch.float32: (2e-5, 2e-6), torch.float64: (1e-12, 1e-14)}
# the norms add their row sums in another order: (rtol, atol)
NORM_TOL = {torch.float32: (1e-4, 2e-5), torch.float64: (1e-11, 1e-12)}


@pytest.fixture(scope="module")
def scalar_program(tmp_path_factory):
    """tests/cpp/shared_math_scalar.cpp compiled against the headers of this tree (no at::vec, no
    libtorch: the shared headers must build in a plain host program, as in a .cu file)."""
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("shared_math") / "shared_math_scalar"
    includes = [f"-isystem{p}" for p in cpp_extension.include_paths()]
    cmd = [cxx, "-std=c++20", "-O1", "-Wall", "-Werror", *includes, f"-I{ROOT / 'csrc'}",
           str(ROOT / "tests/cpp/shared_math_scalar.cpp"), "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return out


def _inputs():
    g = torch.Generator().manual_seed(13)
    grid = torch.linspace(-12, 12, 481, dtype=torch.float64)
    x = torch.cat([grid, torch.tensor(SPECIALS, dtype=torch.float64)])
    n = x.numel()
    b = x[torch.randperm(n, generator=g)]
    dy = torch.randn(n, generator=g, dtype=torch.float64) * 2
    dy[::37] = float("nan")
    dy[5::41] = float("inf")
    dy[7::43] = 0.0
    # norms: R rows of width nn; row 1 has a NaN in x, row 2 is zero, row 3 an inf in dy
    R, nn = 6, 33
    nx = torch.randn(R, nn, generator=g, dtype=torch.float64) * 2 + 0.5
    nx[1, 4] = float("nan")
    nx[2] = 0.0
    ndy = torch.randn(R, nn, generator=g, dtype=torch.float64)
    ndy[3, 7] = float("inf")
    nw = torch.randn(nn, generator=g, dtype=torch.float64) * 0.5
    nb = torch.randn(nn, generator=g, dtype=torch.float64) * 0.5
    # every value representable in fp32, so both precisions see the same inputs
    return [t.float().double() for t in (x, b, dy, nx, ndy, nw, nb)]


def _run_scalar(program, tmp_path, tensors):
    x, b, dy, nx, ndy, nw, nb = tensors
    header = torch.tensor([x.numel(), nx.shape[0], nx.shape[1]], dtype=torch.int64)
    blob = header.numpy().tobytes() + b"".join(t.contiguous().numpy().tobytes() for t in tensors)
    (tmp_path / "in.bin").write_bytes(blob)
    res = subprocess.run([str(program), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return torch.frombuffer(bytearray((tmp_path / "out.bin").read_bytes()), dtype=torch.float64)


def _kernel_outputs(tensors, dtype):
    """The CPU kernels' outputs, in the order the scalar program writes its own."""
    x, b, dy, nx, ndy, nw, nb = (t.to(dtype) for t in tensors)
    out = []
    for a in UNARY:
        out += [(f"{a}_fwd", getattr(ops, f"{a}_fwd")(x)),
                (f"{a}_bwd", getattr(ops, f"{a}_bwd")(dy, x))]
    xb = torch.stack([x, b], dim=-1)  # one (a, b) pair per row
    for a in GATED:
        params = PARAMS.get(a, ())
        dab = getattr(ops, f"{a}_bwd")(dy[:, None], xb, *params, 0)
        out += [(f"{a}_fwd", getattr(ops, f"{a}_fwd")(xb, *params, 0)[:, 0]),
                (f"{a}_bwd_da", dab[:, 0]), (f"{a}_bwd_db", dab[:, 1])]
    for zc in (False, True):
        for eps in NORM_EPS:
            y, mu, rs = ops.layernorm_fwd(nx, nw, nb, eps, zc)
            dx = ops.layernorm_bwd(ndy, nx, mu, rs, nw, zc)[0]
            out += [(f"ln{zc}{eps}_{k}", t) for k, t in zip(("y", "mu", "rstd", "dx"),
                                                            (y, mu, rs, dx))]
            y, rs = ops.rmsnorm_fwd(nx, nw, eps, zc)
            dx = ops.rmsnorm_bwd(ndy, nx, rs, nw, zc)[0]
            out += [(f"rms{zc}{eps}_{k}", t) for k, t in zip(("y", "rstd", "dx"), (y, rs, dx))]
    for eps in L2_EPS:
        y, rn = ops.l2normalization_fwd(nx, eps)
        dx = ops.l2normalization_bwd(ndy, nx, rn)
        out += [(f"l2{eps}_{k}", t) for k, t in zip(("y", "rnorm", "dx"), (y, rn, dx))]
    return out


def test_scalar_program_covers_every_activation():
    """A new activation goes into tests/cpp/shared_math_scalar.cpp (TE_UNARY or TE_GATED, its
    parameters in config()), into tests/cpp/shared_math_device.cu (a TE_*_LAUNCH line) and into
    UNARY or GATED here (its parameters in PARAMS)."""
    assert sorted(UNARY) == sorted(c.op_stem for c in activations.UNARY)
    assert sorted(GATED) == sorted(c.op_stem for c in activations.GATED)
    for name in ("shared_math_scalar.cpp", "shared_math_device.cu"):
        source = (ROOT / "tests/cpp" / name).read_text()
        for stem in UNARY + GATED:
            assert f"Act::{stem.upper()}" in source, f"{stem} missing from tests/cpp/{name}"


def test_scalar_math_matches_cpu_kernels(scalar_program, tmp_path):
    tensors = _inputs()
    flat = _run_scalar(scalar_program, tmp_path, tensors)
    pos = 0
    for dtype in (torch.float32, torch.float64):
        for name, kernel in _kernel_outputs(tensors, dtype):
            scalar = flat[pos:pos + kernel.numel()].view(kernel.shape)
            pos += kernel.numel()
            is_norm = name.startswith(("ln", "rms", "l2"))
            rtol, atol = (NORM_TOL if is_norm else TOL)[dtype]
            torch.testing.assert_close(scalar, kernel.double(), rtol=rtol, atol=atol,
                                       equal_nan=True, msg=lambda m: f"{dtype} {name}: {m}")
    assert pos == flat.numel(), "the scalar program wrote more outputs than the test reads"


def test_shared_math_compiles_as_cuda_device_code(tmp_path):
    """tests/cpp/shared_math_device.cu instantiates every functor and norm formula in CUDA
    kernels, on float and double: nvcc -ptx (device code only, no GPU needed) refuses a call to
    a host-only function from the shared math, and -Werror all-warnings any warning."""
    # 13 activations and 2 norm kernels, each on float and double
    assert compile_ptx("shared_math_device.cu", tmp_path).count(".entry ") == 30


# ---- row tails against the vector body -------------------------------------------------------

WIDTH = 19  # columns 16..18 are a partial vector for every at::vec width (4, 8, 16 lanes)
REPEAT = 3  # the last REPEAT columns repeat the first REPEAT
ROWS = 2 * len(SPECIALS) + 6  # room for the specials in columns 0 and 1
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _repeating(rows, width, dtype, seed, specials=False):
    """Random rows whose last REPEAT columns equal their first REPEAT."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(rows, width, generator=g, dtype=torch.float64) * 3
    if specials:
        sp = torch.tensor(SPECIALS, dtype=torch.float64)
        t[: len(SPECIALS), 0] = sp
        t[len(SPECIALS):2 * len(SPECIALS), 1] = sp
    t[:, width - REPEAT:] = t[:, :REPEAT]
    return t.to(dtype)


def _gated_repeating(rows, half, dtype, seed):
    """[a | b] rows where each half repeats its first columns at its end."""
    return torch.cat([_repeating(rows, half, dtype, seed, specials=True),
                      _repeating(rows, half, dtype, seed + 1)], dim=-1)


def _assert_tail_equals_body(t, what, half=None):
    """Columns -REPEAT: of t (of each half of t) equal columns :REPEAT, NaN included."""
    parts = [t] if half is None else [t[..., :half], t[..., half:]]
    for p in parts:
        torch.testing.assert_close(p[..., -REPEAT:], p[..., :REPEAT], rtol=0, atol=0,
                                   equal_nan=True, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cls", ACTIVATIONS, ids=lambda c: c.__name__)
def test_activation_row_tail_equals_body(cls, dtype):
    rows, stem = ROWS, cls.op_stem
    scaled, gated = cls in SCALED, cls.gated
    params = op_params(cls()) + ((0,) if gated else ())
    scales = (torch.rand(rows, generator=torch.Generator().manual_seed(3)) + 0.5,)
    extra_fwd, extra_bwd = (scales, scales + (True,)) if scaled else ((), ())
    if gated:
        x = _gated_repeating(rows, WIDTH, dtype, 1)
        dy = _repeating(rows, WIDTH, dtype, 5, specials=True)
        half = WIDTH
    else:
        x = _repeating(rows, WIDTH, dtype, 1, specials=True)
        dy = _repeating(rows, WIDTH, dtype, 5, specials=True)
        half = None
    y = getattr(ops, f"{stem}_fwd")(x, *extra_fwd, *params)
    _assert_tail_equals_body(y, f"{stem}_fwd {dtype}")
    dx = getattr(ops, f"{stem}_bwd")(dy, x, *extra_bwd, *params)
    dx = dx[0] if isinstance(dx, tuple) else dx
    _assert_tail_equals_body(dx, f"{stem}_bwd {dtype}", half)
    if cls.fuses_bias_act or cls.fuses_dbias_dact:
        bias = _repeating(1, WIDTH, dtype, 9)[0]
        if cls.fuses_bias_act:
            _assert_tail_equals_body(ops.bias_act_fwd(x, bias, stem), f"bias_act {dtype}")
        if cls.fuses_dbias_dact:
            for b in (None, bias):
                dx, _ = getattr(ops, f"dbias_d{stem}")(dy, x, torch.float32, b)
                _assert_tail_equals_body(dx, f"dbias_d{stem} {dtype} bias={b is not None}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_norm_row_tail_equals_body(dtype):
    rows = ROWS
    x = _repeating(rows, WIDTH, dtype, 1)
    x[3] = 0.0  # a zero row (inf rstd / rnorm with eps = 0)
    dy = _repeating(rows, WIDTH, dtype, 2, specials=True)
    w = _repeating(1, WIDTH, dtype, 3)[0]
    b = _repeating(1, WIDTH, dtype, 4)[0]
    for zc in (False, True):
        for eps in NORM_EPS:
            y, mu, rs = ops.layernorm_fwd(x, w, b, eps, zc)
            _assert_tail_equals_body(y, f"layernorm_fwd {dtype}")
            _assert_tail_equals_body(ops.layernorm_bwd(dy, x, mu, rs, w, zc)[0],
                                     f"layernorm_bwd {dtype}")
            y, rs = ops.rmsnorm_fwd(x, w, eps, zc)
            _assert_tail_equals_body(y, f"rmsnorm_fwd {dtype}")
            _assert_tail_equals_body(ops.rmsnorm_bwd(dy, x, rs, w, zc)[0],
                                     f"rmsnorm_bwd {dtype}")
    for eps in L2_EPS:
        y, rn = ops.l2normalization_fwd(x, eps)
        _assert_tail_equals_body(y, f"l2normalization_fwd {dtype}")
        _assert_tail_equals_body(ops.l2normalization_bwd(dy, x, rn),
                                 f"l2normalization_bwd {dtype}")


# rmsnorm_bwd_add's + dextra is norm_math.h's explicit fma (norm_dx_add); with implicit
# contraction off, a row's tail rounds it as the vector body does.
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rmsnorm_bwd_add_row_tail_equals_body(dtype):
    x = _repeating(ROWS, WIDTH, dtype, 1)
    dy = _repeating(ROWS, WIDTH, dtype, 2, specials=True)
    w = _repeating(1, WIDTH, dtype, 3)[0]
    for zc in (False, True):
        _, rs = ops.rmsnorm_fwd(x, w, 1e-5, zc)
        _assert_tail_equals_body(ops.rmsnorm_bwd_add(dy, x, rs, w, zc, dy)[0],
                                 f"rmsnorm_bwd_add {dtype}")


# ---- the exp-based activations at a realistic size -------------------------------------------

EXP_ACTS = [c for c in ACTIVATIONS
            if c not in SCALED and c.op_stem in ("gelu", "silu", "qgelu", "geglu", "swiglu")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("cls", EXP_ACTS, ids=lambda c: c.__name__)
def test_exp_activations_at_4096x1024_match_float64(cls, dtype):
    """A 4096x1024 step (both threads, every chunk position) of each activation whose kernel
    runs the vector exp: output and input gradient against the float64 reference within the
    dtype's tolerance. The activation's input is spread to +-12, so the sigmoid saturates on
    both sides; a gated op's linear half is standard normal."""
    g = torch.Generator().manual_seed(7)
    x64 = (torch.rand(4096, 1024, generator=g, dtype=torch.float64) - 0.5) * 24
    if cls.gated:
        x64 = torch.cat([x64, torch.randn(4096, 1024, generator=g, dtype=torch.float64)], -1)
    x = x64.to(dtype).requires_grad_()
    dy = torch.randn(4096, 1024, generator=g, dtype=torch.float64).to(dtype)
    op = cls()
    y = te.ops.Sequential(op)(x)
    y.backward(dy)
    xr = x.detach().double().requires_grad_()
    yr = activations.reference(op)(xr)
    yr.backward(dy.double())
    torch.testing.assert_close(y, yr.to(dtype), **tols(dtype))
    torch.testing.assert_close(x.grad, xr.grad.to(dtype), **tols(dtype))
