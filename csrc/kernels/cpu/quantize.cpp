// CPU kernels of the quantize family: FP8 per-tensor current / delayed scaling and MXFP8.
//
// The amax reduction runs over fixed blocks of kAmaxBlock elements (one private maximum per
// block, then the block maxima in order), so the result depends only on the shape. at::vec's
// maximum propagates NaN, so a NaN anywhere gives amax NaN (and scale 1, te_ops.md 4.3).
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <array>
#include <vector>

#include "common/vec.h"
#include "ops/quantize.h"

namespace te_cpp {
namespace {

using fp8::kE4M3;
using fp8::kE5M2;

constexpr int64_t kAmaxBlock = 16384;

// Calls f(std::integral_constant<int64_t, F>{}) for the runtime format.
template <typename Fn>
decltype(auto) visit_format(int64_t fmt, const Fn& f) {
  if (fmt == kE4M3) return f(std::integral_constant<int64_t, kE4M3>{});
  return f(std::integral_constant<int64_t, kE5M2>{});
}

// Inputs the kernels read: fp32, bf16, fp16 as they are; fp64 is first rounded to fp32 (the
// algorithm is defined on x in fp32).
Tensor as_kernel_input(const Tensor& x) {
  return (x.scalar_type() == at::kDouble ? x.to(at::kFloat) : x).contiguous();
}

#define TE_DISPATCH_QUANT_INPUT(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, TYPE, NAME, __VA_ARGS__)

template <typename T>
float amax_of(const T* x, int64_t n) {
  using V = at::vec::Vectorized<float>;
  constexpr int64_t W = V::size();
  const int64_t nblocks = (n + kAmaxBlock - 1) / kAmaxBlock;
  std::vector<float> partial(std::max<int64_t>(nblocks, 1), 0.0f);
  at::parallel_for(0, nblocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t i0 = b * kAmaxBlock;
      const int64_t i1 = std::min(n, i0 + kAmaxBlock);
      V acc(0.0f);
      int64_t i = i0;
      for (; i + W <= i1; i += W) acc = at::vec::maximum(acc, load_acc<T>(x + i).abs());
      if (i < i1) acc = at::vec::maximum(acc, load_acc<T>(x + i, i1 - i).abs());  // zero-padded
      alignas(64) float lanes[W];
      acc.store(lanes);
      float m = 0.0f;
      for (int64_t k = 0; k < W; ++k) {
        m = (std::isnan(lanes[k]) || lanes[k] > m) ? lanes[k] : m;
        if (std::isnan(m)) break;
      }
      partial[b] = m;
    }
  });
  float amax = 0.0f;
  for (float p : partial) {
    if (std::isnan(p)) return p;
    amax = p > amax ? p : amax;
  }
  return amax;
}

// data[i] = cast_to_fp8(float(x[i]) * scale): one fp32 multiply, then the saturating RNE cast.
template <typename T, int64_t F>
void cast_scaled(const T* x, uint8_t* out, int64_t n, float scale) {
  using V = at::vec::Vectorized<float>;
  constexpr int64_t W = V::size();
  const V s(scale);
  at::parallel_for(0, n, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
    alignas(64) float buf[W];
    int64_t i = i0;
#if defined(CPU_CAPABILITY_AVX512)
    // full vectors: clamp to +-fp8_max (NaN stays NaN) and ATen's vectorised RNE fp8 cast
    using F8 = std::conditional_t<F == fp8::kE4M3, c10::Float8_e4m3fn, c10::Float8_e5m2>;
    constexpr float m = F == fp8::kE4M3 ? 448.0f : 57344.0f;
    const V hi(m), lo(-m);
    for (; i + W <= i1; i += W) {
      const V v = at::vec::clamp(load_acc<T>(x + i) * s, lo, hi);
      const V keep_nan = V::blendv(v, load_acc<T>(x + i) * s, v != v);
      at::vec::convert<F8>(keep_nan).store(reinterpret_cast<F8*>(out + i), W);
    }
#endif
    for (; i < i1; i += W) {
      const int64_t k = std::min<int64_t>(W, i1 - i);
      (load_acc<T>(x + i, k) * s).store(buf);
      for (int64_t j = 0; j < k; ++j) out[i + j] = fp8::cast_to_fp8<F>(buf[j]);
    }
  });
}

// Shared by fp8_quantize and fp8_quantize_scaled: amax, the scale (from amax or given), the cast.
template <typename ScaleFn>
std::tuple<Tensor, Tensor, Tensor> quantize_impl(const Tensor& x_in, int64_t fmt,
                                                 const ScaleFn& scale_of) {
  auto [data, scale_inv, amax_out] = Fp8Quantize::allocate(x_in);
  const Tensor x = as_kernel_input(x_in);
  const int64_t n = x.numel();
  TE_DISPATCH_QUANT_INPUT(x.scalar_type(), "fp8_quantize", [&] {
    using T = std::conditional_t<std::is_same_v<scalar_t, double>, float, scalar_t>;
    const T* xp = x.const_data_ptr<T>();
    const float amax = amax_of<T>(xp, n);
    const float scale = scale_of(amax);
    visit_format(fmt, [&](auto F) {
      cast_scaled<T, decltype(F)::value>(xp, data.mutable_data_ptr<uint8_t>(), n, scale);
    });
    scale_inv.mutable_data_ptr<float>()[0] = 1.0f / scale;
    amax_out.mutable_data_ptr<float>()[0] = amax;
  });
  return {data, scale_inv, amax_out};
}

std::tuple<Tensor, Tensor, Tensor> fp8_quantize_cpu(const Tensor& x, int64_t fp8_format,
                                                    bool force_pow_2_scales,
                                                    double amax_epsilon) {
  Fp8Quantize::check("fp8_quantize", x, fp8_format);
  Fp8Quantize::check_epsilon("fp8_quantize", amax_epsilon);
  const float fp8_max = fp8::max_norm(fp8_format);
  const float eps = static_cast<float>(amax_epsilon);
  return quantize_impl(x, fp8_format, [&](float amax) {
    return fp8::compute_scale(amax, fp8_max, force_pow_2_scales, eps);
  });
}

std::tuple<Tensor, Tensor, Tensor> fp8_quantize_scaled_cpu(const Tensor& x, const Tensor& scale,
                                                           int64_t fp8_format) {
  Fp8Quantize::check("fp8_quantize_scaled", x, fp8_format);
  Fp8Quantize::check_scale("fp8_quantize_scaled", x, scale);
  const float s = scale.item<float>();
  return quantize_impl(x, fp8_format, [&](float) { return s; });
}

template <int64_t F>
std::array<float, 256> fp8_table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) t[b] = fp8::fp8_to_float<F>(static_cast<uint8_t>(b));
  return t;
}

const std::array<float, 256>& table_for(int64_t fmt) {
  static const std::array<float, 256> e4m3 = fp8_table<kE4M3>();
  static const std::array<float, 256> e5m2 = fp8_table<kE5M2>();
  return fmt == kE4M3 ? e4m3 : e5m2;
}

// out[i] = T(table[data[i]] * s(i)), the product in fp32.
template <typename SFn>
void dequantize_into(const Tensor& data, const Tensor& out, int64_t fmt, const SFn& s_of) {
  const auto& table = table_for(fmt);
  const uint8_t* dp = data.const_data_ptr<uint8_t>();
  const int64_t n = data.numel();
  TE_DISPATCH_FLOAT(out.scalar_type(), "fp8_dequantize", [&] {
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) op[i] = static_cast<scalar_t>(table[dp[i]] * s_of(i));
    });
  });
}

Tensor fp8_dequantize_cpu(const Tensor& data_in, const Tensor& scale_inv, int64_t fp8_format,
                          at::ScalarType dtype) {
  Fp8Dequantize::check(data_in, scale_inv, fp8_format, dtype);
  Tensor out = Fp8Dequantize::allocate(data_in, dtype);
  const float s = scale_inv.item<float>();
  dequantize_into(data_in.contiguous(), out, fp8_format, [s](int64_t) { return s; });
  return out;
}

// MXFP8 (TE quantize_mxfp8.cuh, rowwise): per block of 32 consecutive elements of the last
// dim, amax = max |x| ignoring NaN (fmaxf); e = float_to_e8m0(amax * float(1/fp8_max));
// data = cast_to_fp8(x * e8m0_rcp(e)).
template <typename T, int64_t F>
void mxfp8_quantize_blocks(const T* x, uint8_t* data, uint8_t* scales, int64_t nblocks) {
  constexpr int64_t B = fp8::kMXFP8BlockSize;
  constexpr int64_t W = at::vec::Vectorized<float>::size();
  static_assert(B % W == 0, "block must be a whole number of vectors");
  const float max_norm_rcp =
      static_cast<float>(1.0 / static_cast<double>(F == kE4M3 ? 448.0 : 57344.0));
  at::parallel_for(0, nblocks, std::max<int64_t>(1, kParallelGrainElems / B),
                   [&](int64_t b0, int64_t b1) {
    alignas(64) float buf[B];
    for (int64_t b = b0; b < b1; ++b) {
      const T* xb = x + b * B;
      for (int64_t j = 0; j < B; j += W) load_acc<T>(xb + j).store(buf + j);
      float amax = 0.0f;
      for (int64_t j = 0; j < B; ++j) amax = std::fmax(amax, std::fabs(buf[j]));
      const uint8_t e = fp8::float_to_e8m0(amax * max_norm_rcp);
      const float rcp = fp8::e8m0_rcp(e);
      scales[b] = e;
      uint8_t* db = data + b * B;
      for (int64_t j = 0; j < B; ++j) db[j] = fp8::cast_to_fp8<F>(buf[j] * rcp);
    }
  });
}

std::tuple<Tensor, Tensor> mxfp8_quantize_cpu(const Tensor& x_in, int64_t fp8_format) {
  Mxfp8Quantize::check(x_in, fp8_format);
  auto [data, scales] = Mxfp8Quantize::allocate(x_in);
  const Tensor x = as_kernel_input(x_in);
  const int64_t nblocks = x.numel() / fp8::kMXFP8BlockSize;
  TE_DISPATCH_QUANT_INPUT(x.scalar_type(), "mxfp8_quantize", [&] {
    using T = std::conditional_t<std::is_same_v<scalar_t, double>, float, scalar_t>;
    visit_format(fp8_format, [&](auto F) {
      mxfp8_quantize_blocks<T, decltype(F)::value>(x.const_data_ptr<T>(),
                                                    data.mutable_data_ptr<uint8_t>(),
                                                    scales.mutable_data_ptr<uint8_t>(), nblocks);
    });
  });
  return {data, scales};
}

Tensor mxfp8_dequantize_cpu(const Tensor& data_in, const Tensor& scale_in, int64_t fp8_format,
                            at::ScalarType dtype) {
  Mxfp8Dequantize::check(data_in, scale_in, fp8_format, dtype);
  Tensor out = Mxfp8Dequantize::allocate(data_in, dtype);
  const Tensor scales = scale_in.contiguous();
  std::array<float, 256> pow2{};
  for (int e = 0; e < 256; ++e) pow2[e] = fp8::e8m0_to_float(static_cast<uint8_t>(e));
  const uint8_t* sp = scales.const_data_ptr<uint8_t>();
  dequantize_into(data_in.contiguous(), out, fp8_format,
                  [&](int64_t i) { return pow2[sp[i / fp8::kMXFP8BlockSize]]; });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, CPU, m) {
  m.impl("fp8_quantize", fp8_quantize_cpu);
  m.impl("fp8_quantize_scaled", fp8_quantize_scaled_cpu);
  m.impl("fp8_dequantize", fp8_dequantize_cpu);
  m.impl("mxfp8_quantize", mxfp8_quantize_cpu);
  m.impl("mxfp8_dequantize", mxfp8_dequantize_cpu);
}

}  // namespace te_cpp
