// Compile-only check (tests/test_nvfp4.py, where nvcc is found) that the shared rules of
// csrc/common/fp4.h are valid CUDA device code: every function called from a kernel. nvcc -ptx
// compiles the device code only; the kernel is never run.
#include "common/fp4.h"

namespace {

namespace fp4 = te_cpp::fp4;

__global__ void fp4_kernel(const float* x, const uint32_t* r, uint8_t* data, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float s_enc = fp4::global_encode_scale(x[0]);
  const uint8_t scale = fp4::block_scale_e4m3(x[1], s_enc);
  const float e = fp4::block_encode_scale(scale, s_enc);
  data[i] = fp4::e2m1_rne(x[i] * e) | fp4::e2m1_stochastic(x[i] * e, r[i]) |
            fp4::e2m1_code_of_magnitude(2.0f) | fp4::sign_bit(x[i]);
  float v[16], w[16];
  for (int j = 0; j < 16; ++j) v[j] = x[j];
  fp4::rht16(v, w);
  fp4::rht16_inverse(w, v);
  out[i] = fp4::e2m1_to_float(data[i]) * fp4::dequant_scale(scale, x[0]) + v[i % 16] +
           (fp4::m_negative(i % 16, 3) || fp4::h_negative(i % 16, 5) ? 1.0f : 0.0f);
}

}  // namespace

// Instantiates everything above (the symbol is never called).
void te_cpp_nvfp4_math_device_check(const float* x, const uint32_t* r, uint8_t* data, float* out,
                                    int n) {
  fp4_kernel<<<1, 32>>>(x, r, data, out, n);
}
