import pytest
import torch

import transformer_engine_cpp  # noqa: F401  (registers torch.ops.te_cpp.*)


@pytest.fixture(autouse=True)
def _reset_dynamo():
    """Each test starts with a clean Dynamo cache and counters."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


@pytest.fixture
def fusion_registry():
    """Restores the process-wide fusion registries after a test registers its own."""
    from transformer_engine_cpp.ops.fuser import OperationFuser

    saved = {name: list(getattr(OperationFuser, name)) for name in
             ("forward_fusion_functions", "backward_fusion_functions",
              "forward_backward_fusion_functions", "extension_forward_fusion_functions",
              "extension_backward_fusion_functions",
              "extension_forward_backward_fusion_functions")}
    yield
    for name, funcs in saved.items():
        setattr(OperationFuser, name, funcs)
    OperationFuser._fusion_registry_version += 1
