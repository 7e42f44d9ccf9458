"""Renders the suite's results as a Markdown report (tables) with ratios.png beside it (a plot
of the speedups), from the Result rows of bench/suite.py or from its CSV:

    python bench/report.py bench/out/suite.csv            # bench/out/suite.md + ratios.png
    python bench/report.py bench/out/suite.csv --readme   # also this CPU's bench/README.md section

Every run renders its own report beside its CSV (bench/out/); the committed report,
bench/README.md, only when asked: the full run (`make bench-report`, `bench/suite.py --full`)
or --readme. The committed report keeps one section per CPU model (bench/machines/<model>/).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import statistics
import sys
import time
from collections import OrderedDict
from operator import attrgetter

PROVIDERS = ("torch", "torch.compile", "ours", "ours compiled")
HERE = os.path.dirname(os.path.abspath(__file__))
COMMITTED_REPORT = os.path.join(HERE, "README.md")
# bench/suite.py times a job again when the host's memory bandwidth (the median of the copies
# timed before the job, after each of its rounds and after it) was below QUIET_HOST of the run's
# median at the job's thread count, or when the VM's host stole more than BUSY_STEAL of its
# threads' time
QUIET_HOST = 0.8
BUSY_STEAL = 0.05
# a row whose timed calls fault in fresh pages (common.timed counts them; the median over
# rounds) worth FRESH_SHARE of the bytes its case moves, or FRESH_PAGES pages for a case without
# a byte count, took new memory for its outputs instead of reusing freed memory
FRESH_PAGES = 1.0
FRESH_SHARE = 0.01
PAGE_BYTES = 4096
# a row whose round medians spread by SPREAD_WIDE or more (p80 / p20, for any of its
# providers) was timed while something moved under the job that the host probes may not see;
# bench/suite.py times such a job again
SPREAD_WIDE = 1.5


def report_paths(stem: str, *, quick: bool, readme: str | None = None) -> list[str]:
    """The Markdown reports a run renders (each with ratios.png in its folder): the run's own,
    ``stem + ".md"`` beside its CSV, always; then ``readme`` when given (None: the committed
    bench/README.md for a full run, none for a quick run; "": none)."""
    if readme is None:
        readme = "" if quick else COMMITTED_REPORT
    paths = [stem + ".md"]
    if readme and os.path.abspath(readme) != os.path.abspath(paths[0]):
        paths.append(readme)
    return paths


def _row_key(r):
    return (r.threads, r.case_id, r.case, r.shape, r.mode, r.dtype)


def _fmt_ratio(r) -> str:
    """Speedup of ours over provider r: t_r / t_ours, median (min-max over rounds)."""
    return f"{r.ratio_vs_ours:.2f} ({r.ratio_min:.2f}-{r.ratio_max:.2f})"


def _goal(label: str, value: float, target: float, fmt) -> str:
    """'label ≥target ✓' (or ✗) for a set target; '' when the case has none."""
    if target != target:  # NaN: no target
        return ""
    return f"{label} ≥{fmt(target)} {'✓' if value >= target else '✗'}"


def _group(results):
    groups: "OrderedDict[tuple, dict]" = OrderedDict()
    for r in results:
        groups.setdefault(_row_key(r), {})[r.provider] = r
    return groups


def summary_table(results) -> list[str]:
    lines = [
        "| case | mode | dtype | shape | ours µs | vs torch | vs torch.compile | "
        "ours compiled vs ours | ours % of copy (GB/s) | ours % of roof (GFLOP/s of roof) | "
        "ours / torch.mm | targets |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, by in _group(results).items():
        ours = by.get("ours")
        if ours is None:
            continue
        cells = [f"{ours.case_id} {ours.case}", ours.mode, ours.dtype, ours.shape,
                 f"{ours.median_us:,.0f}" if ours.median_us >= 100 else f"{ours.median_us:.1f}"]
        cells.append(_fmt_ratio(by["torch"]) if "torch" in by else "")
        cells.append(_fmt_ratio(by["torch.compile"]) if "torch.compile" in by else "")
        oc = by.get("ours compiled")
        # t_ours / t_ours_compiled: > 1 means the compiled te.ops model is faster than eager
        cells.append(f"{1 / oc.ratio_vs_ours:.2f}" if oc else "")
        cells.append(f"{100 * ours.copy_efficiency:.0f}% ({ours.gbps:.1f})"
                     if ours.copy_efficiency else "")
        cells.append(f"{100 * ours.roof_efficiency:.0f}% ({ours.gflops:.1f} of "
                     f"{ours.roof_gflops:.0f}, {'FLOP' if compute_bound(ours) else 'memory'})"
                     if _has_roof(ours) else "")
        mm = by.get("torch.mm")
        cells.append(f"{1 / mm.ratio_vs_ours:.3f}" if mm else "")
        goals = [
            _goal("eager", by["torch"].ratio_vs_ours, ours.target_vs_eager, "{:g}x".format)
            if "torch" in by else "",
            _goal("compile", by["torch.compile"].ratio_vs_ours, ours.target_vs_compile,
                  "{:g}x".format) if "torch.compile" in by else "",
            _goal("roof", ours.roof_efficiency, ours.target_roof, lambda v: f"{100 * v:.0f}%")
            if compute_bound(ours) else
            _goal("copy", ours.copy_efficiency, ours.target_copy, lambda v: f"{100 * v:.0f}%"),
            _goal("compiled", 1 / oc.ratio_vs_ours, ours.target_compiled, "{:g}x".format)
            if oc else "",
        ]
        cell = ", ".join(g for g in goals if g)
        if ours.target_note:
            cell += f" ({ours.target_note})"
        cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# Issue 18's targets, each over every row it covers: (label, case ids, modes, dtypes (None:
# all), the value from a row's providers (None: not applicable), minimum, format)
_MEMORY_BOUND = ("C1", "C2", "C3", "C4", "C5", "C10")


def _has_roof(r) -> bool:
    roof = getattr(r, "roof_gflops", 0.0)
    return roof == roof and roof > 0  # older CSVs: NaN


def compute_bound(r) -> bool:
    """The row's FLOP roof (the GEMM's rate) is below its memory roof: the op's arithmetic,
    not the copy bandwidth, bounds it on this machine (common.roofline's fields)."""
    return _has_roof(r) and r.roof_gflops == r.peak_gflops


def _copy_target(by, r):
    """Target 3 on a bf16 / fp16 row whose memory roof binds: the fraction of copy bandwidth."""
    if not r.copy_efficiency or r.target_copy != r.target_copy or compute_bound(r):
        return None
    return r.copy_efficiency


def _roof_target(by, r):
    """Target 3 on a bf16 / fp16 row whose FLOP roof binds: the fraction of that roof."""
    target = getattr(r, "target_roof", float("nan"))
    if not compute_bound(r) or target != target:
        return None
    return r.roof_efficiency


def _ratio(by, num: str, den: str):
    """t(den) / t(num), from both providers' ratios to ours (> 1: num is faster)."""
    if num not in by or den not in by:
        return None
    return by[den].ratio_vs_ours / by[num].ratio_vs_ours


VERDICTS = (
    ("ours compiled >= ours eager, memory-bound cases", _MEMORY_BOUND, None, None,
     lambda by, r: _ratio(by, "ours compiled", "ours"), 1.0, "{:.2f}x"),
    ("ours eager >= plain eager, memory-bound cases", _MEMORY_BOUND, None, None,
     lambda by, r: _ratio(by, "ours", "torch"), 1.0, "{:.2f}x"),
    ("small steps (C9): ours compiled >= torch.compile", ("C9",), None, None,
     lambda by, r: _ratio(by, "ours compiled", "torch.compile"), 1.0, "{:.2f}x"),
    ("small steps (C9): ours eager >= plain eager", ("C9",), None, None,
     lambda by, r: _ratio(by, "ours", "torch"), 1.0, "{:.2f}x"),
    ("bf16 / fp16 memory-bound kernels >= 60% of copy (rows whose memory roof binds)", None,
     None, ("bfloat16", "float16"), _copy_target, 0.6, "{:.0%}"),
    ("bf16 / fp16 compute-bound kernels >= 70% of the FLOP roof (rows whose FLOP roof binds)",
     None, None, ("bfloat16", "float16"), _roof_target, 0.7, "{:.0%}"),
    ("MLP block (C8) forward+backward >= 1.05x plain eager", ("C8",), ("fwd+bwd",), None,
     lambda by, r: _ratio(by, "ours", "torch"), 1.05, "{:.2f}x"),
    ("MLP block (C8) forward+backward: ours compiled >= ours eager", ("C8",), ("fwd+bwd",),
     None, lambda by, r: _ratio(by, "ours compiled", "ours"), 1.0, "{:.2f}x"),
)


def _ops_share(r) -> str:
    """" (ops N%)": the part of a row's share outside the GEMMs spent in other ops; "" where
    the run did not split it."""
    ops = getattr(r, "outside_gemm_ops", float("nan"))
    return f" (ops {ops:.1%})" if ops == ops else ""


def _split_note(results) -> str:
    """What the MLP block's floor lines add where the run measured it: the ops' part and the
    least bytes (runs before these were recorded have neither)."""
    note = ""
    if any(_ops_share(r) for r in results if r.case_id == "C8"):
        note += "; in brackets the part in other ops, the rest is host work"
    if any(getattr(r, "outside_gemm_min_bytes", -1) > 0 for r in results):
        note += ("; the least that work moves: the bytes of its passes, each input read once "
                 "and each output written once, with the biases and the residual add inside "
                 "the GEMMs")
    return note


def floor_lines(results) -> list[str]:
    """Issue 18's floor for the MLP block: ours' share of a forward+backward step outside the
    GEMMs, against plain eager's (target: ours <= 2%); and that share's own floor, the minimal
    bytes of the work outside the GEMMs at the job's copy rate (its host probe) as a share of
    ours' step, where the run measured both."""
    lines, above = [], 0
    for _, by in _group(results).items():
        r, t = by.get("ours"), by.get("torch")
        if r is None or t is None or getattr(r, "outside_gemm", float("nan")) != r.outside_gemm:
            continue
        verdict = "met" if r.outside_gemm <= 0.02 else "missed"
        ours, plain = (f"{x.outside_gemm:.1%}" + _ops_share(x) for x in (r, t))
        line = (f"* {r.case_id} {r.case} {r.mode} {r.dtype} {r.shape}: outside the GEMMs ours "
                f"{ours} of the step, plain eager {plain} (<= 2%: **{verdict}**)")
        nbytes = getattr(r, "outside_gemm_min_bytes", -1)
        gbps = getattr(r, "host_probe_gbps", float("nan"))
        if nbytes > 0 and gbps == gbps:
            share = nbytes / (gbps * 1e9) / (r.median_us * 1e-6)
            above += share > 0.02
            line += (f"; the least that work moves, {nbytes / 2**20:.0f} MiB, takes "
                     f"{share:.1%} of the step at the job's copy rate ({gbps:.1f} GB/s)")
        lines.append(line)
    if above:
        lines.append(f"* on {above} of these rows the minimal bytes alone take more than 2% of "
                     "the step: the target is out of reach while that work runs in passes of "
                     "its own beside the GEMMs")
    return lines


def _rounds_lines(missed, suffixes=None) -> list[str]:
    """Each missed row (achieved, lowest round, highest round, row) with the range of its
    rounds, flagged where every round misses, and its entry of ``suffixes`` after it; then how
    many have rounds on both sides of 1.00x (a shortfall inside the run's round-to-round
    spread)."""
    lines = []
    for (achieved, lo, hi, r), suffix in zip(missed, suffixes or [""] * len(missed)):
        flag = " (every round below 1.00x)" if hi < 1.0 else ""
        lines.append(f"* {_row_name(r)}: {achieved:.2f}x, its rounds {lo:.2f}-{hi:.2f}x{flag}"
                     f"{suffix}")
    spread = sum(hi >= 1.0 for _, _, hi, _ in missed)
    lines.append(f"* on {spread} of the {len(missed)} missed rows the rounds run on both sides of "
                 "1.00x: the median's shortfall is within the run's round-to-round spread")
    return lines


def eager_floor_lines(results) -> list[str]:
    """The floor of "ours eager >= plain eager" on the memory-bound cases: each missed row with
    the range of its rounds (t(plain) / t(ours) per round) and both providers' bandwidth as a
    share of the copy's (what a kernel moving the row's bytes can reach)."""
    missed, shares = [], []
    for _, by in _group(results).items():
        r, t = by.get("ours"), by.get("torch")
        if r is None or t is None or r.case_id not in _MEMORY_BOUND:
            continue
        if _ratio(by, "ours", "torch") < 1.0:
            missed.append((t.ratio_vs_ours, t.ratio_min, t.ratio_max, r))
            shares.append(f"; ours at {r.copy_efficiency:.0%} of copy, plain eager at "
                          f"{t.copy_efficiency:.0%}" if r.copy_efficiency else "")
    return _rounds_lines(missed, shares) if missed else []


def step_spread_lines(results) -> list[str]:
    """The floor of "MLP block (C8) forward+backward: ours compiled >= ours eager": each missed
    row with the range of its rounds (t(ours) / t(ours compiled) per round), flagged where every
    round misses; how many missed rows have rounds on both sides of 1 (a median inside the
    run's round-to-round spread); and torch.compile's wrapper, the most any memory-bound row of
    the run measured, as a share of the missed steps: what a compiled step adds to the kernels
    it shares with the eager one."""
    missed = []
    for _, by in _group(results).items():
        r, c = by.get("ours"), by.get("ours compiled")
        achieved = _ratio(by, "ours compiled", "ours")
        if r is None or c is None or r.case_id != "C8" or r.mode != "fwd+bwd":
            continue
        if achieved < 1.0:
            missed.append((achieved, r.ratio_vs_ours / c.ratio_max,
                           r.ratio_vs_ours / c.ratio_min, r))
    if not missed:
        return []
    lines = _rounds_lines(missed)
    wrappers = [r.compile_wrapper_us for r in results if r.provider == "ours"
                and r.case_id in _MEMORY_BOUND
                and getattr(r, "compile_wrapper_us", float("nan")) == r.compile_wrapper_us]
    if wrappers:
        steps = [r.median_us for _, _, _, r in missed]
        lines.append(f"* torch.compile's wrapper, at most {max(wrappers):.0f} µs on this run's "
                     f"memory-bound rows, is at most {max(wrappers) / min(steps):.2%} of these "
                     f"steps ({min(steps) / 1e3:.0f}-{max(steps) / 1e3:.0f} ms)")
    return lines


def _rows(shape: str) -> int | None:
    """The row count of a shape: '4096x1024' -> 4096, '4096x2*4096' -> 4096; None for shapes
    of another form."""
    rows, _, width = shape.partition("x")
    return int(rows) if rows.isdigit() and width else None


def threads_label(n: int) -> str:
    """A thread count in words: '1 thread', '2 threads'."""
    return f"{n} thread{'s' if n > 1 else ''}"


def _row_name(r) -> str:
    """A row as the report names it: case, mode, dtype, shape and thread count."""
    return f"{r.case_id} {r.case} {r.mode} {r.dtype} {r.shape}, {threads_label(r.threads)}"


def kernel_floor_lines(results) -> list[str]:
    """Target 3's floor: each row that misses one of the bf16 / fp16 kernel targets of
    VERDICTS (60% of copy, or 70% of the FLOP roof where that roof binds) against its twin,
    the same kernel (case, mode, dtype, threads) at another row count, chosen where the copy's
    bandwidth differs most from the row's: one size from the L3, the other from memory. A
    kernel whose rate stays within 20% while the copy's bandwidth changes by 1.5x or more is
    not bound by memory but by its own work on this CPU; the others are listed with both
    rates. Pairs whose copies differ less (both sizes from memory) tell nothing."""
    targets = [(dtypes, value, minimum) for _, _, _, dtypes, value, minimum, _ in VERDICTS
               if value in (_copy_target, _roof_target)]
    groups = list(_group(results).values())
    by_kernel: dict[tuple, list] = {}
    missed = []
    for by in groups:
        r = by.get("ours")
        if r is None:
            continue
        if r.bytes_moved and r.copy_gbps and _rows(r.shape) is not None:
            by_kernel.setdefault((r.case_id, r.case, r.mode, r.dtype, r.threads), []).append(r)
        if any(r.dtype in dtypes and (v := value(by, r)) is not None and v < minimum
               for dtypes, value, minimum in targets):
            missed.append(r)
    if not missed:
        return []

    def spread(r, o):
        return max(r.copy_gbps, o.copy_gbps) / min(r.copy_gbps, o.copy_gbps)

    held, moved, alone = [], [], []
    for r in missed:
        others = [o for o in by_kernel.get((r.case_id, r.case, r.mode, r.dtype, r.threads), [])
                  if _rows(o.shape) != _rows(r.shape)]
        o = max(others, key=lambda o: spread(r, o), default=None)
        if o is None or spread(r, o) < 1.5:
            alone.append(r)
        elif 1 / 1.2 <= r.gbps / o.gbps <= 1.2:
            held.append((r, o))
        else:
            moved.append((r, o))

    def span(values, fmt):
        lo, hi = fmt.format(min(values)), fmt.format(max(values))
        return lo if lo == hi else f"{lo}-{hi}"

    lines = []
    if held:
        rates = [r.gbps / o.gbps for r, o in held]
        copies = [spread(r, o) for r, o in held]
        near = [max(r, o, key=attrgetter("copy_gbps")) for r, o in held]
        far = [min(r, o, key=attrgetter("copy_gbps")) for r, o in held]
        lines.append(f"* {len(held)} of the {len(missed)} missed rows run at "
                     f"{span(rates, '{:.2f}')}x their twin's rate while the copy's bandwidth "
                     f"differs {span(copies, '{:.1f}')}x between the two sizes: memory does not "
                     f"bound them, their own work does. The same rates are "
                     f"{span([x.copy_efficiency for x in near], '{:.0%}')} of copy from the "
                     f"faster level and {span([x.copy_efficiency for x in far], '{:.0%}')} "
                     f"from the slower")
    for r, o in moved:
        lines.append(f"* {_row_name(r)}: {r.gbps / o.gbps:.2f}x the rate of its twin at "
                     f"{o.shape} ({o.copy_efficiency:.0%} of copy there) while the copy's "
                     f"bandwidth differs {spread(r, o):.1f}x")
    if alone and not lines:
        lines.append(f"* not measured in this run: none of its {len(alone)} missed rows has a "
                     "twin at another level of the memory hierarchy (bench/suite.py --full "
                     "times a twin for every memory-bound kernel)")
    elif alone:
        lines.append(f"* {len(alone)} missed rows have no twin at another level of the memory "
                     "hierarchy in this run: " + "; ".join(_row_name(r) for r in alone))
    return lines


def compile_floor_lines(results) -> list[str]:
    """Target 1's floor ("ours compiled >= ours eager" on the memory-bound cases), from each
    ours row's host costs with cold caches (an 8-row call right after the row's own call): a
    compiled call runs ours eager's kernels plus at least torch.compile's wrapper (the plain
    model compiled), an eager call the kernels plus our host path (ours eager); so the best
    ratio a compiled call can reach is t_eager / (t_eager - host + wrapper). Counts the missed
    rows where that bound is itself below 1, and compares ours compiled's own host cost with
    the plain model's."""
    rows = []
    for _, by in _group(results).items():
        r = by.get("ours")
        achieved = _ratio(by, "ours compiled", "ours")
        if r is None or r.case_id not in _MEMORY_BOUND or achieved is None:
            continue
        host = getattr(r, "eager_host_us", float("nan"))
        wrapper = getattr(r, "compile_wrapper_us", float("nan"))
        if host != host or wrapper != wrapper:  # not measured (NaN)
            continue
        rows.append((achieved, r.median_us / (r.median_us - host + wrapper), r))
    if not rows:
        return []
    missed = [(a, b, r) for a, b, r in rows if a < 1.0]
    bound = [(a, b, r) for a, b, r in missed if b < 1.0]
    wrappers = [r.compile_wrapper_us for _, _, r in rows]
    hosts = [r.eager_host_us for _, _, r in rows]
    above = sum(w > h for w, h in zip(wrappers, hosts))
    lines = [f"* an 8-row call right after the row's own call: the plain model compiled "
             f"(torch.compile's wrapper) {min(wrappers):.0f}-{max(wrappers):.0f} µs, ours eager "
             f"(our whole host path) {min(hosts):.0f}-{max(hosts):.0f} µs; the wrapper costs more "
             f"on {above} of the {len(rows)} rows",
             f"* the best ratio a compiled call can reach, t(eager) / (t(eager) - host + "
             f"wrapper), is below 1.00x on {len(bound)} of the {len(missed)} missed rows"]
    if bound:
        gaps = sorted(b - a for a, b, _ in bound)
        lines.append(f"* on those rows, the bound minus ours compiled's ratio: median "
                     f"{gaps[len(gaps) // 2]:.2f}, from {gaps[0]:.2f} to {gaps[-1]:.2f} "
                     "(negative: measured above the bound, which comes from separate calls)")
    rest = [(a, b, r) for a, b, r in missed if b >= 1.0]
    if rest:
        worst = min(rest, key=lambda t: t[0] - t[1])
        lines.append(f"* the other {len(rest)} missed rows: worst {worst[0]:.2f}x against a "
                     f"bound of {worst[1]:.2f}x ({worst[2].case_id} {worst[2].case} "
                     f"{worst[2].mode} {worst[2].dtype} {worst[2].shape}, {worst[2].threads} "
                     "thread(s))")
    own = sorted(r.compiled_host_us - r.compile_wrapper_us for _, _, r in rows
                 if getattr(r, "compiled_host_us", float("nan")) == r.compiled_host_us)
    if own:
        lines.append(f"* ours compiled's 8-row call minus the plain model's, the part of the "
                     f"compiled host cost that is ours: median {own[len(own) // 2]:.0f} µs, from "
                     f"{own[0]:.0f} to {own[-1]:.0f} µs")
    return lines


def host_floor_lines(callgrind_rows) -> list[str]:
    """Target 2's floor (the C9 small steps): where a step's host instructions go, ours against
    plain, from bench/callgrind.py's rows (8x256, one thread); [] without them."""
    count = {(r["case"], r["provider"]): r["instructions_per_call"] for r in callgrind_rows}

    def pair(case):
        ours, plain = count.get((case, "ours")), count.get((case, "plain"))
        return None if ours is None or plain is None else (ours / 1e3, plain / 1e3)

    ops, fwd = pair("Sequential fwd: op calls only"), pair("Sequential fwd")
    if ops is None or fwd is None:
        return []
    lines = [f"* the op calls alone (our te_cpp ops against ATen's): ours {ops[0]:,.0f}K, plain "
             f"{ops[1]:,.0f}K instructions per forward",
             f"* the forward step (grad enabled): ours {fwd[0]:,.0f}K, plain {fwd[1]:,.0f}K; "
             f"outside the op calls ours {fwd[0] - ops[0]:,.0f}K (Sequential, the fuser and the "
             f"pipeline Function, in Python, and the Function's C++ apply), plain "
             f"{fwd[1] - ops[1]:,.0f}K (nn.Sequential's module calls and ATen's autograd nodes)"]
    no_grad = pair("Sequential fwd (no_grad)")
    if no_grad:
        lines.append(f"* under no_grad: ours {no_grad[0]:,.0f}K, plain {no_grad[1]:,.0f}K")
    compiled = pair("Sequential compiled fwd")
    unguarded = pair("Sequential compiled fwd (guards skipped)")
    if compiled and unguarded:
        lines.append(f"* compiled: ours {compiled[0]:,.0f}K, plain {compiled[1]:,.0f}K, of which "
                     f"Dynamo's guards ours {compiled[0] - unguarded[0]:,.0f}K, plain "
                     f"{compiled[1] - unguarded[1]:,.0f}K")
    return lines


def rounds_spread(rows) -> float:
    """The widest spread of the rows' round medians, p80 / p20 (1 without any)."""
    return max((r.p80_us / r.p20_us for r in rows if r.p20_us > 0), default=1.0)


def verdict_lines(results) -> list[str]:
    """One line per target of VERDICTS: met on all its rows, or missed on k of n with the worst
    row and its value, and the worst row's spread where it is SPREAD_WIDE or more; rows without
    the providers a target compares are not counted."""
    groups = list(_group(results).items())
    lines = []
    for label, cases, modes, dtypes, value, minimum, fmt in VERDICTS:
        vals = []
        for _, by in groups:
            r = by.get("ours")
            if (r is None or (cases and r.case_id not in cases) or (modes and r.mode not in modes)
                    or (dtypes and r.dtype not in dtypes)):
                continue
            v = value(by, r)
            if v is not None:
                vals.append((v, _row_name(r), rounds_spread(by.values())))
        if not vals:
            lines.append(f"* {label}: not measured in this run")
            continue
        missed = [v for v in vals if v[0] < minimum]
        worst = min(vals)
        if not missed:
            lines.append(f"* {label}: **met** on all {len(vals)} rows (lowest "
                         f"{fmt.format(worst[0])}: {worst[1]})")
        else:
            spread = (f"; its rounds spread {worst[2]:.2f}x" if worst[2] >= SPREAD_WIDE
                      else "")
            lines.append(f"* {label}: **missed** on {len(missed)} of {len(vals)} rows; worst "
                         f"{fmt.format(worst[0])} against {fmt.format(minimum)} ({worst[1]}"
                         f"{spread})")
    return lines


def memory_table(results) -> list[str]:
    rows = [r for r in results if r.saved_bytes != -1 or r.peak_bytes != -1]
    if not rows:
        return []
    lines = ["| case | dtype | shape | threads | provider | saved activations MiB | "
             "peak allocated MiB |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        saved = f"{r.saved_bytes / 2**20:.1f}" if r.saved_bytes >= 0 else "n/a"
        peak = f"{r.peak_bytes / 2**20:.1f}" if r.peak_bytes >= 0 else "n/a"
        lines.append(f"| {r.case_id} {r.case} | {r.dtype} | {r.shape} | {r.threads} | "
                     f"{r.provider} | {saved} | {peak} |")
    return lines


def compile_table(results) -> list[str]:
    lines = ["| case | dtype | shape | threads | torch.compile s | ours compiled s |",
             "|---|---|---|---|---|---|"]
    seen = set()
    for key, by in _group(results).items():
        k = (key[0], key[1], key[2], key[3], key[5])
        if k in seen or "torch.compile" not in by:
            continue
        seen.add(k)
        r = by["torch.compile"]
        oc = by.get("ours compiled")
        lines.append(f"| {r.case_id} {r.case} | {r.dtype} | {r.shape} | {r.threads} | "
                     f"{r.compile_s:.1f} | {oc.compile_s:.1f} |" if oc else "")
    return lines


def plot(results, path: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = [(k, by) for k, by in _group(results).items() if "ours" in by and "torch" in by]
    threads = sorted({k[0] for k, _ in groups}, reverse=True)
    fig, axes = plt.subplots(len(threads), 1, figsize=(max(10, 0.42 * len(groups) / len(threads)
                                                            + 3), 5.2 * len(threads)),
                             squeeze=False)
    colours = {"torch.compile": "#9aa5b1", "ours": "#2a7ab0", "ours compiled": "#7fc97f"}
    for ax, th in zip(axes[:, 0], threads):
        sub = [(k, by) for k, by in groups if k[0] == th]
        labels = [f"{k[1]} {by['ours'].case.split(' (')[0]} {k[4]} {k[5][:4]} {k[3]}"
                  for k, by in sub]
        width = 0.27
        for j, prov in enumerate(("torch.compile", "ours", "ours compiled")):
            # speedup over plain eager: t_torch / t_provider
            vals = []
            for _, by in sub:
                if prov in by:
                    vals.append(by["torch"].ratio_vs_ours / by[prov].ratio_vs_ours)
                else:
                    vals.append(0.0)
            xs = [i + (j - 1) * width for i in range(len(sub))]
            ax.bar(xs, vals, width, label=prov, color=colours[prov])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylabel("speedup over plain eager (log)")
        ax.set_title(f"{threads_label(th)}: time of plain PyTorch eager / time "
                     "of each provider (median of per-round ratios)")
        ax.set_xticks(range(len(sub)))
        ax.set_xticklabels(labels, rotation=75, ha="right", fontsize=7)
        ax.legend(fontsize=8)
        ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def callgrind_table(rows) -> list[str]:
    lines = ["| group | case | provider | instructions / call | vs plain |",
             "|---|---|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['group']} | {r['case']} | {r['provider']} | "
                     f"{r['instructions_per_call']:,} | {r['ratio_vs_plain']:.2f} |")
    return lines


_INTRO = (
    "Generated by `bench/suite.py` (do not edit by hand). Reproduce with `make bench-report` "
    "(the full run: 7 rounds, DRAM-size and odd shapes, 2 threads, and a 1-thread table of the "
    "memory-bound and host cases; the GEMM-bound cases C6-C8 at 1 thread take about 40 minutes "
    "more: `python bench/suite.py --threads 1 --cases C6 C7 C8`), or `make bench` (the quick "
    "run: 2 threads, 3 rounds, GEMM cases at T=1024; under 5 minutes once the compile cache is "
    "warm), which renders its report into bench/out/suite.md only. Neither runs the GEMM-bound "
    "cases in a dtype whose GEMM ATen runs as a scalar loop on the CPU (bfloat16 without "
    "AVX-512; the section says so), unless `--cases` names them.")

_METHOD = (
    "Method. One process; four providers per case on identical inputs: plain-PyTorch eager "
    "(`torch`), `torch.compile(fullgraph=True)` of it, ours eager (te.ops) and ours "
    "compiled. Before timing, ours and ours compiled are checked (outputs and gradients): "
    "their relative error to a float64 run of the plain model must be within a per-dtype "
    "bound, or at most twice plain eager's own. Each round times every provider once in "
    "rotated order (torch.utils.benchmark, explicit thread count); a ratio is "
    "t(provider) / t(ours) within one round, shown as the median (min-max) over rounds: "
    "above 1 means ours is faster. Memory-bound cases time a tensor copy of the same bytes "
    "in every round: \"% of copy\" is ours' achieved bandwidth (minimal bytes: each input "
    "read once, each output written once) over the copy's. They also time an fp32 "
    "512x512x512 torch.mm in every round, the FLOP roof: \"% of roof\" is ours' FLOP rate "
    "(the formula's minimal floating-point operations, bench/suite.py's FLOPS) over the "
    "lower of that roof and the memory roof (operations per byte times the copy's "
    "bandwidth); where the FLOP roof is the lower (compute-bound on this machine), the "
    "target is 70% of it instead of 60% of copy. GEMM-bound cases time a bare "
    "torch.mm of the same shapes: \"ours / torch.mm\" is t(ours) / t(mm). `fwd` is a "
    "training forward (grad enabled), `bwd` a backward on a retained graph, `fwd+bwd` a "
    "whole step. The process keeps freed memory and reuses it (jemalloc with purging off "
    "where it is installed, else glibc malloc with GLIBC_TUNABLES; bench/allocator.py, and the "
    "Machine line names it): on these VMs a fresh 64 MiB allocation costs about 18 ms of page "
    "faults, for every provider alike, which would otherwise hide the kernels. Every timed "
    "call's page faults are counted, and a \"Page faults:\" line names the rows whose calls "
    "took fresh pages all the same. A missed target's worst row states its rounds' spread "
    f"where one of its providers' p80 round took {SPREAD_WIDE:g}x its p20 round or more. "
    "Each job (a case at one dtype and thread count) is "
    "watched for a busy host: a 64 MiB copy is timed before it, after each of its timing "
    "rounds and after it, and the CPU time the VM's host stole from it is counted (the steal "
    "column of /proc/stat). Where the median of its copies falls below "
    f"{100 * QUIET_HOST:.0f}% of the run's median at that thread count (other guests of the "
    "VM's host streaming memory) or more than "
    f"{100 * BUSY_STEAL:.0f}% of the job's thread time was stolen, the job is timed again "
    f"once the copy recovers, and so is a job whose rounds spread {SPREAD_WIDE:g}x or more "
    "(something the copies did not see moved under it); a timing on a quiet host stands, "
    "else the one whose rounds spread less, then the one with the faster median copy; a "
    "machine's \"Host:\" "
    "line states its run's probes (a section without a Host or a Page faults line comes from "
    "a run made before the suite probed the host or counted faults; one whose Host line "
    "counts no stolen time, from a run that probed only before and after each job; one whose "
    "Host line does not count spread rounds, from a run made before the suite timed a job "
    "again for them).")


def _body(results, callgrind_rows) -> list[str]:
    """A run's verdicts, floors and tables (its "## " sections), for one machine."""
    out = ["## Verdicts (issue 18's targets)", "", "Each target over every row of this run it "
           "covers (both thread counts); the tables below have the rows.", ""]
    out += verdict_lines(results) + [""]
    # each target's floor: its heading and lines, left out where the run has none
    floors = (
        ("The floor of \"ours compiled >= ours eager\" (memory-bound cases; host costs with the "
         "caches as the row's call leaves them, without a profiler; `bench/compile_floor.py` "
         "splits them into torch.compile's events):", compile_floor_lines(results)),
        ("The floor of \"ours eager >= plain eager\" (memory-bound cases; each missed row's "
         "median and the range of its rounds, and each provider's bandwidth as a share of the "
         "copy's in the same rounds):", eager_floor_lines(results)),
        ("The small steps' floor (C9; `bench/callgrind.py` at 8x256 fp32, one thread, "
         "instructions per call; the table at the end):", host_floor_lines(callgrind_rows)),
        ("The floor of the bf16 / fp16 kernels' targets (60% of copy, or 70% of the FLOP roof; "
         "each missed row against its twin, the same kernel at another row count whose copy is "
         "1.5x faster or slower: one size in the L3, the other from memory):",
         kernel_floor_lines(results)),
        ("The MLP block's floor: time outside the GEMMs (aten::mm / addmm self time under "
         "torch.profiler, over the step's wall time" + _split_note(results) + "):",
         floor_lines(results)),
        ("The floor of \"MLP block (C8) forward+backward: ours compiled >= ours eager\" (each "
         "missed row's median and the range of its rounds; a compiled step runs the eager "
         "step's kernels behind torch.compile's wrapper):", step_spread_lines(results)),
    )
    for heading, lines in floors:
        if lines:
            out += [heading, ""] + lines + [""]
    for th in sorted({r.threads for r in results}, reverse=True):
        sub = [r for r in results if r.threads == th]
        out += [f"## {threads_label(th)}", ""] + summary_table(sub) + [""]
    mem = memory_table(results)
    if mem:
        out += ["## Memory of a training step (C8)", "",
                "Saved activations: distinct storages autograd keeps for backward after one "
                "forward (parameters and the input excluded). Peak: the most CPU memory "
                "allocated and not yet freed during one forward+backward (torch.profiler's "
                "memory timeline). n/a: not observable (e.g. inside a compiled region).", ""]
        out += mem + [""]
    if callgrind_rows:
        r0 = callgrind_rows[0]
        out += ["## Host instruction counts (C9, callgrind)", "",
                f"`bench/callgrind.py`: shape 8x256 fp32, 1 thread, {r0['number']} calls per "
                "case in one valgrind process, an empty call's count subtracted; `vs plain` = "
                "instructions / plain PyTorch's (below 1: ours executes fewer). Deterministic, "
                "unlike wall-clock time on a shared 2-core machine. The extension runs as an "
                "AVX2 build under valgrind (which cannot execute AVX-512), as ATen does.", ""]
        out += callgrind_table(callgrind_rows) + [""]
    out += ["## Compile time (first calls, seconds)", ""] + compile_table(results) + [""]
    return out


def host_lines(results) -> list[str]:
    """The run's host probes (bench/suite.py's QuietHost), per thread count: the median and
    range of the jobs' probe levels, the stolen CPU time, the jobs timed again, and the jobs
    whose host stayed busy (a probe level below QUIET_HOST of the median, or more than
    BUSY_STEAL of their time stolen). None for a run without probes."""
    jobs = {(r.threads, r.case_id, r.case, r.shape, r.dtype): r for r in results
            if r.host_probe_gbps == r.host_probe_gbps}
    if not jobs:
        return []
    probes: dict[int, list[float]] = {}
    for r in jobs.values():
        probes.setdefault(r.threads, []).append(r.host_probe_gbps)
    median = {t: statistics.median(v) for t, v in probes.items()}
    retimed = sum(r.attempts > 1 for r in jobs.values())
    # a run that timed a job again for its rounds' spread records each job's spread
    spread = any(r.rounds_spread == r.rounds_spread for r in jobs.values())
    why_again = (f"after their median probe fell below {100 * QUIET_HOST:.0f}% of the run's"
                 + (f", more than {100 * BUSY_STEAL:.0f}% was stolen or their rounds spread "
                    f"{SPREAD_WIDE:g}x or more" if spread else
                    f" or more than {100 * BUSY_STEAL:.0f}% was stolen"))
    stolen = [r for r in jobs.values() if r.host_steal == r.host_steal]
    levels = ", ".join(f"{threads_label(t)} {median[t]:.1f} GB/s ({min(v):.1f}-{max(v):.1f})"
                       for t, v in sorted(probes.items(), reverse=True))
    if stolen:  # probes after every round, and the stolen time
        worst = max(stolen, key=attrgetter("host_steal"))
        line = (f"Host: a 64 MiB copy timed before each job, after each of its rounds and "
                f"after it, the median per job: {levels}; CPU time stolen by the VM's host, "
                f"median {100 * statistics.median(r.host_steal for r in stolen):.1f}% of a "
                f"job's thread time, at "
                f"most {100 * worst.host_steal:.1f}% ({_job_name(worst)}); {retimed} of "
                f"{len(jobs)} jobs timed again {why_again}; ")
        ok = (f"every job's median probe at or above {100 * QUIET_HOST:.0f}% and at most "
              f"{100 * BUSY_STEAL:.0f}% stolen.")
    else:  # a run that probed only around its jobs
        line = (f"Host: a 64 MiB copy timed before and after each job, the lower of the two "
                f"over the jobs: {levels}; {retimed} of {len(jobs)} jobs timed again after a "
                f"probe below {100 * QUIET_HOST:.0f}% of the median; ")
        ok = f"every job's probes at or above {100 * QUIET_HOST:.0f}%."
    busy = []
    for r in jobs.values():
        why = []
        if r.host_probe_gbps < QUIET_HOST * median[r.threads]:
            why.append(f"{100 * r.host_probe_gbps / median[r.threads]:.0f}%")
        if r.host_steal > BUSY_STEAL:
            why.append(f"{100 * r.host_steal:.0f}% stolen")
        if r.rounds_spread >= SPREAD_WIDE:  # False for NaN
            why.append(f"rounds spread {r.rounds_spread:.2f}x")
        if why:
            busy.append(f"{_job_name(r)} ({', '.join(why)})")
    if not busy:
        return [line + ok, ""]
    ran = "1 job ran" if len(busy) == 1 else f"{len(busy)} jobs ran"
    what = "host" if stolen else "host's memory"
    return [line + f"{ran} while the {what} stayed busy: {'; '.join(busy)}.", ""]


def _job_name(r) -> str:
    return f"{r.case_id} {r.case} {r.dtype} {r.shape}, {threads_label(r.threads)}"


def fresh_share(r) -> float:
    """The bytes of the pages a row's call faulted in, over the bytes its case moves (inf for
    a row that faults without a byte count)."""
    if r.bytes_moved:
        return r.faults_per_call * PAGE_BYTES / r.bytes_moved
    return float("inf") if r.faults_per_call >= FRESH_PAGES else 0.0


def took_fresh_pages(r) -> bool:
    """Whether a row's calls faulted in fresh pages worth FRESH_SHARE of its bytes (FRESH_PAGES
    pages without a byte count)."""
    return r.faults_per_call >= FRESH_PAGES and fresh_share(r) >= FRESH_SHARE


def fault_lines(results) -> list[str]:
    """The rows whose timed calls took fresh pages (FRESH_SHARE of their bytes, or FRESH_PAGES
    pages: the allocator gave them new memory instead of the memory freed by the call before,
    and their times include the faults), and the most any row faulted. None for a run that did
    not count faults."""
    counted = [r for r in results if r.faults_per_call == r.faults_per_call]
    if not counted:
        return []

    def name(r) -> str:
        share = fresh_share(r)
        of = f", {100 * share:.1f}% of its bytes" if share != float("inf") else ""
        return f"{_row_name(r)}, {r.provider} ({r.faults_per_call:,.0f} a call{of})"
    faulted = [r for r in counted if took_fresh_pages(r)]
    line = (f"Page faults: each timed call's minor page faults counted; {len(faulted)} of "
            f"{len(counted)} rows took fresh pages worth {100 * FRESH_SHARE:g}% of the bytes "
            f"they move a call (without a byte count, {FRESH_PAGES:g} page)")
    if faulted:
        line += ": " + "; ".join(map(name, faulted))
    line += "."
    most = max(counted, key=lambda r: r.faults_per_call)
    if most.faults_per_call > 0 and not took_fresh_pages(most):
        line += f" The most: {name(most)}."
    return [line, ""]


_GEMMS_IN_FP32 = re.compile(r"; ((?:bf16|fp16)(?: and fp16)?) GEMMs as fp32 GEMMs")


def slow_gemm_lines(results, env: str) -> list[str]:
    """Where te_cpp runs 16-bit GEMMs as fp32 GEMMs (the machine line says so: ATen's own GEMM
    in that dtype is a scalar loop on this CPU), the GEMM-bound cases the run left out in it."""
    m = _GEMMS_IN_FP32.search(env)
    if not m:
        return []
    gemm_cases = sorted({r.case_id for r in results if r.provider == "torch.mm"},
                        key=lambda c: int(c[1:]) if c[1:].isdigit() else 0)
    names = {"bf16": "bfloat16", "fp16": "float16"}
    lines = []
    for short in m.group(1).split(" and "):
        dtype = names[short]
        if not gemm_cases or any(r.provider == "torch.mm" and r.dtype == dtype for r in results):
            continue
        lines += [f"Not run in {dtype}: the GEMM-bound cases ({', '.join(gemm_cases)}). ATen's "
                  f"{dtype} GEMM on this CPU is a scalar loop, not oneDNN's (plain PyTorch's "
                  "steps would take minutes each); te_cpp runs those GEMMs as fp32 GEMMs "
                  "(docs/ops.md, Dtypes). `python bench/suite.py --cases "
                  f"{' '.join(gemm_cases)} --dtypes {dtype}` times them.", ""]
    return lines


def _machine_lines(results, env: str, folder: str, *, quick: bool, callgrind_rows,
                   when: str | None = None) -> list[str]:
    """One run on one machine: when and where it ran (``when``: the run's time, for a report
    rendered again later from its CSVs; None: now), its plot (ratios.png, drawn into folder
    when matplotlib is installed) and its verdicts, floors and tables."""
    cmd = "make bench" if quick else "make bench-report"
    now = time.strftime('%Y-%m-%d %H:%M')
    stamp = now if when is None else f"{when} (rendered again from its CSVs {now})"
    out = [f"This run: `{cmd}`, {stamp}.  ", f"Machine: {env}", ""] + host_lines(results)
    out += fault_lines(results) + slow_gemm_lines(results, env)
    if plot(results, os.path.join(folder, "ratios.png")):
        out += ["![speedups](ratios.png)", ""]
    return out + _body(results, callgrind_rows)


def render(results, env: str, path: str, *, quick: bool, callgrind_rows=(),
           when: str | None = None) -> None:
    """One run's own report, whole, at path (with ratios.png in its folder)."""
    out = ["# Benchmarks", "", _INTRO, "", _METHOD, ""]
    out += _machine_lines(results, env, os.path.dirname(path), quick=quick,
                          callgrind_rows=callgrind_rows, when=when)
    with open(path, "w") as f:
        f.write("\n".join(out))


# ---- The collected report: one section per CPU model ---------------------------------------
#
# A collected report (the committed bench/README.md) keeps the latest run of every CPU model
# it was rendered on: each run writes its machine's section into machines/<model>/ beside the
# report (report.md, ratios.png and the run's CSVs), and the report is assembled from all the
# sections there, with a table of every target's verdict per machine on top.

MACHINES = "machines"


def machine_name(env: str) -> str:
    """The CPU model of common.environment's line (its third field) without trademarks and the
    words Processor / CPU: 'AMD EPYC', 'Intel Xeon'; with ' (AVX2)' or ' (no AVX2)' where its
    ISA flags lack avx512f, since te_cpp's and ATen's kernels are then other builds (a model's
    VMs differ: some hypervisors hide AVX-512)."""
    fields = env.split(", ")
    cpu, _, flags = (fields[2] if len(fields) > 2 else env).partition(" (")
    cpu = re.sub(r"\((R|TM)\)", "", cpu, flags=re.IGNORECASE)
    words = [w for w in cpu.split() if w.lower() not in ("processor", "cpu")]
    name = " ".join(words) or "unknown CPU"
    have = flags.rstrip(")").split()
    if flags and "avx512f" not in have:
        name += " (AVX2)" if "avx2" in have else " (no AVX2)"
    return name


def machine_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def render_collected(results, env: str, path: str, *, quick: bool, callgrind_rows=(),
                     csvs=(), when: str | None = None) -> str:
    """Writes this run's machine section (machines/<model>/ beside path, replacing that
    model's previous one, with copies of the files in csvs) and re-assembles the report at
    path from every machine's section. Returns the section's folder."""
    name = machine_name(env)
    folder = os.path.join(os.path.dirname(os.path.abspath(path)), MACHINES, machine_slug(name))
    os.makedirs(folder, exist_ok=True)
    out = [f"# {name}", ""] + _machine_lines(results, env, folder, quick=quick,
                                             callgrind_rows=callgrind_rows, when=when)
    with open(os.path.join(folder, "report.md"), "w") as f:
        f.write("\n".join(out))
    for src in csvs:
        dst = os.path.join(folder, os.path.basename(src))
        if os.path.abspath(src) != os.path.abspath(dst):
            shutil.copyfile(src, dst)
    with open(path, "w") as f:
        f.write(assemble(os.path.dirname(os.path.abspath(path))))
    return folder


def render_reports(results, env: str, stem: str, *, quick: bool, readme: str | None = None,
                   callgrind_rows=(), csvs=(), when: str | None = None) -> list[str]:
    """Every report of a run (report_paths): its own whole report, then each collected report
    asked for, with this run as its machine's section. Returns their paths."""
    paths = report_paths(stem, quick=quick, readme=readme)
    render(results, env, paths[0], quick=quick, callgrind_rows=callgrind_rows, when=when)
    for path in paths[1:]:
        render_collected(results, env, path, quick=quick, callgrind_rows=callgrind_rows,
                         csvs=csvs, when=when)
    return paths


_VERDICT = re.compile(r"\* (?P<label>.+?): (?:\*\*met\*\* on all (?P<n>\d+) rows \(lowest "
                      r"(?P<low>[^:]+):|\*\*missed\*\* on (?P<k>\d+) of (?P<m>\d+) rows; worst "
                      r"(?P<worst>\S+) against|(?P<none>not measured in this run))")


def verdict_cells(section: list[str]) -> "OrderedDict[str, str]":
    """target -> its short verdict ('met (lowest 1.30x)', 'missed 3 of 96 (worst 0.90x)'),
    from the verdict lines of a machine section."""
    cells: "OrderedDict[str, str]" = OrderedDict()
    for line in section:
        m = _VERDICT.match(line)
        if not m:
            continue
        if m["n"]:
            cells[m["label"]] = f"met (lowest {m['low']})"
        elif m["k"]:
            cells[m["label"]] = f"**missed** {m['k']} of {m['m']} (worst {m['worst']})"
        else:
            cells[m["label"]] = "not measured"
    return cells


def assemble(folder: str) -> str:
    """The collected report's text from folder/machines/*/report.md, machines in name order:
    the introduction and method, the verdicts per machine, then each machine's section with
    its headings one level down and its plot's path from the report's folder."""
    sections = []
    for slug in sorted(os.listdir(os.path.join(folder, MACHINES))):
        md = os.path.join(folder, MACHINES, slug, "report.md")
        if os.path.exists(md):
            with open(md) as f:
                sections.append((slug, f.read().split("\n")))
    out = ["# Benchmarks", "", _INTRO + " A full run renders its CPU model's section "
           "(bench/machines/<model>/: report.md, ratios.png and the run's CSVs) and this report "
           "from every model's latest section.", "", _METHOD, ""]
    names = [lines[0][2:] for _, lines in sections]
    # the run's time (a section rendered again later also states when, in parentheses)
    runs = [next((ln.split(", ", 1)[1].rstrip(".  ").split(" (")[0] for ln in lines
                  if ln.startswith("This run:")), "") for _, lines in sections]
    cells = [verdict_cells(lines) for _, lines in sections]
    out += ["## Verdicts per machine", "",
            "Issue 18's targets, each over every row of the machine's latest full run; the "
            "machines' sections below have the rows.", "",
            "| target | " + " | ".join(f"{n} ({r})" for n, r in zip(names, runs)) + " |",
            "|---|" + "---|" * len(sections)]
    labels = list(OrderedDict.fromkeys(k for c in cells for k in c))
    out += ["| " + " | ".join([label] + [c.get(label, "") for c in cells]) + " |"
            for label in labels]
    out.append("")
    for (slug, lines), name in zip(sections, names):
        out.append(f"## {name}")
        for ln in lines[1:]:
            if ln.startswith("#"):
                ln = "#" + ln
            ln = ln.replace("](ratios.png)", f"]({MACHINES}/{slug}/ratios.png)")
            out.append(ln)
        while out[-1] == "":
            out.pop()
        out.append("")
    return "\n".join(out)


def _load_csv(path):
    import types
    rows = []
    with open(path) as f:
        reader = csv.reader(f)
        env = next(reader)[0].lstrip("# ")
        head, _, tail = env.rpartition("; ")
        if head and head.endswith(tail):  # older CSVs: the allocator's settings twice
            env = head
        header = next(reader)
        for vals in reader:
            r = types.SimpleNamespace(**dict(zip(header, vals)))
            for name in ("median_us", "ratio_vs_ours", "ratio_min", "ratio_max", "gbps",
                         "copy_efficiency", "copy_gbps", "compile_s", "p20_us", "p80_us",
                         "outside_gemm", "outside_gemm_ops", "eager_host_us",
                         "compile_wrapper_us", "compiled_host_us",
                         "target_vs_eager", "target_vs_compile", "target_copy",
                         "target_compiled", "gflops", "peak_gflops", "roof_gflops",
                         "roof_efficiency", "target_roof", "host_probe_gbps", "host_steal",
                         "faults_per_call", "rounds_spread"):
                setattr(r, name, float(getattr(r, name, "nan")))  # older CSVs lack some
            for name in ("threads", "bytes_moved", "saved_bytes", "peak_bytes"):
                setattr(r, name, int(getattr(r, name)))
            for name, default in (("attempts", 1), ("outside_gemm_min_bytes", -1)):
                setattr(r, name, int(getattr(r, name, default)))  # older CSVs lack these
            rows.append(r)
    return rows, env


def _load_callgrind_csv(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["instructions_per_call"] = int(r["instructions_per_call"])
        r["ratio_vs_plain"] = float(r["ratio_vs_plain"])
    return rows


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Render the suite's CSV as a Markdown report "
                                     "beside it (and, with --readme, into bench/README.md)")
    parser.add_argument("csv", nargs="?", default=os.path.join(HERE, "out", "suite.csv"))
    parser.add_argument("--callgrind", help="bench/callgrind.py's CSV, rendered as well")
    parser.add_argument("--quick", action="store_true", help="the CSV is from a quick run")
    parser.add_argument("--readme", nargs="?", const=COMMITTED_REPORT, default="",
                        help="also render this run's machine section of the committed report "
                        "(default path: bench/README.md, sections in bench/machines/)")
    parser.add_argument("--when", help="the run's time (as its report states it, e.g. "
                        "'2026-12-06 00:45'), when rendering an earlier run again from its CSVs")
    a = parser.parse_args()
    rows, env = _load_csv(a.csv)
    cg = _load_callgrind_csv(a.callgrind) if a.callgrind else ()
    for path in render_reports(rows, env, os.path.splitext(a.csv)[0], quick=a.quick,
                               readme=a.readme, callgrind_rows=cg,
                               csvs=[a.csv] + ([a.callgrind] if a.callgrind else []),
                               when=a.when):
        print(f"wrote {path}")
