"""The pre-norm residual MLP block on CPU: ours (eager and compiled) against plain PyTorch
(eager and torch.compile) in the same run, plus host overhead at a tiny shape.

    block:  x + fc2(GELU(fc1(LayerNorm(x))))   (--activation swiglu: fc1 -> 2*ffn, SwiGLU)
    ours:   te.ops.Sequential(MakeExtraOutput, LayerNorm, Linear, GELU, Linear, AddExtraInput)

    python bench/bench_mlp.py [--quick] [--tokens 4096] [--hidden 1024] [--ffn 4096]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_engine_cpp as te  # noqa: E402
from common import Provider, check_close, environment, run_case, write_outputs  # noqa: E402
from transformer_engine_cpp.testing.reference import PreNormMLP  # noqa: E402


def ours_block(hidden, ffn, activation, dtype):
    act = te.ops.SwiGLU() if activation == "swiglu" else te.ops.GELU()
    fc1_out = 2 * ffn if activation == "swiglu" else ffn
    return te.ops.Sequential(
        te.ops.MakeExtraOutput().set_extra_output_channel(0, "residual", output_to_caller=False),
        te.ops.LayerNorm(hidden, dtype=dtype),
        te.ops.Linear(hidden, fc1_out, dtype=dtype),
        act,
        te.ops.Linear(ffn, hidden, dtype=dtype),
        te.ops.AddExtraInput().set_extra_input_channel(0, "residual"),
    )


def copy_params(plain: PreNormMLP, ours: te.ops.Sequential) -> None:
    with torch.no_grad():
        ours[1].weight.copy_(plain.norm.weight)
        ours[1].bias.copy_(plain.norm.bias)
        ours[2].weight.copy_(plain.fc1.weight)
        ours[2].bias.copy_(plain.fc1.bias)
        ours[4].weight.copy_(plain.fc2.weight)
        ours[4].bias.copy_(plain.fc2.bias)


def providers(T, H, F, activation, dtype, mode):
    torch.manual_seed(0)
    plain = PreNormMLP(H, F, activation=activation, dtype=dtype)
    ours = ours_block(H, F, activation, dtype)
    copy_params(plain, ours)
    plain_c = torch.compile(plain, fullgraph=True)
    ours_c = torch.compile(ours, fullgraph=True)
    x = torch.randn(T, H, dtype=dtype, requires_grad=(mode != "fwd"))
    dy = torch.randn(T, H, dtype=dtype)
    with torch.no_grad():
        check_close("MLP block forward", ours(x), plain(x), dtype)

    def run(model):
        if mode == "fwd":
            def fwd():
                with torch.no_grad():
                    return model(x)
            return fwd
        return lambda: torch.autograd.backward(model(x), dy)

    return [Provider("torch", run(plain)), Provider("torch.compile", run(plain_c)),
            Provider("ours", run(ours)), Provider("ours compiled", run(ours_c))]


def host_overhead(args, results, T=8, H=256):
    """µs per forward+backward step at a tiny shape, where host time dominates."""
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.LayerNorm(H), torch.nn.Linear(H, H),
                                torch.nn.GELU(approximate="tanh"), torch.nn.Linear(H, H))
    ours = te.ops.Sequential(te.ops.LayerNorm(H), te.ops.Linear(H, H), te.ops.GELU(),
                             te.ops.Linear(H, H))
    x = torch.randn(T, H, requires_grad=True)
    dy = torch.randn(T, H)
    for mode in ("fwd", "fwd+bwd"):
        def run(model):
            if mode == "fwd":
                return lambda: model(x.detach())
            return lambda: torch.autograd.backward(model(x), dy)
        results += run_case("host overhead", torch.float32, f"{T}x{H}", mode,
                            [Provider("torch", run(plain)), Provider("ours", run(ours))],
                            ours="ours", **args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 short rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=4096)
    parser.add_argument("--activation", choices=["gelu", "swiglu"], default="gelu")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out", "mlp"))
    a = parser.parse_args()
    rounds, mrt = (3, 0.2) if a.quick else (7, 0.5)
    args = dict(rounds=rounds, threads=a.threads, min_run_time=mrt)
    torch.set_num_threads(a.threads)
    print(environment())
    results = []
    host_overhead(args, results)
    for dtype in (torch.float32, torch.bfloat16):
        for mode in ("fwd", "fwd+bwd"):
            ps = providers(a.tokens, a.hidden, a.ffn, a.activation, dtype, mode)
            results += run_case(f"MLP block ({a.activation})", dtype,
                                f"{a.tokens}x{a.hidden}x{a.ffn}", mode, ps, ours="ours", **args)
    write_outputs(results, a.out, "Pre-norm MLP block on CPU")
    print(f"wrote {a.out}.csv and {a.out}.md")


if __name__ == "__main__":
    main()
