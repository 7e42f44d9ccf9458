"""TransformerEngine's ``QuantizerRole``: which tensor slot of which module a quantizer serves."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class QuantizerRole:
    """The identity of a quantizer slot (TransformerEngine's, experimental there too).

    Fields (empty when not known): ``module_type`` (e.g. ``"linear"``,
    ``"grouped_linear"``), ``tensor_type`` (``"input"``, ``"weight"``, ``"grad_output"``,
    ...), ``name`` (the module instance's name given by the caller)."""

    module_type: str = ""
    tensor_type: str = ""
    name: str = ""

    def __str__(self) -> str:
        parts = [f"{field}={value}" for field, value in (
            ("module_type", self.module_type), ("tensor_type", self.tensor_type),
            ("name", self.name)) if value]
        return "|".join(parts) if parts else "QuantizerRole()"
