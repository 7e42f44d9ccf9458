"""Edge cases of the kernels and constructors (issue 11: no silent wrong answer, no crash on
valid use): size arguments that overflow int64, in-place ops on overlapping buffers, NaN/inf
semantics of the activation and normalisation backwards against PyTorch autograd of the
reference formulas, and L2Normalization's backward on rows of tiny norm."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import transformer_engine_cpp as te
from transformer_engine_cpp.testing import reference as ref

import activations
from activations import GATED, SCALED, op_params, reference, reference_function

ops = torch.ops.te_cpp
BIG = 2**63 - 1  # fits int64, but 2 * BIG does not

# ---- item 3: size arguments ------------------------------------------------------------------

# every gated activation of the activation table, scaled or not
_GATED = GATED + tuple(cls for cls in SCALED if cls.gated)
# (op stem, extra float args before glu_interleave_size (the defaults), takes scales)
GATED_OPS = [(cls.op_stem, op_params(cls()), cls in SCALED) for cls in _GATED]


def _gated_call(stem, params, scaled, kind, x, s):
    dy = torch.ones(*x.shape[:-1], x.shape[-1] // 2, device=x.device)
    scales = torch.ones(x.shape[:-1], device=x.device)
    if kind == "fwd":
        args = (x, scales) if scaled else (x,)
    else:
        args = (dy, x, scales, True) if scaled else (dy, x)
    return getattr(ops, f"{stem}_{kind}")(*args, *params, s)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("kind", ["fwd", "bwd"])
@pytest.mark.parametrize("size", [BIG, 2**62])
@pytest.mark.parametrize("stem,params,scaled", GATED_OPS, ids=[g[0] for g in GATED_OPS])
def test_gated_interleave_size_overflow_is_refused(stem, params, scaled, size, kind, device):
    """2 * glu_interleave_size overflowed: the op read garbage (or passed a wrong check)."""
    for width in (8, 0):
        x = torch.ones(3, width, device=device)
        with pytest.raises(ValueError, match=rf"te_cpp\.{stem}_{kind}: glu_interleave_size "
                                             rf"{size} is too large: 2 \* glu_interleave_size"):
            _gated_call(stem, params, scaled, kind, x, size)


def test_gated_negative_interleave_size_is_refused():
    with pytest.raises(ValueError, match=r"te_cpp\.swiglu_fwd: glu_interleave_size must be >= 0"):
        ops.swiglu_fwd(torch.ones(2, 8), -4)


BAD_SIZES = [
    (lambda: te.ops.Linear(2**63, 4), ValueError,
     r"Linear: in_features must be at most 9223372036854775807 .*got 9223372036854775808"),
    (lambda: te.ops.Linear(4, 2**63), ValueError,
     r"Linear: out_features must be at most .*got 9223372036854775808"),
    (lambda: te.ops.Linear(2**40, 2**40, device="meta"), ValueError,
     r"Linear: weight of shape \(1099511627776, 1099511627776\)"),
    (lambda: te.ops.LayerNorm(2**63), ValueError,
     r"LayerNorm: weight of shape \(9223372036854775808,\) \(torch.float32\)"),
    (lambda: te.ops.RMSNorm((2**32, 2**32), device="meta"), ValueError,
     r"RMSNorm: weight of shape \(4294967296, 4294967296\)"),
    (lambda: te.ops.SwiGLU(glu_interleave_size=2**63), ValueError,
     r"SwiGLU: glu_interleave_size must be at most 4611686018427387903 \(2 \* glu_interleave_size "
     r"must fit in int64\), got 9223372036854775808"),
    (lambda: te.ops.SwiGLU(glu_interleave_size=BIG), ValueError,
     r"SwiGLU: glu_interleave_size must be at most .*got 9223372036854775807"),
    (lambda: te.ops.ClampedSwiGLU(glu_interleave_size=2**62), ValueError,
     r"ClampedSwiGLU: glu_interleave_size must be at most .*got 4611686018427387904"),
    (lambda: te.ops.SiTUGLU(glu_interleave_size=2**62), ValueError,
     r"SiTUGLU: glu_interleave_size must be at most"),
    (lambda: te.ops.ScaledSwiGLU(2**63), ValueError,
     r"ScaledSwiGLU: glu_interleave_size must be at most .*got 9223372036854775808"),
    (lambda: te.ops.ScaledClampedQGeGLU(BIG), ValueError,
     r"ScaledClampedQGeGLU: glu_interleave_size must be at most"),
    (lambda: te.ops.ScaledSiTUGLU(2**64), ValueError, r"ScaledSiTUGLU: glu_interleave_size must"),
    (lambda: te.ops.SwiGLU(glu_interleave_size=2.5), ValueError,
     r"SwiGLU: glu_interleave_size must be a positive int or None, got 2.5"),
    (lambda: te.ops.L2Normalization(seq_length=2**63), ValueError,
     r"L2Normalization: seq_length must be at most .*got 9223372036854775808"),
    (lambda: te.ops.Reshape(3.5), TypeError, r"Reshape: shape must be a sequence of ints, got 3.5"),
    (lambda: te.ops.Reshape((2, 3.5)), TypeError, r"Reshape: shape must be a sequence of ints"),
    (lambda: te.ops.Reshape((2**63,)), ValueError,
     r"Reshape: shape \(9223372036854775808,\) has more than 9223372036854775807"),
    (lambda: te.ops.Reshape((2**32, 2**32, -1)), ValueError, r"Reshape: shape \(4294967296, "),
]


@pytest.mark.parametrize("make,exc,match", BAD_SIZES,
                         ids=[m.split(":")[0] + str(i) for i, (_, _, m) in enumerate(BAD_SIZES)])
def test_constructor_size_out_of_range(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


@pytest.mark.parametrize("make,match", [
    (lambda: te.ops.BasicLinear(2**63, 4), r"BasicLinear: in_features must be at most"),
    (lambda: te.ops.BasicLinear(2**40, 2**40, device="meta"), r"BasicLinear: weight of shape"),
    (lambda: te.ops.Bias(2**63), r"Bias: size must be at most"),
], ids=["BasicLinear", "BasicLinear-numel", "Bias"])
def test_linear_and_bias_constructor_size_out_of_range(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_constructor_sizes_at_the_limit_are_accepted():
    assert te.ops.SwiGLU(glu_interleave_size=2**62 - 1)._interleave == 2**62 - 1
    assert te.ops.Reshape(3)._shape == (3,)
    assert te.ops.Reshape((2**31, -1))._shape == (2**31, -1)
    assert te.ops.LayerNorm(2**20, device="meta").weight.shape == (2**20,)


# ---- item 15: in-place ops and overlapping buffers -------------------------------------------

RESIDUAL_INPLACE = [
    ("add_extra_input_fwd_inplace", "extra_input", "input"),
    ("make_extra_output_bwd_inplace", "grad_extra_output", "grad_output"),
]


@pytest.mark.parametrize("op,out_name,in_name", RESIDUAL_INPLACE, ids=[r[0] for r in RESIDUAL_INPLACE])
def test_residual_inplace_partial_overlap_is_refused(op, out_name, in_name):
    n = 37  # vector body and tail
    buf = torch.arange(3 * n + 5, dtype=torch.float32)
    for shift in (1, n):
        before = buf.clone()
        out, other = buf[:2 * n].view(2, n), buf[shift:shift + 2 * n].view(2, n)
        with pytest.raises(RuntimeError, match=rf"te_cpp\.{op}: {in_name} .* partially overlaps "
                                               rf"{out_name}"):
            getattr(ops, op)(out, other)
        assert torch.equal(buf, before)  # refused before anything was written


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("op,out_name,in_name", RESIDUAL_INPLACE, ids=[r[0] for r in RESIDUAL_INPLACE])
def test_residual_inplace_internal_overlap_is_refused(op, out_name, in_name, device):
    out = torch.zeros(1, 5, device=device).expand(3, 5)
    with pytest.raises(RuntimeError, match=rf"te_cpp\.{op}: {out_name} is written in place but "
                                           r"several of its elements share one memory location"):
        getattr(ops, op)(out, torch.ones(3, 5, device=device))


@pytest.mark.parametrize("op,out_name,in_name", RESIDUAL_INPLACE, ids=[r[0] for r in RESIDUAL_INPLACE])
def test_residual_inplace_full_alias_and_disjoint_views_are_allowed(op, out_name, in_name):
    x = torch.randn(3, 37)
    expected = x + x
    getattr(ops, op)(x, x)  # as x.add_(x)
    assert torch.equal(x, expected)
    buf = torch.randn(2, 3, 37)
    expected = buf[0] + buf[1]
    getattr(ops, op)(buf[0], buf[1])  # two views of one buffer that do not overlap
    assert torch.equal(buf[0], expected)
    # a strided buffer (updated through a copy) overlapping its input is deterministic too
    buf = torch.randn(3, 74)
    out, other = buf[:, ::2], buf[:, :37]
    expected = out + other
    getattr(ops, op)(out, other)
    assert torch.equal(buf[:, ::2], expected)


def test_linear_fwd_add_inplace_overlap_is_refused():
    op = "linear_fwd_add_inplace"
    w = torch.randn(4, 4)
    b = torch.randn(4)
    buf = torch.randn(12)
    x = buf[:8].view(2, 4)
    cases = [
        (buf[4:12].view(2, 4), x, w, b, r"input .* partially overlaps extra_input"),
        (x, x, w, b, r"input is the same memory as extra_input"),
        (w[:2], torch.randn(2, 4), w, b, r"weight .* partially overlaps extra_input"),
        (buf[:4].view(1, 4), torch.randn(1, 4), w, buf[:4], r"bias .* partially overlaps"),
        (buf[:4], torch.randn(4), w, buf[:4], r"bias is the same memory as extra_input"),
        (buf[2:10].view(2, 4), torch.randn(2, 4), w, buf[:4], r"bias .* partially overlaps"),
    ]
    for extra, xx, ww, bb, match in cases:
        with pytest.raises(RuntimeError, match=rf"te_cpp\.{op}: {match}"):
            ops.linear_fwd_add_inplace(extra, xx, ww, bb, 1.0)
    for device in ("cpu", "meta"):
        extra = torch.zeros(1, 4, device=device).expand(2, 4)
        with pytest.raises(RuntimeError, match=rf"te_cpp\.{op}: "):
            ops.linear_fwd_add_inplace(extra, torch.randn(2, 4, device=device),
                                       w.to(device), b.to(device), 1.0)


# ---- item 16: NaN / inf semantics -------------------------------------------------------------

SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -3.0, 20.0, -20.0, 89.0, -89.0, 1e20, -1e20, 1e38, -1e38,
           3e38, -3e38, math.inf, -math.inf, math.nan]
SPECIAL_DY = [1.0, -2.0, 0.0, math.nan, math.inf, -math.inf]


def _autograd(f, inputs, dy):
    ins = [t.clone().requires_grad_(True) for t in inputs]
    return torch.autograd.grad(f(*ins), ins, dy)


def _check_nan_semantics(name, ours, want, where, nan_for_inf=False):
    """ours against PyTorch fp32 autograd of the reference formula: where PyTorch gives NaN we
    must not give +-inf, and where it gives a number we must not give NaN (with nan_for_inf,
    NaN is allowed where PyTorch gives +-inf: LayerNorm's dx row with a non-finite sum)."""
    ours, want = ours.flatten(), want.flatten()
    number = torch.isfinite(want) if nan_for_inf else ~torch.isnan(want)
    for mask, what in ((torch.isnan(want) & torch.isinf(ours), "inf where PyTorch gives NaN"),
                       (number & torch.isnan(ours), "NaN where PyTorch gives a number")):
        if mask.any():
            i = mask.nonzero().flatten()[:6].tolist()
            raise AssertionError(f"{name}: {int(mask.sum())} values {what}, e.g. "
                                 f"{[(where(k), ours[k].item(), want[k].item()) for k in i]}")


UNARY = {cls.op_stem: reference_function(cls) for cls in activations.UNARY}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("offset", [0, 3], ids=["whole", "tail"])
def test_16bit_stores_round_to_nearest_even_as_torch(dtype, offset):
    """The kernels compute in fp32 and round once on store, to nearest even as torch's cast:
    constant_scale of every 16-bit pattern (and of all but the first 3, so that the last vector
    is a partial one) by multipliers that put the exact products on, beside and away from the
    rounding ties, bit for bit against torch's fp32 product cast to the dtype; NaN stays NaN.
    Products below fp32's normal range are left out (vcvtneps2bf16 flushes them to zero)."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)[offset:]
    for s in (1 + 2**-8, 1 + 2**-9, 1 + 3 * 2**-10, 1 - 2**-9, 1 - 2**-12, 0.7, 3.0, 1.0):
        got = torch.ops.te_cpp.constant_scale_fwd(x, s)
        exact = x.float() * torch.tensor(s, dtype=torch.float32)
        want = exact.to(dtype)
        nan = torch.isnan(exact)
        assert torch.isnan(got[nan]).all()
        keep = ~nan & ((exact.abs() >= torch.finfo(torch.float32).tiny) | (exact == 0))
        bad = (got.view(torch.int16) != want.view(torch.int16)) & keep
        assert not bad.any(), (
            f"scale {s}: {int(bad.sum())} values differ, e.g. {exact[bad][:4].tolist()} -> "
            f"{got[bad][:4].tolist()}, torch {want[bad][:4].tolist()}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_16bit_stores_keep_nan_whatever_its_payload(dtype):
    """An fp32 NaN whose low bits are set (here from fp32 router scales, carried through the
    product) is stored as NaN: the bf16 rounding's carry must not turn it into zero or inf."""
    payloads = [0x7FFFFFFF, 0x7F800001, 0x7FC00000, 0x7F8FFFFF, -1, 0xFFFF0001 - 2**32]
    scales = torch.tensor(payloads * 7, dtype=torch.int64).to(torch.int32).view(torch.float32)
    x = torch.ones(scales.numel(), 2 * 19, dtype=dtype)
    y = torch.ops.te_cpp.scaled_swiglu_fwd(x, scales)
    assert y.dtype == dtype and torch.isnan(y).all()


@pytest.mark.parametrize("stem", list(UNARY))
def test_unary_activation_nan_semantics(stem):
    grid = list(itertools.product(SPECIAL, SPECIAL_DY))  # 114 elements: vector body and tail
    x = torch.tensor([g[0] for g in grid])
    dy = torch.tensor([g[1] for g in grid])
    where = lambda k: (x[k].item(), dy[k].item())  # noqa: E731
    f = UNARY[stem]
    _check_nan_semantics(f"{stem}_fwd", getattr(ops, f"{stem}_fwd")(x), f(x), where)
    (want,) = _autograd(f, [x], dy)
    _check_nan_semantics(f"{stem}_bwd", getattr(ops, f"{stem}_bwd")(dy, x), want, where)
    one_by_one = torch.cat([getattr(ops, f"{stem}_bwd")(dy[k:k + 1], x[k:k + 1])
                            for k in range(len(x))])  # the tail path only
    assert torch.equal(one_by_one.nan_to_num(7.0), getattr(ops, f"{stem}_bwd")(dy, x).nan_to_num(7.0))
    dx, _ = getattr(ops, f"dbias_d{stem}")(dy[None], x[None], torch.float32)
    _check_nan_semantics(f"dbias_d{stem}", dx, want, where)
    if stem == "srelu":
        dx, _ = ops.scaled_srelu_bwd(dy[None], x[None], torch.ones(1), True)
        _check_nan_semantics("scaled_srelu_bwd", dx, want, where)


# op stem -> (the reference with the default arguments, those arguments)
GATED_REF = {cls.op_stem: (reference(cls()), op_params(cls())) for cls in _GATED}


@pytest.mark.parametrize("stem", list(GATED_REF))
def test_gated_activation_nan_semantics(stem):
    f, params = GATED_REF[stem]
    scaled = stem.startswith("scaled_")
    grid = list(itertools.product(SPECIAL, SPECIAL, SPECIAL_DY))
    a = torch.tensor([g[0] for g in grid])
    b = torch.tensor([g[1] for g in grid])
    dy = torch.tensor([g[2] for g in grid])
    n = len(grid)
    where = lambda k: ("a" if k < n else "b", a[k % n].item(), b[k % n].item(), dy[k % n].item())  # noqa: E731
    for x, d in ((torch.cat([a, b])[None], dy[None]),  # one long row: vector body and tail
                 (torch.stack([a, b], 1), dy[:, None])):  # rows of 2: the tail path only
        s = torch.full(x.shape[:-1], 0.75)
        fwd_args = (x, s) if scaled else (x,)
        fn = (lambda x: f(x, s)) if scaled else f
        y = getattr(ops, f"{stem}_fwd")(*fwd_args, *params, 0)
        _check_nan_semantics(f"{stem}_fwd", y, fn(x), where)
        (want,) = _autograd(fn, [x], d)
        if scaled:
            dx, _ = getattr(ops, f"{stem}_bwd")(d, x, s, True, *params, 0)
        else:
            dx = getattr(ops, f"{stem}_bwd")(d, x, *params, 0)
        if x.shape[-1] == 2:  # back to the [a..., b...] order of `where`
            dx, want = dx.T, want.T
        _check_nan_semantics(f"{stem}_bwd", dx, want, where)


def test_relu_family_backward_is_zero_where_inactive_whatever_dy():
    """threshold_backward / clamp_backward semantics: 0 where the input is inactive even when dy
    is NaN or inf; a NaN input passes dy through ReLU, as torch.relu's backward does."""
    n = 37
    for d in (math.nan, math.inf, -math.inf):
        x = -torch.rand(n) * 5  # all <= 0
        x[::5] = 0.0
        dy = torch.full((n,), d)
        for stem in ("relu", "srelu"):
            assert torch.equal(getattr(ops, f"{stem}_bwd")(dy, x), torch.zeros(n)), stem
            assert torch.equal(getattr(ops, f"dbias_d{stem}")(dy, x, torch.float32)[0],
                               torch.zeros(n)), stem
        dx, _ = ops.scaled_srelu_bwd(dy[None], x[None], torch.ones(1), False)
        assert torch.equal(dx[0], torch.zeros(n))
        b = torch.randn(n)
        for stem in ("reglu", "sreglu"):
            dx = getattr(ops, f"{stem}_bwd")(dy[None], torch.cat([x, b])[None], 0)
            assert torch.equal(dx[0, :n], torch.zeros(n)), stem
        # ClampedSwiGLU: a above the limit, b outside [-limit, limit]
        xa, xb = 7.5 + torch.rand(n), torch.where(torch.arange(n) % 2 == 0, 8.0, -8.0)
        dx = ops.clamped_swiglu_bwd(dy[None], torch.cat([xa, xb])[None], 7.0, 1.702, 1.0, 0)
        assert torch.equal(dx[0], torch.zeros(2 * n))
    x = torch.full((n,), math.nan)
    dy = torch.randn(n)
    assert torch.equal(ops.relu_bwd(dy, x), dy)
    (want,) = _autograd(ref.relu, [x], dy)
    assert torch.equal(want, dy)


@pytest.mark.parametrize("n", [19, 37])
def test_norm_backward_nan_semantics(n):
    """LayerNorm / RMSNorm / L2Normalization with one special value in x or dy, in the vector
    body or the tail: where PyTorch gives NaN we give no +-inf, and no NaN where it does not."""
    torch.manual_seed(0)
    rows = []
    for p in (0, n // 2, n - 2):
        for v, d, same in itertools.product(SPECIAL, SPECIAL_DY, (True, False)):
            x = torch.randn(n)
            dy = torch.randn(n)
            x[p] = v
            dy[p if same else (p + 3) % n] = d
            rows.append((x, dy))
    x = torch.stack([r[0] for r in rows])
    dy = torch.stack([r[1] for r in rows])
    w = torch.rand(n) + 0.5
    b = torch.randn(n)
    where = lambda k: (k // n, x.flatten()[k].item(), dy.flatten()[k].item())  # noqa: E731

    y, mu, rs = ops.layernorm_fwd(x, w, b, 1e-5, False)
    _check_nan_semantics("layernorm_fwd", y, torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5),
                         where)
    want = _autograd(lambda x: torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5), [x], dy)[0]
    _check_nan_semantics("layernorm_bwd", ops.layernorm_bwd(dy, x, mu, rs, w, False)[0], want,
                         where, nan_for_inf=True)

    y, rs = ops.rmsnorm_fwd(x, w, 1e-5, False)
    _check_nan_semantics("rmsnorm_fwd", y, ref.rms_norm(x, w, 1e-5), where)
    want = _autograd(lambda x: ref.rms_norm(x, w, 1e-5), [x], dy)[0]
    _check_nan_semantics("rmsnorm_bwd", ops.rmsnorm_bwd(dy, x, rs, w, False)[0], want, where)

    y, rn = ops.l2normalization_fwd(x, 1e-6)
    _check_nan_semantics("l2normalization_fwd", y, ref.l2normalization(x, 1e-6), where)
    want = _autograd(lambda x: ref.l2normalization(x, 1e-6), [x], dy)[0]
    _check_nan_semantics("l2normalization_bwd", ops.l2normalization_bwd(dy, x, rn), want, where)


def test_layernorm_backward_row_with_inf_dy_is_nan():
    """An inf in a row's dy makes that row's dx NaN (PyTorch's inf - inf), other rows exact."""
    torch.manual_seed(0)
    x = torch.randn(3, 37)
    dy = torch.randn(3, 37)
    dy[1, 5] = math.inf
    w = torch.rand(37) + 0.5
    _, mu, rs = ops.layernorm_fwd(x, w, torch.zeros(37), 1e-5, False)
    dx = ops.layernorm_bwd(dy, x, mu, rs, w, False)[0]
    assert torch.isnan(dx[1]).all()
    clean = ops.layernorm_bwd(dy[[0, 2]], x[[0, 2]], mu[[0, 2]], rs[[0, 2]], w, False)[0]
    assert torch.equal(dx[[0, 2]], clean)


# ---- item 17: L2Normalization backward on rows of tiny norm -----------------------------------

@pytest.mark.parametrize("eps", [1e-6, 1e-12, 0.0])
def test_l2normalization_backward_tiny_norms(eps):
    """dx against a float64 reference, on rows of norm 1e-20 .. 1e-3 and normal rows: the fp32
    error (per row, relative to the row's largest gradient) is at most about what fp32 PyTorch
    autograd of the reference achieves, and finite where the float64 result is."""
    torch.manual_seed(0)
    n = 37
    # eps = 0: x^2 of norms below ~1e-18 is subnormal in fp32, so rs itself is inexact there
    lowest = -18 if eps == 0.0 else -20
    norms = [10.0 ** e for e in range(lowest, -2)] + [1.0, 30.0]
    x64 = torch.randn(len(norms), 16, n, dtype=torch.float64)
    x64 = x64 / x64.norm(dim=-1, keepdim=True) * torch.tensor(norms, dtype=torch.float64)[:, None, None]
    x = x64.float().reshape(-1, n)
    dy = torch.randn(x.shape)
    x64, dy64 = x.double(), dy.double()
    (g64,) = _autograd(lambda x: ref.l2normalization(x, eps), [x64], dy64)
    (g_torch,) = _autograd(lambda x: ref.l2normalization(x, eps), [x], dy)
    _, rn = ops.l2normalization_fwd(x, eps)
    g_ours = ops.l2normalization_bwd(dy, x, rn)
    scale = g64.abs().amax(-1, keepdim=True)
    err_torch = ((g_torch.double() - g64).abs() / scale).amax(-1)
    err_ours = ((g_ours.double() - g64).abs() / scale).amax(-1)
    assert torch.isfinite(g_ours).all(), "non-finite dx where the float64 result is finite"
    ulp = 2.0**-23
    bound = torch.where(torch.isfinite(err_torch), 2 * err_torch, torch.zeros_like(err_torch)) + 8 * ulp
    bad = err_ours > bound
    assert not bad.any(), (
        f"rows {bad.nonzero().flatten()[:5].tolist()}: ours {err_ours[bad][:5].tolist()}, "
        f"torch {err_torch[bad][:5].tolist()}")


@pytest.mark.parametrize("value", [0.0, 1e-30], ids=["zero_row", "underflowing_row"])
def test_l2normalization_backward_of_a_zero_norm_row_is_nan(value):
    """eps = 0 and sum(x^2) == 0: PyTorch's autograd of the reference gives NaN (inf * 0) and,
    for an underflowing row, +-inf in some lanes; ours gives NaN throughout, never +-inf where
    PyTorch has NaN."""
    torch.manual_seed(0)
    x = torch.full((2, 37), value)
    dy = torch.randn(2, 37)
    (g_torch,) = _autograd(lambda x: ref.l2normalization(x, 0.0), [x], dy)
    _, rn = ops.l2normalization_fwd(x, 0.0)
    g_ours = ops.l2normalization_bwd(dy, x, rn)
    assert not torch.isfinite(g_torch).any() and torch.isnan(g_torch).any()
    assert torch.isnan(g_ours).all()
