"""Shared benchmark harness (never run by pytest; bench/suite.py is its main user).

Method (DESIGN.md "Speed"; the rendered bench/README.md states it with the results): one
process; every provider of a case on identical inputs, checked first; R interleaved rounds, each
timing every provider once (rotated order) with torch.utils.benchmark's blocked_autorange; ratios
are taken within a round and reported as the median (min-max) over rounds. Memory-bound cases
also report achieved bandwidth against a tensor copy of the same byte count timed in the same run.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import os
import platform
import resource
import statistics
import sys
import time
from typing import Callable, Optional, Sequence

import torch
import torch.utils.benchmark as tbench

import report  # torch-free; its row classification is the one the log line uses
# the runners (suite.py, tp.py, ...) reach the allocator through this module
from allocator import allocator_note, ensure_benchmark_allocator  # noqa: F401


@dataclasses.dataclass
class Provider:
    name: str
    fn: Callable[[], object]


@dataclasses.dataclass
class Result:
    case: str
    dtype: str
    shape: str
    mode: str
    threads: int
    provider: str
    median_us: float
    ratio_vs_ours: float  # provider time / ours time (>1: ours is faster), median over rounds
    ratio_min: float
    ratio_max: float
    bytes_moved: int = 0
    gbps: float = 0.0
    copy_efficiency: float = 0.0  # achieved GB/s / copy GB/s at the same byte count
    copy_gbps: float = 0.0  # the copy's bandwidth in the same run (median over rounds)
    # the FLOP roofline (cases with a FLOP count): ours' achieved GFLOP/s; the compute roof,
    # an fp32 GEMM's rate in the same run (median over rounds); the roof, the lower of that
    # and the memory roof (flops / bytes_moved x copy_gbps); ours' fraction of the roof
    gflops: float = 0.0
    peak_gflops: float = 0.0
    roof_gflops: float = 0.0
    roof_efficiency: float = 0.0
    p20_us: float = 0.0  # spread of the per-round medians
    p80_us: float = 0.0
    case_id: str = ""
    compile_s: float = 0.0  # first calls (compilation for the compiled providers)
    saved_bytes: int = -1  # saved-activation bytes of one forward (-1: not measured)
    outside_gemm: float = float("nan")  # share of a step's time outside the GEMMs (profiled)
    # target 1's floor, on ours' rows of the memory-bound cases (cold_call_us, µs per call):
    # an 8-row call of the case right after the row's own call, ours eager (our host path),
    # the plain model compiled (torch.compile's wrapper) and ours compiled
    eager_host_us: float = float("nan")
    compile_wrapper_us: float = float("nan")
    compiled_host_us: float = float("nan")
    peak_bytes: int = -1  # peak bytes allocated during one step (-1: not measured)
    # the case's targets, on ours' rows (NaN: none): minimum t_torch / t_ours,
    # t_torch.compile / t_ours, copy efficiency, and t_ours / t_ours_compiled
    target_vs_eager: float = float("nan")
    target_vs_compile: float = float("nan")
    target_copy: float = float("nan")
    target_roof: float = float("nan")  # used instead of target_copy where compute-bound
    target_compiled: float = float("nan")
    target_note: str = ""
    # the host's state during the job (bench/suite.py's QuietHost): the median of the copy
    # probes timed before it, after each of its rounds and after it (host_probe_gbps, GB/s), the
    # share of its threads' time the VM's host stole (host_steal), NaN where not measured; how
    # many times the job was timed (more than once: the host was busy or its rounds spread);
    # the widest spread of the kept timing's round medians over the job's rows and providers
    # (p80 / p20; NaN: a run made before the suite timed a job again for its spread)
    host_probe_gbps: float = float("nan")
    host_steal: float = float("nan")
    attempts: int = 1
    rounds_spread: float = float("nan")
    # minor page faults per timed call, the median over rounds (common.timed): a call that
    # faults takes fresh pages for its outputs instead of reusing freed ones (NaN: not counted)
    faults_per_call: float = float("nan")
    # C8: the share of a step's time in ops other than the GEMMs (profiled; the rest of
    # outside_gemm is host work), and the minimal bytes that work moves (-1: not measured)
    outside_gemm_ops: float = float("nan")
    outside_gemm_min_bytes: int = -1


def environment() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import transformer_engine_cpp._C as C

    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            have = next((line.split(":", 1)[1].split() for line in f
                         if line.startswith("flags")), [])
        flags = " ".join(x for x in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")
                         if x in have)
    except OSError:
        pass
    return (f"torch {torch.__version__}, python {sys.version.split()[0]}, {cpu} ({flags}), "
            f"{os.cpu_count()} cpus, ATen parallel backend "
            f"{_backend()}, "
            f"te_cpp kernels {C.cpu_capability()} (activation tables read in "
            f"{_lookup_calls(C.activation_lookup_use())}{_gemms_in_fp32()}), "
            f"{allocator_note()}")


def gemm_dtypes_in_fp32() -> list[torch.dtype]:
    """The 16-bit dtypes whose GEMMs te_cpp runs as ATen's fp32 GEMM on this CPU: ATen's own
    GEMM in them is a scalar loop here (csrc/kernels/cpu/linear.cpp, gemm_16bit_in_fp32)."""
    import transformer_engine_cpp._C as C

    flags = C.gemm_16bit_in_fp32()
    return [d for bit, d in ((1, torch.bfloat16), (2, torch.float16)) if flags & bit]


def _gemms_in_fp32() -> str:
    names = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    dtypes = [names[d] for d in gemm_dtypes_in_fp32()]
    return f"; {' and '.join(dtypes)} GEMMs as fp32 GEMMs" if dtypes else ""


def _lookup_calls(flags: int) -> str:
    """The calls _C.activation_lookup_use's flags name, in words."""
    calls = [f"{dtype} {direction}" for bit, (dtype, direction) in
             enumerate([("bf16", "forwards"), ("bf16", "backwards"), ("fp16", "forwards"),
                        ("fp16", "backwards")]) if flags & (1 << bit)]
    return ", ".join(calls) if calls else "no call"


def _backend() -> str:
    info = torch.__config__.parallel_info()
    line = next((ln for ln in info.splitlines() if "parallel backend" in ln.lower()), "")
    return line.split(":", 1)[-1].strip() or "?"


def timed(fn: Callable[[], object], threads: int, min_run_time: float) -> tuple[float, float]:
    """fn's median time per call (µs, blocked_autorange) and the minor page faults per call over
    all of the timer's calls (its block-size calibration included: 1 + 10 + ... + the block)."""
    timer = tbench.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    m = timer.blocked_autorange(min_run_time=min_run_time)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    calls = (10 * m.number_per_run - 1) // 9 + m.number_per_run * len(m.raw_times)
    return m.median * 1e6, faults / calls


def time_us(fn: Callable[[], object], threads: int, min_run_time: float) -> float:
    return timed(fn, threads, min_run_time)[0]


def copy_gbps(nbytes: int, threads: int, min_run_time: float) -> float:
    """Bandwidth of dst.copy_(src) moving nbytes in and nbytes out (GB/s, counting the bytes
    read and the bytes written)."""
    src = torch.randn(max(nbytes // 4, 1))
    dst = torch.empty_like(src)
    t = time_us(lambda: dst.copy_(src), threads, min_run_time)
    return 2 * src.nbytes / (t * 1e-6) / 1e9


# A copy from memory (64 MiB each way, beyond the L3 of the development VMs): its bandwidth drops
# when other guests of the VM's host stream memory, which slows every memory-bound row alike.
PROBE_BYTES = 64 << 20


@functools.cache
def _probe_buffers() -> tuple[torch.Tensor, torch.Tensor]:
    """The probe's source and destination, made once: every probe copies the same pages, and
    no probe allocates (or draws random numbers) between jobs."""
    src = torch.randn(PROBE_BYTES // 4)
    return src, torch.empty_like(src)


PROBE_COPIES = 5


def median_call_s(fn: Callable[[], object], calls: int) -> float:
    """The median time of ``calls`` calls of fn, in seconds, after an untimed one: a fixed,
    short count where blocked_autorange would calibrate (the host probe, A/B rounds)."""
    fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def probe_host(threads: int) -> float:
    """The host's memory bandwidth now: GB/s of the median of PROBE_COPIES timed PROBE_BYTES
    copies after an untimed one (about 20 ms at 2 threads on the development VMs, short
    enough to probe after every timing round)."""
    src, dst = _probe_buffers()
    torch.set_num_threads(threads)
    return 2 * src.nbytes / median_call_s(lambda: dst.copy_(src), PROBE_COPIES) / 1e9


def host_times() -> tuple[float, float]:
    """(wall seconds, CPU seconds stolen): time.perf_counter and the steal column of
    /proc/stat summed over the CPUs, the time the VM's host ran other guests while this
    machine's CPUs had work (NaN where the kernel does not report it). Stolen time adds to a
    timing's wall time as if the code had run slower."""
    wall = time.perf_counter()
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        steal = int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        steal = float("nan")
    return wall, steal


# The compute roof: an fp32 torch.mm of this size runs at the GEMM's rate (on the 2-core
# development VM, 200-208 GFLOP/s for n = 256 to 1024 at 2 threads, 101-109 at 1).
PEAK_GEMM_N = 512


def peak_gflops(threads: int, min_run_time: float) -> float:
    """FLOP rate of an fp32 n x n x n torch.mm (2 n^3 flops): the FLOP roof of the roofline."""
    n = PEAK_GEMM_N
    a, b = torch.randn(n, n), torch.randn(n, n)
    t = time_us(lambda: torch.mm(a, b), threads, min_run_time)
    return 2 * n ** 3 / (t * 1e-6) / 1e9


def roofline(res: Result, flops: int, peaks: list[float]) -> None:
    """Fills res's roofline fields from its time, bytes and copy bandwidth: the roof is the
    lower of the compute roof (the median of peaks) and the memory roof (arithmetic intensity
    flops / bytes_moved times the copy's bandwidth)."""
    res.gflops = flops / (res.median_us * 1e-6) / 1e9
    res.peak_gflops = statistics.median(peaks)
    res.roof_gflops = min(res.peak_gflops, flops / res.bytes_moved * res.copy_gbps)
    res.roof_efficiency = res.gflops / res.roof_gflops


def run_case(case: str, dtype: torch.dtype, shape: str, mode: str, providers: list[Provider],
             *, ours: str, rounds: int, threads: int, min_run_time: float,
             bytes_moved: int = 0, copy_bytes: int = 0, flops: int = 0,
             after_round: Optional[Callable[[], object]] = None, log=print) -> list[Result]:
    """Times the providers in `rounds` interleaved rounds; ratios are against `ours`. With
    copy_bytes, each round also times a copy; with flops as well, the GEMM's FLOP rate (the
    roofline's two roofs). after_round, if given, is called after each round (QuietHost's
    probe)."""
    torch.set_num_threads(threads)
    for p in providers:  # warm-up (and compile)
        p.fn()
    times: dict[str, list[float]] = {p.name: [] for p in providers}
    faults: dict[str, list[float]] = {p.name: [] for p in providers}
    copies: list[float] = []
    peaks: list[float] = []
    for r in range(rounds):
        order = providers[r % len(providers):] + providers[:r % len(providers)]
        for p in order:
            t, f = timed(p.fn, threads, min_run_time)
            times[p.name].append(t)
            faults[p.name].append(f)
        if copy_bytes:
            copies.append(copy_gbps(copy_bytes, threads, min_run_time))
            if flops:
                peaks.append(peak_gflops(threads, min_run_time))
        if after_round is not None:
            after_round()
            torch.set_num_threads(threads)
    results = []
    for p in providers:
        ratios = [t / o for t, o in zip(times[p.name], times[ours])]
        med = statistics.median(times[p.name])
        res = Result(case, str(dtype).replace("torch.", ""), shape, mode, threads, p.name, med,
                     statistics.median(ratios), min(ratios), max(ratios))
        res.p20_us, res.p80_us = _quantile(times[p.name], 0.2), _quantile(times[p.name], 0.8)
        res.faults_per_call = statistics.median(faults[p.name])
        if bytes_moved:
            res.bytes_moved = bytes_moved
            res.gbps = bytes_moved / (med * 1e-6) / 1e9
            if copies:
                res.copy_gbps = statistics.median(copies)
                res.copy_efficiency = res.gbps / res.copy_gbps
                if peaks:
                    roofline(res, flops, peaks)
        results.append(res)
    line = " | ".join(f"{r.provider} {r.median_us:8.1f}us x{r.ratio_vs_ours:4.2f}"
                      for r in results)
    eff = next((r for r in results if r.provider == ours), None)
    extra = (f" | ours {eff.gbps:5.1f} GB/s = {100 * eff.copy_efficiency:4.0f}% of copy"
             if eff and eff.copy_efficiency else "")
    if eff and eff.roof_gflops:
        extra += (f", {eff.gflops:5.1f} GFLOP/s = {100 * eff.roof_efficiency:4.0f}% of the "
                  f"{'FLOP' if report.compute_bound(eff) else 'memory'} roof")
    faulting = [r for r in results if report.took_fresh_pages(r)]
    if faulting:
        extra += " | page faults per call: " + ", ".join(
            f"{r.provider} {r.faults_per_call:.0f}" for r in faulting)
    log(f"  {case:<16} {mode:<8} {results[0].dtype:<9} {shape:<12} t{threads}: {line}{extra}")
    return results


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def saved_activation_bytes(forward: Callable[[], object]) -> int:
    """Bytes of the distinct storages autograd saves during forward(), leaf tensors that require
    grad (parameters, the input) excluded: they exist anyway. -1 if hooks cannot see them."""
    storages = {}

    def pack(t):
        if not (t.is_leaf and t.requires_grad):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            forward()
    except Exception:  # e.g. hooks refused while tracing a compiled region
        return -1
    return sum(storages.values())


@contextlib.contextmanager
def _quiet_stderr():
    """Silences file descriptor 2 (the profiler's C++ start/stop lines)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def peak_allocated_bytes(step: Callable[[], object]) -> int:
    """Peak of the CPU memory allocated (and not yet freed) during step(), from the profiler's
    memory timeline; -1 if the profiler cannot tell."""
    try:
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler._memory_profiler import MemoryProfileTimeline

        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                                      record_shapes=True, with_stack=True) as prof:
            step()
        _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
        return int(max((sum(s) for s in sizes), default=0))
    except Exception:
        return -1


GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation")


def outside_gemm_shares(step: Callable[[], object], repeats: int = 3) -> tuple[float, float]:
    """The shares of ``step()``'s host time spent outside the GEMMs and, within that, in the
    other ops: (1 - (self CPU time of the ATen GEMM ops) / (the step's wall time), the self CPU
    time of every other ``te_cpp::`` and ``aten::`` op over the wall time), from torch.profiler
    over ``repeats`` steps (our linear ops run their GEMMs through these ATen ops, so both
    models are counted alike); what is outside the GEMMs and outside the ops is host work
    (Python, the autograd engine). NaNs if the profiler cannot tell."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            for _ in range(repeats):
                step()
            wall = time.perf_counter() - t0
        gemm = ops = 0.0
        for e in prof.key_averages():
            if e.key in GEMM_OPS:
                gemm += e.self_cpu_time_total
            elif e.key.startswith(KERNEL_EVENTS):
                ops += e.self_cpu_time_total
        return max(0.0, 1.0 - gemm * 1e-6 / wall), ops * 1e-6 / wall
    except Exception:
        return float("nan"), float("nan")


# torch.compile's per-call wrapper, as torch.profiler names its events (torch 2.13): Dynamo's
# guard evaluation, the compiled region, the pre-graph bytecode, AOTAutograd's runtime prologue
# and its autograd Function (forward; "CompiledFunctionBackward" in a backward). The graph call
# ("## Call CompiledFxGraph ...") is left out: for an inductor graph it holds the kernel.
COMPILE_WRAPPER_EVENTS = ("TorchDynamo Cache Lookup", "Torch-Compiled Region",
                          "Pregraph bytecode", "AOTDispatcher Runtime Wrapper Prologue",
                          "CompiledFunction")
KERNEL_EVENTS = ("te_cpp::", "aten::")


def cold_call_us(sweep: Callable[[], object], fns: Sequence[Callable[[], object]],
                 calls: int, blocks: int = 3) -> list[float]:
    """The median wall time (µs) of each of ``fns`` called right after ``sweep()``, which
    leaves the caches as a real call of that size does (a kernel streaming its tensors through
    them evicts the Python objects, guards and frames a host path touches). Each fn runs in
    runs of (sweep, fn) pairs, so that its own objects were last touched one sweep before, as
    in a loop of real calls; the fns take turns over ``blocks`` runs, whose first pair is left
    out (the fn's objects were touched longer ago there)."""
    times: list[list[float]] = [[] for _ in fns]
    per_block = max(1, calls // blocks)
    for _ in range(blocks):
        for t, fn in zip(times, fns):
            for i in range(per_block + 1):
                out = sweep()
                del out
                t0 = time.perf_counter()
                out = fn()
                if i:
                    t.append(time.perf_counter() - t0)
                del out
    return [statistics.median(t) * 1e6 for t in times]


def host_profile(fn: Callable[[], object], calls: int) -> dict:
    """``fn()`` run ``calls`` times under torch.profiler (CPU); per call, in µs: ``call``
    (wall time), ``kernels`` (self time of the te_cpp and aten ops), ``wrapper`` (self time of
    COMPILE_WRAPPER_EVENTS) and ``events`` (self time by event name). The profiler's own cost
    inflates every figure alike."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        wall = (time.perf_counter() - t0) / calls * 1e6
    events = {e.key: e.self_cpu_time_total / calls for e in prof.key_averages()}
    return {"call": wall,
            "kernels": sum(v for k, v in events.items() if k.startswith(KERNEL_EVENTS)),
            "wrapper": sum(v for k, v in events.items()
                           if k.startswith(COMPILE_WRAPPER_EVENTS)),
            "events": events}


def write_csv(results: list[Result], path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fields = [f.name for f in dataclasses.fields(Result)]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["# " + environment()])  # the allocator's settings included
        w.writerow(fields)
        for r in results:
            w.writerow([getattr(r, name) for name in fields])


def check_close(name: str, got, expected, dtype: torch.dtype) -> None:
    tol = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 3e-2)}.get(dtype, (1e-3, 1e-3))
    torch.testing.assert_close(got.float(), expected.float(), rtol=tol[0], atol=tol[1],
                               msg=lambda m: f"{name}: ours disagrees with eager: {m}")


def write_outputs(results: list[Result], path_stem: str, title: str) -> None:
    os.makedirs(os.path.dirname(path_stem) or ".", exist_ok=True)
    with open(path_stem + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([fld.name for fld in dataclasses.fields(Result)])
        for r in results:
            w.writerow([getattr(r, fld.name) for fld in dataclasses.fields(Result)])
    with open(path_stem + ".md", "w") as f:
        f.write(f"# {title}\n\n{environment()}  \n{time.strftime('%Y-%m-%d %H:%M')}\n\n")
        f.write("Ratio = provider time / ours (median over rounds, min-max); >1 means ours is "
                "faster. Efficiency = ours' achieved bandwidth / a tensor copy of the same "
                "bytes in the same run.\n\n")
        f.write("| case | mode | dtype | shape | threads | provider | median µs | ratio | "
                "range | GB/s | of copy |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in results:
            eff = f"{100 * r.copy_efficiency:.0f}%" if r.copy_efficiency else ""
            gbps = f"{r.gbps:.1f}" if r.gbps else ""
            f.write(f"| {r.case} | {r.mode} | {r.dtype} | {r.shape} | {r.threads} | {r.provider} "
                    f"| {r.median_us:.1f} | {r.ratio_vs_ours:.2f} | {r.ratio_min:.2f}-"
                    f"{r.ratio_max:.2f} | {gbps} | {eff} |\n")
