// The one TORCH_LIBRARY(te_cpp, m) of the project: every operator schema, grouped by family.
//
// Rules (docs/architecture.md): outputs are fresh tensors, never an input or a view of one; a
// mutated argument is annotated Tensor(a!); output arity is fixed. Kernels are registered per
// dispatch key elsewhere (ops/*.cpp: Meta; kernels/cpu/*.cpp: CPU; kernels/cuda/*.cu: CUDA).
// No op is differentiable on its own: the Autograd key falls through, and gradients come only
// from the pipeline autograd.Function in transformer_engine_cpp/ops/fuser.py.
#include <torch/library.h>

#include <array>

namespace {

// Every op defined below, for the Autograd fallthrough.
constexpr std::array kOps = {
    // elementwise
    "bias_fwd", "bias_bwd", "constant_scale_fwd", "constant_scale_bwd",
    "add_extra_input_fwd", "add_extra_input_fwd_inplace",
    "make_extra_output_bwd", "make_extra_output_bwd_inplace",
    // unary activations and their fused dbias+dact backward
    "gelu_fwd", "gelu_bwd", "dbias_dgelu",
    "relu_fwd", "relu_bwd", "dbias_drelu",
    "silu_fwd", "silu_bwd", "dbias_dsilu",
    "qgelu_fwd", "qgelu_bwd", "dbias_dqgelu",
    "srelu_fwd", "srelu_bwd", "dbias_dsrelu",
    "bias_act_fwd",
    // gated activations
    "glu_fwd", "glu_bwd", "geglu_fwd", "geglu_bwd", "qgeglu_fwd", "qgeglu_bwd",
    "reglu_fwd", "reglu_bwd", "sreglu_fwd", "sreglu_bwd", "swiglu_fwd", "swiglu_bwd",
    "clamped_swiglu_fwd", "clamped_swiglu_bwd", "situglu_fwd", "situglu_bwd",
    // normalisation
    "layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd", "rmsnorm_bwd_add",
    // linear
    "linear_fwd", "linear_bias_act_fwd", "linear_fwd_add", "linear_fwd_add_inplace",
    "linear_dgrad", "linear_dgrad_add", "linear_wgrad", "linear_bwd",
    // scaled activations (per-row scales as an extra input)
    "scaled_swiglu_fwd", "scaled_swiglu_bwd", "scaled_clamped_qgeglu_fwd",
    "scaled_clamped_qgeglu_bwd", "scaled_situglu_fwd", "scaled_situglu_bwd",
    "scaled_srelu_fwd", "scaled_srelu_bwd",
    // L2Normalization
    "l2normalization_fwd", "l2normalization_bwd",
    // Dropout
    "dropout_fwd", "dropout_bwd",
    // quantize (FP8 per-tensor, MXFP8)
    "fp8_quantize", "fp8_quantize_scaled", "fp8_dequantize", "mxfp8_quantize",
    "mxfp8_dequantize",
};

}  // namespace

TORCH_LIBRARY(te_cpp, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};

  // ---- Bias, ConstantScale, AddExtraInput, MakeExtraOutput --------------------------------
  m.def("bias_fwd(Tensor x, Tensor bias) -> Tensor", tags);
  m.def("bias_bwd(Tensor dy, ScalarType bias_dtype) -> Tensor", tags);
  m.def("constant_scale_fwd(Tensor x, float scale) -> Tensor", tags);
  m.def("constant_scale_bwd(Tensor dy, float scale) -> Tensor", tags);
  m.def("add_extra_input_fwd(Tensor x, Tensor extra) -> Tensor", tags);
  m.def("add_extra_input_fwd_inplace(Tensor(a!) extra, Tensor x) -> ()", tags);
  m.def("make_extra_output_bwd(Tensor dy, Tensor dextra) -> Tensor", tags);
  m.def("make_extra_output_bwd_inplace(Tensor(a!) dextra, Tensor dy) -> ()", tags);

  // ---- Unary activations: y = act(x); dx = dy * act'(x); dbias_d<act>: (dx, sum_rows dx) ---
  // With `bias`, dbias_d<act> takes the bias op's input as x and recomputes the activation's
  // input z = x + bias (rounded as bias_fwd stores it) on the fly.
  for (const char* stem : {"gelu", "relu", "silu", "qgelu", "srelu"}) {
    const std::string s(stem);
    m.def((s + "_fwd(Tensor x) -> Tensor").c_str(), tags);
    m.def((s + "_bwd(Tensor dy, Tensor x) -> Tensor").c_str(), tags);
    m.def(("dbias_d" + s +
           "(Tensor dy, Tensor x, ScalarType bias_dtype, Tensor? bias=None) -> (Tensor, Tensor)")
              .c_str(),
          tags);
  }
  // ForwardBiasActivation: y = act(x + bias) in one pass (activation: gelu, relu, silu, qgelu,
  // srelu); the bias sum is rounded to the output dtype before the activation, as bias_fwd
  // followed by <act>_fwd would.
  m.def("bias_act_fwd(Tensor x, Tensor bias, str activation) -> Tensor", tags);

  // ---- Gated activations: y = act(a) * lin(b), (a, b) = halves (or interleaved runs) of x --
  for (const char* stem : {"glu", "geglu", "qgeglu", "reglu", "sreglu", "swiglu"}) {
    const std::string s(stem);
    m.def((s + "_fwd(Tensor x, int glu_interleave_size=0) -> Tensor").c_str(), tags);
    m.def((s + "_bwd(Tensor dy, Tensor x, int glu_interleave_size=0) -> Tensor").c_str(), tags);
  }
  m.def("clamped_swiglu_fwd(Tensor x, float limit, float alpha, float glu_linear_offset, "
        "int glu_interleave_size=0) -> Tensor",
        tags);
  m.def("clamped_swiglu_bwd(Tensor dy, Tensor x, float limit, float alpha, "
        "float glu_linear_offset, int glu_interleave_size=0) -> Tensor",
        tags);
  m.def("situglu_fwd(Tensor x, float beta1, float beta2, int glu_interleave_size=0) -> Tensor",
        tags);
  m.def("situglu_bwd(Tensor dy, Tensor x, float beta1, float beta2, "
        "int glu_interleave_size=0) -> Tensor",
        tags);

  // ---- Normalisation: x normalised over its trailing dims of weight's shape -----------------
  // mean / rstd: per-row statistics (leading dims), float32 (float64 for fp64 inputs).
  m.def("layernorm_fwd(Tensor x, Tensor weight, Tensor bias, float eps, "
        "bool zero_centered_gamma) -> (Tensor y, Tensor mean, Tensor rstd)",
        tags);
  m.def("layernorm_bwd(Tensor dy, Tensor x, Tensor mean, Tensor rstd, Tensor weight, "
        "bool zero_centered_gamma) -> (Tensor dx, Tensor dweight, Tensor dbias)",
        tags);
  m.def("rmsnorm_fwd(Tensor x, Tensor weight, float eps, bool zero_centered_gamma) "
        "-> (Tensor y, Tensor rstd)",
        tags);
  m.def("rmsnorm_bwd(Tensor dy, Tensor x, Tensor rstd, Tensor weight, "
        "bool zero_centered_gamma) -> (Tensor dx, Tensor dweight)",
        tags);
  // BackwardAddRMSNorm: dx = rmsnorm_dx + dextra (the residual branch's gradient), one pass.
  m.def("rmsnorm_bwd_add(Tensor dy, Tensor x, Tensor rstd, Tensor weight, "
        "bool zero_centered_gamma, Tensor dextra) -> (Tensor dx, Tensor dweight)",
        tags);

  // ---- Linear: y = x W^T (+ bias); weight [out, in]. GEMMs are ATen's / cuBLASLt's --------
  m.def("linear_fwd(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor", tags);
  // ForwardLinearBiasActivation: z = x W^T + bias, y = act(z) in the GEMM's epilogue pass;
  // z is returned for the activation's backward.
  m.def("linear_bias_act_fwd(Tensor x, Tensor weight, Tensor? bias, str activation) "
        "-> (Tensor y, Tensor act_input)",
        tags);
  // ForwardLinearBiasAdd / ForwardLinearScaleAdd: extra + alpha * (x W^T) + bias, the GEMM
  // accumulating into the residual (functional, and in place for eager mode).
  m.def("linear_fwd_add(Tensor x, Tensor weight, Tensor? bias, Tensor extra, float alpha=1.0) "
        "-> Tensor",
        tags);
  m.def("linear_fwd_add_inplace(Tensor(a!) extra, Tensor x, Tensor weight, Tensor? bias, "
        "float alpha=1.0) -> ()",
        tags);
  // dgrad dx = alpha * dy W; BackwardLinearAdd: dx = dextra + alpha * dy W.
  m.def("linear_dgrad(Tensor dy, Tensor weight, float alpha=1.0) -> Tensor", tags);
  m.def("linear_dgrad_add(Tensor dy, Tensor weight, Tensor dextra, float alpha=1.0) -> Tensor",
        tags);
  // wgrad dW = alpha * dy^T x.
  m.def("linear_wgrad(Tensor dy, Tensor x, float alpha=1.0) -> Tensor", tags);
  // The whole backward of a linear in one call: dx = alpha * dy W, dW = alpha * dy^T x, and
  // with a bias dtype dbias = dy summed over the leading dims (BackwardLinearBias; not scaled
  // by alpha); without one, dbias is an empty [0] tensor (fixed arity).
  m.def("linear_bwd(Tensor dy, Tensor x, Tensor weight, float alpha=1.0, "
        "ScalarType? bias_dtype=None) -> (Tensor dx, Tensor dweight, Tensor dbias)",
        tags);

  // ---- Scaled activations: y = scales[..., None] * act(x), scales of shape x.shape[:-1] -----
  // The backward returns (dx, dscales) with dscales[r] = sum_j dy[r, j] * act(x)[r, j]; with
  // compute_dscales=false the second output is an empty tensor of shape [0] (fixed arity).
  m.def("scaled_swiglu_fwd(Tensor x, Tensor scales, int glu_interleave_size=0) -> Tensor", tags);
  m.def("scaled_swiglu_bwd(Tensor dy, Tensor x, Tensor scales, bool compute_dscales, "
        "int glu_interleave_size=0) -> (Tensor, Tensor)",
        tags);
  m.def("scaled_clamped_qgeglu_fwd(Tensor x, Tensor scales, float limit, float alpha, "
        "float glu_linear_offset, int glu_interleave_size=0) -> Tensor",
        tags);
  m.def("scaled_clamped_qgeglu_bwd(Tensor dy, Tensor x, Tensor scales, bool compute_dscales, "
        "float limit, float alpha, float glu_linear_offset, int glu_interleave_size=0) "
        "-> (Tensor, Tensor)",
        tags);
  m.def("scaled_situglu_fwd(Tensor x, Tensor scales, float beta1, float beta2, "
        "int glu_interleave_size=0) -> Tensor",
        tags);
  m.def("scaled_situglu_bwd(Tensor dy, Tensor x, Tensor scales, bool compute_dscales, "
        "float beta1, float beta2, int glu_interleave_size=0) -> (Tensor, Tensor)",
        tags);
  m.def("scaled_srelu_fwd(Tensor x, Tensor scales) -> Tensor", tags);
  m.def("scaled_srelu_bwd(Tensor dy, Tensor x, Tensor scales, bool compute_dscales) "
        "-> (Tensor, Tensor)",
        tags);

  // ---- L2Normalization: y = x * rsqrt(sum(x^2 over the last dim) + eps) --------------------
  // The forward also returns rsqrt_norm (shape x.shape[:-1], fp32; fp64 for fp64 inputs),
  // which the backward takes with the forward's input.
  m.def("l2normalization_fwd(Tensor x, float eps) -> (Tensor, Tensor)", tags);
  m.def("l2normalization_bwd(Tensor dy, Tensor x, Tensor rsqrt_norm) -> Tensor", tags);

  // ---- Dropout (training): y = x * mask / (1 - p) ------------------------------------------
  // The keep mask (uint8, 0/1, x's shape) is a pure function of (seed, element index): a
  // counter-based Philox draw keyed by the int64 `seed` tensor, which the Python op draws from
  // torch's generator. Given its inputs the op is deterministic, so it is traced, partitioned
  // and CSE'd like any other op under torch.compile (docs/ops.md, Dropout).
  m.def("dropout_fwd(Tensor x, Tensor seed, float p) -> (Tensor, Tensor)", tags);
  m.def("dropout_bwd(Tensor dy, Tensor mask, float p) -> Tensor", tags);

  // ---- Quantize: FP8 as plain buffers, the format named by its torch dtype (fp8_dtype:
  // float8_e4m3fn or float8_e5m2; docs/fp8.md) -----------------------------------------------
  // Per-tensor current scaling (te_ops.md 4.3): data = uint8 bytes of the saturating RNE cast
  // of x * scale; scale_inv = 1 / scale and amax = max |x| (fp32, shape [1]).
  m.def("fp8_quantize(Tensor x, ScalarType fp8_dtype, bool force_pow_2_scales, "
        "float amax_epsilon) -> (Tensor data, Tensor scale_inv, Tensor amax)",
        tags);
  // Delayed scaling's cast with a given scale (fp32, shape [1]); amax is for the history.
  m.def("fp8_quantize_scaled(Tensor x, Tensor scale, ScalarType fp8_dtype) "
        "-> (Tensor data, Tensor scale_inv, Tensor amax)",
        tags);
  m.def("fp8_dequantize(Tensor data, Tensor scale_inv, ScalarType fp8_dtype, ScalarType dtype) "
        "-> Tensor",
        tags);
  // MXFP8: blocks of 32 consecutive elements of the last dim, one E8M0 scale (uint8 biased
  // exponent) per block; scale_e8m0 has x's shape with the last dim divided by 32.
  m.def("mxfp8_quantize(Tensor x, ScalarType fp8_dtype) -> (Tensor data, Tensor scale_e8m0)",
        tags);
  m.def("mxfp8_dequantize(Tensor data, Tensor scale_e8m0, ScalarType fp8_dtype, "
        "ScalarType dtype) -> Tensor",
        tags);
}

TORCH_LIBRARY_IMPL(te_cpp, Autograd, m) {
  for (const char* op : kOps) m.impl(op, torch::CppFunction::makeFallthrough());
}
