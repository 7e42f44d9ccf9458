"""The activation table (``transformer_engine_cpp.ops.basic.ACTIVATIONS``) against everything
that must agree with it: the exported classes, the C++ kernels (the names the kernels that take
an activation by name accept, and each class's ops), the fusions, the float64 references and
the activation table of docs/ops.md."""

from __future__ import annotations

import inspect
import pathlib
import re

import pytest
import torch

import transformer_engine_cpp as te
from transformer_engine_cpp.ops import fused as F
from transformer_engine_cpp.ops.basic import ACTIVATIONS
from transformer_engine_cpp.ops.basic.activation import _ActivationOperation, _ScaledActivation
from transformer_engine_cpp.testing import reference as ref

from activations import GATED, LINEAR_BIAS_ACT, SCALED, UNARY, op_params, reference
from activations import reference_function
from tolerances import tols

te_ops = torch.ops.te_cpp
OPS_MD = pathlib.Path(__file__).resolve().parents[1] / "docs" / "ops.md"

# names no kernel takes, beside the stems of the activations that a kernel does not take
UNKNOWN_NAMES = ("tanh", "", "GELU", "gelu_fwd", "gelu ")


def _ids(classes):
    return [c.__name__ for c in classes]


def _registered_ops() -> set[str]:
    return {n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names()
            if n.startswith("te_cpp::")}


# ---- the table and the exports ----------------------------------------------------------------


def test_the_table_is_every_exported_activation():
    exported = {obj for name, obj in vars(te.ops).items() if not name.startswith("_")
                and inspect.isclass(obj)
                and issubclass(obj, (_ActivationOperation, _ScaledActivation))}
    assert set(ACTIVATIONS) == exported
    assert len(set(ACTIVATIONS)) == len(ACTIVATIONS)
    assert len({c.op_stem for c in ACTIVATIONS}) == len(ACTIVATIONS), "one stem per class"
    for cls in ACTIVATIONS:
        assert getattr(te.ops, cls.__name__) is cls
        assert cls.op_stem, cls
        if issubclass(cls, _ScaledActivation):  # the scaled ops' prefix
            assert cls.op_stem.startswith("scaled_"), cls
        # no fused kernel takes a gated or a scaled activation (none exists in C++)
        if cls.gated or cls in SCALED:
            assert not (cls.fuses_linear_bias_act or cls.fuses_bias_act
                        or cls.fuses_dbias_dact), cls


@pytest.mark.parametrize("cls", ACTIVATIONS, ids=_ids(ACTIVATIONS))
def test_every_activation_has_its_float64_reference(cls):
    fn = reference_function(cls)
    assert fn.__module__ == ref.__name__ and fn.__name__ == cls.op_stem
    x = torch.randn(3, 8, dtype=torch.float64)
    inputs = (x, torch.randn(3, dtype=torch.float64)) if cls in SCALED else (x,)
    assert reference(cls())(*inputs).shape == (3, 4 if cls.gated else 8)


# ---- the C++ half -------------------------------------------------------------------------------


def _call_by_name(kernel, name, device):
    x = torch.ones(2, 4, device=device)
    if kernel == "bias_act_fwd":
        return te_ops.bias_act_fwd(x, torch.ones(4, device=device), name)
    return te_ops.linear_bias_act_fwd(x, torch.ones(3, 4, device=device), None, name)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("kernel,table", [
    ("bias_act_fwd", F.forward_bias_activation.BIAS_ACT_ACTIVATIONS),
    ("linear_bias_act_fwd", F.forward_linear_bias_activation.EPILOGUE_ACTIVATIONS),
])
def test_kernels_taking_an_activation_by_name_accept_exactly_the_table(kernel, table, device):
    """The C++ kernels accept the names the fusion tables (the classes' attributes) pass, and
    refuse every other activation's stem and unknown names, naming what they accept."""
    names = set(table.values())
    assert names == {c.op_stem for c in table}
    for name in sorted(names):
        _call_by_name(kernel, name, device)
    for name in sorted({c.op_stem for c in ACTIVATIONS} - names) + list(UNKNOWN_NAMES):
        with pytest.raises(ValueError, match=rf"te_cpp\.{kernel}: activation must be one of "
                                             rf"(.*), got '{re.escape(name)}'") as info:
            _call_by_name(kernel, name, device)
        listed = re.search(r"one of (.*), got", str(info.value)).group(1)
        assert set(listed.split(", ")) == names


def test_each_class_has_its_ops():
    """Each class's ``<stem>_fwd`` / ``_bwd``; ``dbias_d<stem>`` exactly for the classes
    BackwardActivationBias takes, and ``scaled_*`` ops exactly for the scaled classes. (A C++
    activation op with no class fails test_conformance's opcheck coverage: the activation cases
    are generated from the classes.)"""
    ops = _registered_ops()
    for cls in ACTIVATIONS:
        assert {f"{cls.op_stem}_fwd", f"{cls.op_stem}_bwd"} <= ops, cls
    assert {n for n in ops if n.startswith("dbias_d")} == \
        {f"dbias_d{c.op_stem}" for c in ACTIVATIONS if c.fuses_dbias_dact}
    assert {n for n in ops if n.startswith("scaled_")} == \
        {f"{c.op_stem}_{k}" for c in SCALED for k in ("fwd", "bwd")}


@pytest.mark.parametrize("cls", ACTIVATIONS, ids=_ids(ACTIVATIONS))
def test_gated_is_what_the_kernels_do(cls):
    """``gated`` halves the last dim, as the C++ forward does (a tiny call of each kernel)."""
    op = cls()
    x = torch.randn(3, 8)
    args = op._op_args()
    if cls in SCALED:
        y = getattr(te_ops, f"{cls.op_stem}_fwd")(x, torch.ones(3), *args)
    else:
        y = getattr(te_ops, f"{cls.op_stem}_fwd")(x, *args)
    assert y.shape == (3, 4 if cls.gated else 8)


# ---- the fusions --------------------------------------------------------------------------------


def _fused_types(fusion, ops):
    return [type(op) for op in fusion(ops)]


@pytest.mark.parametrize("cls", ACTIVATIONS, ids=_ids(ACTIVATIONS))
def test_fusions_follow_the_class_attributes(cls):
    """Each fusion applies to exactly the activations whose class declares its kernel."""
    bias, lin = te.ops.Bias(8), te.ops.BasicLinear(8, 8)
    act = cls()
    assert _fused_types(F.extend_forward_bias_activation, [bias, act]) == \
        ([F.ForwardBiasActivation] if cls.fuses_bias_act else [te.ops.Bias, cls])
    assert _fused_types(F.extend_backward_activation_bias, [bias, act]) == \
        ([F.BackwardActivationBias] if cls.fuses_dbias_dact else [te.ops.Bias, cls])
    recipe = te.recipe.Float8CurrentScaling()
    assert [type(op) for op in F.fuse_backward_activation_bias([bias, act], recipe=recipe)] == \
        ([F.BackwardActivationBias] if cls.fuses_dbias_dact else [te.ops.Bias, cls])
    assert _fused_types(F.extend_forward_linear_bias_activation, [lin, act]) == \
        ([F.ForwardLinearBiasActivation] if cls.fuses_linear_bias_act
         else [te.ops.BasicLinear, cls])
    # the fused ops' constructors refuse the activations their kernel does not take
    for fused_cls, flag in ((F.ForwardBiasActivation, cls.fuses_bias_act),
                            (F.BackwardActivationBias, cls.fuses_dbias_dact)):
        if not flag:
            with pytest.raises(ValueError, match=f"{fused_cls.__name__}: the activation must "
                                                 f"be one of .*, got {cls.__name__}"):
                fused_cls(bias=bias, activation=act)
    if not cls.fuses_linear_bias_act:
        with pytest.raises(ValueError, match=r"ForwardLinearBiasActivation: unsupported "
                                             rf"activation {cls.__name__}"):
            F.ForwardLinearBiasActivation(linear=lin, activation=act)


@pytest.mark.parametrize("cls", LINEAR_BIAS_ACT, ids=_ids(LINEAR_BIAS_ACT))
def test_linear_epilogue_matches_the_float64_reference(cls):
    """Every activation the epilogue takes: [Linear, act] runs as one
    ForwardLinearBiasActivation, with the float64 reference's values and gradients."""
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.Linear(13, 7), cls())
    with torch.no_grad():
        model[0].bias.normal_()
    x = torch.randn(5, 13, requires_grad=True)
    y = model(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    fuser = model._module_groups[0]
    assert [type(op) for op, _ in fuser._forward_ops] == [F.ForwardLinearBiasActivation]
    w, b = model[0].weight, model[0].bias
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y64 = reference(cls())(ref.linear(x64, w64, b64))
    y64.backward(dy.double())
    tol = tols(torch.float32)
    torch.testing.assert_close(y.double(), y64, **tol)
    for ours, want in ((x.grad, x64.grad), (w.grad, w64.grad), (b.grad, b64.grad)):
        torch.testing.assert_close(ours.double(), want, **tol)


# ---- the docs ------------------------------------------------------------------------------


def _section(text: str, heading: str) -> str:
    """The text under a markdown heading, up to the next heading of the same or a higher
    level."""
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = re.compile(rf"\n#{{1,{len(level)}}} ").search(text, start)
    return text[start:end.start() if end else len(text)]


def _table(section: str) -> list[list[str]]:
    """The cells of the first markdown table in ``section`` (header and separator dropped)."""
    lines = section.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _kind(cls) -> str:
    return ("scaled " if cls in SCALED else "") + ("gated" if cls.gated else "unary")


def test_docs_activation_table_lists_exactly_the_registered_activations():
    """docs/ops.md's activation table: one row per class, in the table's order, with its kind,
    stem and fused kernels as the class declares them."""
    rows = _table(_section(OPS_MD.read_text(), "### The activation table"))
    mark = lambda flag: "yes" if flag else ""  # noqa: E731
    want = [[f"`{c.__name__}`", _kind(c), f"`{c.op_stem}`", mark(c.fuses_linear_bias_act),
             mark(c.fuses_bias_act), mark(c.fuses_dbias_dact)] for c in ACTIVATIONS]
    assert rows == want


@pytest.mark.parametrize("heading,classes", [("### Unary activations", UNARY),
                                             ("### Gated activations", GATED),
                                             ("### Scaled activations", SCALED)],
                         ids=["unary", "gated", "scaled"])
def test_docs_activation_sections_list_their_kind(heading, classes):
    rows = _table(_section(OPS_MD.read_text(), heading))
    assert [row[0] for row in rows] == [f"`{c.__name__}`" for c in classes]
    if heading != "### Gated activations":  # those tables give each class's stem
        assert [row[1 if classes is UNARY else 2] for row in rows] == \
            [f"`{c.op_stem}`" for c in classes]


def test_op_params_are_the_reference_arguments():
    """The references take the ops' configuration arguments in the ops' order: the defaults of
    both agree."""
    for cls in ACTIVATIONS:
        params = op_params(cls())
        sig = inspect.signature(reference_function(cls))
        defaults = [p.default for p in sig.parameters.values()
                    if p.default is not inspect.Parameter.empty
                    and p.name != "glu_interleave_size"]
        assert tuple(defaults) == params, cls
