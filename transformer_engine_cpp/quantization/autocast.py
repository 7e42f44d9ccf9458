"""``te.autocast`` / ``te.fp8_autocast`` and ``te.quantized_model_init``: the global FP8 state.

State lives in ``FP8GlobalStateManager`` (class attributes, process-wide, like TransformerEngine's);
``autocast`` saves it on entry and restores it on exit, so nesting works and an inner
``autocast(enabled=False)`` turns quantization off for its body only. Under ``enabled=True`` with
``recipe=None`` the recipe is ``get_default_fp8_recipe()``: ``Float8CurrentScaling()`` on CPU.

Delayed scaling: forward-mode ``DelayedScalingRecipeState``s registered with
``FP8GlobalStateManager.add_delayed_scaling_state`` during an autocast are updated
(``update_delayed_scaling``) when the outermost enabled autocast exits.
"""

from __future__ import annotations

import contextlib
from typing import Optional

from .. import recipe as _recipe
from .recipe_state import DelayedScalingRecipeState, update_delayed_scaling

__all__ = ["FP8GlobalStateManager", "autocast", "fp8_autocast", "quantized_model_init",
           "fp8_model_init", "get_default_fp8_recipe"]


def get_default_fp8_recipe() -> _recipe.Recipe:
    """The recipe of ``autocast(recipe=None)``: current scaling (TransformerEngine's default
    chooses from MXFP8 and delayed scaling by GPU features; on CPU it is
    Float8CurrentScaling)."""
    return _recipe.Float8CurrentScaling()


class FP8GlobalStateManager:
    """Process-wide FP8 state read by the fuser and the ops (docs/quantization.md)."""

    FP8_ENABLED = False
    FP8_CALIBRATION = False
    FP8_RECIPE: Optional[_recipe.Recipe] = None
    FP8_DISTRIBUTED_GROUP = None
    FP8_AUTOCAST_DEPTH = 0
    FP8_PARAMETERS = False
    FP8_MODEL_INIT_RECIPE: Optional[_recipe.Recipe] = None
    _delayed_states: list = []

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        return cls.FP8_ENABLED

    @classmethod
    def is_fp8_calibration(cls) -> bool:
        return cls.FP8_CALIBRATION

    @classmethod
    def get_fp8_recipe(cls) -> _recipe.Recipe:
        """The active recipe, or the default recipe when none is set."""
        return cls.FP8_RECIPE if cls.FP8_RECIPE is not None else get_default_fp8_recipe()

    @classmethod
    def get_fp8_group(cls):
        return cls.FP8_DISTRIBUTED_GROUP

    @classmethod
    def get_autocast_depth(cls) -> int:
        return cls.FP8_AUTOCAST_DEPTH

    @classmethod
    def with_fp8_parameters(cls) -> bool:
        return cls.FP8_PARAMETERS

    @classmethod
    def get_fp8_model_init_recipe(cls) -> Optional[_recipe.Recipe]:
        return cls.FP8_MODEL_INIT_RECIPE

    @classmethod
    def add_delayed_scaling_state(cls, state: DelayedScalingRecipeState) -> None:
        """Have ``state`` updated when the outermost enabled autocast exits."""
        if not isinstance(state, DelayedScalingRecipeState):
            raise TypeError("add_delayed_scaling_state: expected a DelayedScalingRecipeState")
        if all(s is not state for s in cls._delayed_states):
            cls._delayed_states.append(state)

    @classmethod
    def _get_state(cls) -> tuple:
        return (cls.FP8_ENABLED, cls.FP8_CALIBRATION, cls.FP8_RECIPE, cls.FP8_DISTRIBUTED_GROUP,
                cls.FP8_AUTOCAST_DEPTH)

    @classmethod
    def _set_state(cls, state: tuple) -> None:
        (cls.FP8_ENABLED, cls.FP8_CALIBRATION, cls.FP8_RECIPE, cls.FP8_DISTRIBUTED_GROUP,
         cls.FP8_AUTOCAST_DEPTH) = state

    @classmethod
    def _update_delayed_states(cls) -> None:
        # forward states only: the ops update their backward states after their backward pass
        states, cls._delayed_states = cls._delayed_states, []
        for s in states:
            update_delayed_scaling(s)


def _check_recipe(where: str, recipe) -> None:
    if recipe is not None and not isinstance(recipe, _recipe.Recipe):
        raise ValueError(f"{where}: recipe must be a transformer_engine_cpp.recipe.Recipe or "
                         f"None, got {recipe!r}")


@contextlib.contextmanager
def autocast(enabled: bool = True, calibrating: bool = False,
             recipe: Optional[_recipe.Recipe] = None, amax_reduction_group=None):
    """Quantize the ops run in its body with ``recipe`` (default: ``get_default_fp8_recipe()``).

    ``calibrating`` records amaxes without quantized compute (delayed scaling);
    ``amax_reduction_group`` is the process group amaxes are reduced over."""
    _check_recipe("autocast", recipe)
    saved = FP8GlobalStateManager._get_state()
    M = FP8GlobalStateManager
    M.FP8_ENABLED = bool(enabled)
    M.FP8_CALIBRATION = bool(calibrating)
    M.FP8_RECIPE = (recipe if recipe is not None else get_default_fp8_recipe()) if (
        enabled or calibrating) else None
    M.FP8_DISTRIBUTED_GROUP = amax_reduction_group
    M.FP8_AUTOCAST_DEPTH = saved[4] + 1
    try:
        yield
    finally:
        outermost = saved[4] == 0
        FP8GlobalStateManager._set_state(saved)
        if outermost:
            FP8GlobalStateManager._update_delayed_states()


@contextlib.contextmanager
def fp8_autocast(enabled: bool = True, calibrating: bool = False,
                 fp8_recipe: Optional[_recipe.Recipe] = None, fp8_group=None, **kwargs):
    """Deprecated alias of ``autocast`` (TransformerEngine's argument names are accepted too)."""
    recipe = kwargs.pop("recipe", fp8_recipe)
    group = kwargs.pop("amax_reduction_group", fp8_group)
    if kwargs:
        raise TypeError(f"fp8_autocast: unexpected arguments {sorted(kwargs)}")
    with autocast(enabled=enabled, calibrating=calibrating, recipe=recipe,
                  amax_reduction_group=group):
        yield


@contextlib.contextmanager
def quantized_model_init(enabled: bool = True, recipe: Optional[_recipe.Recipe] = None,
                         preserve_high_precision_init_val: bool = False):
    """Create parameters in its body as quantized tensors (``BasicLinear`` reads the flag at
    construction)."""
    _check_recipe("quantized_model_init", recipe)
    M = FP8GlobalStateManager
    saved = (M.FP8_PARAMETERS, M.FP8_MODEL_INIT_RECIPE,
             getattr(M, "HIGH_PRECISION_INIT_VAL", False))
    M.FP8_PARAMETERS = bool(enabled)
    M.FP8_MODEL_INIT_RECIPE = (recipe if recipe is not None else get_default_fp8_recipe()) \
        if enabled else None
    M.HIGH_PRECISION_INIT_VAL = bool(preserve_high_precision_init_val)
    try:
        yield
    finally:
        M.FP8_PARAMETERS, M.FP8_MODEL_INIT_RECIPE, M.HIGH_PRECISION_INIT_VAL = saved


@contextlib.contextmanager
def fp8_model_init(enabled: bool = True, recipe: Optional[_recipe.Recipe] = None, **kwargs):
    """Deprecated alias of ``quantized_model_init``."""
    with quantized_model_init(enabled=enabled, recipe=recipe, **kwargs):
        yield
