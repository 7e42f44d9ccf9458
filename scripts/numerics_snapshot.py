"""Bitwise snapshot of the activation and normalisation kernels, to check that a change of the
kernels' code leaves their numerics exactly as they were.

    python scripts/numerics_snapshot.py save OUT.pt          # run every op, save the outputs
    python scripts/numerics_snapshot.py compare A.pt B.pt    # compare two snapshots bit by bit

Run `save` once with each build (e.g. PYTHONPATH=<tree> for two checkouts), then `compare`.
Every activation (unary, gated with halves and interleaved, scaled, bias_act_fwd, dbias_d<act>,
the linear_bias_act_fwd epilogue) and every norm op (LayerNorm, RMSNorm, rmsnorm_bwd_add,
L2Normalization), forward and backward, in fp32, fp64, bf16 and fp16, on widths that leave row
tails (1, 7, 33, 1000, ...) and on rows holding NaN, +-inf, +-0, denormals and large values.
Outputs are compared through their bit patterns (so NaN payloads count and NaN equals itself),
and with torch.equal for the report.
"""

from __future__ import annotations

import sys

import torch

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
WIDTHS = [1, 7, 8, 16, 33, 1000]
ROWS = 4
UNARY = ["gelu", "relu", "silu", "qgelu", "srelu"]
GATED = ["glu", "geglu", "qgeglu", "reglu", "sreglu", "swiglu"]
# gated activations with parameters: (stem, extra float arguments before glu_interleave_size)
GATED_PARAMS = [("clamped_swiglu", (7.0, 1.702, 1.0)), ("situglu", (1.5, 0.75))]
SCALED = [("scaled_swiglu", ()), ("scaled_clamped_qgeglu", (7.0, 1.702, 1.0)),
          ("scaled_situglu", (1.5, 0.75))]
SPECIALS = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-39, -1e-39, 88.8, -88.8,
            1e4, -1e4, 20.0, -20.0, 7.0, -7.0, 0.5]


def make(shape, dtype, seed, specials=True, scale=3.0):
    """Random values; with `specials`, row 1 gets the special values (cycled) at every third
    column, so rows 0, 2, ... stay finite (a NaN in a norm's row makes that whole row NaN)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    if specials and x.dim() >= 2 and x.shape[-2] > 1:
        row = x.reshape(-1, x.shape[-2], x.shape[-1])[:, 1]
        for j in range(0, row.shape[-1], 3):
            row[:, j] = SPECIALS[(j // 3) % len(SPECIALS)]
    return x.to(dtype)


def interleaves(n):
    """glu_interleave_size values valid for a gated width n (0: halves)."""
    return [0] + [s for s in (1, 3, 4, 8) if s < n // 2 and n % (2 * s) == 0]


def snapshot():
    import transformer_engine_cpp  # noqa: F401  (loads the ops)

    ops = torch.ops.te_cpp
    out = {}
    seed = 0

    def rnd(shape, dtype, **kw):
        nonlocal seed
        seed += 1
        return make(shape, dtype, seed, **kw)

    for dt in DTYPES:
        d = str(dt).split(".")[-1]
        for n in WIDTHS:
            x = rnd((ROWS, n), dt)
            dy = rnd((ROWS, n), dt, specials=False)
            dy_sp = rnd((ROWS, n), dt)
            bias = rnd((n,), dt, specials=False)
            for a in UNARY:
                key = f"{a}/{d}/{n}"
                out[f"{key}/fwd"] = getattr(ops, f"{a}_fwd")(x)
                out[f"{key}/bwd"] = getattr(ops, f"{a}_bwd")(dy, x)
                out[f"{key}/bwd_dy_special"] = getattr(ops, f"{a}_bwd")(dy_sp, x)
                out[f"{key}/bias_act"] = ops.bias_act_fwd(x, bias, a)
                for bd in (torch.float32, dt):
                    b = str(bd).split(".")[-1]
                    dx, db = getattr(ops, f"dbias_d{a}")(dy, x, bd)
                    out[f"{key}/dbias_dact/{b}/dx"], out[f"{key}/dbias_dact/{b}/db"] = dx, db
                    dx, db = getattr(ops, f"dbias_d{a}")(dy, x, bd, bias)
                    out[f"{key}/dbias_dact_bias/{b}/dx"] = dx
                    out[f"{key}/dbias_dact_bias/{b}/db"] = db
                if dt != torch.float16 or n > 1:
                    w = rnd((n, 5), dt, specials=False, scale=0.3)
                    xl = rnd((ROWS, 5), dt, specials=False)
                    y, z = ops.linear_bias_act_fwd(xl, w, bias, a)
                    out[f"{key}/linear_bias_act/y"], out[f"{key}/linear_bias_act/z"] = y, z
            scales = rnd((ROWS,), torch.float32, specials=False)
            out[f"scaled_srelu/{d}/{n}/fwd"] = ops.scaled_srelu_fwd(x, scales)
            for cd in (True, False):
                dx, ds = ops.scaled_srelu_bwd(dy, x, scales, cd)
                out[f"scaled_srelu/{d}/{n}/bwd/{cd}/dx"] = dx
                out[f"scaled_srelu/{d}/{n}/bwd/{cd}/ds"] = ds

            # gated: width 2n
            n2 = 2 * n
            x2 = rnd((ROWS, n2), dt)
            dyg = rnd((ROWS, n), dt, specials=False)
            dyg_sp = rnd((ROWS, n), dt)
            for s in interleaves(n2):
                for a, params in [(g, ()) for g in GATED] + GATED_PARAMS:
                    key = f"{a}/{d}/{n2}/s{s}"
                    out[f"{key}/fwd"] = getattr(ops, f"{a}_fwd")(x2, *params, s)
                    out[f"{key}/bwd"] = getattr(ops, f"{a}_bwd")(dyg, x2, *params, s)
                    out[f"{key}/bwd_dy_special"] = getattr(ops, f"{a}_bwd")(dyg_sp, x2, *params,
                                                                             s)
                for a, params in SCALED:
                    key = f"{a}/{d}/{n2}/s{s}"
                    out[f"{key}/fwd"] = getattr(ops, f"{a}_fwd")(x2, scales, *params, s)
                    for cd in (True, False):
                        dx, ds = getattr(ops, f"{a}_bwd")(dyg, x2, scales, cd, *params, s)
                        out[f"{key}/bwd/{cd}/dx"], out[f"{key}/bwd/{cd}/ds"] = dx, ds

            # norms
            w = rnd((n,), dt, specials=False, scale=0.5)
            b = rnd((n,), dt, specials=False, scale=0.5)
            de = rnd((ROWS, n), dt, specials=False)
            xz = x.clone()
            xz[2] = 0  # a zero row: rstd = 1 / sqrt(eps), L2's rnorm inf with eps = 0
            for zc in (False, True):
                for eps in (1e-5, 0.0):
                    key = f"norm/{d}/{n}/zc{int(zc)}/eps{eps}"
                    y, mu, rs = ops.layernorm_fwd(xz, w, b, eps, zc)
                    out[f"{key}/ln_fwd/y"], out[f"{key}/ln_fwd/mu"] = y, mu
                    out[f"{key}/ln_fwd/rs"] = rs
                    for tag, g in (("dy", dy), ("dy_special", dy_sp)):
                        dx, dw, db = ops.layernorm_bwd(g, xz, mu, rs, w, zc)
                        out[f"{key}/ln_bwd/{tag}/dx"], out[f"{key}/ln_bwd/{tag}/dw"] = dx, dw
                        out[f"{key}/ln_bwd/{tag}/db"] = db
                    y, rs = ops.rmsnorm_fwd(xz, w, eps, zc)
                    out[f"{key}/rms_fwd/y"], out[f"{key}/rms_fwd/rs"] = y, rs
                    for tag, g in (("dy", dy), ("dy_special", dy_sp)):
                        dx, dw = ops.rmsnorm_bwd(g, xz, rs, w, zc)
                        out[f"{key}/rms_bwd/{tag}/dx"], out[f"{key}/rms_bwd/{tag}/dw"] = dx, dw
                        dx, dw = ops.rmsnorm_bwd_add(g, xz, rs, w, zc, de)
                        out[f"{key}/rms_bwd_add/{tag}/dx"] = dx
                        out[f"{key}/rms_bwd_add/{tag}/dw"] = dw
            for eps in (1e-6, 0.0):
                key = f"l2/{d}/{n}/eps{eps}"
                y, rn = ops.l2normalization_fwd(xz, eps)
                out[f"{key}/fwd/y"], out[f"{key}/fwd/rn"] = y, rn
                for tag, g in (("dy", dy), ("dy_special", dy_sp)):
                    out[f"{key}/bwd/{tag}"] = ops.l2normalization_bwd(g, xz, rn)
        # leading dims and a multi-dim normalized shape
        x3 = rnd((2, 3, 2, 33), dt)
        w3 = rnd((2, 33), dt, specials=False)
        y, mu, rs = ops.layernorm_fwd(x3, w3, w3, 1e-5, False)
        out[f"norm/{d}/3d/ln_fwd/y"] = y
        dx, dw, db = ops.layernorm_bwd(x3, x3, mu, rs, w3, False)
        out[f"norm/{d}/3d/ln_bwd/dx"], out[f"norm/{d}/3d/ln_bwd/dw"] = dx, dw
        out[f"gelu/{d}/3d/fwd"] = ops.gelu_fwd(x3)
        out[f"swiglu/{d}/3d/fwd"] = ops.swiglu_fwd(x3[..., :32], 0)
        # enough elements for several threads (chunk boundaries inside rows)
        xb, dyb = rnd((67, 1001), dt), rnd((67, 1001), dt, specials=False)
        for a in UNARY:
            out[f"{a}/{d}/big/fwd"] = getattr(ops, f"{a}_fwd")(xb)
            out[f"{a}/{d}/big/bwd"] = getattr(ops, f"{a}_bwd")(dyb, xb)
        out[f"swiglu/{d}/big/fwd"] = ops.swiglu_fwd(xb[:, :1000], 0)
        out[f"swiglu/{d}/big/bwd"] = ops.swiglu_bwd(dyb[:, :500], xb[:, :1000], 0)
        y, mu, rs = ops.layernorm_fwd(xb, xb[0], xb[1], 1e-5, True)
        out[f"norm/{d}/big/ln_fwd/y"] = y
        out[f"norm/{d}/big/ln_bwd/dx"] = ops.layernorm_bwd(dyb, xb, mu, rs, xb[0], True)[0]
    return out


def bits(t):
    """The tensor's bit pattern as integers (NaN payloads included)."""
    itype = {8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]
    return t.contiguous().view(itype)


def compare(a, b):
    if a.keys() != b.keys():
        print(f"different keys: only in A {sorted(a.keys() - b.keys())[:5]}, "
              f"only in B {sorted(b.keys() - a.keys())[:5]}")
        return 1
    bad_bits, bad_equal, elems, nan_elems = [], 0, 0, 0
    for k in a:
        x, y = a[k], b[k]
        elems += x.numel()
        if x.is_floating_point():
            nan_elems += int(x.isnan().sum())
        same = x.dtype == y.dtype and x.shape == y.shape and torch.equal(bits(x), bits(y))
        if not same:
            bad_bits.append(k)
        # torch.equal is False on NaN, so compare it with NaNs replaced by the same value
        if not torch.equal(torch.nan_to_num(x, nan=0.0), torch.nan_to_num(y, nan=0.0)):
            bad_equal += 1
    print(f"{len(a)} outputs, {elems} elements ({nan_elems} NaN): "
          f"{len(a) - len(bad_bits)} bitwise identical, {len(bad_bits)} different; "
          f"torch.equal (NaN -> 0) differs on {bad_equal}")
    for k in bad_bits[:20]:
        diff = (bits(a[k]) != bits(b[k])).sum().item() if a[k].shape == b[k].shape else "shape"
        print(f"  {k}: {diff} element(s) differ")
    return 1 if bad_bits else 0


def main(argv):
    if len(argv) == 3 and argv[1] == "save":
        out = snapshot()
        torch.save(out, argv[2])
        print(f"saved {len(out)} outputs to {argv[2]} (torch {torch.__version__}, "
              f"{sys.modules['transformer_engine_cpp'].__file__})")
        return 0
    if len(argv) == 4 and argv[1] == "compare":
        return compare(torch.load(argv[2]), torch.load(argv[3]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
