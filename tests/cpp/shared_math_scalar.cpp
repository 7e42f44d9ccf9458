// The shared math of csrc/common/activation_math.h and csrc/common/norm_math.h instantiated on
// float and double, the way a CUDA kernel runs it (one element at a time, the math library's
// exp and tanh), for tests/test_shared_math.py to compare with the CPU kernels.
//
//   shared_math_scalar IN OUT
// IN:  int64 N, R, n; then float64 arrays x[N], b[N], g[N] (activations: unary on x, gated on
//      (a, b) = (x, b), incoming gradient g) and x[R*n], dy[R*n], w[n], beta[n] (norms).
// OUT: float64 arrays, for float then double:
//      per unary activation (TE_UNARY order): f[N], gx[N];
//      per gated activation (TE_GATED order): y[N], da[N], db[N];
//      per zero_centered_gamma in (0, 1), eps in (1e-5, 0): LayerNorm y[R*n], mu[R], rstd[R],
//      dx[R*n]; RMSNorm y[R*n], rstd[R], dx[R*n];
//      per eps in (1e-6, 0): L2Normalization y[R*n], rnorm[R], dx[R*n].
// The row sums are plain sequential loops (a CUDA kernel's reduction order is its own).
#include <cstdint>
#include <cstdio>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/activation_math.h"
#include "common/norm_math.h"

namespace {

using te_cpp::Act;
using te_cpp::ActConfig;
namespace math = te_cpp::math;

// Calls f(std::integral_constant<Act, K>{}) for each K in order.
template <Act... Ks, typename F>
void each(const F& f) {
  (f(std::integral_constant<Act, Ks>{}), ...);
}
#define TE_UNARY Act::GELU, Act::RELU, Act::SILU, Act::QGELU, Act::SRELU
#define TE_GATED                                                           \
  Act::GLU, Act::GEGLU, Act::QGEGLU, Act::REGLU, Act::SREGLU, Act::SWIGLU, \
      Act::CLAMPED_SWIGLU, Act::SITUGLU

// The parameters tests/test_shared_math.py passes to the ops.
ActConfig config(Act a) {
  if (a == Act::CLAMPED_SWIGLU) return ActConfig{a, 7.0, 1.702, 1.0};
  if (a == Act::SITUGLU) return ActConfig{a, 1.5, 0.75};
  return ActConfig{a};
}

struct Out {
  std::vector<double> data;
  template <typename A>
  void put(const std::vector<A>& v) {
    data.insert(data.end(), v.begin(), v.end());
  }
};

template <typename A>
std::vector<A> cast(const std::vector<double>& v) {
  return std::vector<A>(v.begin(), v.end());
}

template <typename A>
void activations(const std::vector<double>& x64, const std::vector<double>& b64,
                 const std::vector<double>& g64, Out& out) {
  const auto x = cast<A>(x64), b = cast<A>(b64), g = cast<A>(g64);
  const size_t n = x.size();
  each<TE_UNARY>([&](auto k) {
    constexpr Act a = decltype(k)::value;
    const typename math::ActMath<a, A>::Act act(config(a));
    std::vector<A> f(n), gx(n);
    for (size_t i = 0; i < n; ++i) {
      A fi;
      act.grad(x[i], g[i], fi, gx[i]);
      f[i] = act.f(x[i]);
    }
    out.put(f);
    out.put(gx);
  });
  each<TE_GATED>([&](auto k) {
    constexpr Act a = decltype(k)::value;
    const math::Gated<a, A> gated(config(a));
    std::vector<A> y(n), da(n), db(n);
    for (size_t i = 0; i < n; ++i) {
      A fa, fb;
      y[i] = gated.f(x[i], b[i]);
      gated.grad(x[i], b[i], g[i], fa, fb, da[i], db[i]);
    }
    out.put(y);
    out.put(da);
    out.put(db);
  });
}

template <typename A, bool kCentered>
void norm(const std::vector<A>& x, const std::vector<A>& dy, const std::vector<A>& w,
          const std::vector<A>& beta, int64_t R, int64_t n, bool zc, A eps, Out& out) {
  std::vector<A> y(R * n), mu(R), rstd(R), dx(R * n), gamma(n);
  for (int64_t j = 0; j < n; ++j) gamma[j] = math::norm_gamma(w[j], zc);
  for (int64_t r = 0; r < R; ++r) {
    const A* xr = x.data() + r * n;
    const A* dyr = dy.data() + r * n;
    A s(0), var;
    if (kCentered) {
      for (int64_t j = 0; j < n; ++j) s += xr[j];
      mu[r] = math::row_mean(s, n);
      A ssd(0);
      for (int64_t j = 0; j < n; ++j) ssd += (xr[j] - mu[r]) * (xr[j] - mu[r]);
      var = math::row_mean(ssd, n);
    } else {
      for (int64_t j = 0; j < n; ++j) s += xr[j] * xr[j];
      var = math::row_mean(s, n);
    }
    rstd[r] = math::rsqrt_eps(var, eps);
    A sum_g(0), sum_gx(0);
    for (int64_t j = 0; j < n; ++j) {
      const A xh = math::norm_xhat<kCentered>(xr[j], mu[r], rstd[r]);
      y[r * n + j] = math::norm_out<kCentered>(xh, gamma[j], kCentered ? beta[j] : A(0));
      const A gj = dyr[j] * gamma[j];
      sum_g += gj;
      sum_gx += gj * xh;
    }
    const math::NormBwdRow<A> co = math::norm_bwd_row<kCentered>(sum_g, sum_gx, n, rstd[r]);
    for (int64_t j = 0; j < n; ++j) {
      const A xh = math::norm_xhat<kCentered>(xr[j], mu[r], rstd[r]);
      dx[r * n + j] = math::norm_dx(dyr[j] * gamma[j], xh, co.c1, co.c2, co.scale);
    }
  }
  out.put(y);
  if (kCentered) out.put(mu);
  out.put(rstd);
  out.put(dx);
}

template <typename A>
void l2norm(const std::vector<A>& x, const std::vector<A>& dy, int64_t R, int64_t n, A eps,
            Out& out) {
  std::vector<A> y(R * n), rn(R), dx(R * n);
  for (int64_t r = 0; r < R; ++r) {
    const A* xr = x.data() + r * n;
    const A* dyr = dy.data() + r * n;
    A ss(0);
    for (int64_t j = 0; j < n; ++j) ss += xr[j] * xr[j];
    rn[r] = math::rsqrt_eps(ss, eps);
    for (int64_t j = 0; j < n; ++j) y[r * n + j] = math::l2norm_out(xr[j], rn[r]);
    if (math::l2norm_bwd_row_is_nan(rn[r])) {
      for (int64_t j = 0; j < n; ++j) dx[r * n + j] = std::numeric_limits<A>::quiet_NaN();
      continue;
    }
    A k(0);
    for (int64_t j = 0; j < n; ++j) k += dyr[j] * y[r * n + j];
    for (int64_t j = 0; j < n; ++j) {
      dx[r * n + j] = math::l2norm_dx(dyr[j], y[r * n + j], k, rn[r]);
    }
  }
  out.put(y);
  out.put(rn);
  out.put(dx);
}

template <typename A>
void norms(const std::vector<double>& x64, const std::vector<double>& dy64,
           const std::vector<double>& w64, const std::vector<double>& b64, int64_t R, int64_t n,
           Out& out) {
  const auto x = cast<A>(x64), dy = cast<A>(dy64), w = cast<A>(w64), b = cast<A>(b64);
  for (bool zc : {false, true}) {
    for (double eps : {1e-5, 0.0}) {
      norm<A, true>(x, dy, w, b, R, n, zc, static_cast<A>(eps), out);
      norm<A, false>(x, dy, w, b, R, n, zc, static_cast<A>(eps), out);
    }
  }
  for (double eps : {1e-6, 0.0}) l2norm<A>(x, dy, R, n, static_cast<A>(eps), out);
}

std::vector<double> read(std::FILE* f, int64_t count) {
  std::vector<double> v(static_cast<size_t>(count));
  if (std::fread(v.data(), sizeof(double), v.size(), f) != v.size()) {
    std::fprintf(stderr, "short read\n");
    std::exit(1);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
    return 2;
  }
  std::FILE* in = std::fopen(argv[1], "rb");
  if (!in) return 1;
  int64_t hdr[3];
  if (std::fread(hdr, sizeof(int64_t), 3, in) != 3) return 1;
  const int64_t N = hdr[0], R = hdr[1], n = hdr[2];
  const auto x = read(in, N), b = read(in, N), g = read(in, N);
  const auto nx = read(in, R * n), ndy = read(in, R * n), nw = read(in, n), nb = read(in, n);
  std::fclose(in);
  Out out;
  activations<float>(x, b, g, out);
  norms<float>(nx, ndy, nw, nb, R, n, out);
  activations<double>(x, b, g, out);
  norms<double>(nx, ndy, nw, nb, R, n, out);
  std::FILE* o = std::fopen(argv[2], "wb");
  if (!o) return 1;
  std::fwrite(out.data.data(), sizeof(double), out.data.size(), o);
  std::fclose(o);
  return 0;
}
