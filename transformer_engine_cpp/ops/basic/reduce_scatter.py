"""ReduceScatter: sum over ranks, each rank keeping its dim-0 chunk (tensor/sequence
parallelism)."""

from __future__ import annotations

from ... import _comm
from ._comm import CommunicationOperation


class ReduceScatter(CommunicationOperation):
    """Reduce-scatter along the outer dimension: y is chunk ``rank`` (of ``group size`` equal
    chunks along dim 0) of the sum of x over the ranks of ``process_group`` (the default group
    when None). Dim 0 must be a multiple of the group size (a RuntimeError otherwise, as in
    TransformerEngine). Backward is the dual all-gather of dy. With one rank both passes are the
    identity. A quantized input is reduced dequantized."""

    def _forward_collective(self, x, group, size):
        return _comm.reduce_scatter(x, group, size, who="ReduceScatter", what="input")

    def _backward_collective(self, dy, group, size):
        return _comm.all_gather(dy, group, who="ReduceScatter", what="output gradient")
