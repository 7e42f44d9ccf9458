"""The operation fuser and its fusion registry (TransformerEngine's ``ops/fuser.py``).

:class:`OperationFuser` runs a list of fusible ops as one pipeline. It flattens them to basic
ops, picks the :class:`~._plan.Plan` for the call's configuration (built on first use by the
registered fusion functions, then cached) and runs it through the pipeline Function
(``_pipeline.py``). The plan depends only on configuration, never on tensor values.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..quantization.autocast import FP8GlobalStateManager
from ..recipe import Recipe
from . import _pipeline, _torch_shim
from ._plan import FusionFunction, Plan, Routing, build_plan, compute_dtypes, plan_key
from .op import (DELAYED_SCALING_UNDER_COMPILE, BasicOperation, FusibleOperation,
                 compile_unsupported_error, mark_constant_result)

__all__ = [
    "OperationFuser",
    "register_forward_fusion",
    "register_backward_fusion",
    "register_forward_backward_fusion",
]


class OperationFuser:
    """Runs a list of fusible ops as one pipeline, fusing consecutive basic ops.

    Args:
        ops: the operations, basic or fused, in forward order.
    """

    # The registered fusion functions, process-wide: func(ops, *, recipe) -> ops.
    forward_backward_fusion_functions: list[FusionFunction] = []
    forward_fusion_functions: list[FusionFunction] = []
    backward_fusion_functions: list[FusionFunction] = []
    # Our extensions (ops/fused/__init__.py), applied after every registered function, so that
    # registered ones see the ops TransformerEngine would show them.
    extension_forward_backward_fusion_functions: tuple = ()
    extension_forward_fusion_functions: tuple = ()
    extension_backward_fusion_functions: tuple = ()
    # Bumped by every registration: part of the plan key, so existing fusers re-plan.
    _fusion_registry_version: int = 0

    def __init__(self, ops: list[FusibleOperation]) -> None:
        basic_ops: list[BasicOperation] = []
        for op in ops:
            basic_ops.extend(op.basic_ops if op.is_fused_op else [op])
        self._basic_ops = tuple(basic_ops)
        self._num_basic_ops = len(basic_ops)
        self._routing = Routing(basic_ops)
        self.num_extra_inputs = len(self._routing.public_extra_inputs)
        for op in basic_ops:
            op.lock_extra_tensor_channels()
        # the ops' parameter dicts, read on every call (an op may replace its parameters)
        self._param_dicts = tuple(op._parameters for op in basic_ops)
        # the ops with a pre-forward hook, and whether any hook does more than materialise
        # meta parameters (if not, the hooks run only while a parameter is on meta)
        self._pre_forward_ops = tuple(
            (i, op) for i, op in enumerate(basic_ops)
            if type(op).pre_fuser_forward is not FusibleOperation.pre_fuser_forward)
        # (a bool: a traced call then guards it alone, not the tuple's items)
        self._has_pre_forward_ops = bool(self._pre_forward_ops)
        self._other_pre_forward_hooks = any(
            type(op).pre_fuser_forward is not BasicOperation.materialize_meta_parameters
            for _, op in self._pre_forward_ops)
        self._first_fuse_done = False
        self._plans: dict[tuple, Plan] = {}
        # What compiled calls read (see _compiled_configuration): plans and per-op recipe
        # states by their id, and the states by recipe state key (None: no recipe).
        self._compiled: dict[int, Any] = {}
        self._compiled_states: dict[Any, tuple] = {}
        self._last_key: Optional[tuple] = None
        self._last_recipe = None
        self._last_plan: Optional[Plan] = None
        self._last_first = self._last_dtypes = self._last_version = None
        # The argument layout of the last eager call without extra inputs, reused while the
        # parameters are the same objects.
        self._layout_key: Optional[tuple] = None
        self._layout_param_ids: frozenset = frozenset()
        self._layout_all_live = False
        self._layout = None
        # TransformerEngine's fuser attributes, for the plan last used (its tests read them).
        self._forward_ops: tuple = ()
        self._backward_ops: tuple = ()
        self.recipe_type = None
        self.first_op_requiring_backward = 0
        # Build the unquantized plans now, so a first call under torch.compile finds its plan
        # instead of changing the cache during the trace (which would recompile next call).
        dtypes = self._dtypes_now()
        for first in range(self._num_basic_ops + 1):
            key = plan_key(None, first, dtypes, OperationFuser._fusion_registry_version)
            self._plans[key] = self._build_plan(None, first)

    def _dtypes_now(self) -> tuple:
        params = [p for d in self._param_dicts for p in d.values()]
        return compute_dtypes(params[0] if params else torch.empty(0), params)

    # ---- planning ---------------------------------------------------------------------------

    def _raise_extra_input_type(self, extra_inputs):
        """TypeError naming the op whose extra input is not a tensor (TransformerEngine's ops
        take every extra input as a tensor, GroupedLinear's split sizes included); under
        torch.compile the same message as a CompileUnsupportedError, raised at trace time so
        that it reaches the caller first-line."""
        for (op_idx, slot), t in zip(self._routing.public_extra_inputs, extra_inputs):
            if not isinstance(t, torch.Tensor):
                msg = (f"{type(self._basic_ops[op_idx]).__name__}: extra input {slot} must be "
                       f"a torch.Tensor, got {type(t).__name__}")
                if torch.compiler.is_compiling():
                    _raise_at_trace_time(msg)
                raise TypeError(msg)

    def _first_op_requiring_backward(self, input_requires_grad: bool, extra_inputs) -> int:
        """The first basic op the backward reaches: the first whose input, parameters or
        public extra inputs need a gradient."""
        if input_requires_grad:
            return 0
        first = self._num_basic_ops
        for (i, _), t in zip(self._routing.public_extra_inputs, extra_inputs):
            if t.requires_grad:
                first = i
                break
        for i, params in enumerate(self._param_dicts[:first]):
            for p in params.values():
                if p is not None and p.requires_grad:
                    return i
        return first

    def _build_plan(self, recipe, first: int) -> Plan:
        for op in self._basic_ops:
            op.reset_recipe_state(recipe=recipe)
        if not self._first_fuse_done:
            for op in self._basic_ops:
                op.pre_first_fuser_forward()
            self._first_fuse_done = True
        cls = OperationFuser
        fusions = ((*cls.forward_backward_fusion_functions,
                    *cls.extension_forward_backward_fusion_functions),
                   (*cls.forward_fusion_functions, *cls.extension_forward_fusion_functions),
                   (*cls.backward_fusion_functions, *cls.extension_backward_fusion_functions))
        return build_plan(self._basic_ops, self._routing, recipe, first, fusions)

    def _plan(self, recipe, first: int, dtypes: tuple) -> Plan:
        """The plan for this configuration, built on a cache miss; the ops' recipe state is
        brought in line with ``recipe``."""
        key = plan_key(recipe, first, dtypes, OperationFuser._fusion_registry_version)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._build_plan(recipe, first)
        elif recipe is not self._last_recipe:
            # another recipe object (maybe other settings) or none after one: the ops rebuild
            # or drop their quantizers
            for op in self._basic_ops:
                op.reset_recipe_state(recipe=recipe)
        self._last_recipe = recipe
        if key != self._last_key:
            self._last_key = key
            self._forward_ops, self._backward_ops = plan.forward_ops, plan.backward_ops
            self.recipe_type = plan.recipe_type
            self.first_op_requiring_backward = first
        # what __call__ compares to reuse the plan without building its key
        self._last_plan, self._last_first, self._last_dtypes = plan, first, dtypes
        self._last_version = key[-1]
        return plan

    def fusion_plan(self, input_: torch.Tensor, *extra_inputs: torch.Tensor,
                    requires_grad: Optional[bool] = None) -> Plan:
        """The plan a call ``fuser(input_, *extra_inputs)`` would run now: under the current
        grad mode and ``te.autocast`` recipe, with ``input_``'s dtype and autocast state.
        ``requires_grad`` overrides ``input_.requires_grad``."""
        if len(extra_inputs) != self.num_extra_inputs:
            raise ValueError(f"OperationFuser expected {self.num_extra_inputs} extra inputs, "
                             f"got {len(extra_inputs)}")
        recipe = (FP8GlobalStateManager.get_fp8_recipe() if FP8GlobalStateManager.FP8_ENABLED
                  else None)
        if requires_grad is None:
            requires_grad = input_.requires_grad
        params = [p for d in self._param_dicts for p in d.values()]
        first = (self._first_op_requiring_backward(requires_grad, extra_inputs)
                 if torch.is_grad_enabled() else self._num_basic_ops)
        return self._plan(recipe, first, compute_dtypes(input_, params))

    # ---- running ----------------------------------------------------------------------------

    def __call__(
        self,
        input: torch.Tensor,  # pylint: disable=redefined-builtin
        *extra_inputs: torch.Tensor,
        basic_op_kwargs: Optional[list[dict[str, Any]]] = None,
    ):
        n = self._num_basic_ops
        if len(extra_inputs) != self.num_extra_inputs:
            raise ValueError(f"OperationFuser expected {self.num_extra_inputs} extra inputs, "
                             f"got {len(extra_inputs)}")
        for t in extra_inputs:
            if not isinstance(t, torch.Tensor):
                self._raise_extra_input_type(extra_inputs)
        if basic_op_kwargs is not None:
            basic_op_kwargs = self._check_kwargs(basic_op_kwargs)
        compiling = torch.compiler.is_compiling()
        recipe = (FP8GlobalStateManager.get_fp8_recipe() if FP8GlobalStateManager.FP8_ENABLED
                  else None)
        # (eager only, and the last call's recipe object, or none again, cannot differ from it;
        # compiling first: reading _last_recipe under compile would be guarded)
        if not compiling and recipe is not self._last_recipe and _torch_shim.in_backward():
            self._refuse_recompute_under_another_recipe(recipe)

        if not torch.is_grad_enabled():
            first = n
        elif input.requires_grad:
            first = 0
        else:
            first = self._first_op_requiring_backward(False, extra_inputs)
        params = [p for d in self._param_dicts for p in d.values()]
        if self._has_pre_forward_ops:
            run_hooks = self._other_pre_forward_hooks
            if compiling:  # raises for meta parameters, outside the traced code
                _refuse_meta_parameters(self)
            elif not run_hooks:
                for p in params:
                    if p is not None and p.is_meta:
                        run_hooks = True
                        break
            if run_hooks:
                for i, op in self._pre_forward_ops:  # they may replace parameters
                    op.pre_fuser_forward(requires_grad=i >= first)
                params = [p for d in self._param_dicts for p in d.values()]
        if input.is_cpu:  # compute_dtypes, inline for the common case
            autocast = (torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu")
                        else None)
            dtypes = (autocast, *[p.dtype for p in params if p is not None])
        else:
            dtypes = compute_dtypes(input, params)
        if compiling:
            # A function Dynamo runs at trace time, keeping its result as a constant, builds
            # what is missing (the plan, the ops' recipe states) into the caches and returns
            # their keys; the graph then reads existing entries, which Dynamo guards one by
            # one (not the caches' sizes), so entries added later for other configurations
            # leave this graph valid.
            plan_id, states_id = _compiled_configuration(
                self, None if recipe is None else recipe.state_key(), first, dtypes,
                OperationFuser._fusion_registry_version)
            plan = self._compiled[plan_id]
            # the graph makes this recipe's states current, as an eager call would; the ops
            # read them only after these stores, so they are not guarded (ops without
            # quantizers are left out: their state is always None). object.__setattr__:
            # neither is a parameter, buffer or submodule, and each lookup of
            # nn.Module.__setattr__ would be guarded.
            for i, metas, quantizers in self._compiled[states_id]:
                op = self._basic_ops[i]
                object.__setattr__(op, "_fp8_metas", metas)
                object.__setattr__(op, "_quantizers", quantizers)
            self._last_recipe = _STATES_SET_BY_A_GRAPH  # the next eager call re-applies its own
        # the last plan while the configuration is unchanged (eager: under compile its fields
        # would become guards that any eager call in between invalidates)
        elif (recipe is None and self._last_recipe is None
                and first == self._last_first
                and dtypes == self._last_dtypes
                and self._last_version == OperationFuser._fusion_registry_version):
            plan = self._last_plan
        else:
            plan = self._plan(recipe, first, dtypes)
        if not compiling and recipe is not None and recipe.delayed():
            for op in self._basic_ops:
                op.register_delayed_scaling_states()

        arg_layout, tensors = self._arguments(input, params, extra_inputs, compiling)
        if first >= n:  # nothing needs a gradient: no autograd bookkeeping
            return _pipeline.pipeline_forward(None, plan, basic_op_kwargs, arg_layout, *tensors)
        if compiling or _torch_shim.functorch_transforms_active():
            return _pipeline.PipelineFunction.apply(plan, basic_op_kwargs, arg_layout, *tensors)
        if input.numel() >= _pipeline.RELEASE_MIN_NUMEL:
            return _pipeline.release_saved_early(_pipeline.apply_eager, plan, basic_op_kwargs,
                                                 arg_layout, *tensors)
        return _pipeline.apply_eager(plan, basic_op_kwargs, arg_layout, *tensors)

    def _refuse_recompute_under_another_recipe(self, recipe) -> None:
        """A forward run during a backward pass recomputes an earlier one (torch.utils.checkpoint
        runs the checkpointed forward again in the backward, outside te.autocast): under another
        recipe than this fuser's previous eager forward, its saved tensors, hence the gradients,
        would not be that forward's. RuntimeError naming both recipes."""
        last = self._last_recipe
        if self._last_plan is None or last is _STATES_SET_BY_A_GRAPH:
            return  # no eager forward to compare with

        def key(r):
            return None if r is None else r.state_key()

        if key(recipe) == key(last):
            return

        def name(r):
            return "no recipe" if r is None else type(r).__name__

        ops = ", ".join(type(op).__name__ for op in self._basic_ops)
        raise RuntimeError(
            f"te.ops ({ops}): a forward run during a backward pass under {name(recipe)}, while "
            f"this model's previous forward ran under {name(last)}: a recompute of "
            "torch.utils.checkpoint runs outside te.autocast, and its gradients would not be "
            "those of the forward. Re-enter the forward's recipe for the recompute: "
            "torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=lambda: "
            "(contextlib.nullcontext(), te.autocast(recipe=...))) (docs/quantization.md, "
            "Activation checkpointing).")

    def _check_kwargs(self, basic_op_kwargs: list) -> Optional[list]:
        """Validated per-op kwargs, or None when every op's are empty."""
        if len(basic_op_kwargs) != self._num_basic_ops:
            raise ValueError(f"OperationFuser expected kwargs for {self._num_basic_ops} basic "
                             f"ops, got {len(basic_op_kwargs)}")
        if not any(basic_op_kwargs):
            return None
        for op, kwargs in zip(self._basic_ops, basic_op_kwargs):
            if kwargs and not op.accepts_forward_kwargs:
                raise ValueError(f"{type(op).__name__} takes no forward kwargs, got "
                                 f"{sorted(kwargs)}")
        return basic_op_kwargs

    def _arguments(self, input, params: list, extra_inputs, compiling: bool):  # pylint: disable=redefined-builtin
        """The pipeline Function's tensor arguments, de-duplicated by identity (input,
        parameters, public extra inputs), and their layout ``(input_pos, param_pos,
        extra_pos)``. Eager calls without extra inputs reuse the last layout while the
        parameters are the same, distinct objects and the input is none of them."""
        reuse = not compiling and len(extra_inputs) == 0
        if reuse:
            key = tuple(map(id, params))
            if key == self._layout_key and id(input) not in self._layout_param_ids:
                # same ids: the None entries are where they were
                if self._layout_all_live:
                    return self._layout, [input, *params]
                return self._layout, [input, *[p for p in params if p is not None]]
        tensors: list[torch.Tensor] = []

        def position(t: torch.Tensor) -> int:
            for j, u in enumerate(tensors):
                if u is t:
                    return j
            tensors.append(t)
            return len(tensors) - 1

        input_pos = position(input)
        param_pos = tuple(tuple(position(p) for p in d.values() if p is not None)
                          for d in self._param_dicts)
        extra_pos = tuple(position(t) for t in extra_inputs)
        layout = (input_pos, param_pos, extra_pos)
        live = [p for p in params if p is not None]
        if reuse and len(tensors) == 1 + len(live):  # all distinct: the layout is positional
            self._layout_key, self._layout = key, layout
            self._layout_param_ids = frozenset(map(id, live))
            self._layout_all_live = len(live) == len(params)
        return layout, tensors


# Stands in the fuser's last-recipe memo after a compiled call set the ops' recipe states.
_STATES_SET_BY_A_GRAPH = object()


@mark_constant_result
def _compiled_configuration(fuser: OperationFuser, recipe_key, first: int, dtypes: tuple,
                            registry_version: int) -> tuple:
    """Builds the plan and the ops' recipe states for a compiled call on a cache miss and
    returns their keys in ``fuser._compiled`` (integers: Dynamo guards a lookup by such a key
    on that entry alone). Dynamo calls it while tracing and keeps the result as a constant;
    ``recipe_key`` is the call's recipe's state key (None: no recipe)."""
    del registry_version  # part of Dynamo's guards (a registration re-plans)
    # rebuilt from its key: the traced call's te.autocast may not have run yet for real
    recipe = None if recipe_key is None else Recipe.from_state_key(recipe_key)
    plan = fuser._plan(recipe, first, dtypes)
    states = fuser._compiled_states.get(recipe_key)
    if states is None:
        states = fuser._compiled_states[recipe_key] = tuple(
            (i, *op.recipe_state(recipe)) for i, op in enumerate(fuser._basic_ops)
            if op.num_quantizers("forward") or op.num_quantizers("backward"))
    fuser._compiled[id(plan)] = plan
    fuser._compiled[id(states)] = states
    # Refusals are raised here, not in the traced code, so the caller gets them as they are.
    if recipe is not None and recipe.delayed() and any(q is not None for _, _, q in states):
        raise compile_unsupported_error()(DELAYED_SCALING_UNDER_COMPILE)
    for op, _ in plan.forward_ops + plan.backward_ops:
        reason = op.compile_unsupported_reason()
        if reason is not None:
            raise compile_unsupported_error()(
                f"{op.__class__.__name__} cannot run under torch.compile: {reason}")
    return id(plan), id(states)


@mark_constant_result
def _raise_at_trace_time(msg: str) -> bool:
    """Raises ``msg`` as a CompileUnsupportedError from a function Dynamo runs at trace time
    (see _compiled_configuration)."""
    raise compile_unsupported_error()(msg)


@mark_constant_result
def _refuse_meta_parameters(fuser: OperationFuser) -> bool:
    """Raises for a compiled call of a fuser whose parameters are still on the meta device:
    materialising them (``reset_parameters()``) creates parameters, which a trace cannot.
    Dynamo runs it at trace time (a materialisation changes the parameters, which the graph
    guards anyway)."""
    names = sorted({type(op).__name__ for op, params in zip(fuser._basic_ops, fuser._param_dicts)
                    if any(p is not None and p.is_meta for p in params.values())})
    if not names:
        return True
    raise compile_unsupported_error()(
        f"{', '.join(names)} built with device=\"meta\": parameters on the meta device cannot "
        "be materialised under torch.compile; run the model once eagerly before compiling it, "
        "or call reset_parameters() on each such op first (or model.to_empty(device=...), "
        "then reset_parameters()). Materialising creates new Parameters: build the optimizer "
        "afterwards.")


def _register(registry: list, func: FusionFunction, prepend: bool) -> FusionFunction:
    if not callable(func):
        raise TypeError(f"fusion function must be callable, got {type(func).__name__}")
    if prepend:
        registry.insert(0, func)
    else:
        registry.append(func)
    OperationFuser._fusion_registry_version += 1
    return func


def register_forward_fusion(func: FusionFunction, prepend: bool = False) -> FusionFunction:
    """Register ``func(ops, *, recipe) -> ops`` as a forward-pass fusion (appended, or first
    with ``prepend=True``). Every fuser, existing ones included, re-plans on its next call."""
    return _register(OperationFuser.forward_fusion_functions, func, prepend)


def register_backward_fusion(func: FusionFunction, prepend: bool = False) -> FusionFunction:
    """Register ``func(ops, *, recipe) -> ops`` as a backward-pass fusion."""
    return _register(OperationFuser.backward_fusion_functions, func, prepend)


def register_forward_backward_fusion(func: FusionFunction, prepend: bool = False) -> FusionFunction:
    """Register ``func(ops, *, recipe) -> ops`` as a joint forward-and-backward fusion."""
    return _register(OperationFuser.forward_backward_fusion_functions, func, prepend)


FusibleOperation.fuser_class = OperationFuser
