"""Instruction counts (valgrind callgrind) of the host path at a tiny shape, ours against plain
PyTorch: each te_cpp custom op called directly against its ATen counterpart, each te.ops basic
op's module call against the plain nn module, and a whole Sequential step (LayerNorm, Linear,
GELU, Linear) against plain nn.Sequential, forward and forward+backward.

Instruction counts are deterministic where wall-clock times on a shared 2-core machine are not:
they measure the host (dispatch, Python) cost that dominates at 8 tokens.

    python bench/callgrind.py [--quick] [--compile] [--out bench/out/callgrind]

Method: ONE process runs under ``valgrind --tool=callgrind --instr-atstart=no
--collect-atstart=no`` (torch.utils.benchmark's Timer.collect_callgrind starts one valgrind
process per statement, each importing torch instrumented: minutes each here). The worker imports
everything uninstrumented, switches instrumentation on with ``callgrind_control -i on``, then per
case warms the statement up, and collects ``number`` calls between torch's
``_valgrind_toggle()`` and ``_valgrind_toggle_and_dump_stats()`` (the same bindings Timer uses);
each dump's total, minus an empty loop's, divided by ``number`` is the count per call. Threads:
1 (``torch.set_num_threads(1)``, OMP_NUM_THREADS=1).

``run(quick) -> list[dict]`` is the entry point for other benchmark runners; it returns [] (and
says why) when valgrind is not installed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import allocator  # torch-free, beside this file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
T, H = 8, 256
# valgrind 3.19 cannot execute AVX-512: when the in-place extension is built for AVX-512, the
# worker loads a copy built for AVX2 from here (the ISA ATen itself picks under valgrind)
VALGRIND_BUILD = os.path.join(ROOT, "build", "valgrind_avx2")
_EXT_ENV = "TECPP_CALLGRIND_EXTENSION"


# ---- the cases (built inside the valgrind worker) --------------------------------------------

def _cases(include_compile: bool):
    """[(group, name, provider, fn)]: fn() is one call. Ours and plain for one row share a
    name; providers are "ours" / "plain" (and "ours .default" for the overload-resolution row)."""
    import torch
    import torch.nn.functional as F

    import transformer_engine_cpp as te

    torch.manual_seed(0)
    ops, aten = torch.ops.te_cpp, torch.ops.aten
    x = torch.randn(T, H)
    dy = torch.randn(T, H)
    w = torch.randn(H, H)
    g, b = torch.ones(H), torch.zeros(H)
    y, mean, rstd = ops.layernorm_fwd(x, g, b, 1e-5, False)
    _, amean, arstd = aten.native_layer_norm(x, [H], g, b, 1e-5)
    cases = []

    def op(name, ours, plain):
        cases.append(("op", name, "ours", ours))
        cases.append(("op", name, "plain", plain))

    # the packet call (OpOverloadPacket -> OpOverload resolution) against the cached overload
    gelu_default = ops.gelu_fwd.default
    cases.append(("op", "gelu_fwd (packet vs .default)", "ours", lambda: ops.gelu_fwd(x)))
    cases.append(("op", "gelu_fwd (packet vs .default)", "ours .default",
                  lambda: gelu_default(x)))
    op("layernorm_fwd | aten.native_layer_norm",
       lambda: ops.layernorm_fwd.default(x, g, b, 1e-5, False),
       lambda: aten.native_layer_norm.default(x, [H], g, b, 1e-5))
    op("layernorm_bwd | aten.native_layer_norm_backward",
       lambda: ops.layernorm_bwd.default(dy, x, mean, rstd, g, False),
       lambda: aten.native_layer_norm_backward.default(dy, x, [H], amean, arstd, g, b,
                                                       [True, True, True]))
    op("rmsnorm_fwd | F.rms_norm", lambda: ops.rmsnorm_fwd.default(x, g, 1e-5, False),
       lambda: F.rms_norm(x, [H], g, 1e-5))
    op("linear_fwd | F.linear", lambda: ops.linear_fwd.default(x, w),
       lambda: F.linear(x, w))
    op("linear_fwd+bias | F.linear+bias", lambda: ops.linear_fwd.default(x, w, b),
       lambda: F.linear(x, w, b))
    op("linear_bias_act_fwd(gelu) | gelu(F.linear+bias)",
       lambda: ops.linear_bias_act_fwd.default(x, w, b, "gelu"),
       lambda: F.gelu(F.linear(x, w, b), approximate="tanh"))
    op("linear_dgrad | mm", lambda: ops.linear_dgrad.default(dy, w, 1.0),
       lambda: torch.mm(dy, w))
    op("linear_wgrad | mm(dy.t(), x)", lambda: ops.linear_wgrad.default(dy, x, 1.0),
       lambda: torch.mm(dy.t(), x))
    op("linear_bwd(+dbias) | mm, mm(dy.t(), x), sum(0)",
       lambda: ops.linear_bwd.default(dy, x, w, 1.0, torch.float32),
       lambda: (torch.mm(dy, w), torch.mm(dy.t(), x), dy.sum(0)))
    op("gelu_fwd | F.gelu(tanh)", lambda: gelu_default(x),
       lambda: F.gelu(x, approximate="tanh"))
    op("gelu_bwd | aten.gelu_backward", lambda: ops.gelu_bwd.default(dy, x),
       lambda: aten.gelu_backward.default(dy, x, approximate="tanh"))
    op("bias_fwd | add", lambda: ops.bias_fwd.default(x, b), lambda: torch.add(x, b))
    op("bias_bwd | sum(0)", lambda: ops.bias_bwd.default(dy, torch.float32),
       lambda: dy.sum(0))

    class PlainBias(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.zeros(H))

        def forward(self, inp):
            return inp + self.bias

    modules = [
        ("LayerNorm", te.ops.LayerNorm(H), torch.nn.LayerNorm(H)),
        ("RMSNorm", te.ops.RMSNorm(H), torch.nn.RMSNorm(H)),
        ("Linear", te.ops.Linear(H, H), torch.nn.Linear(H, H)),
        ("BasicLinear", te.ops.BasicLinear(H, H), torch.nn.Linear(H, H, bias=False)),
        ("Bias", te.ops.Bias(H), PlainBias()),
        ("GELU", te.ops.GELU(), torch.nn.GELU(approximate="tanh")),
    ]
    xg = x.clone().requires_grad_(True)

    def fwd(m):
        return lambda: m(x)

    def fwd_bwd(m):
        return lambda: torch.autograd.backward(m(xg), dy)

    for name, ours_m, plain_m in modules:
        for mode, make in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
            cases.append(("module", f"{name} {mode}", "ours", make(ours_m)))
            cases.append(("module", f"{name} {mode}", "plain", make(plain_m)))

    ours_seq, plain_seq = _sequentials(te, torch)

    def no_grad(m):
        def f():
            with torch.no_grad():
                return m(x)
        return f

    # the forward's op calls alone (no module, no fuser, no autograd): the floor each side's
    # host path adds to
    # (parameters fetched here: the modules' attribute access is not what is measured)
    ow = [t.detach() for t in (ours_seq[0].weight, ours_seq[0].bias, ours_seq[1].weight,
                               ours_seq[1].bias, ours_seq[3].weight, ours_seq[3].bias)]
    pw = [t.detach() for t in (plain_seq[0].weight, plain_seq[0].bias, plain_seq[1].weight,
                               plain_seq[1].bias, plain_seq[3].weight, plain_seq[3].bias)]
    act_fwd = ops.linear_bias_act_fwd.default
    ln_fwd, lin_fwd = ops.layernorm_fwd.default, ops.linear_fwd.default

    def ours_ops():
        h = ln_fwd(x, ow[0], ow[1], 1e-5, False)[0]
        h = act_fwd(h, ow[2], ow[3], "gelu")[0]
        return lin_fwd(h, ow[4], ow[5])

    def plain_ops():
        h = F.layer_norm(x, [H], pw[0], pw[1], 1e-5)
        h = F.gelu(F.linear(h, pw[2], pw[3]), approximate="tanh")
        return F.linear(h, pw[4], pw[5])

    cases.append(("step", "Sequential fwd: op calls only", "ours", ours_ops))
    cases.append(("step", "Sequential fwd: op calls only", "plain", plain_ops))
    steps = [("fwd", fwd), ("fwd (no_grad)", no_grad), ("fwd+bwd", fwd_bwd)]
    for mode, make in steps:
        cases.append(("step", f"Sequential {mode}", "ours", make(ours_seq)))
        cases.append(("step", f"Sequential {mode}", "plain", make(plain_seq)))
    if include_compile:
        ours_c = torch.compile(ours_seq, fullgraph=True)
        plain_c = torch.compile(plain_seq, fullgraph=True)
        for mode, make in steps:
            if mode == "fwd (no_grad)":
                continue
            cases.append(("step", f"Sequential compiled {mode}", "ours", make(ours_c)))
            cases.append(("step", f"Sequential compiled {mode}", "plain", make(plain_c)))
        # the same calls with Dynamo's guards skipped: the difference is what evaluating the
        # guards costs per call
        for provider, model in (("ours", ours_c), ("plain", plain_c)):
            fn = fwd(model)
            fn.skip_guards = True
            cases.append(("step", "Sequential compiled fwd (guards skipped)", provider, fn))
        # the floor a compiled call stands on, against the eager rows above ("op" and "module
        # LayerNorm fwd"): the LayerNorm op compiled alone (a function calling it, no module
        # and no fuser), and the LayerNorm module compiled
        ours_ln = torch.compile(lambda t: ops.layernorm_fwd.default(t, g, b, 1e-5, False),
                                fullgraph=True)
        plain_ln = torch.compile(lambda t: F.layer_norm(t, [H], g, b, 1e-5), fullgraph=True)
        cases.append(("floor", "layernorm op compiled alone", "ours", lambda: ours_ln(x)))
        cases.append(("floor", "layernorm op compiled alone", "plain", lambda: plain_ln(x)))
        ours_m = torch.compile(te.ops.Sequential(te.ops.LayerNorm(H)), fullgraph=True)
        plain_m = torch.compile(torch.nn.LayerNorm(H), fullgraph=True)
        cases.append(("floor", "LayerNorm module compiled fwd", "ours", fwd(ours_m)))
        cases.append(("floor", "LayerNorm module compiled fwd", "plain", fwd(plain_m)))
    return cases


def _sequentials(te, torch):
    """The suite's C9 host-overhead pair: LayerNorm, Linear, GELU(tanh), Linear."""
    ours = te.ops.Sequential(te.ops.LayerNorm(H), te.ops.Linear(H, H), te.ops.GELU(),
                             te.ops.Linear(H, H))
    plain = torch.nn.Sequential(torch.nn.LayerNorm(H), torch.nn.Linear(H, H),
                                torch.nn.GELU(approximate="tanh"), torch.nn.Linear(H, H))
    return ours, plain


def step_cases():
    """The two Sequential forward+backward steps only (for the test's instruction-count gate)."""
    import torch

    import transformer_engine_cpp as te

    torch.manual_seed(0)
    ours, plain = _sequentials(te, torch)
    x = torch.randn(T, H, requires_grad=True)
    dy = torch.randn(T, H)
    return [("step", "Sequential fwd+bwd", "ours",
             lambda: torch.autograd.backward(ours(x), dy)),
            ("step", "Sequential fwd+bwd", "plain",
             lambda: torch.autograd.backward(plain(x), dy))]


# ---- the worker (runs under valgrind) --------------------------------------------------------

def _load_extension() -> None:
    """Load the extension the driver chose (an AVX2 build) as transformer_engine_cpp._C before
    the package imports it."""
    path = os.environ.get(_EXT_ENV)
    if not path:
        return
    import importlib.util

    import torch  # noqa: F401  (libtorch before the extension)

    spec = importlib.util.spec_from_file_location("transformer_engine_cpp._C", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["transformer_engine_cpp._C"] = module


def _worker(out_dir: str, number: int, include_compile: bool, only_steps: bool) -> None:
    _load_extension()
    import torch

    torch.set_num_threads(1)
    if include_compile:
        # inductor compiles with -march=native, whose AVX-512 code valgrind cannot run
        import torch._inductor.config as inductor_config

        inductor_config.cpp.march = "x86-64-v3"
    cases = step_cases() if only_steps else _cases(include_compile)
    groups = os.environ.get("TECPP_CALLGRIND_GROUPS")  # e.g. "step": only those rows
    if groups:
        cases = [c for c in cases if c[0] in groups.split(",")]
    for _, _, _, fn in cases:  # warm-up, uninstrumented (plans, lazy inits, compiles)
        for _ in range(3):
            fn()
    pid = os.getpid()
    subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    names = []

    def measure(fn):
        skip = getattr(fn, "skip_guards", False)
        if skip:
            torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
        for _ in range(2):  # re-warm under instrumentation (translation, caches)
            fn()
        torch._C._valgrind_toggle()
        for _ in range(number):
            fn()
        torch._C._valgrind_toggle_and_dump_stats()
        if skip:
            torch.compiler.set_stance("default")

    def empty():
        return None

    measure(empty)
    names.append(("baseline", "empty call", "-"))
    for group, name, provider, fn in cases:
        measure(fn)
        names.append((group, name, provider))
    with open(os.path.join(out_dir, "cases.json"), "w") as f:
        json.dump(names, f)


# ---- the driver ------------------------------------------------------------------------------

def valgrind_available() -> bool:
    return shutil.which("valgrind") is not None and shutil.which("callgrind_control") is not None


def _csrc_mtime() -> float:
    newest = 0.0
    for d, _, files in os.walk(os.path.join(ROOT, "csrc")):
        for f in files:
            newest = max(newest, os.path.getmtime(os.path.join(d, f)))
    return newest


def valgrind_extension(build: bool) -> tuple:
    """(path or None, reason): the extension the worker loads. The in-place build unless it
    uses AVX-512 (valgrind cannot run it); then the AVX2 build under build/valgrind_avx2,
    (re)built here when ``build`` (ninja: quick when up to date), else used only if it is
    newer than every csrc/ file."""
    import transformer_engine_cpp._C as C

    if C.cpu_capability().upper() != "AVX512":
        return "", ""
    def find():
        d = os.path.join(VALGRIND_BUILD, "transformer_engine_cpp")
        found = [os.path.join(d, f) for f in os.listdir(d)
                 if f.startswith("_C") and f.endswith(".so")] if os.path.isdir(d) else []
        return found[0] if found else None
    if build:
        print("callgrind: building the AVX2 copy of the extension for valgrind "
              f"({VALGRIND_BUILD}) ...", flush=True)
        env = dict(os.environ, TECPP_CPU_CAPABILITY="AVX2")
        env.setdefault("MAX_JOBS", "2")
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib",
                        VALGRIND_BUILD, "--build-temp", VALGRIND_BUILD + "_tmp"],
                       cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        return find(), ""
    path = find()
    if path is None:
        return None, f"no AVX2 build in {VALGRIND_BUILD} (python bench/callgrind.py makes it)"
    if os.path.getmtime(path) < _csrc_mtime():
        return None, f"the AVX2 build in {VALGRIND_BUILD} is older than csrc/"
    return path, ""


def _total(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def collect(number: int, *, include_compile: bool = False, only_steps: bool = False,
            timeout: float = 900, extension: str = "", keep_dumps: str = "") -> list[dict]:
    """Runs the worker under callgrind; returns one dict per case with instructions per call
    (empty-call baseline subtracted). ``extension``: the _C build to load ("" = in place);
    ``keep_dumps``: a folder that receives each case's raw dump, named after the case, for
    ``callgrind_annotate --inclusive=yes``."""
    import torch

    out_dir = tempfile.mkdtemp(prefix="te_callgrind_")
    try:
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                    else "")
        env["OMP_NUM_THREADS"] = "1"
        if extension:
            env[_EXT_ENV] = extension
        env = allocator.worker_env(env)  # the suite's allocator, however this was started
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
               f"--callgrind-out-file={os.path.join(out_dir, 'callgrind.out')}",
               sys.executable, os.path.abspath(__file__), "--worker", out_dir,
               "--number", str(number)]
        if include_compile:
            cmd.append("--compile")
        if only_steps:
            cmd.append("--only-steps")
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
        if proc.returncode != 0 or not os.path.exists(os.path.join(out_dir, "cases.json")):
            raise RuntimeError(f"callgrind worker failed (rc {proc.returncode}):\n"
                               f"{proc.stdout[-4000:]}")
        with open(os.path.join(out_dir, "cases.json")) as f:
            names = json.load(f)
        dumps = sorted((p for p in os.listdir(out_dir) if re.fullmatch(r"callgrind\.out\.\d+", p)),
                       key=lambda p: int(p.rsplit(".", 1)[1]))
        if len(dumps) != len(names):
            raise RuntimeError(f"expected {len(names)} callgrind dumps, found {len(dumps)}")
        totals = [_total(os.path.join(out_dir, p)) for p in dumps]
        if keep_dumps:
            os.makedirs(keep_dumps, exist_ok=True)
            for i, (p, (group, name, provider)) in enumerate(zip(dumps, names)):
                slug = re.sub(r"[^A-Za-z0-9]+", "_", f"{group} {name} {provider}").strip("_")
                shutil.copy(os.path.join(out_dir, p),
                            os.path.join(keep_dumps, f"{i:02d}_{slug}.callgrind"))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    base = totals[0] / number
    rows = []
    for (group, name, provider), total in zip(names[1:], totals[1:]):
        rows.append(dict(group=group, case=name, provider=provider,
                         instructions_per_call=round(total / number - base),
                         number=number, threads=1, torch=torch.__version__))
    # ratios against the plain provider of the same case
    plain = {r["case"]: r["instructions_per_call"] for r in rows if r["provider"] == "plain"}
    first = {}
    for r in rows:
        first.setdefault(r["case"], r["instructions_per_call"])
    for r in rows:
        ref = plain.get(r["case"], first[r["case"]])
        r["ratio_vs_plain"] = (round(r["instructions_per_call"] / ref, 3) if ref > 0
                               else float("nan"))
    return rows


def run(quick: bool = False, include_compile: bool = False, build: bool = True,
        keep_dumps: str = "") -> list[dict]:
    """All cases; [] when valgrind is not installed. ``quick``: fewer calls per case;
    ``build``: (re)build the AVX2 copy of the extension when one is needed; ``keep_dumps``:
    see ``collect``."""
    if not valgrind_available():
        print("callgrind: valgrind/callgrind_control not found, skipped")
        return []
    extension, reason = valgrind_extension(build=build)
    if extension is None:
        print(f"callgrind: {reason}, skipped")
        return []
    return collect(10 if quick else 25, include_compile=include_compile, extension=extension,
                   keep_dumps=keep_dumps)


def write_outputs(rows: list[dict], stem: str) -> None:
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    fields = ["group", "case", "provider", "instructions_per_call", "ratio_vs_plain", "number",
              "threads", "torch"]
    with open(stem + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: r[k] for k in fields})
    with open(stem + ".md", "w") as f:
        f.write("# Host instruction counts (callgrind)\n\n")
        f.write(f"{time.strftime('%Y-%m-%d %H:%M')}, torch {rows[0]['torch'] if rows else '?'}, "
                f"shape {T}x{H} fp32, 1 thread, {rows[0]['number'] if rows else '?'} calls per "
                "case, empty-call baseline subtracted. Ratio = instructions / plain PyTorch's "
                "(<1: ours executes fewer).\n\n")
        f.write("| group | case | provider | instructions / call | ratio vs plain |\n")
        f.write("|---|---|---|---:|---:|\n")
        for r in rows:
            f.write(f"| {r['group']} | {r['case']} | {r['provider']} | "
                    f"{r['instructions_per_call']:,} | {r['ratio_vs_plain']:.2f} |\n")


def print_table(rows: list[dict]) -> None:
    print(f"{'group':<7} {'case':<52} {'provider':<14} {'instr/call':>12} {'vs plain':>9}")
    for r in rows:
        print(f"{r['group']:<7} {r['case']:<52} {r['provider']:<14} "
              f"{r['instructions_per_call']:>12,} {r['ratio_vs_plain']:>9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 calls per case (default 25)")
    parser.add_argument("--compile", action="store_true",
                        help="also torch.compile'd Sequentials (compiling under valgrind is slow)")
    parser.add_argument("--no-build", action="store_true",
                        help="use the existing AVX2 copy of the extension, do not (re)build it")
    parser.add_argument("--out", default=os.path.join(HERE, "out", "callgrind"))
    parser.add_argument("--keep-dumps", default="", metavar="DIR",
                        help="copy each case's callgrind dump here, to read with "
                             "callgrind_annotate --inclusive=yes")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--number", type=int, default=50, help=argparse.SUPPRESS)
    parser.add_argument("--only-steps", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        _worker(a.worker, a.number, a.compile, a.only_steps)
        return
    t0 = time.time()
    rows = run(a.quick, include_compile=a.compile, build=not a.no_build, keep_dumps=a.keep_dumps)
    if not rows:
        return
    print_table(rows)
    write_outputs(rows, a.out)
    print(f"wrote {a.out}.csv and {a.out}.md ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
