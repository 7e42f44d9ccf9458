"""Quantization recipes, mirroring ``transformer_engine.common.recipe``.

Plain dataclasses validated in ``__post_init__`` (TransformerEngine uses pydantic dataclasses;
the fields, defaults, predicates and rejections are the same for the recipes defined here).
Bad values raise ValueError naming the recipe and the value. See docs/quantization.md.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from typing import Callable, Optional, Union

import torch

__all__ = ["Format", "QParams", "MMParams", "Recipe", "DelayedScaling", "Float8CurrentScaling",
           "MXFP8BlockScaling", "Float8BlockScaling", "NVFP4BlockScaling"]

_BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")


@dataclasses.dataclass(frozen=True)
class _FormatHelper:
    """A format's limits. Compared by value: an enum member pickles as its value and is looked
    up by it on load."""

    max_fwd: float
    max_bwd: float


class Format(enum.Enum):
    """FP8 format: E4M3 (max 448), E5M2 (max 57344), HYBRID (E4M3 forward, E5M2 backward)."""

    # the formats' limits as torch defines them (torch.finfo of the float8 dtypes)
    E4M3 = _FormatHelper(max_fwd=torch.finfo(torch.float8_e4m3fn).max,
                         max_bwd=torch.finfo(torch.float8_e4m3fn).max)
    E5M2 = _FormatHelper(max_fwd=torch.finfo(torch.float8_e5m2).max,
                         max_bwd=torch.finfo(torch.float8_e5m2).max)
    HYBRID = _FormatHelper(max_fwd=E4M3.max_fwd, max_bwd=E5M2.max_bwd)
    # FP4 (NVFP4BlockScaling's values): E2M1, max 6
    E2M1 = _FormatHelper(max_fwd=6.0, max_bwd=6.0)

    @property
    def max_fwd(self) -> float:
        return self.value.max_fwd

    @property
    def max_bwd(self) -> float:
        return self.value.max_bwd


@dataclasses.dataclass(frozen=True)
class QParams:
    """Quantization parameters of one tensor role (current scaling; NVFP4's transform,
    stochastic rounding and 2-D blocks)."""

    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False

    def __post_init__(self):
        for name in ("power_2_scale", "random_hadamard_transform", "stochastic_rounding",
                     "fp4_2d_quantization"):
            _check_bool("QParams", name, getattr(self, name))
        eps = self.amax_epsilon
        if (isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps)
                or eps < 0):
            raise ValueError(f"QParams: amax_epsilon must be a finite float >= 0, got {eps!r}")


def _check_bool(recipe: str, name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{recipe}: {name} must be a bool, got {value!r}")


def _check_bools(recipe) -> None:
    for f in dataclasses.fields(recipe):
        if f.type in ("bool", bool):
            _check_bool(type(recipe).__name__, f.name, getattr(recipe, f.name))


def _default_backward_override():
    value = os.environ.get("NVTE_BACKWARD_OVERRIDE")
    return value if value else None


class Recipe:
    """Base class of every recipe; the predicates say which kind a recipe is."""

    @classmethod
    def nvfp4(cls) -> bool:
        return issubclass(cls, NVFP4BlockScaling)

    @classmethod
    def mxfp8(cls) -> bool:
        return issubclass(cls, MXFP8BlockScaling)

    @classmethod
    def delayed(cls) -> bool:
        return issubclass(cls, DelayedScaling)

    @classmethod
    def float8_current_scaling(cls) -> bool:
        return issubclass(cls, Float8CurrentScaling)

    @classmethod
    def float8_per_tensor_scaling(cls) -> bool:
        return issubclass(cls, (DelayedScaling, Float8CurrentScaling))

    @classmethod
    def float8_block_scaling(cls) -> bool:
        return issubclass(cls, Float8BlockScaling)

    @classmethod
    def custom(cls) -> bool:
        return False

    def state_key(self) -> tuple:
        """What the ops' quantization state depends on: ``(class, ((field, value), ...))``
        over every field, a nested setting such as QParams as ``(class, ((field, value),
        ...))`` of its own. Hashable, and made of plain values: recipes with equal settings
        share the ops' state, and under torch.compile Dynamo guards the key by value (a new
        recipe object with the same settings reuses the compiled graph). ``from_state_key``
        rebuilds an equal recipe."""
        items = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if dataclasses.is_dataclass(v):
                v = (type(v), tuple((g.name, getattr(v, g.name)) for g in dataclasses.fields(v)))
            items.append((f.name, v))
        return (type(self), tuple(items))

    @staticmethod
    def from_state_key(key: tuple) -> "Recipe":
        """A recipe equal to the one whose :meth:`state_key` is ``key``."""
        cls, items = key
        kwargs = {name: (v[0](**dict(v[1])) if isinstance(v, tuple) else v) for name, v in items}
        return cls(**kwargs)


def _check_format(recipe: str, fmt) -> None:
    if not isinstance(fmt, Format):
        raise ValueError(f"{recipe}: fp8_format must be a recipe.Format, got {fmt!r}")
    if fmt == Format.E5M2:
        raise ValueError(f"{recipe}: pure E5M2 training is not supported (fp8_format={fmt})")


def _check_backward_override(recipe: str, value) -> None:
    if value not in _BACKWARD_OVERRIDES:
        raise ValueError(f"{recipe}: backward_override must be one of {_BACKWARD_OVERRIDES}, "
                         f"got {value!r}")


@dataclasses.dataclass
class DelayedScaling(Recipe):
    """Per-tensor scaling from an amax history (te_ops.md 4.4).

    scale = (fp8_max / amax) / 2**margin, with amax the max (or most recent) of the history;
    updated at autocast exit for forward quantizers and after the backward for backward ones.
    Not traceable by torch.compile.
    """

    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Union[str, Callable] = "max"
    scaling_factor_compute_algo: Optional[Callable] = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = dataclasses.field(default_factory=_default_backward_override)

    def __post_init__(self):
        _check_format("DelayedScaling", self.fp8_format)
        if not isinstance(self.margin, int) or isinstance(self.margin, bool) or self.margin < 0:
            raise ValueError(f"DelayedScaling: margin must be an int >= 0, got {self.margin!r}")
        if (not isinstance(self.amax_history_len, int) or isinstance(self.amax_history_len, bool)
                or self.amax_history_len < 1):
            raise ValueError("DelayedScaling: amax_history_len must be an int >= 1, got "
                             f"{self.amax_history_len!r}")
        if not (callable(self.amax_compute_algo)
                or self.amax_compute_algo in ("max", "most_recent")):
            raise ValueError("DelayedScaling: amax_compute_algo must be 'max', 'most_recent' or a "
                             f"callable, got {self.amax_compute_algo!r}")
        if not (self.scaling_factor_compute_algo is None
                or callable(self.scaling_factor_compute_algo)):
            raise ValueError("DelayedScaling: scaling_factor_compute_algo must be None or a "
                             f"callable, got {self.scaling_factor_compute_algo!r}")
        _check_bools(self)
        _check_backward_override("DelayedScaling", self.backward_override)
        if self.backward_override is not None:
            raise ValueError("DelayedScaling: backward_override is not supported with delayed "
                             f"scaling, got {self.backward_override!r}")


@dataclasses.dataclass
class Float8CurrentScaling(Recipe):
    """Per-tensor scaling from each tensor's own amax (te_ops.md 4.3). No margin."""

    use_power_2_scales: bool = dataclasses.field(
        default_factory=lambda: os.environ.get("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "0")
        == "1")
    fp8_format: Format = Format.HYBRID
    fp8_quant_fwd_inp: Optional[QParams] = None
    fp8_quant_fwd_weight: Optional[QParams] = None
    fp8_quant_bwd_grad: Optional[QParams] = None
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = dataclasses.field(default_factory=_default_backward_override)

    def __post_init__(self):
        _check_format("Float8CurrentScaling", self.fp8_format)
        if not isinstance(self.use_power_2_scales, bool):
            raise ValueError("Float8CurrentScaling: use_power_2_scales must be a bool, got "
                             f"{self.use_power_2_scales!r}")
        for name in ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad"):
            value = getattr(self, name)
            if value is None:
                setattr(self, name, QParams(power_2_scale=self.use_power_2_scales))
            elif not isinstance(value, QParams):
                raise ValueError(f"Float8CurrentScaling: {name} must be a QParams, got {value!r}")
        _check_bools(self)
        _check_backward_override("Float8CurrentScaling", self.backward_override)


@dataclasses.dataclass
class MXFP8BlockScaling(Recipe):
    """Blocks of 32 consecutive values with E8M0 (power-of-two) scales."""

    margin: int = 0
    fp8_format: Format = Format.E4M3
    enable_2d_quantization: bool = False
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = dataclasses.field(default_factory=_default_backward_override)

    def __post_init__(self):
        _check_format("MXFP8BlockScaling", self.fp8_format)
        if not isinstance(self.margin, int) or isinstance(self.margin, bool) or self.margin < 0:
            raise ValueError(f"MXFP8BlockScaling: margin must be an int >= 0, got {self.margin!r}")
        _check_bools(self)
        if self.enable_2d_quantization:
            raise ValueError("MXFP8BlockScaling: enable_2d_quantization=True is not supported on "
                             "this backend")
        _check_backward_override("MXFP8BlockScaling", self.backward_override)


def _env_flag(name: str) -> Callable[[], bool]:
    return lambda: os.environ.get(name, "0") == "1"


@dataclasses.dataclass
class NVFP4BlockScaling(Recipe):
    """NVFP4: FP4 E2M1 values, an E4M3 scale per 16 consecutive values and a per-tensor fp32
    scale (docs/quantization.md, NVFP4). As TransformerEngine's recipe: weights use 16x16 blocks,
    gradients stochastic rounding, and the columnwise copies of inputs and gradients (the
    wgrad operands) the 16-point random Hadamard transform, each unless disabled here or by
    its environment variable (NVTE_NVFP4_DISABLE_RHT, NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING,
    NVTE_NVFP4_DISABLE_2D_QUANTIZATION). The per-role QParams are derived in __post_init__.
    TransformerEngine's row-scaled activations and 4over6 options are not implemented here
    (only their defaults are accepted)."""

    disable_rht: bool = dataclasses.field(default_factory=_env_flag("NVTE_NVFP4_DISABLE_RHT"))
    disable_stochastic_rounding: bool = dataclasses.field(
        default_factory=_env_flag("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING"))
    disable_2d_quantization: bool = dataclasses.field(
        default_factory=_env_flag("NVTE_NVFP4_DISABLE_2D_QUANTIZATION"))
    row_scaled_activation: bool = dataclasses.field(
        default_factory=_env_flag("NVTE_NVFP4_ROW_SCALED_ACTIVATION"))
    nvfp4_4over6: str = dataclasses.field(
        default_factory=lambda: os.environ.get("NVTE_NVFP4_4OVER6", "none"))
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = dataclasses.field(default_factory=_default_backward_override)

    def __post_init__(self):
        if self.fp4_format != Format.E2M1:
            raise ValueError(f"NVFP4BlockScaling: only E2M1 is supported for fp4_format, got "
                             f"{self.fp4_format!r}")
        if self.fp8_format != Format.E4M3:
            raise ValueError(f"NVFP4BlockScaling: only E4M3 is supported for fp8_format (the "
                             f"block scales), got {self.fp8_format!r}")
        _check_bools(self)
        _check_backward_override("NVFP4BlockScaling", self.backward_override)
        if self.row_scaled_activation:
            raise ValueError("NVFP4BlockScaling: row_scaled_activation=True is not supported on "
                             "this backend")
        if self.nvfp4_4over6 != "none":
            raise ValueError(f"NVFP4BlockScaling: nvfp4_4over6 must be 'none' on this backend, "
                             f"got {self.nvfp4_4over6!r}")
        # the transform applies to the columnwise copies only (the wgrad operands)
        self.fp4_quant_fwd_inp = QParams(random_hadamard_transform=not self.disable_rht)
        self.fp4_quant_fwd_weight = QParams(fp4_2d_quantization=not self.disable_2d_quantization)
        self.fp4_quant_bwd_grad = QParams(
            random_hadamard_transform=not self.disable_rht,
            stochastic_rounding=not self.disable_stochastic_rounding)


# ---- Float8BlockScaling ----

@dataclasses.dataclass(frozen=True)
class MMParams:
    """GEMM options of a recipe (TransformerEngine's MMParams). ``use_split_accumulator``
    selects cuBLAS' FP8 split accumulation there; here every GEMM of a quantized operand runs on
    its fp32 dequantization with fp32 accumulation, so it is recorded, not acted on."""

    use_split_accumulator: bool = True

    def __post_init__(self):
        _check_bool("MMParams", "use_split_accumulator", self.use_split_accumulator)


def _default_block_scaling_f32_scales() -> bool:
    return os.environ.get("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "0") == "1"


@dataclasses.dataclass
class Float8BlockScaling(Recipe):
    """FP8 with one fp32 scale per block: 1x128 blocks (128 consecutive elements of a row) for
    activations and gradients, 128x128 tiles for weights by default (``x_block_scaling_dim``,
    ``w_block_scaling_dim``, ``grad_block_scaling_dim``: 1 or 2, never two 2-D operands in one
    GEMM). Scales are powers of two unless ``use_f32_scales`` (env
    ``NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1``); each role's ``QParams`` (None: ``QParams(
    power_2_scale=not use_f32_scales)``) gives its ``power_2_scale`` and ``amax_epsilon``. The
    columnwise copy is quantized separately from high precision (blocks down the columns)."""

    use_f32_scales: bool = dataclasses.field(default_factory=_default_block_scaling_f32_scales)
    fp8_format: Format = Format.E4M3
    fp8_quant_fwd_inp: Optional[QParams] = None
    fp8_quant_fwd_weight: Optional[QParams] = None
    fp8_quant_bwd_grad: Optional[QParams] = None
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: MMParams = dataclasses.field(default_factory=MMParams)
    fp8_gemm_dgrad: MMParams = dataclasses.field(default_factory=MMParams)
    fp8_gemm_wgrad: MMParams = dataclasses.field(default_factory=MMParams)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = dataclasses.field(default_factory=_default_backward_override)

    def __post_init__(self):
        name = "Float8BlockScaling"
        _check_format(name, self.fp8_format)
        _check_bools(self)
        for field in ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad"):
            value = getattr(self, field)
            if value is None:
                setattr(self, field, QParams(power_2_scale=not self.use_f32_scales))
            elif not isinstance(value, QParams):
                raise ValueError(f"{name}: {field} must be a QParams, got {value!r}")
        dims = {}
        for field in ("x_block_scaling_dim", "w_block_scaling_dim", "grad_block_scaling_dim"):
            value = getattr(self, field)
            if isinstance(value, bool) or value not in (1, 2):
                raise ValueError(f"{name}: {field} must be 1 (1x128 blocks) or 2 (128x128 "
                                 f"blocks), got {value!r}")
            dims[field] = value
        for a, b in (("x", "w"), ("x", "grad"), ("w", "grad")):
            if dims[f"{a}_block_scaling_dim"] == 2 and dims[f"{b}_block_scaling_dim"] == 2:
                raise ValueError(f"{name}: {a}_block_scaling_dim and {b}_block_scaling_dim "
                                 "cannot both be 2 (a GEMM of two 128x128-scaled operands is "
                                 "not supported)")
        for field in ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad"):
            value = getattr(self, field)
            if not isinstance(value, MMParams):
                raise ValueError(f"{name}: {field} must be an MMParams, got {value!r}")
            if not value.use_split_accumulator:
                raise ValueError(f"{name}: {field}.use_split_accumulator must be True (FP8 "
                                 "block scaling requires split accumulation)")
        if self.fp8_dpa or self.fp8_mha:
            raise ValueError(f"{name}: FP8 attention is not supported (fp8_dpa="
                             f"{self.fp8_dpa}, fp8_mha={self.fp8_mha})")
        _check_backward_override(name, self.backward_override)
