"""TransformerEngine's dtype tags (``transformer_engine.pytorch.DType``), for ported code that
names formats by them: every quantizer and quantized tensor here takes such a tag wherever it
takes an FP8 format, as the torch dtype it names."""

from __future__ import annotations

import enum

import torch


class DType(enum.IntEnum):
    """TransformerEngine's dtype tags, with the values of its C API's ``NVTEDType``."""

    kByte = 0
    kInt32 = 2
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat4E2M1 = 10

    @classmethod
    def cast(cls, dtype) -> "DType":
        """A tag (or its integer value) as a ``DType`` member."""
        return dtype if isinstance(dtype, cls) else cls(int(dtype))


#: torch dtype -> tag, and back (TransformerEngine's ``TE_DType`` / ``TE_DType_To_Torch``)
TE_DType = {
    torch.uint8: DType.kByte,
    torch.float8_e4m3fn: DType.kFloat8E4M3,
    torch.float8_e5m2: DType.kFloat8E5M2,
    torch.int32: DType.kInt32,
    torch.float32: DType.kFloat32,
    torch.half: DType.kFloat16,
    torch.bfloat16: DType.kBFloat16,
}
TE_DType_To_Torch = {tag: dtype for dtype, tag in TE_DType.items()}
