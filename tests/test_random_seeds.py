"""te_cpp.random_seeds, the seed source of the stochastic ops (Dropout's mask, NVFP4's
stochastic rounding): it draws as torch.randint does, so eager runs are reproducible from
torch.manual_seed, and a compiled graph (aot_eager or inductor) draws the same values in the
same order, neither merging two draws (CSE) nor replacing them with inductor's generator."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import transformer_engine_cpp  # noqa: F401  (loads the ops)

from harness import DEVICES, draws_from_generator, skip_missing_cuda_kernel

random_seeds = torch.ops.te_cpp.random_seeds.default
HIGH = 2**62


def test_is_tagged_as_drawing_from_the_generator():
    assert draws_from_generator(random_seeds)
    assert not draws_from_generator(torch.ops.te_cpp.dropout_fwd.default)


@pytest.mark.parametrize("device", DEVICES)
def test_draws_as_torch_randint(device):
    with skip_missing_cuda_kernel():
        like = torch.empty(3, 5, dtype=torch.bfloat16, device=device)
        for n in (0, 1, 7):
            torch.manual_seed(11 + n)
            seeds = random_seeds(like, n)
            torch.manual_seed(11 + n)
            expected = torch.randint(0, HIGH, (n,), dtype=torch.int64, device=device)
            assert seeds.dtype == torch.int64 and seeds.device == like.device
            assert torch.equal(seeds, expected)


def test_seeds_are_in_range_and_each_call_draws_new_ones():
    like = torch.empty(0)
    a, b = random_seeds(like, 1000), random_seeds(like, 1000)
    assert int(a.min()) >= 0 and int(a.max()) < HIGH
    assert int(a.max()) > HIGH // 2  # the upper half of the range is reached
    assert not torch.equal(a, b)


def test_meta_shape_and_bad_n():
    with FakeTensorMode():
        seeds = random_seeds(torch.empty(2, 3, dtype=torch.float16), 4)
    assert seeds.shape == (4,) and seeds.dtype == torch.int64
    with pytest.raises(ValueError, match=r"te_cpp\.random_seeds: .*n must be >= 0, got -2"):
        random_seeds(torch.empty(2), -2)
    with FakeTensorMode(), pytest.raises(ValueError, match=r"te_cpp\.random_seeds: .*-1"):
        random_seeds(torch.empty(2), -1)


def _three_draws(x):
    # two calls with the same arguments, which are not graph outputs themselves (AOTAutograd
    # CSEs the graphs it partitions for a backward: it must keep both), and one after them
    a = random_seeds(x, 2)
    b = random_seeds(x, 2)
    c = random_seeds(x * 2.0, 3)
    return torch.stack([a, b]), c, x * 3.0


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_draws_equal_eager_draws(backend):
    x = torch.randn(4, 8, requires_grad=True)
    torch.manual_seed(5)
    eager = _three_draws(x)
    torch.manual_seed(5)
    compiled = torch.compile(_three_draws, backend=backend, fullgraph=True)(x)
    compiled[2].sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 3.0))
    assert not torch.equal(eager[0][0], eager[0][1])
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)
    # the generator advanced as in eager: the next draw is eager's next draw too
    after_compiled = random_seeds(x, 1)
    torch.manual_seed(5)
    _three_draws(x)
    assert torch.equal(random_seeds(x, 1), after_compiled)
