"""torch.compile(fullgraph=True) of te.ops pipelines: one higher-order op with the custom ops
inside, forward and all gradients equal to eager, backward-only fusions kept, aot_eager and
inductor backends, dynamic shapes, no recompiles, unsupported ops refused clearly."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs, CompileCounterWithBackend, EagerAndRecordGraphs
from torch._dynamo.utils import counters

import transformer_engine_cpp as te

from tolerances import COMPILED_VS_EAGER, tols


def residual_block(features=16):
    """Bias+GELU (fused backward), gated SwiGLU, an internal residual channel, a plain module."""
    return te.ops.Sequential(
        te.ops.MakeExtraOutput().set_extra_output_channel(0, "res", output_to_caller=False),
        te.ops.Bias(features),
        te.ops.GELU(),
        te.ops.ConstantScale(0.5),
        te.ops.AddExtraInput().set_extra_input_channel(0, "res"),
        torch.nn.LayerNorm(features),
        te.ops.Bias(features),
        te.ops.SwiGLU(glu_interleave_size=4),
        te.ops.MakeExtraOutput(),
        te.ops.ReLU(),
        te.ops.AddExtraInput(),
    )


def init_params(model, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return model


def run(model, x, extras, grad_seed=7):
    out = model(x, *extras)
    outs = out if isinstance(out, tuple) else (out,)
    torch.manual_seed(grad_seed)
    torch.autograd.backward(outs, [torch.randn_like(o) for o in outs])
    return outs


def compare_to_eager(make, x_shape, extra_shapes, backend, tol=COMPILED_VS_EAGER, **compile_kw):
    eager = init_params(make())
    comp_model = copy.deepcopy(eager)
    torch.manual_seed(3)
    x = torch.randn(*x_shape, requires_grad=True)
    extras = [torch.randn(*s, requires_grad=True) for s in extra_shapes]
    xc = x.detach().clone().requires_grad_()
    extras_c = [e.detach().clone().requires_grad_() for e in extras]
    compiled = torch.compile(comp_model, backend=backend, fullgraph=True, **compile_kw)
    outs = run(eager, x, extras)
    c_outs = run(compiled, xc, extras_c)
    assert len(counters["graph_break"]) == 0
    for a, b in zip(c_outs, outs):
        torch.testing.assert_close(a, b, **tol)
    torch.testing.assert_close(xc.grad, x.grad, **tol)
    for a, b in zip(extras_c, extras):
        torch.testing.assert_close(a.grad, b.grad, **tol)
    for (name, a), b in zip(comp_model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, **tol, msg=lambda m: f"{name}: {m}")
    return compiled, comp_model


def test_dynamo_graph_holds_one_autograd_function_hop():
    backend = EagerAndRecordGraphs()
    model = te.ops.Sequential(te.ops.Bias(8), te.ops.GELU(), te.ops.ConstantScale(2.0))
    x = torch.randn(3, 8, requires_grad=True)
    torch.compile(model, backend=backend, fullgraph=True)(x).sum().backward()
    assert len(backend.graphs) == 1
    gm = backend.graphs[0]
    hops = [n for n in gm.graph.nodes
            if n.op == "call_function" and n.target is torch.ops.higher_order.autograd_function_apply]
    assert len(hops) == 1
    fwd_body = getattr(gm, hops[0].args[0].target)
    bwd_body = getattr(gm, hops[0].args[1].target)
    fwd_code, bwd_code = fwd_body.code, bwd_body.code
    # Bias+GELU: one bias_act_fwd pass (ForwardBiasActivation)
    for op in ("bias_act_fwd", "constant_scale_fwd"):
        assert f"te_cpp.{op}" in fwd_code
    assert "te_cpp.bias_fwd" not in fwd_code and "te_cpp.gelu_fwd" not in fwd_code
    assert "te_cpp.dbias_dgelu" in bwd_code and "te_cpp.constant_scale_bwd" in bwd_code
    assert "te_cpp.gelu_bwd" not in bwd_code and "te_cpp.bias_bwd" not in bwd_code


def test_residual_block_aot_eager_equals_eager_and_keeps_the_backward_fusion():
    backend = AotEagerAndRecordGraphs()
    compare_to_eager(residual_block, (2, 5, 16), [(2, 5, 8)], backend)
    fw = "\n".join(g.code for g in backend.fw_graphs)
    bw = "\n".join(g.code for g in backend.bw_graphs)
    assert "te_cpp.bias_fwd" in fw and "te_cpp.swiglu_fwd" in fw
    assert "te_cpp.dbias_dgelu" in bw and "te_cpp.swiglu_bwd" in bw
    assert "te_cpp.gelu_bwd" not in bw
    # the plain LayerNorm splits the Sequential into two fusers, both inside one graph
    assert len(backend.fw_graphs) == 1 and len(backend.bw_graphs) == 1


@pytest.mark.slow
def test_residual_block_inductor_equals_eager():
    compare_to_eager(residual_block, (2, 5, 16), [(2, 5, 8)], "inductor", tol=tols(torch.float32))


@pytest.mark.slow
def test_inductor_bf16_pipeline():
    def make():
        return te.ops.Sequential(te.ops.Bias(32, dtype=torch.bfloat16), te.ops.ReLU(),
                                 te.ops.GEGLU(), te.ops.ConstantScale(3.0))

    eager = init_params(make())
    compiled = torch.compile(copy.deepcopy(eager), backend="inductor", fullgraph=True)
    x = torch.randn(4, 32, dtype=torch.bfloat16, requires_grad=True)
    xc = x.detach().clone().requires_grad_()
    y, yc = eager(x), compiled(xc)
    y.sum().backward()
    yc.sum().backward()
    torch.testing.assert_close(yc, y, **COMPILED_VS_EAGER)
    torch.testing.assert_close(xc.grad, x.grad, **COMPILED_VS_EAGER)


def test_dynamic_shapes_do_not_recompile():
    counter = CompileCounterWithBackend("aot_eager")
    model = init_params(te.ops.Sequential(te.ops.Bias(12), te.ops.SiLU(), te.ops.SwiGLU(),
                                          te.ops.MakeExtraOutput(), te.ops.Reshape((-1, 3))))
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    for rows in (3, 5, 11):
        x = torch.randn(rows, 2, 12, requires_grad=True)
        xc = x.detach().clone().requires_grad_()
        outs = run(model, x, [])
        c_outs = run(compiled, xc, [])
        for a, b in zip(c_outs, outs):
            torch.testing.assert_close(a, b, **COMPILED_VS_EAGER)
        torch.testing.assert_close(xc.grad, x.grad, **COMPILED_VS_EAGER)
    assert counter.frame_count == 1


def test_mark_dynamic_keeps_meta_kernels_symbolic():
    model = init_params(te.ops.Sequential(te.ops.Bias(10), te.ops.GEGLU(),
                                          te.ops.ConstantScale(2.0)))
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = torch.randn(6, 10, requires_grad=True)
    torch._dynamo.mark_dynamic(x, 0)
    compiled(x).sum().backward()  # a specialisation would raise ConstraintViolationError
    assert x.grad.shape == x.shape


def test_repeated_calls_do_not_recompile():
    counter = CompileCounterWithBackend("aot_eager")
    model = init_params(te.ops.Sequential(te.ops.Bias(8), te.ops.ReLU()))
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=False)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            compiled(torch.randn(4, 8, requires_grad=True)).sum().backward()
    assert counter.frame_count == 1


def test_eager_calls_between_compiled_calls_do_not_recompile():
    """Eager calls of the same model in between (other configurations: no_grad, an input that
    needs no grad) change the fuser's last-plan memo; the compiled calls do not read it, so
    they keep their one graph."""
    counter = CompileCounterWithBackend("aot_eager")
    model = init_params(te.ops.Sequential(te.ops.Bias(8), te.ops.ReLU()))
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=False)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            compiled(torch.randn(4, 8, requires_grad=True)).sum().backward()
            with torch.no_grad():
                model(torch.randn(4, 8))
            model(torch.randn(4, 8))
    assert counter.frame_count == 1


def test_in_place_variants_compile_functionally():
    def make():
        return te.ops.Sequential(te.ops.MakeExtraOutput(in_place=True), te.ops.GELU(),
                                 te.ops.ConstantScale(2.0), te.ops.AddExtraInput(in_place=True))

    compare_to_eager(make, (3, 7), [(3, 7)], "aot_eager")
    # under compile the caller's extra-input buffer is not written
    model = torch.compile(make(), backend="aot_eager", fullgraph=True)
    extra = torch.zeros(3, 7, requires_grad=True)
    before = extra.detach().clone()
    model(torch.randn(3, 7, requires_grad=True), extra)
    assert torch.equal(extra.detach(), before)


def test_in_place_add_writes_the_buffer_in_eager():
    model = te.ops.Sequential(te.ops.ConstantScale(2.0), te.ops.AddExtraInput(in_place=True))
    x = torch.ones(2, 3)
    extra = torch.full((2, 3), 10.0)
    y = model(x, extra)
    assert y.data_ptr() == extra.data_ptr()
    assert torch.equal(extra, torch.full((2, 3), 12.0))


def test_in_place_write_over_a_saved_tensor_fails_loudly():
    a = torch.randn(3, 4, requires_grad=True)
    h = a * 1.0  # h is saved by the multiplication below
    w = torch.randn(4, requires_grad=True)
    y = h * w
    te.ops.Sequential(te.ops.AddExtraInput(in_place=True))(torch.ones(3, 4), h)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


class Unsupported(te.ops.BasicOperation):
    def compile_unsupported_reason(self):
        return "it keeps global state (test op)"

    def op_forward(self, ctx, input_, **kwargs):
        return input_

    def op_backward(self, ctx, grad_output):
        return grad_output, ()


def test_unsupported_op_is_refused_under_compile():
    model = te.ops.Sequential(te.ops.GELU(), Unsupported())
    x = torch.randn(2, 3, requires_grad=True)
    model(x).sum().backward()  # fine in eager
    with pytest.raises(Exception, match="Unsupported cannot run under torch.compile: it keeps "
                                        "global state"):
        torch.compile(model, backend="aot_eager", fullgraph=True)(x)


def test_identity_and_reshape_only_pipeline_compiles():
    compare_to_eager(lambda: te.ops.Sequential(te.ops.Identity(), te.ops.Reshape((-1, 4)),
                                               te.ops.Identity()),
                     (3, 8), [], "aot_eager")


def test_no_grad_under_compile():
    model = init_params(te.ops.Sequential(te.ops.Bias(8), te.ops.GELU()))
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **COMPILED_VS_EAGER)


def _train_eval_fp8_loop(compiled, model, make_recipe, features, reps=2):
    """Train steps, eval steps (no_grad) and eval steps under te.autocast, ``reps`` times,
    with eager calls of the same model in between; each compiled FP8 eval equals eager."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(reps):
        for _ in range(2):
            compiled(torch.randn(16, features)).sum().backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            for _ in range(2):
                compiled(torch.randn(16, features))
            model(torch.randn(16, features))  # eager in between
        with torch.no_grad(), te.autocast(recipe=make_recipe()):  # a new recipe object
            for _ in range(2):
                x = torch.randn(16, features)
                torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "default"])
def test_train_eval_fp8_eval_loop_compiles_one_graph_per_configuration(fullgraph):
    """Three configurations (grad mode on, off, off under Float8CurrentScaling): three
    graphs, however often the loop switches between them. Nothing a graph is guarded on
    (the fuser's plan cache, the ops' quantizers) changes when another configuration runs."""
    from transformer_engine_cpp.testing.reference import te_prenorm_mlp
    torch.manual_seed(0)
    model = te_prenorm_mlp(32, 64)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=fullgraph)
    _train_eval_fp8_loop(compiled, model, te.recipe.Float8CurrentScaling, 32)
    assert counter.frame_count == 3


def test_op_called_alone_compiles_one_graph_per_configuration():
    """An op called on its own builds its one-op fuser on the first call, also when that call
    is compiled: the second call does not recompile."""
    torch.manual_seed(0)
    op = te.ops.BasicLinear(32, 32)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(op, backend=counter, fullgraph=True)
    _train_eval_fp8_loop(compiled, op, te.recipe.MXFP8BlockScaling, 32)
    assert counter.frame_count == 3


def test_recipe_settings_change_compiles_a_graph_of_its_own():
    """A recipe with other settings is another configuration (other quantizers): its own graph,
    with its own result; switching back reuses the first graph."""
    torch.manual_seed(0)
    model = init_params(te.ops.Sequential(te.ops.Linear(32, 32)))
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    x = torch.randn(16, 32) * 3
    outs = []
    with torch.no_grad():
        for pow2 in (False, True, False):
            with te.autocast(recipe=te.recipe.Float8CurrentScaling(use_power_2_scales=pow2)):
                outs.append(compiled(x))
                torch.testing.assert_close(outs[-1], model(x), rtol=0, atol=0)
    assert counter.frame_count == 2
    assert not torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_compiled_call_leaves_the_recipe_state_an_eager_call_leaves():
    """A compiled call sets its recipe's quantizer state on the ops, as an eager call does, on
    every call of the graph (not only when traced): after an eager FP8 call, a compiled call
    without a recipe leaves no quantizers, and a compiled FP8 call after an eager one without
    a recipe leaves them set; two graphs serve all these calls."""
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.Linear(32, 32))
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    linear = model[0].basic_ops[0] if hasattr(model[0], "basic_ops") else model[0]
    x = torch.randn(16, 32, requires_grad=True)
    recipe = te.recipe.Float8CurrentScaling()
    compiled(x)
    with te.autocast(recipe=recipe):
        compiled(x)
    for _ in range(2):  # the graphs run again, without tracing
        with te.autocast(recipe=recipe):
            model(x)
        assert linear._quantizers is not None
        compiled(x)
        assert linear._quantizers is None and linear._fp8_metas is None
        with te.autocast(recipe=recipe):
            compiled(x)
        assert linear._quantizers is not None and linear._fp8_metas is not None
        model(x)
        assert linear._quantizers is None
    assert counter.frame_count == 2


def _first_line_raised(fn, *args):
    with pytest.raises(te.ops.CompileUnsupportedError) as info:
        fn(*args)
    assert isinstance(info.value, RuntimeError)
    return str(info.value).splitlines()[0]


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "default"])
def test_delayed_scaling_refusal_names_the_problem_and_the_fix_first(fullgraph):
    """The user reads our reason and the recipes to use on the first line, not Dynamo's
    "Observed exception" with the reason under "Developer debug context"."""
    model = te.ops.Sequential(te.ops.Linear(32, 32), te.ops.GELU())
    compiled = torch.compile(model, backend="aot_eager", fullgraph=fullgraph)

    def call():
        with te.autocast(recipe=te.recipe.DelayedScaling()):
            compiled(torch.randn(4, 32, requires_grad=True))

    first = _first_line_raised(call)
    assert first.startswith("DelayedScaling cannot be compiled; use Float8CurrentScaling or "
                            "MXFP8BlockScaling (or Float8BlockScaling, NVFP4BlockScaling) "
                            "under torch.compile, or run the model eagerly.")


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "default"])
def test_op_refusal_is_the_first_line(fullgraph):
    model = te.ops.Sequential(te.ops.GELU(), Unsupported())
    compiled = torch.compile(model, backend="aot_eager", fullgraph=fullgraph)
    assert _first_line_raised(compiled, torch.randn(2, 3)) == (
        "Unsupported cannot run under torch.compile: it keeps global state (test op)")


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "default"])
def test_meta_model_compiled_before_its_first_call_says_what_to_do(fullgraph):
    """The first line names the ops and the ways out (an eager call first, or
    reset_parameters()); following either, the compiled model runs."""
    def make():
        return te.ops.Sequential(te.ops.Linear(16, 16, device="meta"), te.ops.GELU())

    model = make()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=fullgraph)
    first = _first_line_raised(compiled, torch.randn(4, 16))
    assert first.startswith('BasicLinear, Bias built with device="meta": parameters on the meta '
                            "device cannot be materialised under torch.compile; run the model "
                            "once eagerly before compiling it, or call reset_parameters() on "
                            "each such op first")
    x = torch.randn(4, 16)
    y = model(x)  # one eager call
    torch.testing.assert_close(compiled(x), y, rtol=0, atol=0)
    model = make()
    for op in model[0].basic_ops:
        op.reset_parameters()
    y = torch.compile(model, backend="aot_eager", fullgraph=fullgraph)(x)
    torch.testing.assert_close(y, model(x), rtol=0, atol=0)


def test_constant_result_mark_is_torchs_and_import_stays_light():
    """Our functions run at trace time as torch.compiler.assume_constant_result's would (the
    same mark), and importing the package does not import torch._dynamo (the error class
    deriving from one of its classes is made on first use)."""
    import subprocess
    import sys

    from transformer_engine_cpp.ops import op as op_module

    def f():
        return 0

    def g():
        return 0

    torch.compiler.assume_constant_result(f)
    op_module.mark_constant_result(g)
    assert f.__dict__ == g.__dict__ == {"_dynamo_marked_constant": True}
    code = ("import sys, transformer_engine_cpp as te; assert 'torch._dynamo' not in sys.modules; "
            "e = te.ops.CompileUnsupportedError; assert issubclass(e, RuntimeError); "
            "import pickle; assert pickle.loads(pickle.dumps(e)) is e")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pickled_and_deep_copied_ops_compile_after_compiled_fp8_calls():
    """A copy drops the one-op fuser and the recipe states (rebuilt on use); compiled, it
    builds them at trace time again and equals eager."""
    import pickle

    torch.manual_seed(0)
    op = te.ops.BasicLinear(16, 16)
    x = torch.randn(4, 16)
    with torch.no_grad(), te.autocast(recipe=te.recipe.Float8CurrentScaling()):
        torch.compile(op, backend="aot_eager", fullgraph=True)(x)
        for other in (copy.deepcopy(op), pickle.loads(pickle.dumps(op))):
            y = torch.compile(other, backend="aot_eager", fullgraph=True)(x)
            torch.testing.assert_close(y, other(x), rtol=0, atol=0)
            torch.testing.assert_close(y, op(x), rtol=0, atol=0)


@pytest.mark.parametrize("tokens,dtype", [(64, torch.float32), (64, torch.float16),
                                          (4096, torch.float32)], ids=["64", "64-fp16", "4096"])
@pytest.mark.parametrize("config", ["all", "frozen_weight", "bias_only", "input_no_grad",
                                    "inference_mode"])
def test_compiled_plan_configurations_equal_eager(config, tokens, dtype):
    """Each configuration of which ops the backward reaches (frozen weights, bias-only
    training, an input without grad, inference_mode) is a plan of its own, read by the traced
    call as constants (``_plan.traced_plan``): compiled equals eager bit for bit, outputs and
    every gradient, at a realistic size and in fp16 too."""
    torch.manual_seed(0)
    h = 1024 if tokens == 4096 else 64
    model = te.ops.Sequential(te.ops.LayerNorm(h, dtype=dtype), te.ops.Linear(h, h, dtype=dtype),
                              te.ops.GELU(), te.ops.Linear(h, h, dtype=dtype))
    if config == "frozen_weight":
        model[1].weight.requires_grad_(False)
    elif config == "bias_only":
        for name, p in model.named_parameters():
            p.requires_grad_(name.endswith("bias"))
    elif config == "input_no_grad":
        for p in model[0].parameters():
            p.requires_grad_(False)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = torch.randn(tokens, h, dtype=dtype)
    dy = torch.randn(tokens, h, dtype=dtype)
    if config == "inference_mode":
        with torch.inference_mode():
            torch.testing.assert_close(compiled(x), model(x), **COMPILED_VS_EAGER)
        return
    x.requires_grad_(config not in ("input_no_grad", "bias_only"))
    params = [p for p in model.parameters() if p.requires_grad]
    wrt = ([x] if x.requires_grad else []) + params
    results = []
    for m in (model, compiled):
        y = m(x)
        results.append([y.detach(), *torch.autograd.grad(y, wrt, dy)])
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, **COMPILED_VS_EAGER)


@pytest.mark.parametrize("fp8", [False, True], ids=["no_recipe", "current_scaling"])
def test_checkpoint_inside_a_compiled_region_equals_eager(fp8):
    """torch.utils.checkpoint around a pipeline inside a compiled region: Dynamo refuses it
    loudly by default (a compiled call stores the ops' recipe states on them, a side effect the
    recompute would not replay); with torch._dynamo.config.
    skip_fwd_side_effects_in_bwd_under_checkpoint (docs/ops.md) the checkpointed step equals
    the eager un-checkpointed one bit for bit, under a recipe too."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.LayerNorm(32), te.ops.Linear(32, 32), te.ops.GELU(),
                              te.ops.Linear(32, 32))
    x = torch.randn(32, 32, requires_grad=True)
    dy = torch.randn(32, 32)
    recipe = te.recipe.Float8CurrentScaling() if fp8 else None

    def step(fn):
        with te.autocast(enabled=fp8, recipe=recipe):
            y = fn(x)
        return [y.detach(), *torch.autograd.grad(y, [x, *model.parameters()], dy)]

    expected = step(model)
    with pytest.raises(Exception, match="skip_fwd_side_effects_in_bwd_under_checkpoint"):
        step(torch.compile(lambda t: checkpoint(model, t, use_reentrant=False),
                           fullgraph=True))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        got = step(torch.compile(lambda t: checkpoint(model, t, use_reentrant=False),
                                 fullgraph=True))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, **COMPILED_VS_EAGER)
