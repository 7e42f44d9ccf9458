"""GroupedLinear against a float64 reference of one torch.nn.functional.linear per split:
uneven splits, empty groups, one-row groups, every row in one group, scale_bias, frozen weights,
inputs without grad, accumulate_into_main_grad, delay_wgrad_compute, compiled equal to eager,
TransformerEngine's parameter names, and the errors (split count, sum, dtype)."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_cpp as te
from tolerances import COMPILED_VS_EAGER, tols

SPLITS = {
    "uneven": [3, 5, 1, 7],
    "empty_groups": [0, 6, 0, 4],
    "one_row_groups": [1, 1, 1, 1],
    "all_in_one": [0, 0, 9, 0],
}
IN, OUT = 16, 12


def _reference(x, splits, weights, biases, scales):
    """float64: one linear per split, concatenated (the bias scaled per row with scales)."""
    outs, r = [], 0
    for g, n in enumerate(splits):
        y = torch.nn.functional.linear(x[r:r + n], weights[g])
        if biases:
            y = y + (biases[g] if scales is None else scales[r:r + n, None] * biases[g])
        outs.append(y)
        r += n
    return torch.cat(outs)


def _model(splits, dtype, *, bias=True, scale_bias=False, **kwargs):
    op = te.ops.GroupedLinear(len(splits), IN, OUT, bias=bias, dtype=dtype,
                              scale_bias=scale_bias, **kwargs)
    with torch.no_grad():  # non-zero biases, so that their use is checked
        for b in op.biases():
            b.uniform_(-1, 1)
    return op


def _run(op, splits, dtype, *, scale_bias=False, x_grad=True, seed=0, model=None):
    g = torch.Generator().manual_seed(seed)
    total = sum(splits)
    x = torch.randn(total, IN, generator=g).to(dtype).requires_grad_(x_grad)
    scales = torch.rand(total, generator=g).to(dtype).requires_grad_() if scale_bias else None
    dy = torch.randn(total, OUT, generator=g).to(dtype)
    split_t = torch.tensor(splits)
    model = model or te.ops.Sequential(op)
    y = model(x, split_t, scales) if scale_bias else model(x, split_t)
    y.backward(dy)
    return x, scales, dy, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale_bias", [False, True])
@pytest.mark.parametrize("splits", list(SPLITS.values()), ids=list(SPLITS))
def test_matches_float64_linears(splits, scale_bias, dtype):
    op = _model(splits, dtype, scale_bias=scale_bias)
    x, scales, dy, y = _run(op, splits, dtype, scale_bias=scale_bias)
    xr = x.detach().double().requires_grad_()
    sr = scales.detach().double().requires_grad_() if scale_bias else None
    wr = [w.detach().double().requires_grad_() for w in op.weights()]
    br = [b.detach().double().requires_grad_() for b in op.biases()]
    yr = _reference(xr, splits, wr, br, sr)
    yr.backward(dy.double())
    t = tols(dtype)
    torch.testing.assert_close(y.double(), yr, **t)
    torch.testing.assert_close(x.grad.double(), xr.grad, **t)
    for w, ref in zip(op.weights(), wr):
        torch.testing.assert_close(w.grad.double(), ref.grad, **t)
    for b, ref in zip(op.biases(), br):
        torch.testing.assert_close(b.grad.double(), ref.grad, **t)
    if scale_bias:
        torch.testing.assert_close(scales.grad.double(), sr.grad, **t)


def test_empty_group_gets_zero_gradients():
    splits = SPLITS["empty_groups"]
    op = _model(splits, torch.float32)
    _run(op, splits, torch.float32)
    for g in (0, 2):
        assert torch.count_nonzero(op.weights()[g].grad) == 0
        assert torch.count_nonzero(op.biases()[g].grad) == 0


def test_leading_dims_and_no_bias():
    splits = [2, 4, 0, 6]
    op = te.ops.GroupedLinear(4, IN, OUT, bias=False, dtype=torch.float64)
    x = torch.randn(3, 4, IN, dtype=torch.float64, requires_grad=True)
    y = te.ops.Sequential(op)(x, torch.tensor(splits))
    assert y.shape == (3, 4, OUT)
    ref = _reference(x.detach().reshape(-1, IN), splits, [w.detach() for w in op.weights()],
                     [], None)
    torch.testing.assert_close(y.detach().reshape(-1, OUT), ref, **tols(torch.float64))
    assert [n for n, _ in op.named_parameters()] == [f"weight{i}" for i in range(4)]


def test_parameter_names_are_transformer_engines():
    op = te.ops.GroupedLinear(3, 4, 5)
    assert [n for n, _ in op.named_parameters()] == [
        "weight0", "weight1", "weight2", "bias0", "bias1", "bias2"]
    assert all(w.shape == (5, 4) for w in op.weights())
    assert all(torch.count_nonzero(b) == 0 for b in op.biases())


def test_frozen_weights_and_input_without_grad():
    splits = SPLITS["uneven"]
    op = _model(splits, torch.float32)
    for w in op.weights():
        w.requires_grad_(False)
    x, _, dy, _ = _run(op, splits, torch.float32, x_grad=False)
    assert all(w.grad is None for w in op.weights())
    assert x.grad is None
    ref = torch.cat([dy[r:r + n].sum(0, keepdim=True) for r, n in
                     zip([0, 3, 8, 9], splits)])
    for b, db in zip(op.biases(), ref):
        torch.testing.assert_close(b.grad, db, **tols(torch.float32))


def test_accumulate_into_main_grad():
    splits = SPLITS["uneven"]
    op = _model(splits, torch.float32, accumulate_into_main_grad=True)
    ref = _model(splits, torch.float32)
    ref.load_state_dict(op.state_dict())
    for w in op.weights():
        w.main_grad = torch.full_like(w, 0.5)
    _run(op, splits, torch.float32)
    _run(ref, splits, torch.float32)
    for w, wr in zip(op.weights(), ref.weights()):
        assert w.grad is None
        torch.testing.assert_close(w.main_grad, wr.grad + 0.5, **tols(torch.float32))


def test_delay_wgrad_compute():
    splits = SPLITS["uneven"]
    op = _model(splits, torch.float32, delay_wgrad_compute=True)
    ref = _model(splits, torch.float32)
    ref.load_state_dict(op.state_dict())
    x, _, _, _ = _run(op, splits, torch.float32)
    xr, _, _, _ = _run(ref, splits, torch.float32)
    assert op.need_backward_dw() and all(w.grad is None for w in op.weights())
    torch.testing.assert_close(x.grad, xr.grad, rtol=0, atol=0)
    op.backward_dw()
    for w, wr in zip(op.weights(), ref.weights()):
        torch.testing.assert_close(w.grad, wr.grad, rtol=0, atol=0)
    for b, br in zip(op.biases(), ref.biases()):  # biases are computed in the main backward
        torch.testing.assert_close(b.grad, br.grad, rtol=0, atol=0)


@pytest.mark.parametrize("scale_bias", [False, True])
def test_compiled_equals_eager(scale_bias):
    splits = SPLITS["empty_groups"]
    eager = _model(splits, torch.float32, scale_bias=scale_bias)
    comp = _model(splits, torch.float32, scale_bias=scale_bias)
    comp.load_state_dict(eager.state_dict())
    compiled = torch.compile(te.ops.Sequential(comp), backend="aot_eager", fullgraph=True)
    outs = []
    for op, model in ((eager, None), (comp, compiled)):
        x, scales, _, y = _run(op, splits, torch.float32, scale_bias=scale_bias, model=model)
        outs.append([y, x.grad, *[p.grad for p in op.parameters()]]
                    + ([scales.grad] if scale_bias else []))
    for e, c in zip(*outs):
        torch.testing.assert_close(c, e, **COMPILED_VS_EAGER)
    # other split values, same shapes: no recompilation needed for the values
    _run(comp, [4, 2, 3, 1], torch.float32, scale_bias=scale_bias, model=compiled)


def test_bad_split_sizes_are_clear_errors():
    op = te.ops.Sequential(te.ops.GroupedLinear(3, IN, OUT))
    x = torch.randn(6, IN)
    with pytest.raises(ValueError, match=r"GroupedLinear: expected 3 split sizes, got shape \[2\]"):
        op(x, torch.tensor([3, 3]))
    with pytest.raises(TypeError, match="GroupedLinear: the split sizes must be an integer"):
        op(x, torch.tensor([2.0, 2.0, 2.0]))
    with pytest.raises(RuntimeError, match="grouped_linear_fwd.*sum to 5.*6"):
        op(x, torch.tensor([2, 2, 1]))
    with pytest.raises(RuntimeError, match="grouped_linear_fwd.*-1"):
        op(x, torch.tensor([4, 3, -1]))
    with pytest.raises(ValueError, match="GroupedLinear: input's last dimension"):
        op(torch.randn(6, IN + 1), torch.tensor([2, 2, 2]))


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="GroupedLinear: num_groups must be a positive int"):
        te.ops.GroupedLinear(0, 4, 4)
    with pytest.raises(ValueError, match="GroupedLinear: unsupported dtype torch.int32"):
        te.ops.GroupedLinear(2, 4, 4, dtype=torch.int32)
    with pytest.raises(TypeError, match="GroupedLinear: scale_bias must be a bool"):
        te.ops.GroupedLinear(2, 4, 4, scale_bias=1)
    with pytest.warns(UserWarning, match="NVTE_GROUPED_LINEAR_SINGLE_PARAM"):
        op = te.ops.GroupedLinear(2, 4, 4, single_grouped_weight=True)
    assert not op.single_grouped_weight


def test_moe_block_trains_like_plain_pytorch():
    """A top-2 MoE MLP: softmax router, tokens permuted to their experts with argsort,
    GroupedLinear -> GELU -> GroupedLinear, un-permuted and summed with the router weights;
    3 SGD steps equal to a plain-PyTorch loop over experts (float64)."""
    torch.manual_seed(0)
    experts, tokens, hidden, ffn, k = 4, 24, 8, 16, 2
    router = torch.nn.Linear(hidden, experts, dtype=torch.float64)
    fc1 = te.ops.GroupedLinear(experts, hidden, ffn, dtype=torch.float64)
    fc2 = te.ops.GroupedLinear(experts, ffn, hidden, dtype=torch.float64)
    mlp = te.ops.Sequential(fc1, te.ops.GELU(), fc2)
    w1 = [w.detach().clone().requires_grad_() for w in fc1.weights()]
    b1 = [b.detach().clone().requires_grad_() for b in fc1.biases()]
    w2 = [w.detach().clone().requires_grad_() for w in fc2.weights()]
    b2 = [b.detach().clone().requires_grad_() for b in fc2.biases()]
    router_ref = torch.nn.Linear(hidden, experts, dtype=torch.float64)
    router_ref.load_state_dict(router.state_dict())
    x = torch.randn(tokens, hidden, dtype=torch.float64)
    target = torch.randn(tokens, hidden, dtype=torch.float64)

    def route(r):
        probs = torch.softmax(r(x), dim=-1)
        top_p, top_e = probs.topk(k, dim=-1)
        flat_e = top_e.reshape(-1)
        order = torch.argsort(flat_e, stable=True)
        counts = torch.bincount(flat_e, minlength=experts)
        return top_p.reshape(-1), order, counts

    def ours():
        p, order, counts = route(router)
        xs = x.repeat_interleave(k, dim=0)[order]
        ys = mlp(xs, counts, counts)  # each GroupedLinear takes its split sizes
        out = torch.zeros(tokens * k, hidden, dtype=x.dtype).index_copy(0, order, ys)
        return (out * p[:, None]).reshape(tokens, k, hidden).sum(1)

    def plain():
        p, order, counts = route(router_ref)
        xs = x.repeat_interleave(k, dim=0)[order]
        outs, r = [], 0
        for e, n in enumerate(counts.tolist()):
            h = torch.nn.functional.gelu(torch.nn.functional.linear(xs[r:r + n], w1[e], b1[e]),
                                         approximate="tanh")
            outs.append(torch.nn.functional.linear(h, w2[e], b2[e]))
            r += n
        out = torch.zeros(tokens * k, hidden, dtype=x.dtype).index_copy(0, order, torch.cat(outs))
        return (out * p[:, None]).reshape(tokens, k, hidden).sum(1)

    params = [*router.parameters(), *mlp.parameters()]
    params_ref = [*router_ref.parameters(), *w1, *b1, *w2, *b2]
    opt = torch.optim.SGD(params, lr=0.1)
    opt_ref = torch.optim.SGD(params_ref, lr=0.1)
    for _ in range(3):
        for o, f in ((opt, ours), (opt_ref, plain)):
            o.zero_grad()
            loss = torch.nn.functional.mse_loss(f(), target)
            loss.backward()
            o.step()
            if o is opt:
                loss_ours = loss.detach()
            else:
                torch.testing.assert_close(loss_ours, loss.detach(), **tols(torch.float64))


# ---- the fused grouped MLP -------------------------------------------------------------------

def _mlp(act, experts=4, hidden=16, ffn=32, dtype=torch.float32):
    fc1_out = 2 * ffn if act.gated else ffn
    return te.ops.Sequential(te.ops.GroupedLinear(experts, hidden, fc1_out, dtype=dtype), act,
                             te.ops.GroupedLinear(experts, ffn, hidden, dtype=dtype))


def _mlp_step(model, splits, seed=0, hidden=16):
    g = torch.Generator().manual_seed(seed)
    total = sum(splits)
    x = torch.randn(total, hidden, generator=g, requires_grad=True)
    probs = torch.rand(total, generator=g, requires_grad=True)
    split_t = torch.tensor(splits)
    y = model(x, split_t, probs, split_t)
    y.backward(torch.randn(y.shape, generator=g))
    return [y.detach(), x.grad, probs.grad, *[p.grad for p in model.parameters()]]


@pytest.mark.parametrize("act_cls", [te.ops.ScaledSwiGLU, te.ops.ScaledClampedQGeGLU,
                                     te.ops.ScaledSReLU])
def test_grouped_mlp_is_one_fused_op_equal_to_the_unfused_ops(act_cls, fusion_registry):
    splits = [5, 0, 1, 6]
    fused = _mlp(act_cls())
    plan, = fused.fusion_plan(torch.randn(12, 16), torch.tensor(splits), torch.rand(12),
                              torch.tensor(splits), requires_grad=True)
    assert [type(op).__name__ for op, _ in plan.forward_ops] == ["GroupedMLP"]
    assert [type(op).__name__ for op, _ in plan.backward_ops] == ["GroupedMLP"]
    unfused = _mlp(act_cls())
    unfused.load_state_dict(fused.state_dict())
    te.ops.fuser.OperationFuser.extension_forward_backward_fusion_functions = ()
    te.ops.fuser.OperationFuser._fusion_registry_version += 1
    plain = _mlp_step(unfused, splits)
    plan, = unfused.fusion_plan(torch.randn(12, 16), torch.tensor(splits), torch.rand(12),
                                torch.tensor(splits), requires_grad=True)
    assert [type(op).__name__ for op, _ in plan.forward_ops] == [
        "GroupedLinear", act_cls.__name__, "GroupedLinear"]
    from transformer_engine_cpp.ops.fused import fuse_grouped_mlp
    te.ops.fuser.OperationFuser.extension_forward_backward_fusion_functions = (fuse_grouped_mlp,)
    te.ops.fuser.OperationFuser._fusion_registry_version += 1
    for a, b in zip(_mlp_step(fused, splits), plain):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_grouped_mlp_recomputes_the_activation():
    splits = [3, 4, 0, 5]
    recompute = _mlp(te.ops.ScaledSReLU(activation_recompute_in_mlp=True))
    keep = _mlp(te.ops.ScaledSReLU())
    keep.load_state_dict(recompute.state_dict())
    for a, b in zip(_mlp_step(recompute, splits), _mlp_step(keep, splits)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # unfused (a lone scaled activation), recomputation is refused
    with pytest.raises(RuntimeError, match="needs the fused grouped MLP path"):
        te.ops.Sequential(te.ops.ScaledSReLU(activation_recompute_in_mlp=True))(
            torch.randn(4, 8), torch.rand(4))


def test_grouped_mlp_compiled_equals_eager_with_the_fusion_kept():
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    splits = [2, 6, 0, 4]
    eager = _mlp(te.ops.ScaledSwiGLU())
    comp = _mlp(te.ops.ScaledSwiGLU())
    comp.load_state_dict(eager.state_dict())
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(comp, backend=backend, fullgraph=True)
    for a, b in zip(_mlp_step(compiled, splits), _mlp_step(eager, splits)):
        torch.testing.assert_close(a, b, **COMPILED_VS_EAGER)
    fw = "\n".join(g.code for g in backend.fw_graphs)
    bw = "\n".join(g.code for g in backend.bw_graphs)
    assert fw.count("te_cpp.grouped_linear_fwd.default(") == 2
    assert fw.count("te_cpp.scaled_swiglu_fwd.default(") == 1
    assert bw.count("te_cpp.grouped_linear_dgrad.default(") == 2
    assert bw.count("te_cpp.scaled_swiglu_bwd.default(") == 1
