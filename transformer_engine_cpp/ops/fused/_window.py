"""Pattern matching for fusion functions: a left-to-right scan that replaces matched windows."""

from __future__ import annotations

from typing import Callable, Optional


def fuse_windows(ops: list, match: Callable[[list, int], Optional[tuple]]) -> list:
    """``match(ops, i)`` returns ``(fused_op, n_ops)`` when a fusion starts at ``ops[i]``, else
    None. Matched windows are replaced by their fused op; scanning resumes after them."""
    out = []
    i = 0
    while i < len(ops):
        found = match(ops, i)
        if found is None:
            out.append(ops[i])
            i += 1
        else:
            fused, count = found
            out.append(fused)
            i += count
    return out
