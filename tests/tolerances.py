"""The one tolerance table: results in each dtype against a float64 plain-PyTorch reference.

fp32/fp16/bf16 are torch.testing's defaults for those dtypes (a few units of the dtype's
rounding error); fp64 results are compared tightly. Compiled vs eager uses the same kernels,
so it is compared exactly (COMPILED_VS_EAGER).
"""

import torch

TOLERANCES = {
    torch.float64: dict(rtol=1e-10, atol=1e-12),
    torch.float32: dict(rtol=1.3e-6, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-5),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5),
}

COMPILED_VS_EAGER = dict(rtol=0.0, atol=0.0)


def tols(dtype: torch.dtype) -> dict:
    return TOLERANCES[dtype]

#: FP8 GEMMs against the unquantized result, as a norm-wise relative error ||a - b|| / ||b||.
#: Forward operands are E4M3 (3 mantissa bits: per-element rounding up to 2^-4), so a product
#: carries up to ~12.5%; backward gradients are E5M2 (2 bits: up to 2^-3), so a product with an
#: E4M3 operand carries up to ~19%. The conformance shapes reduce over few terms (7 to 64, fewer
#: where a ReLU masks dy, and a mask flipped by the quantized forward adds its own error), so
#: little averages out: observed maxima 4.8% forward, 18.6% backward
#: (tests/test_fp8_ops.py::test_op_case_under_a_recipe: current scaling, Float8BlockScaling,
#: MXFP8 on Linear+ReLU).
FP8_RELATIVE_ERROR = {"forward": 0.1, "backward": 0.2}

#: NVFP4 (E2M1: 1 mantissa bit, per-element rounding up to 20% at the midpoints between
#: representable values) against the unquantized result, the same measure. Its recipe also
#: rounds gradients stochastically (unbiased, but a larger error per element than round to
#: nearest) and applies the random Hadamard transform to the wgrad operands. Observed maxima
#: 14.7% forward, 32.2% backward (Linear+ReLU, with flipped masks), same test.
NVFP4_RELATIVE_ERROR = {"forward": 0.25, "backward": 0.4}

#: Quantized GEMMs against the unquantized result, by recipe class name.
QUANTIZED_RELATIVE_ERROR = {
    "Float8CurrentScaling": FP8_RELATIVE_ERROR,
    "DelayedScaling": FP8_RELATIVE_ERROR,
    "Float8BlockScaling": FP8_RELATIVE_ERROR,
    "MXFP8BlockScaling": FP8_RELATIVE_ERROR,
    "NVFP4BlockScaling": NVFP4_RELATIVE_ERROR,
}
