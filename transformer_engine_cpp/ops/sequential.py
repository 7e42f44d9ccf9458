"""Sequential container of fusible ops (TransformerEngine's ``ops/sequential.py``)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterator, Optional, Union

import torch

from ._plan import Plan
from .fuser import OperationFuser
from .op import BasicOperation, FusibleOperation


class Sequential(torch.nn.Module):
    """A list of modules run in order, consecutive fusible ops running as one fused pipeline.

    Args are modules, or a single ``dict`` (name -> module). Plain ``torch.nn.Module``s may sit
    between fusible ops; they split the pipeline into separate fusers.

    ``forward(input, *extra_inputs, op_kwargs=None)`` feeds each fuser its share of the extra
    inputs in order and returns ``output``, or ``(output, *extra_outputs)`` when ops publish
    extra outputs. ``op_kwargs`` maps a basic op (or its index in this Sequential) to keyword
    arguments for its forward.
    """

    def __init__(self, *args: Union[torch.nn.Module, dict[str, torch.nn.Module]]) -> None:
        super().__init__()
        self._module_groups: Optional[list] = None
        self._single_fuser: Optional[OperationFuser] = None
        if len(args) == 1 and isinstance(args[0], (dict, OrderedDict)):
            items = list(args[0].items())
        else:
            items = [(str(idx), module) for idx, module in enumerate(args)]
        for key, module in items:
            super().add_module(key, module)
        # Group (and lock the ops' channel routing) now and after every change, not lazily in
        # the first forward: a first forward that builds state would make torch.compile
        # recompile on the second call.
        self._regroup()

    def _regroup(self, previous: Optional[OrderedDict] = None) -> None:
        """Rebuild the fusers. If that fails (e.g. a channel without producer), restore the
        modules as they were before the change (``previous``) and re-raise, so a rejected
        change leaves the Sequential as it was."""
        try:
            self._module_groups = self._make_module_groups()
        except Exception:
            if previous is not None:
                self._modules = previous
                self._module_groups = self._make_module_groups()
            raise
        finally:
            # the whole Sequential is one fuser: forward hands the call straight to it
            groups = self._module_groups
            self._single_fuser = (groups[0] if groups is not None and len(groups) == 1
                                  and isinstance(groups[0], OperationFuser) else None)

    # Pickling and deepcopy leave the fusers out (their plans are derived from the modules);
    # the copy groups its modules again, as a new Sequential does.
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_module_groups"] = state["_single_fuser"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._regroup()

    def _snapshot(self) -> OrderedDict:
        return OrderedDict(self._modules)

    # ---- list-like API (each change drops the cached module groups) -------------------------

    def add_module(self, name: str, module: Optional[torch.nn.Module]) -> None:
        previous = self._snapshot()
        super().add_module(name, module)
        self._regroup(previous)

    def _get_keys_by_idx(self, idx: Union[int, slice]) -> list[str]:
        keys = list(self._modules.keys())
        if isinstance(idx, slice):
            return keys[idx]
        if not -len(keys) <= idx < len(keys):
            raise IndexError(f"Sequential: index {idx} is out of range (length {len(keys)})")
        return [keys[idx]]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[torch.nn.Module]:
        return iter(self._modules.values())

    def __getitem__(self, idx: Union[int, slice]):
        keys = self._get_keys_by_idx(idx)
        if isinstance(idx, slice):
            return Sequential(OrderedDict((k, self._modules[k]) for k in keys))
        return self._modules[keys[0]]

    def __setitem__(self, idx: int, module: torch.nn.Module) -> None:
        key = self._get_keys_by_idx(idx)[0]
        previous = self._snapshot()
        self._modules[key] = module
        self._regroup(previous)

    def __delitem__(self, idx: Union[int, slice]) -> None:
        previous = self._snapshot()
        for key in self._get_keys_by_idx(idx):
            del self._modules[key]
        self._regroup(previous)

    def _next_key(self) -> str:
        """The key of a module added at the end: one past the largest integer key, so that a
        key freed by ``del`` is never reused for a module that still exists under it."""
        idx = 0
        for key in self._modules:
            try:
                idx = max(idx, int(key) + 1)
            except ValueError:
                pass
        return str(idx)

    def append(self, module: torch.nn.Module) -> "Sequential":
        self.add_module(self._next_key(), module)
        return self

    def extend(self, modules) -> "Sequential":
        previous = self._snapshot()
        for module in modules:
            super().add_module(self._next_key(), module)
        self._regroup(previous)
        return self

    def insert(self, idx: int, module: torch.nn.Module) -> "Sequential":
        n = len(self)
        if not -n <= idx <= n:
            raise IndexError(f"Sequential.insert: index {idx} is out of range (length {n})")
        if idx < 0:
            idx += n
        previous = self._snapshot()
        # the keys keep their order; the modules from idx on move one key along, and the last
        # one takes a new key (as TransformerEngine's Sequential.insert)
        keys = list(self._modules)[idx:] + [self._next_key()]
        for i in reversed(range(1, len(keys))):
            self._modules[keys[i]] = self._modules[keys[i - 1]]
        super().add_module(keys[0], module)
        self._regroup(previous)
        return self

    def pop(self, idx: int = -1) -> torch.nn.Module:
        module = self[idx]
        del self[idx]
        return module

    def __add__(self, other: "Sequential") -> "Sequential":
        if not isinstance(other, Sequential):
            raise TypeError(f"can only add Sequential to Sequential, got {type(other).__name__}")
        return Sequential(*self, *other)

    def __iadd__(self, other: "Sequential") -> "Sequential":
        return self.extend(other)

    # ---- fusion groups ----------------------------------------------------------------------

    def _make_module_groups(self) -> list:
        groups: list = []
        run: list[FusibleOperation] = []
        for module in self._modules.values():
            if isinstance(module, FusibleOperation):
                run.append(module)
                continue
            if run:
                groups.append(OperationFuser(run))
                run = []
            groups.append(module)
        if run:
            groups.append(OperationFuser(run))
        return groups

    def _resolve_op_kwargs(self, groups: list, op_kwargs: Optional[dict]) -> list:
        per_fuser = [
            [{} for _ in range(g._num_basic_ops)] if isinstance(g, OperationFuser) else None
            for g in groups
        ]
        if not op_kwargs:
            return per_fuser
        modules = list(self._modules.values())
        where = {}
        for g_idx, g in enumerate(groups):
            if isinstance(g, OperationFuser):
                for b_idx, op in enumerate(g._basic_ops):
                    where[id(op)] = (g_idx, b_idx)
        missing = []
        for key, kwargs in op_kwargs.items():
            op = key
            if isinstance(key, int):
                if not -len(modules) <= key < len(modules):
                    raise ValueError(
                        f"Sequential: op_kwargs index {key} is out of range (length {len(modules)})"
                    )
                op = modules[key]
            if not isinstance(op, BasicOperation):
                raise ValueError(
                    "Sequential: op_kwargs keys must be basic operations (or their indices), got "
                    f"{type(op).__name__}"
                )
            if id(op) not in where:
                missing.append(key)
                continue
            g_idx, b_idx = where[id(op)]
            per_fuser[g_idx][b_idx] = dict(kwargs)
        if missing:
            raise ValueError(f"op_kwargs contains keys that are not in this Sequential: {missing}")
        return per_fuser

    def forward(
        self,
        input: torch.Tensor,  # pylint: disable=redefined-builtin
        *extra_inputs: torch.Tensor,
        op_kwargs: Optional[dict[Any, dict[str, Any]]] = None,
    ):
        fuser = self._single_fuser
        if fuser is not None and not op_kwargs and len(extra_inputs) == fuser.num_extra_inputs:
            return fuser(input, *extra_inputs)
        groups = self._module_groups
        kwargs = self._resolve_op_kwargs(groups, op_kwargs)
        x = input
        extra_inputs = list(extra_inputs)
        extra_outputs: list[torch.Tensor] = []
        for group, group_kwargs in zip(groups, kwargs):
            if isinstance(group, OperationFuser):
                k = group.num_extra_inputs
                if len(extra_inputs) < k:
                    raise ValueError(
                        f"Sequential: a fused group needs {k} extra inputs, only "
                        f"{len(extra_inputs)} are left"
                    )
                args, extra_inputs = extra_inputs[:k], extra_inputs[k:]
                out = group(x, *args, basic_op_kwargs=group_kwargs)
                if isinstance(out, tuple):
                    x, *outs = out
                    extra_outputs.extend(outs)
                else:
                    x = out
            else:
                x = group(x)
        if extra_inputs:
            raise ValueError(
                f"Sequential: {len(extra_inputs)} extra input(s) were not consumed by any op"
            )
        if extra_outputs:
            return (x, *extra_outputs)
        return x

    def fusion_plan(self, input: torch.Tensor, *extra_inputs: torch.Tensor,  # pylint: disable=redefined-builtin
                    requires_grad: Optional[bool] = None) -> list[Plan]:
        """The plans a call ``self(input, *extra_inputs)`` would run now: one :class:`Plan` per
        run of consecutive fusible ops, in order (plain modules between them run as they are).
        The grad mode, the ``te.autocast`` recipe and torch autocast are the current ones;
        ``requires_grad`` overrides ``input.requires_grad``. Each plan's ``forward_ops`` and
        ``backward_ops`` list the fused and basic ops that run, with their basic-op indices;
        its ``repr`` names them."""
        if requires_grad is None:
            requires_grad = input.requires_grad
        extra_inputs = list(extra_inputs)
        plans = []
        for group in self._module_groups:
            if isinstance(group, OperationFuser):
                k = group.num_extra_inputs
                args, extra_inputs = extra_inputs[:k], extra_inputs[k:]
                plans.append(group.fusion_plan(input, *args, requires_grad=requires_grad))
                reached = plans[-1].first_op_requiring_backward < group._num_basic_ops
            else:
                reached = any(p.requires_grad for p in group.parameters())
            requires_grad = requires_grad or (reached and torch.is_grad_enabled())
        return plans
