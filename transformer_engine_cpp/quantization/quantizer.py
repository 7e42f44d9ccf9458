"""Quantizers: turn a high-precision tensor into a quantized one (te_ops.md 4.2).

* ``Float8CurrentScalingQuantizer``: per-tensor scale from this tensor's amax
  (``te_cpp.fp8_quantize``, te_ops.md 4.3).
* ``Float8Quantizer``: delayed scaling; casts with the scale it holds
  (``te_cpp.fp8_quantize_scaled``) and records the amax into the amax tensor it holds
  (``amax = max(amax, amax of this tensor)``, the amax history slot of its recipe state).
* ``MXFP8Quantizer``: 32-element blocks with E8M0 scales (``te_cpp.mxfp8_quantize``).

Each quantizer implements its quantization once, in ``quantize_storage(t, rowwise=,
columnwise=, op=)``: it returns the storage form (``Float8TensorStorage`` /
``MXFP8TensorStorage``) and never changes the quantizer's settings (the usages are arguments),
so the ops call it inside the pipeline, traced backward included; only delayed scaling records
its amax (eager only). The public ``quantize(t)`` (and ``__call__``) calls it with the
quantizer's own usages and returns a ``Float8Tensor`` / ``MXFP8Tensor``, or the bare storage
when ``internal`` is set; it passes gradients straight through when grad is enabled and not
``internal``. ``emit(y)`` is the neighbour protocol (what the quantizer can hand over to the op
that quantizes its input with it: the copies its usages ask for) and ``fake_quantize(t)`` the
values an FP8 consumer sees.
"""

from __future__ import annotations

import copy
import math
from typing import Optional

import torch

from .. import _comm
from .tensor import Float8TensorStorage, MXFP8TensorStorage, check_fp8_dtype

__all__ = ["Quantizer", "Float8CurrentScalingQuantizer", "Float8Quantizer", "MXFP8Quantizer"]

# the custom ops' OpOverloads (host cost: docs/architecture.md)
_fp8_quantize = torch.ops.te_cpp.fp8_quantize.default
_fp8_quantize_scaled = torch.ops.te_cpp.fp8_quantize_scaled.default
_mxfp8_quantize = torch.ops.te_cpp.mxfp8_quantize.default


class _QuantizeFunc(torch.autograd.Function):
    """Quantize with a straight-through gradient."""

    @staticmethod
    def forward(ctx, tensor, quantizer):
        return quantizer.quantize_impl(tensor)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class Quantizer:
    """Base quantizer: usage flags and the ``internal`` flag."""

    def __init__(self, *, rowwise: bool = True, columnwise: bool = True):
        self.rowwise_usage = rowwise
        self.columnwise_usage = columnwise
        self.internal = False

    def set_usage(self, *, rowwise: Optional[bool] = None,
                  columnwise: Optional[bool] = None) -> None:
        if rowwise is not None:
            self.rowwise_usage = bool(rowwise)
        if columnwise is not None:
            self.columnwise_usage = bool(columnwise)

    def usage_variant(self, *, rowwise: bool, columnwise: bool) -> "Quantizer":
        """This quantizer with the usages ``rowwise`` / ``columnwise`` (itself when it has
        them): a copy sharing its settings, made once and kept, for a consumer to hand a
        neighbour so that ``emit`` makes only the copies the consumer's GEMMs read (an op keeps
        the quantizer it was handed in its context, so a later change of usage cannot reach a
        pending backward)."""
        if rowwise == self.rowwise_usage and columnwise == self.columnwise_usage:
            return self
        variants = self.__dict__.setdefault("_usage_variants", {})
        variant = variants.get((rowwise, columnwise))
        if variant is None:
            variant = copy.copy(self)
            variant.__dict__.pop("_usage_variants", None)
            variant.set_usage(rowwise=rowwise, columnwise=columnwise)
            variants[(rowwise, columnwise)] = variant
        return variant

    def _check_input(self, tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{type(self).__name__}.quantize: expected a torch.Tensor, "
                            f"got {type(tensor).__name__}")
        if not tensor.is_floating_point() or tensor.dtype.itemsize == 1:
            raise TypeError(f"{type(self).__name__}.quantize: expected a high-precision floating "
                            f"tensor, got {tensor.dtype}")

    def quantize_storage(self, tensor: torch.Tensor, *, rowwise: bool = True,
                         columnwise: bool = False, op: Optional[str] = None):
        """``tensor`` quantized into the storage form, with the copies ``rowwise`` /
        ``columnwise`` ask for; ``op`` names the caller in errors. The one implementation of
        this quantizer's quantization."""
        raise NotImplementedError  # pragma: no cover - abstract

    def quantize_impl(self, tensor: torch.Tensor):
        """``quantize`` without the straight-through Function: this quantizer's usages, the
        tensor subclass unless ``internal``."""
        q = self.quantize_storage(tensor, rowwise=self.rowwise_usage,
                                  columnwise=self.columnwise_usage, op=type(self).__name__)
        return q if self.internal else q.to_tensor()

    def quantize(self, tensor: torch.Tensor):
        """Quantize ``tensor`` (straight-through gradient when it requires grad)."""
        self._check_input(tensor)
        if not self.internal and torch.is_grad_enabled() and tensor.requires_grad:
            return _QuantizeFunc.apply(tensor, self)
        return self.quantize_impl(tensor)

    def __call__(self, tensor: torch.Tensor):
        return self.quantize(tensor)

    def emit(self, y: torch.Tensor):
        """The neighbour protocol (te_ops.md 4.2): an op whose next op quantizes its input with
        this quantizer hands over ``y`` already quantized (the storage form), so the consumer
        skips that step; ``y`` itself where this quantizer cannot hand it over."""
        return y

    def fake_quantize(self, tensor: torch.Tensor) -> torch.Tensor:
        """dequantize(quantize(t)) in t's dtype (the rowwise copy): the values an FP8 consumer
        sees."""
        return self.quantize_storage(tensor).dequantize_rowwise(tensor.dtype)


class _PerTensorQuantizer(Quantizer):
    """Per-tensor FP8 (current or delayed scaling): one copy serves both usages, so the
    neighbour protocol always hands the output over."""

    def emit(self, y: torch.Tensor):
        return self.quantize_storage(y)

    def usage_variant(self, *, rowwise: bool, columnwise: bool) -> "Quantizer":
        """Itself: its one copy serves both usages (and delayed scaling's amax is recorded
        in the quantizer's own state)."""
        return self


class Float8CurrentScalingQuantizer(_PerTensorQuantizer):
    """Per-tensor current scaling: scale = fp8_max / amax of the tensor itself. With an
    ``amax_reduction_group`` (tensor parallelism sets it on an operand that is all-gathered,
    as TransformerEngine's ``with_amax_reduction``), the amax is the maximum over the group's
    ranks, so every rank quantizes with the scale of the gathered tensor."""

    def __init__(self, fp8_dtype: torch.dtype, device=None, *, rowwise: bool = True,
                 columnwise: bool = True, force_pow_2_scales: bool = False,
                 amax_epsilon: float = 0.0):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        fp8_dtype = check_fp8_dtype(fp8_dtype)
        if (isinstance(amax_epsilon, bool) or not isinstance(amax_epsilon, (int, float))
                or not math.isfinite(amax_epsilon) or amax_epsilon < 0):
            raise ValueError(f"Float8CurrentScalingQuantizer: amax_epsilon must be a finite "
                             f"float >= 0, got {amax_epsilon!r}")
        self.dtype = fp8_dtype
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.amax_epsilon = float(amax_epsilon)
        self.amax_reduction_group = None

    @property
    def with_amax_reduction(self) -> bool:
        """Whether the amax is reduced over ``amax_reduction_group`` (TransformerEngine's
        attribute of the same name)."""
        return self.amax_reduction_group is not None

    def quantize_storage(self, tensor, *, rowwise=True, columnwise=False, op=None):
        if self.amax_reduction_group is None:
            data, scale_inv, _amax = _fp8_quantize(tensor, self.dtype, self.force_pow_2_scales,
                                                   self.amax_epsilon)
        else:  # amax -> max over the group -> scale -> cast (the same bits as one call)
            ops = torch.ops.te_cpp
            amax = _comm.wait(_comm.all_reduce(ops.fp8_amax.default(tensor),
                                               self.amax_reduction_group, "max"))
            scale = ops.fp8_current_scale.default(amax, self.dtype, self.force_pow_2_scales,
                                                  self.amax_epsilon)
            data, scale_inv, _amax = _fp8_quantize_scaled(tensor, scale, self.dtype)
        return Float8TensorStorage(data, scale_inv, self.dtype, tensor.dtype, self)


class Float8Quantizer(_PerTensorQuantizer):
    """Delayed scaling: casts with ``scale`` (fp32, one element) and writes the running max of
    the amaxes it sees into ``amax`` (fp32, one element; a slot of the amax history)."""

    def __init__(self, scale: torch.Tensor, amax: torch.Tensor, fp8_dtype: torch.dtype, *,
                 rowwise: bool = True, columnwise: bool = True):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        fp8_dtype = check_fp8_dtype(fp8_dtype)
        for name, t in (("scale", scale), ("amax", amax)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != 1:
                raise ValueError(f"Float8Quantizer: {name} must be a float32 tensor with one "
                                 f"element, got {t!r}")
        self.scale = scale
        self.amax = amax
        self.dtype = fp8_dtype

    def quantize_storage(self, tensor, *, rowwise=True, columnwise=False, op=None):
        data, scale_inv, amax = _fp8_quantize_scaled(tensor, self.scale.reshape(1), self.dtype)
        with torch.no_grad():  # the amax history slot (delayed scaling: eager only)
            self.amax.copy_(torch.maximum(self.amax, amax.reshape(self.amax.shape)))
        return Float8TensorStorage(data, scale_inv, self.dtype, tensor.dtype, self)


class MXFP8Quantizer(Quantizer):
    """MXFP8: blocks of 32 consecutive elements with E8M0 scales. The rowwise copy is blocked
    along the last dim; the columnwise copy is quantized separately from high precision with
    blocks down the columns (the 2-D view's transpose), which needs rows % 32 == 0."""

    def __init__(self, fp8_dtype: torch.dtype, *, rowwise: bool = True, columnwise: bool = True):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        fp8_dtype = check_fp8_dtype(fp8_dtype)
        self.dtype = fp8_dtype

    def quantize_storage(self, tensor, *, rowwise=True, columnwise=False, op=None):
        who = op or "MXFP8BlockScaling"
        if not (rowwise or columnwise):
            raise ValueError(f"{who}: neither rowwise nor columnwise usage is set")
        check_mxfp8_shape(who, tensor.shape, rowwise=rowwise, columnwise=columnwise)
        row_data = row_scale = col_data = col_scale = None
        if rowwise:
            row_data, row_scale = _mxfp8_quantize(tensor, self.dtype)
        if columnwise:  # the op reads the transposed view in place (no transposed copy)
            cols = tensor.shape[-1]
            col_data, col_scale = _mxfp8_quantize(tensor.reshape(-1, cols).t(), self.dtype)
        return MXFP8TensorStorage(row_data, row_scale, col_data, col_scale, self.dtype,
                                  tensor.dtype, tensor.shape, self)

    def emit(self, y: torch.Tensor):
        """The copies the usages ask for (the consumer's GEMMs need blocks along either dim)
        when their blocks fit: the last dim a multiple of 32, and the rows too for the
        columnwise copy; otherwise ``y`` stays high precision."""
        if emit_fits(y, 32, self.rowwise_usage, self.columnwise_usage):
            return self.quantize_storage(y, rowwise=self.rowwise_usage,
                                         columnwise=self.columnwise_usage)
        return y


def emit_fits(y: torch.Tensor, block: int, rowwise: bool, columnwise: bool) -> bool:
    """Whether a block format's ``emit`` hands ``y`` over with the copies asked for: at least
    one copy, and blocks of ``block`` elements tiling the last dim and, for the columnwise
    copy, the rows (the product of the leading dims)."""
    if y.dim() == 0 or not (rowwise or columnwise) or y.shape[-1] % block:
        return False
    return not columnwise or (y.numel() // max(y.shape[-1], 1)) % block == 0


def check_mxfp8_shape(who: str, shape, *, rowwise: bool, columnwise: bool) -> None:
    """MXFP8 blocks are 32 elements: along the last dim for the rowwise copy, down the
    columns of the 2-D view (rows = product of the leading dims) for the columnwise copy.
    Checked on the caller's shape, before the columnwise copy is transposed."""
    shape = tuple(shape)
    if len(shape) == 0:
        raise ValueError(f"{who}: a 0-d tensor cannot be MXFP8-quantized")
    cols = shape[-1]
    if rowwise and cols % 32:
        raise ValueError(
            f"{who}: MXFP8 needs the last dimension to be a multiple of 32 (one E8M0 scale per "
            f"32 consecutive elements), got shape {shape}")
    rows = math.prod(shape[:-1])
    if columnwise and (cols % 32 or rows % 32):
        hint = ("use set_usage(columnwise=False) for a rowwise-only tensor"
                if who == "MXFP8Quantizer" else
                "the columnwise copy feeds the backward GEMMs, so with MXFP8BlockScaling both "
                "dims of a GEMM operand must be multiples of 32")
        raise ValueError(
            f"{who}: columnwise usage needs the number of rows (product of the leading dims, "
            f"{rows}) and the last dimension of an MXFP8 tensor to be multiples of 32, got "
            f"shape {shape}; {hint}")
