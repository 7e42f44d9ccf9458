"""Invalid constructor arguments raise a clear error naming the op and the value."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_engine_cpp as te

BAD_CONSTRUCTORS = [
    (lambda: te.ops.Bias(0), ValueError, r"Bias: size must be a positive int, got 0"),
    (lambda: te.ops.Bias(4.5), ValueError, r"Bias: size must be a positive int, got 4.5"),
    (lambda: te.ops.Bias(4, dtype=torch.int32), ValueError, r"Bias: unsupported dtype torch.int32"),
    (lambda: te.ops.Bias(4, tensor_parallel=True), RuntimeError,
     r"Bias: torch.distributed is not initialized"),
    (lambda: te.ops.Bias(4, tensor_parallel=1), TypeError, r"Bias: tensor_parallel must be a bool"),
    (lambda: te.ops.ConstantScale(math.nan), ValueError, r"ConstantScale: scale must be a finite"),
    (lambda: te.ops.ConstantScale("2"), ValueError, r"ConstantScale: scale must be a finite"),
    (lambda: te.ops.Reshape((-1, -1)), ValueError, r"Reshape: invalid shape \(-1, -1\)"),
    (lambda: te.ops.Reshape((2.0, 3)), TypeError, r"Reshape: shape must be a sequence of ints"),
    (lambda: te.ops.AddExtraInput(in_place="yes"), TypeError, r"AddExtraInput: in_place must be"),
    (lambda: te.ops.MakeExtraOutput(in_place=1), TypeError, r"MakeExtraOutput: in_place must be"),
    (lambda: te.ops.SwiGLU(glu_interleave_size=0), ValueError,
     r"SwiGLU: glu_interleave_size must be a positive int or None, got 0"),
    (lambda: te.ops.ClampedSwiGLU(limit=-1.0), ValueError, r"ClampedSwiGLU: limit must be > 0"),
    (lambda: te.ops.ClampedSwiGLU(alpha=math.inf), ValueError,
     r"ClampedSwiGLU: alpha must be a finite number"),
    (lambda: te.ops.SiTUGLU(beta1=0.0), ValueError, r"SiTUGLU: beta1 must be finite and > 0"),
    (lambda: te.ops.SiTUGLU(beta2=math.nan), ValueError, r"SiTUGLU: beta2 must be finite and > 0"),
    (lambda: te.ops.LayerNorm(0), ValueError, r"LayerNorm: normalized_shape must be positive ints"),
    (lambda: te.ops.RMSNorm((4, -1)), ValueError, r"RMSNorm: normalized_shape must be positive"),
    (lambda: te.ops.LayerNorm("4"), ValueError, r"LayerNorm: normalized_shape must be positive"),
    (lambda: te.ops.LayerNorm(None), TypeError, r"LayerNorm: normalized_shape must be an int or a"),
    (lambda: te.ops.RMSNorm(4, eps=-1.0), ValueError, r"RMSNorm: eps must be a finite number >= 0"),
    (lambda: te.ops.LayerNorm(4, eps=float("inf")), ValueError, r"LayerNorm: eps must be a finite"),
    (lambda: te.ops.LayerNorm(4, zero_centered_gamma=1), TypeError,
     r"LayerNorm: zero_centered_gamma must be a bool"),
    (lambda: te.ops.RMSNorm(4, sm_margin=-2), ValueError, r"RMSNorm: sm_margin must be a non-negative"),
    (lambda: te.ops.LayerNorm(4, sm_margin={"fwd": 1}), ValueError,
     r"LayerNorm: unknown sm_margin keys \['fwd'\]"),
    (lambda: te.ops.RMSNorm(4, dtype=torch.int64), ValueError, r"RMSNorm: unsupported dtype"),
    (lambda: te.ops.GELU(cache_quantized_input=1), TypeError,
     r"GELU: cache_quantized_input must be a bool"),
    (lambda: te.ops.ScaledSwiGLU(activation_recompute_in_mlp=True), ValueError,
     r"ScaledSwiGLU does not support activation recomputation"),
    (lambda: te.ops.ScaledClampedQGeGLU(activation_recompute_in_mlp=True), ValueError,
     r"ScaledClampedQGeGLU does not support activation recomputation"),
    (lambda: te.ops.ScaledSiTUGLU(activation_recompute_in_mlp=True), ValueError,
     r"ScaledSiTUGLU does not support activation recomputation"),
    (lambda: te.ops.ScaledSReLU(activation_recompute_in_mlp=1), TypeError,
     r"ScaledSReLU: activation_recompute_in_mlp must be a bool, got int"),
    (lambda: te.ops.ScaledSwiGLU(0), ValueError,
     r"ScaledSwiGLU: glu_interleave_size must be a positive int or None, got 0"),
    (lambda: te.ops.ScaledClampedQGeGLU(limit=0.0), ValueError,
     r"ScaledClampedQGeGLU: limit must be > 0, got 0.0"),
    (lambda: te.ops.ScaledClampedQGeGLU(glu_linear_offset=math.inf), ValueError,
     r"ScaledClampedQGeGLU: glu_linear_offset must be a finite number, got inf"),
    (lambda: te.ops.ScaledSiTUGLU(beta2=-1.0), ValueError,
     r"ScaledSiTUGLU: beta2 must be finite and > 0, got -1.0"),
    (lambda: te.ops.Dropout(1.0), ValueError,
     r"Dropout: p must be a number in \[0, 1\), got 1.0"),
    (lambda: te.ops.Dropout(-0.1), ValueError,
     r"Dropout: p must be a number in \[0, 1\), got -0.1"),
    (lambda: te.ops.Dropout("0.5"), ValueError,
     r"Dropout: p must be a number in \[0, 1\), got '0.5'"),
    (lambda: te.ops.Dropout(True), ValueError,
     r"Dropout: p must be a number in \[0, 1\), got True"),
    (lambda: te.ops.L2Normalization(eps=-1e-3), ValueError,
     r"L2Normalization: eps must be a finite number >= 0, got -0.001"),
    (lambda: te.ops.L2Normalization(eps=math.nan), ValueError,
     r"L2Normalization: eps must be a finite number >= 0, got nan"),
    (lambda: te.ops.L2Normalization(seq_length=0), ValueError,
     r"L2Normalization: seq_length must be a positive int or None, got 0"),
    (lambda: te.ops.L2Normalization(micro_batch_size=2.0), ValueError,
     r"L2Normalization: micro_batch_size must be a positive int or None, got 2.0"),
]


@pytest.mark.parametrize("make,exc,match", BAD_CONSTRUCTORS,
                         ids=[m.split(":")[0].replace("\\", "") + str(i)
                              for i, (_, _, m) in enumerate(BAD_CONSTRUCTORS)])
def test_bad_constructor_arguments(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_defaults_follow_the_anchor():
    assert te.ops.Bias(3).bias.dtype == torch.get_default_dtype()
    assert torch.equal(te.ops.Bias(3).bias, torch.zeros(3))  # TransformerEngine zero-initialises
    c = te.ops.ClampedSwiGLU()
    assert (c.limit, c.alpha, c.glu_linear_offset) == (7.0, 1.702, 1.0)
    s = te.ops.SiTUGLU()
    assert (s.beta1, s.beta2) == (4.0, 25.0)
    assert te.ops.SwiGLU().glu_interleave_size is None
    q = te.ops.ScaledClampedQGeGLU()
    assert (q.limit, q.alpha, q.glu_linear_offset, q.glu_interleave_size) == (7.0, 1.702, 1.0, None)
    t = te.ops.ScaledSiTUGLU(32)  # glu_interleave_size is positional, as in TransformerEngine
    assert (t.beta1, t.beta2, t.glu_interleave_size) == (4.0, 25.0, 32)
    assert te.ops.ScaledSwiGLU().num_extra_inputs == 1
    assert te.ops.ScaledSReLU(activation_recompute_in_mlp=True).activation_recompute_in_mlp
    assert te.ops.Dropout(0.25).dropout_probability == 0.25
    l2 = te.ops.L2Normalization()
    assert (l2.eps, l2.seq_length, l2.micro_batch_size) == (1e-6, None, None)
    l2 = te.ops.L2Normalization(eps=0.25, seq_length=128, micro_batch_size=4)
    assert (l2.eps, l2.seq_length, l2.micro_batch_size) == (0.25, 128, 4)


def test_bias_on_the_meta_device_materialises_on_first_use():
    bias = te.ops.Bias(5, device="meta")
    assert bias.bias.device.type == "meta"
    seq = te.ops.Sequential(bias, te.ops.ReLU())
    y = seq(torch.ones(2, 5, requires_grad=True))
    assert bias.bias.device.type == "cpu" and torch.equal(bias.bias, torch.zeros(5))
    y.sum().backward()
    assert bias.bias.grad is not None  # the fuser used the materialised parameter
