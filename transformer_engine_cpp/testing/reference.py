"""Plain-PyTorch reference implementations of the ops, for tests and benchmarks.

Every function is written with ordinary differentiable torch ops, so gradients come from
torch.autograd; the tests evaluate them in float64 as the numerical ground truth. They follow
TransformerEngine's conventions (tanh GELU; gated activations gate the *first* half).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

# ---- unary activations ----------------------------------------------------------------------


def gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def qgelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def srelu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) ** 2


# ---- gated activations ----------------------------------------------------------------------


def split_gated(x: torch.Tensor, glu_interleave_size: Optional[int] = None):
    """(a, b) halves of the last dim; with an interleave size s the last dim is read as
    [n / 2s, 2, s] blocks and de-interleaved first."""
    if glu_interleave_size:
        s = glu_interleave_size
        n = x.shape[-1]
        x = x.reshape(*x.shape[:-1], n // (2 * s), 2, s).transpose(-2, -3)
        x = x.reshape(*x.shape[:-3], n)
    a, b = x.chunk(2, dim=-1)
    return a, b


def glu(x, glu_interleave_size=None):
    a, b = split_gated(x, glu_interleave_size)
    return torch.sigmoid(a) * b


def geglu(x, glu_interleave_size=None):
    a, b = split_gated(x, glu_interleave_size)
    return gelu(a) * b


def qgeglu(x, glu_interleave_size=None):
    a, b = split_gated(x, glu_interleave_size)
    return qgelu(a) * b


def reglu(x, glu_interleave_size=None):
    a, b = split_gated(x, glu_interleave_size)
    return relu(a) * b


def sreglu(x, glu_interleave_size=None):
    a, b = split_gated(x, glu_interleave_size)
    return srelu(a) * b


def swiglu(x, glu_interleave_size=None):
    a, b = split_gated(x, glu_interleave_size)
    return silu(a) * b


def clamped_swiglu(x, limit=7.0, alpha=1.702, glu_linear_offset=1.0, glu_interleave_size=None):
    a, b = split_gated(x, glu_interleave_size)
    a = torch.clamp(a, max=limit)
    b = torch.clamp(b, min=-limit, max=limit)
    return a * torch.sigmoid(alpha * a) * (b + glu_linear_offset)


def situglu(x, beta1=4.0, beta2=25.0, glu_interleave_size=None):
    a, b = split_gated(x, glu_interleave_size)
    return beta1 * torch.tanh(a / beta1) * torch.sigmoid(a) * (beta2 * torch.tanh(b / beta2))


# ---- scaled activations: y = scales[..., None] * act(x) ------------------------------------


def scaled_swiglu(x, scales, glu_interleave_size=None):
    return scales.unsqueeze(-1) * swiglu(x, glu_interleave_size)


def scaled_clamped_qgeglu(x, scales, limit=7.0, alpha=1.702, glu_linear_offset=1.0,
                          glu_interleave_size=None):
    """TransformerEngine's ScaledClampedQGeGLU uses ClampedSwiGLU's numerics."""
    return scales.unsqueeze(-1) * clamped_swiglu(x, limit, alpha, glu_linear_offset,
                                                 glu_interleave_size)


def scaled_situglu(x, scales, beta1=4.0, beta2=25.0, glu_interleave_size=None):
    return scales.unsqueeze(-1) * situglu(x, beta1, beta2, glu_interleave_size)


def scaled_srelu(x, scales):
    return scales.unsqueeze(-1) * srelu(x)


# ---- the other basic ops --------------------------------------------------------------------


def bias(x, b):
    return x + b


def constant_scale(x, scale: float):
    return x * scale


def l2normalization(x, eps: float = 1e-6):
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


# ---- reference models (the demo and the benchmarks share them) ------------------------------


class ResidualMLPBlock(torch.nn.Module):
    """Plain-PyTorch twin of the demo's residual block: x + fc2(act(fc1(x) + b1)) * scale."""

    def __init__(self, hidden: int, ffn: int, *, scale: float = 1.0, dtype=None, device=None):
        super().__init__()
        self.fc1 = torch.nn.Linear(hidden, ffn, bias=False, dtype=dtype, device=device)
        self.b1 = torch.nn.Parameter(torch.zeros(ffn, dtype=dtype, device=device))
        self.fc2 = torch.nn.Linear(ffn, hidden, bias=False, dtype=dtype, device=device)
        self.b2 = torch.nn.Parameter(torch.zeros(hidden, dtype=dtype, device=device))
        self.scale = scale

    def forward(self, x):
        h = gelu(self.fc1(x) + self.b1)
        return x + (self.fc2(h) + self.b2) * self.scale




# ---- normalisation --------------------------------------------------------------------------


def layer_norm(x, weight, bias, eps=1e-5, zero_centered_gamma=False):
    """LayerNorm over the trailing weight.shape dims (weight -> 1 + weight if zero-centred)."""
    gamma = 1 + weight if zero_centered_gamma else weight
    return F.layer_norm(x, tuple(weight.shape), gamma, bias, eps)


def rms_norm(x, weight, eps=1e-5, zero_centered_gamma=False):
    gamma = 1 + weight if zero_centered_gamma else weight
    dims = tuple(range(x.dim() - weight.dim(), x.dim()))
    return x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + eps) * gamma


# ---- linear ---------------------------------------------------------------------------------


def linear(x, weight, bias=None):
    y = x @ weight.t()
    return y if bias is None else y + bias


class PreNormMLP(torch.nn.Module):
    """Plain-PyTorch pre-norm residual MLP block: x + scale * fc2(act(fc1(LayerNorm(x)))), the
    twin of the te.ops block in examples/ and bench/ (act: tanh GELU, or SwiGLU with fc1 -> 2 *
    ffn; ``fc2_bias=False`` and ``scale`` give the demo's [..., BasicLinear, ConstantScale]
    ending)."""

    def __init__(self, hidden: int, ffn: int, *, activation: str = "gelu", residual: bool = True,
                 scale: float = 1.0, fc2_bias: bool = True, dtype=None, device=None):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.norm = torch.nn.LayerNorm(hidden, **kw)
        self.activation = activation
        self.residual = residual
        self.scale = scale
        fc1_out = 2 * ffn if activation == "swiglu" else ffn
        self.fc1 = torch.nn.Linear(hidden, fc1_out, **kw)
        self.fc2 = torch.nn.Linear(ffn, hidden, bias=fc2_bias, **kw)

    def forward(self, x):
        h = self.fc1(self.norm(x))
        h = swiglu(h) if self.activation == "swiglu" else gelu(h)
        y = self.fc2(h)
        if self.scale != 1.0:
            y = y * self.scale
        return x + y if self.residual else y


def te_prenorm_mlp(hidden: int, ffn: int, *, activation: str = "gelu", residual: bool = True,
                   dtype=None, in_place: bool = False):
    """The te.ops twin of PreNormMLP (same parameter order, so ``zip(plain.parameters(),
    ours.parameters())`` pairs them): [MakeExtraOutput,] LayerNorm, Linear, GELU | SwiGLU,
    Linear[, AddExtraInput], the residual carried by a channel (``in_place``: the two
    residual ops' flag)."""
    import transformer_engine_cpp as te  # noqa: PLC0415  (te imports nothing from testing)

    fc1_out = 2 * ffn if activation == "swiglu" else ffn
    act = {"gelu": te.ops.GELU, "swiglu": te.ops.SwiGLU}[activation]
    body = [te.ops.LayerNorm(hidden, dtype=dtype), te.ops.Linear(hidden, fc1_out, dtype=dtype),
            act(), te.ops.Linear(ffn, hidden, dtype=dtype)]
    if residual:
        fork = te.ops.MakeExtraOutput(in_place=in_place)
        join = te.ops.AddExtraInput(in_place=in_place)
        body = ([fork.set_extra_output_channel(0, "residual", output_to_caller=False)]
                + body + [join.set_extra_input_channel(0, "residual")])
    return te.ops.Sequential(*body)


class BiasActivation(torch.nn.Module):
    """act(x + bias): the plain twin of te.ops.Sequential(Bias, <activation>)."""

    def __init__(self, features: int, activation: str = "gelu", *, dtype=None, device=None):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(features, dtype=dtype, device=device))
        self.act = globals()[activation]

    def forward(self, x):
        return self.act(x + self.bias)


class Activation(torch.nn.Module):
    """One of this module's activation functions as a module (e.g. "swiglu")."""

    def __init__(self, activation: str):
        super().__init__()
        self.act = globals()[activation]

    def forward(self, x):
        return self.act(x)


class LinearWithSkip(torch.nn.Module):
    """(fc(x), x): the plain twin of te.ops.Sequential(MakeExtraOutput, Linear), whose backward
    adds the skip's gradient to the linear's dgrad (BackwardLinearAdd)."""

    def __init__(self, in_features: int, out_features: int, *, dtype=None, device=None):
        super().__init__()
        self.fc = torch.nn.Linear(in_features, out_features, dtype=dtype, device=device)

    def forward(self, x):
        return self.fc(x), x


# ---- FP8 ------------------------------------------------------------------------------------

E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448


def fp8_quantize_current_scaling(x: torch.Tensor):
    """Per-tensor current scaling to E4M3, as te_cpp.fp8_quantize computes it (no epsilon, no
    power-of-2 scales): returns (data as uint8, scale_inv [1], amax [1]). The amax skips NaN
    elements (TransformerEngine's fmaxf reduction): a NaN changes only its own code."""
    xf = x.float()
    amax = torch.where(torch.isnan(xf), torch.zeros((), dtype=xf.dtype), xf.abs()).amax()
    one = torch.ones_like(amax)
    # tensor / tensor: one correctly rounded division (scalar / tensor would go through
    # reciprocal(), which is not)
    scale = torch.where((amax > 0) & torch.isfinite(amax), (one * E4M3_MAX) / amax, one)
    data = (xf * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return data, (one / scale).reshape(1), amax.reshape(1)


def fp8_block_quantize_reference(x: torch.Tensor, block_dim: int):
    """Float8BlockScaling (E4M3, power-of-two scales, no epsilon) as te_cpp.fp8_block_quantize
    computes it, for a 2-D x whose sizes are multiples of 128: per 1x128 (block_dim 1) or
    128x128 (block_dim 2) block, the NaN-skipping amax, scale = fp8_max / amax in fp32 (1 for
    an amax of 0 or inf; an infinite quotient becomes the input dtype's largest finite value,
    fp32's for fp32) with its exponent bits only, data = x * scale saturated and cast.
    Returns (data as uint8, scale_inv fp32 [M, K / 128] or [M / 128, K / 128])."""
    M, K = x.shape
    xf = x.float()
    mag = torch.where(torch.isnan(xf), torch.zeros((), dtype=xf.dtype), xf.abs())
    if block_dim == 1:
        amax = mag.reshape(M, K // 128, 128).amax(dim=-1)
    else:
        amax = mag.reshape(M // 128, 128, K // 128, 128).amax(dim=(1, 3))
    one = torch.ones_like(amax)
    big = torch.finfo(x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.float32)
    scale = (one * E4M3_MAX) / amax
    scale = torch.where(torch.isinf(scale), one * big.max, scale)
    scale = (scale.view(torch.int32) & -(1 << 23)).view(torch.float32)  # sign and exponent
    scale = torch.where((amax == 0) | torch.isinf(amax), one, scale)
    full = scale.repeat_interleave(128, dim=-1)
    if block_dim == 2:
        full = full.repeat_interleave(128, dim=0)
    data = (xf * full).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return data, one / scale


def nvfp4_quantize_reference(x: torch.Tensor):
    """NVFP4 (1-D blocks of 16, round to nearest even, no transform) as te_cpp.nvfp4_quantize
    computes it, for a 2-D x: the NaN-skipping tensor amax, S_enc = 448 * 6 / amax in fp32 (at
    most FLT_MAX; 1 for an amax of 0 or inf), per block the E4M3 scale of block_amax * (S_enc *
    float(1/6)) and the multiplier 1 / (scale * (1 / S_enc)) (at most FLT_MAX), the E2M1 codes
    of x * multiplier (ties to even, saturating, NaN 7, the sign in bit 3), two per byte.
    Returns (data uint8 [M, K / 2], scales uint8 [M, K / 16], amax fp32 [1])."""
    M, K = x.shape
    big = torch.finfo(torch.float32).max
    v = x.float()
    mag = torch.where(torch.isnan(v), torch.zeros((), dtype=v.dtype), v.abs())
    amax = mag.amax()
    s_enc = torch.tensor(448.0 * 6.0) / amax
    s_enc = torch.where(torch.isnan(s_enc) | (s_enc > big), big, s_enc)
    s_enc = torch.where((amax == 0) | (s_enc == 0), 1.0, s_enc)
    dec = mag.reshape(M, K // 16, 16).amax(-1) * (s_enc * torch.tensor(1.0 / 6.0))
    dec = torch.where(torch.isnan(dec) | (dec > big), big, dec)
    scale = dec.clamp(max=448.0).to(torch.float8_e4m3fn)
    enc = 1.0 / (scale.float() * (1.0 / s_enc))
    enc = torch.where(torch.isnan(enc) | (enc > big), big, enc)
    y = (v.reshape(M, K // 16, 16) * enc[..., None]).reshape(M, K)
    a = y.abs()
    code = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int()
            + (a > 2.5).int() + (a >= 3.5).int() + (a > 5.0).int())
    code = code | (torch.signbit(y).int() << 3)
    code = torch.where(torch.isnan(y), 7, code)
    data = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    return data, scale.view(torch.uint8), amax.reshape(1)


def mxfp8_quantize_reference(x: torch.Tensor):
    """MXFP8 (E4M3) as te_cpp.mxfp8_quantize computes it: per block of 32 along the last dim,
    the NaN-ignoring block amax, TransformerEngine's E8M0 exponent (rounded up), data = x *
    2^(127 - e) saturated and cast. Returns (data as uint8, E8M0 scales as uint8 [..., n /
    32])."""
    xf = x.float().reshape(-1, 32)
    amax = torch.where(torch.isnan(xf), torch.zeros((), dtype=xf.dtype), xf.abs()).amax(dim=1)
    v = amax * torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32)
    bits = v.view(torch.int32)
    exp, mant = bits >> 23, bits & 0x7FFFFF
    up = (mant > 0) & (exp != 254) & ~((exp == 0) & (mant <= 0x400000))
    e = exp + up.to(torch.int32)
    e = torch.where(torch.isinf(v), torch.full_like(e, 254), e)
    rcp = torch.where(e == 0, torch.ones_like(v), ((254 - e) << 23).view(torch.float32))
    data = (xf * rcp[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (data.view(torch.uint8).reshape(x.shape),
            e.to(torch.uint8).reshape(*x.shape[:-1], x.shape[-1] // 32))
