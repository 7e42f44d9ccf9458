"""TransformerEngine's ``transformer_engine.common`` path, for ported scripts:
``from transformer_engine_cpp.common import recipe`` and
``from transformer_engine_cpp.common.recipe import DelayedScaling, Format`` give
``transformer_engine_cpp.recipe`` (the same module object, so the same classes)."""

import sys

from .. import recipe

# ``import transformer_engine_cpp.common.recipe`` finds the module under this name
sys.modules[__name__ + ".recipe"] = recipe

__all__ = ["recipe"]
