"""Quantized tensors: ``Float8Tensor`` (per-tensor scale) and ``MXFP8Tensor`` (E8M0 scale per
32-element block), torch.Tensor subclasses that exist only at the public API boundary, built on
their storage forms ``Float8TensorStorage`` / ``MXFP8TensorStorage``.

The storage form is the one representation of a quantized operand: quantizers return it
(``Quantizer.quantize_storage``), the ops hand it to each other inside the pipeline and run
their GEMMs on its dequantized copies (``dequantize_rowwise`` / ``dequantize_columnwise``), and
save its plain buffers for backward (``buffers()`` / ``metadata()``, rebuilt by
``QuantizedTensorStorage.from_buffers``). The tensor subclasses hold the same buffers plus the
nominal ("fake") high-precision dtype; any aten op they do not handle runs on the dequantized
tensor (``__torch_dispatch__`` fallback).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Optional

import torch
from torch.utils._pytree import tree_map

from ..constants import DType, TE_DType_To_Torch


aten = torch.ops.aten
# the custom ops' OpOverloads (host cost: docs/architecture.md)
_fp8_dequantize = torch.ops.te_cpp.fp8_dequantize.default
_mxfp8_dequantize = torch.ops.te_cpp.mxfp8_dequantize.default

__all__ = ["QuantizedTensorStorage", "QuantizedTensor", "Float8TensorStorage", "Float8Tensor",
           "MXFP8TensorStorage", "MXFP8Tensor"]


def _op_name(op) -> str:
    return "an in-place op" if op is None else op._schema.name.split("::")[-1] + (
        f".{op._overloadname}" if op._overloadname != "default" else "")


def _wrapper_mode(src: torch.Tensor):
    """A view-like result (detach, alias, view) is an inference tensor exactly when its source
    is, inside torch.inference_mode or not (autograd links a normal result's version counter
    to the source's), as for plain tensors."""
    if torch.is_inference_mode_enabled() != src.is_inference():
        return torch.inference_mode(src.is_inference())
    return contextlib.nullcontext()


def check_fp8_dtype(fp8_dtype) -> torch.dtype:
    """The public ``fp8_dtype``, a torch float8 dtype or TransformerEngine's tag for one
    (``DType.kFloat8E4M3`` / ``kFloat8E5M2``), as the torch dtype (ValueError for anything
    else)."""
    dtype = TE_DType_To_Torch.get(fp8_dtype) if isinstance(fp8_dtype, DType) else fp8_dtype
    if dtype is not torch.float8_e4m3fn and dtype is not torch.float8_e5m2:
        raise ValueError("fp8_dtype must be torch.float8_e4m3fn or torch.float8_e5m2 (or "
                         f"DType.kFloat8E4M3 / DType.kFloat8E5M2), got {fp8_dtype!r}")
    return dtype


class QuantizedTensorStorage:
    """Buffers of a quantized tensor without the torch.Tensor wrapper: what quantizers return
    to the ops (and to the public API for ``internal`` quantizers).

    GEMM operands: ``dequantize_rowwise(dtype)`` is the copy blocked along the last dim (the
    reduction dim of the forward GEMM), ``dequantize_columnwise(dtype)`` the copy blocked down
    the columns (the reduction dim of dgrad and wgrad), both in the logical shape and fp32 by
    default. ``dequantize(dtype=None)`` gives the values in the nominal dtype.

    Saving for backward: ``buffers()`` is a fixed-length tuple of plain tensors (None where
    absent) for ``ctx.save_for_backward``, ``metadata()`` a tuple of Python constants, and
    ``QuantizedTensorStorage.from_buffers(buffers, metadata)`` rebuilds the storage in backward.
    Under torch.compile only these tensors cross the traced forward and backward, never the
    storage object."""

    _quantizer = None
    _nominal_dtype = None

    @property
    def nominal_dtype(self) -> torch.dtype:
        """The high-precision dtype the quantized values stand for."""
        return self._nominal_dtype

    def dequantize(self, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        return self._dequantize_impl(self._nominal_dtype if dtype is None else dtype)

    def _dequantize_impl(self, dtype):  # pragma: no cover - abstract
        raise NotImplementedError

    def dequantize_rowwise(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover - abstract

    def dequantize_columnwise(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover - abstract

    def buffers(self) -> tuple:
        """(rowwise data, rowwise scale, columnwise data, columnwise scale), None where absent."""
        raise NotImplementedError  # pragma: no cover - abstract

    def metadata(self) -> tuple:
        """(storage class, fp8 dtype, nominal dtype, logical shape): constants only (the
        storage class, not the tensor subclass, so backward rebuilds a bare storage)."""
        raise NotImplementedError  # pragma: no cover - abstract

    @staticmethod
    def from_buffers(buffers, metadata) -> "QuantizedTensorStorage":
        """The storage ``buffers()`` and ``metadata()`` describe (without a quantizer)."""
        cls, fp8_dtype, dtype, shape, *extra = metadata  # extra: a storage's own constants
        return cls._from_buffers(tuple(buffers), fp8_dtype, dtype, shape, *extra)

    def to_tensor(self) -> "QuantizedTensor":  # pragma: no cover - abstract
        """The public torch.Tensor subclass over the same buffers."""
        raise NotImplementedError

    def update_usage(self, rowwise_usage: Optional[bool] = None,
                     columnwise_usage: Optional[bool] = None) -> None:
        raise NotImplementedError


class _Dequantize(torch.autograd.Function):
    """Dequantize with a straight-through gradient."""

    @staticmethod
    def forward(ctx, tensor, dtype):
        return tensor._dequantize_impl(dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class QuantizedTensor(torch.Tensor):
    """Base of the quantized torch.Tensor subclasses."""

    # Ops handled on the quantized buffers; everything else dequantizes.
    _HANDLED: dict = {}

    def dequantize(self, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        dtype = self.dtype if dtype is None else dtype
        if torch.is_grad_enabled() and self.requires_grad:
            return _Dequantize.apply(self, dtype)
        return self._dequantize_impl(dtype)

    def _dequantize_impl(self, dtype):  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self, *, tensor_contents=None):
        return (f"{type(self).__name__}(fp8_dtype={self._fp8_dtype}, shape={tuple(self.shape)}, "
                f"dtype={self.dtype}, data={self._dequantize_impl(self.dtype)})")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = cls._HANDLED.get(func)
        if handler is not None:
            return handler(*args, **kwargs)

        def unwrap(t):
            return t._dequantize_impl(t.dtype) if isinstance(t, QuantizedTensor) else t

        if not func._schema.is_mutable:
            return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        # An in-place or out= op (an optimizer step, copy_, zero_, a custom op's Tensor(a!)):
        # run on dequantized copies, then re-quantize each written quantized argument into its
        # own buffers (TransformerEngine's rule). The result is the op's, with those copies
        # mapped back.
        new_args = tree_map(unwrap, args)
        new_kwargs = tree_map(unwrap, kwargs)
        out = func(*new_args, **new_kwargs)
        written = {}
        schema = func._schema.arguments
        pairs = list(zip(args, new_args, schema))
        pairs += [(kwargs[a.name], new_kwargs[a.name], a) for a in schema if a.name in kwargs]
        for orig, copy, arg in pairs:
            if (isinstance(orig, QuantizedTensor) and arg.alias_info is not None
                    and arg.alias_info.is_write):
                orig._requantize_from(copy, op=func)
                written[id(copy)] = orig
        return tree_map(lambda t: written.get(id(t), t), out)

    def _requantize_from(self, values: torch.Tensor, op=None) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} cannot be updated in place ({_op_name(op)} on a tensor of "
            f"shape {tuple(self.shape)}); dequantize() it first")


class QuantizedTensorFace:
    """The first base of every quantized tensor subclass, ahead of its storage base (whose
    ``shape`` and ``dequantize`` would shadow the torch.Tensor side's): torch's shape, the
    autograd-aware ``dequantize``, and an ``__init__`` with nothing to do (``__new__`` builds
    the tensor)."""

    def __init__(self, *args, **kwargs):
        pass

    @property
    def shape(self):
        return torch.Tensor.shape.__get__(self)

    def dequantize(self, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        return QuantizedTensor.dequantize(self, dtype=dtype)


class Float8TensorStorage(QuantizedTensorStorage):
    """Per-tensor FP8 buffers: ``_data`` (uint8, logical shape), ``_scale_inv`` (fp32, (1,)).

    Rowwise and columnwise copies of per-tensor scaling are numerically identical, so one copy
    (``_data``) serves both usages and no transpose is materialised (as on Blackwell)."""

    def __init__(self, data: torch.Tensor, scale_inv: torch.Tensor, fp8_dtype: torch.dtype,
                 dtype: torch.dtype, quantizer=None):
        self._data = data
        self._scale_inv = scale_inv
        self._fp8_dtype = fp8_dtype
        self._nominal_dtype = dtype
        self._quantizer = quantizer

    @property
    def shape(self):
        return self._data.shape

    def dequantize_rowwise(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return _fp8_dequantize(self._data, self._scale_inv, self._fp8_dtype, dtype)

    # one copy serves both usages and the nominal values
    dequantize_columnwise = _dequantize_impl = dequantize_rowwise

    def buffers(self) -> tuple:
        return (self._data, self._scale_inv, None, None)

    def metadata(self) -> tuple:
        return (Float8TensorStorage, self._fp8_dtype, self._nominal_dtype, tuple(self.shape))

    @staticmethod
    def _from_buffers(buffers, fp8_dtype, dtype, shape):
        return Float8TensorStorage(buffers[0], buffers[1], fp8_dtype, dtype)

    def to_tensor(self) -> "Float8Tensor":
        return Float8Tensor(self._data, self._scale_inv, self._fp8_dtype, self._nominal_dtype,
                            self._quantizer)

    def update_usage(self, rowwise_usage=None, columnwise_usage=None) -> None:
        if rowwise_usage is False and columnwise_usage is False:
            raise ValueError("Float8Tensor.update_usage: at least one usage must remain")


class Float8Tensor(QuantizedTensorFace, Float8TensorStorage, QuantizedTensor):
    """FP8 tensor with one per-tensor scale; ``dtype`` is the nominal high-precision dtype."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, scale_inv: torch.Tensor, fp8_dtype: torch.dtype,
                dtype: torch.dtype, quantizer=None, requires_grad: bool = False):
        if data.dtype != torch.uint8:
            raise ValueError(f"Float8Tensor: data must be uint8, got {data.dtype}")
        fp8_dtype = check_fp8_dtype(fp8_dtype)
        self = torch.Tensor._make_wrapper_subclass(
            cls, data.shape, dtype=dtype, device=data.device, requires_grad=requires_grad)
        Float8TensorStorage.__init__(self, data, scale_inv, fp8_dtype, dtype, quantizer)
        return self

    def _requantize_from(self, values: torch.Tensor, op=None) -> None:
        """Re-quantize ``values`` into this tensor's buffers (current scaling from its own
        quantizer, or the quantizer's scale for delayed scaling)."""
        if self._quantizer is None:
            raise RuntimeError(
                f"Float8Tensor: {_op_name(op)} writes into a Float8Tensor of shape "
                f"{tuple(self.shape)} that has no quantizer to re-quantize the result; build it "
                "with a quantizer or dequantize() it first")
        fresh = self._quantizer.quantize_storage(values.to(self.dtype))
        with torch.no_grad():
            self._data.copy_(fresh._data)
            self._scale_inv.copy_(fresh._scale_inv)

    def update_quantizer(self, quantizer) -> None:
        """Re-quantize later in-place updates with ``quantizer`` (an op binds its quantized
        weight to its own weight quantizer, so delayed scaling records the weight's amax in
        the op's history and its updated scale applies to the next update). An amax already
        recorded by a previous delayed-scaling quantizer (at initialisation) is carried over.
        (``bind_quantizer`` is the same as a function, for code that torch.compile traces.)"""
        bind_quantizer(self, quantizer)

    def _with_data(self, data: torch.Tensor, scale_inv: Optional[torch.Tensor] = None):
        with _wrapper_mode(self):
            return Float8Tensor(data, self._scale_inv if scale_inv is None else scale_inv,
                                self._fp8_dtype, self.dtype, self._quantizer)

    # torch.compile support: the subclass flattens to its two buffers.
    def __tensor_flatten__(self):
        return ["_data", "_scale_inv"], (self._fp8_dtype, self.dtype)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        fp8_dtype, dtype = meta
        return Float8Tensor(inner["_data"], inner["_scale_inv"], fp8_dtype, dtype)


def _f8_detach(t):
    return t._with_data(t._data.detach(), t._scale_inv.detach())


def _f8_clone(t, *, memory_format=None):
    return t._with_data(t._data.clone(), t._scale_inv.clone())


def _f8_view(t, size):
    return t._with_data(t._data.view(size))


def _f8_unsafe_view(t, size):
    return t._with_data(aten._unsafe_view.default(t._data, size))


# Set while nn.Module._apply converts a te.ops module's tensors (model.half(), model.to(dtype)):
# BasicOperation._apply enters module_cast(), since torch tells a tensor conversion nothing
# about its caller.
_MODULE_CAST = contextvars.ContextVar("transformer_engine_cpp_module_cast", default=False)


@contextlib.contextmanager
def module_cast():
    """Marks the tensor conversions inside as a module cast (see ``_f8_to_copy``)."""
    token = _MODULE_CAST.set(True)
    try:
        yield
    finally:
        _MODULE_CAST.reset(token)


def _f8_to_copy(t, *, dtype=None, layout=None, device=None, pin_memory=None,
                non_blocking=False, memory_format=None):
    """A dtype conversion dequantizes to the nominal dtype first and then casts
    (TransformerEngine's rule), giving a plain tensor equal to ``dequantize().to(dtype)``. A
    module cast (``nn.Module._apply``) of a quantized parameter instead keeps the FP8 buffers
    and changes the nominal dtype, so ``model.half()`` keeps quantized weights (of te.ops
    modules, which mark their casts with :func:`module_cast`). Another device
    dequantizes."""
    same_device = device is None or torch.device(device) == t._data.device
    if same_device and (dtype is None or dtype == t.dtype or (
            dtype.is_floating_point and _MODULE_CAST.get())):
        return Float8Tensor(t._data.clone(), t._scale_inv.clone(), t._fp8_dtype,
                            t.dtype if dtype is None else dtype, t._quantizer)
    return t._dequantize_impl(t.dtype).to(dtype=dtype, device=device)


Float8Tensor._HANDLED = {
    aten._to_copy.default: _f8_to_copy,
    aten.detach.default: _f8_detach,
    aten.alias.default: _f8_detach,
    aten.clone.default: _f8_clone,
    aten.view.default: _f8_view,
    aten._unsafe_view.default: _f8_unsafe_view,
}


class RowColumnStorage(QuantizedTensorStorage):
    """A storage with a rowwise and/or a columnwise copy, each quantized from high precision
    (MXFP8, Float8BlockScaling, NVFP4): the checks on which copies exist, and dequantize() from
    whichever does. Errors name the public tensor (the class name without "Storage")."""

    def _label(self) -> str:
        return type(self).__name__.removesuffix("Storage")

    def _require(self, copy: str) -> None:
        """RuntimeError unless the ``copy`` ("rowwise" / "columnwise") was quantized."""
        if getattr(self, f"_{copy}_data") is None:
            raise RuntimeError(f"{self._label()}: {copy} data was not quantized; quantize with "
                               f"{copy} usage")

    def _check_usage(self, rowwise_usage, columnwise_usage) -> None:
        """update_usage's checks: a copy asked for must exist (none is rebuilt from the
        other)."""
        if rowwise_usage and self._rowwise_data is None:
            raise RuntimeError(f"{self._label()}: rowwise data cannot be rebuilt from "
                               "columnwise data")
        if columnwise_usage:
            self._require("columnwise")

    def _dequantize_impl(self, dtype):
        if self._rowwise_data is not None:
            return self.dequantize_rowwise(dtype)
        if self._columnwise_data is not None:
            return self.dequantize_columnwise(dtype)
        raise RuntimeError(f"{self._label()} has neither rowwise nor columnwise data")


class MXFP8TensorStorage(RowColumnStorage):
    """MXFP8 buffers: rowwise ``_rowwise_data`` (uint8, logical shape) with
    ``_rowwise_scale_inv`` (uint8 E8M0, last dim / 32), and/or the columnwise copy quantized
    separately from high precision: ``_columnwise_data`` is the 2-D transpose (features, rows)
    quantized in blocks of 32 along its last dim (i.e. down the original columns)."""

    def __init__(self, rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv,
                 fp8_dtype, dtype, shape, quantizer=None):
        self._rowwise_data = rowwise_data
        self._rowwise_scale_inv = rowwise_scale_inv
        self._columnwise_data = columnwise_data
        self._columnwise_scale_inv = columnwise_scale_inv
        self._fp8_dtype = fp8_dtype
        self._nominal_dtype = dtype
        self._logical_shape = torch.Size(shape)
        self._quantizer = quantizer

    @property
    def shape(self):
        return self._logical_shape

    def dequantize_rowwise(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        self._require("rowwise")
        return _mxfp8_dequantize(self._rowwise_data, self._rowwise_scale_inv, self._fp8_dtype,
                                 dtype)

    def dequantize_columnwise(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        self._require("columnwise")
        t = _mxfp8_dequantize(self._columnwise_data, self._columnwise_scale_inv,
                              self._fp8_dtype, dtype)
        return t.t().reshape(self._logical_shape)

    def buffers(self) -> tuple:
        return (self._rowwise_data, self._rowwise_scale_inv, self._columnwise_data,
                self._columnwise_scale_inv)

    def metadata(self) -> tuple:
        return (MXFP8TensorStorage, self._fp8_dtype, self._nominal_dtype,
                tuple(self._logical_shape))

    @staticmethod
    def _from_buffers(buffers, fp8_dtype, dtype, shape):
        return MXFP8TensorStorage(*buffers, fp8_dtype, dtype, shape)

    def to_tensor(self) -> "MXFP8Tensor":
        return MXFP8Tensor(self._rowwise_data, self._rowwise_scale_inv, self._columnwise_data,
                           self._columnwise_scale_inv, self._fp8_dtype, self._nominal_dtype,
                           self._logical_shape, self._quantizer)

    def update_usage(self, rowwise_usage=None, columnwise_usage=None) -> None:
        self._check_usage(rowwise_usage, columnwise_usage)
        if rowwise_usage is False:
            self._rowwise_data = self._rowwise_scale_inv = None
        if columnwise_usage is False:
            self._columnwise_data = self._columnwise_scale_inv = None


def requantize_row_column(t, values: torch.Tensor, op=None) -> None:
    """Re-quantize ``values`` into the buffers of ``t`` (a tensor with row-wise and column-wise
    copies: MXFP8Tensor, Float8BlockwiseQTensor, NVFP4Tensor; its ``_BUFFER_NAMES``), the
    copies it holds, with its quantizer."""
    name = type(t).__name__
    if t._quantizer is None:
        raise RuntimeError(
            f"{name}: {_op_name(op)} writes into a {name} of shape {tuple(t.shape)} that has "
            "no quantizer to re-quantize the result; build it with a quantizer or dequantize() "
            "it first")
    fresh = t._quantizer.quantize_storage(
        values.to(t.dtype), rowwise=t._rowwise_data is not None,
        columnwise=t._columnwise_data is not None, op=name)
    with torch.no_grad():
        for buf in t._BUFFER_NAMES:
            mine = getattr(t, buf)
            if mine is not None:
                mine.copy_(getattr(fresh, buf))


class RowColumnTensor:
    """What the quantized tensors with row-wise and column-wise copies (MXFP8Tensor,
    Float8BlockwiseQTensor, NVFP4Tensor) share: their buffers by name (``_BUFFER_NAMES``, in
    constructor order) and the constants that follow them in the constructor
    (``_CONSTANT_NAMES``, before the quantizer), from which a copy over other buffers, the
    compile flattening and the bare storage (``STORAGE_OF``) are built alike."""

    _BUFFER_NAMES = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data",
                     "_columnwise_scale_inv")
    _CONSTANT_NAMES: tuple = ()

    def _constants(self, dtype: Optional[torch.dtype] = None) -> tuple:
        """The constructor's constants (``dtype`` replacing the nominal dtype when given)."""
        return tuple((dtype or self.dtype) if n == "dtype" else
                     tuple(self.shape) if n == "shape" else getattr(self, n)
                     for n in self._CONSTANT_NAMES)

    def _requantize_from(self, values: torch.Tensor, op=None) -> None:
        requantize_row_column(self, values, op)

    def update_quantizer(self, quantizer) -> None:
        """Re-quantize later in-place updates with ``quantizer`` (an op binds its quantized
        weight to its own weight quantizer; ``bind_quantizer`` as a function)."""
        bind_quantizer(self, quantizer)

    def _with_buffers(self, fn, dtype: Optional[torch.dtype] = None):
        """A tensor of this class over ``fn`` of each buffer (None stays None)."""
        bufs = [getattr(self, n) for n in self._BUFFER_NAMES]
        bufs = [None if b is None else fn(b) for b in bufs]
        with _wrapper_mode(self):
            return type(self)(*bufs, *self._constants(dtype), self._quantizer)

    # torch.compile support: the subclass flattens to the buffers it holds.
    def __tensor_flatten__(self):
        names = [n for n in self._BUFFER_NAMES if getattr(self, n) is not None]
        return names, self._constants()

    @classmethod
    def __tensor_unflatten__(cls, inner, meta, outer_size, outer_stride):
        return cls(*[inner.get(n) for n in cls._BUFFER_NAMES], *meta)


def register_row_column_tensor(cls, storage_cls) -> None:
    """The handlers that keep a RowColumnTensor's buffers (``detach`` / ``alias`` over the same
    buffers, ``clone`` / ``_to_copy`` over copies) and its ``as_storage``, which reads
    attributes only (see as_storage)."""
    detach = lambda t: t._with_buffers(lambda b: b)  # noqa: E731
    cls._HANDLED = {aten.detach.default: detach, aten.alias.default: detach,
                    aten.clone.default: _rc_clone, aten._to_copy.default: _rc_to_copy}
    names = cls._BUFFER_NAMES + cls._CONSTANT_NAMES + ("_quantizer",)
    STORAGE_OF[cls] = lambda t: storage_cls(*[getattr(t, n) for n in names])


class MXFP8Tensor(RowColumnTensor, QuantizedTensorFace, MXFP8TensorStorage, QuantizedTensor):
    """MXFP8 tensor (E8M0 scale per 32 consecutive elements); ``dtype`` is the nominal dtype."""

    @staticmethod
    def __new__(cls, rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv,
                fp8_dtype, dtype, shape, quantizer=None, requires_grad=False):
        fp8_dtype = check_fp8_dtype(fp8_dtype)
        ref = rowwise_data if rowwise_data is not None else columnwise_data
        self = torch.Tensor._make_wrapper_subclass(
            cls, torch.Size(shape), dtype=dtype, device=ref.device, requires_grad=requires_grad)
        MXFP8TensorStorage.__init__(self, rowwise_data, rowwise_scale_inv, columnwise_data,
                                    columnwise_scale_inv, fp8_dtype, dtype, shape, quantizer)
        return self

    _CONSTANT_NAMES = ("_fp8_dtype", "dtype", "shape")


def bind_quantizer(t: "QuantizedTensor", quantizer) -> None:
    """``t.update_quantizer(quantizer)``: later in-place updates of ``t`` re-quantize with
    ``quantizer``, a quantizer of ``t``'s kind and FP8 dtype (ValueError otherwise); a
    delayed-scaling amax ``t``'s previous quantizer recorded is carried over. A function, not a
    method, as ``as_storage``: the fuser binds an op's weight while building a plan, which
    torch.compile may trace."""
    from .fp8_block import Float8BlockQuantizer, Float8BlockwiseQTensor  # noqa: PLC0415
    from .nvfp4 import NVFP4Quantizer, NVFP4Tensor  # noqa: PLC0415
    from .quantizer import (Float8CurrentScalingQuantizer, Float8Quantizer,  # noqa: PLC0415
                            MXFP8Quantizer)

    if isinstance(t, Float8Tensor):
        kinds, what = (Float8CurrentScalingQuantizer, Float8Quantizer), "a per-tensor FP8"
    elif isinstance(t, Float8BlockwiseQTensor):
        kinds, what = (Float8BlockQuantizer,), "a Float8BlockQuantizer"
    elif isinstance(t, NVFP4Tensor):
        kinds, what = (NVFP4Quantizer,), "an NVFP4"
    else:
        kinds, what = (MXFP8Quantizer,), "an MXFP8"
    fmt = t._fp4_dtype if isinstance(t, NVFP4Tensor) else t._fp8_dtype
    if not isinstance(quantizer, kinds) or quantizer.dtype != fmt:
        raise ValueError(f"{type(t).__name__}.update_quantizer: expected {what} "
                         f"quantizer of {fmt}, got {quantizer!r}")
    old = t._quantizer
    if old is quantizer:
        return
    old_amax, new_amax = getattr(old, "amax", None), getattr(quantizer, "amax", None)
    if old_amax is not None and new_amax is not None:
        with torch.no_grad():
            new_amax.copy_(torch.maximum(new_amax, old_amax.reshape(new_amax.shape)))
    t._quantizer = quantizer


def as_storage(t: QuantizedTensorStorage) -> QuantizedTensorStorage:
    """The bare storage over a quantized tensor's buffers (a storage is returned as it is).
    A function, not a method: under torch.compile a method call on the traced tensor subclass
    is dispatched as a torch function, while reading its attributes traces."""
    if isinstance(t, Float8Tensor):
        return Float8TensorStorage(t._data, t._scale_inv, t._fp8_dtype, t.dtype, t._quantizer)
    to_storage = STORAGE_OF.get(type(t))
    return t if to_storage is None else to_storage(t)


# as_storage of each RowColumnTensor class (register_row_column_tensor): the function building
# the bare storage over a tensor's buffers.
STORAGE_OF: dict = {}


def _rc_clone(t, *, memory_format=None):
    return t._with_buffers(torch.clone)


def _rc_to_copy(t, *, dtype=None, layout=None, device=None, pin_memory=None,
                non_blocking=False, memory_format=None):
    """As ``_f8_to_copy``: a module cast keeps a RowColumnTensor's buffers and changes the
    nominal dtype; any other conversion dequantizes first."""
    same_device = device is None or torch.device(device) == t.device
    if same_device and (dtype is None or dtype == t.dtype or (
            dtype.is_floating_point and _MODULE_CAST.get())):
        return t._with_buffers(torch.clone, dtype)
    return t._dequantize_impl(t.dtype).to(dtype=dtype, device=device)


register_row_column_tensor(MXFP8Tensor, MXFP8TensorStorage)
