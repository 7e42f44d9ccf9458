"""transformer_engine_cpp: TransformerEngine's fusible operations (``te.ops``) as PyTorch C++
custom ops. CPU kernels today; the build has a CUDA path for the CUDA kernels to come.

    import transformer_engine_cpp as te
    model = te.ops.Sequential(te.ops.Bias(64), te.ops.GELU())
"""

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C  # noqa: F401  (registers torch.ops.te_cpp.*)
from . import ops

__version__ = "0.1.0"


def built_with_cuda() -> bool:
    """Whether the extension was built with the CUDA toolchain (csrc/kernels/cuda/)."""
    return _C.built_with_cuda()


__all__ = ["ops", "built_with_cuda", "__version__"]
