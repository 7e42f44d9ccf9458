// Compile-only check (tests/test_shared_math.py, where nvcc is found) that the shared math of
// csrc/common/activation_math.h and csrc/common/norm_math.h is valid CUDA device code: every
// activation functor and norm formula instantiated in a kernel, on float and on double. The
// kernels are not meant to run (nor to be fast): nvcc -ptx compiles their device code only.
#include "common/activation_math.h"
#include "common/norm_math.h"

namespace {

using te_cpp::Act;
using te_cpp::ActConfig;
namespace math = te_cpp::math;

template <Act K, typename A>
__global__ void unary_kernel(typename math::ActMath<K, A>::Act act, const A* x, const A* g, A* y,
                             A* dx, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    A f;
    act.grad(x[i], g[i], f, dx[i]);
    y[i] = act.f(x[i]);
  }
}

template <Act K, typename A>
__global__ void gated_kernel(math::Gated<K, A> gated, const A* a, const A* b, const A* g, A* y,
                             A* da, A* db, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    A fa, fb;
    y[i] = gated.f(a[i], b[i]);
    gated.grad(a[i], b[i], g[i], fa, fb, da[i], db[i]);
  }
}

// One row per block, sequential sums in thread 0.
template <bool kCentered, typename A>
__global__ void norm_kernel(const A* x, const A* dy, const A* w, A* y, A* dx, int n, A eps,
                            bool zero_centered) {
  if (threadIdx.x != 0) return;
  const A* xr = x + blockIdx.x * n;
  const A* dyr = dy + blockIdx.x * n;
  A s(0), ssd(0), ssq(0);
  for (int j = 0; j < n; ++j) s += xr[j];
  const A mu = kCentered ? math::row_mean(s, n) : A(0);
  for (int j = 0; j < n; ++j) {
    ssd += (xr[j] - mu) * (xr[j] - mu);
    ssq += xr[j] * xr[j];
  }
  const A rstd = math::rsqrt_eps(math::row_mean(ssd, n), eps);
  A sum_g(0), sum_gx(0);
  for (int j = 0; j < n; ++j) {
    const A gamma = math::norm_gamma(w[j], zero_centered);
    const A xh = math::norm_xhat<kCentered>(xr[j], mu, rstd);
    y[blockIdx.x * n + j] = math::norm_out<kCentered>(xh, gamma, A(0));
    sum_g += dyr[j] * gamma;
    sum_gx += dyr[j] * gamma * xh;
  }
  const math::NormBwdRow<A> co = math::norm_bwd_row<kCentered>(sum_g, sum_gx, n, rstd);
  const A rnorm = math::rsqrt_eps(ssq, eps);
  const bool l2_nan = math::l2norm_bwd_row_is_nan(rnorm);
  for (int j = 0; j < n; ++j) {
    const A gamma = math::norm_gamma(w[j], zero_centered);
    const A xh = math::norm_xhat<kCentered>(xr[j], mu, rstd);
    const A l2 = l2_nan ? A(0) : math::l2norm_dx(dyr[j], math::l2norm_out(xr[j], rnorm), sum_g,
                                                  rnorm);
    dx[blockIdx.x * n + j] = math::norm_dx_add(dyr[j] * gamma, xh, co.c1, co.c2, co.scale, l2);
  }
}

template <typename A>
void launch_all(const A* x, const A* g, A* y, A* dx, int n) {
#define TE_UNARY_LAUNCH(K) \
  unary_kernel<K, A><<<1, 32>>>(typename math::ActMath<K, A>::Act(ActConfig{K}), x, g, y, dx, n);
#define TE_GATED_LAUNCH(K, ...)                                                       \
  gated_kernel<K, A><<<1, 32>>>(math::Gated<K, A>(ActConfig{K, __VA_ARGS__}), x, x, g, y, dx, \
                                dx, n);
  TE_UNARY_LAUNCH(Act::GELU)
  TE_UNARY_LAUNCH(Act::RELU)
  TE_UNARY_LAUNCH(Act::SILU)
  TE_UNARY_LAUNCH(Act::QGELU)
  TE_UNARY_LAUNCH(Act::SRELU)
  TE_GATED_LAUNCH(Act::GLU, 0)
  TE_GATED_LAUNCH(Act::GEGLU, 0)
  TE_GATED_LAUNCH(Act::QGEGLU, 0)
  TE_GATED_LAUNCH(Act::REGLU, 0)
  TE_GATED_LAUNCH(Act::SREGLU, 0)
  TE_GATED_LAUNCH(Act::SWIGLU, 0)
  TE_GATED_LAUNCH(Act::CLAMPED_SWIGLU, 7.0, 1.702, 1.0)
  TE_GATED_LAUNCH(Act::SITUGLU, 1.5, 0.75)
#undef TE_UNARY_LAUNCH
#undef TE_GATED_LAUNCH
  norm_kernel<true, A><<<1, 32>>>(x, g, x, y, dx, n, A(1e-5), true);
  norm_kernel<false, A><<<1, 32>>>(x, g, x, y, dx, n, A(1e-5), false);
}

}  // namespace

// Instantiates everything above (the symbols are never called).
void te_cpp_shared_math_device_check(const float* xf, float* yf, const double* xd, double* yd,
                                     int n) {
  launch_all<float>(xf, xf, yf, yf, n);
  launch_all<double>(xd, xd, yd, yd, n);
}
