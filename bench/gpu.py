"""The GPU benchmark subset (issue 13's targets), ratios measured in one run.

Cases, from ``bench/suite.py``'s builders, at the issue's sizes (bf16):
* memory-bound kernels at 16384x4096: LayerNorm, RMSNorm, Bias + GELU, dGELU + dbias, SwiGLU,
  FP8 quantize: ours against plain eager and ``torch.compile`` of plain PyTorch, and the bytes
  they must move against a device-to-device copy of the same bytes (target: >= 85% of the
  copy's bandwidth);
* the pre-norm MLP block (T=8192, H=4096, F=16384) forward + backward (targets: >= 1.05x
  plain eager, >= 1.0x torch.compile);
* Linear + bias + GELU (T=8192, H=4096, F=16384) forward.

Each case is first checked against a float64 run (``suite.check``). An op without a CUDA
kernel is reported as such, not timed. Times are CUDA-event medians. Compiled "ours" is not
timed here (its equality to eager is the conformance suite's; inductor compiles cost minutes of
the device machine's time).

    python bench/gpu.py --out OUT.csv                    # on a GPU
    python bench/gpu.py --device cpu --small --out X.csv  # dry run of the same code on a CPU
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite  # noqa: E402  (imports common, which sets up the benchmark allocator)

import torch  # noqa: E402

FIELDS = ["case", "shape", "dtype", "mode", "provider", "ms", "ratio_vs_ours", "copy_efficiency",
          "note"]


def _timer(device: str):
    """(start, stop) -> elapsed ms around a callable, for the device."""
    if device == "cuda":
        def run(fn, repeat):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            start.record()
            for _ in range(repeat):
                fn()
            stop.record()
            torch.cuda.synchronize()
            return start.elapsed_time(stop) / repeat
    else:
        def run(fn, repeat):
            t0 = time.perf_counter()
            for _ in range(repeat):
                fn()
            return (time.perf_counter() - t0) * 1e3 / repeat
    return run


def median_ms(fn, device: str, rounds: int, repeat: int) -> float:
    run = _timer(device)
    fn()
    return statistics.median(run(fn, repeat) for _ in range(rounds))


def cuda_kernels(fn) -> list[str]:
    """The names of the CUDA kernels one call of ``fn`` launches (torch.profiler), e.g. to
    show that Linear + bias + GELU is one cuBLASLt GEMM with its epilogue."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
            and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]


def copy_ms(nbytes: int, device: str, rounds: int, repeat: int) -> float:
    """A device-to-device copy moving ``nbytes`` (half read, half written)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return median_ms(lambda: dst.copy_(src), device, rounds, repeat)


def cases(small: bool) -> list:
    if small:
        T, H, F, Tm, Hm, Fm = 64, 64, 128, 32, 64, 128
    else:
        T, H, F, Tm, Hm, Fm = 16384, 4096, 4096, 8192, 4096, 16384
    return [suite.layernorm_case(T, H), suite.rmsnorm_case(T, H),
            suite.bias_act_case(T, F, "gelu"), suite.dact_dbias_case(T, F),
            suite.swiglu_case(T, F), suite.quantize_case(T, H, "fp8"),
            suite.linear_gelu_case(Tm, Hm, Fm), suite.mlp_case(Tm, Hm, Fm, "plain")]


def _to(model, device):
    return model.to(device) if isinstance(model, torch.nn.Module) else model


def run_case(case, dtype, device: str, rounds: int, repeat: int, log) -> list[dict]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    plain, ours, inputs = case.build(dtype)
    plain, ours = _to(plain, device), _to(ours, device)
    inputs = tuple(x.to(device).requires_grad_(case.grad) for x in inputs)
    with torch.no_grad():
        grads = tuple(suite._grad_like(y) for y in suite._outputs(plain(*inputs)))
    torch._functorch.config.donated_buffer = "bwd" not in case.modes
    # no compiled "ours": the targets are against plain eager and torch.compile, and every
    # inductor compile costs the device machine's short time
    models = {"torch": plain, "torch.compile": torch.compile(plain, fullgraph=True),
              "ours": ours}
    steps = {name: suite.Step(model, inputs, grads,
                              list((plain if name.startswith("torch") else ours).parameters())
                              if case.grad else [], case.grad)
             for name, model in models.items()}
    base = {"case": case.name, "shape": case.shape, "dtype": str(dtype).split(".")[-1]}
    try:
        for step in steps.values():
            for mode in case.modes:
                step.fn(mode)()
        suite.check(case, dtype, dict(steps, **{"ours compiled": steps["ours"]}), log)
    except NotImplementedError as e:
        note = str(e).split(".")[0]
        log(f"  {case.name}: {note}")
        return [dict(base, mode=mode, provider="ours", note=note) for mode in case.modes]
    rows = []
    esz = torch.empty((), dtype=dtype).element_size()
    for mode in case.modes:
        ms = {name: median_ms(step.fn(mode), device, rounds, repeat)
              for name, step in steps.items()}
        nbytes = case.min_bytes(mode, esz)
        efficiency = ""
        if nbytes:
            efficiency = f"{copy_ms(nbytes, device, rounds, repeat) / ms['ours']:.3f}"
        note = ""
        if device == "cuda":
            names = cuda_kernels(steps["ours"].fn(mode))
            note = f"{len(names)} CUDA kernels: " + "; ".join(n[:60] for n in names[:8])
            log(f"  {case.name} {mode}: ours launches {note}")
        for name, t in ms.items():
            rows.append(dict(base, mode=mode, provider=name, ms=f"{t:.4f}",
                             ratio_vs_ours=f"{t / ms['ours']:.3f}",
                             copy_efficiency=efficiency if name == "ours" else "",
                             note=note if name == "ours" else ""))
        log(f"  {case.name} {mode}: " + " | ".join(
            f"{n} {t:.3f} ms x{t / ms['ours']:.2f}" for n, t in ms.items())
            + (f" | ours at {float(efficiency):.0%} of copy" if efficiency else ""))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--small", action="store_true", help="tiny shapes (a dry run)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out", required=True, help="the CSV to write")
    a = parser.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py: no CUDA device (use --device cpu --small for a dry run)")

    def log(msg):
        print(msg, flush=True)

    env = f"torch {torch.__version__}"
    if a.device == "cuda":
        env += f", {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}"
    log(env)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    # rows are written after each case, so a run stopped by a time limit keeps what it measured
    with open(a.out, "w", newline="") as f:
        f.write(f"# {env}\n")
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for case in cases(a.small):
            for r in run_case(case, torch.bfloat16, a.device, a.rounds, a.repeat, log):
                w.writerow({k: r.get(k, "") for k in FIELDS})
            f.flush()
    log(f"wrote {a.out}")


if __name__ == "__main__":
    main()
