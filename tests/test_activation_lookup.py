"""The CPU kernels' lookup tables of the exp-based activations for bf16 / fp16 inputs
(csrc/kernels/cpu/act_lookup.h): a call of at least 65536 elements reads act(x), and for the
backward GELU's slope f'(x), or the sigmoid that SiLU, QGELU and sigmoid are made of (SiTU's
sigmoid and tanh), from tables computed once over every 16-bit input value; a smaller call
computes.
The two must agree bit for bit on every input value, for every activation (a table built from
a formula that is not the kernel's, or read where the gradient is not what the table assumes,
shows here), and the tables are built where the kernels say they are. Which calls read the
tables is the CPU's choice (AMD CPUs with the AVX512 kernels read only bf16's backward
tables); these tests make every call read them, so that they test the tables on every CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import transformer_engine_cpp as te
from transformer_engine_cpp import _C
from activations import BIAS_ACT, DBIAS_DACT, GATED, SCALED, UNARY, op_params
from tolerances import COMPILED_VS_EAGER, tols
from transformer_engine_cpp.testing import reference as ref

ops = torch.ops.te_cpp
ROWS = 256  # ROWS x 256 = 65536: every 16-bit pattern once, one row per computed call
DTYPES = [torch.bfloat16, torch.float16]


# the flags of _C.activation_lookup_use
BF16_FORWARD, BF16_BACKWARD, FP16_FORWARD, FP16_BACKWARD, ALL = 1, 2, 4, 8, 15


@pytest.fixture(autouse=True)
def _every_call_reads_tables():
    before = _C.set_activation_lookup_use(ALL)
    yield
    _C.set_activation_lookup_use(before)


def _every_value(dtype):
    """All 65536 values of a 16-bit float dtype (NaNs and infinities included), ROWS x 256."""
    bits = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16)
    return bits.view(dtype).reshape(ROWS, 256)


def _by_rows(fn, *tensors):
    """fn applied to each row of the tensors alone (calls below the table's size: computed),
    the results stacked as one call's; tuples of results stacked element-wise."""
    parts = [fn(*(t[r:r + 1] for t in tensors)) for r in range(tensors[0].shape[0])]
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(p) for p in zip(*parts))
    return torch.cat(parts)


def _assert_same_bits(got, want, what):
    # NaN payloads may differ between a table entry and a fresh computation of the same NaN
    # input, as between any two NaN-producing paths; every other value must match exactly
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), what
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16)), what


def _unary_args(cls):
    return op_params(cls())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls", UNARY, ids=lambda c: c.__name__)
def test_unary_table_call_equals_the_computed_one_on_every_input(cls, dtype):
    stem, params = cls.op_stem, _unary_args(cls)
    x = _every_value(dtype)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    fwd = getattr(ops, f"{stem}_fwd")
    bwd = getattr(ops, f"{stem}_bwd")
    _assert_same_bits(fwd(x, *params), _by_rows(lambda t: fwd(t, *params), x), f"{stem}_fwd")
    _assert_same_bits(bwd(dy, x, *params), _by_rows(lambda d, t: bwd(d, t, *params), dy, x),
                      f"{stem}_bwd")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls", GATED, ids=lambda c: c.__name__)
def test_gated_table_call_equals_the_computed_one_on_every_input(cls, dtype):
    stem, params = cls.op_stem, op_params(cls())
    gen = torch.Generator().manual_seed(1)
    x = torch.cat([_every_value(dtype), torch.randn(ROWS, 256, generator=gen).to(dtype)], 1)
    dy = torch.randn(ROWS, 256, generator=gen).to(dtype)
    fwd = getattr(ops, f"{stem}_fwd")
    bwd = getattr(ops, f"{stem}_bwd")
    _assert_same_bits(fwd(x, *params, 0), _by_rows(lambda t: fwd(t, *params, 0), x),
                      f"{stem}_fwd")
    _assert_same_bits(bwd(dy, x, *params, 0),
                      _by_rows(lambda d, t: bwd(d, t, *params, 0), dy, x), f"{stem}_bwd")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls", sorted(set(BIAS_ACT) | set(DBIAS_DACT), key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
def test_bias_fusions_table_call_equals_the_computed_one_on_every_input(cls, dtype):
    stem = cls.op_stem
    gen = torch.Generator().manual_seed(2)
    # with a bias, z = x + bias rounded: x from every value, bias small, so z covers most
    x = _every_value(dtype)
    bias = (0.01 * torch.randn(256, generator=gen)).to(dtype)
    dy = torch.randn(x.shape, generator=gen).to(dtype)
    if cls in BIAS_ACT:
        _assert_same_bits(ops.bias_act_fwd(x, bias, stem),
                          _by_rows(lambda t: ops.bias_act_fwd(t, bias, stem), x),
                          f"bias_act_fwd {stem}")
    if cls in DBIAS_DACT:
        dbias_dact = getattr(ops, f"dbias_d{stem}")
        for b in (None, bias):
            dx, _ = dbias_dact(dy, x, dtype, b)
            want = _by_rows(lambda d, t: dbias_dact(d, t, dtype, b)[0], dy, x)
            _assert_same_bits(dx, want, f"dbias_d{stem} bias={b is not None}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls", SCALED, ids=lambda c: c.__name__)
def test_scaled_table_call_equals_the_computed_one_on_every_input(cls, dtype):
    """The scaled (MoE) activations, dscales included (a row's sum, the same either way)."""
    stem, params = cls.op_stem, op_params(cls())
    gen = torch.Generator().manual_seed(3)
    x = _every_value(dtype)
    if cls.gated:
        x = torch.cat([x, torch.randn(ROWS, 256, generator=gen).to(dtype)], 1)
        params = (*params, 0)
    dy = torch.randn(ROWS, 256, generator=gen).to(dtype)
    scales = torch.rand(ROWS, generator=gen)
    fwd = getattr(ops, f"{stem}_fwd")
    bwd = getattr(ops, f"{stem}_bwd")
    _assert_same_bits(fwd(x, scales, *params),
                      _by_rows(lambda t, s: fwd(t, s, *params), x, scales), f"{stem}_fwd")
    dx, dscales = bwd(dy, x, scales, True, *params)
    want_dx, want_dscales = _by_rows(lambda d, t, s: bwd(d, t, s, True, *params), dy, x, scales)
    _assert_same_bits(dx, want_dx, f"{stem}_bwd dx")
    torch.testing.assert_close(dscales, want_dscales, rtol=0, atol=0, equal_nan=True,
                               msg=f"{stem}_bwd dscales")


_COUNT_SCRIPT = textwrap.dedent("""
    import torch
    from transformer_engine_cpp import _C
    ops = torch.ops.te_cpp
    built = _C.activation_lookup_tables
    _C.set_activation_lookup_use(15)
    seen = [built()]
    big = torch.randn(256, 256)
    ops.gelu_fwd(big[:255].bfloat16()); seen.append(built())   # 65280 elements: computed
    ops.gelu_fwd(big.bfloat16()); seen.append(built())         # the bf16 GELU value table
    ops.gelu_fwd(big.bfloat16()); seen.append(built())         # kept
    ops.bias_act_fwd(big.bfloat16(), big[0].bfloat16(), "gelu"); seen.append(built())  # shared
    ops.gelu_bwd(big.bfloat16(), big.bfloat16()); seen.append(built())  # the slope table
    ops.geglu_fwd(torch.randn(256, 512).bfloat16()); seen.append(built())  # GELU's, shared
    ops.gelu_fwd(big.half()); seen.append(built())             # fp16's own
    ops.gelu_fwd(big); seen.append(built())                    # fp32: computed
    ops.relu_fwd(big.bfloat16()); seen.append(built())         # ReLU: computed
    ops.silu_bwd(big.bfloat16(), big.bfloat16()); seen.append(built())  # SiLU's sigmoid
    ops.swiglu_fwd(torch.randn(256, 512).bfloat16()); seen.append(built())  # SiLU's values
    ops.swiglu_bwd(big.bfloat16(), torch.randn(256, 512).bfloat16())
    seen.append(built())                                       # SiLU's sigmoid, shared
    ops.srelu_bwd(big.bfloat16(), big.bfloat16()); seen.append(built())  # squared ReLU: none
    wide = torch.randn(256, 512).bfloat16()
    ops.clamped_swiglu_fwd(wide, 7.0, 1.702, 1.0); seen.append(built())  # its configuration's
    ops.clamped_swiglu_fwd(wide, 6.0, 1.702, 1.0); seen.append(built())  # another limit
    ops.clamped_swiglu_fwd(wide, 7.0, 1.702, 1.0); seen.append(built())  # kept
    ops.situglu_fwd(wide, 4.0, 25.0, 0); seen.append(built())  # SiTU's value
    ops.situglu_bwd(big.bfloat16(), wide, 4.0, 25.0, 0); seen.append(built())  # sigmoid, tanh
    ops.situglu_bwd(big.bfloat16(), wide, 4.0, 25.0, 0); seen.append(built())  # kept
    _C.set_activation_lookup_use(2)                            # bf16's backwards only:
    ops.qgelu_fwd(big.bfloat16()); seen.append(built())        # computed
    ops.qgelu_bwd(big.bfloat16(), big.bfloat16()); seen.append(built())  # QGELU's sigmoid
    ops.qgelu_bwd(big.half(), big.half()); seen.append(built())  # fp16: computed
    _C.set_activation_lookup_use(1)                            # bf16's forwards only:
    ops.qgelu_fwd(big.half()); seen.append(built())            # fp16: computed
    ops.qgelu_fwd(big.bfloat16()); seen.append(built())        # QGELU's values
    _C.set_activation_lookup_use(8)                            # fp16's backwards only:
    ops.qgelu_fwd(big.half()); seen.append(built())            # computed
    ops.qgelu_bwd(big.half(), big.half()); seen.append(built())  # fp16's sigmoid
    _C.set_activation_lookup_use(0)                            # none
    ops.glu_fwd(wide, 0); ops.glu_bwd(big.bfloat16(), wide, 0); seen.append(built())
    print(seen)
""")


def test_tables_are_built_once_for_the_calls_that_read_them():
    """In a fresh process: which calls build a table (the size threshold, one table per
    activation function, dtype, kind and configuration, kept for the process; none for fp32 or
    the ReLUs)."""
    res = subprocess.run([sys.executable, "-c", _COUNT_SCRIPT], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str([0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 4, 5, 5, 5, 6, 7, 7, 8, 10,
                                      10, 10, 11, 11, 11, 12, 12, 13, 13])


def _cpu_vendor():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    return None


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads /proc/cpuinfo")
def test_the_cpu_chooses_the_calls_that_read_tables():
    """By default AMD CPUs running the AVX512 kernels (16-lane gathers) read only bf16's
    backward tables, other CPUs and builds every table; -1 returns to that choice, flags
    outside 0-15 are refused."""
    _C.set_activation_lookup_use(-1)
    amd_avx512 = _cpu_vendor() == "AuthenticAMD" and _C.cpu_capability() == "AVX512"
    want = BF16_BACKWARD if amd_avx512 else ALL
    assert _C.activation_lookup_use() == want
    assert _C.set_activation_lookup_use(0) == -1
    assert _C.activation_lookup_use() == 0
    assert _C.set_activation_lookup_use(-1) == 0
    assert _C.activation_lookup_use() == want
    for bad in (-2, 16):
        with pytest.raises(ValueError, match=f"set_activation_lookup_use.*got {bad}"):
            _C.set_activation_lookup_use(bad)


# ---- tables at realistic shapes: row tails, and the pipeline eager, compiled and reference ----

TAIL_ROWS, TAIL = 331, 199  # 331 x 199 >= 65536 elements; rows end in a partial vector


@pytest.mark.parametrize("dtype", DTYPES)
def test_tables_read_row_tails_as_the_computed_path(dtype):
    """Calls over the table's size whose rows (and parallel chunks) end in partial vectors:
    the masked loads of the table paths equal the computed path row by row."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(TAIL_ROWS, TAIL, generator=gen).to(dtype)
    x2 = torch.randn(TAIL_ROWS, 2 * TAIL, generator=gen).to(dtype)
    dy = torch.randn(TAIL_ROWS, TAIL, generator=gen).to(dtype)
    bias = torch.randn(TAIL, generator=gen).to(dtype)
    scales = torch.rand(TAIL_ROWS, generator=gen)
    assert x.numel() >= 2**16
    calls = {
        "gelu_fwd": (lambda t: ops.gelu_fwd(t), x),
        "gelu_bwd": (lambda d, t: ops.gelu_bwd(d, t), dy, x),
        "silu_bwd": (lambda d, t: ops.silu_bwd(d, t), dy, x),
        "bias_act_fwd gelu": (lambda t: ops.bias_act_fwd(t, bias, "gelu"), x),
        "dbias_dgelu": (lambda d, t: ops.dbias_dgelu(d, t, dtype, bias)[0], dy, x),
        "dbias_dsilu": (lambda d, t: ops.dbias_dsilu(d, t, dtype)[0], dy, x),
        "geglu_fwd": (lambda t: ops.geglu_fwd(t), x2),
        "geglu_bwd": (lambda d, t: ops.geglu_bwd(d, t), dy, x2),
        "swiglu_bwd": (lambda d, t: ops.swiglu_bwd(d, t), dy, x2),
        "clamped_swiglu_fwd": (lambda t: ops.clamped_swiglu_fwd(t, 7.0, 1.702, 1.0), x2),
        "scaled_swiglu_fwd": (lambda t, s: ops.scaled_swiglu_fwd(t, s), x2, scales),
        "scaled_swiglu_bwd": (lambda d, t, s: ops.scaled_swiglu_bwd(d, t, s, True), dy, x2, scales),
        "situglu_fwd": (lambda t: ops.situglu_fwd(t, 4.0, 25.0, 0), x2),
        "situglu_bwd": (lambda d, t: ops.situglu_bwd(d, t, 4.0, 25.0, 0), dy, x2),
    }
    for name, (fn, *args) in calls.items():
        got, want = fn(*args), _by_rows(fn, *args)
        for g, w in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,)):
            _assert_same_bits(g.to(dtype), w.to(dtype), name)
    # a non-contiguous input of the table's size reads the tables as its contiguous copy does
    x_t = x.t().contiguous().t()
    assert not x_t.is_contiguous()
    _assert_same_bits(ops.gelu_fwd(x_t), ops.gelu_fwd(x), "gelu_fwd non-contiguous")
    _assert_same_bits(ops.silu_bwd(dy, x_t), ops.silu_bwd(dy, x), "silu_bwd non-contiguous")


def _norm_error(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("use", [ALL, 0], ids=["tables", "computed"])
@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_bf16_step_at_4096x1024_eager_equals_compiled_and_the_reference(act, use):
    """A Linear + activation training step at a realistic size in bf16, every activation kernel
    reading its tables (`tables`) or computing (`computed`, what a CPU that reads no table runs;
    the GELU through ForwardLinearBiasActivation and BackwardActivationBias): compiled
    (aot_eager, fullgraph) equals eager exactly, and against
    the float64 reference each output and gradient is as close as plain PyTorch's bf16 step
    (norm-wise; element-wise, bf16's rounding of the pre-activation alone exceeds the bf16
    tolerance where the activation's slope is steep, for plain PyTorch as for ours)."""
    _C.set_activation_lookup_use(use)
    torch.manual_seed(5)
    out = 2048 if act == "swiglu" else 1024
    model = te.ops.Sequential(te.ops.Linear(1024, out, dtype=torch.bfloat16),
                              te.ops.SwiGLU() if act == "swiglu" else te.ops.GELU())
    x = torch.randn(4096, 1024, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(4096, 1024, dtype=torch.bfloat16)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    results = []
    for fn in (model, compiled):
        xi = x.detach().clone().requires_grad_()
        model.zero_grad(set_to_none=True)
        y = fn(xi)
        y.backward(dy)
        results.append([y, xi.grad] + [p.grad.clone() for p in model.parameters()])
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, **COMPILED_VS_EAGER)

    def plain(dtype):
        xp = x.detach().to(dtype).requires_grad_()
        params = [p.detach().to(dtype).requires_grad_() for p in model.parameters()]
        z = ref.linear(xp, *params)
        y = ref.swiglu(z) if act == "swiglu" else ref.gelu(z)
        y.backward(dy.to(dtype))
        return [y, xp.grad] + [p.grad for p in params]

    for ours, bf16, f64 in zip(results[0], plain(torch.bfloat16), plain(torch.float64)):
        assert _norm_error(ours, f64) <= 2 * _norm_error(bf16, f64) + 1e-6


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_bf16_table_size_calls_under_inference_mode_and_with_frozen_weights(act):
    """The paths a user takes besides training reach the same table-reading kernels at a
    realistic size: under inference_mode and under no_grad the output equals the training
    forward's bit for bit, and with frozen weights (an input that needs a gradient, parameters
    that do not) the output and the input's gradient equal the trainable model's bit for bit,
    with no parameter gradient."""
    torch.manual_seed(6)
    out = 2048 if act == "swiglu" else 1024
    model = te.ops.Sequential(te.ops.Linear(1024, out, dtype=torch.bfloat16),
                              te.ops.SwiGLU() if act == "swiglu" else te.ops.GELU())
    x = torch.randn(4096, 1024, dtype=torch.bfloat16)
    dy = torch.randn(4096, 1024, dtype=torch.bfloat16)

    xt = x.clone().requires_grad_()
    y = model(xt)
    y.backward(dy)
    with torch.inference_mode():
        _assert_same_bits(model(x), y.detach(), f"{act}: inference_mode forward")
    with torch.no_grad():
        _assert_same_bits(model(x), y.detach(), f"{act}: no_grad forward")

    for p in model.parameters():
        p.requires_grad_(False)
        p.grad = None
    xf = x.clone().requires_grad_()
    yf = model(xf)
    yf.backward(dy)
    _assert_same_bits(yf.detach(), y.detach(), f"{act}: frozen-weight forward")
    _assert_same_bits(xf.grad, xt.grad, f"{act}: frozen-weight input gradient")
    assert all(p.grad is None for p in model.parameters())
