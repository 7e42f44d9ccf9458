"""TransformerEngine's top-level names this package does not provide, and the errors that say
so (the package's module-level ``__getattr__``).

A script ported from ``import transformer_engine.pytorch as te`` reaches for TransformerEngine's
module API (``te.Linear``, ``te.LayerNormMLP``, ``te.TransformerLayer``, ...). This package
implements the fusible operations API (``te.ops``) only, so those names raise an
AttributeError (an ImportError in ``from transformer_engine_cpp import ...``) that says what
the name is in TransformerEngine and, where one exists, the ``te.ops`` equivalent.
"""

from __future__ import annotations

import dis
import sys

#: TransformerEngine's module API (torch.nn.Modules in transformer_engine.pytorch) -> the te.ops
#: equivalent, or None where there is none.
MODULE_API = {
    "Linear": "te.ops.Linear(in_features, out_features, bias=True)",
    "LayerNormLinear": ("te.ops.Sequential(te.ops.LayerNorm(in_features), "
                        "te.ops.Linear(in_features, out_features))"),
    "LayerNormMLP": ("te.ops.Sequential(te.ops.LayerNorm(hidden_size), "
                     "te.ops.Linear(hidden_size, ffn_hidden_size), te.ops.GELU(), "
                     "te.ops.Linear(ffn_hidden_size, hidden_size))"),
    "LayerNorm": "te.ops.LayerNorm(normalized_shape)",
    "RMSNorm": "te.ops.RMSNorm(normalized_shape)",
    "GroupedLinear": "te.ops.GroupedLinear(num_groups, in_features, out_features)",
    "DotProductAttention": None,
    "MultiheadAttention": None,
    "TransformerLayer": None,
    "GatedDeltaNetAttention": None,
    "RotaryPositionEmbedding": None,
    "InferenceParams": None,
    "Fp8Padding": None,
    "Fp8Unpadding": None,
}

#: TransformerEngine's other top-level names that this package does not provide.
OTHER_NAMES = frozenset({
    "initialize_ub", "destroy_ub", "UserBufferQuantizationMode", "make_graphed_callables",
    "checkpoint", "CudaRNGStatesTracker", "moe_permute", "moe_permute_with_probs",
    "moe_permute_and_pad_with_probs", "moe_unpermute", "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs", "get_cpu_offload_context", "mark_not_offload",
    "ManualOffloadSynchronizer", "optimizers", "onnx_export", "parallel_cross_entropy",
    "apply_recipe", "QuantizerRequest", "DelayedScalingRequest", "quantizer_factory",
    "get_cudnn_version", "get_device_compute_capability", "interleave_glu_tensor",
    "deinterleave_glu_tensor", "CPLoadBalancingStrategy", "HybridQuantizer",
    "HybridQuantizedTensor", "IdentityQuantizer", "IdentityTensor",
})

PACKAGE = "transformer_engine_cpp"


class TransformerEngineNameError(AttributeError):
    """A TransformerEngine name this package does not provide."""


class TransformerEngineImportError(ImportError):
    """The same, raised by ``from transformer_engine_cpp import <name>``."""


def message(name: str) -> str:
    te_name = f"transformer_engine.pytorch.{name}"
    if name in MODULE_API:
        head = (f"{PACKAGE} has no {name}: {te_name} is TransformerEngine's module API, which "
                f"this package does not implement; it implements the fusible operations API, "
                f"te.ops")
        equivalent = MODULE_API[name]
        if equivalent is None:
            return f"{head}, which has no equivalent of {name}"
        return f"{head}. Use {equivalent} instead"
    return (f"{PACKAGE} has no {name}: {te_name} is not provided by this package, which "
            "implements TransformerEngine's fusible operations API (te.ops)")


def _called_from_import(frame) -> bool:
    """Whether ``frame`` is running ``from <package> import <name>``."""
    code = frame.f_code.co_code
    lasti = frame.f_lasti
    return 0 <= lasti < len(code) and code[lasti] == dis.opmap["IMPORT_FROM"]


def module_getattr(name: str):
    """The package's ``__getattr__``: the errors above for TransformerEngine's names, the
    usual AttributeError for anything else."""
    if name not in MODULE_API and name not in OTHER_NAMES:
        raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
    text = message(name)
    # ``from ... import`` turns an AttributeError into a generic ImportError ("cannot import
    # name"), dropping this text: raise the ImportError here instead
    if _called_from_import(sys._getframe(1)):
        raise TransformerEngineImportError(text, name=PACKAGE)
    raise TransformerEngineNameError(text, name=name, obj=sys.modules[PACKAGE])
