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
