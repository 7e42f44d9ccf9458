"""The grouped family's custom ops (GroupedLinear's GEMMs and bias parts) against a float64
reference of separate matmuls, one per group: uneven splits, empty and one-row groups, all rows
in one group, no rows; bad inputs on the real and the Meta kernels; results independent of the
thread count; a larger case. Parametrized by device (CUDA skips without a GPU). The opcheck
samples are tests/cases.py's _samples_grouped."""

from __future__ import annotations

import re

import pytest
import torch

from harness import DEVICES, skip_missing_cuda_kernel
from tolerances import tols

ops = torch.ops.te_cpp

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]
SPLITS = {
    "uneven": [3, 0, 1, 6, 2],   # an empty and a one-row group
    "one_group_has_all": [0, 12, 0],
    "single": [12],
    "last_empty": [5, 7, 0],
}
IN_F, OUT_F = 24, 20


def _rand(*shape, dtype, device, scale=1.0):
    return (torch.randn(shape) * scale).to(dtype=dtype, device=device)


def _groups(splits):
    """(start, stop) row ranges of the groups."""
    out, start = [], 0
    for n in splits:
        out.append((start, start + n))
        start += n
    return out


def _problem(splits, dtype, device, *, bias=True, scales=None, seed=0):
    torch.manual_seed(seed)
    rows, groups = sum(splits), len(splits)
    x = _rand(rows, IN_F, dtype=dtype, device=device)
    dy = _rand(rows, OUT_F, dtype=dtype, device=device)
    w = [_rand(OUT_F, IN_F, dtype=dtype, device=device, scale=IN_F ** -0.5)
         for _ in range(groups)]
    b = [_rand(OUT_F, dtype=dtype, device=device) for _ in range(groups)] if bias else []
    s = None
    if scales is not None:
        s = (torch.rand(rows) + 0.5).to(dtype=scales, device=device)
    split_sizes = torch.tensor(splits, dtype=torch.int64, device=device)
    return x, dy, split_sizes, w, b, s


def _d(t):
    return t.detach().double().cpu()


def ref_fwd(x, splits, w, b, s):
    out = []
    for g, (r0, r1) in enumerate(_groups(splits)):
        y = _d(x[r0:r1]) @ _d(w[g]).T
        if b:
            y = y + (_d(s[r0:r1])[:, None] if s is not None else 1.0) * _d(b[g])
        out.append(y)
    return torch.cat(out)


def ref_dgrad(dy, splits, w):
    return torch.cat([_d(dy[r0:r1]) @ _d(w[g]) for g, (r0, r1) in enumerate(_groups(splits))])


def ref_wgrad(dy, x, splits):
    return [_d(dy[r0:r1]).T @ _d(x[r0:r1]) for r0, r1 in _groups(splits)]


def ref_bias_bwd(dy, splits, b, s):
    dbias, dscales = [], []
    for g, (r0, r1) in enumerate(_groups(splits)):
        scale = _d(s[r0:r1])[:, None] if s is not None else 1.0
        dbias.append((scale * _d(dy[r0:r1])).sum(0))
        if s is not None:
            dscales.append(_d(dy[r0:r1]) @ _d(b[g]))
    return dbias, (torch.cat(dscales) if s is not None else None)


def _close(actual, expected, dtype, **override):
    torch.testing.assert_close(_d(actual), expected, **{**tols(dtype), **override})


# ---- numerics ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("splits", list(SPLITS.values()), ids=list(SPLITS))
@pytest.mark.parametrize("bias", ["none", "bias", "scaled_fp32", "scaled_dtype"])
def test_fwd_matches_separate_matmuls(bias, splits, dtype, device):
    scales = {"scaled_fp32": torch.float32, "scaled_dtype": dtype}.get(bias)
    x, _, split_sizes, w, b, s = _problem(splits, dtype, device, bias=bias != "none",
                                          scales=scales)
    y = ops.grouped_linear_fwd(x, split_sizes, w, b, s)
    assert y.shape == (sum(splits), OUT_F) and y.dtype == dtype and y.device == x.device
    expected = ref_fwd(x, splits, w, b, s)
    _close(y, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("splits", list(SPLITS.values()), ids=list(SPLITS))
def test_dgrad_and_wgrad_match_separate_matmuls(splits, dtype, device):
    x, dy, split_sizes, w, _, _ = _problem(splits, dtype, device)
    dx = ops.grouped_linear_dgrad(dy, split_sizes, w)
    assert dx.shape == x.shape and dx.dtype == dtype
    _close(dx, ref_dgrad(dy, splits, w), dtype)
    dw = ops.grouped_linear_wgrad(dy, x, split_sizes)
    assert len(dw) == len(splits)
    for g, (got, expected) in enumerate(zip(dw, ref_wgrad(dy, x, splits))):
        assert got.shape == (OUT_F, IN_F) and got.dtype == dtype
        _close(got, expected, dtype)
        if splits[g] == 0:
            assert torch.equal(got.cpu(), torch.zeros(OUT_F, IN_F, dtype=dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("splits", list(SPLITS.values()), ids=list(SPLITS))
@pytest.mark.parametrize("scales", ["none", "fp32", "dtype"])
@pytest.mark.parametrize("bias_dtype", ["fp32", "dtype"])
def test_bias_bwd_matches_reference(bias_dtype, scales, splits, dtype, device):
    scale_dtype = {"fp32": torch.float32, "dtype": dtype}.get(scales)
    b_dtype = torch.float32 if bias_dtype == "fp32" else dtype
    _, dy, split_sizes, _, b, s = _problem(splits, dtype, device, scales=scale_dtype)
    dbias, dscales = ops.grouped_bias_bwd(dy, split_sizes, b, s, b_dtype)
    exp_dbias, exp_dscales = ref_bias_bwd(dy, splits, b, s)
    assert len(dbias) == len(splits)
    for g, (got, expected) in enumerate(zip(dbias, exp_dbias)):
        assert got.shape == (OUT_F,) and got.dtype == b_dtype
        _close(got, expected, b_dtype)
        if splits[g] == 0:
            assert torch.equal(got.cpu(), torch.zeros(OUT_F, dtype=b_dtype))
    if s is None:
        assert dscales.shape == (0,)
    else:
        assert dscales.shape == s.shape and dscales.dtype == s.dtype
        _close(dscales, exp_dscales, s.dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_bias_bwd_without_biases_needs_only_split_sizes(device):
    _, dy, split_sizes, _, _, _ = _problem(SPLITS["uneven"], torch.float32, device)
    dbias, dscales = ops.grouped_bias_bwd(dy, split_sizes, [], None, torch.float64)
    exp, _ = ref_bias_bwd(dy, SPLITS["uneven"], [], None)
    assert len(dbias) == len(SPLITS["uneven"]) and dscales.shape == (0,)
    for got, expected in zip(dbias, exp):
        assert got.dtype == torch.float64
        _close(got, expected, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_fp64(device):
    splits = SPLITS["uneven"]
    x, dy, split_sizes, w, b, s = _problem(splits, torch.float64, device, scales=torch.float32)
    _close(ops.grouped_linear_fwd(x, split_sizes, w, b, s), ref_fwd(x, splits, w, b, s),
           torch.float64)
    _close(ops.grouped_linear_dgrad(dy, split_sizes, w), ref_dgrad(dy, splits, w), torch.float64)
    for got, exp in zip(ops.grouped_linear_wgrad(dy, x, split_sizes), ref_wgrad(dy, x, splits)):
        _close(got, exp, torch.float64)
    dbias, dscales = ops.grouped_bias_bwd(dy, split_sizes, b, s, torch.float64)
    exp_dbias, exp_dscales = ref_bias_bwd(dy, splits, b, s)
    for got, exp in zip(dbias, exp_dbias):
        _close(got, exp, torch.float64)
    _close(dscales, exp_dscales, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_operands(device):
    """Transposed weights (read as they are), a non-contiguous input and scales."""
    splits = SPLITS["uneven"]
    x, dy, split_sizes, w, b, s = _problem(splits, torch.float32, device, scales=torch.float32)
    wt = [t.t().contiguous().t() for t in w]  # column-major storage
    wn = [torch.stack([t, t], dim=-1)[..., 0] for t in w]  # every other element
    xn = torch.stack([x, x], dim=-1)[..., 0]
    sn = torch.stack([s, s], dim=-1)[..., 0]
    assert not (xn.is_contiguous() or sn.is_contiguous() or wn[0].is_contiguous())
    expected = ref_fwd(x, splits, w, b, s)
    for weights in (wt, wn):
        _close(ops.grouped_linear_fwd(xn, split_sizes, weights, b, sn), expected, torch.float32)
        _close(ops.grouped_linear_dgrad(dy, split_sizes, weights), ref_dgrad(dy, splits, w),
               torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_rows(device):
    splits = [0, 0, 0]
    x, dy, split_sizes, w, b, s = _problem(splits, torch.float32, device, scales=torch.float32)
    assert ops.grouped_linear_fwd(x, split_sizes, w, b, s).shape == (0, OUT_F)
    assert ops.grouped_linear_dgrad(dy, split_sizes, w).shape == (0, IN_F)
    for dw in ops.grouped_linear_wgrad(dy, x, split_sizes):
        assert torch.equal(dw.cpu(), torch.zeros(OUT_F, IN_F))
    dbias, dscales = ops.grouped_bias_bwd(dy, split_sizes, b, s, torch.float32)
    assert all(torch.equal(d.cpu(), torch.zeros(OUT_F)) for d in dbias)
    assert dscales.shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_features(device):
    """in_features 0: y is the (scaled) bias; out_features 0: dx and dscales are zeros."""
    splits = [2, 0, 3]
    rows = sum(splits)
    split_sizes = torch.tensor(splits, device=device)
    x = torch.randn(rows, 0, device=device)
    w = [torch.randn(4, 0, device=device) for _ in splits]
    b = [torch.randn(4, device=device) for _ in splits]
    s = torch.rand(rows, device=device)
    _close(ops.grouped_linear_fwd(x, split_sizes, w, b, s),
           ref_fwd(x, splits, w, b, s), torch.float32)
    dy = torch.randn(rows, 0, device=device)
    w0 = [torch.randn(0, 3, device=device) for _ in splits]
    assert torch.equal(ops.grouped_linear_dgrad(dy, split_sizes, w0).cpu(), torch.zeros(rows, 3))
    b0 = [torch.randn(0, device=device) for _ in splits]
    _, dscales = ops.grouped_bias_bwd(dy, split_sizes, b0, s, torch.float32)
    assert torch.equal(dscales.cpu(), torch.zeros(rows))


# ---- errors -----------------------------------------------------------------------------------


def _bad_calls(device):
    """(call, message) pairs: every one must raise RuntimeError containing the message, on the
    real kernel of `device` and on Meta (the checks both share)."""
    splits = [3, 0, 2]
    x, dy, split_sizes, w, b, s = _problem(splits, torch.float32, device, scales=torch.float32)
    return [
        (lambda: ops.grouped_linear_fwd(x, split_sizes, w[:2], b, None),
         "grouped_linear_fwd: got 2 weights for 3 groups"),
        (lambda: ops.grouped_linear_fwd(x, split_sizes, w, b[:1], None),
         "grouped_linear_fwd: got 1 biases for 3 groups"),
        (lambda: ops.grouped_linear_fwd(x, split_sizes.int(), w, b, None),
         "split_sizes must be int64"),
        (lambda: ops.grouped_linear_fwd(x, split_sizes[:0], w[:0], [], None),
         "split_sizes must have at least one group"),
        (lambda: ops.grouped_linear_fwd(x, split_sizes, w, [], s),
         "bias_scales given without biases"),
        (lambda: ops.grouped_linear_fwd(x, split_sizes, w, b, s[:-1]),
         "bias_scales shape"),
        (lambda: ops.grouped_linear_fwd(x[:, :-1], split_sizes, w, b, None),
         "must equal in_features"),
        (lambda: ops.grouped_linear_fwd(x, split_sizes, [w[0], w[1], w[2][:-1]], b, None),
         "all weights must have the same shape"),
        (lambda: ops.grouped_linear_fwd(x, split_sizes, [w[0], w[1], w[2].double()], b, None),
         "weights[2] and input must have the same dtype"),
        (lambda: ops.grouped_linear_fwd(x[None], split_sizes, w, b, None), "must be 2-D"),
        (lambda: ops.grouped_linear_dgrad(dy, split_sizes, w[:1]),
         "grouped_linear_dgrad: got 1 weights for 3 groups"),
        (lambda: ops.grouped_linear_wgrad(dy, x[:-1], split_sizes),
         "must have the same number of rows"),
        (lambda: ops.grouped_bias_bwd(dy, split_sizes, b[:2], None, torch.float32),
         "grouped_bias_bwd: got 2 biases for 3 groups"),
        (lambda: ops.grouped_bias_bwd(dy, split_sizes, b, None, torch.int32),
         "bias dtype must be"),
    ]


@pytest.mark.parametrize("device", [*DEVICES, "meta"])
def test_bad_inputs_raise_clear_errors(device):
    for call, message in _bad_calls(device):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            call()


@pytest.mark.parametrize("device", [*DEVICES, "meta"])
def test_a_bad_amax_epsilon_names_its_group(device):
    with skip_missing_cuda_kernel():
        x = torch.randn(8, 16, device=device)
        sizes = torch.tensor([4, 0, 4], device=device)
        for bad, shown in ((float("nan"), "nan"), (float("inf"), "inf"), (-1.0, "-1")):
            with pytest.raises(ValueError, match=re.escape(
                    f"te_cpp.grouped_fp8_quantize: amax_epsilons[1] must be >= 0 and finite, "
                    f"got {shown}")):
                ops.grouped_fp8_quantize(x, sizes, None, torch.float8_e4m3fn, False,
                                         [0.0, bad, 0.0])


def _value_calls(device, splits):
    x, dy, split_sizes, w, b, s = _problem([1] * len(splits), torch.float32, device,
                                           scales=torch.float32)
    sizes = torch.tensor(splits, device=device)
    return [
        ("grouped_linear_fwd", lambda: ops.grouped_linear_fwd(x, sizes, w, b, s)),
        ("grouped_linear_dgrad", lambda: ops.grouped_linear_dgrad(dy, sizes, w)),
        ("grouped_linear_wgrad", lambda: ops.grouped_linear_wgrad(dy, x, sizes)),
        ("grouped_bias_bwd", lambda: ops.grouped_bias_bwd(dy, sizes, b, s, torch.float32)),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_bad_split_values_raise_on_the_real_kernels(device):
    """3 rows: a negative split, and splits summing to 4 (the sum is checked on the host)."""
    for name, call in _value_calls(device, [2, -1, 2]):
        with pytest.raises(RuntimeError,
                           match=rf"te_cpp.{name}: split_sizes\[1\] is -1; split sizes must"):
            call()
    for name, call in _value_calls(device, [2, 1, 1]):
        with pytest.raises(RuntimeError,
                           match=rf"te_cpp.{name}: split_sizes sum to 4 but \w+ has 3 rows"):
            call()


def test_meta_kernels_never_read_the_split_values():
    """The output shapes come from the argument shapes: bad split values pass on Meta (so
    torch.compile traces the ops without data-dependent shapes)."""
    for splits in ([2, -1, 2], [2, 1, 1]):
        for name, call in _value_calls("meta", splits):
            out = call()
            if name == "grouped_linear_fwd":
                assert out.shape == (3, OUT_F)
            if name == "grouped_linear_wgrad":
                assert len(out) == 3 and out[0].shape == (OUT_F, IN_F)


def test_split_sizes_on_another_device_than_x():
    """split_sizes on Meta with CPU data: only its shape and dtype are checked there."""
    x, dy, split_sizes, w, b, _ = _problem([3, 2], torch.float32, "cpu")
    y = ops.grouped_linear_fwd(x.to("meta"), split_sizes, [t.to("meta") for t in w],
                               [t.to("meta") for t in b], None)
    assert y.shape == (5, OUT_F)


# ---- threads, size ----------------------------------------------------------------------------


def _all_ops(splits, in_f, out_f, dtype):
    torch.manual_seed(1)
    rows = sum(splits)
    x = torch.randn(rows, in_f).to(dtype)
    dy = torch.randn(rows, out_f).to(dtype)
    w = [torch.randn(out_f, in_f).to(dtype) for _ in splits]
    b = [torch.randn(out_f).to(dtype) for _ in splits]
    s = torch.rand(rows)
    sizes = torch.tensor(splits)
    dbias, dscales = ops.grouped_bias_bwd(dy, sizes, b, s, torch.float32)
    return [ops.grouped_linear_fwd(x, sizes, w, b, None), ops.grouped_linear_fwd(x, sizes, w, b, s),
            ops.grouped_linear_dgrad(dy, sizes, w), *ops.grouped_linear_wgrad(dy, x, sizes),
            *dbias, dscales]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", ["many_small_groups", "few_large_groups"])
def test_cpu_results_do_not_depend_on_the_thread_count(shape, dtype):
    if shape == "many_small_groups":  # the groups run in parallel, each GEMM on one thread
        splits, in_f, out_f = [5, 0, 17, 1, 33, 8, 64, 2, 9, 40, 3, 70], 48, 40
    else:  # one GEMM after the other, each with ATen's threads
        splits, in_f, out_f = [300, 0, 200], 256, 192
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _all_ops(splits, in_f, out_f, dtype)
        torch.set_num_threads(max(2, threads))
        many = _all_ops(splits, in_f, out_f, dtype)
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, many):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_larger_case(device):
    """8 groups, T = 4096 tokens, in 1024, out 2048, fp32: forward, dgrad and wgrad."""
    torch.manual_seed(2)
    splits = [700, 0, 1200, 1, 512, 900, 383, 400]
    rows = sum(splits)
    assert rows == 4096
    x = torch.randn(rows, 1024, device=device)
    dy = torch.randn(rows, 2048, device=device) * 0.03
    w = [torch.randn(2048, 1024, device=device) * 0.03 for _ in splits]
    b = [torch.randn(2048, device=device) for _ in splits]
    split_sizes = torch.tensor(splits, device=device)
    _close(ops.grouped_linear_fwd(x, split_sizes, w, b, None), ref_fwd(x, splits, w, b, None),
           torch.float32)
    _close(ops.grouped_linear_dgrad(dy, split_sizes, w), ref_dgrad(dy, splits, w), torch.float32)
    for got, exp in zip(ops.grouped_linear_wgrad(dy, x, split_sizes), ref_wgrad(dy, x, splits)):
        _close(got, exp, torch.float32)
