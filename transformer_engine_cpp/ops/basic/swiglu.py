"""The SwiGLU family: SwiGLU, ClampedSwiGLU, SiTUGLU and their scaled forms."""

from __future__ import annotations

import math
from typing import Optional

from .activation import _GatedActivation, _ScaledGatedActivation


class SwiGLU(_GatedActivation):
    """silu(a) * b, with optional ``glu_interleave_size``."""

    op_stem = "swiglu"


class ClampedSwiGLU(_GatedActivation):
    """GPT-OSS SwiGLU: a' = min(a, limit), b' = clamp(b, -limit, limit),
    y = a' * sigmoid(alpha a') * (b' + glu_linear_offset)."""

    op_stem = "clamped_swiglu"

    def __init__(
        self,
        *,
        limit: float = 7.0,
        alpha: float = 1.702,
        glu_linear_offset: float = 1.0,
        cache_quantized_input: bool = False,
        glu_interleave_size: Optional[int] = None,
    ) -> None:
        for name, value in (("limit", limit), ("alpha", alpha),
                            ("glu_linear_offset", glu_linear_offset)):
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value)):
                raise ValueError(f"ClampedSwiGLU: {name} must be a finite number, got {value!r}")
        if limit <= 0:
            raise ValueError(f"ClampedSwiGLU: limit must be > 0, got {limit!r}")
        super().__init__(cache_quantized_input=cache_quantized_input,
                         glu_interleave_size=glu_interleave_size)
        self.limit = float(limit)
        self.alpha = float(alpha)
        self.glu_linear_offset = float(glu_linear_offset)

    def _op_args(self) -> tuple:
        return (self.limit, self.alpha, self.glu_linear_offset, self._interleave)


class SiTUGLU(_GatedActivation):
    """beta1 tanh(a / beta1) sigmoid(a) * beta2 tanh(b / beta2)."""

    op_stem = "situglu"

    def __init__(
        self,
        *,
        beta1: float = 4.0,
        beta2: float = 25.0,
        cache_quantized_input: bool = False,
        glu_interleave_size: Optional[int] = None,
    ) -> None:
        for name, value in (("beta1", beta1), ("beta2", beta2)):
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value <= 0):
                raise ValueError(f"SiTUGLU: {name} must be finite and > 0, got {value!r}")
        super().__init__(cache_quantized_input=cache_quantized_input,
                         glu_interleave_size=glu_interleave_size)
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)

    def _op_args(self) -> tuple:
        return (self.beta1, self.beta2, self._interleave)


class ScaledSwiGLU(_ScaledGatedActivation):
    """``scales[..., None] * silu(a) * b``."""

    op_stem = "scaled_swiglu"


class ScaledClampedQGeGLU(_ScaledGatedActivation):
    """Clamped quick-GEGLU with per-row scales, with :class:`ClampedSwiGLU`'s numerics (as in
    TransformerEngine): ``a' = min(a, limit)``, ``b' = clamp(b, -limit, limit)``,
    ``y = scales[..., None] * a' * sigmoid(alpha a') * (b' + glu_linear_offset)``."""

    op_stem = "scaled_clamped_qgeglu"

    def __init__(
        self,
        glu_interleave_size: Optional[int] = None,
        *,
        activation_recompute_in_mlp: bool = False,
        limit: float = 7.0,
        alpha: float = 1.702,
        glu_linear_offset: float = 1.0,
    ) -> None:
        for name, value in (("limit", limit), ("alpha", alpha),
                            ("glu_linear_offset", glu_linear_offset)):
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value)):
                raise ValueError(f"ScaledClampedQGeGLU: {name} must be a finite number, got "
                                 f"{value!r}")
        if limit <= 0:
            raise ValueError(f"ScaledClampedQGeGLU: limit must be > 0, got {limit!r}")
        super().__init__(glu_interleave_size,
                         activation_recompute_in_mlp=activation_recompute_in_mlp)
        self.limit = float(limit)
        self.alpha = float(alpha)
        self.glu_linear_offset = float(glu_linear_offset)

    def _op_args(self) -> tuple:
        return (self.limit, self.alpha, self.glu_linear_offset, self._interleave)


class ScaledSiTUGLU(_ScaledGatedActivation):
    """``scales[..., None] * beta1 tanh(a / beta1) sigmoid(a) * beta2 tanh(b / beta2)``."""

    op_stem = "scaled_situglu"

    def __init__(
        self,
        glu_interleave_size: Optional[int] = None,
        *,
        activation_recompute_in_mlp: bool = False,
        beta1: float = 4.0,
        beta2: float = 25.0,
    ) -> None:
        for name, value in (("beta1", beta1), ("beta2", beta2)):
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value <= 0):
                raise ValueError(f"ScaledSiTUGLU: {name} must be finite and > 0, got {value!r}")
        super().__init__(glu_interleave_size,
                         activation_recompute_in_mlp=activation_recompute_in_mlp)
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)

    def _op_args(self) -> tuple:
        return (self.beta1, self.beta2, self._interleave)
