"""The benchmark suite: every CPU case of the project's benchmark plan (C1-C11), each timed for
four providers in one process, side by side:

    torch          plain-PyTorch eager (the testing/reference.py modules, nn.LayerNorm, ...)
    torch.compile  torch.compile(fullgraph=True) of that plain model
    ours           the te.ops model (transformer_engine_cpp), eager
    ours compiled  torch.compile(fullgraph=True) of the te.ops model

Before any timing, the outputs and gradients of ours and ours compiled are checked against
plain eager (relative error of the whole tensor, per dtype). Timing: R interleaved rounds, each
timing every provider once in rotated order (torch.utils.benchmark, explicit thread count);
ratios are taken within a round and reported as the median (min-max) over rounds. Memory-bound
cases also time a tensor copy of the same byte count and an fp32 GEMM in every round (the
roofline's memory and FLOP roofs); GEMM-bound cases time a bare torch.mm of the same shapes.
The MLP block reports saved-activation bytes and the peak memory allocated during a step.
Each job (a case at one dtype and thread count) is timed again if the host was busy while it
ran: the median of its probes of the host's memory bandwidth (before it, after each round,
after it) in a dip, or CPU time stolen by the VM's host (QuietHost).

    python bench/suite.py --quick      # 2 threads, fp32 + bf16, short rounds (< 5 min warm)
    python bench/suite.py              # full: + DRAM-size and odd shapes, + the 1-thread table

Every run writes bench/out/suite.csv and renders its report beside it (bench/out/suite.md,
bench/out/ratios.png); the full run also renders this CPU model's section of the committed
report, bench/machines/<model>/, and bench/README.md from every model's section (--readme
chooses another path, or none).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import statistics
import sys
import time
from typing import Callable, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (re-executes with the benchmark allocator settings first)
import report  # noqa: E402

common.ensure_benchmark_allocator()

import torch  # noqa: E402

import transformer_engine_cpp as te  # noqa: E402
from transformer_engine_cpp.testing import reference as ref  # noqa: E402

PROVIDERS = ("torch", "torch.compile", "ours", "ours compiled")
E4M3 = torch.float8_e4m3fn  # the te_cpp quantize ops name the format by its torch dtype


# ---- cases ----------------------------------------------------------------------------------

@dataclasses.dataclass
class Target:
    """Issue 6 / the benchmark plan: minimum speedups of ours (t_provider / t_ours, median over
    rounds) and the minimum fraction of copy bandwidth (or of the FLOP roof)."""
    vs_eager: Optional[float] = None
    vs_compile: Optional[float] = None
    copy_efficiency: Optional[float] = None
    # where the case's FLOP roof is below its memory roof (compute-bound on the machine), the
    # minimum fraction of that roof instead of copy_efficiency
    roof_efficiency: Optional[float] = None
    compiled_vs_ours: Optional[float] = None  # t_ours / t_ours_compiled
    note: str = ""


@dataclasses.dataclass
class Case:
    id: str
    name: str
    modes: tuple[str, ...]
    # (dtype) -> (plain model, ours model, inputs); parameters are equal in both
    build: Callable[[torch.dtype], tuple[torch.nn.Module, torch.nn.Module, tuple]]
    shape: str
    # minimal bytes moved per mode for one element size (0: not memory bound)
    min_bytes: Callable[[str, int], int] = lambda mode, esz: 0
    # GEMM-bound cases: the minimal bytes the work outside the GEMMs moves per mode (0: none)
    outside_gemm_bytes: Callable[[str, int], int] = lambda mode, esz: 0
    # minimal floating-point operations per mode (0: no FLOP roofline; see FLOPS below)
    flops: Callable[[str], int] = lambda mode: 0
    # GEMM shapes (M, K, N) per mode for the bare torch.mm roofline
    gemms: Callable[[str], Sequence[tuple[int, int, int]]] = lambda mode: ()
    targets: dict = dataclasses.field(default_factory=dict)  # mode -> Target
    memory: bool = False  # report saved-activation bytes and peak memory of a step
    grad: bool = True  # False: forward only, no autograd (kernels without a backward)
    # the same case at 8 rows (memory-bound cases): target 1's floor times its calls
    small: Optional[Callable[[], "Case"]] = None
    # only these dtypes of the run's (None: all of them)
    dtypes: Optional[tuple[torch.dtype, ...]] = None


# FLOP counts of the roofline, per element, of each formula in the accumulation type (fp32
# for bf16 / fp16): +, -, x, / and max count one each, a fused multiply-add two; a sign or
# absolute value counts none, nor do conversions and the FP8 casts (no floating-point
# arithmetic of their own). An exp counts EXP_FLOPS: the kernels' exp (vec_math.h) reduces
# the argument with a multiply and two multiply-adds (5) and evaluates a degree-5 polynomial
# by Horner (5 multiply-adds, 10); its clamps, rounding and scaling by a power of two (an
# exponent operation) are not counted. A sigmoid is an exp, an add and a reciprocal.
EXP_FLOPS = 15
SIGMOID_FLOPS = EXP_FLOPS + 2
FLOPS = {
    # mu: sum x (1); var: sum (x - mu)^2 (3); y = (x - mu) rstd gamma + beta (4)
    ("LayerNorm", "fwd"): 8,
    # g = dy gamma (1); xhat (2); sums of g (1) and g xhat (2); dgamma (2), dbeta (1);
    # dx = rstd (g - c1 - xhat c2) (4)
    ("LayerNorm", "bwd"): 13,
    # sum x^2 (2); y = x rstd gamma (2)
    ("RMSNorm", "fwd"): 4,
    # g (1); xhat (1); sum g xhat (2); dgamma (2); dx = rstd (g - xhat c2) (3)
    ("RMSNorm", "bwd"): 9,
    # x + bias (1), max (1)
    ("Bias + ReLU", "fwd"): 2,
    # x + bias (1); GELU as x sigmoid(x (c1 + c2 x^2)): x^2 (1), multiply-add (2), x (1),
    # the sigmoid, x s (1)
    ("Bias + GELU", "fwd"): 6 + SIGMOID_FLOPS,
    # z = x + bias (1); x^2, multiply-add, product, sigmoid, f = x s (5 + sigmoid);
    # dx = dy (f (1 - s) (c1 + c2' x^2) + s): 1 - s, product, two multiply-adds, dy (7);
    # dbias (1)
    ("dGELU + dbias", "bwd"): 14 + SIGMOID_FLOPS,
    # per output element: a sigmoid(a) (1 + sigmoid), times b (1)
    ("SwiGLU", "fwd"): 2 + SIGMOID_FLOPS,
    # per output element: s and f = a s (1 + sigmoid); g = dy b (1);
    # da = (g a) (1 - s) s + g s (7); db = dy f (1)
    ("SwiGLU", "bwd"): 10 + SIGMOID_FLOPS,
    # amax: max |x| (1); x scale (1)
    ("FP8 quantize (current scaling)", "fwd"): 2,
    ("MXFP8 quantize", "fwd"): 2,
}


def _flops(name: str, elements: int) -> Callable[[str], int]:
    return lambda mode: FLOPS.get((name, mode), 0) * elements


def _copy_params(src: torch.nn.Module, dst_params: Sequence[torch.nn.Parameter]) -> None:
    with torch.no_grad():
        for p, q in zip(src.parameters(), dst_params, strict=True):
            q.copy_(p)


def layernorm_case(T, H):
    def build(dtype):
        plain = torch.nn.LayerNorm(H, dtype=dtype)
        with torch.no_grad():
            plain.weight.normal_()
            plain.bias.normal_()
        ours = te.ops.Sequential(te.ops.LayerNorm(H, dtype=dtype))
        _copy_params(plain, [ours[0].weight, ours[0].bias])
        return plain, ours, (torch.randn(T, H, dtype=dtype),)
    # fwd: read x, write y; bwd: read dy and x, write dx (stats and dgamma/dbeta are O(T + H))
    return Case("C1", "LayerNorm", ("fwd", "bwd"), build, f"{T}x{H}",
                small=lambda: layernorm_case(8, H),
                min_bytes=lambda mode, e: (2 if mode == "fwd" else 3) * T * H * e,
                flops=_flops("LayerNorm", T * H),
                targets={m: Target(1.0, 1.0, 0.6, 0.7, 1.0) for m in ("fwd", "bwd")})


def rmsnorm_case(T, H):
    def build(dtype):
        plain = torch.nn.RMSNorm(H, eps=1e-5, dtype=dtype)
        with torch.no_grad():
            plain.weight.normal_()
        ours = te.ops.Sequential(te.ops.RMSNorm(H, eps=1e-5, dtype=dtype))
        _copy_params(plain, [ours[0].weight])
        return plain, ours, (torch.randn(T, H, dtype=dtype),)
    return Case("C2", "RMSNorm", ("fwd", "bwd"), build, f"{T}x{H}",
                small=lambda: rmsnorm_case(8, H),
                min_bytes=lambda mode, e: (2 if mode == "fwd" else 3) * T * H * e,
                flops=_flops("RMSNorm", T * H),
                targets={m: Target(2.0, 1.0, 0.6, 0.7, 1.0) for m in ("fwd", "bwd")})


def bias_act_builder(T, F, act):
    te_act = {"gelu": te.ops.GELU, "relu": te.ops.ReLU}[act]

    def build(dtype):
        plain = ref.BiasActivation(F, act, dtype=dtype)
        ours = te.ops.Sequential(te.ops.Bias(F, dtype=dtype), te_act())
        _copy_params(plain, [ours[0].bias])
        return plain, ours, (torch.randn(T, F, dtype=dtype),)
    return build


def bias_act_case(T, F, act):
    # forward: read x, write y (the pre-activation need not be written)
    name = f"Bias + {act.upper() if act == 'gelu' else 'ReLU'}"
    return Case("C3", name, ("fwd",), bias_act_builder(T, F, act), f"{T}x{F}",
                small=lambda: bias_act_case(8, F, act),
                min_bytes=lambda mode, e: 2 * T * F * e, flops=_flops(name, T * F),
                targets={"fwd": Target(1.5, 1.0, 0.6, 0.7, 1.0)})


def dact_dbias_case(T, F):
    # backward of Bias -> GELU (BackwardActivationBias): read dy and the saved input, write dx
    return Case("C4", "dGELU + dbias", ("bwd",), bias_act_builder(T, F, "gelu"), f"{T}x{F}",
                small=lambda: dact_dbias_case(8, F),
                min_bytes=lambda mode, e: 3 * T * F * e, flops=_flops("dGELU + dbias", T * F),
                targets={"bwd": Target(1.2, 1.0, 0.6, 0.7, 1.0)})


def swiglu_case(T, F):
    def build(dtype):
        return (ref.Activation("swiglu"), te.ops.Sequential(te.ops.SwiGLU()),
                (torch.randn(T, 2 * F, dtype=dtype),))
    # fwd: read T x 2F, write T x F; bwd: read dy (T x F) and x (T x 2F), write dx (T x 2F)
    return Case("C5", "SwiGLU", ("fwd", "bwd"), build, f"{T}x2*{F}",
                small=lambda: swiglu_case(8, F),
                min_bytes=lambda mode, e: (3 if mode == "fwd" else 5) * T * F * e,
                flops=_flops("SwiGLU", T * F),
                targets={"fwd": Target(1.4, 1.0, 0.6, 0.7, 1.0),
                         "bwd": Target(1.5, 1.0, 0.6, 0.7, 1.0)})


def linear_gelu_case(T, H, F):
    def build(dtype):
        plain = torch.nn.Sequential(torch.nn.Linear(H, F, dtype=dtype), ref.Activation("gelu"))
        ours = te.ops.Sequential(te.ops.Linear(H, F, dtype=dtype), te.ops.GELU())
        _copy_params(plain, list(ours.parameters()))
        return plain, ours, (torch.randn(T, H, dtype=dtype),)
    return Case("C6", "Linear + Bias + GELU", ("fwd",), build, f"{T}x{H}x{F}",
                gemms=lambda mode: [(T, H, F)],
                targets={"fwd": Target(1.02, 0.97, note="GEMM-bound: t(ours) / t(mm) shown")})


def linear_add_case(T, H, F):
    def build(dtype):
        plain = ref.LinearWithSkip(H, F, dtype=dtype)
        ours = te.ops.Sequential(te.ops.MakeExtraOutput(), te.ops.Linear(H, F, dtype=dtype))
        _copy_params(plain, list(ours.parameters()))
        return plain, ours, (torch.randn(T, H, dtype=dtype),)
    # backward: dgrad (T x F x H) and wgrad (F x T x H)
    return Case("C7", "BackwardLinearAdd", ("bwd",), build, f"{T}x{H}x{F}",
                gemms=lambda mode: [(T, F, H), (F, T, H)],
                targets={"bwd": Target(1.01, 0.97)})


def mlp_builder(T, H, F, variant):
    def build(dtype):
        act = "swiglu" if variant == "swiglu" else "gelu"
        residual = variant != "plain"
        plain = ref.PreNormMLP(H, F, activation=act, residual=residual, dtype=dtype)
        ours = ref.te_prenorm_mlp(H, F, activation=act, residual=residual, dtype=dtype)
        _copy_params(plain, list(ours.parameters()))
        return plain, ours, (torch.randn(T, H, dtype=dtype),)
    return build


def mlp_case(T, H, F, variant):
    name = {"plain": "MLP block", "residual": "MLP block + residual",
            "swiglu": "MLP block SwiGLU + residual"}[variant]
    fc1 = 2 * F if variant == "swiglu" else F

    def gemms(mode):
        fwd = [(T, H, fc1), (T, F, H)]
        bwd = [(T, fc1, H), (fc1, T, H), (T, H, F), (H, T, F)]
        return fwd if mode == "fwd" else fwd + bwd

    def outside_gemm_bytes(mode, esz):
        # each pass outside the GEMMs reads its inputs once and writes its outputs once; the
        # biases and the residual add ride in the GEMMs (beta = 1). Forward: LayerNorm (x in,
        # out), the activation (fc1's output in, fc2's input out). Backward: fc2's dbias (dy
        # in), the activation's backward with fc1's dbias (dy and the saved fc1 output in, its
        # grad out), LayerNorm's (dy and x in, dx out) and the residual's grad added to it.
        fwd = 2 * T * H + T * (fc1 + F)
        bwd = T * H + T * (F + 2 * fc1) + 3 * T * H + (T * H if variant != "plain" else 0)
        return esz * (fwd if mode == "fwd" else fwd + bwd)
    return Case("C8", name, ("fwd", "fwd+bwd"), mlp_builder(T, H, F, variant), f"{T}x{H}x{F}",
                gemms=gemms, memory=True, outside_gemm_bytes=outside_gemm_bytes,
                targets={"fwd": Target(1.0, 0.95),
                         "fwd+bwd": Target(1.05, 1.0, compiled_vs_ours=1.0)})


def host_case(T, H=256):
    def build(dtype):
        plain = torch.nn.Sequential(torch.nn.LayerNorm(H, dtype=dtype),
                                    torch.nn.Linear(H, H, dtype=dtype), ref.Activation("gelu"),
                                    torch.nn.Linear(H, H, dtype=dtype))
        ours = te.ops.Sequential(te.ops.LayerNorm(H, dtype=dtype), te.ops.Linear(H, H, dtype=dtype),
                                 te.ops.GELU(), te.ops.Linear(H, H, dtype=dtype))
        _copy_params(plain, list(ours.parameters()))
        return plain, ours, (torch.randn(T, H, dtype=dtype),)
    target = Target(1.0)
    return Case("C9", "Host overhead (LN, Linear, GELU, Linear)", ("fwd", "fwd+bwd"), build,
                f"{T}x{H}", targets={"fwd": target, "fwd+bwd": target})


class _PlainExpertMLP(torch.nn.Module):
    """The plain-PyTorch expert MLP: a loop over the experts on the permuted tokens, splitting
    by python-int sizes (torch.compile specialises on them), per expert fc1, SwiGLU scaled per
    row by the router probabilities (ScaledSwiGLU: gate = the first half, ``probs * silu(a) *
    b``), fc2, and the results concatenated. Parameters in the te.ops model's order (fc1
    weights, fc1 biases, fc2 weights, fc2 biases)."""

    def __init__(self, splits: list[int], H: int, F: int, dtype):
        super().__init__()
        self.splits = splits
        E = len(splits)
        new = lambda *shape: torch.nn.Parameter(torch.empty(*shape, dtype=dtype))  # noqa: E731
        self.w1 = torch.nn.ParameterList(new(2 * F, H) for _ in range(E))
        self.b1 = torch.nn.ParameterList(new(2 * F) for _ in range(E))
        self.w2 = torch.nn.ParameterList(new(H, F) for _ in range(E))
        self.b2 = torch.nn.ParameterList(new(H) for _ in range(E))

    def forward(self, x, probs):
        outs = []
        for i, (xi, pi) in enumerate(zip(x.split(self.splits), probs.split(self.splits))):
            a, b = torch.nn.functional.linear(xi, self.w1[i], self.b1[i]).chunk(2, dim=-1)
            h = pi.unsqueeze(-1) * (torch.nn.functional.silu(a) * b)
            outs.append(torch.nn.functional.linear(h, self.w2[i], self.b2[i]))
        return torch.cat(outs)


class _OursExpertMLP(torch.nn.Module):
    """The te.ops expert MLP (GroupedLinear, ScaledSwiGLU, GroupedLinear: the GroupedMLP fusion)
    with the split sizes as a buffer, so that it takes the plain model's (x, probs)."""

    def __init__(self, splits: list[int], H: int, F: int, dtype):
        super().__init__()
        E = len(splits)
        self.mlp = te.ops.Sequential(te.ops.GroupedLinear(E, H, 2 * F, dtype=dtype),
                                     te.ops.ScaledSwiGLU(),
                                     te.ops.GroupedLinear(E, F, H, dtype=dtype))
        self.register_buffer("splits", torch.tensor(splits), persistent=False)

    def forward(self, x, probs):
        return self.mlp(x, self.splits, probs, self.splits)


def moe_routing(T: int, E: int, k: int = 2):
    """A seeded top-k softmax router's result, computed once outside the timed region: the
    expert-sorted token order (token index of each of the T * k rows), the rows' probabilities
    and the split sizes. A per-expert logit offset makes the experts' loads uneven (at T=4096,
    top-2 of 8: 333 to 1446 rows)."""
    logits = (torch.randn(T, E, generator=torch.Generator().manual_seed(0))
              + 0.5 * torch.randn(E, generator=torch.Generator().manual_seed(1)))
    top_p, top_e = logits.softmax(-1).topk(k, dim=-1)
    order = torch.argsort(top_e.flatten(), stable=True)
    splits = torch.bincount(top_e.flatten(), minlength=E).tolist()
    return order // k, top_p.flatten()[order], splits


def moe_mlp_case(T, H, F, E=8, k=2):
    tokens, probs, splits = moe_routing(T, E, k)

    def build(dtype):
        plain = _PlainExpertMLP(splits, H, F, dtype)
        ours = _OursExpertMLP(splits, H, F, dtype)
        with torch.no_grad():  # non-zero biases, so that their use is checked
            for p in ours.parameters():
                if p.dim() == 1:
                    p.uniform_(-0.1, 0.1)
        _copy_params(ours, list(plain.parameters()))
        # the permuted tokens: row j is token tokens[j], in expert order
        x = torch.randn(T, H, dtype=dtype)[tokens]
        return plain, ours, (x, probs.to(dtype))

    def gemms(mode):
        fwd = [g for n in splits for g in ((n, H, 2 * F), (n, F, H))]
        bwd = [g for n in splits for g in ((n, H, F), (H, n, F), (n, 2 * F, H), (2 * F, n, H))]
        return fwd if mode == "fwd" else fwd + bwd
    return Case("C11", "MoE MLP", ("fwd", "fwd+bwd"), build, f"E{E} {T}*{k}x{H}x{F}",
                gemms=gemms,
                targets={m: Target(1.2, 1.0, note="GEMM-bound: t(ours) / t(mm) shown; plain "
                                                  "eager's t / t(mm) bounds the reachable ratio")
                         for m in ("fwd", "fwd+bwd")})


class _Quantize(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def quantize_case(T, H, kind):
    if kind == "fp8":
        def fn(x):
            return torch.ops.te_cpp.fp8_quantize(x, E4M3, False, 0.0)
        plain_fn, name = ref.fp8_quantize_current_scaling, "FP8 quantize (current scaling)"
        # current scaling needs the whole tensor's amax before the first cast: two reads of
        # the input (amax pass, cast pass) + 1 byte per element written
        nbytes = lambda mode, e: T * H * (2 * e + 1)  # noqa: E731
    else:
        def fn(x):
            return torch.ops.te_cpp.mxfp8_quantize(x, E4M3)
        plain_fn, name = ref.mxfp8_quantize_reference, "MXFP8 quantize"
        # one read, 1 byte per element + one E8M0 scale per 32 elements
        nbytes = lambda mode, e: T * H * (e + 1) + T * H // 32  # noqa: E731

    def build(dtype):
        return _Quantize(plain_fn), _Quantize(fn), (torch.randn(T, H, dtype=dtype) * 3,)
    return Case("C10", name, ("fwd",), build, f"{T}x{H}", min_bytes=nbytes, grad=False,
                small=lambda: quantize_case(8, H, kind),
                flops=_flops(name, T * H), targets={"fwd": Target(1.0, 1.0, 0.6, 0.7, 1.0)})


def all_cases(full: bool, quick: bool) -> list[Case]:
    T, H, F = 4096, 1024, 4096
    # the GEMM-bound cases shrink T in quick mode (the ratios are about the same, the run is
    # 4x shorter)
    Tg = 1024 if quick else T
    cases = [layernorm_case(T, H), rmsnorm_case(T, H), bias_act_case(T, F, "gelu"),
             bias_act_case(T, F, "relu"), dact_dbias_case(T, F), swiglu_case(T, F),
             linear_gelu_case(Tg, H, F), linear_add_case(Tg, H, F),
             mlp_case(Tg, H, F, "plain"), mlp_case(Tg, H, F, "residual"),
             mlp_case(Tg, H, F, "swiglu"), host_case(1), host_case(8), host_case(64),
             quantize_case(T, H, "fp8"), quantize_case(T, H, "mxfp8"),
             moe_mlp_case(Tg, H, 2048)]
    if full:
        # DRAM regime (>= 4x the 32 MiB L3) and odd sizes (vector tails)
        cases += [layernorm_case(16384, H), rmsnorm_case(16384, H),
                  bias_act_case(16384, F, "relu"), swiglu_case(16384, F),
                  layernorm_case(T, 1000), rmsnorm_case(T, 1000), swiglu_case(T, 4000),
                  mlp_case(T, 1000, 4000, "residual")]
        # each memory-bound kernel at a second level of the memory hierarchy (bf16 tensors in
        # the L3 at 1024 and 512 rows, from memory at 16384): target 3's floor compares a row
        # with its twin (report.kernel_floor_lines)
        cases += [bias_act_case(1024, F, "gelu"), dact_dbias_case(1024, F), swiglu_case(512, F),
                  quantize_case(16384, H, "fp8"), quantize_case(16384, H, "mxfp8")]
        # and from memory where the L3 holds the sizes above (a copy of 64 MiB runs from the
        # cache on the Intel Xeon VM): 256 MiB and more in 16-bit, for target 3 only
        cases += [dataclasses.replace(c, dtypes=(torch.bfloat16, torch.float16)) for c in
                  (layernorm_case(65536, H), rmsnorm_case(65536, H),
                   bias_act_case(16384, F, "gelu"), dact_dbias_case(16384, F))]
    return cases


# ---- running --------------------------------------------------------------------------------

def _outputs(y) -> tuple:
    return y if isinstance(y, tuple) else (y,)


class Step:
    """The timed callables of one (case, dtype): forward, backward-only (on a retained graph)
    and forward+backward, for one model."""

    def __init__(self, model, inputs, grads, wrt_params, grad_enabled):
        self.model, self.inputs, self.grads = model, inputs, grads
        self.wrt = list(inputs) + list(wrt_params)
        self.grad_enabled = grad_enabled
        self._retained = None

    def fwd(self):
        with torch.set_grad_enabled(self.grad_enabled):
            return self.model(*self.inputs)

    def fwd_bwd(self):
        outs = _outputs(self.model(*self.inputs))
        return torch.autograd.grad(outs, self.wrt, self.grads)

    def bwd(self):
        if self._retained is None:
            self._retained = _outputs(self.model(*self.inputs))
        return torch.autograd.grad(self._retained, self.wrt, self.grads, retain_graph=True)

    def fn(self, mode) -> Callable[[], object]:
        return {"fwd": self.fwd, "bwd": self.bwd, "fwd+bwd": self.fwd_bwd}[mode]


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    if expected.dtype == torch.uint8:  # FP8 payloads: count differing codes
        return (got != expected).double().mean().item()
    e = expected.double()
    return ((got.double() - e).norm() / e.norm().clamp_min(1e-30)).item()


# Whole-tensor relative error to the float64 result allowed to ours: the larger of this and
# twice plain eager's own error (eager's bf16 LayerNorm weight gradients, for one, are off by
# ~2.5e-2 at T=1024).
CHECK_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _results(step: Step, grad: bool) -> list[torch.Tensor]:
    outs = [t.detach() for t in _outputs(step.fwd())]
    return outs + (list(step.fwd_bwd()) if grad else [])


def check(case: Case, dtype, steps: dict[str, Step], log) -> None:
    """ours and ours compiled against a float64 run of the plain model, no worse than plain
    eager: forward outputs, then the gradients of the inputs and parameters."""
    plain = steps["torch"]
    model64 = copy.deepcopy(plain.model).double()
    inputs64 = tuple(x.detach().double().requires_grad_(case.grad) for x in plain.inputs)
    grads64 = tuple(g.double() if g is not None else None for g in plain.grads)
    exact = _results(Step(model64, inputs64, grads64, list(model64.parameters()) if case.grad
                          else [], case.grad), case.grad)
    eager = [relative_error(t, e) for t, e in zip(_results(plain, case.grad), exact, strict=True)]
    worst = 0.0
    for name in ("ours", "ours compiled"):
        for i, (got, e) in enumerate(zip(_results(steps[name], case.grad), exact, strict=True)):
            err = relative_error(got, e)
            allowed = max(CHECK_TOLERANCE[dtype], 2 * eager[i])
            worst = max(worst, err)
            if not err <= allowed:
                raise SystemExit(f"{case.id} {case.name} {dtype}: {name} result {i} (outputs, "
                                 f"then gradients) is off the float64 result by {err:.2e}; plain "
                                 f"eager by {eager[i]:.2e}; allowed {allowed:.1e}")
    log(f"  check vs float64: ours {worst:.1e}, plain eager {max(eager):.1e} (worst relative "
        "error over outputs and gradients)")


def _grad_like(y: torch.Tensor) -> Optional[torch.Tensor]:
    return torch.randn_like(y) if y.is_floating_point() else None


def _steps(case: Case, dtype) -> dict[str, Step]:
    """The four providers' steps on one set of inputs (compiled on their first call)."""
    plain, ours, inputs = case.build(dtype)
    inputs = tuple(x.requires_grad_(case.grad) for x in inputs)
    with torch.no_grad():
        grads = tuple(_grad_like(y) for y in _outputs(plain(*inputs)))
    models = {"torch": plain, "torch.compile": torch.compile(plain, fullgraph=True),
              "ours": ours, "ours compiled": torch.compile(ours, fullgraph=True)}
    steps = {}
    for name, model in models.items():
        params = list(plain.parameters() if name.startswith("torch") else ours.parameters())
        steps[name] = Step(model, inputs, grads, params if case.grad else [], case.grad)
    return steps


def run_case_dtype(case: Case, dtype, threads: int, rounds: int, min_run_time: float,
                   log, after_round: Optional[Callable[[], object]] = None
                   ) -> list[common.Result]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    # a backward-only timing repeats the backward on a retained graph, which AOTAutograd's
    # donated buffers (saved tensors reused as backward scratch) do not allow
    torch._functorch.config.donated_buffer = "bwd" not in case.modes
    steps = _steps(case, dtype)
    torch.set_num_threads(threads)
    # first calls compile: timed separately, reported as compile seconds
    compile_s = {}
    for name, step in steps.items():
        t0 = time.perf_counter()
        for mode in case.modes:
            step.fn(mode)()
        compile_s[name] = time.perf_counter() - t0
    check(case, dtype, steps, log)

    results = []
    esz = torch.empty((), dtype=dtype).element_size()
    for mode in case.modes:
        providers = [common.Provider(n, steps[n].fn(mode)) for n in PROVIDERS]
        nbytes = case.min_bytes(mode, esz)
        gemms = case.gemms(mode)
        extra = []
        if gemms:
            mats = [(torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype))
                    for m, k, n in gemms]
            extra.append(common.Provider("torch.mm", lambda mats=mats: [a @ b for a, b in mats]))
        res = common.run_case(f"{case.id} {case.name}", dtype, case.shape, mode,
                              providers + extra, ours="ours", rounds=rounds, threads=threads,
                              min_run_time=min_run_time, bytes_moved=nbytes,
                              copy_bytes=nbytes // 2, flops=case.flops(mode),
                              after_round=after_round, log=log)
        if case.memory and mode == "fwd+bwd":
            for r in res:
                if r.provider in steps:
                    r.saved_bytes = common.saved_activation_bytes(steps[r.provider].fwd)
                    r.peak_bytes = common.peak_allocated_bytes(steps[r.provider].fwd_bwd)
                    if not r.provider.endswith("compiled") and r.provider != "torch.compile":
                        r.outside_gemm, r.outside_gemm_ops = common.outside_gemm_shares(
                            steps[r.provider].fwd_bwd)
                        r.outside_gemm_min_bytes = case.outside_gemm_bytes(mode, esz)
            mem = {r.provider: r for r in res if r.provider in steps}
            log("  memory: " + " | ".join(
                f"{n} saved {mem[n].saved_bytes / 2**20:.1f} MiB peak "
                f"{mem[n].peak_bytes / 2**20:.1f} MiB" for n in PROVIDERS))
        for r in res:
            r.case_id, r.case = case.id, case.name
            r.compile_s = compile_s.get(r.provider, 0.0)
            if r.provider == "ours" and mode in case.targets:
                t = case.targets[mode]
                nan = float("nan")
                r.target_vs_eager = nan if t.vs_eager is None else t.vs_eager
                r.target_vs_compile = nan if t.vs_compile is None else t.vs_compile
                r.target_copy = nan if t.copy_efficiency is None else t.copy_efficiency
                r.target_roof = nan if t.roof_efficiency is None else t.roof_efficiency
                r.target_compiled = nan if t.compiled_vs_ours is None else t.compiled_vs_ours
                r.target_note = t.note
        results += res
    if case.small is not None:  # after every mode's timing: its compiles add cache entries
        _compile_floor(results, steps, _steps(case.small(), dtype), log)
    return results


def _compile_floor(results: list, steps: dict, small: dict, log) -> None:
    """Target 1's floor on ours' rows of a memory-bound case: the host cost of a call with
    caches as the row leaves them, measured as a call of the same case at 8 rows right after
    one call of the row's own ours eager (common.cold_call_us; no profiler): ours eager
    (eager_host_us), the plain model compiled (compile_wrapper_us: torch.compile's wrapper and
    an 8-row kernel) and ours compiled (compiled_host_us). Ours compiled at the row's shape runs
    ours eager's kernels plus at least torch.compile's wrapper."""
    providers = ("ours", "torch.compile", "ours compiled")
    for r in results:
        if r.provider != "ours" or not r.bytes_moved:
            continue
        for name in providers:  # compile, and warm the small steps up
            small[name].fn(r.mode)()
        calls = max(15, min(100, int(3e5 / (3 * (r.median_us + 100.0)))))
        cold = common.cold_call_us(steps["ours"].fn(r.mode),
                                   [small[name].fn(r.mode) for name in providers], calls)
        r.eager_host_us, r.compile_wrapper_us, r.compiled_host_us = cold
        log(f"  floor {r.mode}: an 8-row call after the row's call, µs: ours eager "
            f"{cold[0]:.0f}, plain compiled {cold[1]:.0f}, ours compiled {cold[2]:.0f}")


class QuietHost:
    """Watches the host while each job is timed, and times a job again that ran while it was
    busy. The development machines are VMs whose host other guests share: on the AMD EPYC VM a
    64 MiB copy at 2 threads flips between about 30 and 50 GB/s every few seconds, and its
    typical level moves between hours, so copies just before and after a job can miss the level
    its rounds ran at. A job's memory probes (common.probe_host at its thread count) come
    before it, after each of its timing rounds and after it, and the CPU time the VM's host
    stole from it is counted (common.host_times). A job whose median probe is below QUIET of
    the median probe so far at its thread count (most of its rounds ran in a dip: one dipped
    round moves neither that median nor the timings, which are medians over rounds), or whose
    threads lost more than STEAL of their time, ran while the host was busy: it is timed again,
    once a probe is back above QUIET (probing every WAIT_S seconds, for at most PATIENCE_S), up
    to ATTEMPTS timings in all. So is a job whose round medians spread by SPREAD or more (p80 /
    p20 of any of its rows' providers): something moved under it that the probes did not see.
    A timing on a quiet host stands, else the one whose rounds spread less (below SPREAD all
    count alike), then the one with the higher median probe."""

    QUIET = report.QUIET_HOST
    STEAL = report.BUSY_STEAL
    SPREAD = report.SPREAD_WIDE
    ATTEMPTS = 2
    WAIT_S = 10.0
    PATIENCE_S = 120.0

    def __init__(self, threads: Sequence[int], log) -> None:
        self.log = log
        self.probes = {t: [common.probe_host(t) for _ in range(3)] for t in threads}
        self.log("host probe (GB/s, a 64 MiB copy): " + ", ".join(
            f"{report.threads_label(t)} {self.reference(t):.1f}" for t in threads))

    def reference(self, threads: int) -> float:
        return statistics.median(self.probes[threads])

    def _probe(self, threads: int, record: bool = True) -> float:
        """A probe; recorded into the median unless taken while waiting out a dip (those come
        more often than a job's and would pull the median into the dip)."""
        gbps = common.probe_host(threads)
        if record:
            self.probes[threads].append(gbps)
        return gbps

    def quiet(self, threads: int, gbps: float) -> bool:
        return gbps >= self.QUIET * self.reference(threads)

    def _wait(self, threads: int) -> float:
        waited = 0.0
        gbps = self._probe(threads)
        while not self.quiet(threads, gbps) and waited < self.PATIENCE_S:
            time.sleep(self.WAIT_S)
            waited += self.WAIT_S
            gbps = self._probe(threads, record=False)
        return gbps

    def _attempt(self, threads: int, job: Callable[[Callable[[], None]], list],
                 before: float) -> tuple[list, float, float]:
        """One timing of the job: its results, the median of its probes (before included), and
        the share of its threads' wall time stolen."""
        probes = [before]
        wall, steal = common.host_times()
        results = job(lambda: probes.append(self._probe(threads)))
        wall1, steal1 = common.host_times()
        probes.append(self._probe(threads))
        return (results, statistics.median(probes),
                (steal1 - steal) / max((wall1 - wall) * threads, 1e-9))

    def run(self, threads: int, job: Callable[[Callable[[], None]], list]) -> list:
        """job(after_round) times the job, calling after_round after each timing round."""
        before = self._wait(threads)
        kept, kept_key = [], None
        for attempt in range(1, self.ATTEMPTS + 1):
            results, probe, steal = self._attempt(threads, job, before)
            spread = report.rounds_spread(results)
            busy = []
            if not self.quiet(threads, probe):
                busy.append(f"median probe {probe:.1f} GB/s against the run's "
                            f"{self.reference(threads):.1f}")
            if steal > self.STEAL:  # False for NaN
                busy.append(f"{100 * steal:.0f}% of its threads' time stolen by the VM's host")
            if spread >= self.SPREAD:
                busy.append(f"its rounds spread {spread:.2f}x (a provider's p80 round median "
                            "over its p20)")
            key = (not busy, -max(spread, self.SPREAD), probe)
            if kept_key is None or key > kept_key:
                kept, kept_key = results, key
                kept_probe, kept_steal, kept_spread = probe, steal, spread
            if not busy or attempt == self.ATTEMPTS:
                break
            self.log(f"  host busy: {'; '.join(busy)}; timing the job again once it recovers")
            before = self._wait(threads)
        for r in kept:
            r.host_probe_gbps, r.host_steal, r.attempts = kept_probe, kept_steal, attempt
            r.rounds_spread = kept_spread
        return kept


def is_gemm_bound(case: Case) -> bool:
    return bool(case.gemms("fwd+bwd") or case.gemms("fwd") or case.gemms("bwd"))


def job_list(threads: Sequence[int], cases: Sequence[Case], dtypes: Sequence[torch.dtype],
             slow_gemm_dtypes: Sequence[torch.dtype] = ()) -> list:
    """The run's jobs, (threads, case, dtype): every case at every dtype it takes, but for the
    GEMM-bound ones at 1 thread beside other thread counts (at T=4096 they alone would take
    about 40 minutes; --threads 1 --cases C8 runs them) and in slow_gemm_dtypes (dtypes whose
    GEMM ATen runs as a scalar loop on this CPU: plain PyTorch's C8 step alone would take
    minutes)."""
    return [(t, c, d) for t in threads for c in cases for d in dtypes
            if (c.dtypes is None or d in c.dtypes)
            and not (is_gemm_bound(c) and ((t == 1 and len(threads) > 1)
                                           or d in slow_gemm_dtypes))]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true",
                      help="2 threads, 3 short rounds, GEMM cases at T=1024 (< 5 min warm)")
    mode.add_argument("--full", action="store_true",
                      help="(default) 7 rounds, + DRAM and odd shapes, 2 and 1 threads")
    parser.add_argument("--threads", type=int, nargs="+", help="thread counts (default: full "
                        "2 1, quick 2)")
    parser.add_argument("--cases", nargs="+", help="case ids to run, e.g. C1 C8")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, help="timing rounds (default: full 7, quick 3)")
    parser.add_argument("--callgrind", action=argparse.BooleanOptionalAction, default=None,
                        help="also count host instructions with bench/callgrind.py (default: "
                        "in the full run only; needs valgrind)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out", "suite"),
                        help="this run's outputs: OUT.csv, OUT.md and ratios.png in OUT's folder "
                        "(default: bench/out/suite)")
    parser.add_argument("--readme", default=None,
                        help="also render the report here (default: the committed bench/README.md "
                        "for the full run, nowhere for --quick; '' for nowhere)")
    return parser.parse_args(argv)


def main() -> None:
    a = parse_args()
    quick = a.quick
    rounds, mrt = (3, 0.05) if quick else (7, 0.2)
    rounds = a.rounds or rounds
    threads = a.threads or ([2] if quick else [2, 1])
    dtypes = [getattr(torch, d) for d in a.dtypes]
    cases = [c for c in all_cases(full=not quick, quick=quick)
             if not a.cases or c.id in a.cases]
    torch._dynamo.config.cache_size_limit = 64
    env = common.environment()
    print(env, flush=True)
    slow_gemm_dtypes = [] if a.cases else [d for d in common.gemm_dtypes_in_fp32()
                                            if d in dtypes]
    if slow_gemm_dtypes:
        print(f"GEMM-bound cases not run in {', '.join(map(str, slow_gemm_dtypes))}: ATen's "
              "GEMM in that dtype is a scalar loop on this CPU (ours runs it in fp32)", flush=True)
    jobs = job_list(threads, cases, dtypes, slow_gemm_dtypes)
    results: list[common.Result] = []
    t_start = time.perf_counter()
    host = QuietHost(sorted(set(threads)), log=lambda s: print(s, flush=True))
    for i, (t, case, dtype) in enumerate(jobs, 1):
        elapsed = time.perf_counter() - t_start
        print(f"[{i}/{len(jobs)} {elapsed:5.0f}s] {case.id} {case.name} "
              f"{str(dtype).replace('torch.', '')} {case.shape} threads={t}", flush=True)
        results += host.run(t, lambda after_round: run_case_dtype(
            case, dtype, t, rounds, mrt, log=lambda s: print(s, flush=True),
            after_round=after_round))
        common.write_csv(results, a.out + ".csv")  # after every job: a stopped run keeps them
    common.write_csv(results, a.out + ".csv")
    print(f"wrote {a.out}.csv ({time.perf_counter() - t_start:.0f} s)")
    callgrind_rows, csvs = [], [a.out + ".csv"]
    if a.callgrind if a.callgrind is not None else not quick:
        import callgrind
        print("[callgrind] host instruction counts (one valgrind process)", flush=True)
        callgrind_rows = callgrind.run(quick=quick, include_compile=True)
        if callgrind_rows:
            stem = os.path.join(os.path.dirname(a.out), "callgrind")
            callgrind.write_outputs(callgrind_rows, stem)
            callgrind.print_table(callgrind_rows)
            csvs.append(stem + ".csv")
    for path in report.render_reports(results, env, a.out, quick=quick, readme=a.readme,
                                      callgrind_rows=callgrind_rows, csvs=csvs):
        print(f"wrote {path} ({time.perf_counter() - t_start:.0f} s in all)")


if __name__ == "__main__":
    main()
