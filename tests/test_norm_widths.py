"""LayerNorm, RMSNorm (rmsnorm_bwd_add included) and L2Normalization on rows of many widths, on
each device.

The widths reach every launch shape of the CUDA kernels (csrc/kernels/cuda/row_reduce.cuh): a
warp per row, a block per row with the row kept in registers, a block that reads a very wide
row once per pass; rows of whole 16-byte chunks and rows whose last chunk is partial; and
enough rows that dweight / dbias add several row ranges. Each op's results in fp32, bf16 and fp16
are compared with the same op in float64 on the CPU, must repeat bitwise (deterministic
reductions), whatever the number of CPU threads, and on a GPU must put NaN and inf where the CPU
kernels do.
"""

import pytest
import torch

import transformer_engine_cpp  # noqa: F401  (loads the ops)
from harness import DEVICES
from tolerances import tols

ops = torch.ops.te_cpp

# The CUDA launch shapes (16-byte chunks: 4 fp32 or 8 bf16 elements), fp32 / bf16 widths:
#   forward   a warp per row up to 512 / 1024, a block caching the row up to 8192 / 16384;
#   backward  a warp per row up to 256 / 512,  a block caching the row up to 4096 / 8192;
# wider rows: a block reading the row once per pass. 7, 13, 300, 1000 (bf16), 6001, 20001 leave
# a partial last chunk (and rows not on 16 bytes).
WIDTHS = [1, 7, 13, 64, 256, 300, 1000, 4096, 6001, 12000, 20001]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
EPS = 1e-5


def _rows(width):
    return 100 if width <= 1024 else 20


def _inputs(width, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed + width)
    rows = _rows(width)
    x = torch.randn(rows, width, generator=g) * 2 + 0.5
    dy = torch.randn(rows, width, generator=g)
    de = torch.randn(rows, width, generator=g)
    w = torch.rand(width, generator=g) + 0.5
    b = torch.randn(width, generator=g)
    return [t.to(dtype).to(device) for t in (x, dy, de, w, b)]


def _run_all(x, dy, de, w, b, zcg):
    """Every op of the two families on these inputs: {name: output}."""
    out = {}
    y, mu, rs = ops.layernorm_fwd(x, w, b, EPS, zcg)
    out.update(layernorm_y=y, layernorm_mean=mu, layernorm_rstd=rs)
    dx, dw, db = ops.layernorm_bwd(dy, x, mu, rs, w, zcg)
    out.update(layernorm_dx=dx, layernorm_dw=dw, layernorm_db=db)
    y, rs = ops.rmsnorm_fwd(x, w, EPS, zcg)
    out.update(rmsnorm_y=y, rmsnorm_rstd=rs)
    dx, dw = ops.rmsnorm_bwd(dy, x, rs, w, zcg)
    out.update(rmsnorm_dx=dx, rmsnorm_dw=dw)
    dx, dw = ops.rmsnorm_bwd_add(dy, x, rs, w, zcg, de)
    out.update(rmsnorm_add_dx=dx, rmsnorm_add_dw=dw)
    y, rn = ops.l2normalization_fwd(x, EPS)
    out.update(l2_y=y, l2_rnorm=rn, l2_dx=ops.l2normalization_bwd(dy, x, rn))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered_gamma"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("width", WIDTHS)
def test_norm_ops_against_float64(width, dtype, zcg, device):
    inputs = _inputs(width, dtype, device)
    got = _run_all(*inputs, zcg)
    want = _run_all(*[t.cpu().double() for t in inputs], zcg)
    again = _run_all(*inputs, zcg)
    tol = tols(dtype)
    for name, value in got.items():
        assert value.device.type == torch.device(device).type, name
        assert torch.equal(value, again[name]), f"{name}: not bitwise repeatable"
        ref = want[name]
        if name.endswith(("_dw", "_db")):
            # sums over the rows: the inputs' rounding to dtype accumulates over _rows terms
            scale = ref.abs().amax().clamp_min(1.0)
            torch.testing.assert_close(value.double().cpu() / scale, ref / scale, **tol,
                                       msg=lambda m: f"{name}: {m}")
        else:
            torch.testing.assert_close(value.double().cpu(), ref, **tol,
                                       msg=lambda m: f"{name}: {m}")


# Row sums run in vector chunks of 16 (fp32 lanes) added into four accumulators in turn: widths
# with no, some and a partial group of four chunks after the last whole group
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("width", [17, 64, 80, 300, 1000, 4100])
def test_cpu_norm_ops_are_bitwise_equal_whatever_the_thread_count(width, dtype):
    """Enough rows that each op's rows (and dweight / dbias's row blocks) are split over the
    threads: 1, 2 and 3 threads give the same bits."""
    g = torch.Generator().manual_seed(width)
    rows = max(700, 3 * 32768 // width)
    x, dy, de = ((torch.randn(rows, width, generator=g) * 2 + 0.5).to(dtype) for _ in range(3))
    w = (torch.rand(width, generator=g) + 0.5).to(dtype)
    b = torch.randn(width, generator=g).to(dtype)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            runs.append(_run_all(x, dy, de, w, b, False))
    finally:
        torch.set_num_threads(before)
    for name, value in runs[0].items():
        for threads, other in zip((2, 3), runs[1:]):
            assert torch.equal(value, other[name]), f"{name}: {threads} threads differ from 1"


@pytest.mark.parametrize("device", [p for p in DEVICES if p != "cpu"])
@pytest.mark.parametrize("width", [13, 300, 8195, 32776])
def test_special_values_where_the_cpu_puts_them(width, device):
    """Rows holding NaN, +-inf and zeros in x or dy: every output is NaN / inf exactly where the
    CPU kernels' is, and finite elsewhere."""
    x, dy, de, w, b = _inputs(width, torch.float32, "cpu", seed=1)
    specials = [float("nan"), float("inf"), -float("inf")]
    for i, v in enumerate(specials):
        x[i, (7 * i) % width] = v
        dy[len(specials) + i, (5 * i + 1) % width] = v
    x[2 * len(specials)] = 0.0  # a zero row (L2Normalization: rnorm = 1 / sqrt(eps))
    inputs = (x, dy, de, w, b)
    want = _run_all(*inputs, False)
    got = _run_all(*[t.to(device) for t in inputs], False)
    for name, ref in want.items():
        value = got[name].cpu()
        assert torch.equal(torch.isnan(value), torch.isnan(ref)), f"{name}: NaN placement"
        assert torch.equal(torch.isinf(value), torch.isinf(ref)), f"{name}: inf placement"
        assert torch.equal(value[torch.isinf(ref)], ref[torch.isinf(ref)]), f"{name}: inf sign"


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("width", [13, 300, 1001])
def test_cpu_norm_ops_are_bitwise_equal_wherever_the_rows_start(width, dtype):
    """The same rows at storage offsets 0-17 elements (each row starting anywhere within a vector
    and a cache line): the same bits. A row's sums are chunked by its width alone, never by where
    it starts, so a tensor and its copy normalise alike."""
    x, dy, de, w, b = _inputs(width, dtype, "cpu", seed=2)
    want = _run_all(x, dy, de, w, b, False)
    for offset in range(18):
        moved = []
        for t in (x, dy, de):
            buf = torch.empty(offset + t.numel(), dtype=dtype)
            buf[offset:].copy_(t.flatten())
            moved.append(buf[offset:].view(t.shape))
        got = _run_all(*moved, w, b, False)
        for name, value in want.items():
            assert torch.equal(got[name], value), f"{name}: differs at offset {offset}"
