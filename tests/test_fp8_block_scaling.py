"""Float8BlockScaling (TransformerEngine's Float8BlockQuantizer): the quantize / dequantize ops
bit for bit against an independent plain-PyTorch emulation written here (random and
adversarial inputs, 1x128 and 128x128 blocks, power-of-two scales on and off, epsilon, partial
blocks, 1-D and 3-D), the quantizer and tensor API, the recipe and its recipe state, and the
ops under te.autocast(recipe=Float8BlockScaling()): BasicLinear against a float64 emulation,
compiled (fullgraph, aot_eager) equal to eager, a training loop and every conformance case."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs
from torch._dynamo.utils import counters

import transformer_engine_cpp as te
from transformer_engine_cpp.quantization.fp8_block import (Float8BlockQuantizer,
                                                           Float8BlockScalingRecipeState,
                                                           Float8BlockwiseQTensor,
                                                           Float8BlockwiseQTensorStorage)
from transformer_engine_cpp.quantization.tensor import as_storage
from transformer_engine_cpp.testing.reference import (fp8_block_quantize_reference,
                                                       te_prenorm_mlp)
from harness import check_quantized_weights_compile_checkpoint_cast
from tolerances import COMPILED_VS_EAGER, tols

ops = torch.ops.te_cpp
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
B = 128
FP32 = tols(torch.float32)


# ---- the independent emulation (TransformerEngine's quantize_transpose_*_blockwise rule) ----

def _value_for_inf(dtype):
    """A +inf scale becomes the input dtype's largest finite value (fp64 is quantized as fp32)."""
    return torch.finfo(dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32).max


def ref_scale(amax, fmt, pow2, eps, value_for_inf):
    """Scale from a block amax (fp32): floor at eps; amax 0 or inf -> 1; fp8_max / amax in
    fp32; +inf -> value_for_inf; with pow2 the exponent bits only."""
    amax = torch.maximum(amax, torch.tensor(eps, dtype=torch.float32))
    scale = torch.tensor(torch.finfo(fmt).max, dtype=torch.float32) / amax
    scale = torch.where(torch.isinf(scale), torch.tensor(value_for_inf, dtype=torch.float32),
                        scale)
    if pow2:
        scale = (scale.view(torch.int32) & torch.tensor(0xFF800000 - (1 << 32),
                                                        dtype=torch.int32)).view(torch.float32)
    return torch.where((amax == 0) | torch.isinf(amax), torch.ones_like(scale), scale)


def ref_block_quantize(x, fmt, block_dim, pow2=False, eps=0.0):
    """(data uint8 in x's shape, scale_inv fp32) as TransformerEngine computes them."""
    vinf = _value_for_inf(x.dtype)
    shape = x.shape
    x2 = x.to(torch.float32).reshape(-1, shape[-1])
    M, K = x2.shape
    Mp = M if block_dim == 1 else -(-M // B) * B
    Kp = -(-K // B) * B
    xp = torch.zeros(Mp, Kp, dtype=torch.float32)
    xp[:M, :K] = x2
    mag = torch.where(torch.isnan(xp), torch.zeros_like(xp), xp.abs())  # NaN skipped
    if block_dim == 1:
        amax = mag.reshape(Mp, Kp // B, B).amax(-1)
        scale = ref_scale(amax, fmt, pow2, eps, vinf)
        full = scale.repeat_interleave(B, dim=1)
        scale_shape = (*shape[:-1], Kp // B)
    else:
        amax = mag.reshape(Mp // B, B, Kp // B, B).amax(dim=(1, 3))
        scale = ref_scale(amax, fmt, pow2, eps, vinf)
        full = scale.repeat_interleave(B, dim=0).repeat_interleave(B, dim=1)
        scale_shape = (Mp // B, Kp // B)
    fmax = torch.finfo(fmt).max
    q = torch.clamp(xp * full, -fmax, fmax).to(fmt).view(torch.uint8)[:M, :K]
    return q.reshape(shape), (1.0 / scale).reshape(scale_shape)


def ref_block_dequantize(data, scale_inv, fmt, block_dim, dtype=torch.float32):
    shape = data.shape
    d2 = data.reshape(-1, shape[-1]).view(fmt).to(torch.float32)
    M, K = d2.shape
    s = scale_inv.reshape(-1, scale_inv.shape[-1])
    s = s.repeat_interleave(B, dim=1)[:, :K]
    if block_dim == 2:
        s = s.repeat_interleave(B, dim=0)[:M]
    return (d2 * s).to(dtype).reshape(shape)


def fq(t, fmt, block_dim, pow2=True, eps=0.0):
    """dequantize(quantize(t)) rowwise, as float64 (exact)."""
    d, s = ref_block_quantize(t, fmt, block_dim, pow2, eps)
    return ref_block_dequantize(d, s, fmt, block_dim).double()


def fq_cols(t, fmt, block_dim, pow2=True, eps=0.0):
    """The columnwise copy: blocks down the columns of the 2-D view."""
    cols = t.shape[-1]
    return fq(t.reshape(-1, cols).t().contiguous(), fmt, block_dim, pow2, eps).t().reshape(t.shape)


# ---- inputs ----

def _adversarial(shape, dtype, seed):
    """Random values spanning many binades, with special blocks: zeros, all-equal, values at
    448 and 57344, denormals (and all-denormal blocks), inf, -inf and NaN, a lone huge
    value."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    x *= torch.exp2(torch.randint(-20, 20, (n,), generator=g).double())
    if n >= 1200:
        x[0:128] = 0.0                      # a zero block
        x[128:256] = -3.25                  # all equal
        x[256:300] = 448.0                  # at E4M3's max
        x[300:340] = -57344.0               # at E5M2's max
        x[400:460] = 1e-40                  # denormal (fp32, bf16; zero in fp16)
        x[520] = float("inf")
        x[650] = -float("inf")
        x[777] = float("nan")
        x[900:1000] = float("nan")
        x[1100] = 3e38
    x = x.reshape(-1, shape[-1])
    if x.shape[0] >= 4:  # whole rows of denormals: all-denormal 1x128 blocks and (for 130
        x[-2:] = -1e-40  # rows) an all-denormal partial tile, whose scale overflows to +inf
    return x.reshape(shape).to(dtype)


SHAPES = [(1, 1), (7, 129), (130, 300), (3, 70, 256), (1000,), (256, 128), (2, 3, 4)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=str)
@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_quantize_matches_the_emulation(shape, block_dim, dtype):
    x = _adversarial(shape, dtype, seed=len(shape) * 100 + shape[-1])
    for fmt in (E4M3, E5M2):
        for pow2, eps in ((False, 0.0), (True, 0.0), (False, 1e-3), (True, 0.5)):
            data, scale_inv = ops.fp8_block_quantize(x, fmt, block_dim, pow2, eps)
            rd, rs = ref_block_quantize(x, fmt, block_dim, pow2, eps)
            what = f"{fmt} pow2={pow2} eps={eps}"
            assert data.dtype == torch.uint8 and data.shape == x.shape, what
            assert scale_inv.shape == rs.shape, what
            assert torch.equal(scale_inv, rs), what
            assert torch.equal(data, rd), what
            for out in (torch.float32, torch.bfloat16, torch.float64):
                got = ops.fp8_block_dequantize(data, scale_inv, fmt, block_dim, out)
                want = ref_block_dequantize(rd, rs, fmt, block_dim, out)
                torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def _realistic(dtype):
    """A 4096x1024 activation: random normal with adversarial rows: a zero row block (zero
    1x128 blocks and 128x128 tiles), a lone huge value, a row of denormals (all-denormal
    blocks, whose scale overflows to +inf) and denormals among normal values."""
    g = torch.Generator().manual_seed(16)
    x = torch.randn(4096, 1024, generator=g)
    x[128:256] = 0.0
    x[1000, 517] = 3e38                                  # finite in fp32 and bf16
    x[2049] = -1e-40                                     # denormal in fp32 and bf16
    x[3000, ::3] = 1e-39 * torch.randn(342, generator=g)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_dim", [1, 2])
def test_quantize_at_a_realistic_size(block_dim, dtype):
    """4096x1024 through the quantizer (the op on x, and for the columnwise copy on its
    transpose, or the rowwise copy transposed for 128x128 tiles): both copies' bytes and scales
    bit for bit against the emulation, power-of-two scales on and off, and the dequantize op
    equal to the emulation's."""
    x = _realistic(dtype)
    xt = x.t().contiguous()
    for fmt, pow2 in ((E4M3, True), (E4M3, False), (E5M2, False)):
        s = Float8BlockQuantizer(fmt, rowwise=True, columnwise=True, block_scaling_dim=block_dim,
                                 force_pow_2_scales=pow2).quantize_storage(x, columnwise=True)
        for copy_, src, data, scale_inv in (
                ("rowwise", x, s._rowwise_data, s._rowwise_scale_inv),
                ("columnwise", xt, s._columnwise_data, s._columnwise_scale_inv)):
            what = f"{copy_} {fmt} pow2={pow2}"
            rd, rs = ref_block_quantize(src, fmt, block_dim, pow2)
            assert torch.equal(scale_inv, rs), what
            assert torch.equal(data, rd), what
            if copy_ == "rowwise" and block_dim == 1:  # the special blocks are there
                assert (rs[128] == 1).all() and (rs[2049] <= 2.0 ** -126).all(), what
            for out in (torch.float32, dtype):
                got = ops.fp8_block_dequantize(data, scale_inv, fmt, block_dim, out)
                want = ref_block_dequantize(rd, rs, fmt, block_dim, out)
                assert torch.equal(got, want), f"{what} dequantized to {out}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_dim", [1, 2])
def test_the_benchmarks_plain_torch_provider_is_the_op(block_dim, dtype):
    """bench/bench_fp8.py times testing.reference.fp8_block_quantize_reference as plain
    PyTorch: the op's bytes and scales (E4M3, power-of-two scales) on the realistic input."""
    x = _realistic(dtype)
    data, scale_inv = ops.fp8_block_quantize(x, E4M3, block_dim, True, 0.0)
    rd, rs = fp8_block_quantize_reference(x, block_dim)
    assert torch.equal(scale_inv, rs) and torch.equal(data, rd)


@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("block_dim", [1, 2])
def test_dequantize_every_byte_and_edge_scales(block_dim, out):
    """Every byte value (NaN and inf included) over runs of 128 and a partial block of 44 per
    row, with scale_inv from fp32-denormal-product sizes to huge, zero, inf and NaN."""
    g = torch.Generator().manual_seed(5)
    data = torch.randint(0, 256, (130, 300), dtype=torch.uint8, generator=g)
    data[0, :256] = torch.arange(256, dtype=torch.uint8)
    rows = 130 if block_dim == 1 else 2
    edge = torch.tensor([1.0, 2.0 ** -118, 2.0 ** -126, 1e-45, 2.0 ** 120, 0.0, float("inf"),
                         float("nan"), 0.37])
    scale_inv = edge[torch.randint(0, edge.numel(), (rows, 3), generator=g)]
    scale_inv[0] = edge[:3]
    for fmt in (E4M3, E5M2):
        got = ops.fp8_block_dequantize(data, scale_inv, fmt, block_dim, out)
        want = ref_block_dequantize(data, scale_inv, fmt, block_dim, out)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_special_blocks():
    """The rules one block at a time (E4M3, no pow2): a zero block has scale 1; an inf block
    scale 1 (inf saturates to 448); NaN elements are skipped by the amax and stay NaN; a block
    of 448 has scale 1; an all-denormal block's +inf scale becomes FLT_MAX in fp32 and bf16's
    max in bf16."""
    x = torch.zeros(6, 128)
    x[1, 0] = float("inf")
    x[1, 1] = 2.0
    x[2, :] = 4.0
    x[2, 5] = float("nan")
    x[3, :] = 448.0
    x[4, :] = 1e-40
    x[5, :] = -1.0
    data, scale_inv = ops.fp8_block_quantize(x, E4M3, 1, False, 0.0)
    assert scale_inv[0, 0] == 1.0 and torch.all(data[0] == 0)
    assert scale_inv[1, 0] == 1.0 and data[1, 0] == 0x7E and data[1, 1] == 0x40  # 448, 2
    assert scale_inv[2, 0] == 4.0 / 448.0 and data[2, 5] == 0x7F  # NaN
    assert scale_inv[3, 0] == 1.0
    assert scale_inv[4, 0] == 1.0 / torch.finfo(torch.float32).max
    assert scale_inv[5, 0] == 1.0 / 448.0
    _, s_bf16 = ops.fp8_block_quantize(x[4:5].bfloat16(), E4M3, 1, False, 0.0)
    assert s_bf16[0, 0] == 1.0 / torch.tensor(torch.finfo(torch.bfloat16).max)
    # pow2: 448 / 4 = 112 rounds down to 64
    _, s2 = ops.fp8_block_quantize(x[2:3], E4M3, 1, True, 0.0)
    assert s2[0, 0] == 1.0 / 64.0
    # epsilon floors the amax: a zero block gets fp8_max / eps
    _, s3 = ops.fp8_block_quantize(x[0:1], E4M3, 1, False, 2.0)
    assert s3[0, 0] == 2.0 / 448.0


def test_block_layouts():
    """1x128 blocks run along the last dim, 128x128 tiles over the 2-D view; a partial block
    holds what is left (its scale comes from its own elements only)."""
    x = torch.ones(130, 300)
    x[129, 299] = 8.0  # in the last row's last 1x128 block, the last tile
    _, s1 = ops.fp8_block_quantize(x, E4M3, 1, False, 0.0)
    assert s1.shape == (130, 3)
    assert s1[129, 2] == 8.0 / 448.0 and torch.all(s1.flatten()[:-1] == 1.0 / 448.0)
    _, s2 = ops.fp8_block_quantize(x, E4M3, 2, False, 0.0)
    assert s2.shape == (2, 3)
    assert s2[1, 2] == 8.0 / 448.0 and torch.all(s2.flatten()[:-1] == 1.0 / 448.0)
    _, s3 = ops.fp8_block_quantize(x.reshape(2, 65, 300), E4M3, 2, False, 0.0)
    assert torch.equal(s3, s2)  # tiles over the 2-D view, whatever the leading dims
    assert ops.fp8_block_quantize(x.reshape(2, 65, 300), E4M3, 1, False, 0.0)[1].shape == (2, 65, 3)


def test_op_errors():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"te_cpp\.fp8_block_quantize: block_dim must be 1"):
        ops.fp8_block_quantize(x, E4M3, 3, False, 0.0)
    with pytest.raises(ValueError, match=r"te_cpp\.fp8_block_quantize: amax_epsilon"):
        ops.fp8_block_quantize(x, E4M3, 1, False, -1.0)
    with pytest.raises(RuntimeError, match=r"te_cpp\.fp8_block_quantize: fp8_dtype"):
        ops.fp8_block_quantize(x, torch.float32, 1, False, 0.0)
    with pytest.raises(RuntimeError, match=r"te_cpp\.fp8_block_quantize: input must have at least"):
        ops.fp8_block_quantize(torch.tensor(1.0), E4M3, 1, False, 0.0)
    data, s = ops.fp8_block_quantize(x, E4M3, 1, False, 0.0)
    with pytest.raises(RuntimeError, match=r"te_cpp\.fp8_block_dequantize: scale_inv must have "
                                           r"shape \[1, 1\]"):
        ops.fp8_block_dequantize(data, s, E4M3, 2, torch.float32)


# ---- quantizer, tensor, recipe ----

@pytest.mark.parametrize("block_dim", [1, 2])
def test_quantizer_copies_and_tensor(block_dim):
    x = _adversarial((3, 50, 200), torch.bfloat16, seed=5)
    q = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=block_dim,
                             amax_epsilon=1e-6)
    t = q(x)
    assert isinstance(t, Float8BlockwiseQTensor) and t.dtype == torch.bfloat16
    assert t.shape == x.shape and t._columnwise_data.shape == (200, 150)
    torch.testing.assert_close(t._rowwise_data, ref_block_quantize(x, E4M3, block_dim, True,
                                                                   1e-6)[0], rtol=0, atol=0)
    s = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=block_dim,
                             amax_epsilon=1e-6).quantize_storage(x, columnwise=True)
    torch.testing.assert_close(s.dequantize_rowwise().double(), fq(x, E4M3, block_dim, True, 1e-6),
                               rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(s.dequantize_columnwise().double(),
                               fq_cols(x, E4M3, block_dim, True, 1e-6), rtol=0, atol=0,
                               equal_nan=True)
    # columnwise only: the same bytes as with the rowwise copy
    c = q.quantize_storage(x, rowwise=False, columnwise=True)
    assert torch.equal(c._columnwise_data, s._columnwise_data)
    assert torch.equal(c._columnwise_scale_inv, s._columnwise_scale_inv)
    # saved buffers round trip
    r = Float8BlockwiseQTensorStorage.from_buffers(s.buffers(), s.metadata())
    assert r._is_2D_scaled == (block_dim == 2)
    torch.testing.assert_close(r.dequantize_columnwise(), s.dequantize_columnwise(), rtol=0,
                               atol=0, equal_nan=True)
    assert t.detach()._is_2D_scaled == (block_dim == 2)
    t.update_usage(columnwise_usage=False)
    with pytest.raises(RuntimeError, match="columnwise data was not quantized"):
        t.dequantize_columnwise()


def test_quantizer_arguments():
    q = Float8BlockQuantizer(te.DType.kFloat8E5M2, rowwise=True, columnwise=False)
    assert q.dtype == E5M2 and q.block_scaling_dim == 2 and q.force_pow_2_scales  # TE defaults
    assert q.amax_epsilon == 0.0 and q.block_len == 128
    for kwargs, match in (({"block_scaling_dim": 3}, "block_scaling_dim must be 1 or 2"),
                          ({"amax_epsilon": -1.0}, "amax_epsilon must be"),
                          ({"amax_epsilon": float("nan")}, "amax_epsilon must be")):
        with pytest.raises(ValueError, match=f"Float8BlockQuantizer: {match}"):
            Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, **kwargs)
    with pytest.raises(ValueError, match="fp8_dtype must be"):
        Float8BlockQuantizer(torch.float16, rowwise=True, columnwise=True)
    with pytest.raises(ValueError, match="0-d tensor"):
        q(torch.tensor(1.0))


def test_2d_columnwise_copy_is_the_transpose():
    x = torch.randn(200, 300)
    s = Float8BlockQuantizer(E5M2, rowwise=True, columnwise=True,
                             block_scaling_dim=2).quantize_storage(x, columnwise=True)
    d, sc = ops.fp8_block_quantize(x.t().contiguous(), E5M2, 2, True, 0.0)
    assert torch.equal(s._columnwise_data, d) and torch.equal(s._columnwise_scale_inv, sc)


def test_recipe_fields_and_validation(monkeypatch):
    r = te.recipe.Float8BlockScaling()
    assert r.float8_block_scaling() and not r.mxfp8() and not r.float8_per_tensor_scaling()
    assert r.fp8_format == te.recipe.Format.E4M3
    assert (r.x_block_scaling_dim, r.w_block_scaling_dim, r.grad_block_scaling_dim) == (1, 2, 1)
    assert r.fp8_quant_fwd_inp == te.recipe.QParams(power_2_scale=True, amax_epsilon=0.0)
    assert r.fp8_gemm_fprop.use_split_accumulator and r.backward_override is None
    monkeypatch.setenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "1")
    assert not te.recipe.Float8BlockScaling().fp8_quant_bwd_grad.power_2_scale
    for kwargs in ({"x_block_scaling_dim": 3}, {"x_block_scaling_dim": 2},
                   {"grad_block_scaling_dim": 2},
                   {"fp8_gemm_dgrad": te.recipe.MMParams(use_split_accumulator=False)},
                   {"fp8_dpa": True}, {"fp8_format": te.recipe.Format.E5M2},
                   {"backward_override": "bad"}, {"fp8_quant_fwd_inp": 1}):
        with pytest.raises(ValueError, match="Float8BlockScaling"):
            te.recipe.Float8BlockScaling(**kwargs)
    te.recipe.Float8BlockScaling(x_block_scaling_dim=2, w_block_scaling_dim=1)
    assert te.is_fp8_block_scaling_available() is True
    ok, reason = te.is_fp8_block_scaling_available(return_reason=True)
    assert ok and "emulated" in reason


def test_recipe_state_roles():
    r = te.recipe.Float8BlockScaling(
        fp8_format=te.recipe.Format.HYBRID,
        fp8_quant_fwd_inp=te.recipe.QParams(power_2_scale=False, amax_epsilon=1e-3),
        fp8_quant_fwd_weight=te.recipe.QParams(power_2_scale=True, amax_epsilon=0.5),
        fp8_quant_bwd_grad=te.recipe.QParams(power_2_scale=False, amax_epsilon=0.25))
    fwd = te.quantization.RecipeState.create(r, mode="forward", num_quantizers=3)
    assert isinstance(fwd, Float8BlockScalingRecipeState)
    x, w, out = fwd.make_quantizers()
    assert (x.block_scaling_dim, x.force_pow_2_scales, x.amax_epsilon, x.dtype) == (
        1, False, 1e-3, E4M3)
    assert (w.block_scaling_dim, w.force_pow_2_scales, w.amax_epsilon) == (2, True, 0.5)
    assert out.block_scaling_dim == 1 and out.amax_epsilon == 1e-3
    (g,) = te.quantization.RecipeState.create(r, mode="backward", num_quantizers=1) \
        .make_quantizers()
    assert (g.block_scaling_dim, g.force_pow_2_scales, g.amax_epsilon, g.dtype) == (
        1, False, 0.25, E5M2)


# ---- the ops under the recipe ----

RECIPES = {
    "default": (lambda: te.recipe.Float8BlockScaling(), (1, 2, 1), (True, True, True),
                (0.0, 0.0, 0.0)),
    "f32_eps_hybrid": (lambda: te.recipe.Float8BlockScaling(
        fp8_format=te.recipe.Format.HYBRID, x_block_scaling_dim=2, w_block_scaling_dim=1,
        fp8_quant_fwd_inp=te.recipe.QParams(power_2_scale=False, amax_epsilon=1e-2),
        fp8_quant_fwd_weight=te.recipe.QParams(power_2_scale=False),
        fp8_quant_bwd_grad=te.recipe.QParams(power_2_scale=True, amax_epsilon=1e-3)),
        (2, 1, 1), (False, False, True), (1e-2, 0.0, 1e-3)),
}


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_basic_linear_gemms_match_the_emulation(recipe_name):
    make_recipe, (xd, wd, gd), (xp, wp, gp), (xe, we, ge) = RECIPES[recipe_name]
    recipe = make_recipe()
    bwd_fmt = E4M3 if recipe.fp8_format == te.recipe.Format.E4M3 else E5M2
    torch.manual_seed(0)
    op = te.ops.BasicLinear(200, 150)
    # values over many binades, so that the block layout matters even with power-of-two scales
    # (a block's small values fall into E4M3's subnormals)
    with torch.no_grad():
        op.weight.mul_(torch.exp2(torch.randint(-8, 8, (150, 200)).float()))
    x = (torch.randn(2, 70, 200) * torch.exp2(torch.randint(-8, 8, (2, 70, 200)).float()))
    x.requires_grad_()
    dy = torch.randn(2, 70, 150) * torch.exp2(torch.randint(-8, 8, (2, 70, 150)).float())
    with te.autocast(recipe=recipe):
        y = op(x)
    y.backward(dy)
    w, xd_ = op.weight.detach(), x.detach()
    gemms = {  # name: (got, the float64 emulation's operands a, b of a @ b)
        "fprop": (y, fq(xd_, E4M3, xd, xp, xe), fq(w, E4M3, wd, wp, we).t()),
        "dgrad": (x.grad, fq(dy, bwd_fmt, gd, gp, ge), fq_cols(w, E4M3, wd, wp, we)),
        "wgrad": (op.weight.grad, fq_cols(dy, bwd_fmt, gd, gp, ge).reshape(-1, 150).t(),
                  fq_cols(xd_, E4M3, xd, xp, xe).reshape(-1, 200)),
    }
    for name, (got, a, b) in gemms.items():
        # the operands are exact; the GEMM accumulates in fp32, whose error over k terms is
        # at most k * 2^-24 * (|a| @ |b|) (the values span 16 binades, so sums cancel)
        ref, bound = a @ b, (a.abs() @ b.abs()) * (a.shape[-1] * 2.0 ** -24)
        err = (got.double() - ref).abs()
        assert torch.all(err <= bound + 1e-30), f"{name}: {(err - bound).max()}"
    assert not torch.allclose(y, xd_ @ w.t(), rtol=1e-2, atol=1e-2)


def test_saved_tensors_are_the_quantized_buffers():
    op = te.ops.BasicLinear(200, 130)
    x = torch.randn(70, 200, requires_grad=True)
    with te.autocast(recipe=te.recipe.Float8BlockScaling()):
        y = op(x)
    saved = [t for t in y.grad_fn.saved_tensors if t is not None]
    assert saved and all(t.dtype in (torch.uint8, torch.float32) for t in saved)
    # uint8 bytes and fp32 scales only, no high-precision copy. BasicLinear saves a storage's
    # four buffers, so both copies of x and W are kept (TransformerEngine drops the rowwise ones
    # before saving): bytes 2 x (x + W); scales x [70, 2] + x^T [200, 1] in 1x128 blocks and
    # W, W^T [2, 2] each in 128x128 tiles
    assert sum(t.numel() for t in saved if t.dtype == torch.uint8) == 2 * (70 * 200 + 130 * 200)
    assert sum(t.numel() for t in saved if t.dtype == torch.float32) == 140 + 200 + 4 + 4


@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_compiled_mlp_block_equals_eager(recipe_name):
    make_recipe = RECIPES[recipe_name][0]
    torch.manual_seed(0)
    eager = te_prenorm_mlp(64, 160)
    comp_model = copy.deepcopy(eager)
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(comp_model, backend=backend, fullgraph=True)
    x = torch.randn(2, 70, 64, requires_grad=True)
    xc = x.detach().clone().requires_grad_()
    dy = torch.randn(2, 70, 64)
    counters.clear()
    with te.autocast(recipe=make_recipe()):
        y = eager(x)
        yc = compiled(xc)
    y.backward(dy)
    yc.backward(dy)
    assert len(counters["graph_break"]) == 0
    torch.testing.assert_close(yc, y, **COMPILED_VS_EAGER)
    torch.testing.assert_close(xc.grad, x.grad, **COMPILED_VS_EAGER)
    for (n, p), q in zip(comp_model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **COMPILED_VS_EAGER, msg=lambda m: f"{n}: {m}")
    for graph in (backend.fw_graphs[0], backend.bw_graphs[0]):
        assert "te_cpp.fp8_block_quantize" in graph.code
        deq = [n for n in graph.graph.nodes
               if n.op == "call_function" and "fp8_block_dequantize" in str(n.target)]
        assert deq and all(n.args[0].meta["val"].dtype == torch.uint8 for n in deq)


def test_training_loop():
    """A bf16 LayerNorm-Linear-GELU-Linear regression trained under the recipe (with inference
    steps in between) learns about as well as the unquantized one."""
    def train(recipe):
        torch.manual_seed(0)
        model = te.ops.Sequential(te.ops.LayerNorm(96), te.ops.Linear(96, 160), te.ops.GELU(),
                                  te.ops.Linear(160, 96)).bfloat16()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(4, 40, 96, generator=g).bfloat16()
        target = torch.sin(x)
        losses = []
        for step in range(24):
            xb, tb = x[step % 4], target[step % 4]
            if step % 6 == 5:
                with torch.inference_mode(), te.autocast(enabled=recipe is not None,
                                                         recipe=recipe):
                    y = model(xb)
                assert y.dtype == torch.bfloat16 and not y.requires_grad
                continue
            opt.zero_grad(set_to_none=True)
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                y = model(xb)
            loss = (y.float() - tb.float()).pow(2).mean()
            loss.backward()
            assert all(p.grad is not None and p.grad.dtype == torch.bfloat16
                       for p in model.parameters())
            opt.step()
            losses.append(loss.item())
        return losses

    quantized, plain = train(te.recipe.Float8BlockScaling()), train(None)
    assert quantized != plain
    assert sum(quantized[-4:]) < 0.7 * sum(quantized[:4])
    assert abs(sum(quantized[-4:]) - sum(plain[-4:])) < 0.1 * sum(plain[-4:])


def test_neighbours_hand_over_block_quantized_operands(monkeypatch):
    """The producers before the linears (LayerNorm, GELU) emit their outputs block-quantized
    with the linear's input quantizer (both copies), and the result is bit-identical to the
    same stack with an Identity in between (which turns the hand-over off)."""
    emitted = []
    emit = Float8BlockQuantizer.emit

    def counting_emit(self, y):
        out = emit(self, y)
        emitted.append(isinstance(out, Float8BlockwiseQTensorStorage))
        return out

    monkeypatch.setattr(Float8BlockQuantizer, "emit", counting_emit)

    def make(with_barrier):
        torch.manual_seed(0)
        layers = [te.ops.LayerNorm(64), te.ops.Identity(), te.ops.Linear(64, 150), te.ops.GELU(),
                  te.ops.Identity(), te.ops.Linear(150, 64)]
        return te.ops.Sequential(*[op for op in layers
                                   if with_barrier or not isinstance(op, te.ops.Identity)])

    outs = []
    for with_barrier in (False, True):
        emitted.clear()
        model = make(with_barrier)
        x = torch.randn(2, 70, 64, generator=torch.Generator().manual_seed(1),
                        requires_grad=True)
        with te.autocast(recipe=te.recipe.Float8BlockScaling()):
            y = model(x)
        y.backward(torch.ones_like(y))
        outs.append((y.detach(), x.grad, [p.grad for p in model.parameters()]))
        if not with_barrier:
            assert emitted and all(emitted)
    (y0, dx0, g0), (y1, dx1, g1) = outs
    assert torch.equal(y0, y1) and torch.equal(dx0, dx1)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))


def test_checkpoint_round_trip():
    """The recipe keeps no state: a model trained under it, saved and restored, computes the
    same bits under the recipe, and its extra state is empty."""
    import io

    recipe = te.recipe.Float8BlockScaling()

    def make():
        torch.manual_seed(0)
        return te.ops.Sequential(te.ops.Linear(160, 130), te.ops.GELU(), te.ops.Linear(130, 96))

    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(3):
        with te.autocast(recipe=recipe):
            model(torch.randn(20, 160) * (i + 1)).pow(2).mean().backward()
        opt.step()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert state["0.basic_ops.0._extra_state"].numel() == 0
    restored = make()
    restored.load_state_dict(state)
    x = torch.randn(20, 160)
    with te.autocast(recipe=recipe):
        y, y2 = model(x), restored(x)
    assert torch.equal(y, y2)
    assert not torch.equal(y, make()(x))  # the trained weights were restored


def test_quantize_op_hands_out_block_quantized_tensors():
    """Quantize under the recipe gives the caller a Float8BlockwiseQTensor forward and as the
    input's gradient (TransformerEngine's); compiled, the same values dequantized."""
    torch.manual_seed(0)
    x = torch.randn(70, 200, requires_grad=True)
    dy = torch.randn(70, 200)
    model = te.ops.Sequential(te.ops.Quantize(forward=True, backward=True))
    with te.autocast(recipe=te.recipe.Float8BlockScaling()):
        y = model(x)
    y.backward(dy)
    assert isinstance(y, Float8BlockwiseQTensor) and isinstance(x.grad, Float8BlockwiseQTensor)
    torch.testing.assert_close(y.double(), fq(x.detach(), E4M3, 1), rtol=0, atol=0)
    torch.testing.assert_close(x.grad.double(), fq(dy, E4M3, 1), rtol=0, atol=0)
    xc = x.detach().clone().requires_grad_()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with te.autocast(recipe=te.recipe.Float8BlockScaling()):
        yc = compiled(xc)
    yc.backward(dy)
    assert torch.equal(yc, y.dequantize()) and torch.equal(xc.grad, x.grad.dequantize())


@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
def test_backward_override(override):
    """The forward is the quantized one; the backward GEMMs are unquantized, on the original
    operands ("high_precision") or the forward's dequantized rowwise copies ("dequantized")."""
    torch.manual_seed(0)
    op = te.ops.BasicLinear(200, 150)
    x = torch.randn(70, 200, requires_grad=True)
    dy = torch.randn(70, 150)
    with te.autocast(recipe=te.recipe.Float8BlockScaling(backward_override=override)):
        y = op(x)
    y.backward(dy)
    w, xd = op.weight.detach(), x.detach()
    torch.testing.assert_close(y.double(), fq(xd, E4M3, 1) @ fq(w, E4M3, 2).t(), **FP32)
    if override == "high_precision":
        w_ref, x_ref = w.double(), xd.double()
    else:
        w_ref, x_ref = fq(w, E4M3, 2), fq(xd, E4M3, 1)
    torch.testing.assert_close(x.grad.double(), dy.double() @ w_ref, **FP32)
    torch.testing.assert_close(op.weight.grad.double(), dy.double().t() @ x_ref, **FP32)


def test_quantized_weights_train_compile_cast_and_checkpoint(tmp_path):
    """te.quantized_model_init under Float8BlockScaling: the weights are Float8BlockwiseQTensors
    with both copies in 128x128 tiles (what quantizing the weight per call gives, so the same
    forward), an optimizer step re-quantizes them in place (both copies), compiled equals eager,
    and a checkpoint loads with torch.load's default weights_only=True."""
    recipe = te.recipe.Float8BlockScaling()
    E4M3 = torch.float8_e4m3fn

    def make():
        torch.manual_seed(0)
        return te.ops.Sequential(te.ops.Linear(160, 130), te.ops.GELU(), te.ops.Linear(130, 96))

    with te.quantized_model_init(recipe=recipe):
        model = make()
    plain = make()
    w = model[0].weight
    assert isinstance(w, te.Float8BlockwiseQTensor) and w._is_2D_scaled
    assert w._rowwise_data is not None and w._columnwise_data is not None
    x = torch.randn(2, 20, 160, requires_grad=True)
    with te.autocast(recipe=recipe):
        y, y_plain = model(x), plain(x)
    assert torch.equal(y, y_plain)
    y.sum().backward()
    before, grad = w.dequantize().detach().clone(), w.grad.clone()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    w = model[0].weight
    assert isinstance(w, te.Float8BlockwiseQTensor)  # re-quantized in place, both copies
    updated = before.clone().add_(grad, alpha=-0.1)  # SGD's update, in fp32
    torch.testing.assert_close(w.dequantize().double(), fq(updated, E4M3, 2), rtol=0, atol=0)
    torch.testing.assert_close(as_storage(w).dequantize_columnwise().double(),
                               fq_cols(updated, E4M3, 2), rtol=0, atol=0)
    assert not torch.equal(w.dequantize(), before)
    check_quantized_weights_compile_checkpoint_cast(model, make, recipe, x, tmp_path,
                                                    te.Float8BlockwiseQTensor)
