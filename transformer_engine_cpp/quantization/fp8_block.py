"""Float8BlockScaling: TransformerEngine's ``Float8BlockQuantizer`` and
``Float8BlockwiseQTensor``, emulated exactly (docs/quantization.md).

One fp32 scale per 1x128 block (128 consecutive elements of a row of the 2-D view [rows, last
dim]; ``block_scaling_dim=1``, activations and gradients) or per 128x128 tile
(``block_scaling_dim=2``, weights), from the block's own amax (NaN skipped), with the current
scaling rule (epsilon floor, optional power-of-two rounding down); blocks at the edges are
partial. The rowwise copy is blocked along the last dim; the columnwise copy, as in
TransformerEngine, is the 2-D view's transpose [last dim, rows] quantized in blocks along its
last dim, i.e. 128x1 blocks of the original (for 128x128 tiles it is the exact transpose of the
rowwise copy). The ops are ``te_cpp.fp8_block_quantize`` / ``te_cpp.fp8_block_dequantize``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from .quantizer import Quantizer
from .recipe_state import RecipeState
from .tensor import (QuantizedTensor, QuantizedTensorFace, RowColumnStorage, RowColumnTensor,
                     check_fp8_dtype, register_row_column_tensor)

__all__ = ["Float8BlockQuantizer", "Float8BlockwiseQTensorStorage", "Float8BlockwiseQTensor",
           "Float8BlockScalingRecipeState"]

_fp8_block_quantize = torch.ops.te_cpp.fp8_block_quantize.default
_fp8_block_dequantize = torch.ops.te_cpp.fp8_block_dequantize.default
_transpose_2d = torch.ops.te_cpp.transpose_2d.default


class Float8BlockwiseQTensorStorage(RowColumnStorage):
    """Block-scaled FP8 buffers: ``_rowwise_data`` (uint8, logical shape) with
    ``_rowwise_scale_inv`` (fp32: the shape with the last dim -> ceil(last / 128) for 1x128
    blocks, [ceil(rows / 128), ceil(last / 128)] for 128x128 tiles), and/or the columnwise copy
    ``_columnwise_data`` (uint8 [last dim, rows]) with ``_columnwise_scale_inv`` (the same rule
    on that 2-D shape). ``_is_2D_scaled``: 128x128 tiles."""

    def __init__(self, rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv,
                 fp8_dtype, dtype, shape, is_2D_scaled: bool, quantizer=None):
        self._rowwise_data = rowwise_data
        self._rowwise_scale_inv = rowwise_scale_inv
        self._columnwise_data = columnwise_data
        self._columnwise_scale_inv = columnwise_scale_inv
        self._fp8_dtype = fp8_dtype
        self._nominal_dtype = dtype
        self._logical_shape = torch.Size(shape)
        self._is_2D_scaled = bool(is_2D_scaled)
        self._quantizer = quantizer

    @property
    def shape(self):
        return self._logical_shape

    @property
    def _block_dim(self) -> int:
        return 2 if self._is_2D_scaled else 1

    def dequantize_rowwise(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        self._require("rowwise")
        return _fp8_block_dequantize(self._rowwise_data, self._rowwise_scale_inv,
                                     self._fp8_dtype, self._block_dim, dtype)

    def dequantize_columnwise(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        self._require("columnwise")
        t = _fp8_block_dequantize(self._columnwise_data, self._columnwise_scale_inv,
                                  self._fp8_dtype, self._block_dim, dtype)
        return t.t().reshape(self._logical_shape)

    def buffers(self) -> tuple:
        return (self._rowwise_data, self._rowwise_scale_inv, self._columnwise_data,
                self._columnwise_scale_inv)

    def metadata(self) -> tuple:
        return (Float8BlockwiseQTensorStorage, self._fp8_dtype, self._nominal_dtype,
                tuple(self._logical_shape), self._is_2D_scaled)

    @staticmethod
    def _from_buffers(buffers, fp8_dtype, dtype, shape, is_2D_scaled=False):
        return Float8BlockwiseQTensorStorage(*buffers, fp8_dtype, dtype, shape, is_2D_scaled)

    def to_tensor(self) -> "Float8BlockwiseQTensor":
        return Float8BlockwiseQTensor(self._rowwise_data, self._rowwise_scale_inv,
                                      self._columnwise_data, self._columnwise_scale_inv,
                                      self._fp8_dtype, self._nominal_dtype, self._logical_shape,
                                      self._is_2D_scaled, self._quantizer)

    def update_usage(self, rowwise_usage=None, columnwise_usage=None) -> None:
        self._check_usage(rowwise_usage, columnwise_usage)
        if rowwise_usage is False:
            self._rowwise_data = self._rowwise_scale_inv = None
        if columnwise_usage is False:
            self._columnwise_data = self._columnwise_scale_inv = None


class Float8BlockwiseQTensor(RowColumnTensor, QuantizedTensorFace, Float8BlockwiseQTensorStorage,
                             QuantizedTensor):
    """Block-scaled FP8 tensor; ``dtype`` is the nominal dtype. ``detach``, ``alias``,
    ``clone`` and ``_to_copy`` keep the buffers; other ops run on the dequantized tensor, and
    an in-place op (an optimizer step on a quantized weight) re-quantizes the result into the
    buffers with the tensor's quantizer."""

    @staticmethod
    def __new__(cls, rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv,
                fp8_dtype, dtype, shape, is_2D_scaled=False, quantizer=None,
                requires_grad=False):
        fp8_dtype = check_fp8_dtype(fp8_dtype)
        ref = rowwise_data if rowwise_data is not None else columnwise_data
        self = torch.Tensor._make_wrapper_subclass(
            cls, torch.Size(shape), dtype=dtype, device=ref.device, requires_grad=requires_grad)
        Float8BlockwiseQTensorStorage.__init__(self, rowwise_data, rowwise_scale_inv,
                                               columnwise_data, columnwise_scale_inv, fp8_dtype,
                                               dtype, shape, is_2D_scaled, quantizer)
        return self

    _CONSTANT_NAMES = ("_fp8_dtype", "dtype", "shape", "_is_2D_scaled")


register_row_column_tensor(Float8BlockwiseQTensor, Float8BlockwiseQTensorStorage)


class Float8BlockQuantizer(Quantizer):
    """TransformerEngine's Float8BlockQuantizer: FP8 with one fp32 scale per 1x128 block
    (``block_scaling_dim=1``) or 128x128 tile (``block_scaling_dim=2``); scale = fp8_max / amax
    with the amax floored at ``amax_epsilon``, rounded down to a power of two with
    ``force_pow_2_scales``. The columnwise copy is quantized separately from high precision in
    blocks down the columns (for tiles: the transpose of the rowwise copy)."""

    def __init__(self, fp8_dtype: torch.dtype, *, rowwise: bool, columnwise: bool,
                 amax_epsilon: float = 0.0, force_pow_2_scales: bool = True,
                 block_scaling_dim: int = 2):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        fp8_dtype = check_fp8_dtype(fp8_dtype)
        if (isinstance(amax_epsilon, bool) or not isinstance(amax_epsilon, (int, float))
                or not math.isfinite(amax_epsilon) or amax_epsilon < 0):
            raise ValueError(f"Float8BlockQuantizer: amax_epsilon must be a finite float >= 0, "
                             f"got {amax_epsilon!r}")
        if isinstance(block_scaling_dim, bool) or block_scaling_dim not in (1, 2):
            raise ValueError(f"Float8BlockQuantizer: block_scaling_dim must be 1 or 2, got "
                             f"{block_scaling_dim!r}")
        self.dtype = fp8_dtype
        self.block_len = 128
        self.amax_epsilon = float(amax_epsilon)
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.block_scaling_dim = int(block_scaling_dim)

    def quantize_storage(self, tensor, *, rowwise=True, columnwise=False, op=None):
        who = op or "Float8BlockScaling"
        if not (rowwise or columnwise):
            raise ValueError(f"{who}: neither rowwise nor columnwise usage is set")
        if tensor.dim() == 0:
            raise ValueError(f"{who}: a 0-d tensor cannot be block-quantized")
        dim, args = self.block_scaling_dim, (self.force_pow_2_scales, self.amax_epsilon)
        row_data = row_scale = col_data = col_scale = None
        if rowwise:
            row_data, row_scale = _fp8_block_quantize(tensor, self.dtype, dim, *args)
        if columnwise:
            cols = tensor.shape[-1]
            if rowwise and dim == 2:  # square tiles: the transpose is exact
                col_data = _transpose_2d(row_data.reshape(-1, cols))
                col_scale = _transpose_2d(row_scale)
            else:
                col_data, col_scale = _fp8_block_quantize(
                    _transpose_2d(tensor.reshape(-1, cols)), self.dtype, dim, *args)
        return Float8BlockwiseQTensorStorage(row_data, row_scale, col_data, col_scale, self.dtype,
                                             tensor.dtype, tensor.shape, dim == 2, self)

    def emit(self, y: torch.Tensor):
        """The copies the usages ask for (the consumer's GEMMs need blocks along either dim);
        any shape (edge blocks are partial)."""
        if y.dim() == 0 or not (self.rowwise_usage or self.columnwise_usage):
            return y
        return self.quantize_storage(y, rowwise=self.rowwise_usage,
                                     columnwise=self.columnwise_usage)


class Float8BlockScalingRecipeState(RecipeState):
    """Quantizers per role, as TransformerEngine: forward weights ``fp8_quant_fwd_weight`` and
    ``w_block_scaling_dim``, inputs and outputs ``fp8_quant_fwd_inp`` and
    ``x_block_scaling_dim`` (``RecipeState.tensor_type``); backward: ``fp8_quant_bwd_grad``
    and ``grad_block_scaling_dim``."""

    def make_quantizers(self) -> list:
        r = self.recipe
        out = []
        for i in range(self.num_quantizers):
            if self.mode == "backward":
                qp, dim = r.fp8_quant_bwd_grad, r.grad_block_scaling_dim
            elif self.tensor_type(i) == "weight":
                qp, dim = r.fp8_quant_fwd_weight, r.w_block_scaling_dim
            else:
                qp, dim = r.fp8_quant_fwd_inp, r.x_block_scaling_dim
            out.append(Float8BlockQuantizer(self.dtype, rowwise=True, columnwise=True,
                                            amax_epsilon=qp.amax_epsilon,
                                            force_pow_2_scales=qp.power_2_scale,
                                            block_scaling_dim=dim))
        return out
