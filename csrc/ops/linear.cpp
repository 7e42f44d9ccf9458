// Checks, allocation, Meta kernels and front end of the linear family.
#include "ops/linear.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include <mutex>
#include <string>
#include <unordered_map>

#include "ops/elementwise.h"
#include "ops/quantize.h"

namespace te_cpp {

void LinearShapes::check_fwd(const char* op, const Tensor& x, const Tensor& weight,
                             const std::optional<Tensor>& bias) {
  check_float(op, "input", x);
  check_float(op, "weight", weight);
  check_same_device(op, "input", x, "weight", weight);
  check_same_dtype(op, "input", x, "weight", weight);
  TE_CHECK(weight.dim() == 2, op, "weight must be 2-D [out_features, in_features], got shape ",
           shape_str(weight));
  check_min_dim(op, "input", x, 1);
  TE_CHECK(x.sym_size(-1) == weight.sym_size(1), op, "input's last dimension (shape ",
           shape_str(x), ") must equal in_features of the weight (shape ", shape_str(weight),
           ")");
  if (bias.has_value()) {
    check_same_device(op, "input", x, "bias", *bias);
    check_same_dtype(op, "input", x, "bias", *bias);
    TE_CHECK(bias->dim() == 1 && bias->sym_size(0) == weight.sym_size(0), op, "bias shape ",
             shape_str(*bias), " must be [out_features] for weight shape ", shape_str(weight));
  }
}

Tensor LinearShapes::allocate_out(const Tensor& x, const Tensor& weight) {
  return at::empty_symint(sizes_with_last(x, weight.sym_size(0)), x.options());
}

void LinearShapes::check_dgrad(const char* op, const Tensor& dy, const Tensor& weight) {
  check_float(op, "grad_output", dy);
  check_float(op, "weight", weight);
  check_same_device(op, "grad_output", dy, "weight", weight);
  check_same_dtype(op, "grad_output", dy, "weight", weight);
  TE_CHECK(weight.dim() == 2, op, "weight must be 2-D, got shape ", shape_str(weight));
  check_min_dim(op, "grad_output", dy, 1);
  TE_CHECK(dy.sym_size(-1) == weight.sym_size(0), op, "grad_output's last dimension (shape ",
           shape_str(dy), ") must equal out_features of the weight (shape ", shape_str(weight),
           ")");
}

void LinearShapes::check_wgrad(const char* op, const Tensor& dy, const Tensor& x) {
  check_float(op, "grad_output", dy);
  check_float(op, "input", x);
  check_same_device(op, "grad_output", dy, "input", x);
  check_same_dtype(op, "grad_output", dy, "input", x);
  check_min_dim(op, "input", x, 1);
  TE_CHECK(dy.dim() == x.dim() && dy.sym_sizes().slice(0, dy.dim() - 1) ==
                                      x.sym_sizes().slice(0, x.dim() - 1),
           op, "grad_output (shape ", shape_str(dy), ") and input (shape ", shape_str(x),
           ") must share their leading dims");
}

Tensor LinearShapes::allocate_dgrad(const Tensor& dy, const Tensor& weight) {
  return at::empty_symint(sizes_with_last(dy, weight.sym_size(1)), dy.options());
}

Tensor LinearShapes::allocate_wgrad(const Tensor& dy, const Tensor& x) {
  return at::empty_symint({dy.sym_size(-1), x.sym_size(-1)}, dy.options());
}

void LinearShapes::check_extra(const char* op, const Tensor& extra, const Tensor& x,
                               const Tensor& weight) {
  check_float(op, "extra_input", extra);
  check_same_device(op, "extra_input", extra, "input", x);
  TE_CHECK(extra.sym_sizes() == c10::SymIntArrayRef(sizes_with_last(x, weight.sym_size(0))), op,
           "extra_input shape ", shape_str(extra), " must equal the output shape (input ",
           shape_str(x), ", weight ", shape_str(weight), ")");
}

void LinearShapes::check_extra_inplace(const char* op, const Tensor& extra, const Tensor& x,
                                       const Tensor& weight, const std::optional<Tensor>& bias) {
  check_extra(op, extra, x, weight);
  check_inplace_overlap(op, "extra_input", extra, "input", x, /*allow_full=*/false);
  check_inplace_overlap(op, "extra_input", extra, "weight", weight, /*allow_full=*/false);
  if (bias.has_value()) {
    check_inplace_overlap(op, "extra_input", extra, "bias", *bias, /*allow_full=*/false);
  }
}

void LinearShapes::check_dextra(const char* op, const Tensor& dextra, const Tensor& dy,
                                const Tensor& weight) {
  check_float(op, "grad_extra_output", dextra);
  check_same_device(op, "grad_extra_output", dextra, "grad_output", dy);
  TE_CHECK(dextra.sym_sizes() == c10::SymIntArrayRef(sizes_with_last(dy, weight.sym_size(1))),
           op, "grad_extra_output shape ", shape_str(dextra),
           " must equal the input-gradient shape (grad_output ", shape_str(dy), ", weight ",
           shape_str(weight), ")");
}

void LinearShapes::check_bwd(const char* op, const Tensor& dy, const Tensor& x,
                             const Tensor& weight, std::optional<at::ScalarType> bias_dtype) {
  check_dgrad(op, dy, weight);
  check_wgrad(op, dy, x);
  TE_CHECK(x.sym_size(-1) == weight.sym_size(1), op, "input's last dimension (shape ",
           shape_str(x), ") must equal in_features of the weight (shape ", shape_str(weight),
           ")");
  if (bias_dtype.has_value()) {
    TE_CHECK(is_supported_float(*bias_dtype), op,
             "bias dtype must be float32, float64, bfloat16 or float16, got ", *bias_dtype);
  }
}

Tensor LinearShapes::allocate_dbias(const Tensor& dy, const Tensor& weight,
                                    std::optional<at::ScalarType> bias_dtype) {
  if (!bias_dtype.has_value()) return at::empty({0}, dy.options());
  return at::empty_symint({weight.sym_size(0)}, dy.options().dtype(*bias_dtype));
}

void Fp8Gemm::check(const Tensor& a, const Tensor& a_scale_inv, at::ScalarType a_fp8,
                    const Tensor& b, const Tensor& b_scale_inv, at::ScalarType b_fp8,
                    at::ScalarType out_dtype, const std::optional<Tensor>& bias) {
  const auto check_fp8 = [](const char* name, at::ScalarType t) {
    TE_CHECK_VALUE(t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2, kName, name,
                   " must be torch.float8_e4m3fn or torch.float8_e5m2, got ", t);
  };
  check_buffer(kName, "a", a, at::kByte, "raw FP8 bytes");
  check_buffer(kName, "b", b, at::kByte, "raw FP8 bytes");
  check_fp8("a_fp8_dtype", a_fp8);
  check_fp8("b_fp8_dtype", b_fp8);
  check_same_device(kName, "a", a, "b", b);
  check_scalar_buffer(kName, "a_scale_inv", a_scale_inv);
  check_same_device(kName, "a_scale_inv", a_scale_inv, "a", a);
  check_scalar_buffer(kName, "b_scale_inv", b_scale_inv);
  check_same_device(kName, "b_scale_inv", b_scale_inv, "a", a);
  check_float_dtype(kName, "out_dtype", out_dtype);
  check_min_dim(kName, "a", a, 1);
  TE_CHECK(b.dim() == 2, kName, "b must be 2-D [n, k], got shape ", shape_str(b));
  TE_CHECK(a.sym_size(-1) == b.sym_size(1), kName, "a's last dimension (shape ", shape_str(a),
           ") must equal b's (shape ", shape_str(b), "): both operands keep the reduction dim "
           "last (TN)");
  if (bias.has_value()) {
    TE_CHECK(bias->scalar_type() == out_dtype, kName, "bias must be in out_dtype (", out_dtype,
             "), got ", bias->scalar_type());
    TE_CHECK(bias->dim() == 1 && bias->sym_size(0) == b.sym_size(0), kName,
             "bias must have shape [n] = [", b.sym_size(0), "], got ", shape_str(*bias));
    check_same_device(kName, "bias", *bias, "a", a);
  }
}

Tensor Fp8Gemm::allocate(const Tensor& a, const Tensor& b, at::ScalarType out_dtype) {
  return at::empty_symint(sizes_with_last(a, b.sym_size(0)), a.options().dtype(out_dtype));
}

void Mxfp8Gemm::check(const Tensor& a, const Tensor& a_scale, at::ScalarType a_fp8,
                      const Tensor& b, const Tensor& b_scale, at::ScalarType b_fp8,
                      at::ScalarType out_dtype) {
  check_buffer(kName, "a", a, at::kByte, "raw FP8 bytes");
  check_buffer(kName, "b", b, at::kByte, "raw FP8 bytes");
  check_buffer(kName, "a_scale", a_scale, at::kByte, "E8M0 exponents");
  check_buffer(kName, "b_scale", b_scale, at::kByte, "E8M0 exponents");
  check_fp8_dtype(kName, a_fp8);
  check_fp8_dtype(kName, b_fp8);
  check_same_device(kName, "a", a, "b", b);
  check_same_device(kName, "a", a, "a_scale", a_scale);
  check_same_device(kName, "a", a, "b_scale", b_scale);
  check_float_dtype(kName, "out_dtype", out_dtype);
  check_min_dim(kName, "a", a, 1);
  TE_CHECK(b.dim() == 2, kName, "b must be 2-D [n, k], got shape ", shape_str(b));
  TE_CHECK(a.sym_size(-1) == b.sym_size(1), kName, "a's last dimension (shape ", shape_str(a),
           ") must equal b's (shape ", shape_str(b), "): both operands keep the reduction dim "
           "last (TN)");
  TE_CHECK(b.sym_size(1) % fp8::kMXFP8BlockSize == 0, kName,
           "the reduction dim must be a multiple of 32 (MXFP8 blocks), got b of shape ",
           shape_str(b));
  const auto expected_a = sizes_with_last(a, a.sym_size(-1) / fp8::kMXFP8BlockSize);
  TE_CHECK(a_scale.sym_sizes() == c10::SymIntArrayRef(expected_a), kName,
           "a_scale must have shape ", c10::SymIntArrayRef(expected_a), " for a of shape ",
           shape_str(a), ", got ", shape_str(a_scale));
  const auto expected_b = sizes_with_last(b, b.sym_size(-1) / fp8::kMXFP8BlockSize);
  TE_CHECK(b_scale.sym_sizes() == c10::SymIntArrayRef(expected_b), kName,
           "b_scale must have shape ", c10::SymIntArrayRef(expected_b), " for b of shape ",
           shape_str(b), ", got ", shape_str(b_scale));
}

TE_DEFINE_STUB(gemm_stub, bool(const GemmArgs&));
TE_DEFINE_STUB(fp8_gemm_stub, void(const Fp8GemmArgs&));

namespace {

// ---- front end (the CPU and CUDA dispatch keys) ----

// The ATen calls of the front end and of the CPU backend run below autograd: the ops are not
// differentiable on their own (Autograd falls through to here), out= GEMMs refuse inputs that
// require grad, and skipping the autograd kernels saves host time on small GEMMs.
using BelowAutograd = at::AutoDispatchBelowADInplaceOrView;

// The product of all but the last dim (the GEMM rows of a [..., k] operand).
int64_t leading_rows(const Tensor& t) {
  int64_t r = 1;
  for (int64_t i = 0; i + 1 < t.dim(); ++i) r *= t.size(i);
  return r;
}

// A 2-D operand as GemmArgs reads it: the logical operand is `t` (transposed false) or t^T,
// with either of its dims unit-stride; any other layout is copied to a contiguous one first.
struct Operand {
  Tensor keep;  // the tensor whose memory `ptr` points into: alive until the GEMM has run
  const void* ptr;
  bool trans;
  int64_t ld;
};

// The operand of `t` as it is, or nothing when neither dim of its logical form is unit-stride.
std::optional<Operand> operand_as_is(const Tensor& t, bool transposed) {
  // strides and sizes of the logical operand [r, c]
  const int64_t r = t.size(transposed ? 1 : 0), c = t.size(transposed ? 0 : 1);
  const int64_t sr = t.stride(transposed ? 1 : 0), sc = t.stride(transposed ? 0 : 1);
  if (sc == 1 && (sr >= c || r <= 1)) {
    return Operand{t, t.const_data_ptr(), false, std::max<int64_t>({sr, c, 1})};
  }
  if (sr == 1 && (sc >= r || c <= 1)) {
    return Operand{t, t.const_data_ptr(), true, std::max<int64_t>({sc, r, 1})};
  }
  return std::nullopt;
}

// Any other layout: a contiguous copy of the logical operand (as ATen's CPU GEMM makes one,
// so the CPU numerics are those of at::mm on the original operand).
Operand operand(const Tensor& t, bool transposed) {
  if (auto op = operand_as_is(t, transposed)) return *op;
  const Tensor copy = (transposed ? t.t() : t).contiguous();
  return Operand{copy, copy.const_data_ptr(), false, std::max<int64_t>(copy.size(1), 1)};
}

GemmArgs gemm_args(at::ScalarType dtype, int64_t m, int64_t n, int64_t k, const void* a,
                   bool trans_a, int64_t lda, const Operand& b, void* d, double alpha) {
  GemmArgs g{};
  g.dtype = dtype;
  g.m = m, g.n = n, g.k = k;
  g.trans_a = trans_a, g.trans_b = b.trans;
  g.lda = lda, g.ldb = b.ld, g.ldc = n, g.ldd = n;
  g.alpha = alpha, g.beta = 0.0;
  g.a = a, g.b = b.ptr, g.c = nullptr, g.d = d;
  return g;
}

// out = extra + g's product (+ bias), in out's (= extra's) dtype; out may be extra itself.
// The same dtype as the GEMM: the GEMM accumulates into the residual (C = extra, beta = 1, the
// bias as its epilogue). Another dtype: the product in the GEMM's dtype, then added in out's.
void gemm_add_into(GemmArgs g, const Tensor& out, const Tensor& extra_in,
                   const std::optional<Tensor>& bias) {
  const c10::DeviceType dev = out.device().type();
  if (extra_in.scalar_type() == g.dtype) {
    const Tensor extra = out.is_same(extra_in) ? out : extra_in.contiguous();
    g.beta = 1.0;
    g.c = extra.const_data_ptr();
    g.d = out.mutable_data_ptr();
    if (bias.has_value()) {
      g.epilogue = GemmEpilogue::kBias;
      g.bias = bias->const_data_ptr();
    }
    gemm_stub(dev, g);
    return;
  }
  const double alpha = g.alpha;
  Tensor prod = at::empty({g.m, g.n}, out.options().dtype(g.dtype));
  g.alpha = 1.0;
  g.d = prod.mutable_data_ptr();
  gemm_stub(dev, g);
  if (!out.is_same(extra_in)) out.copy_(extra_in);
  out.view({g.m, g.n}).add_(prod.to(out.scalar_type()), alpha);
  if (bias.has_value()) {
    const Tensor b = bias->to(out.scalar_type()).contiguous();
    bias_add_stub(dev, BiasAddArgs{out.scalar_type(), g.m, g.n, out.const_data_ptr(),
                                   b.const_data_ptr(), out.mutable_data_ptr()});
  }
}

// y = our activation op `<stem>_fwd` on z, through the dispatcher (for a backend that left the
// activation of linear_bias_act_fwd to it).
Tensor run_activation(c10::string_view stem, Act act, const Tensor& z) {
  using Handle = c10::TypedOperatorHandle<Tensor(const Tensor&)>;
  static std::mutex mutex;
  static std::unordered_map<int, Handle> handles;
  const Handle* h = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = handles.find(static_cast<int>(act));
    if (it == handles.end()) {
      const std::string name = "te_cpp::" + std::string(stem) + "_fwd";
      it = handles
               .emplace(static_cast<int>(act), c10::Dispatcher::singleton()
                                                   .findSchemaOrThrow(name.c_str(), "")
                                                   .typed<Tensor(const Tensor&)>())
               .first;
    }
    h = &it->second;
  }
  return h->call(z);
}

Tensor linear_fwd(const Tensor& x_in, const Tensor& weight, const std::optional<Tensor>& bias) {
  BelowAutograd below_autograd;
  LinearShapes::check_fwd("linear_fwd", x_in, weight, bias);
  const auto guard = device_guard(x_in);
  Tensor y = LinearShapes::allocate_out(x_in, weight);
  const int64_t m = leading_rows(x_in), n = weight.size(0), k = weight.size(1);
  if (m == 0 || n == 0) return y;
  const Tensor x = x_in.contiguous();
  const Operand w = operand(weight, /*transposed=*/true);
  GemmArgs g = gemm_args(x.scalar_type(), m, n, k, x.const_data_ptr(), false, k, w,
                         y.mutable_data_ptr(), 1.0);
  Tensor b;
  if (bias.has_value()) {
    b = bias->contiguous();
    g.epilogue = GemmEpilogue::kBias;
    g.bias = b.const_data_ptr();
  }
  gemm_stub(x.device().type(), g);
  return y;
}

std::tuple<Tensor, Tensor> linear_bias_act_fwd(const Tensor& x_in, const Tensor& weight,
                                               const std::optional<Tensor>& bias,
                                               c10::string_view activation) {
  BelowAutograd below_autograd;
  const char* op = "linear_bias_act_fwd";
  const Act act = linear_activation(op, activation);
  LinearShapes::check_fwd(op, x_in, weight, bias);
  const auto guard = device_guard(x_in);
  // z = x W^T + bias, the activation's saved input, and y = act(z)
  Tensor y = LinearShapes::allocate_out(x_in, weight);
  Tensor z = LinearShapes::allocate_out(x_in, weight);
  const int64_t m = leading_rows(x_in), n = weight.size(0), k = weight.size(1);
  if (m == 0 || n == 0) return {y, z};
  const Tensor x = x_in.contiguous();
  const Operand w = operand(weight, /*transposed=*/true);
  GemmArgs g = gemm_args(x.scalar_type(), m, n, k, x.const_data_ptr(), false, k, w,
                         y.mutable_data_ptr(), 1.0);
  Tensor b;
  if (bias.has_value()) {
    b = bias->contiguous();
    g.bias = b.const_data_ptr();
  }
  g.epilogue = GemmEpilogue::kBiasAct;
  g.act = act;
  g.aux = z.mutable_data_ptr();
  if (!gemm_stub(x.device().type(), g)) y = run_activation(activation, act, z);
  return {y, z};
}

// out = extra + alpha * (x W^T) [+ bias], in extra's dtype; out may be extra itself.
void linear_add_into(const Tensor& out, const Tensor& x_in, const Tensor& weight,
                     const std::optional<Tensor>& bias_in, const Tensor& extra, double alpha) {
  const int64_t m = leading_rows(x_in), n = weight.size(0), k = weight.size(1);
  if (m == 0 || n == 0) return;
  const Tensor x = x_in.contiguous();
  std::optional<Tensor> bias;
  if (bias_in.has_value()) bias = bias_in->contiguous();
  const Operand w = operand(weight, /*transposed=*/true);
  gemm_add_into(gemm_args(x.scalar_type(), m, n, k, x.const_data_ptr(), false, k, w, nullptr,
                          alpha),
                out, extra, bias);
}

Tensor linear_fwd_add(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                      const Tensor& extra, double alpha) {
  BelowAutograd below_autograd;
  LinearShapes::check_fwd("linear_fwd_add", x, weight, bias);
  LinearShapes::check_extra("linear_fwd_add", extra, x, weight);
  const auto guard = device_guard(x);
  Tensor out = at::empty_symint(extra.sym_sizes(), extra.options());
  linear_add_into(out, x, weight, bias, extra, alpha);
  return out;
}

void linear_fwd_add_inplace(const Tensor& extra, const Tensor& x, const Tensor& weight,
                            const std::optional<Tensor>& bias, double alpha) {
  BelowAutograd below_autograd;
  LinearShapes::check_fwd("linear_fwd_add_inplace", x, weight, bias);
  LinearShapes::check_extra_inplace("linear_fwd_add_inplace", extra, x, weight, bias);
  const auto guard = device_guard(x);
  if (extra.is_contiguous()) {
    linear_add_into(extra, x, weight, bias, extra, alpha);
  } else {
    // a non-contiguous buffer is updated through a contiguous copy (as the residual adds are;
    // the Meta kernel accepts any strides, so the real kernel must too)
    Tensor tmp = extra.contiguous();
    linear_add_into(tmp, x, weight, bias, tmp, alpha);
    const_cast<Tensor&>(extra).copy_(tmp);
  }
}

// The dgrad GEMM dx[rows, in] = alpha * dy[rows, out] W[out, in] (d not yet set); w is
// operand(weight, false), which the caller keeps until the GEMM has run.
GemmArgs dgrad_args(const Tensor& dy, const Tensor& weight, const Operand& w, double alpha) {
  const int64_t m = leading_rows(dy), n = weight.size(1), k = weight.size(0);
  return gemm_args(dy.scalar_type(), m, n, k, dy.const_data_ptr(), false, k, w, nullptr, alpha);
}

// The wgrad GEMM dW[out, in] = alpha * dy[rows, out]^T x[rows, in] (d not yet set).
GemmArgs wgrad_args(const Tensor& dy, const Tensor& x, double alpha) {
  const int64_t rows = leading_rows(dy), n = x.size(-1), m = dy.size(-1);
  return gemm_args(dy.scalar_type(), m, n, rows, dy.const_data_ptr(), true, m,
                   Operand{x, x.const_data_ptr(), false, std::max<int64_t>(n, 1)}, nullptr,
                   alpha);
}

Tensor linear_dgrad(const Tensor& dy_in, const Tensor& weight, double alpha) {
  BelowAutograd below_autograd;
  LinearShapes::check_dgrad("linear_dgrad", dy_in, weight);
  const auto guard = device_guard(dy_in);
  Tensor dx = LinearShapes::allocate_dgrad(dy_in, weight);
  if (dx.numel() == 0) return dx;
  const Tensor dy = dy_in.contiguous();
  const Operand w = operand(weight, /*transposed=*/false);
  GemmArgs g = dgrad_args(dy, weight, w, alpha);
  g.d = dx.mutable_data_ptr();
  gemm_stub(dy.device().type(), g);
  return dx;
}

Tensor linear_dgrad_add(const Tensor& dy_in, const Tensor& weight, const Tensor& dextra,
                        double alpha) {
  BelowAutograd below_autograd;
  LinearShapes::check_dgrad("linear_dgrad_add", dy_in, weight);
  LinearShapes::check_dextra("linear_dgrad_add", dextra, dy_in, weight);
  const auto guard = device_guard(dy_in);
  Tensor dx = at::empty_symint(dextra.sym_sizes(), dextra.options());
  if (dx.numel() == 0) return dx;
  const Tensor dy = dy_in.contiguous();
  const Operand w = operand(weight, /*transposed=*/false);
  gemm_add_into(dgrad_args(dy, weight, w, alpha), dx, dextra, std::nullopt);
  return dx;
}

Tensor linear_wgrad(const Tensor& dy_in, const Tensor& x_in, double alpha) {
  BelowAutograd below_autograd;
  LinearShapes::check_wgrad("linear_wgrad", dy_in, x_in);
  const auto guard = device_guard(dy_in);
  Tensor dw = LinearShapes::allocate_wgrad(dy_in, x_in);
  if (dw.numel() == 0) return dw;
  const Tensor dy = dy_in.contiguous(), x = x_in.contiguous();
  GemmArgs g = wgrad_args(dy, x, alpha);
  g.d = dw.mutable_data_ptr();
  gemm_stub(dy.device().type(), g);
  return dw;
}

// dgrad, wgrad and (optionally) dbias of one linear in one call: the backward of BasicLinear
// and of BackwardLinearBias, three dispatcher calls fewer per step than dgrad + wgrad + bias_bwd.
// The dbias is the wgrad GEMM's epilogue (the row sums of its A operand, dy^T).
std::tuple<Tensor, Tensor, Tensor> linear_bwd(const Tensor& dy_in, const Tensor& x_in,
                                              const Tensor& weight, double alpha,
                                              std::optional<at::ScalarType> bias_dtype) {
  BelowAutograd below_autograd;
  LinearShapes::check_bwd("linear_bwd", dy_in, x_in, weight, bias_dtype);
  const auto guard = device_guard(dy_in);
  Tensor dx = LinearShapes::allocate_dgrad(dy_in, weight);
  Tensor dw = LinearShapes::allocate_wgrad(dy_in, x_in);
  Tensor db = LinearShapes::allocate_dbias(dy_in, weight, bias_dtype);
  const Tensor dy = dy_in.contiguous();
  const c10::DeviceType dev = dy.device().type();
  if (dx.numel() != 0) {
    const Operand w = operand(weight, /*transposed=*/false);
  GemmArgs g = dgrad_args(dy, weight, w, alpha);
    g.d = dx.mutable_data_ptr();
    gemm_stub(dev, g);
  }
  if (dw.numel() != 0) {
    const Tensor x = x_in.contiguous();
    GemmArgs g = wgrad_args(dy, x, alpha);
    g.d = dw.mutable_data_ptr();
    if (bias_dtype.has_value()) {
      g.epilogue = GemmEpilogue::kBiasGrad;
      g.bias_dtype = *bias_dtype;
      g.bgrad = db.mutable_data_ptr();
    }
    gemm_stub(dev, g);
  } else if (bias_dtype.has_value()) {
    bias_grad_into(db, dy);  // no wgrad GEMM to carry it (in_features or out_features is 0)
  }
  return {dx, dw, db};
}

Tensor fp8_gemm(const Tensor& a_in, const Tensor& a_scale_inv, at::ScalarType a_fp8,
                const Tensor& b_in, const Tensor& b_scale_inv, at::ScalarType b_fp8,
                at::ScalarType out_dtype, const std::optional<Tensor>& bias_in) {
  BelowAutograd below_autograd;
  Fp8Gemm::check(a_in, a_scale_inv, a_fp8, b_in, b_scale_inv, b_fp8, out_dtype, bias_in);
  const auto guard = device_guard(a_in);
  Tensor d = Fp8Gemm::allocate(a_in, b_in, out_dtype);
  if (d.numel() == 0) return d;
  const Tensor a = a_in.contiguous(), b = b_in.contiguous();
  const Tensor sa = a_scale_inv.contiguous(), sb = b_scale_inv.contiguous();
  const Tensor bias = bias_in.has_value() ? bias_in->contiguous() : Tensor();
  fp8_gemm_stub(a.device().type(),
                Fp8GemmArgs{leading_rows(a), b.size(0), b.size(1), a_fp8, b_fp8, out_dtype,
                            a.const_data_ptr(), b.const_data_ptr(), sa.const_data_ptr<float>(),
                            sb.const_data_ptr<float>(), d.mutable_data_ptr(),
                            bias.defined() ? bias.const_data_ptr() : nullptr});
  return d;
}

// An MXFP8 operand's values in fp32 (the quantize family's dequantize stub).
Tensor mxfp8_operand(const Tensor& data_in, const Tensor& scale_in, at::ScalarType fp8) {
  Tensor out = at::empty(data_in.sizes(), data_in.options().dtype(at::kFloat));
  if (out.numel() == 0) return out;
  const Tensor data = data_in.contiguous(), scale = scale_in.contiguous();
  fp8_dequantize_stub(data.device().type(),
                      Fp8DequantizeArgs{fp8, at::kFloat, data.numel(),
                                        data.const_data_ptr<uint8_t>(), nullptr,
                                        scale.const_data_ptr<uint8_t>(), out.mutable_data_ptr()});
  return out;
}

// The exact emulation of an MXFP8 GEMM: both operands' values in fp32, multiplied with fp32
// accumulation, rounded once to out_dtype. One op for the quantized buffers, so a traced
// backward keeps the uint8 buffers as its saved inputs, never their fp32 values.
Tensor mxfp8_gemm(const Tensor& a_in, const Tensor& a_scale, at::ScalarType a_fp8,
                  const Tensor& b_in, const Tensor& b_scale, at::ScalarType b_fp8,
                  at::ScalarType out_dtype) {
  BelowAutograd below_autograd;
  Mxfp8Gemm::check(a_in, a_scale, a_fp8, b_in, b_scale, b_fp8, out_dtype);
  const auto guard = device_guard(a_in);
  Tensor d = Fp8Gemm::allocate(a_in, b_in, out_dtype);
  if (d.numel() == 0) return d;
  const int64_t k = b_in.size(1), n = b_in.size(0);
  // rows given explicitly: with k = 0 (a wgrad over no tokens) -1 would be ambiguous
  const Tensor a = mxfp8_operand(a_in, a_scale, a_fp8).reshape({leading_rows(a_in), k});
  const Tensor b = mxfp8_operand(b_in, b_scale, b_fp8);
  Tensor d2 = d.view({-1, n});
  if (out_dtype == at::kFloat) {
    at::mm_out(d2, a, b.t());
  } else {
    d2.copy_(at::mm(a, b.t()));  // one rounding of the fp32 product to the output dtype
  }
  return d;
}

void register_front_ends(torch::Library& m) {
  m.impl("mxfp8_gemm", mxfp8_gemm);
  m.impl("linear_fwd", linear_fwd);
  m.impl("linear_bias_act_fwd", linear_bias_act_fwd);
  m.impl("linear_fwd_add", linear_fwd_add);
  m.impl("linear_fwd_add_inplace", linear_fwd_add_inplace);
  m.impl("linear_dgrad", linear_dgrad);
  m.impl("linear_dgrad_add", linear_dgrad_add);
  m.impl("linear_wgrad", linear_wgrad);
  m.impl("linear_bwd", linear_bwd);
  m.impl("fp8_gemm", fp8_gemm);
}

// ---- Meta kernels ----

Tensor linear_fwd_meta(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias) {
  LinearShapes::check_fwd("linear_fwd", x, weight, bias);
  return LinearShapes::allocate_out(x, weight);
}

std::tuple<Tensor, Tensor> linear_bias_act_fwd_meta(const Tensor& x, const Tensor& weight,
                                                    const std::optional<Tensor>& bias,
                                                    c10::string_view activation) {
  linear_activation("linear_bias_act_fwd", activation);
  LinearShapes::check_fwd("linear_bias_act_fwd", x, weight, bias);
  return {LinearShapes::allocate_out(x, weight), LinearShapes::allocate_out(x, weight)};
}

Tensor linear_fwd_add_meta(const Tensor& x, const Tensor& weight,
                           const std::optional<Tensor>& bias, const Tensor& extra, double) {
  LinearShapes::check_fwd("linear_fwd_add", x, weight, bias);
  LinearShapes::check_extra("linear_fwd_add", extra, x, weight);
  return at::empty_symint(extra.sym_sizes(), extra.options());
}

void linear_fwd_add_inplace_meta(const Tensor& extra, const Tensor& x, const Tensor& weight,
                                 const std::optional<Tensor>& bias, double) {
  LinearShapes::check_fwd("linear_fwd_add_inplace", x, weight, bias);
  LinearShapes::check_extra_inplace("linear_fwd_add_inplace", extra, x, weight, bias);
}

Tensor linear_dgrad_meta(const Tensor& dy, const Tensor& weight, double) {
  LinearShapes::check_dgrad("linear_dgrad", dy, weight);
  return LinearShapes::allocate_dgrad(dy, weight);
}

Tensor linear_dgrad_add_meta(const Tensor& dy, const Tensor& weight, const Tensor& dextra,
                             double) {
  LinearShapes::check_dgrad("linear_dgrad_add", dy, weight);
  LinearShapes::check_dextra("linear_dgrad_add", dextra, dy, weight);
  return at::empty_symint(dextra.sym_sizes(), dextra.options());
}

Tensor linear_wgrad_meta(const Tensor& dy, const Tensor& x, double) {
  LinearShapes::check_wgrad("linear_wgrad", dy, x);
  return LinearShapes::allocate_wgrad(dy, x);
}

std::tuple<Tensor, Tensor, Tensor> linear_bwd_meta(const Tensor& dy, const Tensor& x,
                                                   const Tensor& weight, double,
                                                   std::optional<at::ScalarType> bias_dtype) {
  LinearShapes::check_bwd("linear_bwd", dy, x, weight, bias_dtype);
  return {LinearShapes::allocate_dgrad(dy, weight), LinearShapes::allocate_wgrad(dy, x),
          LinearShapes::allocate_dbias(dy, weight, bias_dtype)};
}

Tensor mxfp8_gemm_meta(const Tensor& a, const Tensor& a_scale, at::ScalarType a_fp8,
                       const Tensor& b, const Tensor& b_scale, at::ScalarType b_fp8,
                       at::ScalarType out_dtype) {
  Mxfp8Gemm::check(a, a_scale, a_fp8, b, b_scale, b_fp8, out_dtype);
  return Fp8Gemm::allocate(a, b, out_dtype);
}

Tensor fp8_gemm_meta(const Tensor& a, const Tensor& a_scale_inv, at::ScalarType a_fp8,
                     const Tensor& b, const Tensor& b_scale_inv, at::ScalarType b_fp8,
                     at::ScalarType out_dtype, const std::optional<Tensor>& bias) {
  Fp8Gemm::check(a, a_scale_inv, a_fp8, b, b_scale_inv, b_fp8, out_dtype, bias);
  return Fp8Gemm::allocate(a, b, out_dtype);
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, Meta, m) {
  m.impl("linear_fwd", linear_fwd_meta);
  m.impl("linear_bias_act_fwd", linear_bias_act_fwd_meta);
  m.impl("linear_fwd_add", linear_fwd_add_meta);
  m.impl("linear_fwd_add_inplace", linear_fwd_add_inplace_meta);
  m.impl("linear_dgrad", linear_dgrad_meta);
  m.impl("linear_dgrad_add", linear_dgrad_add_meta);
  m.impl("linear_wgrad", linear_wgrad_meta);
  m.impl("linear_bwd", linear_bwd_meta);
  m.impl("fp8_gemm", fp8_gemm_meta);
  m.impl("mxfp8_gemm", mxfp8_gemm_meta);
}

TE_REGISTER_FRONT_ENDS(register_front_ends)

}  // namespace te_cpp
