"""What the CUDA kernels promise beyond numerics (the conformance suite checks those): for every
te_cpp op's opcheck samples, on the GPU,

* the same bits on a second run (deterministic reductions: no float atomics), also at a
  realistic size for the ops that reduce over rows;
* no host synchronisation (``torch.cuda.set_sync_debug_mode("error")`` around the call);
* the same result when the call is captured in a CUDA graph and replayed;
* FP8 data and scales, MXFP8 scales and dropout masks bit-identical to the CPU kernels' (those
  are defined bit for bit, not within a tolerance).

Every test runs on CUDA and skips without a GPU; the determinism tests also run on the CPU, so
this file's own code runs in every CI.
"""

from __future__ import annotations

import pytest
import torch

from cases import OP_CASES, STANDALONE_OPCHECK_SAMPLES, _op_name
from harness import DEVICES, draws_from_generator, skip_missing_cuda_kernel, to_device

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
DTYPES = [torch.float32, torch.bfloat16]
DTYPE_IDS = ["fp32", "bf16"]


def _samples(dtype) -> list:
    """Every (op, args) opcheck sample, once per sample function."""
    out, seen = [], set()
    for fn in [c.opcheck_samples for c in OP_CASES if c.opcheck_samples] + \
            list(STANDALONE_OPCHECK_SAMPLES.values()):
        if fn not in seen:
            seen.add(fn)
            out += fn(dtype)
    return out


def _mutates(op) -> bool:
    overload = op.default if isinstance(op, torch._ops.OpOverloadPacket) else op
    return any(a.alias_info is not None and a.alias_info.is_write
               for a in overload._schema.arguments)


def _outputs(result) -> list:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [r for r in result if isinstance(r, torch.Tensor)]
    return []


def _clone(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _call(op, args):
    """The op's outputs, and for an in-place op its mutated buffer (args[0]) too. An op that
    draws from torch's generator draws after torch.manual_seed(0), so its calls compare."""
    if draws_from_generator(op):
        torch.manual_seed(0)
    with torch.no_grad():
        args = _clone(args)
        out = _outputs(op(*args))
        return out + ([args[0]] if _mutates(op) else [])


def _assert_bitwise(a: list, b: list, what: str):
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.shape == y.shape and x.dtype == y.dtype, f"{what}: output {i}"
        xb = x.detach().cpu().contiguous().view(-1).view(torch.uint8) if x.numel() else x.cpu()
        yb = y.detach().cpu().contiguous().view(-1).view(torch.uint8) if y.numel() else y.cpu()
        assert torch.equal(xb, yb), f"{what}: output {i} differs bitwise"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_every_op_gives_the_same_bits_twice(dtype, device):
    with skip_missing_cuda_kernel():
        for op, args in _samples(dtype):
            args = to_device(args, device)
            _assert_bitwise(_call(op, args), _call(op, args), f"{_op_name(op)} on {device}")


def _reducing_calls(device, dtype):
    """Ops that reduce over rows, at a realistic size (several row chunks, wide rows)."""
    g = torch.Generator().manual_seed(7)
    rows, n = 4096, 1024

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    x, dy, w, b = rnd(rows, n), rnd(rows, n), rnd(n), rnd(n)
    te = torch.ops.te_cpp
    y, mu, rs = te.layernorm_fwd(x, w, b, 1e-5, False)
    _, rrs = te.rmsnorm_fwd(x, w, 1e-5, False)
    weight = rnd(512, n)
    dy2 = rnd(rows, 512)
    return {
        "bias_bwd": lambda: te.bias_bwd(dy, dtype),
        "dbias_dgelu": lambda: te.dbias_dgelu(dy, x, dtype),
        "layernorm_bwd": lambda: te.layernorm_bwd(dy, x, mu, rs, w, False),
        "rmsnorm_bwd": lambda: te.rmsnorm_bwd(dy, x, rrs, w, False),
        "rmsnorm_bwd_add": lambda: te.rmsnorm_bwd_add(dy, x, rrs, w, False, dy),
        "linear_bwd": lambda: te.linear_bwd(dy2, x, weight, 1.0, dtype),
        "fp8_quantize": lambda: te.fp8_quantize(x, torch.float8_e4m3fn, False, 0.0),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_row_reductions_are_deterministic_at_a_realistic_size(dtype, device):
    with skip_missing_cuda_kernel():
        for name, call in _reducing_calls(device, dtype).items():
            _assert_bitwise(_outputs(call()), _outputs(call()), f"{name} on {device}")


@CUDA
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_no_op_synchronises_the_host(dtype):
    with skip_missing_cuda_kernel():
        for op, args in _samples(dtype):
            args = to_device(args, "cuda")
            _call(op, args)  # first call: one-time set-up (handles, heuristics) may sync
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                _call(op, args)
            except RuntimeError as e:
                raise AssertionError(f"{_op_name(op)} synchronised the host: {e}") from e
            finally:
                torch.cuda.set_sync_debug_mode("default")


@CUDA
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_every_op_replays_under_cuda_graph_capture(dtype):
    with skip_missing_cuda_kernel():
        for op, args in _samples(dtype):
            if _mutates(op) or draws_from_generator(op):
                continue  # a replay would apply the update again, or draw new values
            args = to_device(args, "cuda")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                eager = _call(op, args)  # warm-up on a side stream, as torch.cuda.graph asks
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(graph):
                captured = _outputs(op(*args))
            graph.replay()
            torch.cuda.synchronize()
            _assert_bitwise(eager, captured, f"{_op_name(op)} under graph capture")


_BIT_EXACT = ("fp8_", "mxfp8_", "dropout_fwd")


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
def test_quantize_and_dropout_are_bit_identical_to_the_cpu(dtype):
    checked = 0
    with skip_missing_cuda_kernel():
        for op, args in _samples(dtype):
            if not _op_name(op).startswith(_BIT_EXACT):
                continue
            _assert_bitwise(_call(op, args), _call(op, to_device(args, "cuda")),
                            f"{_op_name(op)}: CUDA against CPU")
            checked += 1
    assert checked > 0
