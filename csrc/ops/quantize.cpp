// Checks, allocation, Meta kernels and front end of the quantize family.
#include "ops/quantize.h"

#include <ATen/ops/empty.h>
#include <algorithm>
#include <cmath>
#include <torch/library.h>

namespace te_cpp {

void check_fp8_dtype(const char* op, at::ScalarType fp8_dtype) {
  TE_CHECK(fp8::is_fp8(fp8_dtype), op,
           "fp8_dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got torch.",
           c10::getDtypeNames(fp8_dtype).first);
}

void check_amax_epsilon(const char* op, double amax_epsilon, int64_t group) {
  const bool ok = std::isfinite(amax_epsilon) && amax_epsilon >= 0.0;
  constexpr const char* kRule = " must be >= 0 and finite, got ";
  if (group < 0) {
    TE_CHECK_VALUE(ok, op, "amax_epsilon", kRule, amax_epsilon);
  } else {
    TE_CHECK_VALUE(ok, op, "amax_epsilons[", group, "]", kRule, amax_epsilon);
  }
}

void Fp8Quantize::check(const Tensor& x, at::ScalarType fp8_dtype, double amax_epsilon) {
  check_float(kName, "input", x);
  check_fp8_dtype(kName, fp8_dtype);
  check_amax_epsilon(kName, amax_epsilon);
}

std::tuple<Tensor, Tensor, Tensor> Fp8Quantize::allocate(const Tensor& x) {
  Tensor data = at::empty_symint(x.sym_sizes(), x.options().dtype(at::kByte));
  Tensor scale_inv = at::empty_symint({c10::SymInt(1)}, x.options().dtype(at::kFloat));
  Tensor amax = at::empty_symint({c10::SymInt(1)}, x.options().dtype(at::kFloat));
  return {data, scale_inv, amax};
}

void Fp8Amax::check(const Tensor& x) { check_float(kName, "input", x); }

Tensor Fp8Amax::allocate(const Tensor& x) {
  return at::empty_symint({c10::SymInt(1)}, x.options().dtype(at::kFloat));
}

void Fp8CurrentScale::check(const Tensor& amax, at::ScalarType fp8_dtype, double amax_epsilon) {
  check_buffer(kName, "amax", amax, at::kFloat);
  TE_CHECK(amax.sym_numel() == 1, kName, "amax must have exactly one element, got shape ",
           shape_str(amax));
  check_fp8_dtype(kName, fp8_dtype);
  check_amax_epsilon(kName, amax_epsilon);
}

Tensor Fp8CurrentScale::allocate(const Tensor& amax) {
  return at::empty_symint({c10::SymInt(1)}, amax.options().dtype(at::kFloat));
}

void Fp8QuantizeScaled::check(const Tensor& x, const Tensor& scale, at::ScalarType fp8_dtype) {
  check_float(kName, "input", x);
  check_fp8_dtype(kName, fp8_dtype);
  check_scalar_buffer(kName, "scale", scale);
  check_same_device(kName, "input", x, "scale", scale);
}

void Fp8Dequantize::check(const Tensor& data, const Tensor& scale_inv,
                          at::ScalarType fp8_dtype, at::ScalarType dtype) {
  check_buffer(kName, "data", data, at::kByte, "raw FP8 bytes");
  check_scalar_buffer(kName, "scale_inv", scale_inv);
  check_same_device(kName, "data", data, "scale_inv", scale_inv);
  check_fp8_dtype(kName, fp8_dtype);
  check_float_dtype(kName, "dtype", dtype);
}

Tensor Fp8Dequantize::allocate(const Tensor& data, at::ScalarType dtype) {
  return at::empty_symint(data.sym_sizes(), data.options().dtype(dtype));
}

namespace {

void check_mxfp8_last_dim(const char* op, const char* name, const Tensor& t) {
  check_min_dim(op, name, t, 1);
  TE_CHECK(t.sym_size(-1) % fp8::kMXFP8BlockSize == 0, op, name,
           "'s last dimension must be a multiple of ", fp8::kMXFP8BlockSize,
           " (one E8M0 scale per 32 consecutive elements), got shape ", shape_str(t));
}

}  // namespace

void Mxfp8Quantize::check(const Tensor& x, at::ScalarType fp8_dtype) {
  check_float(kName, "input", x);
  check_fp8_dtype(kName, fp8_dtype);
  check_mxfp8_last_dim(kName, "input", x);
}

std::tuple<Tensor, Tensor> Mxfp8Quantize::allocate(const Tensor& x) {
  Tensor data = at::empty_symint(x.sym_sizes(), x.options().dtype(at::kByte));
  Tensor scale = at::empty_symint(sizes_with_last(x, x.sym_size(-1) / fp8::kMXFP8BlockSize),
                                  x.options().dtype(at::kByte));
  return {data, scale};
}

void Mxfp8Dequantize::check(const Tensor& data, const Tensor& scale_e8m0,
                            at::ScalarType fp8_dtype, at::ScalarType dtype) {
  check_buffer(kName, "data", data, at::kByte, "raw FP8 bytes");
  check_buffer(kName, "scale_e8m0", scale_e8m0, at::kByte, "biased E8M0 exponents");
  check_same_device(kName, "data", data, "scale_e8m0", scale_e8m0);
  check_fp8_dtype(kName, fp8_dtype);
  check_mxfp8_last_dim(kName, "data", data);
  const auto expected = sizes_with_last(data, data.sym_size(-1) / fp8::kMXFP8BlockSize);
  TE_CHECK(scale_e8m0.sym_sizes() == c10::SymIntArrayRef(expected), kName,
           "scale_e8m0 must have shape ", c10::SymIntArrayRef(expected), " for data of shape ",
           shape_str(data), ", got ", shape_str(scale_e8m0));
  check_float_dtype(kName, "dtype", dtype);
}

Tensor Mxfp8Dequantize::allocate(const Tensor& data, at::ScalarType dtype) {
  return at::empty_symint(data.sym_sizes(), data.options().dtype(dtype));
}

void Fp8DelayedScalingUpdate::check(const Tensor& h, const Tensor& scale, double fp8_max,
                                    int64_t margin, c10::string_view algo) {
  TE_CHECK_VALUE(algo == "max" || algo == "most_recent", kName,
                 "amax_compute_algo must be 'max' or 'most_recent', got '", algo, "'");
  check_buffer(kName, "amax_history", h, at::kFloat);
  check_buffer(kName, "scale", scale, at::kFloat);
  TE_CHECK(h.dim() == 2, kName, "amax_history must be 2-D (history length, quantizers), got shape ",
           shape_str(h));
  TE_CHECK(scale.dim() == 1 && scale.sym_size(0) == h.sym_size(1), kName, "scale must have shape [",
           h.sym_size(1), "] (one per amax_history column), got ", shape_str(scale));
  TE_CHECK_VALUE(h.sym_size(0) >= 1, kName, "amax_history must have at least one row, got shape ",
                 shape_str(h));
  check_same_device(kName, "amax_history", h, "scale", scale);
  check_inplace_overlap(kName, "amax_history", h, "scale", scale, /*allow_full=*/false);
  check_inplace_overlap(kName, "scale", scale, "amax_history", h, /*allow_full=*/false);
  TE_CHECK_VALUE(margin >= 0, kName, "margin must be >= 0, got ", margin);
  TE_CHECK_VALUE(std::isfinite(fp8_max) && fp8_max > 0.0, kName,
                 "fp8_max must be positive and finite, got ", fp8_max);
}

TE_DEFINE_STUB(delayed_scaling_update_stub, void(const DelayedScalingUpdateArgs&));
TE_DEFINE_STUB(fp8_quantize_stub, void(const Fp8QuantizeArgs&));
TE_DEFINE_STUB(fp8_amax_stub, void(const Fp8AmaxArgs&));
TE_DEFINE_STUB(fp8_current_scale_stub, void(const Fp8CurrentScaleArgs&));
TE_DEFINE_STUB(fp8_dequantize_stub, void(const Fp8DequantizeArgs&));
TE_DEFINE_STUB(mxfp8_quantize_stub, void(const Mxfp8QuantizeArgs&));

namespace {

// ---- front end (the CPU and CUDA dispatch keys) ----

// The kernels read float32, bfloat16 and float16 as they are; float64 is first rounded to
// float32 (the algorithm is defined on x in fp32).
Tensor kernel_input(const Tensor& x) {
  return (x.scalar_type() == at::kDouble ? x.to(at::kFloat) : x).contiguous();
}

// fp8_quantize and fp8_quantize_scaled (scale: nullptr for current scaling).
std::tuple<Tensor, Tensor, Tensor> quantize(const Tensor& x_in, at::ScalarType fp8_dtype,
                                            const float* scale, bool pow2, double eps) {
  auto [data, scale_inv, amax] = Fp8Quantize::allocate(x_in);
  const Tensor x = kernel_input(x_in);
  // n = 0 still writes amax (0), scale_inv and nothing else
  fp8_quantize_stub(x.device().type(),
                    Fp8QuantizeArgs{x.scalar_type(), fp8_dtype, x.numel(), x.const_data_ptr(),
                                    scale, pow2, static_cast<float>(eps),
                                    data.mutable_data_ptr<uint8_t>(),
                                    scale_inv.mutable_data_ptr<float>(),
                                    amax.mutable_data_ptr<float>()});
  return {data, scale_inv, amax};
}

std::tuple<Tensor, Tensor, Tensor> fp8_quantize(const Tensor& x, at::ScalarType fp8_dtype,
                                                bool force_pow_2_scales, double amax_epsilon) {
  Fp8Quantize::check(x, fp8_dtype, amax_epsilon);
  const auto guard = device_guard(x);
  return quantize(x, fp8_dtype, nullptr, force_pow_2_scales, amax_epsilon);
}

std::tuple<Tensor, Tensor, Tensor> fp8_quantize_scaled(const Tensor& x, const Tensor& scale_in,
                                                       at::ScalarType fp8_dtype) {
  Fp8QuantizeScaled::check(x, scale_in, fp8_dtype);
  const auto guard = device_guard(x);
  const Tensor scale = scale_in.contiguous();  // read by the kernel: no host round trip
  return quantize(x, fp8_dtype, scale.const_data_ptr<float>(), false, 0.0);
}

Tensor fp8_amax(const Tensor& x_in) {
  Fp8Amax::check(x_in);
  const auto guard = device_guard(x_in);
  Tensor amax = Fp8Amax::allocate(x_in);
  const Tensor x = kernel_input(x_in);
  // n = 0 writes amax = 0
  fp8_amax_stub(x.device().type(), Fp8AmaxArgs{x.scalar_type(), x.numel(), x.const_data_ptr(),
                                               amax.mutable_data_ptr<float>()});
  return amax;
}

Tensor fp8_current_scale(const Tensor& amax_in, at::ScalarType fp8_dtype, bool force_pow_2_scales,
                         double amax_epsilon) {
  Fp8CurrentScale::check(amax_in, fp8_dtype, amax_epsilon);
  const auto guard = device_guard(amax_in);
  Tensor scale = Fp8CurrentScale::allocate(amax_in);
  const Tensor amax = amax_in.contiguous();  // read by the kernel: no host round trip
  fp8_current_scale_stub(amax.device().type(),
                         Fp8CurrentScaleArgs{fp8_dtype, force_pow_2_scales,
                                             static_cast<float>(amax_epsilon),
                                             amax.const_data_ptr<float>(),
                                             scale.mutable_data_ptr<float>()});
  return scale;
}

Tensor fp8_dequantize(const Tensor& data_in, const Tensor& scale_inv_in, at::ScalarType fp8_dtype,
                      at::ScalarType dtype) {
  Fp8Dequantize::check(data_in, scale_inv_in, fp8_dtype, dtype);
  const auto guard = device_guard(data_in);
  Tensor out = Fp8Dequantize::allocate(data_in, dtype);
  if (out.numel() == 0) return out;
  const Tensor data = data_in.contiguous();
  const Tensor scale_inv = scale_inv_in.contiguous();
  fp8_dequantize_stub(data.device().type(),
                      Fp8DequantizeArgs{fp8_dtype, dtype, data.numel(),
                                        data.const_data_ptr<uint8_t>(),
                                        scale_inv.const_data_ptr<float>(), nullptr,
                                        out.mutable_data_ptr()});
  return out;
}

std::tuple<Tensor, Tensor> mxfp8_quantize(const Tensor& x_in, at::ScalarType fp8_dtype) {
  Mxfp8Quantize::check(x_in, fp8_dtype);
  const auto guard = device_guard(x_in);
  auto [data, scales] = Mxfp8Quantize::allocate(x_in);
  if (data.numel() == 0) return {data, scales};
  // x.t() of a row-major [R, C] (how the MXFP8 quantizer passes its columnwise copy) is read
  // in place by the CPU kernel, without the transposed copy
  const bool transposed = x_in.is_cpu() && x_in.dim() == 2 && x_in.scalar_type() != at::kDouble &&
                          x_in.size(0) > 1 && x_in.stride(0) == 1 &&
                          x_in.stride(1) == x_in.size(0);
  const Tensor x = transposed ? x_in : kernel_input(x_in);
  mxfp8_quantize_stub(x.device().type(),
                      Mxfp8QuantizeArgs{x.scalar_type(), fp8_dtype,
                                        x.numel() / fp8::kMXFP8BlockSize, x.const_data_ptr(),
                                        data.mutable_data_ptr<uint8_t>(),
                                        scales.mutable_data_ptr<uint8_t>(),
                                        transposed ? x_in.size(1) : 0});
  return {data, scales};
}

Tensor mxfp8_dequantize(const Tensor& data_in, const Tensor& scale_in, at::ScalarType fp8_dtype,
                        at::ScalarType dtype) {
  Mxfp8Dequantize::check(data_in, scale_in, fp8_dtype, dtype);
  const auto guard = device_guard(data_in);
  Tensor out = Mxfp8Dequantize::allocate(data_in, dtype);
  if (out.numel() == 0) return out;
  const Tensor data = data_in.contiguous();
  const Tensor scales = scale_in.contiguous();
  fp8_dequantize_stub(data.device().type(),
                      Fp8DequantizeArgs{fp8_dtype, dtype, data.numel(),
                                        data.const_data_ptr<uint8_t>(), nullptr,
                                        scales.const_data_ptr<uint8_t>(),
                                        out.mutable_data_ptr()});
  return out;
}

void fp8_delayed_scaling_update(const Tensor& h, const Tensor& scale, double fp8_max,
                                int64_t margin, c10::string_view algo) {
  Fp8DelayedScalingUpdate::check(h, scale, fp8_max, margin, algo);
  const auto guard = device_guard(h);
  if (h.numel() == 0) return;
  // a non-contiguous state is updated through contiguous copies
  const Tensor hc = h.contiguous();
  const Tensor sc = scale.contiguous();
  // float(2^margin) as the Python rule divides by it: exact, +inf from margin 128 on
  const int exponent = static_cast<int>(std::min<int64_t>(margin, 2048));
  const float margin_div = static_cast<float>(std::ldexp(1.0, exponent));
  delayed_scaling_update_stub(
      h.device().type(),
      DelayedScalingUpdateArgs{h.size(0), h.size(1), algo == "most_recent",
                               static_cast<float>(fp8_max), margin_div,
                               hc.mutable_data_ptr<float>(), sc.mutable_data_ptr<float>()});
  if (!hc.is_same(h)) const_cast<Tensor&>(h).copy_(hc);
  if (!sc.is_same(scale)) const_cast<Tensor&>(scale).copy_(sc);
}

void register_front_ends(torch::Library& m) {
  m.impl("fp8_delayed_scaling_update", fp8_delayed_scaling_update);
  m.impl("fp8_quantize", fp8_quantize);
  m.impl("fp8_quantize_scaled", fp8_quantize_scaled);
  m.impl("fp8_amax", fp8_amax);
  m.impl("fp8_current_scale", fp8_current_scale);
  m.impl("fp8_dequantize", fp8_dequantize);
  m.impl("mxfp8_quantize", mxfp8_quantize);
  m.impl("mxfp8_dequantize", mxfp8_dequantize);
}

// ---- Meta kernels ----

std::tuple<Tensor, Tensor, Tensor> fp8_quantize_meta(const Tensor& x, at::ScalarType fp8_dtype,
                                                     bool, double amax_epsilon) {
  Fp8Quantize::check(x, fp8_dtype, amax_epsilon);
  return Fp8Quantize::allocate(x);
}

std::tuple<Tensor, Tensor, Tensor> fp8_quantize_scaled_meta(const Tensor& x, const Tensor& scale,
                                                            at::ScalarType fp8_dtype) {
  Fp8QuantizeScaled::check(x, scale, fp8_dtype);
  return Fp8Quantize::allocate(x);
}

Tensor fp8_amax_meta(const Tensor& x) {
  Fp8Amax::check(x);
  return Fp8Amax::allocate(x);
}

Tensor fp8_current_scale_meta(const Tensor& amax, at::ScalarType fp8_dtype, bool,
                              double amax_epsilon) {
  Fp8CurrentScale::check(amax, fp8_dtype, amax_epsilon);
  return Fp8CurrentScale::allocate(amax);
}

Tensor fp8_dequantize_meta(const Tensor& data, const Tensor& scale_inv, at::ScalarType fp8_dtype,
                           at::ScalarType dtype) {
  Fp8Dequantize::check(data, scale_inv, fp8_dtype, dtype);
  return Fp8Dequantize::allocate(data, dtype);
}

std::tuple<Tensor, Tensor> mxfp8_quantize_meta(const Tensor& x, at::ScalarType fp8_dtype) {
  Mxfp8Quantize::check(x, fp8_dtype);
  return Mxfp8Quantize::allocate(x);
}

Tensor mxfp8_dequantize_meta(const Tensor& data, const Tensor& scale_e8m0,
                             at::ScalarType fp8_dtype, at::ScalarType dtype) {
  Mxfp8Dequantize::check(data, scale_e8m0, fp8_dtype, dtype);
  return Mxfp8Dequantize::allocate(data, dtype);
}

void fp8_delayed_scaling_update_meta(const Tensor& h, const Tensor& scale, double fp8_max,
                                     int64_t margin, c10::string_view algo) {
  Fp8DelayedScalingUpdate::check(h, scale, fp8_max, margin, algo);
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, Meta, m) {
  m.impl("fp8_delayed_scaling_update", fp8_delayed_scaling_update_meta);
  m.impl("fp8_quantize", fp8_quantize_meta);
  m.impl("fp8_quantize_scaled", fp8_quantize_scaled_meta);
  m.impl("fp8_amax", fp8_amax_meta);
  m.impl("fp8_current_scale", fp8_current_scale_meta);
  m.impl("fp8_dequantize", fp8_dequantize_meta);
  m.impl("mxfp8_quantize", mxfp8_quantize_meta);
  m.impl("mxfp8_dequantize", mxfp8_dequantize_meta);
}

TE_REGISTER_FRONT_ENDS(register_front_ends)

}  // namespace te_cpp
