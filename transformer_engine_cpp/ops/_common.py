"""Helpers shared by the op implementations."""

from __future__ import annotations

import math
import numbers
from typing import Iterable, Optional

import torch

SUPPORTED_FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def canonicalize_device(device: Optional[torch.device | str]) -> torch.device:
    """``None`` means torch's default device (CPU unless changed): unlike TransformerEngine, which
    defaults to CUDA, CPU is a first-class device here."""
    if device is None:
        return torch.get_default_device()
    return torch.device(device)


def canonicalize_dtype(dtype: Optional[torch.dtype]) -> torch.dtype:
    if dtype is None:
        return torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    return dtype


def check_float_dtype(op_name: str, dtype: torch.dtype) -> None:
    if dtype not in SUPPORTED_FLOAT_DTYPES:
        raise ValueError(
            f"{op_name}: unsupported dtype {dtype} (expected float32, float64, bfloat16 or float16)"
        )


# Sizes reach the custom ops as int64 (schema `int`, tensor sizes): larger values would wrap.
INT64_MAX = 2**63 - 1


def check_size(op: str, name: str, value, *, optional: bool = False, maximum: int = INT64_MAX,
               limit_reason: str = "it must fit in int64") -> Optional[int]:
    """A positive int size argument of a constructor (``None`` too when ``optional``), at most
    ``maximum``: the value as an int, or a ValueError naming the op, the argument and the value
    (bools and non-integers included, as the constructors have always reported them)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        kind = "a positive int or None" if optional else "a positive int"
        raise ValueError(f"{op}: {name} must be {kind}, got {value!r}")
    if value > maximum:
        raise ValueError(f"{op}: {name} must be at most {maximum} ({limit_reason}), got {value!r}")
    return int(value)


def check_numel(op: str, name: str, shape: Iterable[int], dtype: Optional[torch.dtype]) -> None:
    """A tensor ``name`` of ``shape`` (positive ints) and ``dtype`` (None: torch's default)
    must be addressable: its byte size must fit in int64, as torch requires of a storage.
    Otherwise a ValueError naming the op, the tensor, its shape and dtype."""
    shape = tuple(int(d) for d in shape)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if math.prod(shape) * dtype.itemsize > INT64_MAX:
        raise ValueError(f"{op}: {name} of shape {shape} ({dtype}) would need "
                         f"{math.prod(shape)} elements, more than an int64-indexed tensor holds")


def check_shape(op: str, name: str, shape, *, allow_infer: bool = False) -> tuple[int, ...]:
    """A shape argument: a sequence of ints (an int alone is a 1-D shape), each at least 1, or
    -1 once when ``allow_infer``, with a product that fits in int64. TypeError for a non-int
    entry or a non-sequence, ValueError for a bad value; both name the op and the value."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"{op}: {name} must be a sequence of ints, got {shape!r}") from None
    if not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"{op}: {name} must be a sequence of ints, got {dims!r}")
    dims = tuple(int(d) for d in dims)
    lowest = -1 if allow_infer else 0
    if any(d < lowest for d in dims) or (allow_infer and dims.count(-1) > 1):
        raise ValueError(f"{op}: invalid {name} {dims!r} "
                         f"({'at most one -1, no other negatives' if allow_infer else 'negative'})")
    known = math.prod(d for d in dims if d != -1)
    if known > INT64_MAX or any(d > INT64_MAX for d in dims):
        raise ValueError(f"{op}: {name} {dims!r} has more than {INT64_MAX} (int64) elements")
    return dims


def is_compiling() -> bool:
    return torch.compiler.is_compiling()


def init_parameter(op: torch.nn.Module, name: str, fill, device: torch.device) -> None:
    """(Re)initialise ``op.<name>`` with ``fill(tensor)``: in place where it lives (also after
    a ``.to()``), or, for a parameter still on the meta device (deferred init), as a new
    Parameter on ``device`` that keeps the old one's dtype and requires_grad."""
    param = getattr(op, name)
    if param.device.type == "meta":
        data = torch.empty(param.shape, dtype=param.dtype, device=device)
        with torch.no_grad():
            fill(data)
        setattr(op, name, torch.nn.Parameter(data, requires_grad=param.requires_grad))
    else:
        with torch.no_grad():
            fill(param)


def materialize_device(op_device: torch.device) -> torch.device:
    """Where a parameter built on ``op_device`` lives once materialised."""
    return op_device if op_device.type != "meta" else torch.get_default_device()


def compute_dtype(device_type: str, default: Optional[torch.dtype]) -> Optional[torch.dtype]:
    """The autocast dtype when autocast is on for this device type, else ``default``."""
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return default


def autocast_dtype(t: torch.Tensor, default: Optional[torch.dtype]) -> Optional[torch.dtype]:
    """``compute_dtype(t.device.type, default)``, cheaper for CPU tensors (per-call path: CPU
    autocast is always available, and ``t.is_cpu`` skips building a device object)."""
    if t.is_cpu:
        return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else default
    return compute_dtype(t.device.type, default)


def storage_address(t) -> Optional[int]:
    """The address of a plain tensor's storage, or None (not a tensor, or a wrapper subclass
    without storage of its own)."""
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def shares_storage(a, b) -> bool:
    """Whether two tensors with elements live in the same storage (an in-place write into one
    may change the other)."""
    if (not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.numel() == 0
            or b.numel() == 0):
        return False
    ptr = storage_address(a)
    return ptr is not None and ptr == storage_address(b)


def _check_in_place(op: str, in_place) -> bool:
    if not isinstance(in_place, bool):
        raise TypeError(f"{op}: in_place must be a bool, got {type(in_place).__name__}")
    return in_place


def accumulate_main_grad(weight: torch.nn.Parameter, dw: torch.Tensor, who: str, name: str):
    """``accumulate_into_main_grad``: dW added into ``weight.main_grad`` (which the caller
    allocates; copied instead when ``weight.overwrite_main_grad``). Returns the gradient autograd
    gets: TransformerEngine's (Megatron's) convention, a dummy zero grad for a parameter that
    tracks ``grad_added_to_main_grad`` (the flag set), else None."""
    main_grad = getattr(weight, "main_grad", None)
    if main_grad is None:
        raise RuntimeError(f"{who}: accumulate_into_main_grad=True needs {name}.main_grad "
                           "(allocate it before the backward pass)")
    if getattr(weight, "overwrite_main_grad", False):
        main_grad.copy_(dw)
    else:
        main_grad.add_(dw.to(main_grad.dtype))
    if hasattr(weight, "grad_added_to_main_grad"):
        weight.grad_added_to_main_grad = True
        return torch.zeros_like(weight)
    return None
