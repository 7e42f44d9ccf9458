"""LayerNorm and RMSNorm on CPU: ours against torch in the same run.

Providers per case:
  kernel level   fwd: torch.ops.te_cpp.<norm>_fwd vs aten (F.layer_norm / aten._fused_rms_norm)
                 bwd: torch.ops.te_cpp.<norm>_bwd vs aten's backward kernel
  module level   fwd+bwd: te.ops.<Norm> (the fuser) vs F.layer_norm / F.rms_norm with autograd,
                 and torch.compile of the plain function

    python bench/bench_norms.py [--quick] [--threads 2] [--tokens 4096] [--hidden 1024]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_engine_cpp as te  # noqa: E402
from common import Provider, check_close, environment, run_case, write_outputs  # noqa: E402

te_ops = torch.ops.te_cpp


def layernorm_cases(T, H, dtype, args, results):
    torch.manual_seed(0)
    x = torch.randn(T, H, dtype=dtype)
    w, b = torch.randn(H, dtype=dtype), torch.randn(H, dtype=dtype)
    dy = torch.randn(T, H, dtype=dtype)
    esz = x.element_size()
    shape = f"{T}x{H}"
    y, mean, rstd = te_ops.layernorm_fwd(x, w, b, 1e-5, False)
    check_close("layernorm_fwd", y, F.layer_norm(x, (H,), w, b), dtype)
    _, a_mean, a_rstd = torch.ops.aten.native_layer_norm(x, (H,), w, b, 1e-5)
    dx, dw, db = te_ops.layernorm_bwd(dy, x, mean, rstd, w, False)
    a_dx, a_dw, a_db = torch.ops.aten.native_layer_norm_backward(
        dy, x, (H,), a_mean, a_rstd, w, b, (True, True, True))
    check_close("layernorm_bwd dx", dx, a_dx, dtype)
    check_close("layernorm_bwd dw", dw, a_dw, dtype) if dtype == torch.float32 else None

    results += run_case("LayerNorm", dtype, shape, "fwd", [
        Provider("torch", lambda: F.layer_norm(x, (H,), w, b)),
        Provider("ours", lambda: te_ops.layernorm_fwd(x, w, b, 1e-5, False)),
    ], ours="ours", bytes_moved=2 * T * H * esz, copy_bytes=T * H * esz, **args)
    results += run_case("LayerNorm", dtype, shape, "bwd", [
        Provider("torch", lambda: torch.ops.aten.native_layer_norm_backward(
            dy, x, (H,), a_mean, a_rstd, w, b, (True, True, True))),
        Provider("ours", lambda: te_ops.layernorm_bwd(dy, x, mean, rstd, w, False)),
    ], ours="ours", bytes_moved=3 * T * H * esz, copy_bytes=3 * T * H * esz // 2, **args)

    # module level, forward + backward, with torch.compile of the plain function
    ours_mod = te.ops.LayerNorm(H, dtype=dtype)
    plain = torch.nn.LayerNorm(H, dtype=dtype)
    compiled = torch.compile(plain, fullgraph=True)
    xg = x.detach().requires_grad_()

    def step(model):
        return lambda: torch.autograd.backward(model(xg), dy)

    results += run_case("LayerNorm", dtype, shape, "fwd+bwd", [
        Provider("torch", step(plain)), Provider("torch.compile", step(compiled)),
        Provider("ours", step(ours_mod)),
    ], ours="ours", **args)


def rmsnorm_cases(T, H, dtype, args, results):
    torch.manual_seed(0)
    x = torch.randn(T, H, dtype=dtype)
    w = torch.randn(H, dtype=dtype)
    dy = torch.randn(T, H, dtype=dtype)
    esz = x.element_size()
    shape = f"{T}x{H}"
    y, rstd = te_ops.rmsnorm_fwd(x, w, 1e-5, False)
    check_close("rmsnorm_fwd", y, F.rms_norm(x, (H,), w, 1e-5), dtype)
    dx, dw = te_ops.rmsnorm_bwd(dy, x, rstd, w, False)
    # torch has no CPU kernel for aten._fused_rms_norm_backward: its CPU backward is the
    # autograd graph of the composite rms_norm, timed here on a retained graph.
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    y_graph = F.rms_norm(xg, (H,), wg, 1e-5)
    a_dx, a_dw = torch.autograd.grad(y_graph, (xg, wg), dy, retain_graph=True)
    check_close("rmsnorm_bwd dx", dx, a_dx, dtype)

    results += run_case("RMSNorm", dtype, shape, "fwd", [
        Provider("torch", lambda: F.rms_norm(x, (H,), w, 1e-5)),
        Provider("aten fused", lambda: torch.ops.aten._fused_rms_norm(x, [H], w, 1e-5)),
        Provider("ours", lambda: te_ops.rmsnorm_fwd(x, w, 1e-5, False)),
    ], ours="ours", bytes_moved=2 * T * H * esz, copy_bytes=T * H * esz, **args)
    results += run_case("RMSNorm", dtype, shape, "bwd", [
        Provider("torch", lambda: torch.autograd.grad(y_graph, (xg, wg), dy, retain_graph=True)),
        Provider("ours", lambda: te_ops.rmsnorm_bwd(dy, x, rstd, w, False)),
    ], ours="ours", bytes_moved=3 * T * H * esz, copy_bytes=3 * T * H * esz // 2, **args)

    ours_mod = te.ops.RMSNorm(H, dtype=dtype)
    plain = torch.nn.RMSNorm(H, eps=1e-5, dtype=dtype)
    compiled = torch.compile(plain, fullgraph=True)

    def step(model):
        return lambda: torch.autograd.backward(model(xg), dy)

    results += run_case("RMSNorm", dtype, shape, "fwd+bwd", [
        Provider("torch", step(plain)), Provider("torch.compile", step(compiled)),
        Provider("ours", step(ours_mod)),
    ], ours="ours", **args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 short rounds")
    parser.add_argument("--threads", type=int, nargs="+", default=[2])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out", "norms"))
    a = parser.parse_args()
    rounds, mrt = (3, 0.1) if a.quick else (7, 0.3)
    results = []
    print(environment())
    for threads in a.threads:
        args = dict(rounds=rounds, threads=threads, min_run_time=mrt)
        for dtype in (torch.float32, torch.bfloat16):
            layernorm_cases(a.tokens, a.hidden, dtype, args, results)
            rmsnorm_cases(a.tokens, a.hidden, dtype, args, results)
    write_outputs(results, a.out, "LayerNorm / RMSNorm on CPU")
    print(f"wrote {a.out}.csv and {a.out}.md")


if __name__ == "__main__":
    main()
