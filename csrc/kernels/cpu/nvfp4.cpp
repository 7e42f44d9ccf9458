// CPU backend of NVFP4 quantize / dequantize (the stubs of ops/nvfp4.h; the scalar rules are
// common/fp4.h's, shared with CUDA). Scalar code over 16-element blocks, parallel over rows
// (row groups of 16 for 2-D blocks): every value is a function of its block alone, and the
// amax is an integer maximum of magnitude bit patterns, so the bytes do not depend on the
// thread count.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <vector>

#include "common/dropout_math.h"
#include "ops/nvfp4.h"
#include "ops/quantize.h"

namespace te_cpp {
namespace {

constexpr int64_t B = fp4::kBlock;

// The 16 values v of block b of row r (x in fp32, through fp4::rht16 when rht).
template <typename T>
inline void load_block(const T* x, int64_t cols, int64_t r, int64_t b, bool rht, float* v) {
  const T* p = x + r * cols + b * B;
  float t[B];
  for (int64_t j = 0; j < B; ++j) t[j] = static_cast<float>(p[j]);
  if (rht) {
    fp4::rht16(t, v);
  } else {
    std::copy(t, t + B, v);
  }
}

template <typename T>
void quantize(const Nvfp4QuantizeArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  const int64_t R = a.rows, C = a.cols, nb = C / B;
  // pass 1: amax = max |v| as the integer maximum of the magnitude bits (NaN skipped)
  std::vector<uint32_t> row_max(R, 0u);
  at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
    float v[B];
    for (int64_t r = r0; r < r1; ++r) {
      uint32_t m = 0u;
      for (int64_t b = 0; b < nb; ++b) {
        load_block(x, C, r, b, a.rht, v);
        for (int64_t j = 0; j < B; ++j) m = std::max(m, fp8::abs_bits_skip_nan(v[j]));
      }
      row_max[r] = m;
    }
  });
  const uint32_t amax_bits = R ? *std::max_element(row_max.begin(), row_max.end()) : 0u;
  const float amax = fp8::float_of(amax_bits);
  *a.amax = amax;
  const float s_enc = fp4::global_encode_scale(amax);
  const bool sr = a.seed != nullptr;
  const uint64_t seed = sr ? static_cast<uint64_t>(*a.seed) : 0u;
  // pass 2: per group of h rows (16 for 2-D blocks) and block column b
  const int64_t h = a.block_2d ? B : 1;
  const int64_t groups = (R + h - 1) / h;
  at::parallel_for(0, groups, a.block_2d ? 1 : 16, [&](int64_t g0, int64_t g1) {
    float v[B * B];
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t r0 = g * h, r1 = std::min(R, r0 + h);
      for (int64_t b = 0; b < nb; ++b) {
        float bamax = 0.0f;
        for (int64_t r = r0; r < r1; ++r) {
          float* vr = v + (r - r0) * B;
          load_block(x, C, r, b, a.rht, vr);
          for (int64_t j = 0; j < B; ++j) bamax = std::fmax(bamax, std::fabs(vr[j]));
        }
        const uint8_t scale = fp4::block_scale_e4m3(bamax, s_enc);
        const float e = fp4::block_encode_scale(scale, s_enc);
        for (int64_t r = r0; r < r1; ++r) {
          const float* vr = v + (r - r0) * B;
          const int64_t i0 = r * C + b * B;
          uint8_t code[B];
          if (sr) {
            at::philox_engine rng = dropout::engine_at(seed, static_cast<uint64_t>(i0));
            for (int64_t j = 0; j < B; ++j) code[j] = fp4::e2m1_stochastic(vr[j] * e, rng());
          } else {
            for (int64_t j = 0; j < B; ++j) code[j] = fp4::e2m1_rne(vr[j] * e);
          }
          uint8_t* d = a.data + i0 / 2;
          for (int64_t k = 0; k < B / 2; ++k) {
            d[k] = static_cast<uint8_t>(code[2 * k] | (code[2 * k + 1] << 4));
          }
          a.scales[r * nb + b] = scale;
        }
      }
    }
  });
}

void nvfp4_quantize_cpu(const Nvfp4QuantizeArgs& a) {
  TE_DISPATCH_QUANT_INPUT(a.dtype, "nvfp4_quantize", [&] { quantize<scalar_t>(a); });
}

void nvfp4_dequantize_cpu(const Nvfp4DequantizeArgs& a) {
  const int64_t R = a.rows, C = a.cols, nb = C / B;
  const float amax = *a.amax;
  TE_DISPATCH_FLOAT(a.out_dtype, "nvfp4_dequantize", [&] {
    using T = scalar_t;
    T* out = static_cast<T*>(a.out);
    at::parallel_for(0, R * nb, 256, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        const float s = fp4::dequant_scale(a.scales[q], amax);
        const uint8_t* d = a.data + q * (B / 2);
        float v[B], w[B];
        for (int64_t k = 0; k < B / 2; ++k) {
          v[2 * k] = fp4::e2m1_to_float(d[k] & 0xF) * s;
          v[2 * k + 1] = fp4::e2m1_to_float(d[k] >> 4) * s;
        }
        const float* src = v;
        if (a.rht) {
          fp4::rht16_inverse(v, w);
          src = w;
        }
        T* o = out + q * B;
        for (int64_t j = 0; j < B; ++j) o[j] = static_cast<T>(src[j]);
      }
    });
  });
}

}  // namespace

TE_REGISTER_KERNEL(nvfp4_quantize_stub, CPU, nvfp4_quantize_cpu);
TE_REGISTER_KERNEL(nvfp4_dequantize_stub, CPU, nvfp4_dequantize_cpu);

}  // namespace te_cpp
