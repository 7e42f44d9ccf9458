"""The private PyTorch APIs the pipeline uses, in one place.

Each is bound at import, so a torch release that renames one fails on ``import
transformer_engine_cpp``, and ``tests/test_torch_shim.py`` checks that each still behaves as
the pipeline relies on. Nothing here but ``register_ordered_effect`` (called once, at import)
is used under ``torch.compile`` or functorch transforms: the pipeline takes the public
``Function.apply`` there.
"""

from __future__ import annotations

import torch
from torch._higher_order_ops import effects as _effects

_autograd = torch._C._autograd

#: Whether a functorch transform (vmap, grad, ...) is active: ``Function.apply`` must run then.
functorch_transforms_active = torch._C._are_functorch_transforms_active

#: Inside a backward pass: whether the graph is kept for another one (``retain_graph=True``).
keep_graph = _autograd._get_current_graph_task_keep_graph

_current_graph_task_id = torch._C._current_graph_task_id


def in_backward() -> bool:
    """Whether this thread is running a backward pass (a graph task), as a Function's backward
    or torch.utils.checkpoint's recompute does."""
    return _current_graph_task_id() >= 0


#: The default saved-tensor hooks: whether enabled, the innermost (pack, unpack) pair or None,
#: and push/pop of a pair (what ``torch.autograd.graph.saved_tensors_hooks`` does, without its
#: context-manager object, and readable so that a new pair can chain the caller's).
saved_tensors_hooks_enabled = _autograd._saved_tensors_hooks_is_enabled
top_saved_tensors_hooks = _autograd._top_saved_tensors_default_hooks
push_saved_tensors_hooks = _autograd._push_saved_tensors_default_hooks
pop_saved_tensors_hooks = _autograd._pop_saved_tensors_default_hooks


def c_apply(function_class: type) -> object:
    """The C++ ``apply`` of an ``autograd.Function`` subclass: ``Function.apply`` without its
    Python wrapper (functorch dispatch and ``setup_context`` handling). Only for Functions
    whose ``forward`` takes ``ctx`` itself, called outside torch.compile and functorch
    transforms."""
    return super(torch.autograd.Function, function_class).apply


def register_ordered_effect(op: torch._ops.OpOverload) -> None:
    """Marks ``op`` as an ordered effect for torch.compile: AOTAutograd threads an effect token
    through its calls (``with_effects``), so none is merged with another by CSE, dropped or
    reordered. For an op that draws from torch's generator."""
    _effects._register_effectful_op(op, _effects._EffectType.ORDERED)
