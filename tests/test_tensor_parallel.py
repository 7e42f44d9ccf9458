"""Tensor and sequence parallelism of BasicLinear and Linear on 2 and 4 CPU ranks (gloo) against
a single-process run of the same full-size model (our own te.ops without tensor parallelism,
same dtype, recipe and weights, built in each rank).

For every config (op, mode, sequence parallelism, dtype, eager or compiled, recipe) each rank
runs the parallel op on its part of the data, the shards of the output and of every gradient
are gathered (dist.all_gather) and every rank compares the full tensors with the
single-process ones: within the dtype's tolerance (tests/tolerances.py; the summation order
differs across ranks, so not bitwise), within FP8_RELATIVE_ERROR of the single-process FP8 run
under Float8CurrentScaling, and compiled equal to eager exactly with the aot_eager backend.

Data are uniform in [0, 1) (as TransformerEngine's distributed tests): the partial sums of a
row-parallel GEMM do not cancel, so each rounding stays within the dtype's relative tolerance.

Process start-up is amortised: one spawn (tests/dist_harness.py) per world size and group of
configs runs all the group's configs in the rank body; each config's outcome is reported per
rank and a parametrized test per config reads it, so a failure names its config."""

from __future__ import annotations

import dataclasses
import itertools
import math
import traceback

import pytest
import torch
import torch.distributed as dist

import transformer_engine_cpp as te
from dist_harness import run_ranks
from tolerances import COMPILED_VS_EAGER, FP8_RELATIVE_ERROR, TOLERANCES

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
RANK_ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": "1"}
TOKENS, IN_FEATURES, OUT_FEATURES = 16, 32, 48  # divisible by 2 and 4 ranks


@dataclasses.dataclass(frozen=True)
class Config:
    """One parallel-op run compared with the single-process run."""

    kind: str       # "basic": BasicLinear (no bias); "linear": Linear (bias)
    mode: str       # "column" | "row"
    sp: bool        # sequence_parallel
    dtype: str      # key of DTYPES
    backend: str    # "eager" | a torch.compile backend ("aot_eager", "inductor")
    fp8: bool       # under te.autocast(recipe=Float8CurrentScaling())

    @property
    def id(self) -> str:
        return (f"{self.kind}-{self.mode}-{'sp' if self.sp else 'nosp'}-{self.dtype}-"
                f"{self.backend}-{'fp8' if self.fp8 else 'hp'}")


def _configs(backends, kinds=("basic", "linear"), dtypes=tuple(DTYPES), fp8=(False, True)):
    return [Config(*c) for c in itertools.product(kinds, ("column", "row"), (False, True),
                                                  dtypes, backends, fp8)]


# (world, group) -> configs; one spawn each. A compile costs 1-5 s per rank on a loaded 2-core
# machine, so on 4 ranks (two ranks per core) the compiled group is a subset: every
# BasicLinear config and Linear in fp32. On 2 ranks every config runs compiled.
GROUPS = {
    (2, "eager"): _configs(("eager",)),
    (2, "aot_eager"): _configs(("aot_eager",)),
    (2, "inductor"): [Config("linear", "row", True, "fp32", "inductor", False)],
    (4, "eager"): _configs(("eager",)),
    (4, "aot_eager"): (_configs(("aot_eager",), kinds=("basic",))
                       + _configs(("aot_eager",), kinds=("linear",), dtypes=("fp32",))),
}
DEADLINES_S = {"eager": 120.0, "aot_eager": 300.0, "inductor": 180.0}


# ---- data and layout helpers ---------------------------------------------------------------------

def _rand(seed: int, *shape, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g).to(dtype)


def _rel_err(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _gather(t: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """Concatenation along ``dim`` of every rank's ``t`` (rank order), in t's dtype (gathered
    in fp32, lossless for bf16)."""
    size = dist.get_world_size(group)
    t32 = t.detach().float().contiguous()
    parts = [torch.empty_like(t32) for _ in range(size)]
    dist.all_gather(parts, t32, group=group)
    return torch.cat(parts, dim=dim).to(t.dtype)


def _shard(t: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    return t.chunk(size, dim=dim)[rank].clone()


def _compare(name: str, got, ref, dtype, fp8: bool, direction: str) -> None:
    assert got is not None, f"{name}: no gradient"
    assert got.shape == ref.shape, f"{name}: shape {list(got.shape)} != {list(ref.shape)}"
    assert got.dtype == ref.dtype, f"{name}: dtype {got.dtype} != {ref.dtype}"
    if fp8:
        err = _rel_err(got, ref)
        assert err < FP8_RELATIVE_ERROR[direction], (
            f"{name}: relative error {err:.3g} >= {FP8_RELATIVE_ERROR[direction]} ({direction})")
    else:
        torch.testing.assert_close(got, ref, **TOLERANCES[dtype],
                                   msg=lambda m: f"{name}: {m}")


def _recipe_ctx(fp8: bool):
    import contextlib  # noqa: PLC0415
    return te.autocast(recipe=te.recipe.Float8CurrentScaling()) if fp8 else \
        contextlib.nullcontext()


def _make(kind: str, in_f: int, out_f: int, dtype, **tp):
    if kind == "basic":
        return te.ops.BasicLinear(in_f, out_f, dtype=dtype, **tp)
    return te.ops.Linear(in_f, out_f, bias=True, dtype=dtype, **tp)


def _run(model, x, dy, fp8: bool, backend: str = "eager"):
    """y, dx, dW, db (db None without bias) of one forward and backward."""
    fn = model if backend == "eager" else torch.compile(model, backend=backend, fullgraph=True)
    with _recipe_ctx(fp8):
        y = fn(x)
    y.backward(dy)
    bias = getattr(model, "bias", None)
    return (y.detach(), None if x.grad is None else x.grad.detach(),
            None if model.weight.grad is None else model.weight.grad.detach(),
            None if bias is None else bias.grad)


# ---- one config --------------------------------------------------------------------------------

def _check_config(rank: int, world: int, cfg: Config) -> None:
    dtype = DTYPES[cfg.dtype]
    size, group = world, dist.group.WORLD
    T, K, N = TOKENS, IN_FEATURES, OUT_FEATURES
    x_full = _rand(1, T, K, dtype=dtype)
    w_full = _rand(2, N, K, dtype=dtype)
    dy_full = _rand(3, T, N, dtype=dtype)
    # row mode: every rank holds a full-size bias added before the reduction, so the effective
    # bias is the sum over ranks (TransformerEngine's convention); distinct per-rank biases
    # catch an implementation that uses one rank's bias or the mean
    biases = [_rand(10 + r, N, dtype=torch.float32) for r in range(size)]
    b_full = (sum(biases) if cfg.mode == "row" else biases[0]).to(dtype)

    # single process
    ref = _make(cfg.kind, K, N, dtype)
    with torch.no_grad():
        ref.weight.copy_(w_full)
        if cfg.kind == "linear":
            ref.bias.copy_(b_full)
    ref_y, ref_dx, ref_dw, ref_db = _run(ref, x_full.clone().requires_grad_(), dy_full, cfg.fp8)

    # tensor parallel: the rank's shards
    col = cfg.mode == "column"
    w_local = _shard(w_full, 0 if col else 1, rank, size)
    b_local = _shard(b_full, 0, rank, size) if col else biases[rank].to(dtype)
    if col:
        x_local = _shard(x_full, 0, rank, size) if cfg.sp else x_full.clone()
        dy_local = _shard(dy_full, 1, rank, size)
    else:
        x_local = _shard(x_full, 1, rank, size)
        dy_local = _shard(dy_full, 0, rank, size) if cfg.sp else dy_full.clone()

    def build():
        m = _make(cfg.kind, K, N, dtype, tensor_parallel_mode=cfg.mode,
                  tensor_parallel_group=group, sequence_parallel=cfg.sp)
        assert tuple(m.weight.shape) == tuple(w_local.shape), (
            f"local weight shape {list(m.weight.shape)}, expected {list(w_local.shape)}")
        with torch.no_grad():
            m.weight.copy_(w_local)
            if cfg.kind == "linear":
                assert tuple(m.bias.shape) == tuple(b_local.shape), (
                    f"local bias shape {list(m.bias.shape)}, expected {list(b_local.shape)}")
                m.bias.copy_(b_local)
        return m

    got = _run(build(), x_local.clone().requires_grad_(), dy_local.clone(), cfg.fp8)
    runs = [("eager", got)]
    if cfg.backend != "eager":
        torch._dynamo.reset()
        comp = _run(build(), x_local.clone().requires_grad_(), dy_local.clone(), cfg.fp8,
                    cfg.backend)
        torch._dynamo.reset()
        if cfg.backend == "aot_eager":
            for name, a, b in zip(("y", "dx", "dW", "db"), comp, got):
                if b is None:
                    assert a is None, f"compiled {name}: a gradient where eager has none"
                else:
                    torch.testing.assert_close(a, b, **COMPILED_VS_EAGER,
                                               msg=lambda m, n=name: f"compiled {n}: {m}")
        runs.append((cfg.backend, comp))

    for label, (y, dx, dw, db) in runs:
        # the full tensors from the shards
        if col:
            y = _gather(y, -1)
            dx = _gather(dx, 0) if cfg.sp else dx
            dw = _gather(dw, 0)
            db = None if db is None else _gather(db, 0)
        else:
            y = _gather(y, 0) if cfg.sp else y
            dx = _gather(dx, -1)
            dw = _gather(dw, 1)
            # db is the full db on every rank
        _compare(f"{label} y", y, ref_y, dtype, cfg.fp8, "forward")
        _compare(f"{label} dx", dx, ref_dx, dtype, cfg.fp8, "backward")
        _compare(f"{label} dW", dw, ref_dw, dtype, cfg.fp8, "backward")
        if cfg.kind == "linear":
            _compare(f"{label} db", db, ref_db, dtype, cfg.fp8, "backward")
        else:
            assert db is None


# ---- Megatron-style block ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BlockConfig:
    dtype: str
    backend: str
    fp8: bool

    @property
    def id(self) -> str:
        return f"block-{self.dtype}-{self.backend}-{'fp8' if self.fp8 else 'hp'}"


BLOCK_CONFIGS = [BlockConfig("fp32", "eager", False), BlockConfig("bf16", "eager", False),
                 BlockConfig("fp32", "aot_eager", False), BlockConfig("fp32", "eager", True)]
HIDDEN, FFN, SEQ, STEPS, LR = 32, 64, 16, 3, 0.1


def _block(dtype, group=None):
    """[residual fork] LayerNorm, Linear (column, SP), GELU, Linear (row, SP) [residual join];
    single process when group is None."""
    tp = {} if group is None else dict(tensor_parallel_group=group, sequence_parallel=True)
    fork = te.ops.MakeExtraOutput().set_extra_output_channel(0, "residual",
                                                             output_to_caller=False)
    join = te.ops.AddExtraInput().set_extra_input_channel(0, "residual")
    return te.ops.Sequential(
        fork, te.ops.LayerNorm(HIDDEN, dtype=dtype),
        te.ops.Linear(HIDDEN, FFN, dtype=dtype,
                      tensor_parallel_mode=None if group is None else "column", **tp),
        te.ops.GELU(),
        te.ops.Linear(FFN, HIDDEN, dtype=dtype,
                      tensor_parallel_mode=None if group is None else "row", **tp),
        join)


def _check_block(rank: int, world: int, cfg: BlockConfig) -> None:
    """SGD for STEPS steps: the loss (summed over ranks) equals the single-process loss at every
    step. Sequence parallelism leaves LayerNorm's parameters replicated with partial gradients
    (the rank's tokens), so they are all-reduced as Megatron does; the row-parallel bias of
    every rank gets the full db (TransformerEngine's convention) while the effective bias is
    their sum, so its gradient is divided by the group size to take the single-process step."""
    dtype = DTYPES[cfg.dtype]
    size = world
    ref, tp = _block(dtype), _block(dtype, dist.group.WORLD)
    with torch.no_grad():
        ln, fc1, fc2 = ref[1], ref[2], ref[4]
        ln.weight.copy_(1.0 + 0.1 * _rand(20, HIDDEN, dtype=dtype))
        ln.bias.copy_(0.1 * _rand(21, HIDDEN, dtype=dtype))
        fc1.weight.copy_(_rand(22, FFN, HIDDEN, dtype=dtype) - 0.5)
        fc1.bias.copy_(_rand(23, FFN, dtype=dtype) - 0.5)
        fc2.weight.copy_(_rand(24, HIDDEN, FFN, dtype=dtype) - 0.5)
        fc2.bias.copy_(_rand(25, HIDDEN, dtype=dtype) - 0.5)
        tln, tfc1, tfc2 = tp[1], tp[2], tp[4]
        tln.weight.copy_(ln.weight)
        tln.bias.copy_(ln.bias)
        tfc1.weight.copy_(_shard(fc1.weight, 0, rank, size))
        tfc1.bias.copy_(_shard(fc1.bias, 0, rank, size))
        tfc2.weight.copy_(_shard(fc2.weight, 1, rank, size))
        tfc2.bias.copy_(fc2.bias / size)  # exact: size is a power of 2
    run_ref = ref if cfg.backend == "eager" else torch.compile(ref, backend=cfg.backend,
                                                              fullgraph=True)
    run_tp = tp if cfg.backend == "eager" else torch.compile(tp, backend=cfg.backend,
                                                            fullgraph=True)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=LR)
    opt_tp = torch.optim.SGD(tp.parameters(), lr=LR)
    for step in range(STEPS):
        x = _rand(30 + step, SEQ, HIDDEN, dtype=dtype)
        with _recipe_ctx(cfg.fp8):
            y_ref = run_ref(x)
            y_tp = run_tp(_shard(x, 0, rank, size))
        loss_ref = (y_ref.float() ** 2).mean()
        local = (y_tp.float() ** 2).sum() / y_ref.numel()
        loss_ref.backward()
        local.backward()
        loss_tp = local.detach().clone()
        dist.all_reduce(loss_tp)
        if cfg.fp8:
            err = _rel_err(loss_tp, loss_ref.detach())
            assert err < FP8_RELATIVE_ERROR["forward"], f"step {step}: loss relative error {err}"
        else:
            torch.testing.assert_close(loss_tp, loss_ref.detach(), **TOLERANCES[dtype],
                                       msg=lambda m, s=step: f"step {s} loss: {m}")
        for p in (tp[1].weight, tp[1].bias):
            dist.all_reduce(p.grad)
        tp[4].bias.grad /= size
        opt_ref.step()
        opt_tp.step()
        opt_ref.zero_grad(set_to_none=True)
        opt_tp.zero_grad(set_to_none=True)
    torch._dynamo.reset()


# ---- rank body: many configs in one spawn -------------------------------------------------------

def _body_configs(rank: int, world: int, configs: list) -> dict:
    """Runs every config; returns {config id: "ok" or the traceback}. A failing config does not
    stop the others: the comparisons run on gathered (identical) data, so a mismatch fails on
    every rank alike. After each config the ranks check that all of them finished that config
    (on a separate group, so a rank stuck in a collective of the failed config cannot match
    it); a rank out of step stops the run."""
    status_group = dist.new_group(backend="gloo")
    out = {}
    for i, cfg in enumerate(configs):
        try:
            torch.manual_seed(0)
            if isinstance(cfg, BlockConfig):
                _check_block(rank, world, cfg)
            elif isinstance(cfg, Config):
                _check_config(rank, world, cfg)
            else:
                _SPECIAL[cfg](rank, world)
            out[_id(cfg)] = "ok"
        except Exception:  # pylint: disable=broad-except
            out[_id(cfg)] = traceback.format_exc()
            torch._dynamo.reset()
        marks = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(marks, torch.tensor([i]), group=status_group)
        if any(int(m) != i for m in marks):
            raise RuntimeError(f"ranks out of step after config {_id(cfg)}: "
                               f"{[int(m) for m in marks]}\n{out[_id(cfg)]}")
    return out


def _id(cfg) -> str:
    return cfg if isinstance(cfg, str) else cfg.id


_RUNS: dict = {}


def _outcome(world: int, group: str, configs: list, deadline_s: float, cfg_id: str) -> None:
    """Runs the group once (cached), then fails with the config's tracebacks, if any."""
    key = (world, group)
    if key not in _RUNS:
        try:
            _RUNS[key] = ("ran", run_ranks(_body_configs, world, deadline_s, args=(configs,),
                                           env=RANK_ENV))
        except AssertionError as e:
            _RUNS[key] = ("aborted", str(e))
    state, payload = _RUNS[key]
    if state == "aborted":
        pytest.fail(f"the {world}-rank run of group {group!r} aborted before reporting "
                    f"(config {cfg_id} included):\n{payload}", pytrace=False)
    failures = [f"rank {r}:\n{res[cfg_id]}" for r, res in enumerate(payload)
                if res[cfg_id] != "ok"]
    if failures:
        pytest.fail(f"{cfg_id} on {world} ranks:\n" + "\n".join(failures), pytrace=False)


# ---- tests -------------------------------------------------------------------------------------

@pytest.mark.parametrize("world,group,cfg", [(w, g, c) for (w, g), cs in GROUPS.items()
                                             for c in cs],
                         ids=lambda v: v.id if isinstance(v, Config) else str(v))
def test_parallel_linear_matches_single_process(world, group, cfg):
    _outcome(world, group, GROUPS[(world, group)], DEADLINES_S[group], cfg.id)


@pytest.mark.parametrize("world", (2, 4))
@pytest.mark.parametrize("cfg", BLOCK_CONFIGS, ids=lambda c: c.id)
def test_megatron_block_training_loss_matches_single_process(world, cfg):
    _outcome(world, "block", BLOCK_CONFIGS, 240.0, cfg.id)


# ---- special cases (2 ranks, one spawn) ---------------------------------------------------------

def _tp_pair(rank, size, mode, sp, *, requires_grad_w=True, main_grad=False, K=IN_FEATURES,
             N=OUT_FEATURES, T=TOKENS, dtype=torch.float32, w_full=None):
    """(reference op, parallel op, x_full, x_local, dy_full, dy_local) for BasicLinear."""
    x_full, dy_full = _rand(1, T, K, dtype=dtype), _rand(3, T, N, dtype=dtype)
    w_full = _rand(2, N, K, dtype=dtype) if w_full is None else w_full
    ref = te.ops.BasicLinear(K, N, dtype=dtype, accumulate_into_main_grad=main_grad)
    tp = te.ops.BasicLinear(K, N, dtype=dtype, tensor_parallel_mode=mode,
                            tensor_parallel_group=dist.group.WORLD, sequence_parallel=sp,
                            accumulate_into_main_grad=main_grad)
    col = mode == "column"
    with torch.no_grad():
        ref.weight.copy_(w_full)
        tp.weight.copy_(_shard(w_full, 0 if col else 1, rank, size))
    ref.weight.requires_grad_(requires_grad_w)
    tp.weight.requires_grad_(requires_grad_w)
    if col:
        x_local = _shard(x_full, 0, rank, size) if sp else x_full.clone()
        dy_local = _shard(dy_full, 1, rank, size)
    else:
        x_local = _shard(x_full, 1, rank, size)
        dy_local = _shard(dy_full, 0, rank, size) if sp else dy_full.clone()
    return ref, tp, x_full, x_local, dy_full, dy_local


def _full_y(y, mode, sp):
    if mode == "column":
        return _gather(y, -1)
    return _gather(y, 0) if sp else y


def _full_dx(dx, mode, sp):
    if mode == "column":
        return _gather(dx, 0) if sp else dx
    return _gather(dx, -1)


def _full_dw(dw, mode):
    return _gather(dw, 0 if mode == "column" else 1)


FP32 = TOLERANCES[torch.float32]
MODES = [(m, sp) for m in ("column", "row") for sp in (False, True)]


def _special_frozen_weight(rank, world):
    for mode, sp in MODES:
        ref, tp, x, xl, dy, dyl = _tp_pair(rank, world, mode, sp, requires_grad_w=False)
        x, xl = x.requires_grad_(), xl.requires_grad_()
        y_ref, y = ref(x), tp(xl)
        y_ref.backward(dy)
        y.backward(dyl)
        assert tp.weight.grad is None, f"{mode} sp={sp}: a frozen weight got a gradient"
        torch.testing.assert_close(_full_y(y.detach(), mode, sp), y_ref.detach(), **FP32)
        torch.testing.assert_close(_full_dx(xl.grad, mode, sp), x.grad, **FP32)


def _special_input_needs_no_grad(rank, world):
    for mode, sp in MODES:
        ref, tp, x, xl, dy, dyl = _tp_pair(rank, world, mode, sp)
        y_ref, y = ref(x), tp(xl)
        y_ref.backward(dy)
        y.backward(dyl)
        assert xl.grad is None
        torch.testing.assert_close(_full_y(y.detach(), mode, sp), y_ref.detach(), **FP32)
        torch.testing.assert_close(_full_dw(tp.weight.grad, mode), ref.weight.grad, **FP32)


def _special_main_grad(rank, world):
    for mode, sp in MODES:
        ref, tp, x, xl, dy, dyl = _tp_pair(rank, world, mode, sp, main_grad=True)
        ref.weight.main_grad = torch.full_like(ref.weight, 0.5)
        tp.weight.main_grad = torch.full_like(tp.weight, 0.5)
        x, xl = x.requires_grad_(), xl.requires_grad_()
        ref(x).backward(dy)
        tp(xl).backward(dyl)
        assert tp.weight.grad is None, f"{mode} sp={sp}: weight.grad set besides main_grad"
        torch.testing.assert_close(_full_dw(tp.weight.main_grad, mode), ref.weight.main_grad,
                                   **FP32)
        torch.testing.assert_close(_full_dx(xl.grad, mode, sp), x.grad, **FP32)


def _special_group_of_one(rank, world):
    """A one-rank group turns tensor parallelism off: full-size weight, mode None, the same
    computation as the single-process op (bitwise)."""
    singles = [dist.new_group([r], backend="gloo") for r in range(world)]  # every rank makes all
    for mode, sp in MODES:
        x, dy = _rand(1, TOKENS, IN_FEATURES, dtype=torch.float32), _rand(3, TOKENS, OUT_FEATURES,
                                                                         dtype=torch.float32)
        ref = te.ops.BasicLinear(IN_FEATURES, OUT_FEATURES)
        one = te.ops.BasicLinear(IN_FEATURES, OUT_FEATURES, tensor_parallel_mode=mode,
                                 tensor_parallel_group=singles[rank], sequence_parallel=sp)
        assert one.tensor_parallel_mode is None, f"{mode}: {one.tensor_parallel_mode!r}"
        assert tuple(one.weight.shape) == (OUT_FEATURES, IN_FEATURES)
        with torch.no_grad():
            one.weight.copy_(ref.weight)
        xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        yr, yo = ref(xr), one(xo)
        yr.backward(dy)
        yo.backward(dy)
        for a, b in ((yo, yr), (xo.grad, xr.grad), (one.weight.grad, ref.weight.grad)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def _expect(exc_type, pattern, fn):
    try:
        fn()
    except exc_type as e:
        import re  # noqa: PLC0415
        assert re.search(pattern, str(e)), f"message {str(e)!r} does not match {pattern!r}"
        return
    raise AssertionError(f"no {exc_type.__name__} matching {pattern!r}")


def _special_errors(rank, world):
    g = dist.group.WORLD
    for cls in (te.ops.BasicLinear, te.ops.Linear):
        name = cls.__name__
        _expect(ValueError, rf"{name}.*out_features.*\b7\b.*\b{world}\b|{name}.*\b{world}\b.*\b7\b",
                lambda: cls(8, 7, tensor_parallel_mode="column", tensor_parallel_group=g))
        _expect(ValueError, rf"{name}.*in_features.*\b9\b.*\b{world}\b|{name}.*\b{world}\b.*\b9\b",
                lambda: cls(9, 8, tensor_parallel_mode="row", tensor_parallel_group=g))
        _expect(ValueError, rf"{name}.*tensor_parallel_mode.*diagonal",
                lambda: cls(8, 8, tensor_parallel_mode="diagonal", tensor_parallel_group=g))
    # row + sequence parallel: the output's dim 0 (3 tokens) does not divide by 2 ranks
    for op in (te.ops.BasicLinear(8, 4, tensor_parallel_mode="row", tensor_parallel_group=g,
                                  sequence_parallel=True),
               te.ops.Linear(8, 4, tensor_parallel_mode="row", tensor_parallel_group=g,
                             sequence_parallel=True)):
        x = torch.rand(3, 8 // world)
        _expect(Exception, r"(BasicLinear|Linear|ReduceScatter).*\[3, 4\]", lambda: op(x))
    dist.barrier()


def _special_delayed_scaling(rank, world):
    """After one step under DelayedScaling every rank's scales are those of the full tensors'
    amaxes: the amaxes are reduced over the world group (autocast's amax_reduction_group)."""
    margin, fwd_max, bwd_max = 2, 448.0, 57344.0
    for mode in ("column", "row"):
        K, N = IN_FEATURES, OUT_FEATURES
        x = torch.randn(TOKENS, K, generator=torch.Generator().manual_seed(5))
        w = torch.randn(N, K, generator=torch.Generator().manual_seed(6))
        dy = torch.randn(TOKENS, N, generator=torch.Generator().manual_seed(7))
        col = mode == "column"
        wl = _shard(w, 0 if col else 1, rank, world)
        xl = x.clone() if col else _shard(x, 1, rank, world)
        dyl = _shard(dy, 1, rank, world) if col else dy.clone()
        local = [t.abs().max() for t in (xl, wl, dyl)]
        full = [t.abs().max() for t in (x, w, dy)]
        # the test can fail: some rank's shards miss the full amax
        lower = torch.tensor([float(sum(a < f for a, f in zip(local, full)))])
        dist.all_reduce(lower)
        assert lower.item() > 0
        op = te.ops.BasicLinear(K, N, tensor_parallel_mode=mode,
                                tensor_parallel_group=dist.group.WORLD)
        with torch.no_grad():
            op.weight.copy_(wl)
        recipe = te.recipe.DelayedScaling(margin=margin, amax_history_len=31,
                                          amax_compute_algo="max")
        xl.requires_grad_()
        with te.autocast(recipe=recipe):
            y = op(xl)
        y.backward(dyl)
        expected = [fwd_max / full[0] / 2 ** margin, fwd_max / full[1] / 2 ** margin,
                    bwd_max / full[2] / 2 ** margin]
        got = [op.get_quantizer("forward", 0).scale, op.get_quantizer("forward", 1).scale,
               op.get_quantizer("backward", 0).scale]
        for name, g_, e in zip(("x", "w", "dy"), got, expected):
            torch.testing.assert_close(g_.reshape(()).float(), e.float(),
                                       msg=lambda m, n=name: f"{mode} {n} scale: {m}")


def _special_fp8_shared_scales(rank, world):
    """Column+SP forward and row+SP dgrad under Float8CurrentScaling, with the full weight's max
    |w| planted in every shard: every scale equals the single process's (the gathered input's,
    resp. grad output's, amax is reduced over the group), so the results are its slices to
    1 ulp."""
    K, N, T = IN_FEATURES, OUT_FEATURES, TOKENS
    eps = torch.finfo(torch.float32).eps
    for mode in ("column", "row"):
        w = _rand(2, N, K, dtype=torch.float32)
        wmax = w.abs().max() * 1.5
        for r in range(world):
            if mode == "column":
                w[r * (N // world), 0] = wmax
            else:
                w[0, r * (K // world)] = wmax
        ref, tp, x, xl, dy, dyl = _tp_pair(rank, world, mode, True, w_full=w)
        # a rank's sequence chunk misses the full tensor's amax: plant it on rank 0's chunk
        # only, so a per-rank scale differs from the single process's
        x[0, 0] = 4.0
        dy[0, 0] = 4.0
        xl = _shard(x, 0, rank, world) if mode == "column" else _shard(x, 1, rank, world)
        dyl = _shard(dy, 1, rank, world) if mode == "column" else _shard(dy, 0, rank, world)
        x, xl = x.requires_grad_(), xl.requires_grad_()
        recipe = te.recipe.Float8CurrentScaling()
        with te.autocast(recipe=recipe):
            y_ref, y = ref(x), tp(xl)
        y_ref.backward(dy)
        y.backward(dyl)
        if mode == "column":
            torch.testing.assert_close(_full_y(y.detach(), mode, True), y_ref.detach(),
                                       rtol=eps, atol=0, msg=lambda m: f"column+SP y: {m}")
        else:
            torch.testing.assert_close(_full_dx(xl.grad, mode, True), x.grad, rtol=eps, atol=0,
                                       msg=lambda m: f"row+SP dx: {m}")


def _special_realistic_size(rank, world):
    """4096 tokens x 1024 hidden, column+SP then row+SP, fp32 eager."""
    T, H, F = 4096, 1024, 1024
    x = _rand(40, T, H, dtype=torch.float32)
    dy = _rand(41, T, H, dtype=torch.float32)
    w1, w2 = _rand(42, F, H, dtype=torch.float32), _rand(43, H, F, dtype=torch.float32)
    ref = te.ops.Sequential(te.ops.BasicLinear(H, F), te.ops.BasicLinear(F, H))
    g = dist.group.WORLD
    tp = te.ops.Sequential(
        te.ops.BasicLinear(H, F, tensor_parallel_mode="column", tensor_parallel_group=g,
                           sequence_parallel=True),
        te.ops.BasicLinear(F, H, tensor_parallel_mode="row", tensor_parallel_group=g,
                           sequence_parallel=True))
    with torch.no_grad():
        ref[0].weight.copy_(w1)
        ref[1].weight.copy_(w2)
        tp[0].weight.copy_(_shard(w1, 0, rank, world))
        tp[1].weight.copy_(_shard(w2, 1, rank, world))
    xr, xl = x.clone().requires_grad_(), _shard(x, 0, rank, world).requires_grad_()
    y_ref, y = ref(xr), tp(xl)
    y_ref.backward(dy)
    y.backward(_shard(dy, 0, rank, world))
    torch.testing.assert_close(_gather(y.detach(), 0), y_ref.detach(), **FP32)
    torch.testing.assert_close(_gather(xl.grad, 0), xr.grad, **FP32)
    torch.testing.assert_close(_gather(tp[0].weight.grad, 0), ref[0].weight.grad, **FP32)
    torch.testing.assert_close(_gather(tp[1].weight.grad, 1), ref[1].weight.grad, **FP32)


def _special_edge_inputs(rank, world):
    """Per mode: a non-contiguous local input (a transposed view) gives the contiguous one's
    results; under inference_mode the output equals the grad-mode one bitwise; zero tokens give
    empty outputs and input grads and zero weight grads."""
    for mode, sp in MODES:
        ref, tp, x, xl, dy, dyl = _tp_pair(rank, world, mode, sp)
        xnc = xl.t().contiguous().t().requires_grad_()
        assert not xnc.is_contiguous()
        y_ref, y = ref(x.requires_grad_()), tp(xnc)
        y_ref.backward(dy)
        y.backward(dyl)
        torch.testing.assert_close(_full_y(y.detach(), mode, sp), y_ref.detach(), **FP32)
        torch.testing.assert_close(_full_dx(xnc.grad, mode, sp), x.grad, **FP32)
        torch.testing.assert_close(_full_dw(tp.weight.grad, mode), ref.weight.grad, **FP32)
        with torch.inference_mode():
            y_inf = tp(xl.detach())
        torch.testing.assert_close(y_inf, y.detach(), rtol=0, atol=0)
        tp.weight.grad = None
        x0 = xl[:0].detach().requires_grad_()
        y0 = tp(x0)
        y0.backward(torch.ones_like(y0))
        assert y0.shape[0] == 0 and x0.grad.shape == x0.shape, f"{mode} sp={sp}"
        assert torch.count_nonzero(tp.weight.grad) == 0, f"{mode} sp={sp}"


def _special_fp16(rank, world):
    """fp16, column mode without sequence parallelism (no fp16 partial sums are reduced): y and
    dW against a float64 reference within the fp16 tolerance."""
    ref, tp, x, xl, dy, dyl = _tp_pair(rank, world, "column", False, dtype=torch.float16)
    xr = x.double().requires_grad_()
    wr = ref.weight.detach().double().requires_grad_()
    y_ref = xr @ wr.t()
    y_ref.backward(dy.double())
    xl.requires_grad_()
    y = tp(xl)
    y.backward(dyl)
    fp16 = TOLERANCES[torch.float16]
    torch.testing.assert_close(_full_y(y.detach(), "column", False).double(), y_ref.detach(),
                               **fp16)
    torch.testing.assert_close(_full_dw(tp.weight.grad, "column").double(), wr.grad, **fp16)


def _special_bias_only_training(rank, world):
    """Linear with a frozen weight and a trained bias, per mode: the bias gradient (row mode:
    each rank's full-size bias gets the full db) and dx equal the single process's."""
    for mode, sp in MODES:
        g = dist.group.WORLD
        ref = te.ops.Linear(IN_FEATURES, OUT_FEATURES)
        tp = te.ops.Linear(IN_FEATURES, OUT_FEATURES, tensor_parallel_mode=mode,
                           tensor_parallel_group=g, sequence_parallel=sp)
        w, b = _rand(2, OUT_FEATURES, IN_FEATURES, dtype=torch.float32), _rand(
            4, OUT_FEATURES, dtype=torch.float32)
        col = mode == "column"
        with torch.no_grad():
            ref.weight.copy_(w)
            ref.bias.copy_(b)
            tp.weight.copy_(_shard(w, 0 if col else 1, rank, world))
            tp.bias.copy_(_shard(b, 0, rank, world) if col else b / world)
        for op in (ref, tp):
            op.weight.requires_grad_(False)
        x, dy = _rand(1, TOKENS, IN_FEATURES, dtype=torch.float32), _rand(
            3, TOKENS, OUT_FEATURES, dtype=torch.float32)
        if col:
            xl = _shard(x, 0, rank, world) if sp else x.clone()
            dyl = _shard(dy, 1, rank, world)
        else:
            xl = _shard(x, 1, rank, world)
            dyl = _shard(dy, 0, rank, world) if sp else dy.clone()
        xr, xl = x.requires_grad_(), xl.requires_grad_()
        ref(xr).backward(dy)
        tp(xl).backward(dyl)
        assert tp.weight.grad is None
        db = _gather(tp.bias.grad, 0) if col else tp.bias.grad
        torch.testing.assert_close(db, ref.bias.grad, **FP32)
        torch.testing.assert_close(_full_dx(xl.grad, mode, sp), xr.grad, **FP32)


def _special_in_place_residual(rank, world):
    """The Megatron block with an in-place residual (MakeExtraOutput / AddExtraInput with
    in_place=True) beside the linears that save their inputs: output and input gradient equal
    the single process's."""
    def block(parallel):
        kw1 = dict(tensor_parallel_mode="column", sequence_parallel=True) if parallel else {}
        kw2 = dict(tensor_parallel_mode="row", sequence_parallel=True) if parallel else {}
        return te.ops.Sequential(
            te.ops.MakeExtraOutput(in_place=True).set_extra_output_channel(
                0, "residual", output_to_caller=False),
            te.ops.LayerNorm(H),
            te.ops.Linear(H, F, **kw1), te.ops.GELU(), te.ops.Linear(F, H, **kw2),
            te.ops.AddExtraInput(in_place=True).set_extra_input_channel(0, "residual"))
    T, H, F = TOKENS, IN_FEATURES, 2 * IN_FEATURES
    x, dy = _rand(5, T, H, dtype=torch.float32), _rand(6, T, H, dtype=torch.float32)
    ref, tp = block(False), block(True)
    with torch.no_grad():
        ref[2].bias.copy_(_rand(7, F, dtype=torch.float32))
        ref[4].bias.copy_(_rand(8, H, dtype=torch.float32))
        tp[2].weight.copy_(_shard(ref[2].weight, 0, rank, world))
        tp[2].bias.copy_(_shard(ref[2].bias, 0, rank, world))
        tp[4].weight.copy_(_shard(ref[4].weight, 1, rank, world))
        tp[4].bias.copy_(ref[4].bias / world)
    xr, xl = x.clone().requires_grad_(), _shard(x, 0, rank, world).requires_grad_()
    y_ref, y = ref(xr), tp(xl)
    y_ref.backward(dy)
    y.backward(_shard(dy, 0, rank, world))
    torch.testing.assert_close(_gather(y.detach(), 0), y_ref.detach(), **FP32)
    torch.testing.assert_close(_gather(xl.grad, 0), xr.grad, **FP32)
    torch.testing.assert_close(_gather(tp[2].weight.grad, 0), ref[2].weight.grad, **FP32)


_SPECIAL = {
    "edge_inputs": _special_edge_inputs,
    "fp16_column": _special_fp16,
    "bias_only_training": _special_bias_only_training,
    "in_place_residual": _special_in_place_residual,
    "frozen_weight": _special_frozen_weight,
    "input_needs_no_grad": _special_input_needs_no_grad,
    "accumulate_into_main_grad": _special_main_grad,
    "group_of_one_is_no_tp": _special_group_of_one,
    "errors": _special_errors,
    "delayed_scaling_amax_reduction": _special_delayed_scaling,
    "fp8_current_scaling_shared_scales": _special_fp8_shared_scales,
    "realistic_size": _special_realistic_size,
}


@pytest.mark.parametrize("name", list(_SPECIAL))
def test_special_case_on_2_ranks(name):
    _outcome(2, "special", list(_SPECIAL), 180.0, name)
