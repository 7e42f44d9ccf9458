// The one TORCH_LIBRARY(te_cpp, m) of the project: every operator schema, grouped by family.
//
// Rules (docs/architecture.md): outputs are fresh tensors, never an input or a view of one; a
// mutated argument is annotated Tensor(a!); output arity is fixed. Kernels are registered per
// dispatch key elsewhere (ops/*.cpp: Meta; kernels/cpu/*.cpp: CPU; kernels/cuda/*.cu: CUDA).
// No op is differentiable on its own: the Autograd key falls through, and gradients come only
// from the pipeline autograd.Function in transformer_engine_cpp/ops/fuser.py.
#include <torch/library.h>

#include <string>
#include <utility>
#include <vector>

#include "ops/activation_table.h"

namespace {

// Defines the op of `schema` (with the pt2_compliant_tag) and registers the Autograd
// fallthrough for it, so that no op can be defined without one: the Autograd key falls
// through to the backend kernel and outputs carry no grad_fn.
// `extra_tags` adds to it (nondeterministic_seeded for an op that draws from torch's generator).
void define(torch::Library& m, const std::string& schema,
            const std::vector<at::Tag>& extra_tags = {}) {
  std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  tags.insert(tags.end(), extra_tags.begin(), extra_tags.end());
  c10::FunctionSchema parsed = torch::schema(schema.c_str());
  const std::string name = parsed.name();
  m.def(std::move(parsed), std::as_const(tags));
  m.impl(name.c_str(), torch::dispatch(c10::DispatchKey::Autograd,
                                       torch::CppFunction::makeFallthrough()));
}

// The schemas of the activation family, one row of TE_ACTIVATION_TABLE at a time:
//   unary: <stem>_fwd(Tensor x<params>) -> Tensor: y = act(x);
//          <stem>_bwd(Tensor dy, Tensor x<params>) -> Tensor: dx = dy * act'(x);
//   gated: the same with `int glu_interleave_size=0` last: y = act(a) * lin(b), (a, b) the
//          halves (or interleaved runs of glu_interleave_size) of x's last dim;
//   DBIAS: dbias_d<stem>(dy, x, bias_dtype, bias=None) -> (dx, dbias), dbias = sum_rows dx.
//          With `bias`, x is the bias op's input and the activation's input z = x + bias is
//          recomputed on the fly (rounded as bias_fwd stores it);
//   SCALED: y = scales[..., None] * act(x), scales of shape x.shape[:-1]. The backward
//          returns (dx, dscales) with dscales[r] = sum_j dy[r, j] * act(x)[r, j]; with
//          compute_dscales=false the second output is an empty tensor of shape [0] (fixed
//          arity).
// <params>: `, float <name>` for each name of the row's PARAMS, in order.
void define_activations(torch::Library& m) {
  for (const te_cpp::ActInfo& a : te_cpp::kActInfo) {
    std::string args;  // ", float <param>" per name of PARAMS, then the interleave size
    for (const char* p = a.params; *p != '\0';) {
      if (*p == ',' || *p == ' ') {
        ++p;
        continue;
      }
      const char* end = p;
      while (*end != '\0' && *end != ',' && *end != ' ') ++end;
      args += ", float " + std::string(p, end);
      p = end;
    }
    if (a.gated) args += ", int glu_interleave_size=0";
    const std::string stem(a.stem);
    define(m, stem + "_fwd(Tensor x" + args + ") -> Tensor");
    define(m, stem + "_bwd(Tensor dy, Tensor x" + args + ") -> Tensor");
    if (a.dbias_dact) {
      define(m, "dbias_d" + stem +
                    "(Tensor dy, Tensor x, ScalarType bias_dtype, Tensor? bias=None) "
                    "-> (Tensor, Tensor)");
    }
    if (a.has_scaled()) {
      const std::string scaled(a.scaled);
      define(m, scaled + "_fwd(Tensor x, Tensor scales" + args + ") -> Tensor");
      define(m, scaled + "_bwd(Tensor dy, Tensor x, Tensor scales, bool compute_dscales" + args +
                    ") -> (Tensor, Tensor)");
    }
  }
}

}  // namespace

TORCH_LIBRARY(te_cpp, m) {
  // ---- Bias, ConstantScale, AddExtraInput, MakeExtraOutput --------------------------------
  define(m, "bias_fwd(Tensor x, Tensor bias) -> Tensor");
  define(m, "bias_bwd(Tensor dy, ScalarType bias_dtype) -> Tensor");
  define(m, "constant_scale_fwd(Tensor x, float scale) -> Tensor");
  define(m, "constant_scale_bwd(Tensor dy, float scale) -> Tensor");
  define(m, "add_extra_input_fwd(Tensor x, Tensor extra) -> Tensor");
  define(m, "add_extra_input_fwd_inplace(Tensor(a!) extra, Tensor x) -> ()");
  define(m, "make_extra_output_bwd(Tensor dy, Tensor dextra) -> Tensor");
  define(m, "make_extra_output_bwd_inplace(Tensor(a!) dextra, Tensor dy) -> ()");

  // ---- Activations: the rows of the activation table (ops/activation_table.h) -------------
  define_activations(m);
  // ForwardBiasActivation: y = act(x + bias) in one pass (activation: the stem of a table row
  // with BIAS_ACT); the bias sum is rounded to the output dtype before the activation, as
  // bias_fwd followed by <act>_fwd would.
  define(m, "bias_act_fwd(Tensor x, Tensor bias, str activation) -> Tensor");

  // ---- Normalisation: x normalised over its trailing dims of weight's shape -----------------
  // mean / rstd: per-row statistics (leading dims), float32 (float64 for fp64 inputs).
  define(m, "layernorm_fwd(Tensor x, Tensor weight, Tensor bias, float eps, "
            "bool zero_centered_gamma) -> (Tensor y, Tensor mean, Tensor rstd)");
  define(m, "layernorm_bwd(Tensor dy, Tensor x, Tensor mean, Tensor rstd, Tensor weight, "
            "bool zero_centered_gamma) -> (Tensor dx, Tensor dweight, Tensor dbias)");
  define(m, "rmsnorm_fwd(Tensor x, Tensor weight, float eps, bool zero_centered_gamma) "
            "-> (Tensor y, Tensor rstd)");
  define(m, "rmsnorm_bwd(Tensor dy, Tensor x, Tensor rstd, Tensor weight, "
            "bool zero_centered_gamma) -> (Tensor dx, Tensor dweight)");
  // BackwardAddRMSNorm: dx = rmsnorm_dx + dextra (the residual branch's gradient), one pass.
  define(m, "rmsnorm_bwd_add(Tensor dy, Tensor x, Tensor rstd, Tensor weight, "
            "bool zero_centered_gamma, Tensor dextra) -> (Tensor dx, Tensor dweight)");

  // ---- Linear: y = x W^T (+ bias); weight [out, in]. GEMMs are ATen's / cuBLASLt's --------
  define(m, "linear_fwd(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor");
  // ForwardLinearBiasActivation: z = x W^T + bias, y = act(z) in the GEMM's epilogue pass;
  // z is returned for the activation's backward.
  define(m, "linear_bias_act_fwd(Tensor x, Tensor weight, Tensor? bias, str activation) "
            "-> (Tensor y, Tensor act_input)");
  // ForwardLinearBiasAdd / ForwardLinearScaleAdd: extra + alpha * (x W^T) + bias, the GEMM
  // accumulating into the residual (functional, and in place for eager mode).
  define(m, "linear_fwd_add(Tensor x, Tensor weight, Tensor? bias, Tensor extra, float alpha=1.0) "
            "-> Tensor");
  define(m, "linear_fwd_add_inplace(Tensor(a!) extra, Tensor x, Tensor weight, Tensor? bias, "
            "float alpha=1.0) -> ()");
  // dgrad dx = alpha * dy W; BackwardLinearAdd: dx = dextra + alpha * dy W.
  define(m, "linear_dgrad(Tensor dy, Tensor weight, float alpha=1.0) -> Tensor");
  define(m, "linear_dgrad_add(Tensor dy, Tensor weight, Tensor dextra, float alpha=1.0) -> Tensor");
  // wgrad dW = alpha * dy^T x.
  define(m, "linear_wgrad(Tensor dy, Tensor x, float alpha=1.0) -> Tensor");
  // The whole backward of a linear in one call: dx = alpha * dy W, dW = alpha * dy^T x, and
  // with a bias dtype dbias = dy summed over the leading dims (BackwardLinearBias; not scaled
  // by alpha); without one, dbias is an empty [0] tensor (fixed arity).
  define(m, "linear_bwd(Tensor dy, Tensor x, Tensor weight, float alpha=1.0, "
            "ScalarType? bias_dtype=None) -> (Tensor dx, Tensor dweight, Tensor dbias)");
  // FP8 GEMM with per-tensor scales, TN: out = (a_scale_inv * a) (b_scale_inv * b)^T + bias
  // with a [..., k] and b [n, k] raw FP8 bytes (uint8), bias [n] in out_dtype (optional), fp32
  // accumulation, the bias added before the one rounding (docs/quantization.md).
  define(m, "fp8_gemm(Tensor a, Tensor a_scale_inv, ScalarType a_fp8_dtype, Tensor b, "
            "Tensor b_scale_inv, ScalarType b_fp8_dtype, ScalarType out_dtype, "
            "Tensor? bias=None) -> Tensor");
  // The same with MXFP8 operands, both blocked along k: a [..., k] with a_scale [..., k / 32],
  // b [n, k] with b_scale [n, k / 32] (E8M0, uint8); the exact emulation (fp32 values, fp32
  // accumulation, one rounding) on every device.
  define(m, "mxfp8_gemm(Tensor a, Tensor a_scale, ScalarType a_fp8_dtype, Tensor b, "
            "Tensor b_scale, ScalarType b_fp8_dtype, ScalarType out_dtype) -> Tensor");

  // ---- GroupedLinear: one weight per group of consecutive rows (TransformerEngine's
  // GroupedLinear). x [T, in] (callers flatten the leading dims); split_sizes int64 [G], G >= 1,
  // on any device, values >= 0 summing to T: group g owns the next split_sizes[g] rows. The
  // output shapes depend on the argument shapes only, so the ops trace without data-dependent
  // shapes; the real kernels read split_sizes on the host (a device tensor is copied: one
  // synchronisation per call, so these ops cannot be captured in a CUDA graph). --------------
  // y_t = x_t W_g^T + s_t b_g (s_t = 1 without bias_scales [T], float32 or x's dtype; biases
  // empty: no bias; bias_scales need biases).
  define(m, "grouped_linear_fwd(Tensor x, Tensor split_sizes, Tensor[] weights, Tensor[] biases, "
            "Tensor? bias_scales) -> Tensor");
  // dx [T, in] = dy_g W_g per group.
  define(m, "grouped_linear_dgrad(Tensor dy, Tensor split_sizes, Tensor[] weights) -> Tensor");
  // dW_g [out, in] = dy_g^T x_g per group (zeros for an empty group).
  define(m, "grouped_linear_wgrad(Tensor dy, Tensor x, Tensor split_sizes) -> Tensor[]");
  // dbias_g = sum over the rows t of group g of s_t dy_t, in bias_dtype (zeros for an empty
  // group); with bias_scales, dscales_t = dy_t . b_g in bias_scales's dtype, else an empty [0]
  // tensor (fixed arity). biases are read for dscales only (may be empty without scales).
  define(m, "grouped_bias_bwd(Tensor dy, Tensor split_sizes, Tensor[] biases, "
            "Tensor? bias_scales, ScalarType bias_dtype) -> (Tensor[], Tensor)");
  // Per-group FP8 of x [T, K] (TransformerEngine's split-quantize for GroupedLinear's
  // recipes): group g's rows are quantized with their own per-tensor scale, from their amax
  // (current scaling, scales None: force_pow_2_scales and amax_epsilons[g] as fp8_quantize's)
  // or scales[g] (delayed scaling, scales float32 [G]): data uint8 [T, K], scale_inv and amax
  // float32 [G] (each group's fp8_quantize / fp8_quantize_scaled outputs). amax_epsilons has
  // one entry per group (each group's quantizer's).
  define(m, "grouped_fp8_quantize(Tensor x, Tensor split_sizes, Tensor? scales, "
            "ScalarType fp8_dtype, bool force_pow_2_scales, float[] amax_epsilons) "
            "-> (Tensor data, Tensor scale_inv, Tensor amax)");
  // GroupedLinear's forward GEMMs on per-tensor FP8 operands: grouped_linear_fwd of x's values
  // (x [T, in] uint8 with scale_inv [G], one per group) and of each weight's (uint8 [out, in]
  // with scale_inv [1]) in fp32, biases and bias_scales added in fp32, y rounded once to
  // out_dtype. One op on the quantized buffers: no dequantized operand in a traced graph.
  define(m, "grouped_fp8_linear_fwd(Tensor x, Tensor x_scale_inv, ScalarType x_fp8_dtype, "
            "Tensor split_sizes, Tensor[] weights, Tensor[] weight_scale_invs, "
            "ScalarType weight_fp8_dtype, Tensor[] biases, Tensor? bias_scales, "
            "ScalarType out_dtype) -> Tensor");
  // data [T, K] * scale_inv[g] over group g's rows, in dtype.
  define(m, "grouped_fp8_dequantize(Tensor data, Tensor split_sizes, Tensor scale_inv, "
            "ScalarType fp8_dtype, ScalarType dtype) -> Tensor");
  // MXFP8 of x [T, K] per group: the rowwise copy (mxfp8_quantize of x) and the columnwise
  // copy (mxfp8_quantize of x^T [K, T], blocks of 32 rows down the columns), each an empty
  // [0] tensor when not asked for. The columnwise blocks must not straddle two groups, so it
  // needs every split size to be a multiple of 32.
  define(m, "grouped_mxfp8_quantize(Tensor x, Tensor split_sizes, ScalarType fp8_dtype, "
            "bool rowwise, bool columnwise) -> (Tensor rowwise_data, Tensor rowwise_scale, "
            "Tensor columnwise_data, Tensor columnwise_scale)");
  // Float8BlockScaling of x [T, K] per group: each group's rows quantized as fp8_block_quantize
  // quantizes them alone (blocks and tiles start at the group's first row; partial ones at its
  // end), or with columnwise each group's transpose [K, n_g]. data: uint8 [T, K] (columnwise
  // [K, T], group g in columns offset_g ..). scale_inv float32: the groups' fp8_block_quantize
  // scales one after the other along the rows axis (columnwise: the second dim), which has T
  // entries for 1x128 blocks of the rows and otherwise U = (T + 127 G) / 128 (at least the sum
  // of ceil(n_g / 128)), the unused tail zero: rowwise [T, ceil(K / 128)] (block_dim 1) or
  // [U, ceil(K / 128)] (2); columnwise [K, U] (1) or [ceil(K / 128), U] (2).
  define(m, "grouped_fp8_block_quantize(Tensor x, Tensor split_sizes, ScalarType fp8_dtype, "
            "int block_dim, bool force_pow_2_scales, float amax_epsilon, bool columnwise) "
            "-> (Tensor data, Tensor scale_inv)");
  // The values of a grouped_fp8_block_quantize copy, in dtype, in data's shape.
  define(m, "grouped_fp8_block_dequantize(Tensor data, Tensor split_sizes, Tensor scale_inv, "
            "ScalarType fp8_dtype, int block_dim, bool columnwise, ScalarType dtype) -> Tensor");
  // NVFP4 of x [T, K] per group (K % 16 == 0): each group's rows quantized as nvfp4_quantize
  // quantizes them alone, its own amax (amax float32 [G], 0 for an empty group) and, with
  // sr_seeds (int64 [G]), its own stochastic-rounding seed; with columnwise each group's
  // transpose [K, n_g], which needs every split size to be a multiple of 16 (blocks down the
  // rows must not straddle two groups). data uint8 [T, K / 2] and scale_e4m3 uint8
  // [T, K / 16]; columnwise [K, T / 2] and [K, T / 16], group g in columns offset_g / 2 ..
  // and offset_g / 16 ..
  define(m, "grouped_nvfp4_quantize(Tensor x, Tensor split_sizes, bool columnwise, bool rht, "
            "bool block_2d, Tensor? sr_seeds) -> (Tensor data, Tensor scale_e4m3, Tensor amax)");
  // The values of a grouped_nvfp4_quantize copy in dtype: [T, K], columnwise [K, T].
  define(m, "grouped_nvfp4_dequantize(Tensor data, Tensor split_sizes, Tensor scale_e4m3, "
            "Tensor amax, bool columnwise, bool rht, ScalarType dtype) -> Tensor");

  // ---- L2Normalization: y = x * rsqrt(sum(x^2 over the last dim) + eps) --------------------
  // The forward also returns rsqrt_norm (shape x.shape[:-1], fp32; fp64 for fp64 inputs),
  // which the backward takes with the forward's input.
  define(m, "l2normalization_fwd(Tensor x, float eps) -> (Tensor, Tensor)");
  define(m, "l2normalization_bwd(Tensor dy, Tensor x, Tensor rsqrt_norm) -> Tensor");

  // ---- Dropout (training): y = x * mask / (1 - p) ------------------------------------------
  // The keep mask (uint8, 0/1, x's shape) is a pure function of (seed, element index): a
  // counter-based Philox draw keyed by the int64 `seed` tensor, which the Python op draws from
  // torch's generator. Given its inputs the op is deterministic, so it is traced, partitioned
  // and CSE'd like any other op under torch.compile (docs/ops.md, Dropout).
  define(m, "dropout_fwd(Tensor x, Tensor seed, float p) -> (Tensor, Tensor)");
  define(m, "dropout_bwd(Tensor dy, Tensor mask, float p) -> Tensor");

  // ---- Random seeds of the stochastic ops (Dropout's mask, NVFP4's stochastic rounding) ----
  // n int64 seeds, uniform in [0, 2^62), drawn by torch's default generator of like's device
  // (like's values are not read), exactly as torch.randint(0, 2**62, (n,)) draws them. As an
  // opaque op tagged nondeterministic_seeded it draws from that same generator under
  // torch.compile too (inductor would lower an in-graph torch.randint to its own generator),
  // and is neither CSE'd nor recomputed in the backward.
  define(m, "random_seeds(Tensor like, int n) -> Tensor", {at::Tag::nondeterministic_seeded});

  // ---- Quantize: FP8 as plain buffers, the format named by its torch dtype (fp8_dtype:
  // float8_e4m3fn or float8_e5m2; docs/quantization.md) ---------------------------------------
  // Per-tensor current scaling (te_ops.md 4.3): data = uint8 bytes of the saturating RNE cast
  // of x * scale; scale_inv = 1 / scale and amax = max |x| (fp32, shape [1]).
  define(m, "fp8_quantize(Tensor x, ScalarType fp8_dtype, bool force_pow_2_scales, "
            "float amax_epsilon) -> (Tensor data, Tensor scale_inv, Tensor amax)");
  // Delayed scaling's cast with a given scale (fp32, shape [1]); amax is for the history.
  define(m, "fp8_quantize_scaled(Tensor x, Tensor scale, ScalarType fp8_dtype) "
            "-> (Tensor data, Tensor scale_inv, Tensor amax)");
  // Current scaling in three steps (an amax all-reduced over a process group in between):
  // fp8_amax = fp8_quantize's amax; fp8_current_scale = its scale from an amax (fp32, one
  // element); fp8_quantize_scaled with that scale then gives fp8_quantize's outputs.
  define(m, "fp8_amax(Tensor x) -> Tensor amax");
  define(m, "fp8_current_scale(Tensor amax, ScalarType fp8_dtype, bool force_pow_2_scales, "
            "float amax_epsilon) -> Tensor scale");
  define(m, "fp8_dequantize(Tensor data, Tensor scale_inv, ScalarType fp8_dtype, ScalarType dtype) "
            "-> Tensor");
  // MXFP8: blocks of 32 consecutive elements of the last dim, one E8M0 scale (uint8 biased
  // exponent) per block; scale_e8m0 has x's shape with the last dim divided by 32.
  define(m, "mxfp8_quantize(Tensor x, ScalarType fp8_dtype) -> (Tensor data, Tensor scale_e8m0)");
  define(m, "mxfp8_dequantize(Tensor data, Tensor scale_e8m0, ScalarType fp8_dtype, "
            "ScalarType dtype) -> Tensor");
  // NVFP4 (ops/nvfp4.h): E2M1 codes packed two per byte (uint8, last dim / 2), an E4M3 scale
  // per 16-element block (uint8, last dim / 16) and the per-tensor amax (fp32, shape [1]);
  // rht: the 16-point random Hadamard transform along the last dim (quantize: before, dequantize:
  // inverted after); block_2d: 16x16 tiles share a scale; sr_seed: stochastic rounding keyed by
  // a counter-based Philox draw of (seed, element index), round to nearest even when None.
  define(m, "nvfp4_quantize(Tensor x, bool rht, bool block_2d, Tensor? sr_seed) "
            "-> (Tensor data, Tensor scale_e4m3, Tensor amax)");
  define(m, "nvfp4_dequantize(Tensor data, Tensor scale_e4m3, Tensor amax, bool rht, "
            "ScalarType dtype) -> Tensor");

  // Float8BlockScaling (TransformerEngine's Float8BlockQuantizer): one fp32 scale per 1x128
  // block of a row (block_dim 1) or per 128x128 tile (block_dim 2) of the 2-D view [rows,
  // last dim]; partial blocks at the edges. scale_inv: x's shape with the last dim replaced by
  // ceil(last / 128) (block_dim 1), [ceil(rows / 128), ceil(last / 128)] (block_dim 2).
  define(m, "fp8_block_quantize(Tensor x, ScalarType fp8_dtype, int block_dim, "
            "bool force_pow_2_scales, float amax_epsilon) -> (Tensor data, Tensor scale_inv)");
  define(m, "fp8_block_dequantize(Tensor data, Tensor scale_inv, ScalarType fp8_dtype, "
            "int block_dim, ScalarType dtype) -> Tensor");
  // Delayed scaling's update in one call, in place: amax from the history (max or
  // most_recent), the history rolled by one with row 0 zeroed, the new scale per column.
  define(m, "fp8_delayed_scaling_update(Tensor(a!) amax_history, Tensor(b!) scale, "
            "float fp8_max, int margin, str amax_compute_algo) -> ()");
  // The contiguous transpose of a 2-D tensor of 1-, 2-, 4- or 8-byte elements, bit for bit
  // (x.t().contiguous()): the column-wise copies of quantized bytes and scales, and the
  // transposed high-precision input of a column-wise quantization (ops/transpose.h).
  define(m, "transpose_2d(Tensor x) -> Tensor");
}
