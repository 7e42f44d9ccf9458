"""The front end / backend layout (csrc/common/backend.h): every op has a Meta kernel and a CPU
kernel, and every backend stub a CPU kernel. The CUDA side is checked by
scripts/check_cuda_build.py on the compile-only CUDA build."""

import torch

import transformer_engine_cpp  # noqa: F401  (loads the ops)
from transformer_engine_cpp import _C


def _te_ops():
    return sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("te_cpp::"))


def test_every_op_has_meta_and_cpu_kernels():
    ops = _te_ops()
    assert len(ops) >= 70
    for key in ("Meta", "CPU"):
        missing = [op for op in ops if not torch._C._dispatch_has_kernel_for_dispatch_key(op, key)]
        assert not missing, f"no {key} kernel: {missing}"


def test_every_backend_stub_has_a_cpu_kernel():
    stubs = _C.kernel_stubs()
    assert {"bias_add_stub", "column_sum_stub", "scale_stub", "add_stub"} <= {s[0] for s in stubs}
    assert len({s[0] for s in stubs}) == len(stubs), "a stub name is defined twice"
    assert [s[0] for s in stubs if not s[1]] == []
    if not _C.built_with_cuda():
        assert [s[0] for s in stubs if s[2]] == [], "a CUDA kernel in a CPU-only build"
