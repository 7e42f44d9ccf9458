// CUDA backend of the quantize family: FP8 per-tensor current / delayed scaling, dequantize,
// MXFP8 (the stubs of ops/quantize.h). The rules that decide the bits are common/fp8.h's, the
// ones the CPU kernels run, so the bytes are the CPU's.
//
// Per-tensor quantize, with no host synchronisation: pass 1 reduces max |x| per block into a
// partial buffer (current scaling; with a given scale, pass 1 also casts); a one-block finish
// kernel reduces the partials, writes amax, derives the scale on the device (compute_scale, or
// the given scale read from device memory) and writes scale_inv and the scale the cast reads;
// pass 2 casts. The maximum is taken on magnitude bit patterns with NaN counted as 0
// (fp8::abs_bits_skip_nan; for bf16/fp16 fp8::abs_bits16_skip_nan on the 16-bit patterns, as
// the CPU's AVX512 path): an exact integer maximum, the same bits in any order, NaN elements
// skipped as by TransformerEngine's fmaxf reduction.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/fp8.h"
#include "kernels/cuda/launch.cuh"
#include "ops/quantize.h"

namespace te_cpp {
namespace {

using fp8::kE4M3;
using fp8::kE5M2;

// Blocks of the amax passes (the partial buffer's length): a grid-stride loop covers any size.
constexpr int64_t kAmaxBlocks = 1024;

template <typename Fn>
void visit_format(at::ScalarType fmt, const Fn& f) {
  if (fmt == kE4M3) {
    f(std::integral_constant<c10::ScalarType, kE4M3>{});
  } else {
    f(std::integral_constant<c10::ScalarType, kE5M2>{});
  }
}

// kVec elements of T in one aligned load or store (16 bytes of input).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};
template <int kBytes>
struct alignas(kBytes) BytePack {
  uint8_t v[kBytes];
};

// The magnitude key whose maximum is the amax, NaN counted as 0: fp32's abs bits, or for
// 16-bit types their own 16-bit magnitude (the same order; converted to fp32 once, at the end).
template <typename T>
__device__ inline uint32_t magnitude_key(T v) {
  if constexpr (sizeof(T) == 2) {
    return fp8::abs_bits16_skip_nan<std::is_same_v<T, c10::BFloat16>>(v.x);
  } else {
    return fp8::abs_bits_skip_nan(static_cast<float>(v));
  }
}

template <typename T>
__device__ inline float key_to_float(uint32_t key) {
  if constexpr (sizeof(T) == 2) {
    return static_cast<float>(T(static_cast<uint16_t>(key), T::from_bits()));
  } else {
    return fp8::float_of(key);
  }
}

// Maximum over the block's threads; the result is valid in thread 0.
__device__ inline uint32_t block_max(uint32_t m) {
  __shared__ uint32_t warp_max[kThreads / 32];
  m = __reduce_max_sync(0xFFFFFFFFu, m);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < kThreads / 32 ? warp_max[lane] : 0u;
    m = __reduce_max_sync(0xFFFFFFFFu, m);
  }
  return m;
}

// One pass over x: with kAmax, each block writes the maximum magnitude key of the elements it
// visited to partial[blockIdx.x]; with kCast, data[i] = cast(float(x[i]) * *scale).
template <typename T, c10::ScalarType F, int kVec, bool kAmax, bool kCast>
__global__ void __launch_bounds__(kThreads)
    quantize_pass_kernel(const T* __restrict__ x, uint8_t* __restrict__ data, int64_t n,
                         const float* __restrict__ scale_ptr, uint32_t* __restrict__ partial) {
  const float scale = kCast ? *scale_ptr : 1.0f;
  uint32_t m = 0;
  const int64_t nvec = n / kVec;
  for (int64_t v = grid_start(); v < nvec; v += grid_stride()) {
    const Pack<T, kVec> p = reinterpret_cast<const Pack<T, kVec>*>(x)[v];
    BytePack<kVec> out;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if constexpr (kAmax) m = max(m, magnitude_key(p.v[j]));
      if constexpr (kCast) out.v[j] = fp8::cast_to_fp8<F>(static_cast<float>(p.v[j]) * scale);
    }
    if constexpr (kCast) reinterpret_cast<BytePack<kVec>*>(data)[v] = out;
  }
  for (int64_t i = nvec * kVec + grid_start(); i < n; i += grid_stride()) {
    if constexpr (kAmax) m = max(m, magnitude_key(x[i]));
    if constexpr (kCast) data[i] = fp8::cast_to_fp8<F>(static_cast<float>(x[i]) * scale);
  }
  if constexpr (kAmax) {
    m = block_max(m);
    if (threadIdx.x == 0) partial[blockIdx.x] = m;
  }
}

// One block: amax from the partials; unless scale_inv is nullptr (fp8_amax: the amax only),
// the scale (given, or from amax) and scale_inv; the scale the cast reads goes to *scale_out.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    quantize_finish_kernel(const uint32_t* __restrict__ partial, int64_t nparts,
                           const float* __restrict__ given_scale, float fp8_max, bool pow2,
                           float epsilon, float* __restrict__ amax_out,
                           float* __restrict__ scale_inv, float* __restrict__ scale_out) {
  uint32_t m = 0;
  for (int64_t k = threadIdx.x; k < nparts; k += kThreads) m = max(m, partial[k]);
  m = block_max(m);
  if (threadIdx.x == 0) {
    const float amax = key_to_float<T>(m);
    *amax_out = amax;
    if (scale_inv == nullptr) return;
    const float scale =
        given_scale != nullptr ? *given_scale : fp8::compute_scale(amax, fp8_max, pow2, epsilon);
    *scale_inv = fp8::scale_inv(scale);
    if (scale_out != nullptr) *scale_out = scale;
  }
}

// Blocks of the amax pass over n elements read kVec at a time (the partial buffer's length).
template <int kVec>
unsigned amax_grid(int64_t n) {
  const int64_t units = std::max<int64_t>(n / kVec, 1);
  return static_cast<unsigned>(
      std::clamp<int64_t>((units + kThreads - 1) / kThreads, 1, kAmaxBlocks));
}

// Pass 1 of current scaling and all of fp8_amax: the per-block maxima into `partial` (the
// format is a template argument the amax-only pass does not use).
template <typename T, int kVec>
void launch_amax_pass(const T* x, int64_t n, unsigned blocks, uint32_t* partial,
                      cudaStream_t stream) {
  quantize_pass_kernel<T, kE4M3, kVec, true, false><<<blocks, kThreads, 0, stream>>>(
      x, nullptr, n, nullptr, partial);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int kVec>
void quantize_typed(const Fp8QuantizeArgs& a, cudaStream_t stream) {
  const int64_t units = std::max<int64_t>(a.n / kVec, 1);
  const unsigned amax_blocks = amax_grid<kVec>(a.n);
  const Workspace ws(static_cast<int64_t>(amax_blocks) * sizeof(uint32_t) + sizeof(float));
  uint32_t* partial = static_cast<uint32_t*>(ws.get());
  float* scale_ws = reinterpret_cast<float*>(partial + amax_blocks);
  const T* x = static_cast<const T*>(a.x);
  const float fp8_max = fp8::max_norm(a.fp8_dtype);
  visit_format(a.fp8_dtype, [&](auto fmt) {
    constexpr c10::ScalarType F = decltype(fmt)::value;
    if (a.scale != nullptr) {  // delayed scaling: amax and cast in one pass
      quantize_pass_kernel<T, F, kVec, true, true><<<amax_blocks, kThreads, 0, stream>>>(
          x, a.data, a.n, a.scale, partial);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      quantize_finish_kernel<T><<<1, kThreads, 0, stream>>>(
          partial, amax_blocks, a.scale, fp8_max, false, 0.0f, a.amax, a.scale_inv, nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
    launch_amax_pass<T, kVec>(x, a.n, amax_blocks, partial, stream);
    quantize_finish_kernel<T><<<1, kThreads, 0, stream>>>(
        partial, amax_blocks, nullptr, fp8_max, a.force_pow_2_scales, a.amax_epsilon, a.amax,
        a.scale_inv, scale_ws);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (a.n == 0) return;
    quantize_pass_kernel<T, F, kVec, false, true><<<blocks_for(units), kThreads, 0, stream>>>(
        x, a.data, a.n, scale_ws, nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void fp8_quantize_cuda(const Fp8QuantizeArgs& a) {
  const auto stream = current_stream();
  TE_DISPATCH_QUANT_INPUT(a.dtype, "fp8_quantize", [&] {
    using T = scalar_t;
    if (aligned(a.x, 16)) {
      quantize_typed<T, kVec<T>>(a, stream);
    } else {
      quantize_typed<T, 1>(a, stream);
    }
  });
}

// fp8_quantize's amax alone: the same pass and finish kernel, so the same bits.
template <typename T, int kVec>
void amax_typed(const Fp8AmaxArgs& a, cudaStream_t stream) {
  const unsigned blocks = amax_grid<kVec>(a.n);
  const Workspace ws(static_cast<int64_t>(blocks) * sizeof(uint32_t));
  uint32_t* partial = static_cast<uint32_t*>(ws.get());
  launch_amax_pass<T, kVec>(static_cast<const T*>(a.x), a.n, blocks, partial, stream);
  quantize_finish_kernel<T><<<1, kThreads, 0, stream>>>(partial, blocks, nullptr, 0.0f, false,
                                                        0.0f, a.amax, nullptr, nullptr);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void fp8_amax_cuda(const Fp8AmaxArgs& a) {
  const auto stream = current_stream();
  TE_DISPATCH_QUANT_INPUT(a.dtype, "fp8_amax", [&] {
    using T = scalar_t;
    if (aligned(a.x, 16)) {
      amax_typed<T, kVec<T>>(a, stream);
    } else {
      amax_typed<T, 1>(a, stream);
    }
  });
}

// One thread: the scale from the amax in device memory.
__global__ void current_scale_kernel(const float* __restrict__ amax, float fp8_max, bool pow2,
                                     float epsilon, float* __restrict__ scale) {
  *scale = fp8::compute_scale(*amax, fp8_max, pow2, epsilon);
}

void fp8_current_scale_cuda(const Fp8CurrentScaleArgs& a) {
  current_scale_kernel<<<1, 1, 0, current_stream()>>>(a.amax, fp8::max_norm(a.fp8_dtype),
                                                     a.force_pow_2_scales, a.amax_epsilon,
                                                     a.scale);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// out[i] = OutT(fp8_to_float(data[i]) * s(i)), the product in fp32; the 256 decoded values
// come from a per-block table.
template <c10::ScalarType F, typename OutT, bool kMx>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const uint8_t* __restrict__ data, const float* __restrict__ scale_inv,
                      const uint8_t* __restrict__ e8m0, OutT* __restrict__ out, int64_t n) {
  __shared__ float table[256];
  table[threadIdx.x] = fp8::fp8_to_float<F>(static_cast<uint8_t>(threadIdx.x));
  __syncthreads();
  const float s = kMx ? 0.0f : *scale_inv;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const float si = kMx ? fp8::e8m0_to_float(e8m0[i / fp8::kMXFP8BlockSize]) : s;
    out[i] = static_cast<OutT>(table[data[i]] * si);
  }
}
static_assert(kThreads == 256, "dequantize_kernel fills its 256-entry table one per thread");

void fp8_dequantize_cuda(const Fp8DequantizeArgs& a) {
  const auto stream = current_stream();
  TE_DISPATCH_FLOAT(a.out_dtype, "fp8_dequantize", [&] {
    using OutT = scalar_t;
    visit_format(a.fp8_dtype, [&](auto fmt) {
      constexpr c10::ScalarType F = decltype(fmt)::value;
      if (a.e8m0 != nullptr) {
        dequantize_kernel<F, OutT, true><<<blocks_for(a.n), kThreads, 0, stream>>>(
            a.data, nullptr, a.e8m0, static_cast<OutT*>(a.out), a.n);
      } else {
        dequantize_kernel<F, OutT, false><<<blocks_for(a.n), kThreads, 0, stream>>>(
            a.data, a.scale_inv, nullptr, static_cast<OutT*>(a.out), a.n);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

// MXFP8: a group of kGroup = 32 / kVec consecutive threads handles one 32-element block, each
// thread kVec elements (one 16-byte load when aligned). The block amax (NaN elements skipped,
// fmaxf) is exact in any order; the group's threads combine theirs with shuffles, then each
// computes the block's exponent and multiplier (fp8::mxfp8_block_exponent, fp8::e8m0_rcp) and
// casts its elements.
template <typename T, c10::ScalarType F, int kVec>
__global__ void __launch_bounds__(kThreads)
    mxfp8_quantize_kernel(const T* __restrict__ x, uint8_t* __restrict__ data,
                          uint8_t* __restrict__ scales, int64_t nblocks) {
  constexpr int kGroup = static_cast<int>(fp8::kMXFP8BlockSize) / kVec;
  static_assert(kGroup >= 1 && kGroup <= 32 && kThreads % 32 == 0, "a group within a warp");
  const int lane = threadIdx.x % 32;
  // the lanes of this thread's group (the groups of a warp leave the loop independently)
  const unsigned group_mask =
      kGroup == 32 ? 0xFFFFFFFFu : ((1u << kGroup) - 1u) << (lane / kGroup * kGroup);
  const int64_t units = nblocks * kGroup;
  for (int64_t u = grid_start(); u < units; u += grid_stride()) {
    const int64_t b = u / kGroup;
    const Pack<T, kVec> p = reinterpret_cast<const Pack<T, kVec>*>(x)[u];
    float v[kVec];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      v[j] = static_cast<float>(p.v[j]);
      amax = fmaxf(amax, fabsf(v[j]));
    }
#pragma unroll
    for (int off = kGroup / 2; off > 0; off /= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(group_mask, amax, off));
    }
    const uint8_t e = fp8::mxfp8_block_exponent<F>(amax);
    const float rcp = fp8::e8m0_rcp(e);
    if (u % kGroup == 0) scales[b] = e;
    BytePack<kVec> out;
#pragma unroll
    for (int j = 0; j < kVec; ++j) out.v[j] = fp8::cast_to_fp8<F>(v[j] * rcp);
    reinterpret_cast<BytePack<kVec>*>(data)[u] = out;
  }
}

void mxfp8_quantize_cuda(const Mxfp8QuantizeArgs& a) {
  const auto stream = current_stream();
  TE_DISPATCH_QUANT_INPUT(a.dtype, "mxfp8_quantize", [&] {
    using T = scalar_t;
    const T* x = static_cast<const T*>(a.x);
    visit_format(a.fp8_dtype, [&](auto fmt) {
      constexpr c10::ScalarType F = decltype(fmt)::value;
      if (aligned(a.x, 16)) {
        constexpr int V = kVec<T>;
        const int64_t units = a.nblocks * (fp8::kMXFP8BlockSize / V);
        mxfp8_quantize_kernel<T, F, V><<<blocks_for(units), kThreads, 0, stream>>>(
            x, a.data, a.scales, a.nblocks);
      } else {
        const int64_t units = a.nblocks * fp8::kMXFP8BlockSize;
        mxfp8_quantize_kernel<T, F, 1><<<blocks_for(units), kThreads, 0, stream>>>(
            x, a.data, a.scales, a.nblocks);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

// Delayed scaling's update: one block per column (grid-stride over columns). Each pass over
// the history reads a chunk of kThreads rows (row i + 1 into position i, row 0 into the last
// position), waits for the block, then writes it back, so the in-place roll never reads a
// written value. The amax is a NaN-propagating maximum (fp8::history_max): its result does not
// depend on the order, except for which NaN, and a NaN amax keeps the old scale either way.
__global__ void __launch_bounds__(kThreads)
    delayed_scaling_update_kernel(float* __restrict__ history, float* __restrict__ scale,
                                  int64_t length, int64_t columns, bool most_recent,
                                  float fp8_max, float margin_div) {
  __shared__ float warp_max[kThreads / 32];
  for (int64_t j = blockIdx.x; j < columns; j += gridDim.x) {
    float* h = history + j;
    const float first = h[0];
    float m = first;
    for (int64_t off = 0; off < length; off += kThreads) {
      const int64_t i = off + threadIdx.x;
      float v = 0.0f;
      if (i < length) {
        v = i + 1 < length ? h[(i + 1) * columns] : first;
        m = fp8::history_max(m, v);
      }
      __syncthreads();
      if (i < length) h[i * columns] = i == 0 ? 0.0f : v;
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
      m = fp8::history_max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    }
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
      float amax = first;
      if (!most_recent) {
        for (int w = 0; w < kThreads / 32; ++w) amax = fp8::history_max(amax, warp_max[w]);
      }
      scale[j] = fp8::delayed_scale(amax, scale[j], fp8_max, margin_div);
    }
    __syncthreads();  // warp_max is reused by the next column
  }
}

void delayed_scaling_update_cuda(const DelayedScalingUpdateArgs& a) {
  const auto grid = static_cast<unsigned>(std::clamp<int64_t>(a.columns, 1, kMaxBlocks));
  delayed_scaling_update_kernel<<<grid, kThreads, 0, current_stream()>>>(
      a.history, a.scale, a.length, a.columns, a.most_recent, a.fp8_max, a.margin_div);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TE_REGISTER_KERNEL(delayed_scaling_update_stub, CUDA, delayed_scaling_update_cuda);
TE_REGISTER_KERNEL(fp8_quantize_stub, CUDA, fp8_quantize_cuda);
TE_REGISTER_KERNEL(fp8_amax_stub, CUDA, fp8_amax_cuda);
TE_REGISTER_KERNEL(fp8_current_scale_stub, CUDA, fp8_current_scale_cuda);
TE_REGISTER_KERNEL(fp8_dequantize_stub, CUDA, fp8_dequantize_cuda);
TE_REGISTER_KERNEL(mxfp8_quantize_stub, CUDA, mxfp8_quantize_cuda);

}  // namespace te_cpp
