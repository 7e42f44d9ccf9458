"""Saved-activation bytes: a regression guard that is not a timing. The te.ops pre-norm MLP
block saves exactly what its backward needs, and no more than plain PyTorch's autograd."""

from __future__ import annotations

import weakref

import pytest
import torch

import transformer_engine_cpp as te
from transformer_engine_cpp.testing.reference import PreNormMLP, te_prenorm_mlp


def saved_activation_bytes(model, x) -> int:
    """Bytes of the distinct storages autograd saves for backward, parameters and the input
    excluded (they exist anyway)."""
    storages = {}

    def pack(t):
        if not (t.is_leaf and t.requires_grad):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(storages.values())


def ours_block(hidden, ffn):
    return te_prenorm_mlp(hidden, ffn)


def test_mlp_block_saves_exactly_what_backward_needs():
    T, H, F = 64, 32, 128
    x = torch.randn(T, H, requires_grad=True)
    ours = saved_activation_bytes(ours_block(H, F), x)
    # LayerNorm: mean and rstd (fp32, T each); fc1: the LayerNorm output (T x H); GELU: its
    # input, the fc1 output (T x F), also what the fused dbias+dgelu reads; fc2: the GELU
    # output (T x F). The input x and the parameters are not activations.
    expected = 4 * (2 * T + T * H + T * F + T * F)
    assert ours == expected
    plain = saved_activation_bytes(PreNormMLP(H, F), x)
    assert ours <= plain, (ours, plain)


def test_inference_saves_nothing():
    x = torch.randn(16, 32)
    with torch.no_grad():
        assert saved_activation_bytes(ours_block(32, 64), x) == 0
    # parameters requiring grad but an input that does not: only the ops from the first one
    # needing a gradient save (here all of them, LayerNorm has parameters)
    model = ours_block(32, 64)
    for p in model.parameters():
        p.requires_grad_(False)
    assert saved_activation_bytes(model, x) == 0


class _Probe(te.ops.BasicOperation):
    """Identity whose backward (the pipeline's last step when it is the first op) records
    which of the watched tensors are still alive."""

    def __init__(self, refs, alive):
        super().__init__()
        self.refs, self.alive = refs, alive

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None,
                   next_op_input_quantizer=None):
        return input_

    def op_backward(self, ctx, grad_output):
        self.alive.append([r() is not None for r in self.refs])
        return grad_output, ()


@pytest.mark.parametrize("retain_graph", [False, True], ids=["free", "retain_graph"])
@pytest.mark.parametrize("extra", [False, True], ids=["plain", "residual"])
def test_backward_frees_each_ops_saved_tensors_once_it_has_run(retain_graph, extra):
    """As autograd frees a node's saved tensors after running it, the pipeline frees each
    op's saved activations after its backward step (large inputs; eager), so the backward's
    peak stays that of plain PyTorch; with retain_graph they stay for the next backward.
    Caller's saved-tensors hooks still see every saved tensor."""
    T, H, F = 384, 256, 512  # T * H >= the fuser's release threshold
    refs, alive = [], []
    body = [_Probe(refs, alive), te.ops.Linear(H, F), te.ops.GELU(), te.ops.Linear(F, H)]
    if extra:
        body = ([te.ops.MakeExtraOutput().set_extra_output_channel(0, "res",
                                                                   output_to_caller=False)]
                + body + [te.ops.AddExtraInput().set_extra_input_channel(0, "res")])
    model = te.ops.Sequential(*body)
    x = torch.randn(T, H, requires_grad=True)

    def pack(t):
        if t.shape == (T, F):  # the GELU input and output: activations, not leaves
            refs.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = model(x)
    assert len(refs) == 2
    y.backward(torch.ones_like(y), retain_graph=retain_graph)
    assert alive == [[retain_graph, retain_graph]]
    if retain_graph:  # and a second backward still works
        y.backward(torch.ones_like(y))
        assert len(alive) == 2
