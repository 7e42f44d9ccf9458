"""Saving and loading models as users do: whole-model ``torch.save`` / ``torch.load``, pickle
and ``copy.deepcopy`` of every op (fresh and after a forward, under te.autocast, then compiled),
and quantized checkpoints loaded with torch.load's default ``weights_only=True``, including
those written by the previous release (tests/data/checkpoint_f393f0e.pt)."""

from __future__ import annotations

import copy
import io
import pickle
from pathlib import Path

import pytest
import torch

import transformer_engine_cpp as te
from transformer_engine_cpp import recipe as R
from cases import OP_CASES
from harness import as_tuple, build, clone_leaf, inputs_for, random_grads_like
from tolerances import tols

DATA = Path(__file__).parent / "data"


def _pickle(model):
    return pickle.loads(pickle.dumps(model))


def _torch_save(model):
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)  # a whole model is arbitrary Python objects


ROUND_TRIPS = {"pickle": _pickle, "deepcopy": copy.deepcopy, "torch.save": _torch_save}


def _run(model, x, extras, seed=99):
    """Outputs, input grads and parameter grads (by name) of one forward and backward."""
    x, extras = clone_leaf(x), [clone_leaf(e) for e in extras]
    model.zero_grad(set_to_none=True)
    outs = as_tuple(model(x, *extras))
    torch.autograd.backward(outs, random_grads_like(outs, seed))
    return ([o.detach() for o in outs], [t.grad for t in (x, *extras)],
            {n: p.grad for n, p in model.named_parameters()})


def _assert_same_run(a, b):
    (outs_a, grads_a, pgrads_a), (outs_b, grads_b, pgrads_b) = a, b
    assert len(outs_a) == len(outs_b)
    for u, v in zip(outs_a, outs_b):
        assert torch.equal(u, v)
    for u, v in zip(grads_a, grads_b):
        assert (u is None) == (v is None) and (u is None or torch.equal(u, v))
    assert pgrads_a.keys() == pgrads_b.keys()
    for name, g in pgrads_a.items():
        assert (g is None) == (pgrads_b[name] is None), name
        assert g is None or torch.equal(g, pgrads_b[name]), name


def _assert_independent(model, copied):
    for (name, p), q in zip(model.named_parameters(), copied.parameters()):
        assert p is not q and torch.equal(p, q), name


def _assert_same_plans(model, copied, x, extras, how):
    """The copy's fusion plans are the original's, and the plans' fused ops round-trip too."""
    for plan, plan_copy in zip(model.fusion_plan(x, *extras), copied.fusion_plan(x, *extras)):
        assert repr(plan) == repr(plan_copy)
        for op, _ in plan.forward_ops + plan.backward_ops:
            if op.is_fused_op:
                op_copy = ROUND_TRIPS[how](op)
                assert [type(o) for o in op_copy.basic_ops] == [type(o) for o in op.basic_ops]


# ---- every op: pickle, deepcopy, torch.save ------------------------------------------------


@pytest.mark.parametrize("after_forward", [False, True], ids=["fresh", "after_forward"])
@pytest.mark.parametrize("how", list(ROUND_TRIPS))
@pytest.mark.parametrize("case", OP_CASES, ids=[c.id for c in OP_CASES])
def test_round_trip_of_every_op_case(case, how, after_forward):
    model = build(case, torch.float32)
    x, extras = inputs_for(case, torch.float32, "leading_dims")
    if after_forward:
        _run(model, x, extras)
    copied = ROUND_TRIPS[how](model)
    assert type(copied) is te.ops.Sequential
    _assert_independent(model, copied)
    _assert_same_run(_run(model, x, extras), _run(copied, x, extras))
    _assert_same_plans(model, copied, x, extras, how)


def _ops_not_in_cases():
    """Ops (and configurations) the conformance cases do not build: name -> (ops, input width,
    extra inputs)."""
    splits = torch.tensor([3, 5])
    return {
        "GroupedLinear": (lambda: [te.ops.GroupedLinear(2, 32, 16)], 32, [splits]),
        "GroupedLinear(bias=False)": (lambda: [te.ops.GroupedLinear(2, 32, 16, bias=False)], 32,
                                      [torch.tensor([8, 0])]),
        # fused into GroupedMLP
        "GroupedLinear+ScaledSwiGLU+GroupedLinear": (
            lambda: [te.ops.GroupedLinear(2, 32, 64), te.ops.ScaledSwiGLU(),
                     te.ops.GroupedLinear(2, 32, 16)], 32, [splits, torch.rand(8), splits]),
        "Quantize": (lambda: [te.ops.Quantize(forward=True, backward=True)], 32, []),
        "GELU(cache_quantized_input)": (lambda: [te.ops.GELU(cache_quantized_input=True)], 32,
                                        []),
    }


@pytest.mark.parametrize("how", list(ROUND_TRIPS))
@pytest.mark.parametrize("name", list(_ops_not_in_cases()))
def test_round_trip_of_other_ops(name, how):
    make, width, extras = _ops_not_in_cases()[name]
    torch.manual_seed(0)
    model = te.ops.Sequential(*make())
    x = torch.randn(8, width, requires_grad=True)
    _run(model, x, extras)
    copied = ROUND_TRIPS[how](model)
    _assert_independent(model, copied)
    _assert_same_run(_run(model, x, extras), _run(copied, x, extras))
    _assert_same_plans(model, copied, x, extras, how)


def test_every_exported_op_is_covered():
    """The round trips above (the communication ops: test_process_groups) build every op class
    te.ops exports, and their plans hold every fused op."""
    built = {te.ops.AllReduce, te.ops.AllGather, te.ops.ReduceScatter}
    plans = []
    for case in OP_CASES:
        for op in case.make(torch.float32):
            built.add(type(op))
            built.update(type(o) for o in getattr(op, "basic_ops", ()))
    fused = set()
    for make, width, extras in _ops_not_in_cases().values():
        model = te.ops.Sequential(*make())
        built.update(type(op) for op in model)
        plans.append(model.fusion_plan(torch.randn(8, width, requires_grad=True), *extras))
    for case in OP_CASES:
        x, extras = inputs_for(case, torch.float32, "rows")
        plans.append(build(case, torch.float32).fusion_plan(x, *extras))
    for plan in (p for model_plans in plans for p in model_plans):
        fused.update(type(op) for op, _ in plan.forward_ops + plan.backward_ops if op.is_fused_op)
    assert {getattr(te.ops, n) for n in te.ops.basic.__all__} - built == set()
    assert {getattr(te.ops.fused, n) for n in te.ops.fused.__all__
            if isinstance(getattr(te.ops.fused, n), type)} - fused == set()


def test_standalone_op_after_a_call():
    """An op called on its own keeps a one-op fuser; the copy builds its own."""
    op = te.ops.GELU()
    x = torch.randn(4, 8)
    y = op(x)
    for how, round_trip in ROUND_TRIPS.items():
        op_copy = round_trip(op)
        assert op_copy.__dict__.get("_single_op_fuser") is None, how
        assert torch.equal(op_copy(x), y), how


# ---- recipes, te.autocast, quantized weights, torch.compile ----------------------------------


def test_formats_and_recipes_pickle():
    for fmt in R.Format:
        assert pickle.loads(pickle.dumps(fmt)) is fmt
        assert copy.deepcopy(fmt) is fmt
    for recipe in (R.DelayedScaling(fp8_format=R.Format.HYBRID), R.Float8CurrentScaling(),
                   R.MXFP8BlockScaling(), R.Float8BlockScaling(), R.NVFP4BlockScaling()):
        assert pickle.loads(pickle.dumps(recipe)) == recipe


RECIPES = {
    "Float8CurrentScaling": R.Float8CurrentScaling,
    "DelayedScaling": lambda: R.DelayedScaling(amax_history_len=8),
    "MXFP8BlockScaling": R.MXFP8BlockScaling,
    "Float8BlockScaling": R.Float8BlockScaling,
    "NVFP4BlockScaling": R.NVFP4BlockScaling,
}
#: te.quantized_model_init is implemented for these recipes' weights
QUANTIZED_WEIGHTS = ("Float8CurrentScaling", "DelayedScaling", "MXFP8BlockScaling",
                     "Float8BlockScaling", "NVFP4BlockScaling")


def _mlp(recipe=None, seed=0):
    torch.manual_seed(seed)
    with te.quantized_model_init(enabled=recipe is not None, recipe=recipe):
        return te.ops.Sequential(te.ops.LayerNorm(128), te.ops.Linear(128, 128), te.ops.GELU(),
                                 te.ops.Linear(128, 128), te.ops.AddExtraInput())


def _step(model, recipe, x, seed=7):
    with te.autocast(recipe=recipe):
        return _run(model, x, [x.detach()], seed)


@pytest.mark.parametrize("how", list(ROUND_TRIPS))
@pytest.mark.parametrize("name,quantized_weights",
                         [(n, False) for n in RECIPES] + [(n, True) for n in QUANTIZED_WEIGHTS])
def test_round_trip_under_autocast(name, quantized_weights, how):
    """A model trained under te.autocast continues identically after the round trip (delayed
    scaling's scales and amax histories included)."""
    recipe = RECIPES[name]()
    model = _mlp(recipe if quantized_weights else None)
    torch.manual_seed(1)
    xs = [torch.randn(32, 128, requires_grad=True) for _ in range(3)]
    for i, x in enumerate(xs[:2]):
        _step(model, recipe, x, seed=i)
    copied = ROUND_TRIPS[how](model)
    _assert_independent(model, copied)
    if quantized_weights:
        assert type(copied[1].basic_ops[0].weight) is type(model[1].basic_ops[0].weight)
    _assert_same_run(_step(model, recipe, xs[2]), _step(copied, recipe, xs[2]))
    assert torch.equal(model.state_dict()["1.basic_ops.0._extra_state"],
                       copied.state_dict()["1.basic_ops.0._extra_state"])


@pytest.mark.parametrize("how,name", [(how, None) for how in ROUND_TRIPS]
                         + [("torch.save", "Float8CurrentScaling"),
                            ("torch.save", "MXFP8BlockScaling")])
def test_loaded_model_compiles(how, name):
    """A copy of a model that ran (under te.autocast with a recipe) compiles with
    fullgraph=True and computes what the original computes eagerly."""
    recipe = None if name is None else RECIPES[name]()
    autocast = lambda: te.autocast(enabled=recipe is not None, recipe=recipe)  # noqa: E731
    model = _mlp(recipe)
    x = torch.randn(32, 128, requires_grad=True)
    with autocast():
        _run(model, x, [x.detach()], seed=1)
        expected = _run(model, x, [x.detach()])
    copied = ROUND_TRIPS[how](model)
    compiled = torch.compile(copied, backend="aot_eager", fullgraph=True)
    with autocast():
        got = _run(compiled, x, [x.detach()])
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=1e-6)
    got_pgrads = {n.removeprefix("_orig_mod."): g for n, g in got[2].items()}
    assert got_pgrads.keys() == expected[2].keys()
    for name, g in expected[2].items():
        torch.testing.assert_close(got_pgrads[name], g, rtol=0, atol=1e-6)


def test_pickled_fuser_state_is_not_carried():
    """The fusers and their plans are rebuilt, not pickled: a model's pickle does not grow with
    the number of configurations it ran."""
    model = _mlp()
    size = len(pickle.dumps(model))
    x = torch.randn(32, 128, requires_grad=True)
    for name in RECIPES:
        _step(model, RECIPES[name](), x)
    with torch.no_grad():
        model(x, x)
    grown = len(pickle.dumps(model))
    # only DelayedScaling's pending scales and histories (two ops, 3 + 2 quantizers of 8 rows)
    assert grown - size < 4096


# ---- process groups ---------------------------------------------------------------------------


def _process_group_body(rank, world):
    import torch.distributed as dist  # noqa: PLC0415

    group = dist.new_group(list(range(world)))
    out = {}
    torch.manual_seed(0)  # the same inputs and parameters on every rank
    x = torch.randn(4, 8)
    for name, make in (("AllReduce", te.ops.AllReduce), ("AllGather", te.ops.AllGather),
                       ("ReduceScatter", te.ops.ReduceScatter),
                       ("AllReduce(group)", lambda: te.ops.AllReduce(process_group=group)),
                       ("Linear(column)", lambda: te.ops.Linear(
                           8, 8, tensor_parallel_mode="column", tensor_parallel_group=group))):
        model = te.ops.Sequential(make())
        model(x)
        for how, round_trip in ROUND_TRIPS.items():
            try:
                copied = round_trip(model)
            except TypeError as e:
                out[name, how] = str(e)
                continue
            groups = [(getattr(op, "process_group", None), getattr(op, "tensor_parallel_group",
                                                                  None))
                      for op in (model[0], copied[0])]
            out[name, how] = torch.equal(copied(x), model(x)) and groups[0] == groups[1]
    return out


def test_process_groups():
    """The default group is looked up again after a pickle; an op holding a group does not
    pickle (a clear TypeError) and shares it with its deep copy."""
    from dist_harness import run_ranks  # noqa: PLC0415

    for out in run_ranks(_process_group_body, world=2):
        for name in ("AllReduce", "AllGather", "ReduceScatter"):
            for how in ROUND_TRIPS:
                assert out[name, how] is True, (name, how)
        for name, op, attr in (("AllReduce(group)", "AllReduce", "process_group"),
                               ("Linear(column)", "BasicLinear", "tensor_parallel_group")):
            assert out[name, "deepcopy"] is True
            assert out[name, "torch.save"] == out[name, "pickle"] == (
                f"{op}: cannot pickle an op that holds a process group ({attr}): a "
                "torch.distributed ProcessGroup belongs to the running process. Save the "
                "model's state_dict() instead and load it into a model built with the process "
                "group of the loading process")


# ---- quantized checkpoints with torch.load's default weights_only=True ------------------------


@pytest.mark.parametrize("name", list(RECIPES))
def test_quantized_state_dict_loads_with_default_torch_load(name, tmp_path):
    recipe = RECIPES[name]()
    quantized = name in QUANTIZED_WEIGHTS
    model = _mlp(recipe if quantized else None)
    torch.manual_seed(1)
    xs = [torch.randn(32, 128, requires_grad=True) for _ in range(2)]
    _step(model, recipe, xs[0])
    path = tmp_path / "checkpoint.pt"
    torch.save(model.state_dict(), path)

    state = torch.load(path)  # the default: weights_only=True
    if quantized:
        assert isinstance(state["1.basic_ops.0.weight"], te.QuantizedTensor)
    restored = _mlp(recipe if quantized else None, seed=123)
    restored.load_state_dict(state)
    _assert_same_run(_step(model, recipe, xs[1]), _step(restored, recipe, xs[1]))


def _quantized_tensors():
    w = torch.randn(32, 64, dtype=torch.bfloat16)
    quantizers = {
        "Float8Tensor(current)": te.Float8CurrentScalingQuantizer(torch.float8_e5m2),
        "Float8Tensor(delayed)": te.Float8Quantizer(torch.full((1,), 4.0), torch.zeros(1),
                                                    torch.float8_e4m3fn),
        "MXFP8Tensor": te.MXFP8Quantizer(torch.float8_e4m3fn),
        "Float8BlockwiseQTensor": te.Float8BlockQuantizer(torch.float8_e4m3fn, rowwise=True,
                                                          columnwise=True),
        "NVFP4Tensor": te.NVFP4Quantizer(),
    }
    return {name: q(w) for name, q in quantizers.items()}


@pytest.mark.parametrize("name", list(_quantized_tensors()))
def test_quantized_tensor_loads_with_default_torch_load(name, tmp_path):
    t = _quantized_tensors()[name]
    path = tmp_path / "tensor.pt"
    torch.save({"t": t, "p": torch.nn.Parameter(t, requires_grad=False)}, path)
    loaded = torch.load(path)
    for key in ("t", "p"):
        u = loaded[key]
        assert type(u) is type(t) and u.dtype == t.dtype and u.shape == t.shape
        assert torch.equal(u.dequantize(), t.dequantize())
    assert type(loaded["t"]._quantizer) is type(t._quantizer)


def _values(t):
    return t.dequantize() if isinstance(t, te.QuantizedTensor) else t


def test_checkpoint_of_the_previous_release_loads():
    """tests/data/checkpoint_f393f0e.pt was written at f393f0e (make_checkpoint_f393f0e.py):
    it loads with the default torch.load, every entry of the models' state comes back exactly,
    and the models give the outputs they gave then. Those outputs come from ATen's fp32 GEMM
    (the FP8 GEMM's fp32-output path), whose summation order is the CPU's BLAS kernel's: on
    another CPU model they agree to fp32 rounding, not bitwise (a checkpoint written on an AMD
    EPYC gave differences up to 3e-7 on an Intel Xeon), so they are compared with the fp32
    tolerance."""
    data = torch.load(DATA / "checkpoint_f393f0e.pt")
    recipes = {"Float8CurrentScaling": R.Float8CurrentScaling(),
               "DelayedScaling": R.DelayedScaling(amax_history_len=16),
               "MXFP8BlockScaling": R.MXFP8BlockScaling()}
    assert data["models"].keys() == recipes.keys()
    for name, saved in data["models"].items():
        with te.quantized_model_init(enabled=True, recipe=recipes[name]):
            model = te.ops.Sequential(te.ops.Linear(32, 32))
        model.load_state_dict(saved["state"])
        state = model.state_dict()
        assert state.keys() == saved["state"].keys(), name
        for key, value in saved["state"].items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(_values(state[key]), _values(value)), (name, key)
            else:
                assert state[key] == value, (name, key)
        with torch.no_grad(), te.autocast(recipe=recipes[name]):
            torch.testing.assert_close(model(data["x"]), saved["y"], **tols(torch.float32),
                                       msg=name)
    assert len(data["tensors"]) == 5
    for name, saved in data["tensors"].items():
        assert torch.equal(saved["tensor"].dequantize(), saved["values"]), name
