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
from ._common import shares_storage, storage_address
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
    start: int  # idxs == range(start, stop): the group's contexts are ctxs[start:stop]
    stop: int
    # whether any op in the group has extra inputs (else no_extra_inputs is passed)
    has_extra_inputs: bool
    no_extra_inputs: tuple  # ((),) * len(idxs)
    # (position in the group, slot) of the extra inputs the group overwrites in eager mode
    in_place_writes: tuple = ()
    # per extra output (op, slot) produced before this group: whether it is read after this
    # group (returned to the caller, or consumed by a later group)
    outputs_read_after: tuple = ()
    # per basic op of the group with extra inputs: (index, per slot: True/False for a channel,
    # whose producer is at or after the first op needing backward; None for a public input,
    # whose own requires_grad decides)
    extra_inputs_requires_grad: tuple = ()


@dataclasses.dataclass(frozen=True)
class _BackwardStep:
    """One backward group (in forward order), precomputed at plan time."""

    op: FusibleOperation
    idxs: tuple
    idx_set: frozenset
    start: int
    stop: int
    requires_grad: bool  # whether the backward pass reaches any op of the group
    size: int  # len(idxs)
    has_extra_inputs: bool
    has_extra_outputs: bool
    no_grad_extra_outputs: tuple  # ((),) * len(idxs)
    # (position in the group, slot) of the grads of extra outputs the group may accumulate
    # into in place (eager mode)
    in_place_grad_slots: tuple = ()


@dataclasses.dataclass(frozen=True)
class _FusionPlan:
    """One cached fusion plan: groupings of the basic ops for the forward and backward pass.

    Each entry of ``forward_ops`` / ``backward_ops`` is ``(op, basic_op_indices)`` in forward
    order; ``forward_steps`` / ``backward_steps`` hold the groups with their per-call
    bookkeeping precomputed. The plan is immutable; the pipeline Function only reads it.
    """

    forward_ops: tuple
    backward_ops: tuple
    first_op_requiring_backward: int
    forward_steps: tuple
    quantized: bool  # a recipe is active: neighbours' quantizers are looked up per call
    backward_steps: tuple = ()  # in forward order (run reversed)
    backward_steps_reversed: tuple = ()  # in the order the backward runs them
    # (requires_grad, input_requires_grad) per basic op; op 0's input flag is the input's
    ctx_flags: tuple = ()
    # the ops whose flags differ from OperationContext's defaults (both True):
    # (index, requires_grad, input_requires_grad)
    ctx_flag_overrides: tuple = ()


def _forward_steps(forward_ops: tuple, basic_ops: list, routing: "_Routing", first: int) -> tuple:
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
        writes = tuple((k, slot) for k, i in enumerate(idxs)
                       for slot in basic_ops[i].in_place_extra_inputs())
        read_after = ()
        if writes:
            stop = idxs[-1] + 1
            read_after = tuple(
                (i, slot) for i in range(idxs[0]) for slot in range(basic_ops[i].num_extra_outputs)
                if (i, slot) in routing.public_output_index
                or any(c_op >= stop for c_op, _ in routing.consumers.get((i, slot), ())))
        steps.append(_ForwardStep(
            op=op, idxs=idxs, idx_set=idx_set, channel_fills=fills,
            prev_idx=idxs[0] - 1 if idxs[0] > 0 else None,
            next_idx=idxs[-1] + 1 if idxs[-1] + 1 < n else None,
            has_extra_outputs=any(basic_ops[i].num_extra_outputs for i in idxs),
            start=idxs[0], stop=idxs[-1] + 1,
            has_extra_inputs=any(basic_ops[i].num_extra_inputs for i in idxs),
            no_extra_inputs=((),) * len(idxs),
            in_place_writes=writes,
            outputs_read_after=read_after,
            extra_inputs_requires_grad=tuple(
                (i, tuple(None if src[0] == "public" else src[1] >= first
                          for src in routing.extra_input_sources[i]))
                for i in idxs if basic_ops[i].num_extra_inputs),
        ))
    return tuple(steps)


def _backward_steps(backward_ops: tuple, basic_ops: list, first: int) -> tuple:
    return tuple(
        _BackwardStep(
            op=op, idxs=idxs, idx_set=frozenset(idxs), start=idxs[0], stop=idxs[-1] + 1,
            requires_grad=idxs[-1] >= first, size=len(idxs),
            has_extra_inputs=any(basic_ops[i].num_extra_inputs for i in idxs),
            has_extra_outputs=any(basic_ops[i].num_extra_outputs for i in idxs),
            no_grad_extra_outputs=((),) * len(idxs),
            in_place_grad_slots=tuple((k, slot) for k, i in enumerate(idxs)
                                      for slot in basic_ops[i].in_place_grad_extra_outputs()),
        )
        for op, idxs in backward_ops
    )


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


_new_object = object.__new__


def _copy_context(ctx: OperationContext) -> OperationContext:
    """An eager shallow copy of an op context, by its ``__dict__`` (cheaper than copy.copy's
    generic reduce protocol)."""
    new = _new_object(type(ctx))
    new.__dict__.update(ctx.__dict__)
    return new


def _save_op_contexts(func_ctx, ctxs) -> None:
    """Save every op context's tensors through the pipeline Function, one flat list; each
    context records its range in it (read back as ``saved_tensors`` in backward)."""
    to_save = []
    packed = 0  # tensors (not None slots) saved so far: one saved-tensor pack each
    for ctx in ctxs:
        saved = ctx.to_save
        if saved is not None:
            start = len(to_save)
            to_save.extend(saved)
            ctx._saved_tensors_range = (start, len(to_save))
            first_packed = packed
            for t in saved:
                if t is not None:
                    packed += 1
            ctx._packed_range = (first_packed, packed)
            ctx.to_save = None
        else:
            ctx._saved_tensors_range = (0, 0)
            ctx._packed_range = (0, 0)
    func_ctx.save_for_backward(*to_save)


def _pipeline_forward(func_ctx, plan, fuser, basic_op_kwargs, arg_layout, *tensors):
    """The forward plan. ``func_ctx`` is None when nothing needs a gradient (no autograd)."""
    basic_ops = fuser._basic_ops
    routing = fuser._routing
    input_pos, _, extra_pos = arg_layout
    x = tensors[input_pos]

    # op i's input needs a grad when an earlier op (or the pipeline input) does
    flags = plan.ctx_flags
    if torch.compiler.is_compiling():
        ctxs = [OperationContext(requires_grad=rg, input_requires_grad=irg)
                for rg, irg in flags]
    else:
        # eager: no dataclass __init__ call per context (the fields' defaults are class
        # attributes: only flags that differ from them are set)
        ctxs = [_new_object(OperationContext) for _ in flags]
        for i, rg, irg in plan.ctx_flag_overrides:
            ctx = ctxs[i]
            ctx.requires_grad = rg
            ctx.input_requires_grad = irg
    if ctxs:
        ctxs[0].input_requires_grad = x.requires_grad if func_ctx is not None else False
    has_extras = fuser._has_extra_tensors
    if has_extras:
        extra_inputs: list[list[Optional[torch.Tensor]]] = [
            [tensors[extra_pos[src[1]]] if src[0] == "public" else None for src in sources]
            for sources in routing.extra_input_sources
        ]
        extra_outputs: list[Optional[tuple]] = [None] * len(basic_ops)
    no_kwargs = basic_op_kwargs is None

    for step in plan.forward_steps:
        op, idxs = step.op, step.idxs
        if step.has_extra_inputs:
            for i, slot, p_op, p_slot in step.channel_fills:
                extra_inputs[i][slot] = extra_outputs[p_op][p_slot]
            op_extra_inputs = [tuple(extra_inputs[i]) for i in idxs]
            for i, flags in step.extra_inputs_requires_grad:
                ctxs[i].extra_inputs_requires_grad = tuple(
                    (func_ctx is not None and t is not None and t.requires_grad)
                    if rg is None else rg
                    for rg, t in zip(flags, extra_inputs[i]))
        else:
            op_extra_inputs = step.no_extra_inputs
        if step.in_place_writes and not torch.compiler.is_compiling():
            for k, slot in step.in_place_writes:
                _protect_from_write(op_extra_inputs[k][slot], ctxs[:step.start],
                                    extra_outputs, step.outputs_read_after)
        prev_q = next_q = None
        if plan.quantized:
            if step.prev_idx is not None:
                prev_q = basic_ops[step.prev_idx].get_grad_output_quantizer()
            if step.next_idx is not None:
                next_q = basic_ops[step.next_idx].get_input_quantizer()
        x, op_extra_outputs = op.fuser_forward(
            ctxs[step.start:step.stop],
            x,
            basic_op_extra_inputs=op_extra_inputs,
            prev_op_grad_output_quantizer=prev_q,
            next_op_input_quantizer=next_q,
            basic_op_kwargs=(fuser._no_kwargs[step.start:step.stop] if no_kwargs
                             else basic_op_kwargs[step.start:step.stop]),
        )
        op_extra_outputs = list(op_extra_outputs)
        if len(op_extra_outputs) != len(idxs):
            raise RuntimeError(
                f"{op.__class__.__name__}.fuser_forward returned extra outputs for "
                f"{len(op_extra_outputs)} basic ops, expected {len(idxs)}"
            )
        if not step.has_extra_outputs:
            if any(op_extra_outputs) and any(len(outs) for outs in op_extra_outputs):
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

    if has_extras:
        public_outputs = _distinct_outputs(
            x, [extra_outputs[i][slot] for i, slot in routing.public_extra_outputs])
    else:
        public_outputs = None

    if func_ctx is not None:
        _save_op_contexts(func_ctx, ctxs)
        func_ctx.plan = plan
        func_ctx.fuser = fuser
        func_ctx.basic_op_ctxs = ctxs
        func_ctx.arg_layout = arg_layout
        func_ctx.num_tensors = len(tensors)

    if public_outputs:
        return (x, *public_outputs)
    return x


def _protect_from_write(target, ctxs, extra_outputs, outputs_read_after) -> None:
    """Eager in-place writes (AddExtraInput(in_place=True) and its fusions) overwrite
    ``target``. Whatever still needs its current values gets a copy first: tensors that earlier
    ops saved for backward (autograd's version check cannot see a write made before they are
    saved), and earlier extra outputs that are returned or consumed after the write. The write
    itself still lands in the caller's buffer."""
    for ctx in ctxs:
        saved = ctx.to_save
        if saved and any(shares_storage(t, target) for t in saved):
            ctx.to_save = tuple(t.clone() if shares_storage(t, target) else t for t in saved)
    for i, slot in outputs_read_after:
        outs = extra_outputs[i]
        if outs is not None and shares_storage(outs[slot], target):
            extra_outputs[i] = outs[:slot] + (outs[slot].clone(),) + outs[slot + 1:]


def _distinct_outputs(x: torch.Tensor, outputs: list) -> list:
    """The public extra outputs, each a distinct tensor object: one that is the main output or
    an earlier extra output (MakeExtraOutput returns its input) is returned as a view of it.
    A Function that returns one tensor twice cannot be traced (Dynamo loses the second)."""
    seen = {id(x)}
    result = []
    for t in outputs:
        if id(t) in seen:
            t = t.view_as(t)
        seen.add(id(t))
        result.append(t)
    return result


def _pipeline_backward(func_ctx, grad_output, *grad_public_outputs):
    """The backward plan, in reverse."""
    plan = func_ctx.plan
    fuser = func_ctx.fuser
    basic_ops = fuser._basic_ops
    routing = fuser._routing
    input_pos, param_pos, extra_pos = func_ctx.arg_layout

    saved = func_ctx.saved_tensors
    # eager, large tensors: each step's saved tensors are freed once it has run (see
    # _apply_releasing_saved), unless the graph is kept for another backward
    boxes = getattr(func_ctx, "_saved_boxes", None)
    if boxes is not None and _keep_graph():
        boxes = None
    ctxs = []
    # Contexts were created in the (traced) forward: copy before writing (compile rule).
    # Eager copies their __dict__ (copy.copy's generic reduce protocol costs more).
    compiling = torch.compiler.is_compiling()
    for ctx in func_ctx.basic_op_ctxs:
        ctx = copy.copy(ctx) if compiling else _copy_context(ctx)
        start, end = ctx._saved_tensors_range
        ctx.saved_tensors = saved[start:end]
        ctxs.append(ctx)
    del saved

    has_extras = fuser._has_extra_tensors
    if has_extras:
        # Grads of extra outputs: the caller's (public) plus those from channel consumers.
        grad_extra_outputs: list[list[Optional[torch.Tensor]]] = [
            [None] * op.num_extra_outputs for op in basic_ops
        ]
        for (i, slot), g in zip(routing.public_extra_outputs, grad_public_outputs):
            grad_extra_outputs[i][slot] = g

    grads: list[Optional[torch.Tensor]] = [None] * func_ctx.num_tensors
    # Grads an in-place accumulation must not write into (eager), by storage (a view shares
    # its base's): the caller's and any routed to more than one extra output (``shared``), and
    # those returned for an extra input or a parameter (``grads``).
    shared = None
    if has_extras and not compiling:
        shared = {storage_address(t) for t in (grad_output, *grad_public_outputs)}
        routed: set = set()

    dx = grad_output
    for step in reversed(plan.backward_steps):
        if not step.requires_grad:
            dx = None
            break
        op, idxs = step.op, step.idxs
        step_ctxs = ctxs[step.start:step.stop]
        if step.in_place_grad_slots and shared is not None:
            for k, slot in step.in_place_grad_slots:
                g = grad_extra_outputs[idxs[k]][slot]
                writable = list(step_ctxs[k].writable_grad_extra_outputs
                                or (False,) * basic_ops[idxs[k]].num_extra_outputs)
                ptr = storage_address(g)
                writable[slot] = (ptr is not None and ptr not in shared
                                  and not shares_storage(g, dx)
                                  and not any(shares_storage(g, t) for t in grads))
                step_ctxs[k].writable_grad_extra_outputs = tuple(writable)
        dx, op_param_grads, op_extra_input_grads = op.fuser_backward(
            step_ctxs,
            dx,
            basic_op_grad_extra_outputs=(
                [tuple(grad_extra_outputs[i]) for i in idxs] if step.has_extra_outputs
                else step.no_grad_extra_outputs),
        )
        _add_param_grads(step, op_param_grads, param_pos, grads)
        if step.has_extra_inputs:
            op_extra_input_grads = list(op_extra_input_grads)
            if len(op_extra_input_grads) != len(idxs):
                raise RuntimeError(
                    f"{op.__class__.__name__}.fuser_backward returned extra-input grads for "
                    f"{len(op_extra_input_grads)} basic ops, expected {len(idxs)}"
                )
        if step.has_extra_inputs:
            idx_set = step.idx_set
            for i, egrads in zip(idxs, op_extra_input_grads):
                egrads = tuple(egrads) if egrads is not None else ()
                for slot, src in enumerate(routing.extra_input_sources[i]):
                    g = egrads[slot] if slot < len(egrads) else None
                    if g is None:
                        continue
                    if src[0] == "public":
                        pos = extra_pos[src[1]]
                        grads[pos] = g if grads[pos] is None else grads[pos] + g
                    elif src[1] not in idx_set:
                        prev = grad_extra_outputs[src[1]][src[2]]
                        grad_extra_outputs[src[1]][src[2]] = g if prev is None else prev + g
                        if shared is not None:
                            ptr = storage_address(g)
                            if ptr in routed:
                                shared.add(ptr)
                            routed.add(ptr)
        for ctx in step_ctxs:
            ctx.saved_tensors = None
            if boxes is not None:
                _release_boxes(boxes, ctx)

    if plan.quantized and not compiling:
        for op in basic_ops:  # delayed scaling (eager only): the backward scales' update
            op.update_delayed_backward_state()

    if dx is not None:
        grads[input_pos] = dx if grads[input_pos] is None else grads[input_pos] + dx
    return (None, None, None, None, *grads)


class _OperationFuserAutogradFunction(torch.autograd.Function):
    """The pipeline Function: runs the forward plan, then the backward plan in reverse.

    ``apply(plan, fuser, basic_op_kwargs, arg_layout, *tensors)`` where ``tensors`` holds the
    input, the parameters and the public extra inputs, de-duplicated; ``arg_layout`` maps each
    role to its position in ``tensors``; ``basic_op_kwargs`` is None when no op has any.
    """

    # forward(func_ctx, plan, fuser, basic_op_kwargs, arg_layout, *tensors)
    forward = staticmethod(_pipeline_forward)

    @staticmethod
    def backward(func_ctx, grad_output, *grad_public_outputs):
        if torch.is_grad_enabled():  # create_graph=True: once_differentiable's error graph
            return _pipeline_backward_once_differentiable(func_ctx, grad_output,
                                                          *grad_public_outputs)
        # (what once_differentiable does when grad mode is off, without its no_grad context)
        return _pipeline_backward(func_ctx, grad_output, *grad_public_outputs)


_pipeline_backward_once_differentiable = once_differentiable(_pipeline_backward)


# Eager pipelines with large tensors free each op's saved tensors as soon as the backward has
# run that op, as autograd does for a chain of ATen ops. save_for_backward's tensors live until
# the end of the Function's backward, so they are saved through a saved-tensors hook that wraps
# each in a box the backward empties step by step (chained with any hooks the caller has
# installed). Below this many input elements the two hook calls cost more than they free.
_RELEASE_MIN_NUMEL = 1 << 16
_keep_graph = torch._C._autograd._get_current_graph_task_keep_graph
_top_saved_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_saved_hooks_enabled = torch._C._autograd._saved_tensors_hooks_is_enabled


def _release_boxes(boxes: list, ctx: OperationContext) -> None:
    """Empty the boxes of one op context's saved tensors. Boxes exist only for the tensors
    actually packed: ``None`` slots of save_for_backward get none, so a context's boxes are
    numbered by its ``_packed_range``, not by its slots."""
    start, end = ctx._packed_range
    for j in range(start, end):
        boxes[j][0] = None


def _apply_releasing_saved(apply, *args):
    """apply(*args), with the pipeline's saved tensors packed in boxes the backward empties."""
    if not _saved_hooks_enabled():
        return apply(*args)
    boxes: list[list] = []
    outer = _top_saved_hooks(False)
    if outer is None:
        def pack(t):
            box = [t]
            boxes.append(box)
            return box

        def unpack(box):
            return box[0]
    else:
        outer_pack, outer_unpack = outer

        def pack(t):
            box = [outer_pack(t)]
            boxes.append(box)
            return box

        def unpack(box):
            return outer_unpack(box[0])
    torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)
    try:
        out = apply(*args)
    finally:
        torch._C._autograd._pop_saved_tensors_default_hooks()
    grad_fn = (out[0] if isinstance(out, tuple) else out).grad_fn
    if grad_fn is not None:
        grad_fn._saved_boxes = boxes
    return out


# Eager calls skip autograd.Function.apply's Python wrapper (its setup_context and functorch
# checks: these Functions have no setup_context, and functorch transforms are checked per
# call): _apply_eager, below, is the C++ apply bound to the eager pipeline Function.
_functorch_transforms_active = torch._C._are_functorch_transforms_active


def _eager_forward(func_ctx, plan, fuser, arg_layout, *tensors):
    """:func:`_pipeline_forward` for the eager fast path (:meth:`OperationFuser._call_eager`):
    no extra tensors, no recipe, no kwargs, a gradient needed. The same steps, without the
    bookkeeping those features need; :func:`_eager_backward` is its backward."""
    x = tensors[arg_layout[0]]
    ctxs = [_new_object(OperationContext) for _ in plan.ctx_flags]
    for i, rg, irg in plan.ctx_flag_overrides:
        ctx = ctxs[i]
        ctx.requires_grad = rg
        ctx.input_requires_grad = irg
    if ctxs:
        ctxs[0].input_requires_grad = x.requires_grad
    no_kwargs = fuser._no_kwargs
    for step in plan.forward_steps:
        x, op_extra_outputs = step.op.fuser_forward(
            ctxs[step.start:step.stop], x, basic_op_extra_inputs=step.no_extra_inputs,
            prev_op_grad_output_quantizer=None, next_op_input_quantizer=None,
            basic_op_kwargs=no_kwargs[step.start:step.stop])
        if len(op_extra_outputs) != len(step.idxs) or any(op_extra_outputs):
            _check_no_extra_outputs(step, op_extra_outputs)
    _save_op_contexts(func_ctx, ctxs)
    func_ctx.plan = plan
    func_ctx.basic_op_ctxs = ctxs
    func_ctx.arg_layout = arg_layout
    func_ctx.num_tensors = len(tensors)
    return x


def _check_no_extra_outputs(step, op_extra_outputs) -> None:
    """What :func:`_pipeline_forward` checks of a group without extra outputs."""
    op_extra_outputs = list(op_extra_outputs)
    if len(op_extra_outputs) != len(step.idxs):
        raise RuntimeError(
            f"{step.op.__class__.__name__}.fuser_forward returned extra outputs for "
            f"{len(op_extra_outputs)} basic ops, expected {len(step.idxs)}"
        )
    if any(len(outs) for outs in op_extra_outputs if outs):
        raise RuntimeError(
            f"{step.op.__class__.__name__}.fuser_forward returned extra outputs for basic "
            "ops that have none"
        )


def _eager_backward(func_ctx, grad_output):
    """:func:`_pipeline_backward` for :func:`_eager_forward`'s graphs. The contexts are used
    as the forward left them (copied only when the graph is kept for another backward)."""
    plan = func_ctx.plan
    saved = func_ctx.saved_tensors
    ctxs = func_ctx.basic_op_ctxs
    if _keep_graph():
        boxes = None
        ctxs = [_copy_context(ctx) for ctx in ctxs]
    else:
        boxes = getattr(func_ctx, "_saved_boxes", None)
    for ctx in ctxs:
        start, end = ctx._saved_tensors_range
        ctx.saved_tensors = saved[start:end]
    del saved
    input_pos, param_pos, _ = func_ctx.arg_layout
    grads: list[Optional[torch.Tensor]] = [None] * func_ctx.num_tensors
    dx = grad_output
    for step in plan.backward_steps_reversed:
        if not step.requires_grad:
            dx = None
            break
        step_ctxs = ctxs[step.start:step.stop]
        dx, op_param_grads, _ = step.op.fuser_backward(
            step_ctxs, dx, basic_op_grad_extra_outputs=step.no_grad_extra_outputs)
        _add_param_grads(step, op_param_grads, param_pos, grads)
        if boxes is not None:  # large tensors: this step's saved tensors go now
            for ctx in step_ctxs:
                ctx.saved_tensors = None
                _release_boxes(boxes, ctx)
    if dx is not None:
        grads[input_pos] = dx if grads[input_pos] is None else grads[input_pos] + dx
    return (None, None, None, *grads)


def _add_param_grads(step, op_param_grads, param_pos: tuple, grads: list) -> None:
    """Check what one backward step returned for parameters (a sequence per basic op of the
    group, one grad per parameter; an op without parameters may return all-None grads) and add
    the grads into ``grads`` at their argument positions. Both pipeline backwards use it."""
    if not isinstance(op_param_grads, (tuple, list)):
        op_param_grads = tuple(op_param_grads)
    if len(op_param_grads) != step.size:
        raise RuntimeError(
            f"{step.op.__class__.__name__}.fuser_backward returned parameter grads for "
            f"{len(op_param_grads)} basic ops, expected {step.size}"
        )
    for i, pgrads in zip(step.idxs, op_param_grads):
        positions = param_pos[i]
        if not isinstance(pgrads, (tuple, list)):
            pgrads = () if pgrads is None else tuple(pgrads)
        if len(pgrads) != len(positions):
            if not positions and not any(g is not None for g in pgrads):
                continue
            basic_op = step.op._ops[i - step.start] if step.op.is_fused_op else step.op
            raise RuntimeError(
                f"{basic_op.__class__.__name__} returned {len(pgrads)} parameter grads, "
                f"expected {len(positions)}"
            )
        for pos, g in zip(positions, pgrads):
            if g is not None:
                prev = grads[pos]
                grads[pos] = g if prev is None else prev + g


class _EagerPipelineFunction(torch.autograd.Function):
    """The pipeline Function of the eager fast path: ``apply(plan, fuser, arg_layout,
    *tensors)``. Never traced (torch.compile runs :class:`_OperationFuserAutogradFunction`)."""

    forward = staticmethod(_eager_forward)

    @staticmethod
    def backward(func_ctx, grad_output):
        if torch.is_grad_enabled():  # create_graph=True: once_differentiable's error graph
            return _eager_backward_once_differentiable(func_ctx, grad_output)
        return _eager_backward(func_ctx, grad_output)


_eager_backward_once_differentiable = once_differentiable(_eager_backward)
_apply_eager = super(torch.autograd.Function, _EagerPipelineFunction).apply
_apply_general = super(torch.autograd.Function, _OperationFuserAutogradFunction).apply


class OperationFuser:
    """Runs a list of fusible ops as one pipeline, fusing consecutive basic ops.

    Args:
        ops: the operations, basic or fused, in forward order.
    """

    # Fusion functions, process-wide: func(ops, *, recipe) -> ops.
    forward_backward_fusion_functions: list[FusionFunction] = []
    forward_fusion_functions: list[FusionFunction] = []
    backward_fusion_functions: list[FusionFunction] = []
    # Our extensions (ops/fused/__init__.py): applied after every registered function, so
    # registered ones see the ops TransformerEngine would show them. Not user-extensible.
    extension_forward_fusion_functions: tuple = ()
    extension_backward_fusion_functions: tuple = ()
    # Bumped by every registration: part of the plan key, so existing fusers re-plan with
    # fusions registered after they were built.
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
        # whether any of those hooks does more than materialise meta parameters (deferred
        # init): if not, the eager fast path calls them only when a parameter is on meta
        self._other_pre_forward_hooks = any(
            type(op).pre_fuser_forward is not BasicOperation.materialize_meta_parameters
            for _, op in self._ops_with_pre_forward
        )
        # Plan cache: key -> _FusionPlan.
        self._plans: dict[tuple, _FusionPlan] = {}
        self._current_plan: Optional[_FusionPlan] = None
        self._last_recipe = None
        # per-call fast path (eager, no recipe, no kwargs): the ops' parameter dicts (read
        # fresh every call), shared empty kwargs, and whether any op has extra tensors
        self._param_dicts = tuple(op._parameters for op in basic_ops)
        self._no_kwargs = tuple({} for _ in basic_ops)
        self._has_extra_tensors = any(op.num_extra_inputs or op.num_extra_outputs
                                      for op in basic_ops)
        # the unquantized plans by first op needing backward, valid for one registry version
        self._unquantized_plans: list = []
        self._unquantized_version = -1
        # the last call's parameter identities and the argument layout built from them
        self._layout_key: Optional[tuple] = None
        self._layout_param_ids: frozenset = frozenset()
        self._layout_sizes: tuple = ()
        self._layout: Optional[tuple] = None
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
        for first in range(self._num_basic_ops + 1):
            self._unquantized_plan(first)

    # ---- planning ---------------------------------------------------------------------------

    def _first_op_requiring_backward(self, input_, extra_inputs, is_grad_enabled: bool) -> int:
        n = self._num_basic_ops
        if not is_grad_enabled:
            return n
        if input_.requires_grad:
            return 0
        public_extra = {}
        if extra_inputs:
            public_extra = {slot: t for slot, t in
                            zip(self._routing.external_extra_input_slots, extra_inputs)}
        for i, params in enumerate(self._param_dicts):
            for p in params.values():
                if p is not None and p.requires_grad:
                    return i
            if public_extra:
                for slot in range(self._basic_ops[i].num_extra_inputs):
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
        fwd = self._fuse(list(joint), [*self.forward_fusion_functions,
                                       *self.extension_forward_fusion_functions], recipe)
        bwd = self._fuse(list(joint), [*self.backward_fusion_functions,
                                       *self.extension_backward_fusion_functions], recipe)
        forward_ops = _map_to_basic_ops(fwd, self._basic_ops, "forward")
        backward_ops = _map_to_basic_ops(bwd, self._basic_ops, "backward")
        backward_steps = _backward_steps(backward_ops, self._basic_ops, first)
        return _FusionPlan(
            forward_ops=forward_ops,
            backward_ops=backward_ops,
            first_op_requiring_backward=first,
            forward_steps=_forward_steps(forward_ops, self._basic_ops, self._routing, first),
            quantized=recipe is not None,
            backward_steps=backward_steps,
            backward_steps_reversed=backward_steps[::-1],
            ctx_flags=tuple((i >= first, i > first) for i in range(self._num_basic_ops)),
            ctx_flag_overrides=tuple((i, i >= first, i > first)
                                     for i in range(self._num_basic_ops)
                                     if not (i >= first and i > first)),
        )

    def _unquantized_plan(self, first: int) -> _FusionPlan:
        """The unquantized plan for ``first`` (eager fast path): a list lookup while the fusion
        registry is unchanged, else the plan cache's (built on a miss)."""
        if self._unquantized_version != OperationFuser._fusion_registry_version:
            self._unquantized_plans = [None] * (self._num_basic_ops + 1)
            self._unquantized_version = OperationFuser._fusion_registry_version
        plan = self._unquantized_plans[first]
        if plan is None:
            key = self._plan_key(None, first)
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = self._build_plan(None, first)
            self._unquantized_plans[first] = plan
        return plan

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
        elif recipe is not self._last_recipe:
            # same recipe class, maybe other settings: ops rebuild their quantizers if the
            # recipe differs (the anchor keeps stale quantizers here); no recipe after one:
            # the quantizers go, or the GEMMs would stay quantized outside te.autocast
            for op in self._basic_ops:
                op.reset_recipe_state(recipe=recipe)
        self._last_recipe = recipe
        if recipe is not None and recipe.delayed():  # eager only: refused under compile
            for op in self._basic_ops:
                op.register_delayed_scaling_states()
        self._set_current_plan(plan, recipe, backward_override)
        return plan

    def _set_current_plan(self, plan: _FusionPlan, recipe, backward_override) -> None:
        self._current_plan = plan
        self.recipe_type = type(recipe)
        self.first_op_requiring_backward = plan.first_op_requiring_backward
        self.backward_override = backward_override
        self._forward_ops = plan.forward_ops
        self._backward_ops = plan.backward_ops

    # ---- running ----------------------------------------------------------------------------

    def __call__(
        self,
        input: torch.Tensor,  # pylint: disable=redefined-builtin
        *extra_inputs: torch.Tensor,
        basic_op_kwargs: Optional[list[dict[str, Any]]] = None,
    ):
        if (not FP8GlobalStateManager.FP8_ENABLED and not extra_inputs
                and self.num_extra_inputs == 0 and not torch.compiler.is_compiling()
                and (basic_op_kwargs is None or not any(basic_op_kwargs))):
            if basic_op_kwargs is not None and len(basic_op_kwargs) != self._num_basic_ops:
                raise ValueError(f"OperationFuser expected kwargs for {self._num_basic_ops} "
                                 f"basic ops, got {len(basic_op_kwargs)}")
            return self._call_eager(input)
        return self._call(input, extra_inputs, basic_op_kwargs)

    def _call_eager(self, input: torch.Tensor):  # pylint: disable=redefined-builtin
        """The common eager call, with the per-call Python work cut to the minimum: no recipe,
        no extra inputs, no kwargs. Same plans, hooks, state and results as :meth:`_call`."""
        n = self._num_basic_ops
        # the plan: cached per "first op needing backward" (never a fusion function call)
        if not torch.is_grad_enabled():
            first = n
        elif input.requires_grad:
            first = 0
        else:
            first = self._first_op_requiring_backward(input, (), True)
        plan = self._unquantized_plans[first]
        if plan is None or self._unquantized_version != OperationFuser._fusion_registry_version:
            plan = self._unquantized_plan(first)
        if plan is not self._current_plan:
            self._set_current_plan(plan, None, None)
        if self._last_recipe is not None:  # the first call after te.autocast: drop quantizers
            for op in self._basic_ops:
                op.reset_recipe_state(recipe=None)
            self._last_recipe = None
        params = [p for d in self._param_dicts for p in d.values()]
        run_hooks = self._other_pre_forward_hooks
        if not run_hooks and self._ops_with_pre_forward:
            for p in params:
                if p is not None and p.is_meta:
                    run_hooks = True
                    break
        if run_hooks:
            for i, op in self._ops_with_pre_forward:
                op.pre_fuser_forward(requires_grad=i >= first)
            params = [p for d in self._param_dicts for p in d.values()]

        # the tensor arguments: the input, then the parameters; their layout is reused while
        # the parameters are the same objects (identity of the live objects, checked per call)
        if (tuple(map(id, params)) == self._layout_key and id(input) not in self._layout_param_ids
                and tuple(map(len, self._param_dicts)) == self._layout_sizes):
            arg_layout = self._layout
            tensors = [input]
            tensors += [p for p in params if p is not None]
        else:
            arg_layout, tensors = self._arg_layout(input, ())
        if first >= n:
            # Nothing needs a gradient: run the forward plan without autograd bookkeeping.
            return _pipeline_forward(None, plan, self, None, arg_layout, *tensors)
        if _functorch_transforms_active():  # Function.apply's own checks (and refusal)
            return _OperationFuserAutogradFunction.apply(plan, self, None, arg_layout, *tensors)
        if self._has_extra_tensors:  # extra tensors: the general pipeline Function
            apply, args = _apply_general, (plan, self, None, arg_layout)
        else:
            apply, args = _apply_eager, (plan, self, arg_layout)
        if input.numel() >= _RELEASE_MIN_NUMEL:
            return _apply_releasing_saved(apply, *args, *tensors)
        return apply(*args, *tensors)

    def _arg_layout(self, input, extra_inputs):  # pylint: disable=redefined-builtin
        """The tensor arguments of the pipeline Function, de-duplicated by identity (input,
        parameters, public extra inputs), and their layout (input_pos, param_pos, extra_pos).
        Eager calls without extra inputs remember the layout for the next call while the
        parameters are the same, distinct objects."""
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
        if not extra_inputs and not torch.compiler.is_compiling():
            params = [p for d in self._param_dicts for p in d.values()]
            live = [p for p in params if p is not None]
            ids = frozenset(map(id, live))
            if len(ids) == len(live) and id(input) not in ids:
                self._layout_key = tuple(map(id, params))
                self._layout_param_ids = ids
                self._layout_sizes = tuple(map(len, self._param_dicts))
                self._layout = arg_layout
        return arg_layout, tensors

    def _call(self, input, extra_inputs, basic_op_kwargs):  # pylint: disable=redefined-builtin
        """The general call (any recipe, extra inputs, kwargs; the path torch.compile traces)."""
        n = self._num_basic_ops
        if len(extra_inputs) != self.num_extra_inputs:
            raise ValueError(
                f"OperationFuser expected {self.num_extra_inputs} extra inputs, got "
                f"{len(extra_inputs)}"
            )
        if basic_op_kwargs is not None:
            if len(basic_op_kwargs) != n:
                raise ValueError(
                    f"OperationFuser expected kwargs for {n} basic ops, got "
                    f"{len(basic_op_kwargs)}"
                )
            if any(basic_op_kwargs):
                for op, kwargs in zip(self._basic_ops, basic_op_kwargs):
                    if kwargs and not op.accepts_forward_kwargs:
                        raise ValueError(f"{type(op).__name__} takes no forward kwargs, "
                                         f"got {sorted(kwargs)}")
            else:
                basic_op_kwargs = None
        is_grad_enabled = torch.is_grad_enabled()
        recipe = None
        if FP8GlobalStateManager.is_fp8_enabled():
            recipe = FP8GlobalStateManager.get_fp8_recipe()
        plan = self.maybe_fuse_ops(is_grad_enabled, recipe, input, extra_inputs)
        first = plan.first_op_requiring_backward
        for i, op in self._ops_with_pre_forward:
            op.pre_fuser_forward(requires_grad=i >= first)

        compiling = torch.compiler.is_compiling()
        if compiling:
            for op, _ in plan.forward_ops + plan.backward_ops:
                reason = op.compile_unsupported_reason()
                if reason is not None:
                    raise RuntimeError(
                        f"{op.__class__.__name__} cannot run under torch.compile: {reason}"
                    )

        arg_layout, tensors = self._arg_layout(input, extra_inputs)

        if plan.first_op_requiring_backward >= n:
            # Nothing needs a gradient: run the forward plan without autograd bookkeeping.
            return _pipeline_forward(None, plan, self, basic_op_kwargs, arg_layout, *tensors)
        if not compiling and input.numel() >= _RELEASE_MIN_NUMEL:
            return _apply_releasing_saved(_OperationFuserAutogradFunction.apply, plan, self,
                                          basic_op_kwargs, arg_layout, *tensors)
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
