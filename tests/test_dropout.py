"""Dropout in training: the random output cannot go through the deterministic conformance
harness, so it is checked statistically (TransformerEngine's z-test on the fraction of zeros), for
exact self-consistency (kept values, backward from the forward's own mask), for
reproducibility from torch.manual_seed, and compiled (fullgraph, aot_eager and inductor).

Evaluation mode and p == 0 (pass-through) run through the harness (tests/cases.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch._dynamo.utils import counters

import transformer_engine_cpp as te

te_ops = torch.ops.te_cpp

DTYPES = [torch.float32, torch.bfloat16]
DTYPE_IDS = ["fp32", "bf16"]
Z_CRIT = 2.5758  # two-sided 99%, as in TransformerEngine's test_dropout


def _input(shape, dtype, seed=0):
    """Inputs with no zeros, so that the mask can be read off the output (y != 0)."""
    torch.manual_seed(seed)
    x = torch.rand(shape) + 0.5
    x = x * torch.where(torch.rand(shape) < 0.5, -1.0, 1.0)
    return x.to(dtype).requires_grad_()


def assert_zero_fraction(y, p):
    n = y.numel()
    zeros = (y == 0).sum().item()
    z = (zeros - n * p) / math.sqrt(n * p * (1 - p))
    assert abs(z) < Z_CRIT, f"{zeros} zeros of {n} for p={p}: z = {z:.2f}"


def assert_valid_dropout(x, y, dx, dy, p):
    """Kept elements are x / (1 - p) (scale rounded once, as the kernel does) and the gradient
    uses exactly the same mask: dx == dy * mask * (1 / (1 - p))."""
    mask = y != 0
    scale = 1.0 / (1.0 - p)
    torch.testing.assert_close(y, x.detach() * mask * scale, rtol=0, atol=0)
    torch.testing.assert_close(dx, dy * mask * scale, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(101,), (2, 4, 16), (128, 128)], ids=str)
@pytest.mark.parametrize("p", [0.0625, 0.5, 0.75])
def test_training_zero_fraction_and_gradient(p, shape, dtype):
    op = te.ops.Dropout(p)
    x = _input(shape, dtype)
    torch.manual_seed(11)
    y = op(x)
    assert y.dtype == dtype and y.shape == x.shape
    assert_zero_fraction(y, p)
    dy = torch.randn(shape).to(dtype)
    y.backward(dy)
    assert_valid_dropout(x, y, x.grad, dy, p)


def test_eval_is_the_identity_and_p0_passes_through():
    x = _input((4, 9), torch.float32)
    op = te.ops.Dropout(0.5).eval()
    y = op(x)
    torch.testing.assert_close(y, x, rtol=0, atol=0)
    y.backward(torch.full_like(y, 3.0))
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0), rtol=0, atol=0)
    # training with p == 0 is also a pass-through: no random draw at all
    state = torch.get_rng_state()
    torch.testing.assert_close(te.ops.Dropout(0.0)(x), x, rtol=0, atol=0)
    assert torch.equal(torch.get_rng_state(), state)


def test_fp16_fp64_and_non_contiguous_inputs():
    for dtype in (torch.float16, torch.float64):
        x = _input((64, 33), dtype)
        y = te.ops.Dropout(0.5)(x)
        dy = torch.randn(y.shape).to(dtype)
        y.backward(dy)
        assert_valid_dropout(x, y, x.grad, dy, 0.5)
    base = _input((40, 64), torch.float32)
    xt = base.detach().t().requires_grad_()  # a non-contiguous leaf
    y = te.ops.Dropout(0.3)(xt)
    dy = torch.randn(y.shape)
    y.backward(dy)
    assert_valid_dropout(xt, y, xt.grad, dy, 0.3)
    assert_zero_fraction(y, 0.3)


def test_the_op_returns_the_mask_it_applied():
    x = _input((8, 50), torch.bfloat16).detach()
    y, mask = te_ops.dropout_fwd(x, torch.tensor(5, dtype=torch.int64), 0.4)
    assert mask.dtype == torch.uint8 and set(mask.unique().tolist()) <= {0, 1}
    assert torch.equal(mask.bool(), y != 0)
    dx = te_ops.dropout_bwd(torch.ones_like(x), mask, 0.4)
    assert torch.equal(dx, torch.ones_like(x) * mask * (1 / 0.6))


def test_same_seed_same_mask():
    """manual_seed reproduces the whole training step; consecutive calls draw new masks."""
    op = te.ops.Dropout(0.5)
    x = _input((32, 32), torch.float32)
    torch.manual_seed(123)
    a = op(x)
    b = op(x)
    torch.manual_seed(123)
    a2 = op(x)
    assert torch.equal(a, a2)
    assert not torch.equal(a != 0, b != 0)
    # The op itself: the same seed tensor gives the same mask, another seed another one.
    xs = x.detach()
    seed = torch.tensor(42, dtype=torch.int64)
    m1 = te_ops.dropout_fwd(xs, seed, 0.5)[1]
    m2 = te_ops.dropout_fwd(xs, seed.clone(), 0.5)[1]
    m3 = te_ops.dropout_fwd(xs, torch.tensor(43, dtype=torch.int64), 0.5)[1]
    assert torch.equal(m1, m2) and not torch.equal(m1, m3)


def test_mask_depends_only_on_seed_and_element_index():
    """Element i's draw depends on (seed, i) alone: not on the thread count, the chunking, the
    dtype or the tensor's length (a prefix of the input gets the prefix of the mask)."""
    seed = torch.tensor(-987654321, dtype=torch.int64)
    x = torch.randn(100003)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        m1 = te_ops.dropout_fwd(x, seed, 0.3)[1]
        torch.set_num_threads(max(2, threads))
        m2 = te_ops.dropout_fwd(x, seed, 0.3)[1]
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(m1, m2)
    assert torch.equal(te_ops.dropout_fwd(x[:50001], seed, 0.3)[1], m1[:50001])
    assert torch.equal(te_ops.dropout_fwd(x.bfloat16(), seed, 0.3)[1], m1)
    # each residue class mod 4 (the four lanes of a Philox block) is dropped at the right rate
    for lane in range(4):
        assert_zero_fraction(m1[lane::4], 0.3)


def _compiled_step(backend, p=0.5, shape=(64, 96)):
    model = te.ops.Sequential(te.ops.Dropout(p), te.ops.ConstantScale(2.0))
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    x = _input(shape, torch.float32)
    dy = torch.randn(shape)
    torch.manual_seed(7)
    y = compiled(x)
    y.backward(dy)
    assert len(counters["graph_break"]) == 0
    return compiled, model, x, y, dy


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_is_a_valid_dropout(backend):
    p = 0.5
    compiled, model, x, y, dy = _compiled_step(backend, p)
    assert_zero_fraction(y, p)
    # y = 2 * dropout(x); dx = 2 * dy * mask / (1 - p), from the compiled forward's own mask
    mask = y != 0
    torch.testing.assert_close(y, x.detach() * mask * (1 / (1 - p)) * 2.0, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, (dy * 2.0) * mask * (1 / (1 - p)), rtol=0, atol=0)
    # a new mask per call, the same one again after the same manual_seed
    x2 = x.detach()
    with torch.no_grad():
        torch.manual_seed(7)
        again = compiled(x2)
        other = compiled(x2)
    assert torch.equal(again, y.detach())
    assert not torch.equal(other != 0, mask)
    # the seed is drawn from torch's generator at run time (te_cpp.random_seeds), as in eager
    torch.manual_seed(7)
    torch.testing.assert_close(model(x2), y.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "dynamic"])
def test_compiled_masks_equal_eager_without_autograd_and_with_dynamic_shapes(backend, mode):
    """Linear -> Dropout -> GELU compiled: under no_grad and inference_mode (no backward
    graph), and with dynamic shapes over two token counts, the seed draws give eager's bits."""
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.Linear(64, 64), te.ops.Dropout(0.3), te.ops.GELU())
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=mode == "dynamic")
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
               "dynamic": torch.enable_grad}[mode]
    for tokens in ((32, 48) if mode == "dynamic" else (32,)):
        x = torch.randn(tokens, 64)
        with context():
            torch.manual_seed(3)
            eager = model(x)
            torch.manual_seed(3)
            got = compiled(x)
        assert torch.equal(eager, got)
        assert 0 < int((got == 0).sum()) < got.numel()
    assert len(counters["graph_break"]) == 0


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_two_dropouts_of_one_input_draw_two_masks(backend):
    """Two dropouts of the same tensor in one graph must not be merged by CSE (an op drawing
    from a global generator with identical arguments would be)."""
    d1, d2 = te.ops.Dropout(0.5), te.ops.Dropout(0.5)

    def f(x):
        return d1(x), d2(x)

    x = _input((32, 64), torch.float32)
    a, b = torch.compile(f, backend=backend, fullgraph=True)(x)
    (a + b).sum().backward()
    assert len(counters["graph_break"]) == 0
    assert not torch.equal(a != 0, b != 0)
    expected = ((a != 0).float() + (b != 0).float()) * 2.0
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=0)


# ---- the mask rule itself, and CUDA against CPU --------------------------------------------


def _philox4x32_10(key: int, counter: int) -> list[int]:
    """Philox4x32-10 (Salmon et al., 2011) in plain Python: 64-bit key, counter (counter, 0)."""
    m32 = 0xFFFFFFFF
    c = [counter & m32, (counter >> 32) & m32, 0, 0]
    k = [key & m32, (key >> 32) & m32]
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & m32, (k[1] + 0xBB67AE85) & m32]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & m32, (p0 >> 32) ^ c[3] ^ k[1], p0 & m32]
    return c


@pytest.mark.parametrize("seed,p", [(20240607, 0.3), (-7, 0.5), (2**62 + 12345, 0.9)])
def test_mask_is_the_documented_philox_rule(seed, p):
    """ops/dropout.h: element i is kept iff philox4x32_10(key = seed, counter = (i / 4, 0))[i % 4]
    >= round(p * 2^32)."""
    n = 203
    threshold = round(p * 2**32)
    want = [int(_philox4x32_10(seed & (2**64 - 1), i // 4)[i % 4] >= threshold)
            for i in range(n)]
    mask = te_ops.dropout_fwd(torch.ones(n), torch.tensor(seed, dtype=torch.int64), p)[1]
    assert mask.tolist() == want


@pytest.mark.parametrize("i", [2, 37, 200], ids=lambda i: f"element{i}")
def test_a_draw_equal_to_the_threshold_keeps_its_element(i):
    """keep iff draw >= threshold, at equality too: p = draw / 2^32 makes element i's draw the
    threshold (element 200 of 203 is in the scalar tail, the others in whole vectors)."""
    seed, n = 99991, 203
    draw = _philox4x32_10(seed, i // 4)[i % 4]
    p = draw / 2**32
    mask = te_ops.dropout_fwd(torch.ones(n), torch.tensor(seed, dtype=torch.int64), p)[1]
    assert mask[i].item() == 1
    want = [int(_philox4x32_10(seed, j // 4)[j % 4] >= draw) for j in range(n)]
    assert mask.tolist() == want


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=["fp32", "bf16", "fp16", "fp64"])
@pytest.mark.parametrize("n", [1, 6, 4099, 1 << 20])
def test_cuda_dropout_equals_cpu(n, dtype):
    seed = torch.tensor(-987654321, dtype=torch.int64)
    x = torch.randn(n + 1, generator=torch.Generator().manual_seed(n)).to(dtype)
    x[0] = float("nan")
    dy = torch.randn(n + 1, generator=torch.Generator().manual_seed(n + 1)).to(dtype)
    # aligned, and an offset view (the CUDA kernels' element-by-element path)
    for xs, dys in ((x[:n], dy[:n]), (x[1:], dy[1:])):
        y, mask = te_ops.dropout_fwd(xs, seed, 0.3)
        gy, gmask = te_ops.dropout_fwd(xs.cuda(), seed.cuda(), 0.3)
        assert torch.equal(mask, gmask.cpu())
        torch.testing.assert_close(gy.cpu(), y, rtol=0, atol=0, equal_nan=True)
        dx = te_ops.dropout_bwd(dys, mask, 0.3)
        gdx = te_ops.dropout_bwd(dys.cuda(), gmask, 0.3)
        torch.testing.assert_close(gdx.cpu(), dx, rtol=0, atol=0, equal_nan=True)


@needs_cuda
def test_cuda_dropout_reads_the_seed_on_the_device():
    """The seed stays in device memory: the op records into a CUDA graph, and a new seed
    written before the replay gives that seed's mask."""
    x = torch.randn(1000, device="cuda")
    seed = torch.tensor(1, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        _, mask = te_ops.dropout_fwd(x, seed, 0.5)
    seed.fill_(2)
    g.replay()
    torch.cuda.synchronize()
    want = te_ops.dropout_fwd(x.cpu(), torch.tensor(2, dtype=torch.int64), 0.5)[1]
    assert torch.equal(mask.cpu(), want)
