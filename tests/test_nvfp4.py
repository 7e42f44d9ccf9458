"""NVFP4BlockScaling: te_cpp.nvfp4_quantize / nvfp4_dequantize bit for bit against a plain-PyTorch
emulation written here (ops/nvfp4.h states the algorithm), the quantizer's copies, the recipe,
BasicLinear under the recipe against a float64 emulation, torch.compile and a training loop."""

import math

import pytest
import torch

import transformer_engine_cpp as te
from device_code import compile_ptx
from harness import check_quantized_weights_compile_checkpoint_cast
from transformer_engine_cpp.quantization.nvfp4 import NVFP4Quantizer, NVFP4TensorStorage
from transformer_engine_cpp.testing.reference import nvfp4_quantize_reference

ops = torch.ops.te_cpp
F32 = torch.float32
FLT_MAX = torch.finfo(F32).max

# ---- the emulation (fp32 tensor arithmetic, no custom op) ----------------------------------

GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
SIGNS = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]  # TransformerEngine's


def _hadamard16():
    h = torch.ones(1, 1)
    while h.shape[0] < 16:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return torch.diag(torch.tensor(SIGNS, dtype=F32)) @ h  # diag(s) H: entries +-1


M_NEG = (_hadamard16() < 0).tolist()  # M = diag(s) H / 4


def ref_rht(v):
    """y[..., j] = (sum over i in order of +-v[..., i]) * 0.25 per run of 16, in fp32."""
    b = v.reshape(*v.shape[:-1], -1, 16)
    out = torch.empty_like(b)
    for j in range(16):
        acc = torch.zeros_like(b[..., 0])
        for i in range(16):
            acc = acc - b[..., i] if M_NEG[i][j] else acc + b[..., i]
        out[..., j] = acc * 0.25
    return out.reshape(v.shape)


def ref_rht_inverse(y):
    b = y.reshape(*y.shape[:-1], -1, 16)
    out = torch.empty_like(b)
    for i in range(16):
        acc = torch.zeros_like(b[..., 0])
        for j in range(16):
            acc = acc - b[..., j] if M_NEG[i][j] else acc + b[..., j]
        out[..., i] = acc * 0.25
    return out.reshape(y.shape)


def ref_e2m1_rne(s):
    """Nearest grid magnitude, ties to the even code; saturating; sign bit kept; NaN -> 7."""
    a = s.abs().clamp(max=6.0)
    d = (a.unsqueeze(-1) - GRID).abs()
    best = d == d.min(-1, keepdim=True).values
    score = best.to(torch.int64) * (2 - torch.arange(8) % 2)  # prefer the even code on a tie
    code = score.argmax(-1)
    code = torch.where(torch.signbit(s), code | 8, code)
    return torch.where(s.isnan(), torch.full_like(code, 7), code)


def _philox4x32_10(key, counter):
    m32 = 0xFFFFFFFF
    c = [counter & m32, (counter >> 32) & m32, 0, 0]
    k = [key & m32, (key >> 32) & m32]
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & m32, (k[1] + 0xBB67AE85) & m32]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & m32, (p0 >> 32) ^ c[3] ^ k[1], p0 & m32]
    return c


def ref_draws(seed, n):
    key = seed & (2**64 - 1)
    out = []
    for blk in range((n + 3) // 4):
        out += _philox4x32_10(key, blk)
    return torch.tensor(out[:n], dtype=torch.int64)


def ref_e2m1_stochastic(s, draws):
    a = s.abs().nan_to_num(nan=0.0).clamp(max=6.0)
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    q = a / step
    fl = q.floor()
    u = (draws >> 8).to(torch.float64) / 2**24
    mag = (fl + (q - fl > u).to(F32)) * step
    code = (mag.unsqueeze(-1) == GRID).to(torch.int64).argmax(-1)
    code = torch.where(torch.signbit(s), code | 8, code)
    return torch.where(s.isnan(), torch.full_like(code, 7), code)


def ref_quantize(x, rht=False, block_2d=False, seed=None):
    """(data, scale bytes, amax) of nvfp4_quantize, on the 2-D view of x."""
    shape = x.shape
    v = x.to(F32).reshape(-1, shape[-1])
    if rht:
        v = ref_rht(v)
    rows, cols = v.shape
    # NaN elements are skipped (TransformerEngine's amax kernels reduce with fmaxf / __hmax)
    amax = torch.where(v.isnan(), 0.0, v.abs()).max() if v.numel() else torch.tensor(0.0)
    s_enc = torch.tensor(2688.0) / amax
    s_enc = torch.where(s_enc.isnan() | (s_enc > FLT_MAX), FLT_MAX, s_enc)
    s_enc = torch.where((amax == 0) | (s_enc == 0), 1.0, s_enc)
    mag = v.abs().nan_to_num(nan=0.0).reshape(rows, cols // 16, 16)
    bamax = mag.amax(-1)  # [rows, nb]
    if block_2d:
        pad = (-rows) % 16
        t = torch.cat([bamax, bamax.new_zeros(pad, bamax.shape[1])])
        t = t.reshape(-1, 16, bamax.shape[1]).amax(1)
        bamax = t.repeat_interleave(16, 0)[:rows]
    dec = bamax * (s_enc * torch.tensor(1.0 / 6.0, dtype=F32))
    dec = torch.where(dec.isnan() | (dec > FLT_MAX), FLT_MAX, dec)
    scale = dec.clamp(max=448.0).to(torch.float8_e4m3fn)
    enc = 1.0 / (scale.to(F32) * (1.0 / s_enc))
    enc = torch.where(enc.isnan() | (enc > FLT_MAX), FLT_MAX, enc)
    scaled = (v.reshape(rows, cols // 16, 16) * enc.unsqueeze(-1)).reshape(rows, cols)
    if seed is None:
        code = ref_e2m1_rne(scaled)
    else:
        code = ref_e2m1_stochastic(scaled, ref_draws(seed, rows * cols).reshape(rows, cols))
    data = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    return (data.reshape(*shape[:-1], cols // 2),
            scale.view(torch.uint8).reshape(*shape[:-1], cols // 16), amax.reshape(1))


def ref_dequantize(data, scale, amax, rht=False, dtype=F32):
    codes = torch.stack([data & 0xF, data >> 4], -1).reshape(*data.shape[:-1], -1).long()
    val = GRID[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    final = scale.view(torch.float8_e4m3fn).to(F32) * amax * torch.tensor(1.0 / 2688.0,
                                                                            dtype=F32)
    out = (val.reshape(*val.shape[:-1], -1, 16) * final.unsqueeze(-1)).reshape(val.shape)
    if rht:
        out = ref_rht_inverse(out)
    return out.to(dtype)


@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
@pytest.mark.parametrize("dtype", [F32, torch.bfloat16, torch.float16], ids=str)
def test_dequantize_every_byte_and_scale_at_extreme_amaxes(rht, dtype):
    """Every data byte under every E4M3 scale byte (NaN ones included), with tensor amaxes that
    make fp32-denormal products (and, under the inverse transform, denormal sums), ordinary
    ones, and ones whose sums overflow: the emulation's values and signs."""
    data = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(256, 2)  # 256 x 512 bytes
    scale = torch.arange(256, dtype=torch.int32).to(torch.uint8)[:, None].repeat(1, 64)
    for amax in (1e-36, 3e-31, 1.0, 2688.0, 1e30, 3e38):
        a = torch.tensor([amax], dtype=F32)
        out = ops.nvfp4_dequantize(data, scale, a, rht, dtype)
        ref = ref_dequantize(data, scale, a, rht, dtype)
        torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
        both = ~torch.isnan(ref)
        assert torch.equal(torch.signbit(out[both]), torch.signbit(ref[both])), amax


def bits_equal(a, b):
    if a.dtype.is_floating_point:
        a = a.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()])
        b = b.view(a.dtype)
    return torch.equal(a, b)


def assert_op_matches(x, rht=False, block_2d=False, seed=None):
    seed_t = None if seed is None else torch.tensor(seed, dtype=torch.int64)
    d, s, a = ops.nvfp4_quantize(x, rht, block_2d, seed_t)
    rd, rs, ra = ref_quantize(x, rht, block_2d, seed)
    assert torch.equal(s, rs), "scales differ"
    assert torch.equal(d, rd), "data differ"
    torch.testing.assert_close(a, ra, rtol=0, atol=0, equal_nan=True)
    for dtype in (F32, torch.bfloat16):
        out = ops.nvfp4_dequantize(d, s, a, rht, dtype)
        ref = ref_dequantize(rd, rs, ra, rht, dtype)
        torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)


# ---- the op, bit for bit -------------------------------------------------------------------


def _adversarial(rows=32, cols=64, dtype=F32):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(rows, cols, generator=g) * 3
    x[0] = 0.0                                       # an all-zero row (zero blocks)
    x[1, :16] = 2.5                                  # an all-equal block
    x[2, :16] = torch.tensor(1e-40).float()          # fp32 denormals
    x[3, 16:32] = torch.finfo(F32).max               # the format's max... of fp32
    x[4, :16] = torch.linspace(-6, 6, 16)            # values straddling the E2M1 grid
    x[5, 32:48] = -0.0
    return x.to(dtype)


@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
@pytest.mark.parametrize("block_2d", [False, True], ids=["1d", "2d"])
@pytest.mark.parametrize("dtype", [F32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
def test_quantize_random_and_adversarial(rht, block_2d, dtype):
    torch.manual_seed(0)
    assert_op_matches(torch.randn(48, 64).to(dtype), rht, block_2d)
    assert_op_matches((torch.randn(3, 5, 32) * 1e-3).to(dtype), rht, block_2d)
    x = _adversarial()
    if dtype != F32:
        x = x.clamp(-1e4, 1e4).to(dtype)
    assert_op_matches(x, rht, block_2d)


@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
def test_quantize_grid_ties_and_scale_edges(rht):
    """Exact E2M1 ties after scaling (amax 6 makes the global scale 448 and the scale of a
    block with amax 6 exactly 448: its elements are scaled by 1)."""
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.75, -1.25,
                         -1.75, -2.5, -3.5, -5.0, -6.0])
    x = torch.stack([ties, ties * 0.5, ties.flip(0), torch.full((16,), 6.0)])
    assert_op_matches(x, rht)
    d, s, a = ops.nvfp4_quantize(x, False, False, None)
    assert d[0].tolist() == [0x20, 0x42, 0x64, 0x76, 0xA8, 0xCA, 0xEC, 0xFE]


def _f32(bits):
    return torch.tensor(bits, dtype=torch.int32).view(F32)


@pytest.mark.parametrize("g_bits,c_bits", [(0x40815FD6, 0x3C1D18F2), (0x3F7C1A2C, 0x3B190FE4),
                                           (0x40C845D3, 0x3C733038), (0x40B42158, 0x3C747664)])
def test_block_scale_multiplication_order(g_bits, c_bits):
    """Block amaxes c whose E4M3 scale depends on the order of the fp32 products (an E4M3 tie
    point): c * (S_enc * float(1/6)) is the rule, (c * S_enc) * float(1/6) gives another byte.
    (Found by a search over tensor amaxes g near E4M3 midpoints.)"""
    x = torch.zeros(1, 32)
    x[0, 0] = _f32(g_bits)
    x[0, 16] = _f32(c_bits)
    assert_op_matches(x)
    g, c = _f32(g_bits), _f32(c_bits)
    s_enc = torch.tensor(2688.0) / g
    other = ((c * s_enc) * torch.tensor(1 / 6, dtype=F32)).to(torch.float8_e4m3fn)
    assert ops.nvfp4_quantize(x, False, False, None)[1][0, 1] != other.view(torch.uint8)


def test_quantize_zeros_inf_nan():
    for x in (torch.zeros(16, 32), torch.full((16, 16), -0.0), torch.full((2, 16), 3.0)):
        assert_op_matches(x)
        assert_op_matches(x, block_2d=True)
    x = torch.randn(4, 32)
    x[1, 3] = float("inf")
    assert_op_matches(x)
    x[2, 5] = float("nan")
    assert_op_matches(x)
    y = torch.randn(4, 32)
    y[0, 0] = float("nan")
    assert_op_matches(y)
    d, s, a = ops.nvfp4_quantize(y, False, False, None)
    assert a.isfinite().all() and (d[0, 0] & 0xF) == 7


def _codes(data):
    """The E2M1 codes of packed data (low nibble first), data's shape with the last dim * 2."""
    return torch.stack([data & 0xF, data >> 4], -1).reshape(*data.shape[:-1], -1)


@pytest.mark.parametrize("block_2d", [False, True], ids=["1d", "2d"])
@pytest.mark.parametrize("seed", [None, 5], ids=["rne", "sr"])
@pytest.mark.parametrize("dtype", [F32, torch.bfloat16], ids=["fp32", "bf16"])
def test_nan_changes_only_its_own_code(block_2d, seed, dtype):
    """TransformerEngine's NVFP4 quantization on NaN inputs: the tensor amax (nvte_compute_amax,
    fmaxf / __hmax) and the block amaxes (its cast kernels, fmaxf / __hmax / PTX max) skip NaN,
    and the NaN element itself converts to positive MAXNORM (CUDA's FP4 conversion: "NaN input
    values result in positive MAXNORM"), code 7. So NaNs change nothing but their own codes:
    the same bytes, scales and amax as with zeros in their place."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(32, 48, generator=g) * 2).to(dtype)
    nan_at = torch.zeros(32, 48, dtype=torch.bool)
    nan_at[0, 0] = nan_at[5, 17] = nan_at[31, 47] = True
    nan_at[9, 16:32] = True  # a whole block of NaN
    seed_t = None if seed is None else torch.tensor(seed)
    d, s, a = ops.nvfp4_quantize(x.masked_fill(nan_at, float("nan")), False, block_2d, seed_t)
    d0, s0, a0 = ops.nvfp4_quantize(x.masked_fill(nan_at, 0.0), False, block_2d, seed_t)
    assert torch.equal(a, a0) and a.isfinite().all()
    assert torch.equal(s, s0)
    codes, codes0 = _codes(d), _codes(d0)
    assert (codes[nan_at] == 7).all()
    assert torch.equal(codes[~nan_at], codes0[~nan_at])
    assert_op_matches(x.masked_fill(nan_at, float("nan")), False, block_2d, seed)


def test_all_nan_and_nan_under_the_transform():
    """An all-NaN tensor: amax 0 (nothing left to reduce), zero scales, every code 7. Under the
    random Hadamard transform a NaN spreads to the 16 transformed values of its run, each code
    7, while the other runs keep their codes."""
    d, s, a = ops.nvfp4_quantize(torch.full((16, 32), float("nan")), False, False, None)
    assert a.item() == 0.0 and (s == 0).all() and (_codes(d) == 7).all()
    x = torch.randn(16, 64)
    x[3, 20] = float("nan")
    assert_op_matches(x, rht=True)
    d, _, a = ops.nvfp4_quantize(x, True, False, None)
    assert a.isfinite().all() and (_codes(d)[3, 16:32] == 7).all()


@pytest.mark.parametrize("seed", [None, 11], ids=["rne", "sr"])
def test_negative_zero_keeps_its_sign(seed):
    """-0.0 and negative values that round to zero give the code of -0 (8), as the hardware
    conversion keeps the sign of a zero result; dequantized they are -0.0. (TransformerEngine's
    plain-PyTorch reference quantizer, custom_recipes/quantization_nvfp4.py, gives 8 for a
    negative value rounding to zero too, but 0 for an exact -0.0, which its tests never feed.)"""
    x = torch.zeros(16, 32)
    x[:, 0] = 6.0                    # block amax 6: the elements are scaled by 1
    x[:, 1] = -0.0
    x[:, 2] = -1e-3                  # rounds to -0 (to nearest; stochastically almost surely)
    x[:, 3] = -1e-40                 # an fp32 denormal
    x[:, 16:32] = -0.0               # an all -0.0 block (zero scale)
    seed_t = None if seed is None else torch.tensor(seed)
    d, s, a = ops.nvfp4_quantize(x, False, False, seed_t)
    codes = _codes(d)
    assert (codes[:, 1:4] == 8).all() and (codes[:, 16:] == 8).all()
    out = ops.nvfp4_dequantize(d, s, a, False, F32)
    assert torch.signbit(out[:, 1:4]).all() and (out[:, 1:4] == 0).all()
    assert torch.signbit(out[:, 16:]).all()
    assert_op_matches(x, seed=seed)


def test_quantize_rows_not_multiple_of_16_2d():
    """A 2-D tile in the last row group covers the remaining rows only."""
    assert_op_matches(torch.randn(21, 48), block_2d=True)


def test_sizes_not_multiple_of_16_raise():
    with pytest.raises(RuntimeError, match="multiple of 16"):
        ops.nvfp4_quantize(torch.randn(4, 24), False, False, None)
    with pytest.raises(ValueError, match="multiple of 16"):
        NVFP4Quantizer()(torch.randn(4, 24))
    with pytest.raises(ValueError, match="rows"):
        NVFP4Quantizer().quantize_storage(torch.randn(4, 32), columnwise=True)


def test_empty_and_noncontiguous():
    d, s, a = ops.nvfp4_quantize(torch.randn(0, 32), False, False, None)
    assert d.shape == (0, 16) and s.shape == (0, 2) and a.item() == 0.0
    x = torch.randn(64, 32).t()
    assert_op_matches(x)
    assert_op_matches(x.double())


def test_2d_blocks_share_scales_and_transpose():
    x = torch.randn(32, 48)
    d, s, _ = ops.nvfp4_quantize(x, False, True, None)
    assert torch.equal(s.reshape(2, 16, 3)[:, 1:], s.reshape(2, 16, 3)[:, :1].expand(2, 15, 3))
    # the transpose has the same tiles: the same values, transposed
    dt, st, at = ops.nvfp4_quantize(x.t().contiguous(), False, True, None)
    dq = ops.nvfp4_dequantize(d, s, ops.nvfp4_quantize(x, False, True, None)[2], False, F32)
    torch.testing.assert_close(ops.nvfp4_dequantize(dt, st, at, False, F32), dq.t(),
                               rtol=0, atol=0)


def test_rht_is_orthogonal_and_changes_blocks():
    x = torch.randn(8, 64)
    d0, _, _ = ops.nvfp4_quantize(x, False, False, None)
    d1, _, _ = ops.nvfp4_quantize(x, True, False, None)
    assert not torch.equal(d0, d1)
    m = _hadamard16().double() / 4  # diag(s) H / 4
    torch.testing.assert_close(m @ m.t(), torch.eye(16, dtype=torch.float64))
    torch.testing.assert_close(ref_rht(x).double(), (x.double().reshape(8, 4, 16) @ m)
                               .reshape(8, 64), rtol=1e-6, atol=1e-6)


def _realistic(dtype):
    """A 4096x1024 activation: random normal with a zero row block (zero 16-blocks and 16x16
    tiles), a lone huge value (the tensor amax: the blocks of a band of small rows get
    subnormal E4M3 scales), a row of denormals and denormals among normal values."""
    g = torch.Generator().manual_seed(16)
    x = torch.randn(4096, 1024, generator=g)
    x[32:48] = 0.0
    x[1000, 517] = 1e4
    x[496:512] *= 0.05
    x[2049] = -1e-40                                     # denormal in fp32 and bf16
    x[3000, ::3] = 1e-39 * torch.randn(342, generator=g)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [F32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_benchmarks_plain_torch_provider_is_the_op(dtype):
    """bench/bench_fp8.py times testing.reference.nvfp4_quantize_reference as plain PyTorch:
    the op's bytes, scales and amax (1-D blocks, no transform, round to nearest even) on the
    realistic input and on the adversarial one."""
    for x in (_realistic(dtype), _adversarial(64, 256, dtype)):
        got = ops.nvfp4_quantize(x, False, False, None)
        want = nvfp4_quantize_reference(x)
        assert all(bits_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("dtype", [F32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("block_2d", [False, True], ids=["1d", "2d"])
def test_quantize_at_a_realistic_size(block_2d, dtype):
    """4096x1024 through the quantizer, with and without the random Hadamard transform on the
    columnwise copy: both copies' bytes, scales and amaxes bit for bit against the emulation
    (the columnwise one on the transpose), and the dequantize op equal to the emulation's."""
    x = _realistic(dtype)
    rows = ref_quantize(x, block_2d=block_2d)
    assert (rows[1][32:48] == 0).all() and (rows[1] == 0).float().mean() < 0.01
    subnormal = ((rows[1] & 0x78) == 0) & ((rows[1] & 0x07) != 0)  # E4M3 scale bytes
    assert subnormal[496:512].float().mean() > 0.9 and subnormal.float().mean() < 0.01
    for rht in (False, True):
        st = NVFP4Quantizer(with_rht=rht, with_2d_quantization=block_2d).quantize_storage(
            x, rowwise=True, columnwise=True)
        cols = ref_quantize(x.t().contiguous(), rht, block_2d)
        names = ("data", "scales", "amax")
        for copy_, got, want, rht_ in (("rowwise", st.buffers()[:3], rows, False),
                                       ("columnwise", st.buffers()[3:], cols, rht)):
            for name, a, b in zip(names, got, want):
                assert bits_equal(a, b), f"{copy_} {name} rht={rht}"
            ref = ref_dequantize(*want, rht=rht_)  # fp32, rounded once to the output dtype
            for out in (F32, torch.bfloat16):
                assert bits_equal(ops.nvfp4_dequantize(*got, rht_, out), ref.to(out)), \
                    f"{copy_} rht={rht} dequantized to {out}"


# ---- stochastic rounding ---------------------------------------------------------------------


def test_stochastic_rounding_bits_and_reproducible():
    x = torch.randn(16, 32) * 2
    x[0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])
    assert_op_matches(x, seed=1234)
    assert_op_matches(x, rht=True, seed=2**62 + 5)
    assert_op_matches(x, block_2d=True, seed=-3)
    x = torch.randn(16, 32)
    assert_op_matches(x, seed=7)
    seed = torch.tensor(99, dtype=torch.int64)
    a = ops.nvfp4_quantize(x, False, False, seed)[0]
    assert torch.equal(a, ops.nvfp4_quantize(x, False, False, seed)[0])
    assert not torch.equal(a, ops.nvfp4_quantize(x, False, False, seed + 1)[0])


@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
@pytest.mark.parametrize("block_2d", [False, True], ids=["1d", "2d"])
def test_stochastic_rounding_bits_over_rows_of_many_blocks(rht, block_2d):
    """Rows of 17 blocks (272 elements: the draws of whole groups of counters and a tail, the
    block scales of a group of a row's blocks and a last block) against the emulation's Philox
    draws, with NaN, inf, signed zeros and values at and beyond the grid's ends."""
    g = torch.Generator().manual_seed(41)
    x = torch.randn(32, 272, generator=g) * torch.exp2(torch.randint(-3, 4, (32, 1),
                                                                     generator=g).float())
    x[3, :6] = torch.tensor([float("nan"), float("inf"), -0.0, 0.0, -float("inf"), 7.0])
    x[5, 100:116] = 0.0
    assert_op_matches(x, rht=rht, block_2d=block_2d, seed=20251207)


def test_stochastic_rounding_at_a_realistic_size():
    """4096x1024 bf16 through the recipe's gradient quantizer (stochastic rounding, the random
    Hadamard transform on the columnwise copy): the same torch seed gives the same bytes, another
    seed other bytes in both copies, with the scales and amaxes of round to nearest (only the
    codes are drawn), each code of the nearest one's sign and at most one grid step from it.
    (Bit for bit against the emulation's Philox draws, and unbiasedness over many draws: the
    small-size tests above and below.)"""
    x = _realistic(torch.bfloat16)
    q = NVFP4Quantizer(with_rht=True, stochastic_rounding=True)

    def draw(seed):
        torch.manual_seed(seed)
        return q.quantize_storage(x, rowwise=True, columnwise=True).buffers()

    a, b, c = draw(5), draw(5), draw(6)
    rne = NVFP4Quantizer(with_rht=True).quantize_storage(x, rowwise=True,
                                                         columnwise=True).buffers()
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    for i in (1, 2, 4, 5):  # scales and amaxes
        assert torch.equal(a[i], rne[i]) and torch.equal(c[i], rne[i])
    for i in (0, 3):  # data: each copy's codes differ between the seeds in a good fraction
        codes_a, codes_c, codes_rne = _codes(a[i]), _codes(c[i]), _codes(rne[i])
        assert (codes_a != codes_c).float().mean() > 0.1
        for codes in (codes_a, codes_c):
            step = ((codes & 7).int() - (codes_rne & 7).int()).abs()
            assert (step <= 1).all() and torch.equal(codes & 8, codes_rne & 8)


def test_stochastic_rounding_is_unbiased():
    """Values between grid points (block amax 6 fixes the element scale at 1): the mean of n
    independent roundings estimates the value; with Bernoulli(p) rounding between neighbours a
    step h apart, the standard deviation of the mean is h * sqrt(p (1 - p) / n) <= h / (2
    sqrt(n)), and the test allows 5 of those (a false failure has probability < 1e-6 per
    value)."""
    vals = torch.tensor([0.1, 0.3, 0.7, 1.1, 1.6, 2.2, 2.9, 3.3, 4.5, 5.1, 5.9, -0.4, -1.3,
                         -2.6, -4.2])
    x = torch.cat([vals, torch.tensor([6.0])])  # one block, amax 6
    n = 4000
    xs = x.expand(n, 16).contiguous()  # n rows: every element gets its own draw
    d, s, a = ops.nvfp4_quantize(xs, False, False, torch.tensor(20240607))
    out = ops.nvfp4_dequantize(d, s, a, False, torch.float64)
    mean = out.mean(0)[:15]
    h = torch.where(vals.abs() < 2, 0.5, torch.where(vals.abs() < 4, 1.0, 2.0)).double()
    bound = 5 * h / (2 * math.sqrt(n))
    assert ((mean - vals.double()).abs() <= bound).all(), (mean, vals)
    # and round to nearest is biased on the same values
    rne = ops.nvfp4_dequantize(*ops.nvfp4_quantize(x.reshape(1, 16), False, False, None), False,
                               torch.float64)[0, :15]
    assert ((rne - vals.double()).abs() > bound).any()


# ---- quantizer, storage, recipe ------------------------------------------------------------


def test_quantizer_copies_against_emulation():
    x = torch.randn(32, 48)
    q = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True)
    st = q.quantize_storage(x, rowwise=True, columnwise=True)
    rd, rs, ra = ref_quantize(x)
    cd, cs, ca = ref_quantize(x.t().contiguous(), rht=True)
    b = st.buffers()
    for got, want in zip(b, (rd, rs, ra, cd, cs, ca)):
        assert bits_equal(got, want)
    torch.testing.assert_close(st.dequantize_columnwise(),
                               ref_dequantize(cd, cs, ca, rht=True).t(), rtol=0, atol=0)
    # the storage round trip through buffers / metadata
    st2 = NVFP4TensorStorage.from_buffers(st.buffers(), st.metadata())
    torch.testing.assert_close(st2.dequantize_columnwise(), st.dequantize_columnwise(),
                               rtol=0, atol=0)
    t = q(x)
    assert isinstance(t, te.NVFP4Tensor) and t.shape == x.shape and t.dtype == x.dtype
    torch.testing.assert_close(t.dequantize(), ref_dequantize(rd, rs, ra), rtol=0, atol=0)
    assert NVFP4TensorStorage.fp4_view(b[0]).dtype == torch.float4_e2m1fn_x2


def test_quantizer_options_and_storage_usage():
    with pytest.raises(ValueError, match="float4_e2m1fn_x2"):
        NVFP4Quantizer(torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="amax reduction"):
        NVFP4Quantizer(with_amax_reduction=True)
    with pytest.raises(NotImplementedError, match="sign"):
        NVFP4Quantizer(with_random_sign_mask=False)
    x = torch.randn(16, 32)
    st = NVFP4Quantizer(with_rht=True).quantize_storage(x, rowwise=True, columnwise=True)
    st.update_usage(rowwise_usage=False)
    assert st.buffers()[:3] == (None, None, None)
    with pytest.raises(RuntimeError, match="rowwise data cannot be rebuilt"):
        st.update_usage(rowwise_usage=True)
    torch.testing.assert_close(st.dequantize(), st.dequantize_columnwise(), rtol=0, atol=0)
    t = NVFP4Quantizer()(x.requires_grad_())
    d = t.detach()
    assert isinstance(d, te.NVFP4Tensor) and not d.requires_grad
    torch.testing.assert_close(d.dequantize(), t.dequantize(), rtol=0, atol=0)
    (t.dequantize() * 2).sum().backward()  # straight-through gradient
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))


def test_recipe_defaults_env_and_rejections(monkeypatch):
    r = te.recipe.NVFP4BlockScaling()
    assert r.nvfp4() and not r.mxfp8()
    assert r.fp4_format == te.recipe.Format.E2M1 and r.fp8_format == te.recipe.Format.E4M3
    assert r.fp4_quant_fwd_inp.random_hadamard_transform
    assert not r.fp4_quant_fwd_inp.stochastic_rounding
    assert r.fp4_quant_fwd_weight.fp4_2d_quantization
    assert not r.fp4_quant_fwd_weight.random_hadamard_transform
    assert r.fp4_quant_bwd_grad.stochastic_rounding
    assert r.fp4_quant_bwd_grad.random_hadamard_transform
    monkeypatch.setenv("NVTE_NVFP4_DISABLE_RHT", "1")
    monkeypatch.setenv("NVTE_NVFP4_DISABLE_2D_QUANTIZATION", "1")
    r = te.recipe.NVFP4BlockScaling()
    assert not r.fp4_quant_fwd_inp.random_hadamard_transform
    assert not r.fp4_quant_fwd_weight.fp4_2d_quantization
    with pytest.raises(ValueError, match="E2M1"):
        te.recipe.NVFP4BlockScaling(fp4_format=te.recipe.Format.E4M3)
    with pytest.raises(ValueError, match="backward_override"):
        te.recipe.NVFP4BlockScaling(backward_override="x")
    assert te.is_nvfp4_available() is True
    ok, reason = te.is_nvfp4_available(return_reason=True)
    assert ok and "emulated" in reason


def test_recipe_state_quantizers():
    from transformer_engine_cpp.quantization import RecipeState
    r = te.recipe.NVFP4BlockScaling()
    fwd = RecipeState.create(r, mode="forward", num_quantizers=3).make_quantizers()
    assert [q.with_rht for q in fwd] == [True, False, True]
    assert [q.with_2d_quantization for q in fwd] == [False, True, False]
    assert not any(q.stochastic_rounding for q in fwd)
    (bwd,) = RecipeState.create(r, mode="backward", num_quantizers=1).make_quantizers()
    assert bwd.stochastic_rounding and bwd.with_rht and not bwd.with_2d_quantization


# ---- BasicLinear under the recipe ----------------------------------------------------------


def _emulated_linear(x, w, dy, rht, two_d):
    """Forward and gradients from the emulated quantizations, GEMMs in float64."""
    def dq(t, rht_=False, b2=False):
        return ref_dequantize(*ref_quantize(t, rht_, b2), rht=rht_).double()
    x_row = dq(x)
    w_row = dq(w, b2=two_d)
    y = x_row @ w_row.t()
    dy_row = dq(dy)
    w_col = dq(w.t().contiguous(), b2=two_d).t()
    dx = dy_row @ w_col
    dy_col = dq(dy.t().contiguous(), rht).t()
    x_col = dq(x.t().contiguous(), rht).t()
    dw = dy_col.t() @ x_col
    return y, dx, dw


@pytest.mark.parametrize("disable_rht", [False, True], ids=["rht", "no_rht"])
@pytest.mark.parametrize("disable_2d", [False, True], ids=["2d", "1d"])
def test_basic_linear_against_float64_emulation(disable_rht, disable_2d):
    torch.manual_seed(1)
    recipe = te.recipe.NVFP4BlockScaling(disable_rht=disable_rht,
                                         disable_2d_quantization=disable_2d,
                                         disable_stochastic_rounding=True)
    op = te.ops.BasicLinear(64, 32)
    x = torch.randn(48, 64, requires_grad=True)
    dy = torch.randn(48, 32)
    with te.autocast(recipe=recipe):
        y = op(x)
    y.backward(dy)
    ey, edx, edw = _emulated_linear(x.detach(), op.weight.detach(), dy, not disable_rht,
                                    not disable_2d)
    tol = dict(rtol=1e-5, atol=1e-5)  # fp32 accumulation against float64
    torch.testing.assert_close(y.double(), ey, **tol)
    torch.testing.assert_close(x.grad.double(), edx, **tol)
    torch.testing.assert_close(op.weight.grad.double(), edw, **tol)


def test_basic_linear_stochastic_rounding_reproducible():
    def run(seed):
        torch.manual_seed(0)
        op = te.ops.BasicLinear(32, 32)
        x = torch.randn(32, 32, requires_grad=True)
        torch.manual_seed(seed)
        with te.autocast(recipe=te.recipe.NVFP4BlockScaling()):
            y = op(x)
        y.backward(torch.randn(32, 32))
        return x.grad, op.weight.grad
    a, b = run(5), run(5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c = run(6)
    assert not torch.equal(a[1], c[1])


@pytest.mark.parametrize("disable_sr", [True, False], ids=["rne", "stochastic"])
def test_compiled_equals_eager(disable_sr):
    """torch.compile(fullgraph=True) (aot_eager) gives the eager bits; with stochastic rounding
    the seeds are drawn inside the traced graph from the same generator, so the same
    torch.manual_seed gives the same draws."""
    torch.manual_seed(2)
    recipe = te.recipe.NVFP4BlockScaling(disable_stochastic_rounding=disable_sr)
    model = te.ops.Sequential(te.ops.Linear(32, 64), te.ops.GELU(), te.ops.Linear(64, 32))
    x = torch.randn(32, 32, requires_grad=True)

    def step(inp):
        with te.autocast(recipe=recipe):
            return model(inp)

    def run(fn):
        for p in list(model.parameters()) + [x]:
            p.grad = None
        torch.manual_seed(11)
        y = fn(x)
        y.sum().backward()
        return [y] + [p.grad.clone() for p in list(model.parameters()) + [x]]

    eager = run(step)
    torch._dynamo.reset()
    compiled = run(torch.compile(step, backend="aot_eager", fullgraph=True))
    for c, e in zip(compiled, eager):
        torch.testing.assert_close(c, e, rtol=0, atol=0)


def test_training_loop_reduces_loss():
    """A teacher-student regression: under NVFP4 (all three techniques on) the loss falls as
    in high precision (within 1.5x of the high-precision run's final loss)."""
    def train(recipe):
        torch.manual_seed(3)
        model = te.ops.Sequential(te.ops.Linear(32, 64), te.ops.GELU(), te.ops.Linear(64, 16))
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        x = torch.randn(64, 32)
        target = x @ (torch.randn(32, 16) / 4)
        losses = []
        for _ in range(40):
            with te.autocast(enabled=recipe is not None, recipe=recipe):
                loss = torch.nn.functional.mse_loss(model(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses
    fp4 = train(te.recipe.NVFP4BlockScaling())
    ref = train(None)
    assert all(math.isfinite(v) for v in fp4)
    assert fp4[-1] < 0.25 * fp4[0]
    assert fp4[-1] < 1.5 * ref[-1], (fp4[-1], ref[-1])


def test_shared_nvfp4_rules_compile_as_cuda_device_code(tmp_path):
    """tests/cpp/nvfp4_math_device.cu calls every function of csrc/common/fp4.h from a CUDA
    kernel: nvcc -ptx refuses a host-only call, and -Werror all-warnings any warning."""
    assert compile_ptx("nvfp4_math_device.cu", tmp_path).count(".entry ") == 1


def test_quantized_weights_train_compile_cast_and_checkpoint(tmp_path):
    """te.quantized_model_init under NVFP4BlockScaling: the weights are NVFP4Tensors with both
    copies (the recipe's weight quantizer: 16x16 blocks, no transform, no stochastic rounding),
    the same forward as quantizing the weight per call, an optimizer step re-quantizes both
    copies in place, compiled equals eager, and a checkpoint loads with torch.load's default
    weights_only=True."""
    from transformer_engine_cpp.quantization.tensor import as_storage

    recipe = te.recipe.NVFP4BlockScaling(disable_stochastic_rounding=True)

    def make():
        torch.manual_seed(0)
        return te.ops.Sequential(te.ops.Linear(64, 48), te.ops.GELU(), te.ops.Linear(48, 32))

    with te.quantized_model_init(recipe=recipe):
        model = make()
    plain = make()
    w = model[0].weight
    assert isinstance(w, te.NVFP4Tensor)
    assert w._rowwise_data is not None and w._columnwise_data is not None
    assert w._quantizer.with_2d_quantization and not w._quantizer.with_rht
    x = torch.randn(32, 64, requires_grad=True)
    with te.autocast(recipe=recipe):
        y, y_plain = model(x), plain(x)
    assert torch.equal(y, y_plain)
    y.sum().backward()
    before, grad = w.dequantize().detach().clone(), w.grad.clone()
    quantizer = w._quantizer
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    w = model[0].weight
    assert isinstance(w, te.NVFP4Tensor)  # re-quantized in place, both copies
    updated = before.clone().add_(grad, alpha=-0.1)  # SGD's update, in fp32
    fresh = quantizer.quantize_storage(updated, rowwise=True, columnwise=True)
    assert torch.equal(w.dequantize(), fresh.dequantize_rowwise())
    assert torch.equal(as_storage(w).dequantize_columnwise(), fresh.dequantize_columnwise())
    assert not torch.equal(w.dequantize(), before)
    check_quantized_weights_compile_checkpoint_cast(model, make, recipe, x, tmp_path,
                                                    te.NVFP4Tensor)
    with pytest.raises(ValueError, match="multiples of 16"):
        with te.quantized_model_init(recipe=recipe):
            te.ops.Linear(64, 40)
