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
