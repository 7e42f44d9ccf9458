"""FP8 quantize ops (te_cpp.fp8_quantize, fp8_quantize_scaled, fp8_amax, fp8_current_scale,
fp8_dequantize, mxfp8_quantize, mxfp8_dequantize) against independent plain-PyTorch references,
bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_engine_cpp  # noqa: F401  (registers torch.ops.te_cpp)
from device_code import compile_ptx

te_ops = torch.ops.te_cpp

# the ops name the format by its torch dtype
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
FLT_MAX = torch.finfo(torch.float32).max
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(1,), (7,), (3, 5), (2, 3, 64), (300, 97), (70000,)]


# ---- references (written from te_ops.md 4.3 and TE's MXFP8 rule, torch ops only) ----------------


def ref_scale(amax: torch.Tensor, fmt: torch.dtype, pow2: bool, eps: float) -> torch.Tensor:
    a = torch.where(amax < eps, torch.tensor(eps, dtype=torch.float32), amax)
    special = (a == 0) | torch.isinf(a) | torch.isnan(a)
    scale = torch.tensor(FP8_MAX[fmt], dtype=torch.float32) / a  # fp32, correctly rounded
    scale = torch.where(torch.isinf(scale), torch.tensor(FLT_MAX), scale)
    scale = torch.where(special, torch.tensor(1.0), scale)
    if pow2:
        scale = (scale.view(torch.int32) & -8388608).view(torch.float32)  # & 0xFF800000
    return scale


def ref_cast(xf: torch.Tensor, scale: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    m = FP8_MAX[fmt]
    return (xf * scale).clamp(-m, m).to(fmt).view(torch.uint8)


def ref_amax(xf: torch.Tensor) -> torch.Tensor:
    """max |x| with NaN elements skipped (TransformerEngine's amax kernels reduce with fmaxf from
    0): 0 for an empty or all-NaN tensor."""
    if not xf.numel():
        return torch.tensor(0.0)
    return torch.where(torch.isnan(xf), torch.zeros(()), xf.abs()).amax()


def ref_current(x, fmt, pow2=False, eps=0.0):
    xf = x.float()
    amax = ref_amax(xf)
    scale = ref_scale(amax.reshape(1), fmt, pow2, eps)
    return ref_cast(xf, scale, fmt), torch.reciprocal(scale), amax.reshape(1)


def ref_dequant(data, scale_inv, fmt, dtype):
    return (data.view(fmt).float() * scale_inv).to(dtype)


def ref_e8m0(v: torch.Tensor) -> torch.Tensor:
    """TE float_to_e8m0 for v >= 0: biased exponent of v rounded up to a power of two."""
    bits = v.view(torch.int32)
    exp = bits >> 23
    mant = bits & 0x7FFFFF
    up = (mant > 0) & (exp != 254) & ~((exp == 0) & (mant <= 0x400000))
    e = exp + up.to(torch.int32)
    e = torch.where(torch.isinf(v), torch.tensor(254, dtype=torch.int32), e)
    return e


def ref_mxfp8(x, fmt):
    m = FP8_MAX[fmt]
    xf = x.float().reshape(-1, 32)
    amax = torch.where(torch.isnan(xf), torch.zeros(()), xf.abs()).amax(dim=1)
    v = amax * torch.tensor(1.0 / m, dtype=torch.float32)
    e = ref_e8m0(v)
    rcp = torch.where(e == 0, torch.tensor(1.0), ((254 - e) << 23).view(torch.float32))
    data = (xf * rcp[:, None]).clamp(-m, m).to(fmt).view(torch.uint8)
    return data.reshape(x.shape), e.to(torch.uint8).reshape(*x.shape[:-1], x.shape[-1] // 32)


def ref_mx_dequant(data, scale, fmt, dtype):
    e = scale.to(torch.int32).reshape(-1, 1)
    s = torch.where(e == 0, torch.tensor(2.0 ** -127, dtype=torch.float32),
                    (e << 23).view(torch.float32))
    return (data.view(fmt).float().reshape(-1, 32) * s).reshape(data.shape).to(dtype)


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    if a.is_floating_point():
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        assert torch.equal(nan_a, nan_b)
        a = torch.where(nan_a, torch.zeros((), dtype=a.dtype), a)
        b = torch.where(nan_b, torch.zeros((), dtype=b.dtype), b)
        w = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.view(w), b.view(w)
    assert torch.equal(a, b), f"{(a != b).sum()} of {a.numel()} elements differ"


def assert_fp8_bytes_equal(a: torch.Tensor, b: torch.Tensor, fmt: torch.dtype):
    """Byte equality, with every NaN encoding counted as one value."""
    nan_a = torch.isnan(a.view(fmt).float())
    nan_b = torch.isnan(b.view(fmt).float())
    assert torch.equal(nan_a, nan_b)
    assert torch.equal(a[~nan_a], b[~nan_b]), f"{(a != b).sum()} bytes differ"


def assert_same_bits(a: torch.Tensor, b: torch.Tensor):
    """The same dtype, shape and bytes: NaNs included, with their payloads."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    w = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    a, b = a.contiguous().view(w), b.contiguous().view(w)
    assert torch.equal(a, b), f"{(a != b).sum()} of {a.numel()} elements differ"


def randn(shape, dtype, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


# ---- current scaling --------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_current_scaling_matches_reference(shape, dtype, fmt):
    for seed, scale in enumerate([1.0, 1e-3, 300.0]):
        x = randn(shape, dtype, scale, seed)
        data, scale_inv, amax = te_ops.fp8_quantize(x, fmt, False, 0.0)
        rdata, rscale_inv, ramax = ref_current(x, fmt)
        assert data.dtype == torch.uint8 and data.shape == x.shape
        assert scale_inv.shape == (1,) and amax.shape == (1,)
        assert_bits_equal(data, rdata)
        assert_bits_equal(scale_inv, rscale_inv)
        assert_bits_equal(amax, ramax)
        y = te_ops.fp8_dequantize(data, scale_inv, fmt, dtype)
        assert_bits_equal(y, ref_dequant(data, scale_inv, fmt, dtype))


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("pow2", [False, True], ids=["fp32scale", "pow2"])
@pytest.mark.parametrize("eps", [0.0, 1e-2, 10.0])
def test_current_scaling_pow2_and_epsilon(fmt, pow2, eps):
    for x in [randn((33, 17), torch.float32, 1.0, 3), randn((33, 17), torch.float32, 1e-4, 4),
              torch.zeros(5, 8)]:
        data, scale_inv, amax = te_ops.fp8_quantize(x, fmt, pow2, eps)
        rdata, rscale_inv, ramax = ref_current(x, fmt, pow2, eps)
        assert_bits_equal(data, rdata)
        assert_bits_equal(scale_inv, rscale_inv)
        assert_bits_equal(amax, ramax)  # the tensor's own amax, before the epsilon floor
        if pow2:
            m, _ = math.frexp(1.0 / scale_inv.item())
            assert m == 0.5  # a power of two


def test_current_scaling_epsilon_floors_amax():
    x = torch.full((4,), 1e-3)
    _, scale_inv, amax = te_ops.fp8_quantize(x, E4M3, False, 0.5)
    assert amax.item() == pytest.approx(1e-3)
    assert scale_inv.item() == torch.reciprocal(torch.tensor(448.0) / torch.tensor(0.5)).item()


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_current_scaling_special_values(fmt):
    cases = {
        "zeros": torch.zeros(3, 40),
        "empty": torch.zeros(0, 8),
        "inf": torch.tensor([1.0, -float("inf"), 2.0, 0.5]),
        "nan": torch.tensor([1.0, float("nan"), -3.0, 0.25]),
        "all-nan": torch.full((3, 5), float("nan")),
        "tiny": torch.tensor([1e-40, -2e-45, 0.0]),  # 448 / amax overflows: FLT_MAX
    }
    for name, x in cases.items():
        data, scale_inv, amax = te_ops.fp8_quantize(x, fmt, False, 0.0)
        rdata, rscale_inv, ramax = ref_current(x, fmt)
        assert_fp8_bytes_equal(data, rdata, fmt)
        assert_bits_equal(scale_inv, rscale_inv)
        assert_bits_equal(amax, ramax)
    for name in ("zeros", "empty", "inf", "all-nan"):
        _, scale_inv, _ = te_ops.fp8_quantize(cases[name], fmt, False, 0.0)
        assert scale_inv.item() == 1.0, name
    _, scale_inv, _ = te_ops.fp8_quantize(cases["tiny"], fmt, False, 0.0)
    assert scale_inv.item() == torch.reciprocal(torch.tensor(FLT_MAX)).item()  # scale = FLT_MAX
    # inf saturates to the format's max; NaN stays NaN
    data, _, _ = te_ops.fp8_quantize(cases["inf"], fmt, False, 0.0)
    assert data.view(fmt).float()[1].item() == -FP8_MAX[fmt]
    # NaN stays NaN and is skipped by the amax: the scale comes from the finite values
    data, scale_inv, amax = te_ops.fp8_quantize(cases["nan"], fmt, False, 0.0)
    assert torch.isnan(data.view(fmt).float()[1]) and amax.item() == 3.0
    assert scale_inv.item() == torch.reciprocal(torch.tensor(FP8_MAX[fmt]) / 3.0).item()
    _, _, amax = te_ops.fp8_quantize(cases["all-nan"], fmt, False, 0.0)
    assert amax.item() == 0.0


def _with_nans(x: torch.Tensor, seed: int):
    """x with NaNs (both signs) at a few positions spread over the tensor (several amax blocks of
    a large one, vector bodies and tails), and x with zeros there instead."""
    n = x.numel()
    g = torch.Generator().manual_seed(seed)
    pos = torch.unique(torch.cat([torch.tensor([0, n - 1, n // 2]),
                                  torch.randint(0, n, (5,), generator=g)]))
    xnan, xzero = x.clone(), x.clone()
    nan = torch.full((len(pos),), float("nan"), dtype=x.dtype)
    nan[::2] = -nan[::2]
    xnan.view(-1)[pos] = nan
    xzero.view(-1)[pos] = 0
    return xnan, xzero, pos


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES + [torch.float64], ids=["fp32", "bf16", "fp16", "fp64"])
@pytest.mark.parametrize("shape", [(1,), (7,), (33, 17), (2, 3, 64), (70000,)], ids=str)
def test_nan_changes_only_its_own_code_per_tensor(shape, dtype, fmt):
    """TransformerEngine's per-tensor amax (current scaling's amax kernel, and the amax the cast
    records for delayed scaling) reduces with fmaxf, which skips NaN: a NaN element becomes a NaN
    code and the amax, scale and every other code are those of the tensor with a 0 there."""
    x = randn(shape, dtype, 3.0, 1)
    xnan, xzero, pos = _with_nans(x, 2)
    data, scale_inv, amax = te_ops.fp8_quantize(xnan, fmt, False, 0.0)
    zdata, zscale_inv, zamax = te_ops.fp8_quantize(xzero, fmt, False, 0.0)
    assert_same_bits(amax, zamax)
    assert_same_bits(scale_inv, zscale_inv)
    assert_same_bits(te_ops.fp8_amax(xnan), zamax)
    codes = data.view(-1).view(fmt).float()
    assert torch.isnan(codes[pos]).all()
    keep = torch.ones(data.numel(), dtype=torch.bool)
    keep[pos] = False
    assert torch.equal(data.view(-1)[keep], zdata.view(-1)[keep])
    if fmt == E4M3:  # the public plain-PyTorch reference (bench, users' checks) agrees
        from transformer_engine_cpp.testing import reference
        rdata, rscale_inv, ramax = reference.fp8_quantize_current_scaling(xnan)
        assert_fp8_bytes_equal(rdata, data, fmt)
        assert_same_bits(rscale_inv, scale_inv)
        assert_same_bits(ramax, amax)
    # delayed scaling: the amax recorded for the history skips NaN too
    scale = torch.tensor([0.37])
    sdata, _, samax = te_ops.fp8_quantize_scaled(xnan, scale, fmt)
    assert_same_bits(samax, zamax)
    assert torch.isnan(sdata.view(-1).view(fmt).float()[pos]).all()
    assert torch.equal(sdata.view(-1)[keep],
                       te_ops.fp8_quantize_scaled(xzero, scale, fmt)[0].view(-1)[keep])


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
def test_nan_changes_only_its_own_code_blockwise(dtype):
    """MXFP8, Float8BlockScaling (1x128 and 128x128) and NVFP4 skip NaN in their block amaxes
    (and NVFP4 in its per-tensor amax): with a NaN instead of a 0, only that element's code
    differs (a NaN code: MXFP8 and Float8BlockScaling keep NaN; NVFP4 maps it to its largest
    code), the scales are the same."""
    x = randn((130, 256), dtype, 3.0, 3)
    xnan, xzero, pos = _with_nans(x, 4)
    keep = torch.ones(x.numel(), dtype=torch.bool)
    keep[pos] = False
    runs = {
        "mxfp8": lambda t: te_ops.mxfp8_quantize(t, E4M3),
        "block1d": lambda t: te_ops.fp8_block_quantize(t, E4M3, 1, False, 0.0),
        "block2d": lambda t: te_ops.fp8_block_quantize(t, E4M3, 2, False, 0.0),
        "nvfp4": lambda t: te_ops.nvfp4_quantize(t, False, False, None),
        "nvfp4-2d": lambda t: te_ops.nvfp4_quantize(t, False, True, None),
    }
    for name, run in runs.items():
        got, want = run(xnan), run(xzero)
        for a, b in zip(got[1:], want[1:]):  # scales (and NVFP4's amax)
            assert_same_bits(a, b)
        if name.startswith("nvfp4"):  # two codes per byte: compare the unpacked codes
            lo = lambda d: torch.stack([d & 0xF, d >> 4], -1).reshape(-1)  # noqa: E731
            assert torch.equal(lo(got[0])[keep], lo(want[0])[keep]), name
        else:
            assert torch.equal(got[0].view(-1)[keep], want[0].view(-1)[keep]), name
            assert torch.isnan(got[0].view(-1)[pos].view(E4M3).float()).all(), name


def test_current_scaling_fp64_input_is_rounded_to_fp32():
    x = torch.randn(5, 33, dtype=torch.float64)
    got = te_ops.fp8_quantize(x, E4M3, False, 0.0)
    for a, b in zip(got, ref_current(x.float(), E4M3)):
        assert_bits_equal(a, b)


def test_current_scaling_thread_count_independent():
    x = randn((257, 1031), torch.bfloat16, 5.0, 7)
    xnan = randn((300, 1031), torch.float32, 5.0, 8)
    xnan.view(-1)[[5, 70000, 300000]] = float("nan")  # NaNs in several amax blocks
    before = torch.get_num_threads()

    def run():
        return (*te_ops.fp8_quantize(x, E4M3, False, 0.0), te_ops.fp8_amax(x),
                te_ops.fp8_amax(xnan))

    try:
        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(max(2, before))
        many = run()
    finally:
        torch.set_num_threads(before)
    for a, b in zip(one, many):
        assert_same_bits(a, b)


# ---- current scaling in three steps: fp8_amax, fp8_current_scale, fp8_quantize_scaled ---------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]

SPLIT_SHAPES = [(0,), (0, 8), (1,), (7,), (3, 5), (2, 3, 64), (70000,), (4096, 1024)]


def _split_inputs(shape, dtype):
    """Random values at a few magnitudes, and with a NaN, an inf, or all zeros."""
    xs = [randn(shape, dtype, scale, seed) for seed, scale in enumerate([1.0, 3e-3, 200.0])]
    xs.append(torch.zeros(shape, dtype=dtype))
    n = xs[0].numel()
    for special in (float("nan"), -float("inf")):
        if n:
            x = randn(shape, dtype, 2.0, 9)
            x.view(-1)[n // 2] = special
            xs.append(x)
    return xs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=str)
def test_split_current_scaling_equals_fp8_quantize(shape, dtype, device):
    """amax = fp8_amax(x); scale = fp8_current_scale(amax, ...); fp8_quantize_scaled(x, scale)
    gives fp8_quantize(x, ...)'s data, scale_inv and amax bit for bit (NaN payloads included),
    so an amax reduced over a process group in between gives TransformerEngine's amax-reduced
    current scaling."""
    for x in _split_inputs(shape, dtype):
        x = x.to(device)
        amax = te_ops.fp8_amax(x)
        assert amax.dtype == torch.float32 and amax.shape == (1,) and amax.device == x.device
        for fmt in (E4M3, E5M2):
            for pow2, eps in [(False, 0.0), (True, 0.0), (False, 1e-2), (True, 1e-2)]:
                scale = te_ops.fp8_current_scale(amax, fmt, pow2, eps)
                assert scale.dtype == torch.float32 and scale.shape == (1,)
                assert scale.device == x.device
                split = te_ops.fp8_quantize_scaled(x, scale, fmt)
                whole = te_ops.fp8_quantize(x, fmt, pow2, eps)
                for a, b in zip(split, whole):
                    assert_same_bits(a, b)
                assert_same_bits(amax, whole[2])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES + [torch.float64], ids=["fp32", "bf16", "fp16", "fp64"])
def test_fp8_amax_matches_reference(dtype, device):
    for shape in [(0, 3), (1,), (9, 70), (300, 97)]:
        for x in _split_inputs(shape, dtype):
            got = te_ops.fp8_amax(x.to(device)).cpu()
            _, _, want = ref_current(x.float(), E4M3)
            assert_bits_equal(got, want)


AMAX_VALUES = [0.0, -0.0, 1e-45, 1e-40, 1e-30, 1e-3, 0.37, 1.0, 448.0, 57344.0, 3e38,
               float("inf"), float("nan")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_fp8_current_scale_matches_reference(fmt, device):
    for v in AMAX_VALUES:
        for pow2 in (False, True):
            for eps in (0.0, 1e-2, 10.0):
                want = ref_scale(torch.tensor([v]), fmt, pow2, eps)
                for amax in (torch.tensor([v]), torch.tensor(v), torch.tensor([[v]])):
                    got = te_ops.fp8_current_scale(amax.to(device), fmt, pow2, eps)
                    assert got.shape == (1,)
                    assert_bits_equal(got.cpu(), want)


def test_split_current_scaling_bad_inputs():
    x = torch.randn(4, 64)
    amax = torch.ones(1)
    cases = [
        (lambda: te_ops.fp8_amax(x.to(torch.int32)), RuntimeError,
         r"te_cpp\.fp8_amax: input must be float32, float64, bfloat16 or float16, got Int"),
        (lambda: te_ops.fp8_current_scale(amax.double(), E4M3, False, 0.0), RuntimeError,
         r"te_cpp\.fp8_current_scale: amax must be float32, got Double"),
        (lambda: te_ops.fp8_current_scale(torch.ones(2), E4M3, False, 0.0), RuntimeError,
         r"te_cpp\.fp8_current_scale: amax must have exactly one element, got shape \[2\]"),
        (lambda: te_ops.fp8_current_scale(torch.ones(0), E4M3, False, 0.0), RuntimeError,
         r"te_cpp\.fp8_current_scale: amax must have exactly one element, got shape \[0\]"),
        (lambda: te_ops.fp8_current_scale(amax, E4M3, False, -1.0), ValueError,
         r"te_cpp\.fp8_current_scale: amax_epsilon must be >= 0 and finite, got -1"),
        (lambda: te_ops.fp8_current_scale(amax, E4M3, False, float("nan")), ValueError,
         r"te_cpp\.fp8_current_scale: amax_epsilon must be >= 0 and finite, got nan"),
        (lambda: te_ops.fp8_current_scale(amax, E4M3, False, float("inf")), ValueError,
         r"te_cpp\.fp8_current_scale: amax_epsilon must be >= 0 and finite, got inf"),
    ]
    for device in ("cpu", "meta"):  # the Meta kernels share the checks
        x, amax = x.to(device), amax.to(device)
        for call, exc, msg in cases:
            with pytest.raises(exc, match=msg):
                call()


def test_compiled_split_current_scaling_matches_eager():
    torch._dynamo.reset()

    def f(x):
        amax = te_ops.fp8_amax(x)
        scale = te_ops.fp8_current_scale(amax, E4M3, True, 1e-3)
        return te_ops.fp8_quantize_scaled(x, scale, E4M3)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for shape in [(4, 64), (3, 5, 32), (0, 8)]:
        x = torch.randn(shape)
        for a, b in zip(compiled(x), f(x)):
            assert_same_bits(a, b)
    torch._dynamo.reset()


# ---- delayed scaling's cast -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
def test_quantize_scaled_matches_reference(dtype, fmt):
    x = randn((9, 70), dtype, 4.0, 1)
    for s in [1.0, 0.37, 100.0, 1e6]:  # large scales overflow: saturate to +-fp8_max
        scale = torch.tensor([s], dtype=torch.float32)
        data, scale_inv, amax = te_ops.fp8_quantize_scaled(x, scale, fmt)
        assert_bits_equal(data, ref_cast(x.float(), scale, fmt))
        assert_bits_equal(scale_inv, torch.reciprocal(scale))
        assert_bits_equal(amax, x.float().abs().amax().reshape(1))
    data, _, _ = te_ops.fp8_quantize_scaled(x, torch.tensor([1e6]), fmt)
    assert data.view(fmt).float().abs().max().item() == FP8_MAX[fmt]


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_quantize_scaled_every_bf16_pattern_and_random_fp32_bits(fmt):
    """The vectorised fp32 cast's bytes against the reference over every bf16 bit pattern as
    fp32 (every binade, the FP8 rounding ties, denormals both of fp32 and of the format, inf and
    NaN, either sign) and a million random fp32 bit patterns, in vector-sized runs and a tail."""
    g = torch.Generator().manual_seed(9)
    every = (torch.arange(65536, dtype=torch.int32) << 16).view(torch.float32)
    wild = torch.randint(-2**31, 2**31, (1 << 20,), generator=g, dtype=torch.int64)
    x = torch.cat([every, wild.to(torch.int32).view(torch.float32), every[:13]])
    for s in [1.0, 2.0 ** -10, 3.0]:
        scale = torch.tensor([s])
        data, _, _ = te_ops.fp8_quantize_scaled(x, scale, fmt)
        assert_fp8_bytes_equal(data, ref_cast(x, scale, fmt), fmt)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_dequantize_dtypes(dtype):
    data = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    for fmt in (E4M3, E5M2):
        scale_inv = torch.tensor([0.125])
        got = te_ops.fp8_dequantize(data, scale_inv, fmt, dtype)
        assert got.dtype == dtype
        assert_bits_equal(got, ref_dequant(data, scale_inv, fmt, dtype))


# the dequantize kernels' multipliers: ordinary, small enough for fp32 denormal products (the
# bfloat16 rounding of those), fp32 denormal, huge (256 s overflows fp32), zero (0 * inf), and
# not finite (the scalar path)
EDGE_SCALES = [1.0, 0.37, -1.5, 2.0 ** -117, 2.0 ** -118, 2.0 ** -126, 2.0 ** -140, 1e-45,
               2.0 ** 120, 3e38, 0.0, float("inf"), float("nan")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16],
                         ids=["fp32", "fp64", "bf16", "fp16"])
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_dequantize_every_byte_and_edge_scales(fmt, dtype):
    """Every byte value (NaN and, for E5M2, inf included) in shuffled order over an odd count
    (whole vectors with and without a NaN lane, then a tail), times each multiplier."""
    g = torch.Generator().manual_seed(3)
    data = torch.arange(256, dtype=torch.uint8).repeat(4)
    data = data[torch.randperm(data.numel(), generator=g)][:1013]
    data[:64] = torch.arange(64, dtype=torch.uint8)  # NaN-free vectors first (E4M3 and E5M2)
    for s in EDGE_SCALES:
        scale_inv = torch.tensor([s])
        got = te_ops.fp8_dequantize(data, scale_inv, fmt, dtype)
        assert_bits_equal(got, ref_dequant(data, scale_inv, fmt, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16],
                         ids=["fp32", "fp64", "bf16", "fp16"])
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_mxfp8_dequantize_every_byte_and_edge_exponents(fmt, dtype):
    """Every byte value under block exponents from 0 (the subnormal 2^-127) to 254, and 255."""
    g = torch.Generator().manual_seed(4)
    data = torch.arange(256, dtype=torch.uint8).repeat(4)
    data = data[torch.randperm(data.numel(), generator=g)].reshape(4, 256)
    scale = torch.randint(0, 256, (4, 8), dtype=torch.uint8, generator=g)
    scale[0] = torch.tensor([0, 1, 2, 10, 11, 18, 254, 255], dtype=torch.uint8)
    got = te_ops.mxfp8_dequantize(data, scale, fmt, dtype)
    want = ref_mx_dequant(data, scale, fmt, torch.float32)
    nan_scale = (scale == 255).repeat_interleave(32, dim=1)
    want = torch.where(nan_scale, torch.tensor(float("nan")), want).to(dtype)
    assert_bits_equal(got, want)


# ---- MXFP8 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", [(32,), (3, 64), (2, 5, 96), (129, 320)], ids=str)
def test_mxfp8_matches_reference(shape, dtype, fmt):
    g = torch.Generator().manual_seed(11)
    # per-block magnitudes spread over many binades, so the scales differ block to block
    mags = torch.exp2(torch.randint(-20, 20, (*shape[:-1], shape[-1] // 32, 1), generator=g))
    x = (torch.randn((*shape[:-1], shape[-1] // 32, 32), generator=g) * mags).reshape(shape)
    x = x.to(dtype)
    data, scale = te_ops.mxfp8_quantize(x, fmt)
    rdata, rscale = ref_mxfp8(x, fmt)
    assert scale.dtype == torch.uint8 and scale.shape == (*shape[:-1], shape[-1] // 32)
    assert_bits_equal(scale, rscale)
    assert_bits_equal(data, rdata)
    y = te_ops.mxfp8_dequantize(data, scale, fmt, dtype)
    assert_bits_equal(y, ref_mx_dequant(data, scale, fmt, dtype))


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES + [torch.float64], ids=["fp32", "bf16", "fp16", "fp64"])
@pytest.mark.parametrize("rows,cols", [(32, 16), (96, 37), (64, 1000), (160, 7), (32, 1),
                                       (1184, 40)], ids=str)
def test_mxfp8_of_a_transposed_view(rows, cols, dtype, fmt):
    """x.t() of a row-major [rows, cols] (the MXFP8 quantizer's columnwise copy) is read in
    place by the CPU kernel, in tiles of 16 (AVX512) or 8 (AVX2) columns by 64 or 32 rows and
    a gathered tail, in passes of 16 bands of 32 rows (1184 rows: two whole passes and one of
    5 bands, and with two threads a task starting at an odd band): the same bytes as the
    reference on the transposed copy, over spread magnitudes, zeros, inf, NaN and denormals."""
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    x = torch.randn(rows, cols, generator=g)
    x = x * torch.exp2(torch.randint(-30, 30, (rows, cols), generator=g).float())
    special = torch.tensor([0.0, float("inf"), -float("inf"), float("nan"), 1e-40, 3e38])
    idx = torch.randint(0, x.numel(), (max(1, x.numel() // 40),), generator=g)
    x.view(-1)[idx] = special[torch.randint(0, special.numel(), idx.shape, generator=g)]
    x[:32, :1] = 0.0  # an all-zero block
    x = x.to(dtype)
    xt = x.t()
    assert xt.stride() == (1, cols)
    data, scale = te_ops.mxfp8_quantize(xt, fmt)
    rdata, rscale = ref_mxfp8(xt.contiguous(), fmt)
    assert_bits_equal(scale, rscale)
    assert_fp8_bytes_equal(data, rdata, fmt)
    cdata, cscale = te_ops.mxfp8_quantize(xt.contiguous(), fmt)
    assert torch.equal(data, cdata) and torch.equal(scale, cscale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mxfp8_of_a_transposed_view_at_a_realistic_size(dtype):
    """The columnwise copy of a 4096x1024 activation (128 bands: 8 passes of 16 bands, split
    between the threads) with per-row magnitudes over many binades and a few NaN, inf and zero
    elements: the same bytes as the reference on the transposed copy."""
    g = torch.Generator().manual_seed(4096)
    x = torch.randn(4096, 1024, generator=g)
    x = x * torch.exp2(torch.randint(-12, 12, (4096, 1), generator=g).float())
    idx = torch.randint(0, x.numel(), (64,), generator=g)
    x.view(-1)[idx[:16]] = float("nan")
    x.view(-1)[idx[16:24]] = float("inf")
    x.view(-1)[idx[24:]] = 0.0
    x = x.to(dtype)
    xt = x.t()
    data, scale = te_ops.mxfp8_quantize(xt, E4M3)
    rdata, rscale = ref_mxfp8(xt.contiguous(), E4M3)
    assert_bits_equal(scale, rscale)
    assert_fp8_bytes_equal(data, rdata, E4M3)


def _bf16_blocks(nblocks, seed, wild):
    """nblocks MXFP8 blocks of bf16 built from bit patterns: per block a top binade, elements
    up to a per-block 4 to 32 binades below it (across both formats' FP8 denormal boundaries)
    with every 7-bit mantissa (ties of the FP8 rounding included) and either sign; zeros and
    bf16 denormals; with wild, NaN, inf and blocks whose maximum is huge or tiny (a scale e
    outside the bf16 fast path's range)."""
    g = torch.Generator().manual_seed(seed)
    n = nblocks * 32
    top = torch.randint(127 - 100, 127 + 100, (nblocks, 1), generator=g)
    if wild:
        top = torch.randint(1, 255, (nblocks, 1), generator=g)
    spread = torch.randint(4, 33, (nblocks, 1), generator=g)
    below = (torch.rand(nblocks, 32, generator=g) * (spread + 1)).long()
    exp = (top - below).clamp(0, 254).reshape(-1)
    bits = (torch.randint(0, 2, (n,), generator=g) << 15) | (exp << 7) | torch.randint(
        0, 128, (n,), generator=g)
    pick = torch.rand(n, generator=g)
    bits = torch.where(pick < 0.05, bits & 0x8000, bits)  # signed zeros
    bits = torch.where((pick >= 0.05) & (pick < 0.051), bits & 0x807F, bits)  # denormals
    if wild:
        bits = torch.where((pick >= 0.10) & (pick < 0.105), 0x7FC1 | (bits & 0x8000), bits)
        bits = torch.where((pick >= 0.105) & (pick < 0.107), 0x7F80 | (bits & 0x8000), bits)
    x = bits.to(torch.int16).view(torch.bfloat16).reshape(nblocks, 32)
    x[::97] = 0.0  # all-zero blocks
    return x.reshape(-1, 256)


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("wild", [False, True], ids=["in_range", "wild"])
def test_mxfp8_bf16_bit_patterns(fmt, wild):
    """bf16 MXFP8 (the CPU kernel works on bf16 as 16-bit lanes, taking the fp32 path for the
    blocks it cannot: FP8 denormals, inf and tiny block maxima): the reference's bytes and
    scales over 4096 blocks of bit-pattern-built values, with rounding ties, zeros, denormals
    and, in the wild set, NaN, inf and extreme scales."""
    x = _bf16_blocks(4096, 3 if wild else 2, wild)
    data, scale = te_ops.mxfp8_quantize(x, fmt)
    rdata, rscale = ref_mxfp8(x, fmt)
    assert_bits_equal(scale, rscale)
    assert_fp8_bytes_equal(data, rdata, fmt)


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_mxfp8_scale_fits_block_amax(fmt):
    """The rule's intent: block_amax * 2^-(e-127) lies in (fp8_max/2, fp8_max]."""
    x = randn((64, 256), torch.float32, 3.0, 5) * torch.exp2(torch.randint(-30, 30, (64, 1)))
    _, scale = te_ops.mxfp8_quantize(x, fmt)
    amax = x.abs().reshape(64, 8, 32).amax(-1)
    scaled = amax * torch.exp2(127.0 - scale.double())
    assert (scaled <= FP8_MAX[fmt]).all() and (scaled > FP8_MAX[fmt] / 2).all()


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_mxfp8_special_blocks(fmt):
    x = torch.randn(6, 32)
    x[0] = 0.0                       # zero block: e = 0, data 0
    x[1, 3] = float("nan")           # NaN is ignored by the block amax and stays NaN
    x[2, 5] = float("inf")           # inf block: e = 254
    x[3] = 1e-39                     # subnormal amax
    x[4] = FP8_MAX[fmt] * 2.0 ** 5   # exactly a power of two times fp8_max
    x[5] = torch.finfo(torch.float32).max
    data, scale = te_ops.mxfp8_quantize(x, fmt)
    rdata, rscale = ref_mxfp8(x, fmt)
    assert_bits_equal(scale, rscale)
    assert_fp8_bytes_equal(data, rdata, fmt)
    assert scale[0, 0].item() == 0 and scale[2, 0].item() == 254
    assert scale[4, 0].item() == 127 + 5
    assert torch.isnan(data[1].view(fmt).float()[3])
    assert not torch.isnan(data[1].view(fmt).float()[torch.arange(32) != 3]).any()


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
def test_mxfp8_special_blocks_at_every_position_of_a_group(dtype, fmt):
    """The vector kernels take 16 (AVX512) or 8 (AVX2) consecutive blocks at once, their maxima
    side by side in one register: each special block of test_mxfp8_special_blocks, and the
    two blocks at float_to_e8m0's subnormal boundary (a scale of 0 or 1), at every position of
    such a group among ordinary blocks of spread magnitudes, give the reference's bytes and
    scales (and a tail of 5 blocks after the last whole group)."""
    g = torch.Generator().manual_seed(23)
    kinds = 8
    # the two float32 neighbours of 2^-127 * fp8_max whose products are 0x00400000, 0x00400001
    rcp = torch.tensor(1.0 / FP8_MAX[fmt], dtype=torch.float64).float()
    near = torch.tensor(2.0 ** -127 * FP8_MAX[fmt]).view(torch.int32) + torch.arange(-8, 9)
    near = near.to(torch.int32).view(torch.float32)
    prod = (near * rcp).view(torch.int32)
    edge = [near[prod == 0x400000][0].item(), near[prod == 0x400001][0].item()]
    nblocks = kinds * 16 * 16 + 5
    mags = torch.exp2(torch.randint(-20, 20, (nblocks, 1), generator=g).float())
    x = torch.randn(nblocks, 32, generator=g) * mags
    for k in range(kinds):
        for pos in range(16):
            b = (k * 16 + pos) * 16 + pos  # group k * 16 + pos, its block pos
            if k == 0:
                x[b] = 0.0
            elif k == 1:
                x[b, 7] = float("nan")
            elif k == 2:
                x[b, 30] = -float("inf")
            elif k == 3:
                x[b] = 1e-39
            elif k == 4:
                x[b] = FP8_MAX[fmt] * 2.0 ** -9
            elif k == 5:
                x[b, 1] = torch.finfo(torch.float32).max
            else:  # amax * float(1 / fp8_max) exactly 2^-127 (scale 0), or just above (1)
                x[b] = 0.0
                x[b, 9] = edge[k - 6]
    x = x.to(dtype)
    data, scale = te_ops.mxfp8_quantize(x, fmt)
    rdata, rscale = ref_mxfp8(x, fmt)
    assert_bits_equal(scale, rscale)
    assert_fp8_bytes_equal(data, rdata, fmt)


def test_mxfp8_e4m3_known_value():
    x = torch.zeros(32)
    x[0] = 1.0  # amax/448 = 2^-8.8 -> rounded up to 2^-8: e = 119, data = 256 in E4M3
    data, scale = te_ops.mxfp8_quantize(x, E4M3)
    assert scale.item() == 119
    assert data.view(torch.float8_e4m3fn).float()[0].item() == 256.0


# ---- errors ------------------------------------------------------------------------------------


def test_bad_inputs():
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="te_cpp.fp8_quantize: amax_epsilon must be >= 0"):
        te_ops.fp8_quantize(x, E4M3, False, -1.0)
    with pytest.raises(RuntimeError, match="te_cpp.fp8_quantize: input must be float32"):
        te_ops.fp8_quantize(x.to(torch.int32), E4M3, False, 0.0)
    with pytest.raises(RuntimeError, match=r"te_cpp.fp8_quantize_scaled: scale must have shape \[1\]"):
        te_ops.fp8_quantize_scaled(x, torch.ones(2), E4M3)
    with pytest.raises(RuntimeError, match="te_cpp.fp8_quantize_scaled: scale must be float32"):
        te_ops.fp8_quantize_scaled(x, torch.ones(1, dtype=torch.float64), E4M3)
    data, scale_inv, _ = te_ops.fp8_quantize(x, E4M3, False, 0.0)
    with pytest.raises(RuntimeError, match="te_cpp.fp8_dequantize: data must be uint8"):
        te_ops.fp8_dequantize(x, scale_inv, E4M3, torch.float32)
    with pytest.raises(ValueError, match="te_cpp.fp8_dequantize: dtype must be"):
        te_ops.fp8_dequantize(data, scale_inv, E4M3, torch.int32)
    with pytest.raises(RuntimeError, match=r"te_cpp.mxfp8_quantize: input's last dimension must be "
                                           r"a multiple of 32.*\[4, 48\]"):
        te_ops.mxfp8_quantize(torch.randn(4, 48), E4M3)
    mx, sc = te_ops.mxfp8_quantize(x, E4M3)
    with pytest.raises(RuntimeError, match="te_cpp.mxfp8_dequantize: scale_e8m0 must have shape"):
        te_ops.mxfp8_dequantize(mx, sc[:, :1], E4M3, torch.float32)


_BAD_FP8_DTYPES = [torch.float32, torch.bfloat16, torch.uint8, torch.float8_e4m3fnuz,
                   torch.float8_e5m2fnuz]


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("bad", _BAD_FP8_DTYPES, ids=str)
def test_wrong_fp8_dtype_is_rejected(bad, device):
    """Every quantize op takes the format as its torch dtype; any dtype but float8_e4m3fn and
    float8_e5m2 is a RuntimeError naming the op and the dtype, from the CPU and the Meta
    kernel alike (they share the check)."""
    x = torch.randn(4, 64, device=device)
    data = torch.zeros(4, 64, dtype=torch.uint8, device=device)
    scale = torch.ones(1, device=device)
    e8m0 = torch.full((4, 2), 127, dtype=torch.uint8, device=device)
    calls = {
        "fp8_quantize": lambda: te_ops.fp8_quantize(x, bad, False, 0.0),
        "fp8_quantize_scaled": lambda: te_ops.fp8_quantize_scaled(x, scale, bad),
        "fp8_current_scale": lambda: te_ops.fp8_current_scale(scale, bad, False, 0.0),
        "fp8_dequantize": lambda: te_ops.fp8_dequantize(data, scale, bad, torch.float32),
        "mxfp8_quantize": lambda: te_ops.mxfp8_quantize(x, bad),
        "mxfp8_dequantize": lambda: te_ops.mxfp8_dequantize(data, e8m0, bad, torch.float32),
    }
    name = str(bad).replace(".", r"\.")
    for op, call in calls.items():
        with pytest.raises(RuntimeError, match=rf"te_cpp\.{op}: fp8_dtype must be "
                                               rf"torch\.float8_e4m3fn or torch\.float8_e5m2, "
                                               rf"got {name}$"):
            call()


def test_format_is_a_scalar_type_in_the_schemas():
    """The format argument is a ScalarType named fp8_dtype in every quantize schema."""
    for op in ("fp8_quantize", "fp8_quantize_scaled", "fp8_current_scale", "fp8_dequantize",
               "mxfp8_quantize", "mxfp8_dequantize"):
        args = {a.name: str(a.real_type) for a in getattr(te_ops, op).default._schema.arguments}
        assert args.get("fp8_dtype") == "ScalarType", (op, args)
        assert "fp8_format" not in args


# ---- torch.compile -----------------------------------------------------------------------------


def test_compiled_quantize_dequantize_matches_eager():
    torch._dynamo.reset()

    def f(x, scale):
        d, si, amax = te_ops.fp8_quantize(x, E4M3, False, 0.0)
        d2, si2, _ = te_ops.fp8_quantize_scaled(x * 2, scale, E5M2)
        m, s = te_ops.mxfp8_quantize(x, E4M3)
        return (te_ops.fp8_dequantize(d, si, E4M3, x.dtype)
                + te_ops.fp8_dequantize(d2, si2, E5M2, x.dtype),
                te_ops.mxfp8_dequantize(m, s, E4M3, x.dtype), amax)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for shape in [(4, 64), (3, 5, 32)]:
        x = torch.randn(shape)
        scale = torch.tensor([7.0])
        for a, b in zip(compiled(x, scale), f(x, scale)):
            assert_bits_equal(a, b)
    torch._dynamo.reset()


# ---- CUDA against CPU: the same bytes (common/fp8.h is the rule both backends run) -----------


def _special_input(n, dtype, seed):
    """Random values over a wide range with zeros, subnormals, +-inf, NaN and values near the
    FP8 limits scattered in."""
    x = randn((n,), torch.float32, 3.0, seed) * torch.exp2(randn((n,), torch.float32, 6.0,
                                                                  seed + 1).round())
    sp = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 448.0, -448.0, 57344.0, 464.0, 1e30, -1e30])
    x[: min(n, sp.numel())] = sp[: min(n, sp.numel())]
    return x.to(dtype)


# (n, with specials): odd sizes, a vector tail, several amax blocks, and inf/NaN tensors
CUDA_SIZES = [1, 7, 64, 4099, 300 * 97, 1 << 20]


@needs_cuda
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES + [torch.float64], ids=["fp32", "bf16", "fp16", "fp64"])
@pytest.mark.parametrize("n", CUDA_SIZES)
def test_cuda_quantize_equals_cpu(n, dtype, fmt):
    x = _special_input(n, dtype, n)
    # an offset view too: the CUDA kernels' unaligned (scalar) path
    for xc in (x, torch.cat([x[:1], x])[1:]):
        xg = xc.cuda()
        for pow2, eps in [(False, 0.0), (True, 1e-3)]:
            for a, b in zip(te_ops.fp8_quantize(xc, fmt, pow2, eps),
                            te_ops.fp8_quantize(xg, fmt, pow2, eps)):
                assert_bits_equal(a, b.cpu())
        assert_bits_equal(te_ops.fp8_amax(xc), te_ops.fp8_amax(xg).cpu())
        scale = torch.tensor([0.37], dtype=torch.float32)
        cpu = te_ops.fp8_quantize_scaled(xc, scale, fmt)
        gpu = te_ops.fp8_quantize_scaled(xg, scale.cuda(), fmt)
        for a, b in zip(cpu, gpu):
            assert_bits_equal(a, b.cpu())
        data, scale_inv, _ = cpu
        for out in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            assert_bits_equal(te_ops.fp8_dequantize(data, scale_inv, fmt, out),
                              te_ops.fp8_dequantize(data.cuda(), scale_inv.cuda(), fmt,
                                                    out).cpu())


@needs_cuda
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_cuda_quantize_non_finite_amax_equals_cpu(fmt):
    for special in (float("inf"), float("nan")):
        for dtype in DTYPES:
            x = randn((5000,), dtype, 2.0, 3)
            x[4321] = special
            cpu = te_ops.fp8_quantize(x, fmt, False, 0.0)
            gpu = te_ops.fp8_quantize(x.cuda(), fmt, False, 0.0)
            for a, b in zip(cpu, gpu):
                assert_bits_equal(a, b.cpu())


@needs_cuda
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES + [torch.float64], ids=["fp32", "bf16", "fp16", "fp64"])
@pytest.mark.parametrize("rows", [1, 3, 517])
def test_cuda_mxfp8_equals_cpu(rows, dtype, fmt):
    x = _special_input(rows * 96, dtype, rows).reshape(rows, 96)
    x.view(-1)[5::97] = float("nan")
    for xc in (x, torch.cat([x.view(-1)[:1], x.view(-1)])[1:].view(rows, 96)):
        data, scale = te_ops.mxfp8_quantize(xc, fmt)
        gdata, gscale = te_ops.mxfp8_quantize(xc.cuda(), fmt)
        assert_bits_equal(data, gdata.cpu())
        assert_bits_equal(scale, gscale.cpu())
        for out in (torch.float32, torch.bfloat16, torch.float64):
            assert_bits_equal(te_ops.mxfp8_dequantize(data, scale, fmt, out),
                              te_ops.mxfp8_dequantize(gdata, gscale, fmt, out).cpu())


@needs_cuda
def test_cuda_quantize_captures_in_a_graph():
    """No host synchronisation: the ops record into a CUDA graph, and replaying it with new
    input values (and a new delayed-scaling scale) gives the eager results."""
    x = torch.randn(4096, 33, device="cuda")
    scale = torch.tensor([2.0], device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        cur = te_ops.fp8_quantize(x, E4M3, False, 0.0)
        dly = te_ops.fp8_quantize_scaled(x, scale, E5M2)
        mx = te_ops.mxfp8_quantize(x[:, :32], E4M3)
        split = te_ops.fp8_quantize_scaled(
            x, te_ops.fp8_current_scale(te_ops.fp8_amax(x), E5M2, True, 1e-3), E5M2)
    x.copy_(torch.randn(4096, 33, device="cuda") * 7)
    scale.fill_(0.25)
    g.replay()
    torch.cuda.synchronize()
    for got, want in [(cur, te_ops.fp8_quantize(x, E4M3, False, 0.0)),
                      (dly, te_ops.fp8_quantize_scaled(x, scale, E5M2)),
                      (mx, te_ops.mxfp8_quantize(x[:, :32], E4M3)),
                      (split, te_ops.fp8_quantize(x, E5M2, True, 1e-3))]:
        for a, b in zip(got, want):
            assert_bits_equal(a, b)


# ---- delayed scaling's update: te_cpp.fp8_delayed_scaling_update against the Python rule --------


def ref_delayed_update(h, scale, fp8_max, margin, algo):
    """The plain-PyTorch update (transformer_engine_cpp/quantization/recipe_state.py before it
    called the op), on copies: returns (new history, new scale)."""
    h, scale = h.clone(), scale.clone()
    amax = torch.amax(h, dim=0) if algo == "max" else h[0].clone()
    h.copy_(torch.roll(h, -1, 0))
    h[0].zero_()
    fmax = torch.tensor(fp8_max, dtype=torch.float32, device=amax.device)
    sf = (fmax / amax) / (2.0 ** margin)
    sf = torch.where(amax > 0.0, sf, scale)
    sf = torch.where(torch.isfinite(amax), sf, scale)
    sf = torch.where(torch.isinf(sf), torch.full_like(sf, FLT_MAX), sf)
    return h, sf


def _history(length, n, seed):
    """Amax histories with zeros, negative zeros, tiny and huge values, inf and NaN scattered
    over the columns, and old scales with the same specials."""
    g = torch.Generator().manual_seed(seed)
    h = torch.rand(length, n, generator=g) * torch.exp2(torch.randint(-140, 120, (length, n),
                                                                      generator=g).float())
    specials = [0.0, -0.0, float("inf"), float("nan"), 1e-45, 3e38, -1.0]
    for j in range(n):
        k = j % (len(specials) + 2)
        if k < len(specials):
            h[torch.randint(0, length, (1,), generator=g), j] = specials[k]
    h[:, n - 1] = 0.0  # an all-zero column: the old scale stays
    scale = torch.rand(n, generator=g) * 4
    scale[0] = float("inf")
    if n > 2:
        scale[2] = float("nan")
    return h, scale


DELAYED_CONFIGS = [(1, 3), (2, 9), (5, 9), (1024, 3), (1500, 11)]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("length,n", DELAYED_CONFIGS, ids=str)
def test_delayed_scaling_update_op_equals_python_rule(length, n, algo, device):
    for seed, (fp8_max, margin) in enumerate([(448.0, 0), (57344.0, 1), (448.0, 3),
                                              (57344.0, 130)]):
        h, scale = _history(length, n, seed)
        want_h, want_scale = ref_delayed_update(h, scale, fp8_max, margin, algo)
        got_h, got_scale = h.to(device), scale.to(device)
        te_ops.fp8_delayed_scaling_update(got_h, got_scale, fp8_max, margin, algo)
        assert_bits_equal(got_h.cpu(), want_h)
        assert_bits_equal(got_scale.cpu(), want_scale)


def test_delayed_scaling_update_op_bad_inputs():
    h, s = torch.zeros(4, 3), torch.ones(3)
    cases = [
        (lambda: te_ops.fp8_delayed_scaling_update(h, s, 448.0, 0, "mean"),
         r"fp8_delayed_scaling_update: amax_compute_algo must be 'max' or 'most_recent', got "
         r"'mean'"),
        (lambda: te_ops.fp8_delayed_scaling_update(h.double(), s, 448.0, 0, "max"),
         r"fp8_delayed_scaling_update: amax_history must be float32, got Double"),
        (lambda: te_ops.fp8_delayed_scaling_update(h, torch.ones(4), 448.0, 0, "max"),
         r"fp8_delayed_scaling_update: scale must have shape \[3\] \(one per amax_history "
         r"column\), got \[4\]"),
        (lambda: te_ops.fp8_delayed_scaling_update(torch.zeros(0, 3), s, 448.0, 0, "max"),
         r"fp8_delayed_scaling_update: amax_history must have at least one row, got shape "
         r"\[0, 3\]"),
        (lambda: te_ops.fp8_delayed_scaling_update(h, h[0], 448.0, 0, "max"),
         r"fp8_delayed_scaling_update: scale \(shape \[3\]\) partially overlaps amax_history"),
        (lambda: te_ops.fp8_delayed_scaling_update(h, torch.ones(1).expand(3), 448.0, 0, "max"),
         r"fp8_delayed_scaling_update: scale is written in place but several of its elements "
         r"share one memory location"),
        (lambda: te_ops.fp8_delayed_scaling_update(h[0], s, 448.0, 0, "max"),
         r"fp8_delayed_scaling_update: amax_history must be 2-D \(history length, quantizers\), "
         r"got shape \[3\]"),
        (lambda: te_ops.fp8_delayed_scaling_update(h, s, 448.0, -1, "max"),
         r"fp8_delayed_scaling_update: margin must be >= 0, got -1"),
        (lambda: te_ops.fp8_delayed_scaling_update(h, s, float("inf"), 0, "max"),
         r"fp8_delayed_scaling_update: fp8_max must be positive and finite, got inf"),
    ]
    for call, msg in cases:
        with pytest.raises((RuntimeError, ValueError), match=msg):
            call()
    # nothing was written by the refused calls
    assert torch.equal(h, torch.zeros(4, 3)) and torch.equal(s, torch.ones(3))


def test_delayed_scaling_update_op_non_contiguous_state():
    """A non-contiguous history and scale are updated in place (through contiguous copies)."""
    h, scale = _history(7, 5, 11)
    want_h, want_scale = ref_delayed_update(h, scale, 448.0, 2, "max")
    hb = torch.zeros(5, 7).t()
    hb.copy_(h)
    sb = torch.zeros(10)[::2]
    sb.copy_(scale)
    te_ops.fp8_delayed_scaling_update(hb, sb, 448.0, 2, "max")
    assert_bits_equal(hb.contiguous(), want_h)
    assert_bits_equal(sb.contiguous(), want_scale)


# ---- the shared rules are CUDA device code ----------------------------------------------------

def test_shared_quantize_and_dropout_rules_compile_as_cuda_device_code(tmp_path):
    """tests/cpp/quantize_math_device.cu calls every function of csrc/common/fp8.h and
    csrc/common/dropout_math.h from CUDA kernels: nvcc -ptx refuses a host-only call, and
    -Werror all-warnings any warning."""
    assert compile_ptx("quantize_math_device.cu", tmp_path).count(".entry ") == 3
