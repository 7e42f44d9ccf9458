"""L2Normalization beyond the conformance cases: TransformerEngine's test shapes (a 1-D input
included), float64 against the float64 reference with fp64 tolerances, an all-zero row, and
results independent of the thread count."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_cpp as te
from transformer_engine_cpp.testing import reference as ref

from tolerances import tols


def _check(shape, dtype, eps=1e-6, x_scale=1.0):
    torch.manual_seed(0)
    x = (torch.randn(shape) * x_scale).to(dtype).requires_grad_()
    dy = torch.randn(shape).to(dtype)
    y = te.ops.L2Normalization(eps=eps)(x)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    y64 = ref.l2normalization(x64, eps)
    y64.backward(dy.double())
    torch.testing.assert_close(y.double(), y64, **tols(dtype))
    torch.testing.assert_close(x.grad.double(), x64.grad, **tols(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64],
                         ids=["fp32", "bf16", "fp64"])
@pytest.mark.parametrize("shape", [(32,), (6, 16, 64), (32, 64)], ids=str)
def test_anchor_shapes(shape, dtype):
    _check(shape, dtype)


def test_eps_matters_for_small_rows():
    """Rows of norm ~1e-3 with eps = 1e-4: eps dominates the sum of squares."""
    _check((4, 10), torch.float64, eps=1e-4, x_scale=1e-3)


def test_zero_row_gives_zero_output_and_finite_gradient():
    x = torch.zeros(2, 8, requires_grad=True)
    y = te.ops.L2Normalization()(x)
    y.backward(torch.ones_like(y))
    assert torch.equal(y, torch.zeros_like(y))
    # dx = r dy with r = 1 / sqrt(eps): the reference's value too
    torch.testing.assert_close(x.grad, torch.full_like(x, 1e-6 ** -0.5))


def test_independent_of_the_thread_count():
    x = torch.randn(4096, 96)
    dy = torch.randn(4096, 96)
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, max(2, threads)):
            torch.set_num_threads(n)
            y, r = torch.ops.te_cpp.l2normalization_fwd(x, 1e-6)
            outs.append((y, r, torch.ops.te_cpp.l2normalization_bwd(dy, x, r)))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*outs):
        assert torch.equal(a, b)
