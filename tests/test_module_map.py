"""Module paths: each TransformerEngine module under ``transformer_engine.pytorch.ops`` that we
implement imports as ``transformer_engine_cpp.ops.<path>`` and defines the same public names."""

from __future__ import annotations

import importlib

import pytest

import transformer_engine_cpp.ops as ops

# TransformerEngine's module (relative to ``ops``) -> the public names it defines.
# Not implemented yet, so not listed:
#   basic.adaptive_layer_norm: AdaptiveLayerNorm (issue 15)
TRANSFORMER_ENGINE_MODULES = {
    "basic.activation": ("GELU", "GEGLU", "GLU", "QGELU", "QGEGLU", "ReLU", "ReGLU", "SReLU",
                         "ScaledSReLU", "SReGLU", "SiLU"),
    "basic.add_extra_input": ("AddExtraInput",),
    "basic.all_gather": ("AllGather",),
    "basic.all_reduce": ("AllReduce",),
    "basic.basic_linear": ("BasicLinear",),
    "basic.bias": ("Bias",),
    "basic.constant_scale": ("ConstantScale",),
    "basic.dropout": ("Dropout",),
    "basic.grouped_linear": ("GroupedLinear",),
    "basic.identity": ("Identity",),
    "basic.l2normalization": ("L2Normalization",),
    "basic.layer_norm": ("LayerNorm",),
    "basic.make_extra_output": ("MakeExtraOutput",),
    "basic.quantize": ("Quantize",),
    "basic.reduce_scatter": ("ReduceScatter",),
    "basic.reshape": ("Reshape",),
    "basic.rmsnorm": ("RMSNorm",),
    "basic.swiglu": ("ClampedSwiGLU", "ScaledClampedQGeGLU", "ScaledSiTUGLU", "ScaledSwiGLU",
                     "SiTUGLU", "SwiGLU"),
    "fused.backward_activation_bias": ("BackwardActivationBias",),
    "fused.backward_add_rmsnorm": ("BackwardAddRMSNorm",),
    "fused.backward_linear_add": ("BackwardLinearAdd",),
    "fused.backward_linear_scale": ("BackwardLinearScale",),
    "fused.forward_linear_bias_activation": ("ForwardLinearBiasActivation",),
    "fused.forward_linear_bias_add": ("ForwardLinearBiasAdd",),
    "fused.forward_linear_scale_add": ("ForwardLinearScaleAdd",),
    "fuser": ("OperationFuser", "register_backward_fusion", "register_forward_backward_fusion",
              "register_forward_fusion"),
    "linear": ("Linear",),
    "op": ("BasicOperation", "FusedOperation", "FusibleOperation", "OperationContext"),
    "sequential": ("Sequential",),
}

# Our fused ops without a TransformerEngine counterpart.
OUR_MODULES = {
    "fused.backward_linear_bias": ("BackwardLinearBias",),
    "fused.forward_bias_activation": ("ForwardBiasActivation",),
    "fused.grouped_mlp": ("GroupedMLP",),
}

CASES = [(path, name) for table in (TRANSFORMER_ENGINE_MODULES, OUR_MODULES)
         for path, names in table.items() for name in names]


def _public(path: str, name: str):
    """The object as the package exports it: ``ops.fused.<name>`` for a fused module's name,
    else ``ops.<name>``."""
    return getattr(ops.fused if path.startswith("fused.") else ops, name)


@pytest.mark.parametrize("path,name", CASES, ids=[f"{p}.{n}" for p, n in CASES])
def test_module_defines_name(path, name):
    module = importlib.import_module("transformer_engine_cpp.ops." + path)
    assert hasattr(module, name), f"transformer_engine_cpp.ops.{path} has no {name}"
    assert getattr(module, name) is _public(path, name)


def test_every_exported_op_is_mapped():
    """Each public op of ``ops.basic`` and ``ops.fused`` is in one of the tables, under the
    module that defines it."""
    mapped = {name: path for path, name in CASES}
    exported = [(ops.basic, name) for name in ops.basic.__all__]
    exported += [(ops.fused, name) for name in ops.fused.__all__
                 if not name.startswith("register_")]
    for package, name in exported:
        assert name in mapped, f"{package.__name__}.{name} is in no table"
        obj = getattr(package, name)
        assert obj.__module__ == "transformer_engine_cpp.ops." + mapped[name], name
