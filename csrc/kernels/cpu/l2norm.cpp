// CPU backend of L2Normalization (see ops/l2norm.h for the math; the row formulas are
// common/norm_math.h's, shared with the CUDA kernels). Rows are independent:
// at::parallel_for over rows, each row reduced in one Vectorized<acc_t> register (lanes summed
// once at the end), so the result depends only on the row, never on the thread count.
#include <ATen/cpu/vec/functional.h>

#include <algorithm>
#include <limits>

#include "common/norm_math.h"
#include "kernels/cpu/vec.h"
#include "kernels/cpu/vec_math.h"
#include "ops/l2norm.h"

namespace te_cpp {
namespace {

template <typename T>
using Vec = AccVec<T>;

// sum_i f(a[i], b[i]) over a row of n elements, f working on Vec<T>.
template <typename T, typename F>
acc_t<T> row_sum(const T* a, const T* b, int64_t n, const F& f) {
  constexpr int64_t W = Vec<T>::size();
  Vec<T> acc(acc_t<T>(0));
  int64_t i = 0;
  for (; i + W <= n; i += W) acc += f(load_acc<T>(a + i), load_acc<T>(b + i));
  if (i < n) {
    // Partial loads zero the tail lanes, and f(0, 0) = 0 for the products used here.
    acc += f(load_acc<T>(a + i, n - i), load_acc<T>(b + i, n - i));
  }
  return at::vec::vec_reduce_all<acc_t<T>>([](Vec<T>& u, Vec<T>& v) { return u + v; }, acc);
}

void l2norm_fwd_cpu(const L2NormFwdArgs& a) {
  const int64_t n = a.features;
  const int64_t rows = a.rows;
  const double eps = a.eps;
  TE_DISPATCH_FLOAT(a.dtype, "l2normalization_fwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    constexpr int64_t W = Vec<T>::size();
    const T* xp = static_cast<const T*>(a.x);
    T* yp = static_cast<T*>(a.y);
    A* rp = static_cast<A*>(a.rsqrt_norm);
    at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = xp + r * n;
        T* yr = yp + r * n;
        const A ss = row_sum<T>(xr, xr, n, [](const Vec<T>& u, const Vec<T>& v) { return u * v; });
        const A rs = math::rsqrt_eps(ss, static_cast<A>(eps));
        rp[r] = rs;
        const Vec<T> rv(rs);
        int64_t i = 0;
        for (; i + W <= n; i += W) store_acc<T>(yr + i, math::l2norm_out(load_acc<T>(xr + i), rv));
        if (i < n) {
          store_acc<T>(yr + i, math::l2norm_out(load_acc<T>(xr + i, n - i), rv), n - i);
        }
      }
    });
  });
}

void l2norm_bwd_cpu(const L2NormBwdArgs& a) {
  const int64_t n = a.features;
  const int64_t rows = a.rows;
  TE_DISPATCH_FLOAT(a.dtype, "l2normalization_bwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    constexpr int64_t W = Vec<T>::size();
    const T* xp = static_cast<const T*>(a.x);
    const T* dyp = static_cast<const T*>(a.dy);
    const A* rp = static_cast<const A*>(a.rsqrt_norm);
    T* dxp = static_cast<T*>(a.dx);
    at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = xp + r * n;
        const T* dyr = dyp + r * n;
        T* dxr = dxp + r * n;
        const A rs = rp[r];
        if (math::l2norm_bwd_row_is_nan(rs)) {
          // sum(x^2) + eps == 0 (eps = 0, a zero or underflowing row): the forward is inf or
          // NaN and PyTorch's autograd of it gives NaN (inf * 0), never +-inf
          std::fill(dxr, dxr + n, std::numeric_limits<T>::quiet_NaN());
          continue;
        }
        const Vec<T> rv(rs);
        // k = dy . y with y = x r: every intermediate is O(|dy|), whatever the row's norm
        const A dot_y = row_sum<T>(dyr, xr, n, [&](const Vec<T>& u, const Vec<T>& v) {
          return u * math::l2norm_out(v, rv);
        });
        const Vec<T> kv(dot_y);
        auto step = [&](int64_t i, int64_t k) {
          const Vec<T> y = math::l2norm_out(load_acc<T>(xr + i, k), rv);
          store_acc<T>(dxr + i, math::l2norm_dx(load_acc<T>(dyr + i, k), y, kv, rv), k);
        };
        int64_t i = 0;
        for (; i + W <= n; i += W) step(i, W);
        if (i < n) step(i, n - i);
      }
    });
  });
}

}  // namespace

TE_REGISTER_KERNEL(l2norm_fwd_stub, CPU, l2norm_fwd_cpu);
TE_REGISTER_KERNEL(l2norm_bwd_stub, CPU, l2norm_bwd_cpu);

}  // namespace te_cpp
