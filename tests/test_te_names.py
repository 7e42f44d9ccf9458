"""TransformerEngine names a ported script reaches for: ``transformer_engine.common.recipe``'s
path, and clear errors for TransformerEngine's module API (``te.Linear``, ...), which this
package does not implement."""

from __future__ import annotations

import importlib

import pytest

import transformer_engine_cpp as te
from transformer_engine_cpp import _te_names


def test_common_recipe_imports_as_in_transformer_engine():
    namespace: dict = {}
    exec("from transformer_engine_cpp.common import recipe", namespace)  # noqa: S102
    assert namespace["recipe"] is te.recipe
    exec("from transformer_engine_cpp.common.recipe import Float8CurrentScaling, "  # noqa: S102
         "DelayedScaling, Format, MXFP8BlockScaling", namespace)
    assert namespace["DelayedScaling"] is te.recipe.DelayedScaling
    assert namespace["Format"].HYBRID is te.recipe.Format.HYBRID
    assert importlib.import_module("transformer_engine_cpp.common.recipe") is te.recipe
    assert te.common.recipe is te.recipe
    # a recipe built through either path is accepted by te.autocast
    with te.autocast(recipe=namespace["Float8CurrentScaling"]()):
        pass


MODULE_API_ERRORS = {
    "Linear": "transformer_engine_cpp has no Linear: transformer_engine.pytorch.Linear is "
              "TransformerEngine's module API, which this package does not implement; it "
              "implements the fusible operations API, te.ops. Use te.ops.Linear(in_features, "
              "out_features, bias=True) instead",
    "LayerNormMLP": "transformer_engine_cpp has no LayerNormMLP: "
                    "transformer_engine.pytorch.LayerNormMLP is TransformerEngine's module API, "
                    "which this package does not implement; it implements the fusible "
                    "operations API, te.ops. Use te.ops.Sequential(te.ops.LayerNorm("
                    "hidden_size), te.ops.Linear(hidden_size, ffn_hidden_size), te.ops.GELU(), "
                    "te.ops.Linear(ffn_hidden_size, hidden_size)) instead",
    "TransformerLayer": "transformer_engine_cpp has no TransformerLayer: "
                        "transformer_engine.pytorch.TransformerLayer is TransformerEngine's "
                        "module API, which this package does not implement; it implements the "
                        "fusible operations API, te.ops, which has no equivalent of "
                        "TransformerLayer",
}


@pytest.mark.parametrize("name", list(MODULE_API_ERRORS))
def test_module_api_attribute_error(name):
    with pytest.raises(AttributeError) as info:
        getattr(te, name)
    assert str(info.value) == MODULE_API_ERRORS[name]
    assert not hasattr(te, name)


@pytest.mark.parametrize("name", list(MODULE_API_ERRORS))
def test_module_api_import_error(name):
    with pytest.raises(ImportError) as info:
        exec(f"from transformer_engine_cpp import {name}", {})  # noqa: S102
    assert str(info.value) == MODULE_API_ERRORS[name]


@pytest.mark.parametrize("name", sorted(_te_names.MODULE_API))
def test_every_module_api_name_points_to_te_ops_or_says_there_is_none(name):
    text = _te_names.message(name)
    equivalent = _te_names.MODULE_API[name]
    if equivalent is None:
        assert text.endswith(f"te.ops, which has no equivalent of {name}")
    else:
        # the equivalent named in the message exists and builds
        assert text.endswith(f"Use {equivalent} instead")
        assert callable(getattr(te.ops, equivalent.split("(")[0].split(".")[-1]))
    assert not hasattr(te, name)


def test_other_transformer_engine_names():
    with pytest.raises(AttributeError, match=r"^transformer_engine_cpp has no moe_permute: "
                       r"transformer_engine\.pytorch\.moe_permute is not provided by this "
                       r"package, which implements TransformerEngine's fusible operations API "
                       r"\(te\.ops\)$"):
        te.moe_permute  # noqa: B018
    with pytest.raises(ImportError, match="make_graphed_callables is not provided"):
        exec("from transformer_engine_cpp import make_graphed_callables", {})  # noqa: S102


def test_unknown_names_keep_the_usual_errors():
    with pytest.raises(AttributeError, match=r"^module 'transformer_engine_cpp' has no "
                                             r"attribute 'no_such_name'$"):
        te.no_such_name  # noqa: B018
    assert not hasattr(te, "no_such_name")
    with pytest.raises(ImportError, match=r"^cannot import name 'no_such_name' from "
                                          r"'transformer_engine_cpp'"):
        exec("from transformer_engine_cpp import no_such_name", {})  # noqa: S102
    # the names this package does provide are unaffected
    from transformer_engine_cpp import Float8Tensor, autocast, ops  # noqa: F401,PLC0415
