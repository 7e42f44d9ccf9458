"""Tensor parallelism on CPU: examples/train_tensor_parallel.py's block (LayerNorm,
column-parallel Linear, GELU, row-parallel Linear, residual; sequence parallelism on) on 2 gloo
ranks, against the same full-size block in one process, and the bytes its collectives moved.

Time. Every rank runs, in the same rounds, the tensor-parallel step (its tokens / world rows,
its slices of the weights) and the full model's step on the whole batch, one after the other in
alternating order; a step is a forward and a backward (dx and every gradient; no optimizer).
Each measurement is the slowest rank's wall time for ``--steps`` steps (the ranks start
together after a barrier). "TP / single" is t(TP step) / t(single-process step) within a round,
median (min-max) over rounds; ideal compute scaling would be 1 / world. "collectives alone" is
the same step's collectives (recorded shapes, same order) replayed with nothing else running:
the communication a step would cost if none of it overlapped.

Bytes. One extra eager step runs with transformer_engine_cpp._comm's all_gather /
reduce_scatter / all_reduce wrapped: each call is waited at once, and the bytes this rank wrote
to its sockets during it are read from /proc/self/io (wchar: gloo's TCP writes). "minimum" is
what the collective needs per rank with a bandwidth-optimal algorithm for p ranks: all-gather
(p-1)/p of the gathered tensor, reduce-scatter (p-1)/p of its input, all-reduce 2(p-1)/p of
its tensor. gloo's reduce-scatter is an all-reduce followed by taking this rank's chunk
(/work/shared/reference/cuda_and_parallel.md), so it moves 2x the minimum; its all-gather and
all-reduce are at the minimum (plus a few header bytes).

    python bench/tp.py [--quick] [--world 2] [--tokens 1024] [--hidden 512] [--ffn 2048]
                       [--threads 1] [--rounds 5] [--steps 3] [--compile]

Prints the tables and writes bench/out/tp.csv. Not a test (nothing here runs under pytest).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (re-executes with the benchmark allocator settings first)

common.ensure_benchmark_allocator()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from transformer_engine_cpp import _comm  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from train_tensor_parallel import full_weights, load, mlp_block  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "tp.csv")


def _wchar() -> int:
    """Bytes this process has written through write-like system calls (sockets included)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError("bench/tp.py: no wchar line in /proc/self/io")


def count_collectives(forward, backward) -> list[dict]:
    """Runs ``backward(forward())`` once with the collectives of transformer_engine_cpp._comm
    wrapped; one record per call, in call order."""
    p = dist.get_world_size()
    records = []
    phase = ["forward"]
    originals = {name: getattr(_comm, name) for name in ("all_gather", "reduce_scatter",
                                                         "all_reduce")}

    def wrap(name):
        def counted(tensor, group, *args, **kwargs):
            before = _wchar()
            out = _comm.wait(originals[name](tensor, group, *args, **kwargs))
            sent = _wchar() - before
            in_bytes = tensor.numel() * tensor.element_size()
            out_bytes = out.numel() * out.element_size()
            minimum = {"all_gather": (p - 1) * out_bytes // p,
                       "reduce_scatter": (p - 1) * in_bytes // p,
                       "all_reduce": 2 * (p - 1) * in_bytes // p}[name]
            records.append({"pass": phase[0], "collective": name,
                            "op": kwargs.get("who", "AllReduce"),
                            "what": kwargs.get("what", "tensor"),
                            "in_shape": "x".join(map(str, tensor.shape)),
                            "out_shape": "x".join(map(str, out.shape)),
                            "dtype": str(tensor.dtype).replace("torch.", ""),
                            "sent_bytes": sent, "min_bytes": minimum,
                            "call": (name, tuple(tensor.shape), tensor.dtype, group, args,
                                     kwargs)})
            return out
        return counted

    try:
        for name in originals:
            setattr(_comm, name, wrap(name))
        out = forward()
        phase[0] = "backward"
        backward(out)
    finally:
        for name, fn in originals.items():
            setattr(_comm, name, fn)
    return records


def timed(fn, steps: int) -> float:
    """The slowest rank's seconds for ``steps`` calls of ``fn``, the ranks starting together."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def rank_main(rank: int, world: int, port: int, args) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))
    torch.set_num_threads(args.threads)
    T, H, F = args.tokens, args.hidden, args.ffn
    weights = full_weights(H, F)
    tp_block = mlp_block(H, F, torch.device("cpu"), parallel=True)
    full_block = mlp_block(H, F, torch.device("cpu"), parallel=False)
    load(tp_block, weights, rank, world)
    load(full_block, weights, 0, 1)
    gen = torch.Generator().manual_seed(1)
    x, dy = torch.randn(T, H, generator=gen), torch.randn(T, H, generator=gen)
    rows = slice(rank * T // world, (rank + 1) * T // world)
    x_tp, dy_tp = x[rows].clone().requires_grad_(), dy[rows].clone()
    x.requires_grad_()

    def step_of(model, inp, grad):
        def step():
            for p in model.parameters():
                p.grad = None
            inp.grad = None
            model(inp).backward(grad)
        return step

    # correctness first: this rank's rows of the full block's output
    with torch.no_grad():
        err = (tp_block(x_tp) - full_block(x)[rows]).abs().max().item()
    if not err <= 1e-4:
        raise RuntimeError(f"bench/tp.py: rank {rank}: TP output differs from the full block's "
                           f"by {err:.2e} (> 1e-4)")

    records = count_collectives(lambda: tp_block(x_tp), lambda out: out.backward(dy_tp))

    def replay():  # the recorded collectives alone, same shapes and order
        for name, shape, dtype, group, a, kw in (r["call"] for r in records):
            _comm.wait(getattr(_comm, name)(torch.ones(shape, dtype=dtype), group, *a, **kw))

    tp_model, full_model = tp_block, full_block
    if args.compile:
        tp_model = torch.compile(tp_block, fullgraph=True)
        full_model = torch.compile(full_block, fullgraph=True)
    providers = {"TP step": step_of(tp_model, x_tp, dy_tp),
                 "single-process step": step_of(full_model, x, dy),
                 "collectives alone": replay}
    for fn in providers.values():  # warm-up (and compilation)
        fn()
        fn()
    times = {name: [] for name in providers}
    names = list(providers)
    for rnd in range(args.rounds):
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            times[name].append(timed(providers[name], args.steps) / args.steps)

    if rank == 0:
        report(args, world, records, times)
    dist.barrier()
    dist.destroy_process_group()


def report(args, world, records, times) -> None:
    mode = "torch.compile(fullgraph=True)" if args.compile else "eager"
    print(f"bench/tp.py: {world} gloo ranks, {args.threads} thread(s) each, {mode}; block "
          f"T={args.tokens} H={args.hidden} F={args.ffn} fp32, column+SP and row+SP; "
          f"{args.rounds} rounds of {args.steps} steps")
    print(common.environment())
    single = times["single-process step"]
    rows = []
    print(f"\n{'step (fwd+bwd)':<22}{'median ms':>10}{'TP / single (min-max)':>26}")
    for name, ts in times.items():
        ratios = [t / s for t, s in zip(ts, single)]
        med = statistics.median(ratios)
        print(f"{name:<22}{1e3 * statistics.median(ts):>10.2f}{med:>12.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f})")
        rows.append({"table": "time", "item": name, "median_ms": 1e3 * statistics.median(ts),
                     "ratio_vs_single": med, "ratio_min": min(ratios),
                     "ratio_max": max(ratios)})
    print(f"(ideal compute scaling: TP / single = 1/{world} = {1 / world:.3f})")

    print(f"\n{'pass':<10}{'collective':<16}{'op: what':<38}{'in':>11}{'out':>11}"
          f"{'sent B/rank':>13}{'minimum':>11}{'sent/min':>9}")
    for r in records:
        print(f"{r['pass']:<10}{r['collective']:<16}{r['op'] + ': ' + r['what']:<38}"
              f"{r['in_shape']:>11}{r['out_shape']:>11}{r['sent_bytes']:>13,}{r['min_bytes']:>11,}"
              f"{r['sent_bytes'] / r['min_bytes']:>9.3f}")
        rows.append({"table": "bytes", "item": r["collective"],
                     **{k: v for k, v in r.items() if k != "call"},
                     "sent_over_min": r["sent_bytes"] / r["min_bytes"]})
    sent = sum(r["sent_bytes"] for r in records)
    minimum = sum(r["min_bytes"] for r in records)
    print(f"{'total':<64}{'':>22}{sent:>13,}{minimum:>11,}{sent / minimum:>9.3f}")
    rows.append({"table": "bytes", "item": "total", "sent_bytes": sent, "min_bytes": minimum,
                 "sent_over_min": sent / minimum})

    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    fields = ["table", "item", "median_ms", "ratio_vs_single", "ratio_min", "ratio_max",
              "pass", "collective", "op", "what", "in_shape", "out_shape", "dtype", "sent_bytes",
              "min_bytes", "sent_over_min"]
    with open(OUT, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    print(f"\nwrote {os.path.relpath(OUT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2 steps")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--ffn", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps per measurement")
    parser.add_argument("--compile", action="store_true",
                        help="time both blocks under torch.compile(fullgraph=True)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = 3, 2
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    # a rank that raises ends the others and this process (mp.spawn's join)
    mp.spawn(rank_main, args=(args.world, port, args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
