"""The operation fuser (the anchor's ``transformer_engine.pytorch.ops.fuser``).

:class:`OperationFuser` runs a list of fusible ops as one ``torch.autograd.Function``. It
flattens the ops to basic ops, applies the registered fusion functions (joint forward-backward
first, then forward-only and backward-only) and caches the resulting *plan*: the forward and
backward passes may group the basic ops differently. The plan depends only on configuration
(recipe class, grad mode, which ops need gradients), never on tensor values.

``torch.compile(fullgraph=True)`` traces the pipeline Function as one higher-order op
(``autograd_function_apply``): its forward and backward only call ``torch.ops.te_cpp.*``, torch
ops and Python on constants, and every tensor that needs a gradient (input, parameters, public
extra inputs) is a top-level positional argument of ``apply``, de-duplicated.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Optional

import torch
from torch.autograd.function import once_differentiable

from ..quantization.autocast import FP8GlobalStateManager
from .op import BasicOperation, FusibleOperation, OperationContext

FusionFunction = Callable[..., list]

__all__ = [
    "OperationFuser",
    "register_forward_fusion",
    "register_backward_fusion",
    "register_forward_backward_fusion",
]


@dataclasses.dataclass(frozen=True)
class _ForwardStep:
    """One forward group with what the pipeline needs per call, precomputed at plan time."""

    op: FusibleOperation
    idxs: tuple
    idx_set: frozenset
    # (consumer op, slot, producer op, producer slot) for channels fed from an earlier group
    channel_fills: tuple
    prev_idx: Optional[int]  # basic op before the group (its grad-output quantizer), or None
    next_idx: Optional[int]  # basic op after the group (its input quantizer), or None
    # whether any op in the group has extra outputs (only then are they validated in detail)
    has_extra_outputs: bool


@dataclasses.dataclass(frozen=True)
class _FusionPlan:
    """One cached fusion plan: groupings of the basic ops for the forward and backward pass.

    Each entry of ``forward_ops`` / ``backward_ops`` is ``(op, basic_op_indices)`` in forward
    order; ``forward_steps`` holds the forward groups with their per-call bookkeeping
    precomputed. The plan is immutable; the pipeline Function only reads it.
    """

    forward_ops: tuple
    backward_ops: tuple
    first_op_requiring_backward: int
    forward_steps: tuple
    quantized: bool  # a recipe is active: neighbours' quantizers are looked up per call


def _forward_steps(forward_ops: tuple, basic_ops: list, routing: "_Routing") -> tuple:
    n = len(basic_ops)
    steps = []
    for op, idxs in forward_ops:
        idx_set = frozenset(idxs)
        fills = tuple(
            (i, slot, src[1], src[2])
            for i in idxs
            for slot, src in enumerate(routing.extra_input_sources[i])
            if src[0] == "channel" and src[1] not in idx_set
        )
        steps.append(_ForwardStep(
            op=op, idxs=idxs, idx_set=idx_set, channel_fills=fills,
            prev_idx=idxs[0] - 1 if idxs[0] > 0 else None,
            next_idx=idxs[-1] + 1 if idxs[-1] + 1 < n else None,
            has_extra_outputs=any(basic_ops[i].num_extra_outputs for i in idxs),
        ))
    return tuple(steps)


def _map_to_basic_ops(ops: list, basic_ops: list, what: str) -> tuple:
    """Annotate fused ops with their basic-op indices, checking they cover ``basic_ops`` in
    order (by identity)."""
    result = []
    idx = 0
    for op in ops:
        members = list(op._ops) if op.is_fused_op else [op]
        idxs = tuple(range(idx, idx + len(members)))
        for i, member in zip(idxs, members):
            if i >= len(basic_ops) or member is not basic_ops[i]:
                raise RuntimeError(
                    f"Found mismatch after fusing operations ({what} fusions): op "
                    f"{member.__class__.__name__} at position {i} does not match the basic "
                    "ops of the pipeline"
                )
        result.append((op, idxs))
        idx += len(members)
    if idx != len(basic_ops):
        raise RuntimeError(
            f"Found mismatch after fusing operations ({what} fusions): the fused ops cover "
            f"{idx} basic ops, the pipeline has {len(basic_ops)}"
        )
    return tuple(result)


def _op_params(op: BasicOperation) -> list:
    """A basic op's own parameters, read fresh on every call (an op may replace them, e.g. on
    deferred initialisation); the direct dict read keeps this off the host-overhead path that
    Module.parameters()'s generators would cost."""
    return [p for p in op._parameters.values() if p is not None]


class _Routing:
    """Static extra-tensor routing of a fuser, resolved once at construction."""

    def __init__(self, basic_ops: list[BasicOperation]) -> None:
        producers: dict[str, tuple[int, int]] = {}
        for op_idx, op in enumerate(basic_ops):
            for slot, name in enumerate(op._extra_output_channels):
                if name is None:
                    continue
                if name in producers:
                    raise ValueError(
                        f"Extra-tensor channel {name!r} has multiple producers "
                        f"(basic ops {producers[name][0]} and {op_idx})"
                    )
                producers[name] = (op_idx, slot)
        # Extra inputs: (op, slot) -> ("public", index) or ("channel", producer_op, slot, name)
        self.extra_input_sources: list[list[tuple]] = []
        self.external_extra_input_slots: list[tuple[int, int]] = []
        self.consumers: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for op_idx, op in enumerate(basic_ops):
            sources = []
            for slot, name in enumerate(op._extra_input_channels):
                if name is None:
                    sources.append(("public", len(self.external_extra_input_slots)))
                    self.external_extra_input_slots.append((op_idx, slot))
                    continue
                if name not in producers:
                    raise ValueError(
                        f"Extra-tensor channel {name!r} (extra input {slot} of basic op {op_idx}, "
                        f"{op.__class__.__name__}) has no producer in this fuser"
                    )
                p_op, p_slot = producers[name]
                if p_op >= op_idx:
                    raise ValueError(
                        f"Extra-tensor channel {name!r} (extra input {slot} of basic op {op_idx}, "
                        f"{op.__class__.__name__}) has no earlier producer: it is produced by "
                        f"basic op {p_op}"
                    )
                sources.append(("channel", p_op, p_slot, name))
                self.consumers.setdefault((p_op, p_slot), []).append((op_idx, slot))
            self.extra_input_sources.append(sources)
        # Public extra outputs, in (op, slot) order.
        self.public_extra_outputs: list[tuple[int, int]] = [
            (op_idx, slot)
            for op_idx, op in enumerate(basic_ops)
            for slot in range(op.num_extra_outputs)
            if op._extra_output_to_caller[slot]
        ]
        self.public_output_index = {key: i for i, key in enumerate(self.public_extra_outputs)}


class _OperationFuserAutogradFunction(torch.autograd.Function):
    """The pipeline Function: runs the forward plan, then the backward plan in reverse.

    ``apply(plan, fuser, basic_op_kwargs, arg_layout, *tensors)`` where ``tensors`` holds the
    input, the parameters and the public extra inputs, de-duplicated; ``arg_layout`` maps each
    role to its position in ``tensors``.
    """

    @staticmethod
    def forward(func_ctx, plan, fuser, basic_op_kwargs, arg_layout, *tensors):
        basic_ops = fuser._basic_ops
        routing = fuser._routing
        n = len(basic_ops)
        input_pos, param_pos, extra_pos = arg_layout
        x = tensors[input_pos]
        first = plan.first_op_requiring_backward

        # op i's input needs a grad when an earlier op (or the pipeline input) does
        input_rg = x.requires_grad if func_ctx is not None else False
        ctxs = [OperationContext(requires_grad=i >= first,
                                 input_requires_grad=i > first or (i == 0 and input_rg))
                for i in range(n)]
        extra_inputs: list[list[Optional[torch.Tensor]]] = [
            [tensors[extra_pos[src[1]]] if src[0] == "public" else None for src in sources]
            for sources in routing.extra_input_sources
        ]
        extra_outputs: list[Optional[tuple]] = [None] * n

        for step in plan.forward_steps:
            op, idxs = step.op, step.idxs
            for i, slot, p_op, p_slot in step.channel_fills:
                extra_inputs[i][slot] = extra_outputs[p_op][p_slot]
            prev_q = next_q = None
            if plan.quantized:
                if step.prev_idx is not None:
                    prev_q = basic_ops[step.prev_idx].get_grad_output_quantizer()
                if step.next_idx is not None:
                    next_q = basic_ops[step.next_idx].get_input_quantizer()
            x, op_extra_outputs = op.fuser_forward(
                [ctxs[i] for i in idxs],
                x,
                basic_op_extra_inputs=[tuple(extra_inputs[i]) for i in idxs],
                prev_op_grad_output_quantizer=prev_q,
                next_op_input_quantizer=next_q,
                basic_op_kwargs=[basic_op_kwargs[i] for i in idxs],
            )
            op_extra_outputs = list(op_extra_outputs)
            if len(op_extra_outputs) != len(idxs):
                raise RuntimeError(
                    f"{op.__class__.__name__}.fuser_forward returned extra outputs for "
                    f"{len(op_extra_outputs)} basic ops, expected {len(idxs)}"
                )
            if not step.has_extra_outputs:
                if any(len(outs) for outs in op_extra_outputs):
                    raise RuntimeError(
                        f"{op.__class__.__name__}.fuser_forward returned extra outputs for basic "
                        "ops that have none"
                    )
                continue
            idx_set = step.idx_set
            for i, outs in zip(idxs, op_extra_outputs):
                outs = tuple(outs)
                if len(outs) != basic_ops[i].num_extra_outputs:
                    raise RuntimeError(
                        f"{basic_ops[i].__class__.__name__} returned {len(outs)} extra outputs, "
                        f"expected {basic_ops[i].num_extra_outputs}"
                    )
                for slot, t in enumerate(outs):
                    if t is not None:
                        continue
                    if (i, slot) in routing.public_output_index:
                        raise RuntimeError(
                            f"{basic_ops[i].__class__.__name__}: extra output {slot} is public, "
                            "but the op returned None"
                        )
                    for c_op, _ in routing.consumers.get((i, slot), ()):
                        if c_op not in idx_set:
                            raise RuntimeError(
                                f"{basic_ops[i].__class__.__name__}: extra output {slot} returned "
                                "None but is consumed outside its forward fusion"
                            )
                extra_outputs[i] = outs

        public_outputs = [extra_outputs[i][slot] for i, slot in routing.public_extra_outputs]

        if func_ctx is not None:
            to_save = []
            for ctx in ctxs:
                start = len(to_save)
                if ctx.to_save is not None:
                    to_save.extend(ctx.to_save)
                ctx._saved_tensors_range = (start, len(to_save))
                ctx.to_save = None
            func_ctx.save_for_backward(*to_save)
            func_ctx.plan = plan
            func_ctx.fuser = fuser
            func_ctx.basic_op_ctxs = ctxs
            func_ctx.arg_layout = arg_layout
            func_ctx.num_tensors = len(tensors)

        if public_outputs:
            return (x, *public_outputs)
        return x

    @staticmethod
    @once_differentiable
    def backward(func_ctx, grad_output, *grad_public_outputs):
        plan = func_ctx.plan
        fuser = func_ctx.fuser
        basic_ops = fuser._basic_ops
        routing = fuser._routing
        n = len(basic_ops)
        _, param_pos, extra_pos = func_ctx.arg_layout

        saved = func_ctx.saved_tensors
        ctxs = []
        for ctx in func_ctx.basic_op_ctxs:
            # Contexts were created in the traced forward: copy before writing (compile rule).
            ctx = copy.copy(ctx)
            start, end = ctx._saved_tensors_range
            ctx.saved_tensors = tuple(saved[start:end])
            ctxs.append(ctx)

        # Grads of extra outputs: the caller's (public) plus those from channel consumers.
        grad_extra_outputs: list[list[Optional[torch.Tensor]]] = [
            [None] * op.num_extra_outputs for op in basic_ops
        ]
        for (i, slot), g in zip(routing.public_extra_outputs, grad_public_outputs):
            grad_extra_outputs[i][slot] = g

        grads: list[Optional[torch.Tensor]] = [None] * func_ctx.num_tensors

        def accumulate(pos: int, g: Optional[torch.Tensor]) -> None:
            if g is None:
                return
            grads[pos] = g if grads[pos] is None else grads[pos] + g

        dx = grad_output
        for op, idxs in reversed(plan.backward_ops):
            if not any(ctxs[i].requires_grad for i in idxs):
                dx = None
                break
            idx_set = set(idxs)
            dx, op_param_grads, op_extra_input_grads = op.fuser_backward(
                [ctxs[i] for i in idxs],
                dx,
                basic_op_grad_extra_outputs=[tuple(grad_extra_outputs[i]) for i in idxs],
            )
            op_param_grads = list(op_param_grads)
            op_extra_input_grads = list(op_extra_input_grads)
            if len(op_param_grads) != len(idxs) or len(op_extra_input_grads) != len(idxs):
                raise RuntimeError(
                    f"{op.__class__.__name__}.fuser_backward returned grads for "
                    f"{len(op_param_grads)} / {len(op_extra_input_grads)} basic ops, "
                    f"expected {len(idxs)}"
                )
            for i, pgrads, egrads in zip(idxs, op_param_grads, op_extra_input_grads):
                pgrads = tuple(pgrads)
                if len(pgrads) != len(param_pos[i]):
                    raise RuntimeError(
                        f"{basic_ops[i].__class__.__name__} returned {len(pgrads)} parameter "
                        f"grads, expected {len(param_pos[i])}"
                    )
                for pos, g in zip(param_pos[i], pgrads):
                    accumulate(pos, g)
                egrads = tuple(egrads) if egrads is not None else ()
                for slot, src in enumerate(routing.extra_input_sources[i]):
                    g = egrads[slot] if slot < len(egrads) else None
                    if src[0] == "public":
                        accumulate(extra_pos[src[1]], g)
                    elif src[1] not in idx_set and g is not None:
                        prev = grad_extra_outputs[src[1]][src[2]]
                        grad_extra_outputs[src[1]][src[2]] = g if prev is None else prev + g
            for i in idxs:
                ctxs[i].saved_tensors = None

        if plan.quantized and not torch.compiler.is_compiling():
            for op in basic_ops:  # delayed scaling (eager only): the backward scales' update
                op.update_delayed_backward_state()

        input_pos = func_ctx.arg_layout[0]
        accumulate(input_pos, dx)
        return (None, None, None, None, *grads)


class OperationFuser:
    """Runs a list of fusible ops as one pipeline, fusing consecutive basic ops.

    Args:
        ops: the operations, basic or fused, in forward order.
    """

    # Fusion functions, process-wide: func(ops, *, recipe) -> ops.
    forward_backward_fusion_functions: list[FusionFunction] = []
    forward_fusion_functions: list[FusionFunction] = []
    backward_fusion_functions: list[FusionFunction] = []
    # Bumped by every registration: part of the plan key, so existing fusers re-plan with
    # fusions registered after they were built (the anchor keeps their stale plans).
    _fusion_registry_version: int = 0

    def __init__(self, ops: list[FusibleOperation]) -> None:
        basic_ops: list[BasicOperation] = []
        for op in ops:
            if op.is_fused_op:
                basic_ops.extend(op.basic_ops)
            else:
                basic_ops.append(op)
        self._basic_ops = basic_ops
        self._num_basic_ops = len(basic_ops)
        self._routing = _Routing(basic_ops)
        self.num_extra_inputs = len(self._routing.external_extra_input_slots)
        for op in basic_ops:
            op._extra_tensor_channels_locked = True
        # ops whose pre_fuser_forward hook does something (called before every forward)
        self._ops_with_pre_forward = tuple(
            (i, op) for i, op in enumerate(basic_ops)
            if type(op).pre_fuser_forward is not FusibleOperation.pre_fuser_forward
        )
        # Plan cache: key -> _FusionPlan.
        self._plans: dict[tuple, _FusionPlan] = {}
        self._last_recipe = None
        self._first_fuse_done = False
        self.recipe_type = None
        self.first_op_requiring_backward = 0
        self.backward_override = None
        self._forward_ops: tuple = ()
        self._backward_ops: tuple = ()
        # Build the unquantized plans for every possible first op needing backward now, so a
        # first call under torch.compile finds its plan instead of adding it to the cache
        # (a cache that changes during a trace makes the next call recompile).
        for first in range(self._num_basic_ops + 1):
            self._plans[self._plan_key(None, first)] = self._build_plan(None, first)

    # ---- planning ---------------------------------------------------------------------------

    def _first_op_requiring_backward(self, input_, extra_inputs, is_grad_enabled: bool) -> int:
        n = self._num_basic_ops
        if not is_grad_enabled:
            return n
        if input_.requires_grad:
            return 0
        public_extra = {slot: t for slot, t in zip(self._routing.external_extra_input_slots,
                                                   extra_inputs)}
        for i, op in enumerate(self._basic_ops):
            if any(p.requires_grad for p in _op_params(op)):
                return i
            for slot in range(op.num_extra_inputs):
                t = public_extra.get((i, slot))
                if t is not None and t.requires_grad:
                    return i
        return n

    @classmethod
    def _fuse(cls, ops: list, functions: list[FusionFunction], recipe) -> list:
        for func in functions:
            ops = list(func(ops, recipe=recipe))
        return ops

    def _build_plan(self, recipe, first: int) -> _FusionPlan:
        for op in self._basic_ops:
            op.reset_recipe_state(recipe=recipe)
        if not self._first_fuse_done:
            for op in self._basic_ops:
                op.pre_first_fuser_forward()
            self._first_fuse_done = True
        joint = self._fuse(list(self._basic_ops), self.forward_backward_fusion_functions, recipe)
        fwd = self._fuse(list(joint), self.forward_fusion_functions, recipe)
        bwd = self._fuse(list(joint), self.backward_fusion_functions, recipe)
        forward_ops = _map_to_basic_ops(fwd, self._basic_ops, "forward")
        return _FusionPlan(
            forward_ops=forward_ops,
            backward_ops=_map_to_basic_ops(bwd, self._basic_ops, "backward"),
            first_op_requiring_backward=first,
            forward_steps=_forward_steps(forward_ops, self._basic_ops, self._routing),
            quantized=recipe is not None,
        )

    @staticmethod
    def _plan_key(recipe, first: int) -> tuple:
        """What a plan depends on: the recipe class and its backward override, the first basic
        op needing backward, and the fusion registry (a new registration re-plans)."""
        return (type(recipe), first, getattr(recipe, "backward_override", None),
                OperationFuser._fusion_registry_version)

    def maybe_fuse_ops(self, is_grad_enabled: bool, recipe, input_, extra_inputs) -> _FusionPlan:
        """Return the plan for this call's configuration, building it on a cache miss."""
        first = self._first_op_requiring_backward(input_, extra_inputs, is_grad_enabled)
        backward_override = getattr(recipe, "backward_override", None)
        key = self._plan_key(recipe, first)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._build_plan(recipe, first)
            self._plans[key] = plan
        elif recipe is not None and recipe is not self._last_recipe:
            # same recipe class, maybe other settings: ops rebuild their quantizers if the
            # recipe differs (the anchor keeps stale quantizers here)
            for op in self._basic_ops:
                op.reset_recipe_state(recipe=recipe)
        self._last_recipe = recipe
        if recipe is not None and recipe.delayed():  # eager only: refused under compile
            for op in self._basic_ops:
                op.register_delayed_scaling_states()
        self.recipe_type = type(recipe)
        self.first_op_requiring_backward = first
        self.backward_override = backward_override
        self._forward_ops = plan.forward_ops
        self._backward_ops = plan.backward_ops
        return plan

    # ---- running ----------------------------------------------------------------------------

    def __call__(
        self,
        input: torch.Tensor,  # pylint: disable=redefined-builtin
        *extra_inputs: torch.Tensor,
        basic_op_kwargs: Optional[list[dict[str, Any]]] = None,
    ):
        n = self._num_basic_ops
        if len(extra_inputs) != self.num_extra_inputs:
            raise ValueError(
                f"OperationFuser expected {self.num_extra_inputs} extra inputs, got "
                f"{len(extra_inputs)}"
            )
        if basic_op_kwargs is None:
            basic_op_kwargs = [{}] * n
        elif len(basic_op_kwargs) != n:
            raise ValueError(
                f"OperationFuser expected kwargs for {n} basic ops, got {len(basic_op_kwargs)}"
            )

        if any(basic_op_kwargs):
            for op, kwargs in zip(self._basic_ops, basic_op_kwargs):
                if kwargs and not op.accepts_forward_kwargs:
                    raise ValueError(f"{type(op).__name__} takes no forward kwargs, "
                                     f"got {sorted(kwargs)}")
        is_grad_enabled = torch.is_grad_enabled()
        recipe = None
        if FP8GlobalStateManager.is_fp8_enabled():
            recipe = FP8GlobalStateManager.get_fp8_recipe()
        plan = self.maybe_fuse_ops(is_grad_enabled, recipe, input, extra_inputs)
        first = plan.first_op_requiring_backward
        for i, op in self._ops_with_pre_forward:
            op.pre_fuser_forward(requires_grad=i >= first)

        if torch.compiler.is_compiling():
            for op, _ in plan.forward_ops + plan.backward_ops:
                reason = op.compile_unsupported_reason()
                if reason is not None:
                    raise RuntimeError(
                        f"{op.__class__.__name__} cannot run under torch.compile: {reason}"
                    )

        # Tensor arguments, de-duplicated by identity: input, params, public extra inputs.
        tensors: list[torch.Tensor] = []

        def position(t: torch.Tensor) -> int:
            for j, u in enumerate(tensors):
                if u is t:
                    return j
            tensors.append(t)
            return len(tensors) - 1

        input_pos = position(input)
        param_pos = tuple(tuple(position(p) for p in _op_params(op)) for op in self._basic_ops)
        extra_pos = tuple(position(t) for t in extra_inputs)
        arg_layout = (input_pos, param_pos, extra_pos)

        if first >= n:
            # Nothing needs a gradient: run the forward plan without autograd bookkeeping.
            return _OperationFuserAutogradFunction.forward(
                None, plan, self, basic_op_kwargs, arg_layout, *tensors
            )
        return _OperationFuserAutogradFunction.apply(
            plan, self, basic_op_kwargs, arg_layout, *tensors
        )


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
