"""One process-wide kernel setting measured off and on, alternating in one process: the
streaming stores of large fp32 / fp64 outputs (`_C.set_stream_store_min_bytes`) or the
activation lookup tables of bf16 / fp16 calls (`_C.set_activation_lookup_use`).

    python bench/kernel_ab.py --switch stream [--threads 2] [--dtypes float32] [--rounds 4]
    python bench/kernel_ab.py --switch lookup --dtypes bfloat16 float16

Whole suite runs on the shared development VMs differ from one another by more than such a
setting moves a row (docs/architecture.md, Benchmarks); switching it between calls of one
process, on the same model and inputs, is what tells it. The kernels are the suite's own
models (bench/suite.py's case builders, ours only): for the streaming stores, the sizes whose
outputs reach the default threshold (the last-level cache, at most 32 MiB) plus LayerNorm at
4096x1024 (16 MiB in fp32, streamed only where the cache is smaller) as a control; for the
tables, the exp-based activations.

Method: per kernel, mode (a no_grad forward, or a backward on a retained graph) and round,
`calls` timed calls with the setting off, then `calls` with it on, each run after one untimed
call; a round's figure is the median per call. "speedup" is off / on per round, the median
(min-max) over rounds: above 1, the setting makes the kernel faster. The process runs on the
benchmarks' allocator (bench/allocator.py), so no call faults fresh pages in.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import common  # noqa: E402
import suite  # noqa: E402
from transformer_engine_cpp import _C  # noqa: E402

NEVER = 1 << 62  # a streaming threshold no output reaches
LOOKUP_ALL = 15  # every dtype and direction reads its tables (csrc/kernels/cpu/lookup_count.h)

# switch -> (off, on, restore) for the process, and the dtypes it concerns
SWITCHES = {
    "stream": ((lambda: _C.set_stream_store_min_bytes(NEVER)),
               (lambda: _C.set_stream_store_min_bytes(-1)),
               (lambda: _C.set_stream_store_min_bytes(-1)),
               ("float32", "float64")),
    "lookup": ((lambda: _C.set_activation_lookup_use(0)),
               (lambda: _C.set_activation_lookup_use(LOOKUP_ALL)),
               (lambda: _C.set_activation_lookup_use(-1)),
               ("bfloat16", "float16")),
}

# switch -> (label, case, its modes), at full size; --quick takes 64 rows of each
KERNELS = {
    "stream": (
        ("LayerNorm", lambda T=16384: suite.layernorm_case(T, 1024), ("fwd", "bwd")),
        ("RMSNorm", lambda T=16384: suite.rmsnorm_case(T, 1024), ("fwd", "bwd")),
        ("Bias + GELU", lambda T=4096: suite.bias_act_case(T, 4096, "gelu"), ("fwd", "bwd")),
        ("Bias + ReLU", lambda T=4096: suite.bias_act_case(T, 4096, "relu"), ("fwd", "bwd")),
        ("SwiGLU", lambda T=16384: suite.swiglu_case(T, 4096), ("fwd", "bwd")),
        ("LayerNorm (control)", lambda T=4096: suite.layernorm_case(T, 1024), ("fwd", "bwd")),
    ),
    "lookup": (
        ("Bias + GELU", lambda T=4096: suite.bias_act_case(T, 4096, "gelu"), ("fwd", "bwd")),
        ("SwiGLU", lambda T=4096: suite.swiglu_case(T, 4096), ("fwd", "bwd")),
    ),
}


def _calls(model, x, mode: str):
    """The timed call: a no_grad forward, or a backward of one forward on a retained graph."""
    if mode == "fwd":
        def fwd():
            with torch.no_grad():
                return model(x)
        return fwd
    x = x.detach().requires_grad_()
    y = model(x)
    dy = torch.randn_like(y)
    return lambda: torch.autograd.grad(y, [x], dy, retain_graph=True)


def _alternate(fn, off, on, rounds: int, calls: int) -> tuple[list, list]:
    """Per round, fn's median µs per call with the setting off, then on."""
    offs, ons = [], []
    for _ in range(rounds):
        off()
        offs.append(common.median_call_s(fn, calls) * 1e6)
        on()
        ons.append(common.median_call_s(fn, calls) * 1e6)
    return offs, ons


def run(switch: str, dtypes, threads: int, rounds: int, calls: int, quick: bool,
        log=print) -> list[dict]:
    off, on, restore, concerned = SWITCHES[switch]
    for d in dtypes:
        if d not in concerned:
            raise SystemExit(f"kernel_ab: --switch {switch} concerns {', '.join(concerned)} "
                             f"outputs, not {d}")
    torch.set_num_threads(threads)
    rows = []
    try:
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            for label, make, modes in KERNELS[switch]:
                case = make(64) if quick else make()
                torch.manual_seed(0)
                _, ours, (x,) = case.build(dtype)
                for mode in modes:
                    offs, ons = _alternate(_calls(ours, x, mode), off, on, rounds, calls)
                    ratios = [a / b for a, b in zip(offs, ons)]
                    row = {"kernel": label, "shape": case.shape, "dtype": dtype_name,
                           "mode": mode, "off_us": statistics.median(offs),
                           "on_us": statistics.median(ons),
                           "speedup": statistics.median(ratios), "lo": min(ratios),
                           "hi": max(ratios)}
                    rows.append(row)
                    log(_line(row))
    finally:
        restore()
    return rows


def _line(r: dict) -> str:
    return (f"{r['kernel']:<20} {r['mode']:<4} {r['dtype']:<9} {r['shape']:<12} off "
            f"{r['off_us']:9.0f} µs  on {r['on_us']:9.0f} µs  speedup {r['speedup']:.2f} "
            f"({r['lo']:.2f}-{r['hi']:.2f})")


def main() -> None:
    common.ensure_benchmark_allocator()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--switch", choices=sorted(SWITCHES), required=True)
    parser.add_argument("--dtypes", nargs="+", help="default: the switch's first dtype")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=9, help="timed calls per setting a round")
    parser.add_argument("--quick", action="store_true",
                        help="64 rows of each kernel, for a check that the script runs")
    a = parser.parse_args()
    dtypes = a.dtypes or [SWITCHES[a.switch][3][0]]
    print(f"{a.switch}: {a.threads} threads, {a.rounds} rounds of {a.calls} calls per setting "
          f"({common.environment()})")
    run(a.switch, dtypes, a.threads, a.rounds, a.calls, a.quick)


if __name__ == "__main__":
    main()
