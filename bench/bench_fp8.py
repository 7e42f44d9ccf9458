"""FP8 on CPU: the pre-norm MLP block in bf16 against the same block under FP8 current scaling,
and the per-tensor quantize / dequantize kernels against a plain-torch emulation.

    block:  x + fc2(GELU(fc1(LayerNorm(x))))   (bf16 params and input)
    ours bf16:  te.ops.Sequential(MakeExtraOutput, LayerNorm, Linear, GELU, Linear, AddExtraInput)
    ours fp8:   the same module under te.autocast(recipe=te.recipe.Float8CurrentScaling())
                (its Linears run exactly-emulated FP8 GEMMs: te_cpp.fp8_gemm, on a CPU with
                native bfloat16 products a bf16 GEMM of the raw FP8 values, else dequantize to
                fp32 and an fp32 mm; docs/quantization.md)
    torch bf16: plain PyTorch eager, for reference

    quantize:   torch.ops.te_cpp.fp8_quantize (E4M3, per-tensor current scaling), mxfp8_quantize,
                fp8_block_quantize (Float8BlockScaling, 1x128 and 128x128 blocks, power-of-two
                scales), nvfp4_quantize (1-D blocks of 16, no transform, round to nearest even)
                and fp8_dequantize against plain torch (amax, scale, clamp,
                .to(float8_e4m3fn)), eager and torch.compile (quantize)

Ratios are against "ours bf16" (block) and "ours" (kernels); >1 means that provider is slower.

    python bench/bench_fp8.py [--quick] [--tokens 4096] [--hidden 1024] [--ffn 4096] [--no-block]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

common.ensure_benchmark_allocator()

import transformer_engine_cpp as te  # noqa: E402
from common import Provider, check_close, environment, run_case, write_outputs  # noqa: E402
from suite import mlp_builder  # noqa: E402
from transformer_engine_cpp.testing.reference import (  # noqa: E402
    fp8_block_quantize_reference, fp8_quantize_current_scaling, mxfp8_quantize_reference,
    nvfp4_quantize_reference)

E4M3 = torch.float8_e4m3fn  # the custom ops name the format by its torch dtype
FP8_TOL = 0.10  # relative error (Frobenius norm) allowed between the FP8 and the bf16 block


def fp8_recipe():
    return te.recipe.Float8CurrentScaling()


def block_providers(T, H, F, mode):
    dtype = torch.bfloat16
    torch.manual_seed(0)
    plain, ours, (x,) = mlp_builder(T, H, F, "residual")(dtype)
    x.requires_grad_(mode != "fwd")
    dy = torch.randn(T, H, dtype=dtype)
    with torch.no_grad():
        y_plain = plain(x)
        y_bf16 = ours(x)
        with te.autocast(recipe=fp8_recipe()):
            y_fp8 = ours(x)
    check_close("MLP block bf16 forward", y_bf16, y_plain, dtype)
    # FP8 E4M3 keeps 3 mantissa bits, so compare norms, not elements: the relative error of
    # the whole output, and of the MLP branch alone (y - x; the residual would hide errors).
    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()
    err_out = rel(y_fp8, y_bf16)
    err_branch = rel(y_fp8 - x.detach(), y_bf16 - x.detach())
    print(f"  check {mode}: FP8 vs bf16 relative error ||d||/||ref||: output {err_out:.2e}, "
          f"MLP branch {err_branch:.2e} (tolerance {FP8_TOL:.0%})")
    if not (err_out < FP8_TOL and err_branch < FP8_TOL):
        raise SystemExit("FP8 block disagrees with the bf16 block beyond the FP8 tolerance")

    def run(model, fp8=False):
        def fwd():
            with te.autocast(enabled=fp8, recipe=fp8_recipe()):
                return model(x)
        if mode == "fwd":
            def fwd_nograd():
                with torch.no_grad():
                    return fwd()
            return fwd_nograd
        return lambda: torch.autograd.backward(fwd(), dy)

    return [Provider("torch bf16", run(plain)), Provider("ours bf16", run(ours)),
            Provider("ours fp8", run(ours, fp8=True))]


def torch_fp8_dequantize(data, scale_inv, dtype):
    return (data.view(torch.float8_e4m3fn).float() * scale_inv).to(dtype)


def quantize_cases(args, results, T, H):
    ops = torch.ops.te_cpp
    n = T * H
    for dtype in (torch.float32, torch.bfloat16):
        esz = torch.empty((), dtype=dtype).element_size()
        torch.manual_seed(0)
        x = torch.randn(T, H, dtype=dtype) * 3
        data, scale_inv, amax = ops.fp8_quantize(x, E4M3, False, 0.0)
        t_data, t_scale_inv, t_amax = fp8_quantize_current_scaling(x)
        torch.testing.assert_close(amax.reshape(1), t_amax, rtol=0, atol=0)
        torch.testing.assert_close(scale_inv, t_scale_inv, rtol=0, atol=0)
        if not torch.equal(data, t_data):
            raise SystemExit(f"fp8_quantize ({dtype}) disagrees with the torch emulation")
        deq = ops.fp8_dequantize(data, scale_inv, E4M3, dtype)
        if not torch.equal(deq, torch_fp8_dequantize(data, scale_inv, dtype)):
            raise SystemExit(f"fp8_dequantize ({dtype}) disagrees with the torch emulation")
        compiled_q = torch.compile(fp8_quantize_current_scaling, fullgraph=True)
        if not torch.equal(compiled_q(x)[0], t_data):
            raise SystemExit(f"compiled torch fp8 quantize ({dtype}) disagrees with eager")
        # quantize (current scaling) reads the input twice, the amax pass then the cast pass:
        # bytes_moved = 2 reads of the input + 1 byte/element written.
        qbytes = n * (2 * esz + 1)
        results += run_case("fp8_quantize", dtype, f"{T}x{H}", "fwd", [
            Provider("torch", lambda: fp8_quantize_current_scaling(x)),
            Provider("torch.compile", lambda: compiled_q(x)),
            Provider("ours", lambda: ops.fp8_quantize(x, E4M3, False, 0.0)),
        ], ours="ours", bytes_moved=qbytes, copy_bytes=qbytes // 2, **args)
        # MXFP8: one read of the input, 1 byte/element + 1 scale byte per 32 elements written
        m_data, m_scale = ops.mxfp8_quantize(x, E4M3)
        t_mdata, t_mscale = mxfp8_quantize_reference(x)
        if not (torch.equal(m_data, t_mdata) and torch.equal(m_scale, t_mscale)):
            raise SystemExit(f"mxfp8_quantize ({dtype}) disagrees with the torch emulation")
        compiled_mx = torch.compile(mxfp8_quantize_reference, fullgraph=True)
        mbytes = n * (esz + 1) + n // 32
        results += run_case("mxfp8_quantize", dtype, f"{T}x{H}", "fwd", [
            Provider("torch", lambda: mxfp8_quantize_reference(x)),
            Provider("torch.compile", lambda: compiled_mx(x)),
            Provider("ours", lambda: ops.mxfp8_quantize(x, E4M3)),
        ], ours="ours", bytes_moved=mbytes, copy_bytes=mbytes // 2, **args)
        # Float8BlockScaling: one read (each block's amax pass and cast pass read it from
        # cache), 1 byte/element + one fp32 scale per block written
        for block_dim, blocks in ((1, "1x128"), (2, "128x128")):
            b_data, b_scale = ops.fp8_block_quantize(x, E4M3, block_dim, True, 0.0)
            t_bdata, t_bscale = fp8_block_quantize_reference(x, block_dim)
            if not (torch.equal(b_data, t_bdata) and torch.equal(b_scale, t_bscale)):
                raise SystemExit(f"fp8_block_quantize {blocks} ({dtype}) disagrees with the "
                                 "torch emulation")
            compiled_b = torch.compile(fp8_block_quantize_reference, fullgraph=True)
            bbytes = n * (esz + 1) + 4 * b_scale.numel()
            results += run_case(f"fp8_block_quantize {blocks}", dtype, f"{T}x{H}", "fwd", [
                Provider("torch", lambda bd=block_dim: fp8_block_quantize_reference(x, bd)),
                Provider("torch.compile", lambda bd=block_dim, f=compiled_b: f(x, bd)),
                Provider("ours", lambda bd=block_dim: ops.fp8_block_quantize(x, E4M3, bd, True,
                                                                             0.0)),
            ], ours="ours", bytes_moved=bbytes, copy_bytes=bbytes // 2, **args)
        # NVFP4: two reads of the input (the tensor amax, then the blocks), half a byte per
        # element and one scale byte per 16 elements written
        n_data, n_scale, n_amax = ops.nvfp4_quantize(x, False, False, None)
        t_ndata, t_nscale, t_namax = nvfp4_quantize_reference(x)
        if not (torch.equal(n_data, t_ndata) and torch.equal(n_scale, t_nscale)
                and torch.equal(n_amax, t_namax)):
            raise SystemExit(f"nvfp4_quantize ({dtype}) disagrees with the torch emulation")
        compiled_nv = torch.compile(nvfp4_quantize_reference, fullgraph=True)
        nbytes = 2 * n * esz + n // 2 + n // 16
        results += run_case("nvfp4_quantize", dtype, f"{T}x{H}", "fwd", [
            Provider("torch", lambda: nvfp4_quantize_reference(x)),
            Provider("torch.compile", lambda: compiled_nv(x)),
            Provider("ours", lambda: ops.nvfp4_quantize(x, False, False, None)),
        ], ours="ours", bytes_moved=nbytes, copy_bytes=nbytes // 2, **args)
        # dequantize: 1 byte/element read + esz bytes/element written
        dbytes = n * (1 + esz)
        results += run_case("fp8_dequantize", dtype, f"{T}x{H}", "fwd", [
            Provider("torch", lambda: torch_fp8_dequantize(data, scale_inv, dtype)),
            Provider("ours", lambda: ops.fp8_dequantize(data, scale_inv, E4M3, dtype)),
        ], ours="ours", bytes_moved=dbytes, copy_bytes=dbytes // 2, **args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 short rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=4096)
    parser.add_argument("--no-block", action="store_true", help="only the quantize kernels")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out", "fp8"))
    a = parser.parse_args()
    rounds, mrt = (3, 0.2) if a.quick else (7, 0.5)
    args = dict(rounds=rounds, threads=a.threads, min_run_time=mrt)
    torch.set_num_threads(a.threads)
    print(environment())
    print("GB/s: fp8_quantize counts two reads of the input (amax pass, cast pass) + 1 B/element "
          "written; mxfp8_quantize one read + 1 B/element + 1 B/32 elements written; "
          "fp8_block_quantize one read + 1 B/element + 4 B/block written; "
          "nvfp4_quantize two reads + 1/2 B/element + 1 B/16 elements written; "
          "dequantize 1 B/element read + the output")
    results = []
    quantize_cases(args, results, a.tokens, a.hidden)
    for mode in () if a.no_block else ("fwd", "fwd+bwd"):
        ps = block_providers(a.tokens, a.hidden, a.ffn, mode)
        results += run_case("MLP block (gelu)", torch.bfloat16, f"{a.tokens}x{a.hidden}x{a.ffn}",
                            mode, ps, ours="ours bf16", **args)
    write_outputs(results, a.out, "FP8 and NVFP4 on CPU: MLP block (current scaling) and quantize")
    print(f"wrote {a.out}.csv and {a.out}.md")


if __name__ == "__main__":
    main()
