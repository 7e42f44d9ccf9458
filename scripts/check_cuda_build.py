"""Checks a CUDA build of the extension (`make cuda-build`) on a machine with or without a GPU.

Usage: python scripts/check_cuda_build.py build/cuda/lib/transformer_engine_cpp/_C.so

Loads the shared library with the CUDA build of torch (`torch.ops.load_library`, which runs its
TORCH_LIBRARY registrations) and asserts that:
  * the library was compiled with the CUDA kernels (`_C.built_with_cuda()`);
  * every op in CUDA_OPS reports a kernel for the CUDA dispatch key;
  * no other te_cpp op does (a new CUDA kernel must be added to CUDA_OPS, and to the CUDA status
    in README.md);
  * every backend stub of the front ends (csrc/common/backend.h) has its CUDA kernel: an op
    registered for CUDA reaches CUDA code for every path it takes.
Nothing is run on a GPU. Exits non-zero, naming the ops, when a check fails.
"""

import importlib.util
import sys

import torch

# The ops that have a CUDA kernel, by family (csrc/kernels/cuda/<family>.cu).
CUDA_OPS = {
    "elementwise": [
        "bias_fwd", "bias_bwd", "constant_scale_fwd", "constant_scale_bwd",
        "add_extra_input_fwd", "add_extra_input_fwd_inplace",
        "make_extra_output_bwd", "make_extra_output_bwd_inplace",
    ],
    "normalization": [
        "layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "rmsnorm_bwd_add",
    ],
    "l2norm": ["l2normalization_fwd", "l2normalization_bwd"],
    "activation": [
        *[f"{stem}_{d}" for stem in ("gelu", "relu", "silu", "qgelu", "srelu")
          for d in ("fwd", "bwd")],
        *[f"dbias_d{stem}" for stem in ("gelu", "relu", "silu", "qgelu", "srelu")],
        "bias_act_fwd",
        *[f"{stem}_{d}" for stem in ("glu", "geglu", "qgeglu", "reglu", "sreglu", "swiglu",
                                     "clamped_swiglu", "situglu") for d in ("fwd", "bwd")],
        *[f"{stem}_{d}" for stem in ("scaled_srelu", "scaled_swiglu", "scaled_clamped_qgeglu",
                                     "scaled_situglu") for d in ("fwd", "bwd")],
    ],
    "quantize": [
        "fp8_quantize", "fp8_quantize_scaled", "fp8_amax", "fp8_current_scale", "fp8_dequantize",
        "mxfp8_quantize", "mxfp8_dequantize", "fp8_delayed_scaling_update",
    ],
    "nvfp4": ["nvfp4_quantize", "nvfp4_dequantize"],
    "fp8_block": ["fp8_block_quantize", "fp8_block_dequantize"],
    "dropout": ["dropout_fwd", "dropout_bwd", "random_seeds"],
    "transpose": ["transpose_2d"],
    "linear": [
        "linear_fwd", "linear_bias_act_fwd", "linear_fwd_add", "linear_fwd_add_inplace",
        "linear_dgrad", "linear_dgrad_add", "linear_wgrad", "linear_bwd", "fp8_gemm", "mxfp8_gemm",
    ],
    "grouped": [
        "grouped_linear_fwd", "grouped_linear_dgrad", "grouped_linear_wgrad", "grouped_bias_bwd",
        "grouped_fp8_quantize", "grouped_fp8_dequantize", "grouped_mxfp8_quantize",
        "grouped_fp8_linear_fwd", "grouped_fp8_block_quantize", "grouped_fp8_block_dequantize",
        "grouped_nvfp4_quantize", "grouped_nvfp4_dequantize",
    ],
}


def main(path):
    if torch.version.cuda is None:
        sys.exit(f"check_cuda_build: torch {torch.__version__} is a CPU build; run this check "
                 "with the CUDA build of torch (.venv-cuda)")
    torch.ops.load_library(path)
    # The same file as a Python module, for its build information (already loaded: no second
    # registration).
    spec = importlib.util.spec_from_file_location("transformer_engine_cpp._C", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not module.built_with_cuda():
        sys.exit(f"check_cuda_build: {path} was built without CUDA (TECPP_WITH_CUDA unset?)")

    ops = sorted(name for name in torch._C._dispatch_get_all_op_names()
                 if name.startswith("te_cpp::"))
    if not ops:
        sys.exit(f"check_cuda_build: {path} registered no te_cpp ops")
    has_cuda = {op for op in ops if torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA")}
    expected = {f"te_cpp::{op}" for family in CUDA_OPS.values() for op in family}

    for family, names in CUDA_OPS.items():
        for op in names:
            mark = "ok" if f"te_cpp::{op}" in has_cuda else "MISSING"
            print(f"  CUDA kernel  {family:12s} te_cpp::{op:32s} {mark}")
    missing = sorted(expected - has_cuda)
    unexpected = sorted(has_cuda - expected)
    print(f"check_cuda_build: torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"{len(ops)} te_cpp ops, {len(has_cuda)} with a CUDA kernel, "
          f"{len(ops) - len(has_cuda)} without")
    if missing:
        sys.exit("check_cuda_build: FAILED: no CUDA kernel registered for " + ", ".join(missing))
    if unexpected:
        sys.exit("check_cuda_build: FAILED: CUDA kernels not listed in CUDA_OPS (add them there "
                 "and to the CUDA status in README.md): " + ", ".join(unexpected))
    stubs = module.kernel_stubs()
    no_cuda = sorted(name for name, _, has_cuda_kernel in stubs if not has_cuda_kernel)
    print(f"check_cuda_build: {len(stubs)} backend stubs, {len(stubs) - len(no_cuda)} with a "
          "CUDA kernel")
    if no_cuda:
        sys.exit("check_cuda_build: FAILED: backend stubs without a CUDA kernel: "
                 + ", ".join(no_cuda))
    print("check_cuda_build: OK")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
