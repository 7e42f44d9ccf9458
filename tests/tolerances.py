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
#: E4M3 operand carries up to ~19%. The conformance shapes reduce over few terms (7 to 13, fewer
#: where a ReLU masks dy), so little averages out: observed maxima 4.8% forward, 13.8% backward
#: (tests/test_fp8_ops.py::test_op_case_under_a_recipe, current scaling).
FP8_RELATIVE_ERROR = {"forward": 0.1, "backward": 0.2}
