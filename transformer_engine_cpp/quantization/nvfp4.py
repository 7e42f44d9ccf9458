"""NVFP4 (TransformerEngine's NVFP4BlockScaling): ``NVFP4Quantizer``, ``NVFP4TensorStorage`` and
``NVFP4Tensor``.

Two-level scaling: FP4 E2M1 values with an E4M3 scale per 16 consecutive elements and a
per-tensor fp32 amax (the global scale is derived from it: 6 * 448 / amax). The data is uint8,
two E2M1 codes per byte (element 2k in the low nibble, 2k + 1 in the high one, as
TransformerEngine packs them; ``NVFP4TensorStorage.fp4_view`` reinterprets it as torch's
``float4_e2m1fn_x2``). The rowwise copy is blocked along the last dim, the columnwise copy
quantized separately from high precision as the 2-D transpose (features, rows), blocked along
its last dim. Options, as TransformerEngine's quantizer:

* ``with_2d_quantization``: 16x16 tiles share one scale (weights), so both copies hold the same
  blocks;
* ``with_rht``: the columnwise copy is quantized after the 16-point random Hadamard transform
  (TransformerEngine's fixed sign vector), its amax taken after the transform; the columnwise
  dequantization maps it back, so every GEMM here sees the tensor's own values;
* ``stochastic_rounding``: each quantization draws a seed from torch's generator
  (``te_cpp.random_seeds``, the same draws eager and compiled), and the E2M1 rounding is
  stochastic, keyed by (seed, element index).

The custom ops are ``te_cpp.nvfp4_quantize`` / ``te_cpp.nvfp4_dequantize`` (ops/nvfp4.h).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..constants import DType
from .quantizer import Quantizer, emit_fits
from .tensor import (QuantizedTensor, QuantizedTensorFace, RowColumnStorage, RowColumnTensor,
                     register_row_column_tensor)

__all__ = ["NVFP4Quantizer", "NVFP4TensorStorage", "NVFP4Tensor"]

_nvfp4_quantize = torch.ops.te_cpp.nvfp4_quantize.default
_nvfp4_dequantize = torch.ops.te_cpp.nvfp4_dequantize.default
_transpose_2d = torch.ops.te_cpp.transpose_2d.default
_random_seeds = torch.ops.te_cpp.random_seeds.default

#: the FP4 format name (TransformerEngine's DType.kFloat4E2M1): torch's packed E2M1 dtype
FP4_DTYPE = torch.float4_e2m1fn_x2
BLOCK = 16


def check_nvfp4_shape(who: str, shape, *, rowwise: bool, columnwise: bool) -> None:
    """Blocks are 16 elements along the last dim (rowwise copy) and down the columns of the
    2-D view (columnwise copy, rows = product of the leading dims)."""
    shape = tuple(shape)
    if len(shape) == 0:
        raise ValueError(f"{who}: a 0-d tensor cannot be NVFP4-quantized")
    cols = shape[-1]
    rows = math.prod(shape[:-1])
    if cols % BLOCK:
        raise ValueError(f"{who}: NVFP4 needs the last dimension to be a multiple of 16 (one "
                         f"E4M3 scale per 16 consecutive elements), got shape {shape}")
    if columnwise and rows % BLOCK:
        raise ValueError(
            f"{who}: columnwise usage needs the number of rows (product of the leading dims, "
            f"{rows}) of an NVFP4 tensor to be a multiple of 16, got shape {shape}; with "
            "NVFP4BlockScaling both dims of a GEMM operand must be multiples of 16")


class NVFP4Quantizer(Quantizer):
    """TransformerEngine's ``NVFP4Quantizer`` (same constructor arguments). The amax reduction
    over a process group and ``with_random_sign_mask=False`` are not implemented here;
    ``with_post_rht_amax`` is accepted (the columnwise copy's amax is always the transformed
    tensor's)."""

    def __init__(self, fp4_dtype=FP4_DTYPE, rowwise: bool = True, columnwise: bool = True,
                 with_amax_reduction: bool = False, amax_reduction_group=None,
                 with_rht: bool = False, with_post_rht_amax: bool = False,
                 with_2d_quantization: bool = False, stochastic_rounding: bool = False,
                 with_random_sign_mask: bool = True):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        if fp4_dtype is DType.kFloat4E2M1:  # TransformerEngine's tag for it
            fp4_dtype = FP4_DTYPE
        if fp4_dtype is not FP4_DTYPE:
            raise ValueError(f"NVFP4Quantizer: fp4_dtype must be torch.float4_e2m1fn_x2 (E2M1), "
                             f"got {fp4_dtype!r}")
        if with_amax_reduction or amax_reduction_group is not None:
            raise NotImplementedError("NVFP4Quantizer: amax reduction over a process group is "
                                      "not implemented on this backend")
        if not with_random_sign_mask:
            raise NotImplementedError("NVFP4Quantizer: with_random_sign_mask=False is not "
                                      "implemented (the transform uses TransformerEngine's "
                                      "fixed sign vector)")
        self.dtype = fp4_dtype
        self.with_amax_reduction = False
        self.amax_reduction_group = None
        self.with_rht = bool(with_rht)
        self.with_post_rht_amax = bool(with_post_rht_amax)
        self.with_2d_quantization = bool(with_2d_quantization)
        self.stochastic_rounding = bool(stochastic_rounding)
        self.with_random_sign_mask = True

    def seeds(self, tensor: torch.Tensor, n: int):
        """``n`` stochastic-rounding seeds for the quantizations of ``tensor`` (int64, drawn by
        torch's generator for its device through ``te_cpp.random_seeds``, one call for all of
        them), or None without stochastic rounding."""
        if not self.stochastic_rounding:
            return None
        return _random_seeds(tensor, n)

    def quantize_storage(self, tensor, *, rowwise=True, columnwise=False, op=None):
        who = op or "NVFP4BlockScaling"
        if not (rowwise or columnwise):
            raise ValueError(f"{who}: neither rowwise nor columnwise usage is set")
        check_nvfp4_shape(who, tensor.shape, rowwise=rowwise, columnwise=columnwise)
        seeds = self.seeds(tensor, int(rowwise) + int(columnwise))
        rd = rs = ra = cd = cs = ca = None
        if rowwise:
            rd, rs, ra = _nvfp4_quantize(tensor, False, self.with_2d_quantization,
                                         None if seeds is None else seeds[0])
        if columnwise:
            xt = _transpose_2d(tensor.reshape(-1, tensor.shape[-1]))
            cd, cs, ca = _nvfp4_quantize(xt, self.with_rht, self.with_2d_quantization,
                                         None if seeds is None else seeds[-1])
        return NVFP4TensorStorage(rd, rs, ra, cd, cs, ca, tensor.dtype, tensor.shape,
                                  self.with_rht, self)

    def emit(self, y: torch.Tensor):
        """The copies the usages ask for when their 16-element blocks fit (the last dim, and
        the rows too for the columnwise copy); otherwise ``y`` stays high precision."""
        if emit_fits(y, BLOCK, self.rowwise_usage, self.columnwise_usage):
            return self.quantize_storage(y, rowwise=self.rowwise_usage,
                                         columnwise=self.columnwise_usage)
        return y

    def __repr__(self):
        return (f"NVFP4Quantizer(rowwise={self.rowwise_usage}, "
                f"columnwise={self.columnwise_usage}, with_rht={self.with_rht}, "
                f"with_2d_quantization={self.with_2d_quantization}, "
                f"stochastic_rounding={self.stochastic_rounding})")


class NVFP4TensorStorage(RowColumnStorage):
    """NVFP4 buffers (TransformerEngine's names): ``_rowwise_data`` (uint8, logical shape with
    the last dim / 2), ``_rowwise_scale_inv`` (uint8 E4M3, last dim / 16), ``_amax_rowwise``
    (fp32, (1,)); the columnwise copy ``_columnwise_data`` / ``_columnwise_scale_inv`` /
    ``_amax_columnwise`` over the 2-D transpose (features, rows), quantized after the random
    Hadamard transform when ``_columnwise_rht``."""

    _fp8_dtype = FP4_DTYPE  # the low-precision format (QuantizedTensor's repr reads this name)

    def __init__(self, rowwise_data, rowwise_scale_inv, amax_rowwise, columnwise_data,
                 columnwise_scale_inv, amax_columnwise, dtype, shape, columnwise_rht=False,
                 quantizer=None):
        self._rowwise_data = rowwise_data
        self._rowwise_scale_inv = rowwise_scale_inv
        self._amax_rowwise = amax_rowwise
        self._columnwise_data = columnwise_data
        self._columnwise_scale_inv = columnwise_scale_inv
        self._amax_columnwise = amax_columnwise
        self._nominal_dtype = dtype
        self._logical_shape = torch.Size(shape)
        self._columnwise_rht = bool(columnwise_rht)
        self._quantizer = quantizer

    @property
    def shape(self):
        return self._logical_shape

    @property
    def _fp4_dtype(self):
        return FP4_DTYPE

    @staticmethod
    def fp4_view(data: torch.Tensor) -> torch.Tensor:
        """The packed uint8 data as torch's ``float4_e2m1fn_x2`` (same bytes)."""
        return data.view(FP4_DTYPE)

    def dequantize_rowwise(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        self._require("rowwise")
        return _nvfp4_dequantize(self._rowwise_data, self._rowwise_scale_inv, self._amax_rowwise,
                                 False, dtype)

    def dequantize_columnwise(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        self._require("columnwise")
        t = _nvfp4_dequantize(self._columnwise_data, self._columnwise_scale_inv,
                              self._amax_columnwise, self._columnwise_rht, dtype)
        return t.t().reshape(self._logical_shape)

    def buffers(self) -> tuple:
        """(rowwise data, rowwise scales, rowwise amax, columnwise data, columnwise scales,
        columnwise amax), None where absent."""
        return (self._rowwise_data, self._rowwise_scale_inv, self._amax_rowwise,
                self._columnwise_data, self._columnwise_scale_inv, self._amax_columnwise)

    def metadata(self) -> tuple:
        """(NVFP4TensorStorage, (fp4 dtype, columnwise RHT), nominal dtype, logical shape)."""
        return (NVFP4TensorStorage, (FP4_DTYPE, self._columnwise_rht), self._nominal_dtype,
                tuple(self._logical_shape))

    @staticmethod
    def _from_buffers(buffers, fmt, dtype, shape):
        return NVFP4TensorStorage(*buffers, dtype, shape, fmt[1])

    def to_tensor(self) -> "NVFP4Tensor":
        return NVFP4Tensor(*self.buffers(), self._nominal_dtype, self._logical_shape,
                           self._columnwise_rht, self._quantizer)

    def update_usage(self, rowwise_usage=None, columnwise_usage=None) -> None:
        self._check_usage(rowwise_usage, columnwise_usage)
        if rowwise_usage is False:
            self._rowwise_data = self._rowwise_scale_inv = self._amax_rowwise = None
        if columnwise_usage is False:
            self._columnwise_data = self._columnwise_scale_inv = self._amax_columnwise = None


class NVFP4Tensor(RowColumnTensor, QuantizedTensorFace, NVFP4TensorStorage, QuantizedTensor):
    """NVFP4 tensor; ``dtype`` is the nominal high-precision dtype. ``detach``, ``alias``,
    ``clone`` and ``_to_copy`` keep the buffers; other ops run on the dequantized tensor, and
    an in-place op (an optimizer step on a quantized weight) re-quantizes the result into the
    buffers with the tensor's quantizer."""

    @staticmethod
    def __new__(cls, rowwise_data, rowwise_scale_inv, amax_rowwise, columnwise_data,
                columnwise_scale_inv, amax_columnwise, dtype, shape, columnwise_rht=False,
                quantizer=None, requires_grad=False):
        ref = rowwise_data if rowwise_data is not None else columnwise_data
        self = torch.Tensor._make_wrapper_subclass(
            cls, torch.Size(shape), dtype=dtype, device=ref.device, requires_grad=requires_grad)
        NVFP4TensorStorage.__init__(self, rowwise_data, rowwise_scale_inv, amax_rowwise,
                                    columnwise_data, columnwise_scale_inv, amax_columnwise,
                                    dtype, shape, columnwise_rht, quantizer)
        return self

    _BUFFER_NAMES = ("_rowwise_data", "_rowwise_scale_inv", "_amax_rowwise",
                     "_columnwise_data", "_columnwise_scale_inv", "_amax_columnwise")
    _CONSTANT_NAMES = ("dtype", "shape", "_columnwise_rht")


register_row_column_tensor(NVFP4Tensor, NVFP4TensorStorage)
