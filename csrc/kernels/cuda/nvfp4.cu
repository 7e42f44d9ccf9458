// CUDA backend of NVFP4 quantize / dequantize (the stubs of ops/nvfp4.h). The rules that decide
// the bits are common/fp4.h's, the ones the CPU kernels run, so the bytes are the CPU's.
//
// Quantize, with no host synchronisation: the amax word is zeroed on the stream, pass 1 takes
// the maximum of the magnitude bit patterns of the (transformed) values per 16-element block
// and combines them with an integer atomicMax (exact in any order; NaN elements skipped, as on
// CPU); pass 2 reads the amax from device memory, one thread per block (per 16x16 tile for 2-D
// blocks: the tile's amax in a first loop over its rows, the rows quantized in a second).
#include <cstdint>

#include "common/dropout_math.h"
#include "kernels/cuda/launch.cuh"
#include "ops/nvfp4.h"
#include "ops/quantize.h"

namespace te_cpp {
namespace {

constexpr int64_t B = fp4::kBlock;

template <typename T>
__device__ inline void load_block(const T* __restrict__ x, int64_t cols, int64_t r, int64_t b,
                                  bool rht, float* v) {
  const T* p = x + r * cols + b * B;
  float t[B];
#pragma unroll
  for (int j = 0; j < B; ++j) t[j] = static_cast<float>(p[j]);
  if (rht) {
    fp4::rht16(t, v);
  } else {
#pragma unroll
    for (int j = 0; j < B; ++j) v[j] = t[j];
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    nvfp4_amax_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, bool rht,
                      unsigned int* __restrict__ amax_bits) {
  const int64_t nb = cols / B, units = rows * nb;
  uint32_t m = 0u;
  for (int64_t u = grid_start(); u < units; u += grid_stride()) {
    float v[B];
    load_block(x, cols, u / nb, u % nb, rht, v);
#pragma unroll
    for (int j = 0; j < B; ++j) m = max(m, fp8::abs_bits_skip_nan(v[j]));
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  if (threadIdx.x % 32 == 0 && m != 0u) atomicMax(amax_bits, m);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    nvfp4_quantize_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, bool rht,
                          int64_t h, const int64_t* __restrict__ seed_ptr,
                          const float* __restrict__ amax_ptr, uint8_t* __restrict__ data,
                          uint8_t* __restrict__ scales) {
  const int64_t nb = cols / B, groups = (rows + h - 1) / h, units = groups * nb;
  const float s_enc = fp4::global_encode_scale(*amax_ptr);
  for (int64_t u = grid_start(); u < units; u += grid_stride()) {
    const int64_t g = u / nb, b = u % nb;
    const int64_t r0 = g * h, r1 = min(rows, r0 + h);
    float v[B];
    float bamax = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
      load_block(x, cols, r, b, rht, v);
#pragma unroll
      for (int j = 0; j < B; ++j) bamax = fmaxf(bamax, fabsf(v[j]));
    }
    const uint8_t scale = fp4::block_scale_e4m3(bamax, s_enc);
    const float e = fp4::block_encode_scale(scale, s_enc);
    for (int64_t r = r0; r < r1; ++r) {
      load_block(x, cols, r, b, rht, v);
      const int64_t i0 = r * cols + b * B;
      uint8_t code[B];
      if (seed_ptr != nullptr) {
        at::philox_engine rng =
            dropout::engine_at(static_cast<uint64_t>(*seed_ptr), static_cast<uint64_t>(i0));
#pragma unroll
        for (int j = 0; j < B; ++j) code[j] = fp4::e2m1_stochastic(v[j] * e, rng());
      } else {
#pragma unroll
        for (int j = 0; j < B; ++j) code[j] = fp4::e2m1_rne(v[j] * e);
      }
      uint8_t* d = data + i0 / 2;
#pragma unroll
      for (int k = 0; k < B / 2; ++k) {
        d[k] = static_cast<uint8_t>(code[2 * k] | (code[2 * k + 1] << 4));
      }
      scales[r * nb + b] = scale;
    }
  }
}

void nvfp4_quantize_cuda(const Nvfp4QuantizeArgs& a) {
  const auto stream = current_stream();
  // the amax word starts at +0 (bits 0); pass 1 raises it
  C10_CUDA_CHECK(cudaMemsetAsync(a.amax, 0, sizeof(float), stream));
  const int64_t nb = a.cols / B;
  const int64_t h = a.block_2d ? B : 1;
  TE_DISPATCH_QUANT_INPUT(a.dtype, "nvfp4_quantize", [&] {
    using T = scalar_t;
    const T* x = static_cast<const T*>(a.x);
    nvfp4_amax_kernel<T><<<blocks_for(a.rows * nb), kThreads, 0, stream>>>(
        x, a.rows, a.cols, a.rht, reinterpret_cast<unsigned int*>(a.amax));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const int64_t units = (a.rows + h - 1) / h * nb;
    nvfp4_quantize_kernel<T><<<blocks_for(units), kThreads, 0, stream>>>(
        x, a.rows, a.cols, a.rht, h, a.seed, a.amax, a.data, a.scales);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// One thread per 16-element block.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    nvfp4_dequantize_kernel(const uint8_t* __restrict__ data, const uint8_t* __restrict__ scales,
                            const float* __restrict__ amax_ptr, int64_t nblocks, bool rht,
                            T* __restrict__ out) {
  const float amax = *amax_ptr;
  for (int64_t q = grid_start(); q < nblocks; q += grid_stride()) {
    const float s = fp4::dequant_scale(scales[q], amax);
    const uint8_t* d = data + q * (B / 2);
    float v[B], w[B];
#pragma unroll
    for (int k = 0; k < B / 2; ++k) {
      v[2 * k] = fp4::e2m1_to_float(d[k] & 0xF) * s;
      v[2 * k + 1] = fp4::e2m1_to_float(d[k] >> 4) * s;
    }
    if (rht) {
      fp4::rht16_inverse(v, w);
    } else {
#pragma unroll
      for (int j = 0; j < B; ++j) w[j] = v[j];
    }
    T* o = out + q * B;
#pragma unroll
    for (int j = 0; j < B; ++j) o[j] = static_cast<T>(w[j]);
  }
}

void nvfp4_dequantize_cuda(const Nvfp4DequantizeArgs& a) {
  const auto stream = current_stream();
  const int64_t nblocks = a.rows * (a.cols / B);
  TE_DISPATCH_FLOAT(a.out_dtype, "nvfp4_dequantize", [&] {
    using T = scalar_t;
    nvfp4_dequantize_kernel<T><<<blocks_for(nblocks), kThreads, 0, stream>>>(
        a.data, a.scales, a.amax, nblocks, a.rht, static_cast<T*>(a.out));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TE_REGISTER_KERNEL(nvfp4_quantize_stub, CUDA, nvfp4_quantize_cuda);
TE_REGISTER_KERNEL(nvfp4_dequantize_stub, CUDA, nvfp4_dequantize_cuda);

}  // namespace te_cpp
