"""Saved-activation bytes: a regression guard that is not a timing. The te.ops pre-norm MLP
block saves exactly what its backward needs, and no more than plain PyTorch's autograd."""

from __future__ import annotations

import torch

import transformer_engine_cpp as te
from transformer_engine_cpp.testing.reference import PreNormMLP


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
    return te.ops.Sequential(
        te.ops.MakeExtraOutput().set_extra_output_channel(0, "residual", output_to_caller=False),
        te.ops.LayerNorm(hidden),
        te.ops.Linear(hidden, ffn),
        te.ops.GELU(),
        te.ops.Linear(ffn, hidden),
        te.ops.AddExtraInput().set_extra_input_channel(0, "residual"),
    )


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
