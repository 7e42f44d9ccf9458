"""Peak memory of one MLP training step (forward + backward), ours against plain PyTorch.

The step is the pre-norm MLP block of ``bench/suite.py``'s C8 case (LayerNorm, Linear, GELU,
Linear, optionally with the residual), fp32. For each provider it prints the bytes autograd
saves in the forward and the peak CPU memory allocated during the whole step (the profiler's
memory timeline, ``common.peak_allocated_bytes``). ``ours, no early release`` runs the same
pipeline with the early release of saved tensors switched off (``ops/_pipeline.py``,
``RELEASE_MIN_NUMEL``): the row that shows whether that mechanism pays.

    python bench/memory.py [--tokens 1024] [--hidden 1024] [--ffn 4096]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import suite  # noqa: E402

from transformer_engine_cpp.ops import _pipeline  # noqa: E402


def measure(T: int, H: int, F: int, variant: str) -> list[tuple[str, int, int]]:
    plain, ours, (x,) = suite.mlp_builder(T, H, F, variant)(torch.float32)
    x.requires_grad_(True)
    rows = []

    def steps(model):
        def fwd():
            return model(x)

        def fwd_bwd():
            y = model(x)
            y.backward(torch.ones_like(y))
        return fwd, fwd_bwd

    release = _pipeline.RELEASE_MIN_NUMEL
    for name, model, threshold in (("torch", plain, release), ("ours", ours, release),
                                   ("ours, no early release", ours, 1 << 62)):
        _pipeline.RELEASE_MIN_NUMEL = threshold
        try:
            fwd, fwd_bwd = steps(model)
            fwd_bwd()  # warm-up: parameter grads allocated
            rows.append((name, common.saved_activation_bytes(fwd),
                         common.peak_allocated_bytes(fwd_bwd)))
        finally:
            _pipeline.RELEASE_MIN_NUMEL = release
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=4096)
    a = parser.parse_args()
    torch.manual_seed(0)
    for variant in ("plain", "residual"):
        print(f"MLP block ({variant}) fp32 {a.tokens}x{a.hidden}x{a.ffn}, forward + backward:")
        for name, saved, peak in measure(a.tokens, a.hidden, a.ffn, variant):
            print(f"  {name:24s} saved {saved / 2**20:7.1f} MiB   peak {peak / 2**20:7.1f} MiB")


if __name__ == "__main__":
    main()
