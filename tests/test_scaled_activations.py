"""Scaled activations beyond the conformance cases: every combination of which of (input,
scales) requires grad (fp32, and fp64 with fp64 tolerances), 1-D inputs with 0-d scales,
dscales dtype, and ScaledSReLU's activation_recompute_in_mlp refusal at run time."""

from __future__ import annotations

import functools

import pytest
import torch

import transformer_engine_cpp as te

from activations import SCALED, reference
from tolerances import tols

# constructor arguments that reach the clamps and the tanh saturation at these inputs
_CTOR = {te.ops.ScaledClampedQGeGLU: dict(limit=0.75, glu_linear_offset=0.0),
         te.ops.ScaledSiTUGLU: dict(beta1=3.0, beta2=12.0)}

# every scaled activation (the activation table), and an interleaved one
OPS = {cls.__name__: functools.partial(cls, **_CTOR.get(cls, {})) for cls in SCALED}
OPS["ScaledSwiGLU(interleave=8)"] = functools.partial(te.ops.ScaledSwiGLU, 8)


def _run(name, shape, dtype, x_rg, s_rg, scales_dtype=None):
    op = OPS[name]()
    ref_fn = reference(op)
    torch.manual_seed(0)
    x = torch.randn(shape).to(dtype).requires_grad_(x_rg)
    s = torch.randn(shape[:-1]).to(scales_dtype or dtype).requires_grad_(s_rg)
    y = op(x, s)
    dy = torch.randn(y.shape).to(dtype)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_(x_rg)
    s64 = s.detach().double().requires_grad_(s_rg)
    y64 = ref_fn(x64, s64)
    y64.backward(dy.double())
    return (x, s, y), (x64, s64, y64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("x_rg,s_rg", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("name", list(OPS))
def test_grad_requirements(name, x_rg, s_rg, dtype):
    (x, s, y), (x64, s64, y64) = _run(name, (5, 7, 32), dtype, x_rg, s_rg)
    tol = tols(dtype)
    torch.testing.assert_close(y.double(), y64, **tol)
    if x_rg:
        torch.testing.assert_close(x.grad.double(), x64.grad, **tol)
    else:
        assert x.grad is None
    if s_rg:
        torch.testing.assert_close(s.grad.double(), s64.grad, **tol)
    else:
        assert s.grad is None


@pytest.mark.parametrize("name", list(OPS))
def test_vector_input_with_0d_scales(name):
    (x, s, y), (x64, s64, y64) = _run(name, (32,), torch.float32, True, True)
    assert s.shape == () and s.grad.shape == ()
    tol = tols(torch.float32)
    torch.testing.assert_close(y.double(), y64, **tol)
    torch.testing.assert_close(x.grad.double(), x64.grad, **tol)
    torch.testing.assert_close(s.grad.double(), s64.grad, **tol)


def test_scales_keep_their_dtype():
    """fp32 scales on a bf16 input: y and dx are bf16, d(scales) is fp32 and, reduced in fp32
    from the unrounded products, as accurate as an fp32 result."""
    (x, s, y), (x64, s64, y64) = _run("ScaledSwiGLU", (4, 64), torch.bfloat16, True, True,
                                      scales_dtype=torch.float32)
    assert y.dtype == x.grad.dtype == torch.bfloat16 and s.grad.dtype == torch.float32
    torch.testing.assert_close(s.grad.double(), s64.grad, **tols(torch.float32))
    torch.testing.assert_close(y.double(), y64, **tols(torch.bfloat16))


def test_compute_dscales_false_returns_an_empty_tensor():
    x, s, dy = torch.randn(3, 8), torch.randn(3), torch.randn(3, 4)
    dx, ds = torch.ops.te_cpp.scaled_swiglu_bwd(dy, x, s, False)
    dx2, ds2 = torch.ops.te_cpp.scaled_swiglu_bwd(dy, x, s, True)
    assert ds.shape == (0,) and ds2.shape == (3,)
    torch.testing.assert_close(dx, dx2, rtol=0, atol=0)


def test_scaled_srelu_activation_recompute_in_mlp_raises_at_run_time():
    op = te.ops.ScaledSReLU(activation_recompute_in_mlp=True)
    with pytest.raises(RuntimeError, match=r"ScaledSReLU\(activation_recompute_in_mlp=True\) "
                                           r"needs the fused grouped MLP path"):
        op(torch.randn(2, 4), torch.randn(2))


@pytest.mark.slow
def test_in_a_pipeline_with_a_bias_and_inductor():
    """Bias + ScaledSwiGLU + ConstantScale compiled with inductor matches eager."""
    def make():
        torch.manual_seed(1)
        seq = te.ops.Sequential(te.ops.Bias(16), te.ops.ScaledSwiGLU(4), te.ops.ConstantScale(0.5))
        with torch.no_grad():
            seq[0].bias.copy_(torch.randn(16))
        return seq

    eager, comp = make(), make()
    x = torch.randn(6, 16, requires_grad=True)
    s = torch.randn(6, requires_grad=True)
    xc, sc = [t.detach().clone().requires_grad_() for t in (x, s)]
    dy = torch.randn(6, 8)
    y = eager(x, s)
    y.backward(dy)
    compiled = torch.compile(comp, backend="inductor", fullgraph=True)
    yc = compiled(xc, sc)
    yc.backward(dy)
    torch.testing.assert_close(yc, y, rtol=0, atol=0)
    for a, b in [(xc.grad, x.grad), (sc.grad, s.grad), (comp[0].bias.grad, eager[0].bias.grad)]:
        torch.testing.assert_close(a, b, rtol=0, atol=0)
