"""Where the benchmark suite writes (no timing): every run renders its own report beside its CSV
in bench/out/; the committed report, bench/README.md with its per-CPU sections in
bench/machines/, changes only in the full run (`make bench-report`, `bench/suite.py --full`) or
when a path is asked for."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
OUT = os.path.join(BENCH, "out", "suite")
COMMITTED = os.path.join(BENCH, "README.md")

# bench/suite.py's arguments -> the reports it renders (bench/report.py's report_paths), in a
# subprocess: importing bench/suite.py re-executes the process with the benchmark allocator
# settings unless TECPP_BENCH_SYSTEM_MALLOC is set, and puts bench/ modules on sys.path
_PATHS = """
import json, sys
sys.path.insert(0, "bench")
import report, suite
out = {}
for argv in json.loads(sys.argv[1]):
    a = suite.parse_args(argv)
    out[" ".join(argv)] = [a.out + ".csv"] + report.report_paths(a.out, quick=a.quick,
                                                                 readme=a.readme)
print(json.dumps(out))
"""


def test_suite_output_paths(tmp_path):
    stem = str(tmp_path / "run")
    argvs = [["--quick"], [], ["--full"], ["--quick", "--readme", str(tmp_path / "r.md")],
             ["--full", "--readme", ""], ["--quick", "--out", stem], ["--full", "--out", stem]]
    env = dict(os.environ, TECPP_BENCH_SYSTEM_MALLOC="1")
    res = subprocess.run([sys.executable, "-c", _PATHS, json.dumps(argvs)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = {k: [os.path.abspath(p) for p in v]
           for k, v in json.loads(res.stdout.splitlines()[-1]).items()}
    run = [OUT + ".csv", OUT + ".md"]
    assert got["--quick"] == run  # `make bench`: bench/out/ only
    assert got[""] == run + [COMMITTED]
    assert got["--full"] == run + [COMMITTED]  # `make bench-report`
    assert got[f"--quick --readme {tmp_path / 'r.md'}"] == run + [str(tmp_path / "r.md")]
    assert got["--full --readme "] == run
    assert got[f"--quick --out {stem}"] == [stem + ".csv", stem + ".md"]
    assert got[f"--full --out {stem}"] == [stem + ".csv", stem + ".md", COMMITTED]


def test_report_plot_beside_its_markdown(tmp_path):
    """bench/report.py renders a CSV into the Markdown file asked for, with the plot
    (ratios.png, when matplotlib is installed) in the same folder, never in bench/."""
    csv_path = tmp_path / "suite.csv"
    header = ("case,dtype,shape,mode,threads,provider,median_us,ratio_vs_ours,ratio_min,"
              "ratio_max,bytes_moved,gbps,copy_efficiency,copy_gbps,p20_us,p80_us,case_id,"
              "compile_s,saved_bytes,peak_bytes,target_vs_eager,target_vs_compile,target_copy,"
              "target_compiled,target_note")
    rows = [f"GELU,float32,8x8,fwd,2,{p},{t},{r},{r},{r},0,0,0,0,{t},{t},C3,0,-1,-1,"
            "nan,nan,nan,nan," for p, t, r in (("torch", 2.0, 2.0), ("ours", 1.0, 1.0))]
    csv_path.write_text("\n".join(["# test machine", header, *rows]) + "\n")
    before = os.path.getmtime(COMMITTED)
    res = subprocess.run([sys.executable, os.path.join(BENCH, "report.py"), str(csv_path),
                          "--quick"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    text = (tmp_path / "suite.md").read_text()
    assert "| C3 GELU | fwd | float32 | 8x8 |" in text
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not (tmp_path / "ratios.png").exists()
    else:
        assert (tmp_path / "ratios.png").exists() and "![speedups](ratios.png)" in text
    assert os.path.getmtime(COMMITTED) == before


def test_report_verdict_lines():
    """Each issue-18 target gets one line: met on all its rows, or missed with the count and
    the worst row; targets whose rows are absent say so."""
    sys.path.insert(0, BENCH)
    import types

    import report

    def row(case_id, mode, dtype, provider, ratio, copy=0.0, target_copy=float("nan")):
        return types.SimpleNamespace(case=f"case {case_id}", case_id=case_id, mode=mode,
                                     dtype=dtype, shape="4x4", threads=2, provider=provider,
                                     ratio_vs_ours=ratio, copy_efficiency=copy,
                                     target_copy=target_copy, p20_us=10.0, p80_us=11.0)

    rows = [row("C1", "fwd", "float32", "torch", 1.3), row("C1", "fwd", "float32", "ours", 1.0),
            # ours compiled 0.8x ours: t(ours compiled) / t(ours) = 1.25
            row("C1", "fwd", "float32", "ours compiled", 1.25),
            row("C1", "fwd", "bfloat16", "torch", 2.0),
            row("C1", "fwd", "bfloat16", "ours", 1.0, copy=0.33, target_copy=0.6),
            row("C1", "fwd", "bfloat16", "ours compiled", 0.9)]
    lines = dict(zip((v[0] for v in report.VERDICTS), report.verdict_lines(rows)))
    assert "**missed** on 1 of 2 rows; worst 0.80x against 1.00x" in lines[
        "ours compiled >= ours eager, memory-bound cases"]
    assert "**met** on all 2 rows (lowest 1.30x" in lines[
        "ours eager >= plain eager, memory-bound cases"]
    assert "**missed** on 1 of 1 rows; worst 33% against 60%" in lines[
        "bf16 / fp16 memory-bound kernels >= 60% of copy (rows whose memory roof binds)"]
    assert lines["bf16 / fp16 compute-bound kernels >= 70% of the FLOP roof (rows whose FLOP "
                 "roof binds)"].endswith("not measured in this run")
    assert lines["small steps (C9): ours eager >= plain eager"].endswith(
        "not measured in this run")

    # a worst row whose rounds spread widely (p80 / p20 of any of its providers' round
    # medians at SPREAD_WIDE or more) says so: its median carries a host that moved under it
    label = "ours compiled >= ours eager, memory-bound cases"
    assert lines[label].endswith("(C1 case C1 fwd float32 4x4, 2 threads)")
    rows[2].p20_us, rows[2].p80_us = 10.0, 10.0 * report.SPREAD_WIDE
    lines = dict(zip((v[0] for v in report.VERDICTS), report.verdict_lines(rows)))
    assert lines[label].endswith(
        f"(C1 case C1 fwd float32 4x4, 2 threads; its rounds spread {report.SPREAD_WIDE:.2f}x)")
    assert dict(report.verdict_cells([lines[label]])) == {
        label: "**missed** 1 of 2 (worst 0.80x)"}


def test_roofline_picks_the_lower_roof_and_its_target():
    """Target 3's roofline: a row's roof is the lower of the GEMM's FLOP rate and its
    operations per byte times the copy's bandwidth; a row under its FLOP roof is judged by the
    fraction of that roof (70%), one under its memory roof by the fraction of copy (60%)."""
    sys.path.insert(0, BENCH)
    import common
    import report

    def row(flops_per_byte, us, copy_eff):
        # 1 MB moved in `us` µs; the copy at 100 GB/s; the GEMM at 100 GFLOP/s
        r = common.Result("LayerNorm", "bfloat16", f"{flops_per_byte}", "fwd", 2, "ours", us,
                          1.0, 1.0, 1.0,
                          bytes_moved=10**6, case_id="C1", target_copy=0.6, target_roof=0.7)
        r.gbps, r.copy_gbps, r.copy_efficiency = 1e6 / (us * 1e3), 100.0, copy_eff
        common.roofline(r, int(flops_per_byte * 10**6), [90.0, 100.0, 110.0])
        return r

    # 2 flops per byte: memory roof 200 GFLOP/s, FLOP roof 100: compute-bound, at 80 GFLOP/s
    compute = row(2, 25.0, 0.4)
    assert (compute.peak_gflops, compute.roof_gflops) == (100.0, 100.0)
    assert compute.gflops == 80.0 and compute.roof_efficiency == 0.8
    assert report.compute_bound(compute)
    # 0.5 flops per byte: memory roof 50 GFLOP/s: memory-bound, at 20 GFLOP/s (40% of copy)
    memory = row(0.5, 25.0, 0.4)
    assert memory.roof_gflops == 50.0 and memory.roof_efficiency == 0.4
    assert not report.compute_bound(memory)
    lines = dict(zip((v[0] for v in report.VERDICTS), report.verdict_lines([compute, memory])))
    assert "**met** on all 1 rows (lowest 80%" in lines[
        "bf16 / fp16 compute-bound kernels >= 70% of the FLOP roof (rows whose FLOP roof binds)"]
    assert "**missed** on 1 of 1 rows; worst 40% against 60%" in lines[
        "bf16 / fp16 memory-bound kernels >= 60% of copy (rows whose memory roof binds)"]
    table = "\n".join(report.summary_table([compute, memory]))
    assert "| 80% (80.0 of 100, FLOP) |" in table and "roof ≥70% ✓" in table
    assert "| 40% (20.0 of 50, memory) |" in table and "copy ≥60% ✗" in table


def test_kernel_floor_lines_pair_each_miss_with_its_twin():
    """Target 3's floor: a missed bf16 row against the same kernel at another row count. A
    rate that holds while the copy's bandwidth changes 3x is the kernel's own; one that moves
    with the copy is listed with both rates; a twin whose copy is about as fast (both from
    memory) and a row without a twin are listed as having none."""
    sys.path.insert(0, BENCH)
    import common
    import report

    def row(case_id, shape, gbps, copy_gbps, dtype="bfloat16", mode="fwd", threads=2):
        r = common.Result(f"case {case_id}", dtype, shape, mode, threads, "ours", 100.0, 1.0,
                          1.0, 1.0, bytes_moved=10**6, case_id=case_id, target_copy=0.6)
        r.gbps, r.copy_gbps, r.copy_efficiency = gbps, copy_gbps, gbps / copy_gbps
        return r

    rows = [row("C1", "4096x1024", 40.0, 180.0), row("C1", "16384x1024", 38.0, 60.0),
            row("C2", "4096x1000", 90.0, 180.0), row("C2", "16384x1024", 45.0, 60.0),
            row("C5", "4096x2*4096", 20.0, 60.0), row("C5", "16384x2*4096", 20.0, 55.0),
            row("C10", "4096x1024", 30.0, 180.0),
            row("C1", "4096x1024", 100.0, 180.0, dtype="float32"),  # no bf16 target
            row("C3", "4096x4096", 170.0, 180.0)]  # met
    lines = report.kernel_floor_lines(rows)
    # C1 at 16384 rows and C2 at 16384 rows meet 60%: 5 misses
    assert lines[0] == ("* 1 of the 5 missed rows run at 1.05x their twin's rate while the "
                        "copy's bandwidth differs 3.0x between the two sizes: memory does not "
                        "bound them, their own work does. The same rates are 22% of copy from "
                        "the faster level and 63% from the slower")
    held = report.kernel_floor_lines(rows + [row("C10", "16384x1024", 27.0, 60.0)])[0]
    # C10's twin misses too: both held, each against the other
    assert held.startswith("* 3 of the 6 missed rows run at 0.90-1.11x their twin's rate while "
                           "the copy's bandwidth differs 3.0x")
    assert lines[1] == ("* C2 case C2 fwd bfloat16 4096x1000, 2 threads: 2.00x the rate of its "
                        "twin at 16384x1024 (75% of copy there) while the copy's bandwidth "
                        "differs 3.0x")
    assert lines[2].startswith("* 3 missed rows have no twin at another level of the memory "
                               "hierarchy in this run: C5 case C5 fwd bfloat16 4096x2*4096, 2 "
                               "threads; C5 case C5 fwd bfloat16 16384x2*4096")
    assert lines[2].endswith("C10 case C10 fwd bfloat16 4096x1024, 2 threads")
    assert len(lines) == 3
    assert report.kernel_floor_lines(rows[-2:]) == []
    # a run without twins (the quick run): one line, not a list of every miss
    assert report.kernel_floor_lines(rows[6:7]) == [
        "* not measured in this run: none of its 1 missed rows has a twin at another level of "
        "the memory hierarchy (bench/suite.py --full times a twin for every memory-bound "
        "kernel)"]


def test_report_rendered_again_from_its_csvs_keeps_the_run(tmp_path):
    """A report rendered again from a run's CSVs states the run's own time and when it was
    rendered; the machine line is the CSV's, once (older CSVs repeat the allocator note)."""
    sys.path.insert(0, BENCH)
    import report

    env = ("torch 2.13.0+cpu, python 3.11.7, AMD EPYC (avx2 avx512f), 2 cpus, ATen parallel "
           "backend OpenMP, GLIBC_TUNABLES=x=1")
    csv_path = tmp_path / "suite.csv"
    csv_path.write_text(f'"# {env}; GLIBC_TUNABLES=x=1"\ncase,threads,bytes_moved,saved_bytes,'
                        "peak_bytes\n")
    rows, loaded = report._load_csv(str(csv_path))
    assert rows == [] and loaded == env
    report.render_reports(_verdict_rows(1.3), env, str(tmp_path / "suite"), quick=False,
                          readme="", when="2026-12-06 00:45")
    text = (tmp_path / "suite.md").read_text()
    assert re.search(r"This run: `make bench-report`, 2026-12-06 00:45 \(rendered again from its "
                     r"CSVs \d{4}-\d\d-\d\d \d\d:\d\d\)\.", text)
    assert f"Machine: {env}\n" in text
    # the collected report's verdict table names the run's time alone
    readme = tmp_path / "README.md"
    report.render_collected(_verdict_rows(1.3), env, str(readme), quick=False,
                            when="2026-12-06 00:45")
    assert "| target | AMD EPYC (2026-12-06 00:45) |" in readme.read_text()


def test_quiet_host_times_a_job_again_while_the_host_is_busy(monkeypatch):
    """A job is timed again, once a probe recovers, when the median of its host probes (before
    it, after each of its rounds, after it) falls below 80% of the run's median at its thread
    count, or when the VM's host stole more than 5% of its threads' time; a timing on a quiet
    host stands, else the one with the higher median probe. A host that stays busy gives up
    after the wait, and the report names that job and counts the re-timed ones."""
    monkeypatch.setenv("TECPP_BENCH_SYSTEM_MALLOC", "1")  # importing suite: no re-exec
    sys.path.insert(0, BENCH)
    import common
    import report
    import suite

    probes = iter([30.0, 31.0, 30.0,  # the start: median 30
                   # job 1: the probe before it quiet, its rounds and the one after it in a
                   # dip; then the wait's probe, and a quiet second timing
                   30.0, 20.0, 20.0, 20.0, 30.0, 30.0, 28.0, 29.0,
                   30.0, 31.0, 30.0, 30.0, 30.0, 30.0, 30.0, 30.0,  # job 2: quiet probes
                   30.0] + [20.0] * 200)  # job 3: busy in every round, and while waiting
    monkeypatch.setattr(common, "probe_host", lambda threads: next(probes))
    # (wall s, stolen CPU s) at the start and end of each timing: job 2's first timing lost
    # 2 s of its 2 threads' 20 s (10%), its second 0.2 s (1%)
    clock = iter([(0, 0.0), (10, 0.0), (20, 0.0), (30, 0.0), (40, 0.0), (50, 2.0),
                  (60, 2.0), (70, 2.2), (80, 2.2), (90, 2.2), (100, 2.2), (110, 2.2)])
    monkeypatch.setattr(common, "host_times", lambda: next(clock))
    monkeypatch.setattr(suite.time, "sleep", lambda s: None)
    logged = []
    host = suite.QuietHost([2], log=logged.append)
    assert host.reference(2) == 30.0
    timed = []

    def job(case_id):
        def run(after_round):
            timed.append(case_id)
            for _ in range(2):
                after_round()
            return [common.Result("LayerNorm", "bfloat16", "16384x1024", "fwd", 2, p,
                                  float(len(timed)), 1.0, 1.0, 1.0, case_id=case_id)
                    for p in report.PROVIDERS]
        return run

    rows = host.run(2, job("C1")) + host.run(2, job("C2")) + host.run(2, job("C3"))
    assert timed == ["C1", "C1", "C2", "C2", "C3", "C3"]
    assert [s for s in logged if "host busy" in s] == [
        "  host busy: median probe 20.0 GB/s against the run's 30.0; timing the job again "
        "once it recovers",
        "  host busy: 10% of its threads' time stolen by the VM's host; timing the job again "
        "once it recovers",
        "  host busy: median probe 20.0 GB/s against the run's 30.0; timing the job again "
        "once it recovers"]
    by = {r.case_id: r for r in rows if r.provider == "ours"}
    # C1's and C2's second timings stand; C3's first (20), the second no better
    assert (by["C1"].attempts, by["C1"].host_probe_gbps, by["C1"].median_us) == (2, 29.5, 2.0)
    assert (by["C2"].attempts, by["C2"].host_probe_gbps, by["C2"].median_us) == (2, 30.0, 4.0)
    assert by["C2"].host_steal == pytest.approx(0.01)
    assert (by["C1"].host_steal, by["C3"].host_steal) == (0.0, 0.0)
    assert (by["C3"].attempts, by["C3"].host_probe_gbps, by["C3"].median_us) == (2, 20.0, 5.0)
    # the probes repeated while waiting out a dip (C3's twelve 20s) stay out of the median
    assert host.reference(2) == 30.0
    lines = report.host_lines(rows)
    assert lines[0] == ("Host: a 64 MiB copy timed before each job, after each of its rounds "
                        "and after it, the median per job: 2 threads 29.5 GB/s (20.0-30.0); "
                        "CPU time stolen by the VM's host, median 0.0% of a job's thread time, "
                        "at most 1.0% (C2 LayerNorm bfloat16 16384x1024, 2 threads); 3 of 3 "
                        "jobs timed again after their median probe fell below 80% of the run's, "
                        "more than 5% was stolen or their rounds spread 1.5x or more; 1 job ran "
                        "while the host stayed busy: C3 LayerNorm bfloat16 16384x1024, 2 threads "
                        "(68%).")
    assert report.host_lines(rows[:8])[0].endswith(
        "every job's median probe at or above 80% and at most 5% stolen.")
    for r in rows[:4]:  # a job whose kept timing lost 12%
        r.host_steal = 0.12
    assert report.host_lines(rows)[0].endswith(
        "2 jobs ran while the host stayed busy: C1 LayerNorm bfloat16 16384x1024, 2 threads "
        "(12% stolen); C3 LayerNorm bfloat16 16384x1024, 2 threads (68%).")
    # a run that probed only around its jobs (an older CSV: no stolen time)
    for r in rows:
        r.host_steal = float("nan")
    assert report.host_lines(rows)[0] == (
        "Host: a 64 MiB copy timed before and after each job, the lower of the two over the "
        "jobs: 2 threads 29.5 GB/s (20.0-30.0); 3 of 3 jobs timed again after a probe below "
        "80% of the median; 1 job ran while the host's memory stayed busy: C3 LayerNorm "
        "bfloat16 16384x1024, 2 threads (68%).")
    assert report.host_lines([common.Result("x", "float32", "1", "fwd", 1, "ours", 1.0, 1.0,
                                            1.0, 1.0)]) == []


def test_quiet_host_times_a_job_again_whose_rounds_spread(monkeypatch):
    """A job whose rounds spread on a quiet host (one of its rows' providers' p80 round median
    1.5x its p20 or more, SPREAD_WIDE) is timed again once: the steadier timing stands, of two
    spread ones the less spread. Each row records its job's spread; the report counts the jobs
    timed again for it and names a job whose rounds stayed spread."""
    monkeypatch.setenv("TECPP_BENCH_SYSTEM_MALLOC", "1")  # importing suite: no re-exec
    sys.path.insert(0, BENCH)
    import common
    import report
    import suite

    monkeypatch.setattr(common, "probe_host", lambda threads: 30.0)
    monkeypatch.setattr(common, "host_times", lambda: (0, 0.0))
    monkeypatch.setattr(suite.time, "sleep", lambda s: None)
    logged = []
    host = suite.QuietHost([2], log=logged.append)

    def job(case_id, spreads):
        attempt = iter(range(len(spreads)))

        def run(after_round):
            k = next(attempt)
            after_round()
            rows = [common.Result("RMSNorm", "float32", "4096x1024", "fwd", 2, p,
                                  10.0 + k, 1.0, 1.0, 1.0, p20_us=10.0, p80_us=10.0,
                                  case_id=case_id) for p in report.PROVIDERS]
            rows[-1].p80_us = 10.0 * spreads[k]  # one provider's rounds spread
            return rows
        return run

    rows = (host.run(2, job("C1", [2.0, 1.2])) + host.run(2, job("C2", [1.1]))
            + host.run(2, job("C3", [1.8, 1.6])) + host.run(2, job("C4", [1.6, 1.9])))
    assert [s for s in logged if "host busy" in s] == [
        f"  host busy: its rounds spread {s}x (a provider's p80 round median over its p20); "
        "timing the job again once it recovers" for s in ("2.00", "1.80", "1.60")]
    by = {r.case_id: r for r in rows if r.provider == "ours"}
    # (attempts, the kept timing's spread, its median: 10 the first timing, 11 the second)
    assert {c: (r.attempts, r.rounds_spread, r.median_us) for c, r in by.items()} == {
        "C1": (2, 1.2, 11.0), "C2": (1, 1.1, 10.0), "C3": (2, 1.6, 11.0),
        "C4": (2, 1.6, 10.0)}
    assert report.host_lines(rows)[0] == (
        "Host: a 64 MiB copy timed before each job, after each of its rounds and after it, the "
        "median per job: 2 threads 30.0 GB/s (30.0-30.0); CPU time stolen by the VM's host, "
        "median 0.0% of a job's thread time, at most 0.0% (C1 RMSNorm float32 4096x1024, 2 "
        "threads); 3 of 4 jobs timed again after their median probe fell below 80% of the "
        "run's, more than 5% was stolen or their rounds spread 1.5x or more; 2 jobs ran while "
        "the host stayed busy: C3 RMSNorm float32 4096x1024, 2 threads (rounds spread 1.60x); "
        "C4 RMSNorm float32 4096x1024, 2 threads (rounds spread 1.60x).")
    for r in rows:  # a run made before the suite timed a spread job again
        r.rounds_spread = float("nan")
    assert report.host_lines(rows)[0].endswith(
        "3 of 4 jobs timed again after their median probe fell below 80% of the run's or more "
        "than 5% was stolen; every job's median probe at or above 80% and at most 5% stolen.")


def test_run_case_probes_after_each_round_and_host_times_reads_steal(monkeypatch):
    """common.run_case calls its after_round hook once per timing round; host_times reads the
    wall clock and /proc/stat's stolen CPU time, both non-decreasing."""
    monkeypatch.setenv("TECPP_BENCH_SYSTEM_MALLOC", "1")
    sys.path.insert(0, BENCH)
    import common

    calls = []
    common.run_case("x", __import__("torch").float32, "1", "fwd",
                    [common.Provider("ours", lambda: None)], ours="ours", rounds=3, threads=1,
                    min_run_time=1e-3, after_round=lambda: calls.append(1), log=lambda s: None)
    assert len(calls) == 3
    (w0, s0), (w1, s1) = common.host_times(), common.host_times()
    assert w1 >= w0
    if os.path.exists("/proc/stat"):
        assert 0.0 <= s0 <= s1
    assert common.probe_host(1) > 0


def test_timed_counts_each_calls_fresh_pages():
    """common.timed counts the minor page faults of every call the timer made (its block-size
    calibration included): a call that maps and touches 256 fresh pages faults 256 times a
    call, one that writes into memory it already has none."""
    sys.path.insert(0, BENCH)
    import mmap

    import common

    pages = 256

    def fresh():
        m = mmap.mmap(-1, pages * mmap.PAGESIZE)
        m.madvise(mmap.MADV_NOHUGEPAGE)
        for i in range(0, pages * mmap.PAGESIZE, mmap.PAGESIZE):
            m[i] = 1
        m.close()

    kept = bytearray(pages * mmap.PAGESIZE)

    def reuse():
        for i in range(0, len(kept), mmap.PAGESIZE):
            kept[i] = 1

    us, faults = common.timed(fresh, 1, 0.05)
    assert us > 0 and pages <= faults < 1.05 * pages, faults
    assert common.timed(reuse, 1, 0.05)[1] < 1


def test_fault_lines_name_the_rows_that_took_fresh_pages():
    """A row whose calls fault in pages worth 1% of the bytes it moves (or 1 page, without a
    byte count) is named; below that, the line states the most any row faulted."""
    sys.path.insert(0, BENCH)
    import common
    import report

    mib = 2**20
    rows = [common.Result("Bias + ReLU", "float32", "4096x4096", "fwd", 1, p, 1.0, 1.0, 1.0,
                          1.0, bytes_moved=nbytes, case_id="C3", faults_per_call=f)
            for p, f, nbytes in (("torch", 0.0, 128 * mib), ("ours", 16384.0, 128 * mib),
                                 ("ours compiled", 300.0, 128 * mib),
                                 ("torch.compile", 1.0, 0))]
    head = ("Page faults: each timed call's minor page faults counted; {} of 4 rows took fresh "
            "pages worth 1% of the bytes they move a call (without a byte count, 1 page)")
    assert report.fault_lines(rows) == [
        head.format(2) + ": C3 Bias + ReLU fwd float32 4096x4096, 1 thread, ours (16,384 a call, "
        "50.0% of its bytes); C3 Bias + ReLU fwd float32 4096x4096, 1 thread, torch.compile "
        "(1 a call).", ""]
    rows[1].faults_per_call = rows[3].faults_per_call = 0.0
    assert report.fault_lines(rows)[0] == (
        head.format(0) + ". The most: C3 Bias + ReLU fwd float32 4096x4096, 1 thread, ours "
        "compiled (300 a call, 0.9% of its bytes).")
    rows[2].faults_per_call = 0.0
    assert report.fault_lines(rows)[0] == head.format(0) + "."
    assert report.fault_lines([common.Result("x", "float32", "1", "fwd", 1, "ours", 1.0, 1.0,
                                             1.0, 1.0)]) == []


def test_benchmark_allocator_env():
    """The benchmarks re-execute on jemalloc with purging off where it is installed, else on
    glibc with the tunables; once only, and not where the system's defaults are asked for; the
    callgrind worker starts on the same allocator whether or not its parent runs on it."""
    sys.path.insert(0, BENCH)
    import allocator

    je = "libjemalloc.so.2"
    env = allocator.benchmark_allocator_env({"LD_PRELOAD": f"libx.so:{je}", "A": "1"}, je)
    assert env == {"LD_PRELOAD": f"{je}:libx.so", "A": "1",
                   "MALLOC_CONF": allocator.JEMALLOC_CONF, "TECPP_BENCH_ALLOCATOR": "jemalloc"}
    env = allocator.benchmark_allocator_env({}, None)
    assert env == {"GLIBC_TUNABLES": allocator.ALLOCATOR_TUNABLES,
                   "TECPP_BENCH_ALLOCATOR": "glibc"}
    assert allocator.benchmark_allocator_env(env, None) is None
    assert allocator.benchmark_allocator_env({"TECPP_BENCH_SYSTEM_MALLOC": "1"}, je) is None
    # a worker of an already re-executed parent still gets the allocator's settings
    worker = allocator.worker_env({"TECPP_BENCH_ALLOCATOR": "glibc", "B": "2"})
    assert worker["B"] == "2" and worker["TECPP_BENCH_ALLOCATOR"] in ("jemalloc", "glibc")
    assert ("MALLOC_CONF" in worker) == (worker["TECPP_BENCH_ALLOCATOR"] == "jemalloc")
    assert allocator.worker_env({"TECPP_BENCH_SYSTEM_MALLOC": "1"}) == {
        "TECPP_BENCH_SYSTEM_MALLOC": "1"}


# a 64 MiB output freed with a small block allocated after it (as a call's other results are),
# six times: the most pages any call after the first faulted in
_REUSE = """
import resource, torch
faults = []
for i in range(6):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = torch.empty(16 << 20).fill_(1.0)
    pin = torch.empty(256)
    del out
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(max(faults[1:]))
"""


def test_benchmark_allocator_reuses_a_freed_output():
    """On the benchmarks' allocator a freed 64 MiB output is handed back to the next call without
    a page fault (glibc 2.36 with the tunables faults in all 16,384 pages again: its
    posix_memalign, c10's allocator, does not reuse the block; docs/architecture.md)."""
    sys.path.insert(0, BENCH)
    import ctypes.util

    import allocator

    jemalloc = ctypes.util.find_library("jemalloc")
    if not jemalloc:
        pytest.skip(f"{allocator.JEMALLOC} is not installed (Debian: libjemalloc2)")
    environ = {k: v for k, v in os.environ.items()
               if k not in ("TECPP_BENCH_SYSTEM_MALLOC", "TECPP_BENCH_ALLOCATOR")}
    env = allocator.benchmark_allocator_env(environ, jemalloc)
    out = subprocess.run([sys.executable, "-c", _REUSE], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) < 16, out.stdout


def test_outside_gemm_fraction_and_floor_line():
    """The C8 floor: a step that is all GEMM has a small share outside the GEMMs, one with a
    large elementwise tail a large share; the report states ours against plain eager."""
    sys.path.insert(0, BENCH)
    import types

    import torch

    import common
    import report

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    big = torch.randn(4 * 2**20)
    gemm_only, gemm_only_ops = common.outside_gemm_shares(lambda: [a @ b for _ in range(20)])
    mostly_other, other_ops = common.outside_gemm_shares(
        lambda: (a @ b, [big.exp() for _ in range(5)]))
    assert 0 <= gemm_only < mostly_other <= 1 and mostly_other > 0.5
    # the exps are ops: most of the share outside the GEMMs; the GEMM-only step has next to none
    assert gemm_only_ops < 0.05 and 0.5 * mostly_other < other_ops <= mostly_other

    def row(provider, frac):
        return types.SimpleNamespace(case="MLP block", case_id="C8", mode="fwd+bwd",
                                     dtype="float32", shape="4x4x4", threads=2,
                                     provider=provider, ratio_vs_ours=1.0, outside_gemm=frac)
    lines = report.floor_lines([row("torch", 0.031), row("ours", 0.045)])
    assert lines == ["* C8 MLP block fwd+bwd float32 4x4x4: outside the GEMMs ours 4.5% of the "
                     "step, plain eager 3.1% (<= 2%: **missed**)"]
    # with the ops' part, the minimal bytes and the job's copy rate: 30 MB at 10 GB/s is 3 ms,
    # 3% of a 100 ms step, above 2%; 10 MB in a 100 ms step is 1%
    ours, plain = row("ours", 0.045), row("torch", 0.031)
    ours.outside_gemm_ops, plain.outside_gemm_ops = 0.04, 0.025
    ours.outside_gemm_min_bytes, ours.host_probe_gbps, ours.median_us = 30_000_000, 10.0, 1e5
    lines = report.floor_lines([plain, ours])
    assert lines == ["* C8 MLP block fwd+bwd float32 4x4x4: outside the GEMMs ours 4.5% (ops "
                     "4.0%) of the step, plain eager 3.1% (ops 2.5%) (<= 2%: **missed**); the "
                     "least that work moves, "
                     "29 MiB, takes 3.0% of the step at the job's copy rate (10.0 GB/s)",
                     "* on 1 of these rows the minimal bytes alone take more than 2% of the "
                     "step: the target is out of reach while that work runs in passes of its "
                     "own beside the GEMMs"]
    ours.outside_gemm_min_bytes = 10_000_000
    assert report.floor_lines([plain, ours])[0].endswith(
        "takes 1.0% of the step at the job's copy rate (10.0 GB/s)")
    # the heading names the ops' part and the bytes only where the run recorded them
    assert "in brackets" in report._split_note([plain, ours])
    assert "the least that work moves" in report._split_note([plain, ours])
    assert report._split_note([row("torch", 0.031), row("ours", 0.045)]) == ""


def test_mlp_outside_gemm_bytes(monkeypatch):
    """The C8 step's minimal bytes outside the GEMMs, counted by hand at T=4, H=2, F=8 in
    elements. Forward: LayerNorm 4*2 in + out; GELU fc1's 4*8 out in, 4*8 out. Backward: fc2's
    dbias reads dy (4*2); dGELU reads dy and the fc1 output, writes dx (3*4*8); LayerNorm reads
    dy and x, writes dx (3*4*2); with the residual, its grad read (4*2). SwiGLU's fc1 output is
    4*16: its forward reads it (64) and writes 32, its backward reads dy (32) and it (64),
    writes 64."""
    monkeypatch.setenv("TECPP_BENCH_SYSTEM_MALLOC", "1")  # importing suite: no re-exec
    sys.path.insert(0, BENCH)
    import suite

    fwd = 16 + 64
    plain_bwd = 8 + 96 + 24
    assert suite.mlp_case(4, 2, 8, "plain").outside_gemm_bytes("fwd", 2) == 2 * fwd
    assert suite.mlp_case(4, 2, 8, "plain").outside_gemm_bytes("fwd+bwd", 2) == 2 * (
        fwd + plain_bwd)
    assert suite.mlp_case(4, 2, 8, "residual").outside_gemm_bytes("fwd+bwd", 4) == 4 * (
        fwd + plain_bwd + 8)
    assert suite.mlp_case(4, 2, 8, "swiglu").outside_gemm_bytes("fwd+bwd", 2) == 2 * (
        16 + 96 + 8 + 160 + 24 + 8)


def test_step_spread_lines():
    """The floor of "MLP block: ours compiled >= ours eager": each missed row with the range of
    its rounds (ours eager / ours compiled per round: the inverse of ours compiled's ratios to
    ours), flagged where every round is below 1, and torch.compile's wrapper (the most any
    memory-bound row of the run measured) as a share of the missed steps."""
    sys.path.insert(0, BENCH)
    import types

    import report

    def row(case_id, mode, shape, provider, ratio, lo, hi, median_us, wrapper=float("nan")):
        return types.SimpleNamespace(case="MLP block", case_id=case_id, mode=mode,
                                     dtype="float32", shape=shape, threads=2,
                                     provider=provider, ratio_vs_ours=ratio, ratio_min=lo,
                                     ratio_max=hi, median_us=median_us,
                                     compile_wrapper_us=wrapper)

    results = [
        # missed, its rounds on both sides of 1: 1 / 1.25 = 0.80 to 1 / 0.8 = 1.25
        row("C8", "fwd+bwd", "8x8x8", "ours", 1.0, 1.0, 1.0, 400_000.0),
        row("C8", "fwd+bwd", "8x8x8", "ours compiled", 1.02, 0.8, 1.25, 408_000.0),
        # missed in every round
        row("C8", "fwd+bwd", "16x8x8", "ours", 1.0, 1.0, 1.0, 800_000.0),
        row("C8", "fwd+bwd", "16x8x8", "ours compiled", 1.04, 1.02, 1.05, 832_000.0),
        # met: no line
        row("C8", "fwd+bwd", "32x8x8", "ours", 1.0, 1.0, 1.0, 800_000.0),
        row("C8", "fwd+bwd", "32x8x8", "ours compiled", 0.98, 0.9, 1.1, 784_000.0),
        # the forward alone is not this target's; the memory-bound row gives the wrapper
        row("C8", "fwd", "8x8x8", "ours compiled", 1.5, 1.4, 1.6, 1.0),
        row("C1", "fwd", "8x8", "ours", 1.0, 1.0, 1.0, 500.0, wrapper=200.0),
        row("C1", "fwd", "16x8", "ours", 1.0, 1.0, 1.0, 500.0, wrapper=400.0),
    ]
    assert report.step_spread_lines(results) == [
        "* C8 MLP block fwd+bwd float32 8x8x8, 2 threads: 0.98x, its rounds 0.80-1.25x",
        "* C8 MLP block fwd+bwd float32 16x8x8, 2 threads: 0.96x, its rounds 0.95-0.98x "
        "(every round below 1.00x)",
        "* on 1 of the 2 missed rows the rounds run on both sides of 1.00x: the median's "
        "shortfall is within the run's round-to-round spread",
        "* torch.compile's wrapper, at most 400 µs on this run's memory-bound rows, is at most "
        "0.10% of these steps (400-800 ms)",
    ]
    assert report.step_spread_lines(results[4:]) == []


def test_eager_floor_lines():
    """The floor of "ours eager >= plain eager": each memory-bound row where plain eager is
    faster, with the range of its rounds (plain's time over ours' per round) and both
    providers' share of the copy's bandwidth; a met row, and a GEMM-bound one, get no line."""
    sys.path.insert(0, BENCH)
    import types

    import report

    def row(case_id, shape, provider, ratio, lo, hi, copy):
        return types.SimpleNamespace(case="LayerNorm", case_id=case_id, mode="fwd",
                                     dtype="float32", shape=shape, threads=1,
                                     provider=provider, ratio_vs_ours=ratio, ratio_min=lo,
                                     ratio_max=hi, copy_efficiency=copy)

    results = [
        row("C1", "8x8", "ours", 1.0, 1.0, 1.0, 0.65),  # missed in every round
        row("C1", "8x8", "torch", 0.89, 0.85, 0.96, 0.73),
        row("C1", "16x8", "ours", 1.0, 1.0, 1.0, 0.9),  # missed, rounds on both sides
        row("C1", "16x8", "torch", 0.98, 0.9, 1.05, 0.91),
        row("C1", "32x8", "ours", 1.0, 1.0, 1.0, 0.9),  # met
        row("C1", "32x8", "torch", 1.2, 1.1, 1.3, 0.75),
        row("C8", "8x8x8", "ours", 1.0, 1.0, 1.0, 0.0),  # not memory-bound
        row("C8", "8x8x8", "torch", 0.9, 0.8, 1.0, 0.0),
    ]
    assert report.eager_floor_lines(results) == [
        "* C1 LayerNorm fwd float32 8x8, 1 thread: 0.89x, its rounds 0.85-0.96x (every round "
        "below 1.00x); ours at 65% of copy, plain eager at 73%",
        "* C1 LayerNorm fwd float32 16x8, 1 thread: 0.98x, its rounds 0.90-1.05x; ours at 90% "
        "of copy, plain eager at 91%",
        "* on 1 of the 2 missed rows the rounds run on both sides of 1.00x: the median's "
        "shortfall is within the run's round-to-round spread",
    ]
    assert report.eager_floor_lines(results[4:]) == []


def test_host_profile_and_compile_floor_lines():
    """Target 1's floor: host_profile finds torch.compile's wrapper events around a compiled
    call and none around an eager one; cold_call_us times each call after the sweep, in turns;
    the report turns each row's eager host cost and the plain model's wrapper into the best
    ratio a compiled call can reach, counts the misses where that bound is below 1, and states
    ours compiled's own excess over the plain model's."""
    sys.path.insert(0, BENCH)
    import types

    import torch

    import common
    import report

    x = torch.randn(64, 64, requires_grad=True)
    lin = torch.nn.Linear(64, 64)
    compiled = torch.compile(lin, fullgraph=True)
    compiled(x)
    eager = common.host_profile(lambda: lin(x), 5)
    prof = common.host_profile(lambda: compiled(x), 5)
    assert eager["wrapper"] == 0 and eager["kernels"] > 0 and eager["call"] > eager["kernels"]
    assert prof["wrapper"] > 0 and any(k.startswith("TorchDynamo Cache Lookup")
                                       for k in prof["events"])

    order = []
    slow = common.cold_call_us(lambda: order.append("s"),
                               [lambda: order.append("a"), lambda: time.sleep(2e-3)], 4, 2)
    # per block: a run of (sweep, fn) pairs per fn, one more than timed
    assert order == (["s", "a"] * 3 + ["s"] * 3) * 2
    assert len(slow) == 2 and slow[1] > 1500 > slow[0] > 0

    def rows(shape, eager_us, compiled_ratio, host, wrapper, compiled_host):
        def row(provider, ratio):
            return types.SimpleNamespace(case="LayerNorm", case_id="C1", mode="fwd",
                                         dtype="float32", shape=shape, threads=2,
                                         provider=provider, ratio_vs_ours=ratio,
                                         median_us=eager_us, eager_host_us=host,
                                         compile_wrapper_us=wrapper,
                                         compiled_host_us=compiled_host)
        return [row("ours", 1.0), row("ours compiled", compiled_ratio)]

    # 100 µs eager with 20 µs host; a 50 µs wrapper bounds compiled at 100 / 130 = 0.77x, and
    # it reaches 1 / 1.4 = 0.71x; a 10 µs wrapper bounds it at 1.11x, and it reaches 0.91x
    lines = report.compile_floor_lines(rows("8x8", 100.0, 1.4, 20.0, 50.0, 56.0)
                                       + rows("16x8", 100.0, 1.1, 20.0, 10.0, 30.0))
    assert lines[0] == ("* an 8-row call right after the row's own call: the plain model "
                        "compiled (torch.compile's wrapper) 10-50 µs, ours eager (our whole "
                        "host path) 20-20 µs; the wrapper costs more on 1 of the 2 rows")
    assert "below 1.00x on 1 of the 2 missed rows" in lines[1]
    assert "the bound minus ours compiled's ratio: median 0.05, from 0.05 to 0.05" in lines[2]
    assert "worst 0.91x against a bound of 1.11x (C1 LayerNorm fwd float32 16x8" in lines[3]
    assert lines[4].endswith("median 20 µs, from 6 to 20 µs")


def test_host_floor_lines():
    """Target 2's floor: the C9 step's instructions split into the op calls and the rest, ours
    against plain, and the compiled step's guards; nothing without the callgrind rows."""
    sys.path.insert(0, BENCH)
    import report

    counts = {"Sequential fwd: op calls only": (579_000, 586_000),
              "Sequential fwd": (807_000, 716_000),
              "Sequential fwd (no_grad)": (745_000, 696_000),
              "Sequential compiled fwd": (1_063_000, 957_000),
              "Sequential compiled fwd (guards skipped)": (1_003_000, 940_000)}
    rows = [{"case": case, "provider": provider, "instructions_per_call": n}
            for case, pair in counts.items() for provider, n in zip(("ours", "plain"), pair)]
    lines = report.host_floor_lines(rows)
    assert lines[0].endswith("ours 579K, plain 586K instructions per forward")
    assert "ours 807K, plain 716K; outside the op calls ours 228K" in lines[1]
    assert "plain 130K (nn.Sequential" in lines[1]
    assert lines[2] == "* under no_grad: ours 745K, plain 696K"
    assert lines[3].endswith("of which Dynamo's guards ours 60K, plain 17K")
    assert report.host_floor_lines([]) == []


def _verdict_rows(ours_vs_torch):
    sys.path.insert(0, BENCH)
    import common
    return [common.Result("LayerNorm", "float32", "4x4", "fwd", 2, p, 10.0, r, r, r,
                          bytes_moved=0, case_id="C1", target_vs_eager=1.0)
            for p, r in (("torch", ours_vs_torch), ("ours", 1.0))]


def test_collected_report_keeps_a_section_per_cpu_model(tmp_path):
    """A collected report keeps the latest run of each CPU model: a run replaces its own
    model's section (machines/<model>/) and leaves the others, and the verdict table has a
    column per model."""
    sys.path.insert(0, BENCH)
    import report

    amd = ("torch 2.13.0+cpu, python 3.11.7, AMD EPYC (avx2 avx512f), 2 cpus, ATen parallel "
           "backend OpenMP")
    intel = ("torch 2.13.0+cpu, python 3.11.7, Intel(R) Xeon(R) Processor (avx2 avx512f "
             "amx_bf16), 2 cpus, ATen parallel backend OpenMP")
    assert (report.machine_name(amd), report.machine_name(intel)) == ("AMD EPYC", "Intel Xeon")
    readme = tmp_path / "README.md"
    csv_path = tmp_path / "suite.csv"
    csv_path.write_text("# a run\n")
    label = "ours eager >= plain eager, memory-bound cases"
    report.render_collected(_verdict_rows(1.3), amd, str(readme), quick=False)
    report.render_collected(_verdict_rows(0.9), intel, str(readme), quick=False,
                            csvs=[str(csv_path)])
    text = readme.read_text()
    assert (tmp_path / "machines" / "intel-xeon" / "suite.csv").read_text() == "# a run\n"
    row = next(ln for ln in text.split("\n") if ln.startswith(f"| {label} |"))
    assert row.endswith("| met (lowest 1.30x) | **missed** 1 of 1 (worst 0.90x) |")
    assert text.index("## AMD EPYC") < text.index("## Intel Xeon")
    assert "\n### Verdicts (issue 18's targets)\n" in text and "\n## 2 threads" not in text
    # the Intel model's next run replaces its section only
    report.render_collected(_verdict_rows(1.1), intel, str(readme), quick=False)
    text = readme.read_text()
    row = next(ln for ln in text.split("\n") if ln.startswith(f"| {label} |"))
    assert row.endswith("| met (lowest 1.30x) | met (lowest 1.10x) |")
    assert text.count("### 2 threads") == 2
    assert text == report.assemble(str(tmp_path))


def test_a_cpu_without_avx512_has_its_own_section():
    """The kernels (te_cpp's and ATen's) are built for the widest vector ISA the CPU has, so a
    model's VMs without AVX-512 (an AMD EPYC whose hypervisor hides it) keep a section of their
    own rather than replacing the AVX-512 one; env lines without a flags list (older runs) keep
    the model's name."""
    sys.path.insert(0, BENCH)
    import report

    env = ("torch 2.13.0+cpu, python 3.11.7, AMD EPYC ({}), 2 cpus, ATen parallel backend "
           "OpenMP, te_cpp kernels {}")
    names = [report.machine_name(env.format(f, k)) for f, k in
             (("avx2 avx512f avx512_bf16", "AVX512"), ("avx2", "AVX2"), ("", "DEFAULT"))]
    assert names == ["AMD EPYC", "AMD EPYC (AVX2)", "AMD EPYC (no AVX2)"]
    assert report.machine_slug(names[1]) == "amd-epyc-avx2"
    assert report.machine_name("torch 2.1.0, python 3.11.7, AMD EPYC, 2 cpus") == "AMD EPYC"


def test_committed_report_is_assembled_from_its_sections():
    """bench/README.md is exactly what bench/report.py assembles from bench/machines/ (no hand
    edits), and every section's plot is there."""
    sys.path.insert(0, BENCH)
    import report

    with open(COMMITTED) as f:
        assert f.read() == report.assemble(BENCH)
    for slug in os.listdir(os.path.join(BENCH, report.MACHINES)):
        assert os.path.exists(os.path.join(BENCH, report.MACHINES, slug, "ratios.png"))


# bench/kernel_ab.py at 64 rows, one round of one call per setting, in a subprocess (importing
# bench/suite.py re-executes the process unless TECPP_BENCH_SYSTEM_MALLOC is set); then the
# settings the run leaves behind, which must be the process defaults again
_KERNEL_AB = """
import json, sys
sys.path.insert(0, "bench")
import kernel_ab
from transformer_engine_cpp import _C
default = (_C.stream_store_min_bytes(), _C.activation_lookup_use())
rows = kernel_ab.run(sys.argv[1], sys.argv[2:], 1, 1, 1, True, log=lambda line: None)
print(json.dumps({"rows": rows, "default": default,
                  "after": (_C.stream_store_min_bytes(), _C.activation_lookup_use())}))
"""


@pytest.mark.parametrize("switch,dtypes,kernels", [
    ("stream", ["float32", "float64"], 6), ("lookup", ["bfloat16", "float16"], 2)])
def test_kernel_ab_times_each_kernel_both_ways_and_restores_the_setting(switch, dtypes, kernels):
    """Each of the switch's kernels, forward and backward, per dtype: a time with the setting
    off and on and their ratio; the process's setting is its default afterwards."""
    env = dict(os.environ, TECPP_BENCH_SYSTEM_MALLOC="1")
    out = subprocess.run([sys.executable, "-c", _KERNEL_AB, switch, *dtypes], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    res = json.loads(out.strip().splitlines()[-1])
    rows = res["rows"]
    assert len(rows) == kernels * 2 * len(dtypes)
    assert {(r["dtype"], r["mode"]) for r in rows} == {(d, m) for d in dtypes
                                                      for m in ("fwd", "bwd")}
    assert all(r["off_us"] > 0 and r["on_us"] > 0 and r["lo"] <= r["speedup"] <= r["hi"]
               and r["shape"].startswith("64x") for r in rows)
    assert res["after"] == res["default"]


def test_kernel_ab_refuses_a_dtype_its_switch_does_not_concern():
    env = dict(os.environ, TECPP_BENCH_SYSTEM_MALLOC="1")
    p = subprocess.run([sys.executable, os.path.join(BENCH, "kernel_ab.py"), "--switch",
                        "stream", "--dtypes", "bfloat16", "--quick"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert p.returncode != 0
    assert "--switch stream concerns float32, float64 outputs, not bfloat16" in p.stderr


def test_a_run_leaves_out_the_gemm_bound_cases_in_a_dtype_aten_multiplies_slowly(monkeypatch):
    """Where te_cpp runs a 16-bit dtype's GEMMs in fp32 (ATen's own GEMM in it is a scalar loop
    on the CPU), the run leaves the GEMM-bound cases out in that dtype, and the report says so;
    the memory-bound cases run as ever. The 1-thread table leaves the GEMM-bound cases out
    beside other thread counts."""
    monkeypatch.setenv("TECPP_BENCH_SYSTEM_MALLOC", "1")  # importing suite: no re-exec
    sys.path.insert(0, BENCH)
    import common
    import report
    import suite
    import torch

    cases = suite.all_cases(full=True, quick=False)
    ln, c8 = (next(c for c in cases if c.id == i and c.dtypes is None) for i in ("C1", "C8"))
    assert not suite.is_gemm_bound(ln) and suite.is_gemm_bound(c8)
    f32, bf16 = torch.float32, torch.bfloat16
    jobs = suite.job_list([2, 1], [ln, c8], [f32, bf16], [bf16])
    assert [(t, c.id, d) for t, c, d in jobs] == [
        (2, "C1", f32), (2, "C1", bf16), (2, "C8", f32), (1, "C1", f32), (1, "C1", bf16)]
    assert len(suite.job_list([1], [c8], [f32, bf16])) == 2
    flags = ("torch 2.13.0+cpu, python 3.11.7, AMD EPYC (avx2), 2 cpus, ATen parallel backend "
             "OpenMP, te_cpp kernels AVX2 (activation tables read in bf16 backwards{}), glibc")
    env = flags.format("; bf16 and fp16 GEMMs as fp32 GEMMs")
    mm = lambda dtype: common.Result("MLP block", dtype, "4096x1024x4096", "fwd", 2,  # noqa: E731
                                     "torch.mm", 1.0, 1.0, 1.0, 1.0, case_id="C8")
    lines = report.slow_gemm_lines([mm("float32")], env)
    assert len(lines) == 4 and lines[0].startswith(
        "Not run in bfloat16: the GEMM-bound cases (C8). ATen's bfloat16 GEMM on this CPU is a "
        "scalar loop")
    assert "`python bench/suite.py --cases C8 --dtypes float16` times them." in lines[2]
    assert report.slow_gemm_lines([mm("float32"), mm("bfloat16"), mm("float16")], env) == []
    assert report.slow_gemm_lines([mm("float32")], flags.format("")) == []
    assert report.machine_name(env) == "AMD EPYC (AVX2)"
