// CPU backend of Float8BlockScaling's quantize ops (the stubs of ops/fp8_block.h; the scalar
// rules are common/fp8.h's, shared with CUDA). Each block's amax is an order-free maximum
// (NaN skipped), so the result does not depend on the thread count; the amax and the cast run
// on whole vectors (fp8_vec.h's amax_span_into and cast_span, the bytes of the scalar rules).
#include <ATen/Parallel.h>

#include <vector>

#include "kernels/cpu/fp8_vec.h"
#include "ops/fp8_block.h"
#include "ops/quantize.h"

namespace te_cpp {
namespace {

constexpr int64_t kB = fp8::kFp8BlockSize;

template <typename T, c10::ScalarType F>
void block_quantize(const Fp8BlockQuantizeArgs& a) {
  using V = at::vec::Vectorized<float>;
  const T* x = static_cast<const T*>(a.x);
  const int64_t rows = a.rows, cols = a.cols, ncb = (cols + kB - 1) / kB;
  constexpr float fmax = fp8::max_norm(F);
  auto scale_of = [&](float amax) {
    return fp8::compute_scale(amax, fmax, a.force_pow_2_scales, a.amax_epsilon, a.value_for_inf);
  };
  if (a.block_dim == 1) {
    // one row per task unit: ncb blocks of up to 128 elements
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = x + r * cols;
        uint8_t* dr = a.data + r * cols;
        for (int64_t b = 0; b < ncb; ++b) {
          const int64_t c0 = b * kB, len = std::min(cols, c0 + kB) - c0;
          V acc(0.0f);
          amax_span_into<T>(xr + c0, len, acc);
          const float s = scale_of(max_lane(acc));
          a.scale_inv[r * ncb + b] = fp8::scale_inv(s);
          cast_span<T, F>(xr + c0, dr + c0, len, s);
        }
      }
    });
    return;
  }
  // 128x128 tiles: one band of up to 128 rows per task unit
  const int64_t nrb = (rows + kB - 1) / kB;
  at::parallel_for(0, nrb, 1, [&](int64_t b0, int64_t b1) {
    std::vector<V> amax(ncb);
    std::vector<float> scale(ncb);
    for (int64_t rb = b0; rb < b1; ++rb) {
      const int64_t r0 = rb * kB, r1 = std::min(rows, r0 + kB);
      std::fill(amax.begin(), amax.end(), V(0.0f));
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = x + r * cols;
        for (int64_t b = 0; b < ncb; ++b) {
          const int64_t c0 = b * kB;
          amax_span_into<T>(xr + c0, std::min(cols, c0 + kB) - c0, amax[b]);
        }
      }
      for (int64_t b = 0; b < ncb; ++b) {
        scale[b] = scale_of(max_lane(amax[b]));
        a.scale_inv[rb * ncb + b] = fp8::scale_inv(scale[b]);
      }
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = x + r * cols;
        uint8_t* dr = a.data + r * cols;
        for (int64_t b = 0; b < ncb; ++b) {
          const int64_t c0 = b * kB;
          cast_span<T, F>(xr + c0, dr + c0, std::min(cols, c0 + kB) - c0, scale[b]);
        }
      }
    }
  });
}

void fp8_block_quantize_cpu(const Fp8BlockQuantizeArgs& a) {
  TE_DISPATCH_QUANT_INPUT(a.dtype, "fp8_block_quantize", [&] {
    using T = scalar_t;
    visit_format(a.fp8_dtype, [&](auto F) { block_quantize<T, decltype(F)::value>(a); });
  });
}

// out = T(fp8_to_float(data) * scale_inv of the element's block), the product in fp32
// (dequantize_span, per run of up to 128 elements of a row that share a scale).
void fp8_block_dequantize_cpu(const Fp8BlockDequantizeArgs& a) {
  const int64_t rows = a.rows, cols = a.cols, ncb = (cols + kB - 1) / kB;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
  TE_DISPATCH_FLOAT(a.out_dtype, "fp8_block_dequantize", [&] {
    using T = scalar_t;
    T* out = static_cast<T*>(a.out);
    visit_format(a.fp8_dtype, [&](auto Fc) {
      constexpr c10::ScalarType F = decltype(Fc)::value;
      at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* sr = a.scale_inv + (a.block_dim == 1 ? r : r / kB) * ncb;
          for (int64_t b = 0; b < ncb; ++b) {
            const int64_t c0 = b * kB, len = std::min(cols, c0 + kB) - c0;
            dequantize_span<F, T>(a.data + r * cols + c0, out + r * cols + c0, len, sr[b]);
          }
        }
      });
    });
  });
}

}  // namespace

TE_REGISTER_KERNEL(fp8_block_quantize_stub, CPU, fp8_block_quantize_cpu);
TE_REGISTER_KERNEL(fp8_block_dequantize_stub, CPU, fp8_block_dequantize_cpu);

}  // namespace te_cpp
