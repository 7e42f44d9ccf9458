"""Non-temporal stores (csrc/kernels/cpu/stream.h): the CPU kernels write an fp32 / fp64 output
of at least _C.stream_store_min_bytes() bytes with non-temporal stores wherever a whole vector
lands on an aligned address, with plain stores elsewhere. Only the speed may change: every op
case gives the same bits with every output streamed (threshold 0) as with none (a threshold no
output reaches), at the conformance layouts and at aligned widths where most stores stream."""

from __future__ import annotations

import os

import pytest
import torch

import transformer_engine_cpp as te
from transformer_engine_cpp import _C
from cases import CASE_IDS, OP_CASES
from harness import build, eager_run, inputs_for, random_grads_like

NEVER = 1 << 62


@pytest.fixture
def restore_threshold():
    before = _C.set_stream_store_min_bytes(-1)
    yield
    _C.set_stream_store_min_bytes(before)


def _run(seq, x, extras, grads, threshold):
    """Outputs and gradients of one eager forward + backward with the given threshold."""
    _C.set_stream_store_min_bytes(threshold)
    seq.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(x.requires_grad)
    extras = [e.detach().clone().requires_grad_(e.requires_grad) for e in extras]
    outs, dx, dextras, dparams = eager_run(seq, x, extras, grads)
    return [o.detach() for o in outs] + [dx] + dextras + [dparams[n] for n in sorted(dparams)]


def _assert_same_bits(streamed, plain, what):
    assert len(streamed) == len(plain)
    for i, (s, p) in enumerate(zip(streamed, plain)):
        if p is None:
            assert s is None, f"{what}: tensor {i}"
            continue
        assert s.dtype == p.dtype and s.shape == p.shape, f"{what}: tensor {i}"
        # the same bytes (NaN included): compare the bit patterns
        assert torch.equal(s.contiguous().view(torch.uint8), p.contiguous().view(torch.uint8)), \
            f"{what}: tensor {i} differs when streamed"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("case", OP_CASES, ids=CASE_IDS)
def test_every_op_case_gives_the_same_bits_streamed(case, dtype, restore_threshold):
    seq = build(case, dtype)
    for layout in ("rows", "non_contiguous", "zero_rows"):
        x, extras = inputs_for(case, dtype, layout)
        outs = [o.detach() for o in _as_list(seq(x, *extras))]
        grads = random_grads_like(outs)
        plain = _run(seq, x, extras, grads, NEVER)
        _assert_same_bits(_run(seq, x, extras, grads, 0), plain, f"{case.id} {layout}")


def _as_list(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _aligned_models(dtype):
    # widths whose rows start on a vector boundary (1024) and one whose rows alternate (1000)
    return {
        "LayerNorm": lambda n: te.ops.Sequential(te.ops.LayerNorm(n, dtype=dtype)),
        "RMSNorm": lambda n: te.ops.Sequential(te.ops.RMSNorm(n, dtype=dtype)),
        "Bias+GELU": lambda n: te.ops.Sequential(te.ops.Bias(n, dtype=dtype), te.ops.GELU()),
        "GELU": lambda n: te.ops.Sequential(te.ops.GELU()),
        "SwiGLU": lambda n: te.ops.Sequential(te.ops.SwiGLU()),
    }


def _random_step(seq, rows, n, dtype):
    """seq's parameters set to random values, a random (rows, n) input and output gradients,
    and seq's outputs and gradients with plain stores."""
    with torch.no_grad():
        for p in seq.parameters():
            p.copy_(torch.randn_like(p))
    x = torch.randn(rows, n, dtype=dtype, requires_grad=True)
    grads = random_grads_like(_as_list(seq(x)))
    return x, grads, _run(seq, x, [], grads, NEVER)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("n", [1024, 1000])
def test_aligned_rows_give_the_same_bits_streamed(n, dtype, restore_threshold):
    """Rows of 1024 elements put every vector on an aligned address (all stream); rows of 1000
    alternate between aligned and not within one output."""
    for name, make in _aligned_models(dtype).items():
        torch.manual_seed(0)
        seq = make(n)
        x, grads, plain = _random_step(seq, 67, n, dtype)
        _assert_same_bits(_run(seq, x, [], grads, 0), plain, f"{name} {n}")


def test_default_threshold_is_the_last_level_cache_at_most_32_mib(restore_threshold):
    """The threshold is the largest cache sysfs lists, capped at 32 MiB: sysfs gives the
    socket's whole L3 (480 MiB on an Intel Xeon VM, where a 2-core process keeps less than
    64 MiB of it: a copy falls to memory's bandwidth between 64 and 128 MiB moved)."""
    sizes = []
    for i in range(8):
        path = f"/sys/devices/system/cpu/cpu0/cache/index{i}/size"
        if not os.path.exists(path):
            break
        with open(path) as f:
            s = f.read().strip()
        sizes.append(int(s[:-1]) * {"K": 1 << 10, "M": 1 << 20}[s[-1]] if s[-1] in "KM"
                     else int(s))
    expected = min(max(sizes, default=32 << 20), 32 << 20)
    assert _C.stream_store_min_bytes() == expected
    assert _C.set_stream_store_min_bytes(4096) == -1
    assert _C.stream_store_min_bytes() == 4096
    assert _C.set_stream_store_min_bytes(-5) == 4096
    assert _C.stream_store_min_bytes() == expected


@pytest.mark.parametrize("dtype", [torch.float32], ids=["fp32"])
def test_a_realistic_step_streams_alike_eager_and_compiled(dtype, restore_threshold):
    """A 4096x2048 LayerNorm -> Bias -> GELU step (32 MiB outputs) at a 32 MiB threshold, where
    the forward and backward kernels stream as they do on the development machines by default:
    the same bits as with plain stores, and compiled equal to eager."""
    torch.manual_seed(0)
    n = 2048
    seq = te.ops.Sequential(te.ops.LayerNorm(n, dtype=dtype), te.ops.Bias(n, dtype=dtype),
                            te.ops.GELU())
    x, grads, plain = _random_step(seq, 4096, n, dtype)
    streamed = _run(seq, x, [], grads, 32 << 20)
    _assert_same_bits(streamed, plain, "eager")
    compiled = torch.compile(seq, fullgraph=True)
    _assert_same_bits(_run(compiled, x, [], grads, 32 << 20), streamed, "compiled")
