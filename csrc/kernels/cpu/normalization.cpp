// CPU kernels of LayerNorm and RMSNorm (see ops/normalization.h for the conventions).
//
// Forward: each row is read from memory once and its statistics are computed from the cached
// row (for bf16/fp16 a converted fp32 copy of the row), in the accumulation type; the output
// is written in the same visit. Backward: one visit per row computes dx and adds the row's
// dgamma/dbeta contributions to its row block's partial sums (deterministic, see reduce.h).
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "common/vec.h"
#include "kernels/cpu/reduce.h"
#include "ops/normalization.h"

namespace te_cpp {
namespace {

using cpu::for_chunks;

template <typename A>
inline A hsum(const at::vec::Vectorized<A>& v) {
  alignas(64) A buf[at::vec::Vectorized<A>::size()];
  v.store(buf);
  A s(0);
  for (int64_t i = 0; i < at::vec::Vectorized<A>::size(); ++i) s += buf[i];
  return s;
}

// weight (or 1 + weight) converted to the accumulation type once per call.
template <typename T, typename A = acc_t<T>>
std::vector<A> effective_gamma(const Tensor& weight, bool zero_centered) {
  const T* w = weight.const_data_ptr<T>();
  std::vector<A> g(static_cast<size_t>(weight.numel()));
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<A>(w[i]) + (zero_centered ? A(1) : A(0));
  return g;
}

template <typename T, typename A = acc_t<T>>
std::vector<A> to_acc(const Tensor& t) {
  const T* p = t.const_data_ptr<T>();
  std::vector<A> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<A>(p[i]);
  return out;
}

// Row view in the accumulation type: the row itself (fp32/fp64) or a converted copy.
template <typename T, typename A = acc_t<T>>
inline const A* row_as_acc(const T* row, int64_t n, A* scratch) {
  if constexpr (std::is_same_v<T, A>) {
    return row;
  } else {
    constexpr int64_t W = AccVec<T>::size();
    for_chunks<W>(n, [&](int64_t i, int64_t k) { load_acc<T>(row + i, k).store(scratch + i, k); });
    return scratch;
  }
}

// Sum of v[0..n) with two vector accumulators.
template <typename A>
inline A sum_row(const A* v, int64_t n) {
  using V = at::vec::Vectorized<A>;
  constexpr int64_t W = V::size();
  V s0(A(0)), s1(A(0));
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    s0 += V::loadu(v + i);
    s1 += V::loadu(v + i + W);
  }
  for (; i + W <= n; i += W) s0 += V::loadu(v + i);
  A s = hsum<A>(s0 + s1);
  for (; i < n; ++i) s += v[i];
  return s;
}

// Sum of (v - c)^2 over v[0..n).
template <typename A>
inline A sum_sq_dev(const A* v, int64_t n, A c) {
  using V = at::vec::Vectorized<A>;
  constexpr int64_t W = V::size();
  const V cv(c);
  V s0(A(0)), s1(A(0));
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const V d0 = V::loadu(v + i) - cv, d1 = V::loadu(v + i + W) - cv;
    s0 = at::vec::fmadd(d0, d0, s0);
    s1 = at::vec::fmadd(d1, d1, s1);
  }
  for (; i + W <= n; i += W) {
    const V d = V::loadu(v + i) - cv;
    s0 = at::vec::fmadd(d, d, s0);
  }
  A s = hsum<A>(s0 + s1);
  for (; i < n; ++i) s += (v[i] - c) * (v[i] - c);
  return s;
}

// ---- LayerNorm ----------------------------------------------------------------------------------

std::tuple<Tensor, Tensor, Tensor> layernorm_fwd_cpu(const Tensor& x_in, const Tensor& weight_in,
                                                     const Tensor& bias_in, double eps,
                                                     bool zero_centered_gamma) {
  NormShapes::check(LayerNormFwd::kName, x_in, weight_in, &bias_in);
  NormShapes::check_eps(LayerNormFwd::kName, eps);
  auto [y, mean, rstd] = LayerNormFwd::allocate(x_in, weight_in);
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous(), bias = bias_in.contiguous();
  const int64_t n = weight.numel();
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  TE_DISPATCH_FLOAT(x.scalar_type(), "layernorm_fwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using V = AccVec<T>;
    constexpr int64_t W = V::size();
    const std::vector<A> gamma = effective_gamma<T>(weight, zero_centered_gamma);
    const std::vector<A> beta = to_acc<T>(bias);
    const T* xp = x.const_data_ptr<T>();
    T* yp = y.mutable_data_ptr<T>();
    A* meanp = mean.mutable_data_ptr<A>();
    A* rstdp = rstd.mutable_data_ptr<A>();
    at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
      std::vector<A> scratch(std::is_same_v<T, A> ? 0 : static_cast<size_t>(n));
      for (int64_t r = r0; r < r1; ++r) {
        const A* xr = row_as_acc<T>(xp + r * n, n, scratch.data());
        const A mu = sum_row<A>(xr, n) / static_cast<A>(n);
        const A rs = A(1) / std::sqrt(sum_sq_dev<A>(xr, n, mu) / static_cast<A>(n) + A(eps));
        meanp[r] = mu;
        rstdp[r] = rs;
        const V muv(mu), rsv(rs);
        T* yr = yp + r * n;
        for_chunks<W>(n, [&](int64_t i, int64_t k) {
          const V xh = (V::loadu(xr + i, k) - muv) * rsv;
          store_acc<T>(yr + i, at::vec::fmadd(xh, V::loadu(gamma.data() + i, k),
                                              V::loadu(beta.data() + i, k)), k);
        });
      }
    });
  });
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor> layernorm_bwd_cpu(const Tensor& dy_in, const Tensor& x_in,
                                                     const Tensor& mean_in, const Tensor& rstd_in,
                                                     const Tensor& weight_in,
                                                     bool zero_centered_gamma) {
  LayerNormBwd::check(dy_in, x_in, mean_in, rstd_in, weight_in);
  auto [dx, dweight, dbias] = LayerNormBwd::allocate(x_in, weight_in);
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  const Tensor dy = dy_in.to(x.scalar_type()).contiguous();
  const Tensor mean = mean_in.contiguous(), rstd = rstd_in.contiguous();
  const int64_t n = weight.numel();
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  TE_DISPATCH_FLOAT(x.scalar_type(), "layernorm_bwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using V = AccVec<T>;
    constexpr int64_t W = V::size();
    const std::vector<A> gamma = effective_gamma<T>(weight, zero_centered_gamma);
    const T* xp = x.const_data_ptr<T>();
    const T* dyp = dy.const_data_ptr<T>();
    const A* meanp = mean.const_data_ptr<A>();
    const A* rstdp = rstd.const_data_ptr<A>();
    T* dxp = dx.mutable_data_ptr<T>();
    // acc[0, n): dgamma partials, acc[n, 2n): dbeta partials.
    auto row_fn = [&](int64_t r, A* acc) {
      const T* xr = xp + r * n;
      const T* dyr = dyp + r * n;
      const V muv(meanp[r]), rsv(rstdp[r]);
      V sg(A(0)), sgx(A(0));
      for_chunks<W>(n, [&](int64_t i, int64_t k) {
        const V xh = (load_acc<T>(xr + i, k) - muv) * rsv;
        const V d = load_acc<T>(dyr + i, k);
        const V g = d * V::loadu(gamma.data() + i, k);
        sg += g;
        sgx = at::vec::fmadd(g, xh, sgx);
        at::vec::fmadd(d, xh, V::loadu(acc + i, k)).store(acc + i, k);
        (V::loadu(acc + n + i, k) + d).store(acc + n + i, k);
      });
      const V c1(hsum<A>(sg) / static_cast<A>(n)), c2(hsum<A>(sgx) / static_cast<A>(n));
      T* dxr = dxp + r * n;
      for_chunks<W>(n, [&](int64_t i, int64_t k) {
        const V xh = (load_acc<T>(xr + i, k) - muv) * rsv;
        const V g = load_acc<T>(dyr + i, k) * V::loadu(gamma.data() + i, k);
        store_acc<T>(dxr + i, rsv * (g - c1 - xh * c2), k);
      });
    };
    const std::vector<A> sums = cpu::blocked_column_sums<A>(rows, 2 * n, row_fn);
    T* dwp = dweight.mutable_data_ptr<T>();
    T* dbp = dbias.mutable_data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      dwp[i] = static_cast<T>(sums[i]);
      dbp[i] = static_cast<T>(sums[n + i]);
    }
  });
  return {dx, dweight, dbias};
}

// ---- RMSNorm ------------------------------------------------------------------------------------

std::tuple<Tensor, Tensor> rmsnorm_fwd_cpu(const Tensor& x_in, const Tensor& weight_in, double eps,
                                           bool zero_centered_gamma) {
  NormShapes::check(RMSNormFwd::kName, x_in, weight_in, nullptr);
  NormShapes::check_eps(RMSNormFwd::kName, eps);
  auto [y, rstd] = RMSNormFwd::allocate(x_in, weight_in);
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  const int64_t n = weight.numel();
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  TE_DISPATCH_FLOAT(x.scalar_type(), "rmsnorm_fwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using V = AccVec<T>;
    constexpr int64_t W = V::size();
    const std::vector<A> gamma = effective_gamma<T>(weight, zero_centered_gamma);
    const T* xp = x.const_data_ptr<T>();
    T* yp = y.mutable_data_ptr<T>();
    A* rstdp = rstd.mutable_data_ptr<A>();
    at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
      std::vector<A> scratch(std::is_same_v<T, A> ? 0 : static_cast<size_t>(n));
      for (int64_t r = r0; r < r1; ++r) {
        const A* xr = row_as_acc<T>(xp + r * n, n, scratch.data());
        const A rs = A(1) / std::sqrt(sum_sq_dev<A>(xr, n, A(0)) / static_cast<A>(n) + A(eps));
        rstdp[r] = rs;
        const V rsv(rs);
        T* yr = yp + r * n;
        for_chunks<W>(n, [&](int64_t i, int64_t k) {
          store_acc<T>(yr + i, V::loadu(xr + i, k) * rsv * V::loadu(gamma.data() + i, k), k);
        });
      }
    });
  });
  return {y, rstd};
}

// dx = rstd * (g - xhat * mean(g * xhat)) [+ dextra], g = dy * gamma, xhat = x * rstd.
std::tuple<Tensor, Tensor> rmsnorm_bwd_impl(const char* op, const Tensor& dy_in,
                                            const Tensor& x_in, const Tensor& rstd_in,
                                            const Tensor& weight_in, bool zero_centered_gamma,
                                            const Tensor* dextra_in) {
  RMSNormBwd::check(op, dy_in, x_in, rstd_in, weight_in, dextra_in);
  auto [dx, dweight] = RMSNormBwd::allocate(x_in, weight_in);
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  const Tensor dy = dy_in.to(x.scalar_type()).contiguous();
  const Tensor rstd = rstd_in.contiguous();
  const Tensor dextra = dextra_in ? dextra_in->to(x.scalar_type()).contiguous() : Tensor();
  const int64_t n = weight.numel();
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  TE_DISPATCH_FLOAT(x.scalar_type(), "rmsnorm_bwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using V = AccVec<T>;
    constexpr int64_t W = V::size();
    const std::vector<A> gamma = effective_gamma<T>(weight, zero_centered_gamma);
    const T* xp = x.const_data_ptr<T>();
    const T* dyp = dy.const_data_ptr<T>();
    const T* dep = dextra.defined() ? dextra.const_data_ptr<T>() : nullptr;
    const A* rstdp = rstd.const_data_ptr<A>();
    T* dxp = dx.mutable_data_ptr<T>();
    auto row_fn = [&](int64_t r, A* acc) {
      const T* xr = xp + r * n;
      const T* dyr = dyp + r * n;
      const V rsv(rstdp[r]);
      V sgx(A(0));
      for_chunks<W>(n, [&](int64_t i, int64_t k) {
        const V xh = load_acc<T>(xr + i, k) * rsv;
        const V d = load_acc<T>(dyr + i, k);
        sgx = at::vec::fmadd(d * V::loadu(gamma.data() + i, k), xh, sgx);
        at::vec::fmadd(d, xh, V::loadu(acc + i, k)).store(acc + i, k);
      });
      const V c2(hsum<A>(sgx) / static_cast<A>(n));
      T* dxr = dxp + r * n;
      const T* der = dep ? dep + r * n : nullptr;
      for_chunks<W>(n, [&](int64_t i, int64_t k) {
        const V xh = load_acc<T>(xr + i, k) * rsv;
        const V g = load_acc<T>(dyr + i, k) * V::loadu(gamma.data() + i, k);
        V out = rsv * (g - xh * c2);
        if (der != nullptr) out += load_acc<T>(der + i, k);
        store_acc<T>(dxr + i, out, k);
      });
    };
    cpu::blocked_column_sum<A>(rows, n, dweight.mutable_data_ptr<T>(), row_fn);
  });
  return {dx, dweight};
}

std::tuple<Tensor, Tensor> rmsnorm_bwd_cpu(const Tensor& dy, const Tensor& x, const Tensor& rstd,
                                           const Tensor& weight, bool zero_centered_gamma) {
  return rmsnorm_bwd_impl("rmsnorm_bwd", dy, x, rstd, weight, zero_centered_gamma, nullptr);
}

std::tuple<Tensor, Tensor> rmsnorm_bwd_add_cpu(const Tensor& dy, const Tensor& x,
                                               const Tensor& rstd, const Tensor& weight,
                                               bool zero_centered_gamma, const Tensor& dextra) {
  return rmsnorm_bwd_impl("rmsnorm_bwd_add", dy, x, rstd, weight, zero_centered_gamma, &dextra);
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, CPU, m) {
  m.impl("layernorm_fwd", layernorm_fwd_cpu);
  m.impl("layernorm_bwd", layernorm_bwd_cpu);
  m.impl("rmsnorm_fwd", rmsnorm_fwd_cpu);
  m.impl("rmsnorm_bwd", rmsnorm_bwd_cpu);
  m.impl("rmsnorm_bwd_add", rmsnorm_bwd_add_cpu);
}

}  // namespace te_cpp
