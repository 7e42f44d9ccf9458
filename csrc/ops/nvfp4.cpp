// Checks, allocation, Meta kernels and front end of NVFP4 quantize / dequantize.
#include "ops/nvfp4.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace te_cpp {

void Nvfp4Quantize::check(const Tensor& x, const c10::optional<Tensor>& sr_seed) {
  check_float(kName, "input", x);
  check_min_dim(kName, "input", x, 1);
  TE_CHECK(x.sym_size(-1) % fp4::kBlock == 0, kName,
           "input's last dimension must be a multiple of 16 (one E4M3 scale per 16 "
           "consecutive elements), got shape ", shape_str(x));
  if (sr_seed.has_value()) {
    const Tensor& s = *sr_seed;
    TE_CHECK(s.defined() && s.scalar_type() == at::kLong, kName,
             "sr_seed must be an int64 tensor, got ",
             s.defined() ? c10::toString(s.scalar_type()) : "undefined");
    TE_CHECK(s.sym_numel() == 1, kName, "sr_seed must have exactly one element, got shape ",
             shape_str(s));
    check_same_device(kName, "input", x, "sr_seed", s);
  }
}

std::tuple<Tensor, Tensor, Tensor> Nvfp4Quantize::allocate(const Tensor& x) {
  const auto opts = x.options().dtype(at::kByte);
  Tensor data = at::empty_symint(sizes_with_last(x, x.sym_size(-1) / 2), opts);
  Tensor scale = at::empty_symint(sizes_with_last(x, x.sym_size(-1) / fp4::kBlock), opts);
  Tensor amax = at::empty_symint({c10::SymInt(1)}, x.options().dtype(at::kFloat));
  return {data, scale, amax};
}

void Nvfp4Dequantize::check(const Tensor& data, const Tensor& scale, const Tensor& amax,
                            at::ScalarType dtype) {
  check_buffer(kName, "data", data, at::kByte, "two E2M1 codes per byte");
  check_min_dim(kName, "data", data, 1);
  TE_CHECK(data.sym_size(-1) % (fp4::kBlock / 2) == 0, kName,
           "data's last dimension must be a multiple of 8 (16 packed elements per block), got "
           "shape ", shape_str(data));
  check_buffer(kName, "scale_e4m3", scale, at::kByte, "E4M3 bytes");
  const auto expected = sizes_with_last(data, data.sym_size(-1) / (fp4::kBlock / 2));
  TE_CHECK(scale.sym_sizes() == c10::SymIntArrayRef(expected), kName,
           "scale_e4m3 must have shape ", c10::SymIntArrayRef(expected), " for data of shape ",
           shape_str(data), ", got ", shape_str(scale));
  check_scalar_buffer(kName, "amax", amax);
  check_same_device(kName, "data", data, "scale_e4m3", scale);
  check_same_device(kName, "data", data, "amax", amax);
  check_float_dtype(kName, "dtype", dtype);
}

Tensor Nvfp4Dequantize::allocate(const Tensor& data, at::ScalarType dtype) {
  return at::empty_symint(sizes_with_last(data, data.sym_size(-1) * 2),
                          data.options().dtype(dtype));
}

TE_DEFINE_STUB(nvfp4_quantize_stub, void(const Nvfp4QuantizeArgs&));
TE_DEFINE_STUB(nvfp4_dequantize_stub, void(const Nvfp4DequantizeArgs&));

namespace {

// ---- front end (the CPU and CUDA dispatch keys) ----

std::tuple<Tensor, Tensor, Tensor> nvfp4_quantize(const Tensor& x_in, bool rht, bool block_2d,
                                                  const c10::optional<Tensor>& sr_seed) {
  Nvfp4Quantize::check(x_in, sr_seed);
  const auto guard = device_guard(x_in);
  auto [data, scale, amax] = Nvfp4Quantize::allocate(x_in);
  if (x_in.numel() == 0) {
    amax.zero_();
    return {data, scale, amax};
  }
  // float64 is rounded to float32 first (the algorithm is defined on x in fp32)
  const Tensor x = (x_in.scalar_type() == at::kDouble ? x_in.to(at::kFloat) : x_in).contiguous();
  Tensor seed;
  if (sr_seed.has_value()) seed = sr_seed->contiguous();  // read by the kernel
  const int64_t cols = x.size(-1);
  nvfp4_quantize_stub(x.device().type(),
                      Nvfp4QuantizeArgs{x.scalar_type(), x.numel() / cols, cols,
                                        x.const_data_ptr(), rht, block_2d,
                                        seed.defined() ? seed.const_data_ptr<int64_t>() : nullptr,
                                        data.mutable_data_ptr<uint8_t>(),
                                        scale.mutable_data_ptr<uint8_t>(),
                                        amax.mutable_data_ptr<float>()});
  return {data, scale, amax};
}

Tensor nvfp4_dequantize(const Tensor& data_in, const Tensor& scale_in, const Tensor& amax_in,
                        bool rht, at::ScalarType dtype) {
  Nvfp4Dequantize::check(data_in, scale_in, amax_in, dtype);
  const auto guard = device_guard(data_in);
  Tensor out = Nvfp4Dequantize::allocate(data_in, dtype);
  if (out.numel() == 0) return out;
  const Tensor data = data_in.contiguous();
  const Tensor scale = scale_in.contiguous();
  const Tensor amax = amax_in.contiguous();
  const int64_t cols = out.size(-1);
  nvfp4_dequantize_stub(data.device().type(),
                        Nvfp4DequantizeArgs{dtype, out.numel() / cols, cols,
                                            data.const_data_ptr<uint8_t>(),
                                            scale.const_data_ptr<uint8_t>(),
                                            amax.const_data_ptr<float>(), rht,
                                            out.mutable_data_ptr()});
  return out;
}

void register_front_ends(torch::Library& m) {
  m.impl("nvfp4_quantize", nvfp4_quantize);
  m.impl("nvfp4_dequantize", nvfp4_dequantize);
}

// ---- Meta kernels ----

std::tuple<Tensor, Tensor, Tensor> nvfp4_quantize_meta(const Tensor& x, bool, bool,
                                                       const c10::optional<Tensor>& sr_seed) {
  Nvfp4Quantize::check(x, sr_seed);
  return Nvfp4Quantize::allocate(x);
}

Tensor nvfp4_dequantize_meta(const Tensor& data, const Tensor& scale, const Tensor& amax, bool,
                             at::ScalarType dtype) {
  Nvfp4Dequantize::check(data, scale, amax, dtype);
  return Nvfp4Dequantize::allocate(data, dtype);
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, Meta, m) {
  m.impl("nvfp4_quantize", nvfp4_quantize_meta);
  m.impl("nvfp4_dequantize", nvfp4_dequantize_meta);
}

TE_REGISTER_FRONT_ENDS(register_front_ends)

}  // namespace te_cpp
