"""The communication ops (AllGather, ReduceScatter, AllReduce) on 2 CPU ranks with gloo: forward
and backward on each rank equal a single-process autograd computation of the same sums and
concatenations, fp32 and bf16, and compiled (fullgraph) equal to eager; a one-rank group is the
identity; a dim 0 that does not divide
by the group size raises an error naming the op and the sizes.

The ranks run under tests/dist_harness.py (spawned, free port, bounded time, fail fast)."""

from __future__ import annotations

import copy

import time

import pytest
import torch
import torch.distributed as dist

import transformer_engine_cpp as te
from dist_harness import run_ranks


# ---- rank bodies (module level: spawn pickles them by name) -------------------------------------

def _data(seed, *shape, dtype):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _tol(dtype):
    return dict(rtol=0, atol=0) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)


def _check_all_gather(rank, world, dtype, group=None, group_size=None):
    group_size = group_size or world
    n, k = 3, 5
    shards = [_data(10 + r, n, k, dtype=dtype) for r in range(group_size)]
    dys = [_data(20 + r, n * group_size, k, dtype=dtype) for r in range(group_size)]
    me = rank % group_size
    # single process: every rank's output is the concatenation; loss sums <y_r, dy_r>
    ref_shards = [s.clone().float().requires_grad_() for s in shards]
    full = torch.cat(ref_shards)
    sum(((full * dy.float()).sum() for dy in dys)).backward()
    x = shards[me].clone().requires_grad_()
    y = te.ops.AllGather(group)(x)
    y.backward(dys[me])
    torch.testing.assert_close(y, full.detach().to(dtype), **_tol(dtype))
    torch.testing.assert_close(x.grad, ref_shards[me].grad.to(dtype), **_tol(dtype))


def _check_reduce_scatter(rank, world, dtype, group=None, group_size=None):
    group_size = group_size or world
    n, k = 2, 4
    xs = [_data(30 + r, n * group_size, k, dtype=dtype) for r in range(group_size)]
    dys = [_data(40 + r, n, k, dtype=dtype) for r in range(group_size)]
    me = rank % group_size
    ref_xs = [t.clone().float().requires_grad_() for t in xs]
    total = sum(ref_xs)
    ref_ys = total.chunk(group_size)
    sum(((yr * dy.float()).sum() for yr, dy in zip(ref_ys, dys))).backward()
    x = xs[me].clone().requires_grad_()
    y = te.ops.ReduceScatter(group)(x)
    y.backward(dys[me])
    torch.testing.assert_close(y, ref_ys[me].detach().to(dtype), **_tol(dtype))
    torch.testing.assert_close(x.grad, ref_xs[me].grad.to(dtype), **_tol(dtype))


def _check_all_reduce(rank, world, dtype, group=None, group_size=None):
    group_size = group_size or world
    xs = [_data(50 + r, 3, 2, 4, dtype=dtype) for r in range(group_size)]
    dy = _data(60, 3, 2, 4, dtype=dtype)  # identical on every rank: the op's assumption
    me = rank % group_size
    ref_xs = [t.clone().float().requires_grad_() for t in xs]
    total = sum(ref_xs)
    (total * dy.float()).sum().backward()
    x = xs[me].clone().requires_grad_()
    before = x.detach().clone()
    y = te.ops.AllReduce(group)(x)
    torch.testing.assert_close(x.detach(), before, rtol=0, atol=0)  # input not overwritten
    y.backward(dy)
    torch.testing.assert_close(y, total.detach().to(dtype), **_tol(dtype))
    torch.testing.assert_close(x.grad, ref_xs[me].grad.to(dtype), **_tol(dtype))
    # backward is the identity (TransformerEngine), whatever reduce_in_backward says
    x2 = xs[me].clone().requires_grad_()
    dy_mine = _data(70 + me, 3, 2, 4, dtype=dtype)
    te.ops.AllReduce(group, reduce_in_backward=False)(x2).backward(dy_mine)
    torch.testing.assert_close(x2.grad, dy_mine, rtol=0, atol=0)


def _check_sequential(rank, world, dtype):
    """AllGather, ConstantScale, ReduceScatter in one Sequential: y_r = chunk r of
    world * 2 * concat(shards)."""
    n, k = 2, 3
    shards = [_data(80 + r, n, k, dtype=dtype) for r in range(world)]
    dys = [_data(90 + r, n, k, dtype=dtype) for r in range(world)]
    ref_shards = [s.clone().float().requires_grad_() for s in shards]
    full = torch.cat(ref_shards)
    ref_ys = sum([2.0 * full for _ in range(world)]).chunk(world)
    sum(((yr * dy.float()).sum() for yr, dy in zip(ref_ys, dys))).backward()
    seq = te.ops.Sequential(te.ops.AllGather(), te.ops.ConstantScale(2.0),
                            te.ops.ReduceScatter())
    x = shards[rank].clone().requires_grad_()
    y = seq(x)
    y.backward(dys[rank])
    torch.testing.assert_close(y, ref_ys[rank].detach().to(dtype), **_tol(dtype))
    torch.testing.assert_close(x.grad, ref_shards[rank].grad.to(dtype), **_tol(dtype))


def _check_compiled(rank, world, dtype):
    """The three ops under torch.compile(fullgraph=True) (functional collectives: no graph
    break), forward and backward equal to eager exactly."""
    n, k = 4, 3
    seq = te.ops.Sequential(te.ops.AllGather(), te.ops.ConstantScale(2.0), te.ops.AllReduce(),
                            te.ops.ReduceScatter())
    results = []
    for model in (seq, torch.compile(seq, backend="aot_eager", fullgraph=True)):
        x = _data(100 + rank, n, k, dtype=dtype).requires_grad_()
        y = model(x)
        y.backward(_data(110 + rank, n, k, dtype=dtype))
        results.append((y.detach(), x.grad))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


def _check_quantized_input(rank, world, single):
    """A Quantize's tensor: a one-rank group passes it on as it is (the identity, as
    TransformerEngine's), quantized; a group of several reduces its dequantization."""
    x = _data(120 + rank, 4, 32, dtype=torch.float32)
    with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        xq = te.ops.Sequential(te.ops.Quantize())(x)
        y_one = te.ops.Sequential(te.ops.Quantize(), te.ops.AllReduce(single))(x)
        y_all = te.ops.Sequential(te.ops.Quantize(), te.ops.AllReduce())(x)
    assert isinstance(y_one, te.Float8Tensor), type(y_one)
    assert torch.equal(y_one.dequantize(), xq.dequantize())
    total = xq.dequantize().clone()
    dist.all_reduce(total)
    assert type(y_all) is torch.Tensor and torch.equal(y_all, total)
    # before a trained linear, after an op the backward does not reach: the one-rank group
    # hands the linear the copies its wgrad reads (as a Quantize does)
    model = te.ops.Sequential(te.ops.ReLU(), te.ops.Quantize(), te.ops.AllReduce(single),
                              te.ops.Linear(32, 32))
    grads = []
    for input_grad in (False, True):
        run = copy.deepcopy(model)
        with te.autocast(recipe=te.recipe.MXFP8BlockScaling()):
            run(_data(130 + rank, 32, 32, dtype=torch.float32).requires_grad_(input_grad)).sum(
            ).backward()
        grads.append(run[-1].weight.grad)
    assert torch.equal(*grads)


def _body_correctness(rank, world):
    singles = [dist.new_group([r]) for r in range(world)]  # every rank creates every group
    done = []
    for dtype in (torch.float32, torch.bfloat16):
        for check in (_check_all_gather, _check_reduce_scatter, _check_all_reduce):
            check(rank, world, dtype)
            check(rank, world, dtype, group=singles[rank], group_size=1)  # identity
            done.append(f"{check.__name__}[{dtype}]")
        _check_sequential(rank, world, dtype)
        done.append(f"sequential[{dtype}]")
        _check_compiled(rank, world, dtype)
        done.append(f"compiled[{dtype}]")
    _check_quantized_input(rank, world, singles[rank])
    done.append("quantized input")
    return done


def _body_errors(rank, world):
    messages = []
    x = torch.randn(3, 4, requires_grad=True)
    try:
        te.ops.ReduceScatter()(x)
    except RuntimeError as e:
        messages.append(str(e))
    try:
        te.ops.AllGather()(torch.tensor(1.0))
    except RuntimeError as e:
        messages.append(str(e))
    dist.barrier()
    return messages


def _body_rank1_fails(rank, world):
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    dist.barrier()  # rank 0 would wait here for the collective timeout without the harness
    return "rank 0 passed the barrier"


# ---- tests --------------------------------------------------------------------------------------

def test_communication_ops_match_single_process():
    done = run_ranks(_body_correctness)
    assert done[0] == done[1] and len(done[0]) == 11


def test_indivisible_dim0_names_the_op_and_sizes():
    for msgs in run_ranks(_body_errors):
        assert len(msgs) == 2, msgs
        assert "ReduceScatter" in msgs[0] and "[3, 4]" in msgs[0] and "2 processes" in msgs[0]
        assert "AllGather" in msgs[1] and "0-d" in msgs[1]


def test_failing_rank_fails_fast():
    start = time.monotonic()
    with pytest.raises(AssertionError, match="rank 1 fails on purpose"):
        run_ranks(_body_rank1_fails)
    assert time.monotonic() - start < 30  # not the 30 s collective timeout plus start-up


def test_uninitialized_process_group_is_a_clear_error():
    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    for op in (te.ops.AllGather(), te.ops.ReduceScatter(), te.ops.AllReduce()):
        with pytest.raises(RuntimeError, match=f"{type(op).__name__}: torch.distributed is not "
                                               "initialized"):
            op(torch.randn(2, 2))
