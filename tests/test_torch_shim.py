"""The private PyTorch APIs of ops/_torch_shim.py still behave as the pipeline relies on. A torch
release that changes one fails here, by name, rather than somewhere inside the fuser."""

import torch

from transformer_engine_cpp.ops import _torch_shim as shim


class _Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, g):
        return 2 * g


def test_c_apply_runs_forward_and_backward():
    x = torch.randn(3, requires_grad=True)
    y = shim.c_apply(_Double)(x)
    assert y.grad_fn is not None and type(y.grad_fn).__name__ == "_DoubleBackward"
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


def test_functorch_transforms_active():
    assert shim.functorch_transforms_active() is False
    seen = []

    def f(x):
        seen.append(shim.functorch_transforms_active())
        return x * 2

    torch.func.vmap(f)(torch.randn(2, 3))
    assert seen == [True]


class _KeepGraphProbe(torch.autograd.Function):
    seen: list = []

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        _KeepGraphProbe.seen.append(shim.keep_graph())
        return g


def test_keep_graph_tells_retain_graph():
    _KeepGraphProbe.seen = []
    x = torch.randn(3, requires_grad=True)
    y = _KeepGraphProbe.apply(x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert _KeepGraphProbe.seen == [True, False]


def test_in_backward_tells_a_backward_pass():
    """-1 outside a backward pass; a graph task's id (>= 0) inside one, as in a Function's
    backward."""
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            seen.append(shim.in_backward())
            return g

    assert not shim.in_backward()
    Probe.apply(torch.randn(2, requires_grad=True)).sum().backward()
    assert seen == [True]


def test_saved_tensors_hooks_push_pop_and_top():
    def pack(t):
        return t

    def unpack(t):
        return t

    assert shim.saved_tensors_hooks_enabled() is True
    assert shim.top_saved_tensors_hooks(False) is None
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        assert shim.top_saved_tensors_hooks(False) == (pack, unpack)
    packed = []

    def counting_pack(t):
        packed.append(t.shape)
        return t

    shim.push_saved_tensors_hooks(counting_pack, unpack)
    try:
        assert shim.top_saved_tensors_hooks(False) == (counting_pack, unpack)
        x = torch.randn(4, requires_grad=True)
        y = (x * x).sum()
    finally:
        shim.pop_saved_tensors_hooks()
    assert shim.top_saved_tensors_hooks(False) is None
    assert packed == [torch.Size([4]), torch.Size([4])]
    y.backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())


def test_random_seeds_is_registered_as_an_ordered_effect():
    from torch._higher_order_ops.effects import _EffectType, _get_effect

    assert _get_effect(torch.ops.te_cpp.random_seeds.default) == _EffectType.ORDERED
    assert _get_effect(torch.ops.te_cpp.dropout_fwd.default) is None
