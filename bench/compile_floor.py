"""Where a compiled call's host time goes, at a tiny and at a realistic shape: torch.profiler's
wrapper events of ``torch.compile`` (guard evaluation, the compiled region, AOTAutograd's
autograd Function, ...) around ours and around the plain model, next to ours eager.

    python bench/compile_floor.py [--threads 2] [--calls 40] [--rounds 5]

This splits the floor of issue 18's "ours compiled >= ours eager" on the memory-bound cases
into torch.compile's events: a compiled call costs the same kernel plus torch.compile's
wrapper, an eager call the kernel plus our eager host path. Where torch.compile's wrapper
around the *plain* model already exceeds our whole eager host path at that shape, no change to
our traced code can make ours compiled as fast as ours eager. The suite measures that floor
itself without a profiler, whose cost grows with the shape (common.cold_call_us).

Method: one process; the suite's own models and inputs (bench/suite.py's case builders); a
training forward (grad enabled) per call; per round each provider runs ``calls`` forwards under
torch.profiler (CPU), in rotated order; each figure is the median over rounds of the per-call
self CPU time of an event (wall time for "call"). The profiler's own cost inflates every
figure alike. "kernels" is the self time of the te_cpp / aten ops (for the plain compiled
model the inductor kernel runs inside "graph call" and is not separable); "eager host" is ours
eager's call time minus its kernels.
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

# the columns: torch.compile's wrapper events (common.COMPILE_WRAPPER_EVENTS, in call order),
# the graph call, and ours eager's pipeline Function
COLUMNS = (
    ("guards", "TorchDynamo Cache Lookup"),
    ("region", "Torch-Compiled Region"),
    ("pregraph", "Pregraph bytecode"),
    ("prologue", "AOTDispatcher Runtime Wrapper Prologue"),
    ("autograd fn", "CompiledFunction"),
    ("graph call", "## Call CompiledFxGraph"),
)

CASES = (
    ("C1 LayerNorm fwd", suite.layernorm_case, ((8, 256), (4096, 1024))),
    ("C2 RMSNorm fwd", suite.rmsnorm_case, ((8, 256), (4096, 1024))),
    ("C9 LN-Linear-GELU-Linear fwd", suite.host_case, ((8, 256), (64, 256))),
)


def measure(fn, calls: int) -> dict:
    prof = common.host_profile(fn, calls)
    row = {"call": prof["call"], "kernels": prof["kernels"], "wrapper": prof["wrapper"]}
    for name, prefix in COLUMNS:
        row[name] = sum(v for k, v in prof["events"].items() if k.startswith(prefix))
    row["autograd fn"] += prof["events"].get("PipelineFunction", 0.0)  # ours eager's
    return row


def run(threads: int, calls: int, rounds: int, log=print) -> list[dict]:
    rows = []
    for label, build_case, shapes in CASES:
        for T, H in shapes:
            torch._dynamo.reset()
            torch.manual_seed(0)
            plain, ours, (x,) = build_case(T, H).build(torch.float32)
            x.requires_grad_(True)
            providers = {"ours eager": ours,
                         "ours compiled": torch.compile(ours, fullgraph=True),
                         "plain compiled": torch.compile(plain, fullgraph=True)}
            torch.set_num_threads(threads)
            for model in providers.values():  # compile and warm up
                for _ in range(5):
                    model(x)
            n = calls if T * H >= 1 << 20 else calls * 10
            per = {name: [] for name in providers}
            names = list(providers)
            for r in range(rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    model = providers[name]
                    per[name].append(measure(lambda model=model: model(x), n))
            for name, samples in per.items():
                row = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
                row.update(case=label, shape=f"{T}x{H}", provider=name)
                if name == "ours eager":
                    row["eager host"] = row["call"] - row["kernels"]
                rows.append(row)
                log(f"{label:<30} {T}x{H:<6} {name:<15} call {row['call']:8.1f} us")
    return rows


def render(rows: list[dict], threads: int) -> str:
    cols = [name for name, _ in COLUMNS]
    lines = [f"Per-call µs, fp32, {threads} threads, median over rounds, under torch.profiler "
             f"({common.environment()}).", "",
             "| case | shape | provider | call | kernels | eager host | "
             + " | ".join(cols) + " | wrapper total |",
             "|---|---|---|" + "---:|" * (len(cols) + 4)]
    for r in rows:
        eager = r["provider"] == "ours eager"
        # ours eager has no wrapper events: only its pipeline Function's own time is shown
        cells = [f"{r[c]:.1f}" if not eager or c == "autograd fn" else "" for c in cols]
        wrapper = "" if eager else f"{r['wrapper']:.1f}"
        host = f"{r['eager host']:.1f}" if eager else ""
        lines.append(f"| {r['case']} | {r['shape']} | {r['provider']} | {r['call']:.1f} | "
                     f"{r['kernels']:.1f} | {host} | " + " | ".join(cells) + f" | {wrapper} |")
    lines += ["", "\"wrapper total\" leaves out \"graph call\" (for the plain model it holds "
              "the inductor kernel). For ours eager, \"autograd fn\" is the pipeline "
              "Function's own time."]
    return "\n".join(lines) + "\n"


def main() -> None:
    common.ensure_benchmark_allocator()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=40,
                        help="calls per round at the realistic shapes (x10 at the tiny ones)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(HERE, "out", "compile_floor.md"))
    a = parser.parse_args()
    rows = run(a.threads, a.calls, a.rounds)
    text = render(rows, a.threads)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("# Where a compiled call's host time goes\n\n" + text)
    print(text)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
