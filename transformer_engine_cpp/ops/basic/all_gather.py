"""AllGather: concatenate every rank's tensor along dim 0 (tensor/sequence parallelism)."""

from __future__ import annotations

from ... import _comm
from ._comm import CommunicationOperation


class AllGather(CommunicationOperation):
    """All-gather along the outer dimension: y is the concatenation along dim 0 of x from every
    rank of ``process_group`` (the default group when None), in rank order. Backward is the
    dual reduce-scatter: dx is this rank's dim-0 chunk of the sum of dy over the ranks. With one
    rank both passes are the identity. A quantized input is gathered dequantized."""

    def _forward_collective(self, x, group, size):
        return _comm.all_gather(x, group, who="AllGather", what="input")

    def _backward_collective(self, dy, group, size):
        return _comm.reduce_scatter(dy, group, size, who="AllGather", what="output gradient")
