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


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("alone", [True, False], ids=["op", "sequential"])
def test_split_sizes_not_a_tensor_is_a_clear_error(alone, grad):
    """TransformerEngine's ops take their extra inputs as tensors (GroupedLinear's split sizes
    as an integer tensor); a Python list gets a TypeError naming the op, not an
    AttributeError from inside the fuser."""
    op = te.ops.GroupedLinear(3, IN, OUT)
    model = op if alone else te.ops.Sequential(te.ops.Identity(), op)
    x = torch.randn(6, IN, requires_grad=grad)
    with torch.set_grad_enabled(grad), pytest.raises(
            TypeError, match=r"GroupedLinear: extra input 0 must be a torch\.Tensor, got list"):
        model(x, [2, 2, 2])


def test_split_sizes_not_a_tensor_under_compile_is_a_clear_error():
    """Under torch.compile(fullgraph=True) the same message on the first line (raised at trace
    time, as te.ops.CompileUnsupportedError), not Dynamo's "Observed exception"."""
    model = te.ops.Sequential(te.ops.GroupedLinear(3, IN, OUT))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with pytest.raises(te.ops.CompileUnsupportedError) as info:
        compiled(torch.randn(6, IN), [2, 2, 2])
    assert str(info.value).splitlines()[0] == (
        "GroupedLinear: extra input 0 must be a torch.Tensor, got list")


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


def _mlp_step(model, splits, seed=0, hidden=16, x_grad=True, probs_grad=True):
    g = torch.Generator().manual_seed(seed)
    total = sum(splits)
    x = torch.randn(total, hidden, generator=g, requires_grad=x_grad)
    probs = torch.rand(total, generator=g, requires_grad=probs_grad)
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
    for a, b in zip(_mlp_step(fused, splits), plain):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("reached", ["fc2", "activation and fc2"])
@pytest.mark.parametrize("act_cls", [te.ops.ScaledSwiGLU, te.ops.ScaledSReLU])
def test_grouped_mlp_whose_backward_stops_inside_it(act_cls, reached, fusion_registry):
    """The backward reaches only fc2 (an input and scales without grad, fc1 frozen) or only the
    activation and fc2 (scales that need grad): the fused step stops where the unfused ops'
    backward stops, with the same gradients (it ran the unreached ops' backward, which had
    saved nothing, and failed), eager and compiled."""
    splits = [5, 0, 1, 6]
    models = [_mlp(act_cls()) for _ in range(3)]
    for model in models:
        model.load_state_dict(models[0].state_dict())
        for p in model[0].parameters():
            p.requires_grad_(False)
    step = dict(x_grad=False, probs_grad=reached != "fc2")
    fused = _mlp_step(models[0], splits, **step)
    compiled = _mlp_step(torch.compile(models[2], fullgraph=True), splits, **step)
    for a, b in zip(compiled, fused, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    te.ops.fuser.OperationFuser.extension_forward_backward_fusion_functions = ()
    te.ops.fuser.OperationFuser._fusion_registry_version += 1
    plain = _mlp_step(models[1], splits, **step)
    for a, b in zip(fused, plain, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


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


# ---- the top-2 MoE block compiled -----------------------------------------------------------

MOE_EXPERTS, MOE_TOKENS, MOE_HIDDEN, MOE_FFN, MOE_K = 4, 24, 8, 16, 2
MOE_ACTS = ["gelu", "scaled_swiglu", "scaled_srelu_recompute"]


def _expert_counts(flat_e):
    """Tokens per expert, shape [experts]: torch.bincount, whose output length under
    torch.compile is data-dependent (GroupedLinear asserts it instead of branching on it)."""
    return torch.bincount(flat_e, minlength=MOE_EXPERTS)


def _moe_block(act):
    """A float64 router and expert MLP: GroupedLinear -> act -> GroupedLinear. With a scaled
    activation the router probabilities scale the activation (the fused GroupedMLP); with GELU
    they scale the MLP's output."""
    e, h, f = MOE_EXPERTS, MOE_HIDDEN, MOE_FFN
    router = torch.nn.Linear(h, e, dtype=torch.float64)
    op = {"gelu": te.ops.GELU, "scaled_swiglu": te.ops.ScaledSwiGLU,
          "scaled_srelu_recompute": lambda: te.ops.ScaledSReLU(activation_recompute_in_mlp=True)
          }[act]()
    fc1_out = 2 * f if act == "scaled_swiglu" else f
    mlp = te.ops.Sequential(te.ops.GroupedLinear(e, h, fc1_out, dtype=torch.float64), op,
                            te.ops.GroupedLinear(e, f, h, dtype=torch.float64))
    with torch.no_grad():  # non-zero biases, so that their use is checked
        for p in mlp.parameters():
            if p.dim() == 1:
                p.uniform_(-0.5, 0.5)
    return router, mlp


def _moe_loss(router, mlp, act, x, target):
    """Top-2 routing: softmax router, tokens permuted to their experts with argsort, the expert
    MLP, un-permuted with index_copy and summed with the router probabilities; MSE loss."""
    k = MOE_K
    probs = torch.softmax(router(x), dim=-1)
    top_p, top_e = probs.topk(k, dim=-1)
    flat_e = top_e.reshape(-1)
    order = torch.argsort(flat_e, stable=True)
    counts = _expert_counts(flat_e)
    p = top_p.reshape(-1)[order]
    xs = x.repeat_interleave(k, dim=0)[order]
    if act == "gelu":
        ys = mlp(xs, counts, counts) * p[:, None]
    else:
        ys = mlp(xs, counts, p, counts)
    out = torch.zeros_like(ys).index_copy(0, order, ys).reshape(-1, k, ys.shape[-1]).sum(1)
    return torch.nn.functional.mse_loss(out, target)


def _plain_moe_loss(router, w1, b1, w2, b2, act, x, target):
    """The same block in plain PyTorch: torch.bincount and a loop over the experts."""
    k = MOE_K
    probs = torch.softmax(router(x), dim=-1)
    top_p, top_e = probs.topk(k, dim=-1)
    flat_e = top_e.reshape(-1)
    order = torch.argsort(flat_e, stable=True)
    counts = torch.bincount(flat_e, minlength=MOE_EXPERTS)
    p = top_p.reshape(-1)[order]
    xs = x.repeat_interleave(k, dim=0)[order]
    outs, r = [], 0
    for e, n in enumerate(counts.tolist()):
        h = torch.nn.functional.linear(xs[r:r + n], w1[e], b1[e])
        if act == "gelu":
            a = torch.nn.functional.gelu(h, approximate="tanh")
        elif act == "scaled_swiglu":
            a1, a2 = h.chunk(2, dim=-1)
            a = p[r:r + n, None] * torch.nn.functional.silu(a1) * a2
        else:
            a = p[r:r + n, None] * torch.relu(h) ** 2
        y = torch.nn.functional.linear(a, w2[e], b2[e])
        outs.append(y * p[r:r + n, None] if act == "gelu" else y)
        r += n
    ys = torch.cat(outs)
    out = torch.zeros_like(ys).index_copy(0, order, ys).reshape(-1, k, ys.shape[-1]).sum(1)
    return torch.nn.functional.mse_loss(out, target)


@pytest.mark.parametrize("act", MOE_ACTS)
def test_moe_block_compiled_trains_like_eager_and_plain_pytorch(act):
    """The whole top-2 MoE step (router, permutation, GroupedLinear MLP, un-permutation,
    weighted sum, loss) under torch.compile(fullgraph=True), trained 3 SGD steps in float64:
    equal to eager exactly and to a plain-PyTorch MoE within the float64 tolerance, in one
    graph for every step's split values, with each GroupedLinear's custom ops in it (and, with
    activation recomputation, the fused GroupedMLP's recomputed activation in backward)."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    torch.manual_seed(0)
    router, mlp = _moe_block(act)
    router_c, mlp_c = _moe_block(act)
    router_c.load_state_dict(router.state_dict())
    mlp_c.load_state_dict(mlp.state_dict())
    router_p = torch.nn.Linear(MOE_HIDDEN, MOE_EXPERTS, dtype=torch.float64)
    router_p.load_state_dict(router.state_dict())
    fc1, fc2 = mlp[0], mlp[2]
    plain_w = [[t.detach().clone().requires_grad_() for t in ts]
               for ts in (fc1.weights(), fc1.biases(), fc2.weights(), fc2.biases())]
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(lambda x, t: _moe_loss(router_c, mlp_c, act, x, t),
                             backend=backend, fullgraph=True)
    runs = {
        "eager": ([*router.parameters(), *mlp.parameters()],
                  lambda x, t: _moe_loss(router, mlp, act, x, t)),
        "compiled": ([*router_c.parameters(), *mlp_c.parameters()], compiled),
        "plain": ([*router_p.parameters(), *(t for ts in plain_w for t in ts)],
                  lambda x, t: _plain_moe_loss(router_p, *plain_w, act, x, t)),
    }
    opts = {name: torch.optim.SGD(params, lr=0.5) for name, (params, _) in runs.items()}
    splits_seen = set()
    for _ in range(3):  # a new batch each step: other split values
        x0 = torch.randn(MOE_TOKENS, MOE_HIDDEN, dtype=torch.float64)
        target = torch.randn(MOE_TOKENS, MOE_HIDDEN, dtype=torch.float64)
        with torch.no_grad():
            top_e = router(x0).topk(MOE_K, dim=-1).indices.reshape(-1)
            splits_seen.add(tuple(_expert_counts(top_e).tolist()))
        got = {}
        for name, (params, fn) in runs.items():
            opts[name].zero_grad()
            x = x0.clone().requires_grad_()
            loss = fn(x, target)
            loss.backward()
            got[name] = [loss.detach(), x.grad, *[p.grad.clone() for p in params]]
            opts[name].step()
        for c, e in zip(got["compiled"], got["eager"]):
            torch.testing.assert_close(c, e, **COMPILED_VS_EAGER)
        for e, p in zip(got["eager"], got["plain"]):
            torch.testing.assert_close(e, p, **tols(torch.float64))
    assert len(splits_seen) == 3
    assert len(backend.graphs) == 1  # new split values, no recompilation
    fw = "\n".join(g.code for g in backend.fw_graphs)
    bw = "\n".join(g.code for g in backend.bw_graphs)
    assert fw.count("te_cpp.grouped_linear_fwd.default(") == 2
    assert bw.count("te_cpp.grouped_linear_dgrad.default(") == 2
    assert bw.count("te_cpp.grouped_linear_wgrad.default(") == 2
    if act != "gelu":
        stem = "scaled_swiglu" if act == "scaled_swiglu" else "scaled_srelu"
        plan, = mlp_c.fusion_plan(x0, torch.tensor([MOE_TOKENS * MOE_K, 0, 0, 0]),
                                  torch.rand(MOE_TOKENS * MOE_K, dtype=torch.float64),
                                  torch.tensor([MOE_TOKENS * MOE_K, 0, 0, 0]),
                                  requires_grad=True)
        assert [type(op).__name__ for op, _ in plan.forward_ops] == ["GroupedMLP"]
        assert fw.count(f"te_cpp.{stem}_fwd.default(") == 1
        assert bw.count(f"te_cpp.{stem}_bwd.default(") == 1
        # Only the fused GroupedMLP recomputes the activation (for fc2's wgrad): the traced
        # backward has it. (AOTAutograd's CSE then merges it with the forward's call, so the
        # partitioned backward graph reads the saved activation instead.)
        bwd_body = "\n".join(m.code for name, m in backend.graphs[0].named_modules()
                             if name.startswith("bwd_body"))
        assert bwd_body.count(f"te_cpp.{stem}_fwd(") == (act == "scaled_srelu_recompute")


# ---- the paths easy to forget ---------------------------------------------------------------

def _check_against_reference(op, x, splits, y, dy, *, scales=None, dtype=torch.float32):
    """y and every gradient of one GroupedLinear call against the float64 reference."""
    xr = x.detach().double().requires_grad_()
    sr = scales.detach().double().requires_grad_() if scales is not None else None
    wr = [w.detach().double().requires_grad_() for w in op.weights()]
    br = [b.detach().double().requires_grad_() for b in op.biases()]
    yr = _reference(xr.reshape(-1, xr.shape[-1]), splits, wr, br, sr)
    yr.backward(dy.double().reshape(yr.shape))
    t = tols(dtype)
    torch.testing.assert_close(y.detach().double().reshape(yr.shape), yr, **t)
    torch.testing.assert_close(x.grad.double(), xr.grad, **t)
    for got, ref in zip([*op.weights(), *op.biases()], [*wr, *br]):
        torch.testing.assert_close(got.grad.double(), ref.grad, **t)
    if scales is not None:
        torch.testing.assert_close(scales.grad.double(), sr.grad, **t)


@pytest.mark.parametrize("scale_bias", [False, True])
def test_inference_mode_forward(scale_bias):
    """Under torch.inference_mode the output equals the grad-mode one bitwise (and so the
    float64 reference) and is an inference tensor without autograd history."""
    splits = SPLITS["empty_groups"]
    op = _model(splits, torch.float32, scale_bias=scale_bias)
    model = te.ops.Sequential(op)
    x, scales, dy, y = _run(op, splits, torch.float32, scale_bias=scale_bias, model=model)
    _check_against_reference(op, x, splits, y, dy, scales=scales)
    extra = (torch.tensor(splits),) + ((scales.detach(),) if scale_bias else ())
    with torch.inference_mode():
        y_inf = model(x.detach(), *extra)
    assert y_inf.is_inference() and not y_inf.requires_grad
    torch.testing.assert_close(y_inf, y.detach(), rtol=0, atol=0)


def test_in_place_residual_around_grouped_linear():
    """y = x + GroupedLinear(x) with in-place residual ops (MakeExtraOutput / AddExtraInput
    with in_place=True): the in-place add writes into the input GroupedLinear saved for its
    weight gradients, which must still be the reference's."""
    splits = SPLITS["uneven"]
    op = te.ops.GroupedLinear(len(splits), IN, IN, dtype=torch.float32)
    with torch.no_grad():
        for b in op.biases():
            b.uniform_(-1, 1)
    model = te.ops.Sequential(
        te.ops.MakeExtraOutput(in_place=True).set_extra_output_channel(
            0, "res", output_to_caller=False),
        op,
        te.ops.AddExtraInput(in_place=True).set_extra_input_channel(0, "res"))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(sum(splits), IN, generator=g).requires_grad_()
    dy = torch.randn(sum(splits), IN, generator=g)
    xr = x.detach().double().requires_grad_()
    y = model(x, torch.tensor(splits))
    y.backward(dy)
    wr = [w.detach().double().requires_grad_() for w in op.weights()]
    br = [b.detach().double().requires_grad_() for b in op.biases()]
    yr = _reference(xr, splits, wr, br, None) + xr
    yr.backward(dy.double())
    t = tols(torch.float32)
    torch.testing.assert_close(y.detach().double(), yr, **t)
    torch.testing.assert_close(x.grad.double(), xr.grad, **t)
    for got, ref in zip([*op.weights(), *op.biases()], [*wr, *br]):
        torch.testing.assert_close(got.grad.double(), ref.grad, **t)


@pytest.mark.parametrize("x_grad", [False, True])
def test_input_modified_in_place_after_forward_is_refused(x_grad):
    """The input GroupedLinear saved for its weight gradients, modified in place before
    backward: autograd's version check refuses the backward instead of a wrong dW."""
    splits = SPLITS["uneven"]
    op = _model(splits, torch.float32)
    leaf = torch.randn(sum(splits), IN, requires_grad=x_grad)
    x = leaf * 1 if x_grad else leaf  # a leaf that requires grad cannot be modified in place
    y = te.ops.Sequential(op)(x, torch.tensor(splits))
    x.add_(1)
    with pytest.raises(RuntimeError, match="modified (by an )?inplace"):
        y.backward(torch.ones_like(y))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("layout", ["transposed", "permuted_3d"])
def test_non_contiguous_input_split_sizes_and_scales(layout, dtype):
    """A transposed-view input (and a permuted 3-D one), split sizes and bias scales taken
    with a stride of 2: the reference's results, dx with the input's shape."""
    splits = SPLITS["uneven"]
    total = sum(splits)
    op = _model(splits, dtype, scale_bias=True)
    g = torch.Generator().manual_seed(0)
    if layout == "transposed":
        x = torch.randn(IN, total, generator=g).to(dtype).t()
    else:
        x = torch.randn(total // 4, 4, IN, generator=g).to(dtype).transpose(0, 1)
    x.requires_grad_()
    scales = torch.rand(total, 2, generator=g).to(dtype)[:, 0].requires_grad_()
    split_t = torch.tensor([[n, 99] for n in splits])[:, 0]
    assert not (x.is_contiguous() or scales.is_contiguous() or split_t.is_contiguous())
    dy = torch.randn(*x.shape[:-1], OUT, generator=g).to(dtype)
    y = te.ops.Sequential(op)(x, split_t, scales)
    y.backward(dy)
    assert y.shape == (*x.shape[:-1], OUT) and x.grad.shape == x.shape
    # the reference splits the rows in the order the op sees them (x's logical row order)
    _check_against_reference(op, x, splits, y, dy, scales=scales, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_realistic_size_matches_float64(dtype):
    """8 groups, 4096 rows, 1024 -> 1024, uneven splits with an empty and a one-row group.
    Elementwise tolerances do not hold for the near-zero elements of long reductions (dW sums
    up to 1200 rows; its largest elements are ~150), so each tensor is compared with the
    dtype's relative tolerance times its largest magnitude (plain PyTorch in the same dtype
    is as far from float64). The empty group's gradients are exactly zero."""
    splits = [700, 0, 512, 1, 1200, 383, 900, 400]
    torch.manual_seed(0)
    op = te.ops.GroupedLinear(8, 1024, 1024, dtype=dtype)
    with torch.no_grad():
        for b in op.biases():
            b.uniform_(-1, 1)
    x = torch.randn(4096, 1024).to(dtype).requires_grad_()
    dy = torch.randn(4096, 1024).to(dtype)
    y = te.ops.Sequential(op)(x, torch.tensor(splits))
    y.backward(dy)
    xr = x.detach().double().requires_grad_()
    wr = [w.detach().double().requires_grad_() for w in op.weights()]
    br = [b.detach().double().requires_grad_() for b in op.biases()]
    yr = _reference(xr, splits, wr, br, None)
    yr.backward(dy.double())
    rtol = tols(dtype)["rtol"]
    pairs = [(y.detach(), yr), (x.grad, xr.grad),
             *[(w.grad, r.grad) for w, r in zip([*op.weights(), *op.biases()], [*wr, *br])]]
    for got, ref in pairs:
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), ref, rtol=0,
                                   atol=rtol * max(ref.abs().max().item(), 1.0))
    assert torch.count_nonzero(op.weights()[1].grad) == 0
    assert torch.count_nonzero(op.biases()[1].grad) == 0


@pytest.mark.parametrize("form", ["int32", "int16", "uint8", "2d"])
def test_split_sizes_other_integer_dtypes_and_2d(form):
    """Split sizes as int32 / int16 / uint8 (TransformerEngine reads them with tolist, any
    integer dtype) or as a [1, num_groups] tensor (accepted here, numel checked): the same
    results as int64 split sizes, bitwise."""
    splits = SPLITS["empty_groups"]
    split_t = {"int32": torch.tensor(splits, dtype=torch.int32),
               "int16": torch.tensor(splits, dtype=torch.int16),
               "uint8": torch.tensor(splits, dtype=torch.uint8),
               "2d": torch.tensor([splits])}[form]
    op = _model(splits, torch.float32)
    ref = _model(splits, torch.float32)
    ref.load_state_dict(op.state_dict())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(sum(splits), IN, generator=g)
    dy = torch.randn(sum(splits), OUT, generator=g)
    outs, xs = [], []
    for m, s in ((op, split_t), (ref, torch.tensor(splits))):
        xs.append(x.clone().requires_grad_())
        y = te.ops.Sequential(m)(xs[-1], s)
        y.backward(dy)
        outs.append([y.detach(), xs[-1].grad, *[p.grad for p in m.parameters()]])
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    _check_against_reference(op, xs[0], splits, outs[0][0], dy)


def test_bincount_split_sizes_compile_fullgraph():
    """Split sizes from torch.bincount(..., minlength=num_groups), the usual way to count an
    MoE's tokens per expert, under torch.compile(fullgraph=True): bincount's output length is
    an unbacked size there (only known to be >= minlength), so GroupedLinear's split-count
    check must be one the compiler can assume (a runtime check), not a Python branch on it."""
    splits = SPLITS["empty_groups"]
    op = _model(splits, torch.float32)
    model = te.ops.Sequential(op)
    experts = torch.repeat_interleave(torch.arange(len(splits)), torch.tensor(splits))

    def fn(x, e):
        return model(x, torch.bincount(e, minlength=len(splits)))

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    x = torch.randn(sum(splits), IN)
    torch.testing.assert_close(compiled(x, experts), fn(x, experts), **COMPILED_VS_EAGER)
