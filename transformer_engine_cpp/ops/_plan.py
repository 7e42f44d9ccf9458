"""Fusion plans: how one fuser's basic ops are grouped for a given configuration.

A :class:`Plan` is built once per configuration (see :func:`plan_key`) by applying the fusion
functions, and is immutable afterwards. Its steps carry everything the pipeline Function needs
per call, decided here at plan time: the groups, the extra-tensor routing between them, which
ops the backward reaches, and the in-place writes to guard. A fused op named in a plan is the
code that runs.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

from .op import BasicOperation, mark_constant_result

FusionFunction = Callable[..., list]


class Routing:
    """The extra-tensor routing of a fuser's basic ops, resolved once at construction.

    * ``extra_input_sources[i][slot]``: ``("public", k)`` for the caller's k-th extra input, or
      ``("channel", producer_op, producer_slot, name)``;
    * ``public_extra_inputs``: the (op, slot) of each public extra input, in argument order;
    * ``consumers[(op, slot)]``: the (op, slot) extra inputs an extra output feeds;
    * ``public_extra_outputs``: the (op, slot) returned to the caller, in order.
    """

    def __init__(self, basic_ops: list[BasicOperation]) -> None:
        producers: dict[str, tuple[int, int]] = {}
        for op_idx, op in enumerate(basic_ops):
            for slot, name in enumerate(op.extra_output_channels()):
                if name is None:
                    continue
                if name in producers:
                    raise ValueError(
                        f"Extra-tensor channel {name!r} has multiple producers "
                        f"(basic ops {producers[name][0]} and {op_idx})"
                    )
                producers[name] = (op_idx, slot)
        self.extra_input_sources: list[list[tuple]] = []
        self.public_extra_inputs: list[tuple[int, int]] = []
        self.consumers: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for op_idx, op in enumerate(basic_ops):
            sources = []
            for slot, name in enumerate(op.extra_input_channels()):
                if name is None:
                    sources.append(("public", len(self.public_extra_inputs)))
                    self.public_extra_inputs.append((op_idx, slot))
                    continue
                where = (f"(extra input {slot} of basic op {op_idx}, "
                         f"{op.__class__.__name__})")
                if name not in producers:
                    raise ValueError(f"Extra-tensor channel {name!r} {where} has no producer "
                                     "in this fuser")
                p_op, p_slot = producers[name]
                if p_op >= op_idx:
                    raise ValueError(f"Extra-tensor channel {name!r} {where} has no earlier "
                                     f"producer: it is produced by basic op {p_op}")
                sources.append(("channel", p_op, p_slot, name))
                self.consumers.setdefault((p_op, p_slot), []).append((op_idx, slot))
            self.extra_input_sources.append(sources)
        self.public_extra_outputs: list[tuple[int, int]] = [
            (op_idx, slot)
            for op_idx, op in enumerate(basic_ops)
            for slot, to_caller in enumerate(op.extra_outputs_to_caller())
            if to_caller
        ]
        self.public_output_index = {key: i for i, key in enumerate(self.public_extra_outputs)}


@dataclasses.dataclass(frozen=True)
class ForwardStep:
    """One forward group's per-call bookkeeping (its op: ``Plan.forward_step_ops``)."""

    idxs: tuple  # the basic ops of the group: range(start, stop)
    start: int
    stop: int
    no_kwargs: tuple  # one empty dict per basic op (calls without kwargs)
    no_extra_inputs: tuple  # ((),) per basic op (groups without extra inputs)
    has_extra_inputs: bool
    has_extra_outputs: bool
    prev_idx: Optional[int]  # the basic op before the group (its grad-output quantizer)
    next_idx: Optional[int]  # the basic op after the group (its input quantizer)
    # the op whose GEMMs read the copies of an input quantized with that quantizer: next_idx,
    # or past the ops that hand their input on; None where none follows (the caller's)
    reader_idx: Optional[int]
    # (consumer op, slot, producer op, producer slot) for channels fed by an earlier group
    channel_fills: tuple
    # per basic op with extra inputs: (index, per slot True/False for a channel, by whether its
    # producer is reached by the backward; None for a public input: its requires_grad decides)
    extra_inputs_requires_grad: tuple
    # (position in the group, slot) of the extra inputs the group overwrites in eager mode
    in_place_writes: tuple
    # the extra outputs (op, slot) produced before this group and read after it (returned, or
    # consumed by a later group): an in-place write must not change them
    outputs_read_after: tuple
    # whether a quantized input is dequantized before the group (its op does not accept one)
    dequantize_input: bool


@dataclasses.dataclass(frozen=True)
class BackwardStep:
    """One backward group's per-call bookkeeping, its basic ops in forward order (its op:
    ``Plan.backward_step_ops``)."""

    idxs: tuple
    start: int
    stop: int
    requires_grad: bool  # whether the backward reaches any op of the group
    has_extra_inputs: bool
    has_extra_outputs: bool
    no_grad_extra_outputs: tuple  # ((),) per basic op
    # (position in the group, slot) of the extra-output grads the group may accumulate into
    in_place_grad_slots: tuple
    # whether a quantized grad_output is dequantized before the group (as dequantize_input)
    dequantize_grad_output: bool


@dataclasses.dataclass(frozen=True, eq=False)
class TracedPlan:
    """The fields of a :class:`Plan` the pipeline Function reads, for a call traced by
    torch.compile: :func:`traced_plan` hands them to the trace as constants, so Dynamo guards
    the plan's identity once instead of every field it reads (a plan is immutable). The steps
    hold no ops: the trace reads those from the plan (``forward_step_ops``,
    ``backward_step_ops``), since an op's parameters are graph inputs, to be guarded. A trace
    does not read ``no_kwargs`` (a constant's dict cannot be unpacked in it)."""

    first_op_requiring_backward: int
    quantized: bool
    has_extra_tensors: bool
    backward_override: Optional[str]
    forward_steps: tuple
    backward_steps: tuple


@mark_constant_result
def traced_plan(plan: Plan) -> TracedPlan:
    """``plan.traced``; Dynamo runs it at trace time and keeps the result as a constant."""
    return plan.traced


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """The grouping of a fuser's basic ops for one configuration, with its steps.

    ``forward_ops`` and ``backward_ops`` list ``(op, basic_op_indices)`` in forward order, as
    TransformerEngine's fuser does; ``forward_steps`` / ``backward_steps`` are the same groups
    with their per-call bookkeeping (``backward_steps`` in the order the backward runs them).
    """

    basic_ops: tuple
    routing: Routing
    recipe_type: type
    backward_override: Optional[str]
    first_op_requiring_backward: int
    forward_ops: tuple
    backward_ops: tuple
    forward_steps: tuple
    backward_steps: tuple
    quantized: bool  # a recipe is active: neighbours' quantizers are read per call
    has_extra_tensors: bool
    context_types: tuple  # per basic op, the context class it declares
    # the basic ops whose context flags differ from the defaults (both True):
    # (index, requires_grad, input_requires_grad)
    context_flag_overrides: tuple
    # each step's op, in the steps' order (the pipeline zips them with the steps)
    forward_step_ops: tuple
    backward_step_ops: tuple
    traced: TracedPlan  # what a traced call reads, as constants (traced_plan)

    def __repr__(self) -> str:
        def group(op) -> str:
            if not op.is_fused_op:
                return type(op).__name__
            members = ", ".join(type(m).__name__ for m in op.basic_ops)
            return f"{type(op).__name__}({members})"

        recipe = "None" if self.recipe_type is type(None) else self.recipe_type.__name__
        return (f"Plan(recipe={recipe}, "
                f"first_op_requiring_backward={self.first_op_requiring_backward},\n"
                f"  forward=[{', '.join(group(op) for op, _ in self.forward_ops)}],\n"
                f"  backward=[{', '.join(group(op) for op, _ in self.backward_ops)}])")


def plan_key(recipe, first: int, dtypes: tuple, registry_version: int) -> tuple:
    """What a plan depends on: the recipe class and its backward override, the first basic op
    the backward reaches, the compute dtypes (autocast and parameter dtypes, which fusion
    conditions read), and the fusion registry (a new registration re-plans)."""
    return (type(recipe), getattr(recipe, "backward_override", None), first, dtypes,
            registry_version)


def _apply_fusions(ops: list, functions, recipe) -> list:
    for func in functions:
        ops = list(func(ops, recipe=recipe))
    return ops


def _map_to_basic_ops(ops: list, basic_ops: tuple, what: str) -> tuple:
    """``(op, basic_op_indices)`` per op, checking the ops cover ``basic_ops`` in order."""
    result = []
    idx = 0
    for op in ops:
        members = list(op.basic_ops) if op.is_fused_op else [op]
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


def _reader(basic_ops: tuple, i: int) -> Optional[int]:
    """The first basic op from ``i`` on that does not hand its input on, or None."""
    while i < len(basic_ops) and basic_ops[i].passes_input_on:
        i += 1
    return i if i < len(basic_ops) else None


def _forward_steps(forward_ops: tuple, basic_ops: tuple, routing: Routing, first: int) -> tuple:
    n = len(basic_ops)
    steps = []
    for op, idxs in forward_ops:
        idx_set = frozenset(idxs)
        start, stop = idxs[0], idxs[-1] + 1
        writes = tuple((k, slot) for k, i in enumerate(idxs)
                       for slot in basic_ops[i].in_place_extra_inputs())
        read_after = ()
        if writes:
            read_after = tuple(
                (i, slot) for i in range(start) for slot in range(basic_ops[i].num_extra_outputs)
                if (i, slot) in routing.public_output_index
                or any(c_op >= stop for c_op, _ in routing.consumers.get((i, slot), ())))
        steps.append(ForwardStep(
            idxs=idxs, start=start, stop=stop,
            no_kwargs=tuple({} for _ in idxs), no_extra_inputs=((),) * len(idxs),
            has_extra_inputs=any(basic_ops[i].num_extra_inputs for i in idxs),
            has_extra_outputs=any(basic_ops[i].num_extra_outputs for i in idxs),
            prev_idx=start - 1 if start > 0 else None,
            next_idx=stop if stop < n else None,
            reader_idx=_reader(basic_ops, stop),
            channel_fills=tuple(
                (i, slot, src[1], src[2])
                for i in idxs
                for slot, src in enumerate(routing.extra_input_sources[i])
                if src[0] == "channel" and src[1] not in idx_set),
            extra_inputs_requires_grad=tuple(
                (i, tuple(None if src[0] == "public" else src[1] >= first
                          for src in routing.extra_input_sources[i]))
                for i in idxs if basic_ops[i].num_extra_inputs),
            in_place_writes=writes,
            outputs_read_after=read_after,
            dequantize_input=not op.accepts_quantized_input,
        ))
    return tuple(steps)


def _backward_steps(backward_ops: tuple, basic_ops: tuple, first: int) -> tuple:
    steps = tuple(
        BackwardStep(
            idxs=idxs, start=idxs[0], stop=idxs[-1] + 1,
            requires_grad=idxs[-1] >= first,
            has_extra_inputs=any(basic_ops[i].num_extra_inputs for i in idxs),
            has_extra_outputs=any(basic_ops[i].num_extra_outputs for i in idxs),
            no_grad_extra_outputs=((),) * len(idxs),
            in_place_grad_slots=tuple((k, slot) for k, i in enumerate(idxs)
                                      for slot in basic_ops[i].in_place_grad_extra_outputs()),
            dequantize_grad_output=not op.accepts_quantized_grad_output,
        )
        for op, idxs in backward_ops
    )
    return steps[::-1]


def build_plan(basic_ops: tuple, routing: Routing, recipe, first: int,
               fusions: tuple[tuple, tuple, tuple]) -> Plan:
    """Group ``basic_ops`` with the fusion functions ``(joint, forward, backward)``: the joint
    forward-backward fusions first, then forward-only and backward-only ones on the result."""
    joint_fns, forward_fns, backward_fns = fusions
    joint = _apply_fusions(list(basic_ops), joint_fns, recipe)
    forward_ops = _map_to_basic_ops(_apply_fusions(list(joint), forward_fns, recipe),
                                    basic_ops, "forward")
    backward_ops = _map_to_basic_ops(_apply_fusions(list(joint), backward_fns, recipe),
                                     basic_ops, "backward")
    n = len(basic_ops)
    forward_steps = _forward_steps(forward_ops, basic_ops, routing, first)
    backward_steps = _backward_steps(backward_ops, basic_ops, first)
    fields = dict(
        first_op_requiring_backward=first,
        quantized=recipe is not None,
        has_extra_tensors=any(op.num_extra_inputs or op.num_extra_outputs for op in basic_ops),
        backward_override=getattr(recipe, "backward_override", None),
    )
    traced = TracedPlan(forward_steps=forward_steps, backward_steps=backward_steps, **fields)
    return Plan(
        basic_ops=basic_ops,
        routing=routing,
        recipe_type=type(recipe),
        forward_ops=forward_ops,
        backward_ops=backward_ops,
        forward_steps=forward_steps,
        backward_steps=backward_steps,
        context_types=tuple(op.context_type for op in basic_ops),
        context_flag_overrides=tuple((i, i >= first, i > first) for i in range(n)
                                     if not (i >= first and i > first)),
        forward_step_ops=tuple(op for op, _ in forward_ops),
        backward_step_ops=tuple(op for op, _ in backward_ops)[::-1],  # the steps' order
        traced=traced,
        **fields,
    )


def compute_dtypes(input_: torch.Tensor, params: list) -> tuple:
    """The dtypes a plan depends on: the autocast dtype for the input's device (None when
    autocast is off) and each parameter's dtype."""
    if input_.is_cpu:
        autocast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
    else:
        device_type = input_.device.type
        autocast = (torch.get_autocast_dtype(device_type)
                    if torch.amp.is_autocast_available(device_type)
                    and torch.is_autocast_enabled(device_type) else None)
    return (autocast, *[p.dtype for p in params if p is not None])
