// Compile-only check (tests/test_fp8_quantize.py, where nvcc is found) that the shared rules of
// csrc/common/fp8.h and csrc/common/dropout_math.h are valid CUDA device code: every function
// called from a kernel, for both FP8 formats. nvcc -ptx compiles the device code only; the
// kernels are never run.
#include "common/dropout_math.h"
#include "common/fp8.h"

namespace {

namespace fp8 = te_cpp::fp8;

template <c10::ScalarType F>
__global__ void fp8_kernel(const float* x, uint8_t* data, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float scale = fp8::compute_scale(
      fp8::float_of(fp8::abs_bits(x[0]) | fp8::abs_bits_skip_nan(x[1]) |
                    fp8::abs_bits16_skip_nan<true>(static_cast<uint16_t>(i)) |
                    fp8::abs_bits16_skip_nan<false>(static_cast<uint16_t>(n))),
      fp8::max_norm(F), true, 1e-3f);
  data[i] = fp8::cast_to_fp8<F>(x[i] * scale);
  const uint8_t e = fp8::mxfp8_block_exponent<F>(x[i]);
  const float mx = fp8::cast_to_fp8<F>(x[i] * fp8::e8m0_rcp(e)) + fp8::float_to_e8m0(x[i]);
  out[i] = fp8::fp8_to_float<F>(data[i]) * fp8::scale_inv(scale) + mx * fp8::e8m0_to_float(e) +
           fp8::max_norm_rcp<F>() + (fp8::is_nan(x[i]) || fp8::is_inf(x[i]) ? 1.0f : 0.0f) +
           fp8::delayed_scale(fp8::history_max(x[0], x[i]), x[1], fp8::max_norm(F), 2.0f) +
           fp8::compute_scale(fp8::block_amax_step(x[2], x[i]), fp8::max_norm(F), false, 0.0f,
                              3.0e38f);
}

__global__ void dropout_kernel(const int64_t* seed, uint8_t* mask, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  at::philox_engine rng = te_cpp::dropout::engine_at(static_cast<uint64_t>(*seed), i);
  mask[i] = te_cpp::dropout::keep(rng(), uint64_t{1} << 31) ? 1 : 0;
}

}  // namespace

// Instantiates everything above (the symbol is never called).
void te_cpp_quantize_math_device_check(const float* x, uint8_t* data, float* out,
                                       const int64_t* seed, int n) {
  fp8_kernel<fp8::kE4M3><<<1, 32>>>(x, data, out, n);
  fp8_kernel<fp8::kE5M2><<<1, 32>>>(x, data, out, n);
  dropout_kernel<<<1, 32>>>(seed, data, n);
}
