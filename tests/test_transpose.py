"""te_cpp.transpose_2d: bit for bit equal to x.t().contiguous() for every element size it
takes (1, 2, 4 and 8 bytes; random bit patterns, NaN payloads included), odd and vector shapes,
tiles with ragged edges, zero size and non-contiguous inputs; its Meta shape; its errors; and
the column-wise copies the quantizers make with it (opcheck: tests/cases.py)."""

from __future__ import annotations

import pytest
import torch

from transformer_engine_cpp.ops.basic.basic_linear import _columnwise
from transformer_engine_cpp.quantization import Float8CurrentScalingQuantizer

transpose_2d = torch.ops.te_cpp.transpose_2d

BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
DTYPES = [torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2, torch.int16, torch.bfloat16,
          torch.float16, torch.float32, torch.int32, torch.float64, torch.int64]
SHAPES = [(1, 37), (37, 1), (37, 129), (1000, 7), (7, 1000), (64, 64), (130, 300), (16, 17),
          (0, 5), (5, 0), (0, 0)]


def _random_bits(shape, dtype, generator):
    """A tensor of `dtype` whose elements are random bit patterns (NaNs and infs included)."""
    bits = BITS[dtype.itemsize]
    info = torch.iinfo(bits)
    raw = torch.randint(info.min, info.max, shape, dtype=torch.int64, generator=generator)
    return raw.to(bits).view(dtype)


def _assert_bit_equal(y, x):
    ref = x.t().contiguous()
    assert y.shape == ref.shape and y.dtype == ref.dtype and y.is_contiguous()
    assert torch.equal(y.view(BITS[y.dtype.itemsize]), ref.view(BITS[y.dtype.itemsize]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_transpose_2d_is_bit_exact(dtype, shape):
    g = torch.Generator().manual_seed(sum(shape) + dtype.itemsize)
    x = _random_bits(shape, dtype, g)
    _assert_bit_equal(transpose_2d(x), x)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32, torch.float64],
                         ids=str)
def test_transpose_2d_many_tiles_and_non_contiguous(dtype):
    """Several full tiles and ragged edges (the threads split the tiles), and inputs that are
    views: the transpose of a contiguous tensor, and every other column."""
    g = torch.Generator().manual_seed(1)
    x = _random_bits((1100, 700), dtype, g)
    _assert_bit_equal(transpose_2d(x), x)
    _assert_bit_equal(transpose_2d(x.t()), x.t())
    _assert_bit_equal(transpose_2d(x[:, ::2]), x[:, ::2])


def test_transpose_2d_meta_shape():
    y = transpose_2d(torch.empty(37, 129, dtype=torch.uint8, device="meta"))
    assert y.shape == (129, 37) and y.dtype == torch.uint8 and y.device.type == "meta"


@pytest.mark.parametrize("x, message", [
    (torch.zeros(5, dtype=torch.uint8), r"te_cpp.transpose_2d: input must be 2-D, got shape \[5\]"),
    (torch.zeros(2, 3, 4), r"te_cpp.transpose_2d: input must be 2-D, got shape \[2, 3, 4\]"),
    (torch.zeros(2, 3, dtype=torch.complex128),
     r"te_cpp.transpose_2d: input's dtype must have 1, 2, 4 or 8 bytes per element, got "
     r"ComplexDouble \(16 bytes\) of shape \[2, 3\]"),
])
def test_transpose_2d_errors(x, message):
    with pytest.raises(RuntimeError, match=message):
        transpose_2d(x)
    with pytest.raises(RuntimeError, match=message):
        transpose_2d(x.to("meta"))


def test_fp8_columnwise_copy_is_the_transpose():
    """BasicLinear's column-wise FP8 operand: the transpose of the 2-D view of the bytes."""
    q = Float8CurrentScalingQuantizer(torch.float8_e4m3fn).quantize_storage(
        torch.randn(3, 37, 48))
    _assert_bit_equal(_columnwise(q), q._data.reshape(-1, 48))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32, torch.float64],
                         ids=str)
def test_transpose_2d_cuda_is_bit_exact(dtype):
    """The CUDA kernel: the same bits as x.t().contiguous(), over partial and many tiles
    (grid-stride), vectors, zero size and a non-contiguous input."""
    g = torch.Generator().manual_seed(2)
    for shape in [(1, 37), (37, 1), (37, 129), (1000, 7), (33, 32), (2100, 1500), (0, 5)]:
        x = _random_bits(shape, dtype, g).cuda()
        _assert_bit_equal(transpose_2d(x), x)
    x = _random_bits((300, 200), dtype, g).cuda()
    _assert_bit_equal(transpose_2d(x[:, ::2]), x[:, ::2])
