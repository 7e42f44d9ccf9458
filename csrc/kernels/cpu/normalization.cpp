// CPU backend of LayerNorm and RMSNorm (see ops/normalization.h for the conventions).
//
// Forward: each row is read from memory once and its statistics are computed from the cached
// row, in the accumulation type; the output is written in the same visit. Backward: one visit
// per row computes dx and adds the row's dgamma/dbeta contributions to its row block's partial
// sums (deterministic, see reduce.h).
#include <vector>

#include "common/norm_math.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/stream.h"
#include "kernels/cpu/vec.h"
#include "kernels/cpu/vec_math.h"
#include "ops/normalization.h"

namespace te_cpp {
namespace {

using cpu::for_chunks;

// Sum of v's lanes, in a fixed tree of shuffles (at::vec's; a scalar loop without a vector ISA):
// a few instructions of latency where a lane-by-lane chain took one addition per lane.
template <typename A>
inline A hsum(const at::vec::Vectorized<A>& v) {
  return at::vec::vec_reduce_all<A>(
      [](const at::vec::Vectorized<A>& x, const at::vec::Vectorized<A>& y) { return x + y; }, v);
}

// A row's vector sums are kept in kLanes independent accumulators (chunk j of each group of
// kLanes adds into acc[j]), so consecutive chunks' additions do not wait on each other's latency.
constexpr int kLanes = 4;

// Calls body(i, k, acc) over [0, n) in chunks of W (k = W but for a partial last chunk), with
// acc cycling over acc[0 .. kLanes) in whole groups of kLanes chunks; the chunks after the last
// whole group go to acc[0]. The order depends only on n.
template <int64_t W, typename Acc, typename Body>
C10_ALWAYS_INLINE void for_chunks_lanes(int64_t n, Acc (&acc)[kLanes], const Body& body) {
  int64_t i = 0;
  for (; i + kLanes * W <= n; i += kLanes * W) {
    body(i, W, acc[0]);
    body(i + W, W, acc[1]);
    body(i + 2 * W, W, acc[2]);
    body(i + 3 * W, W, acc[3]);
  }
  for (; i < n; i += W) body(i, std::min<int64_t>(W, n - i), acc[0]);
}

// (a0 + a1) + (a2 + a3): the accumulators of for_chunks_lanes combined in a fixed order.
template <typename V>
C10_ALWAYS_INLINE V combine_lanes(const V (&a)[kLanes]) {
  return (a[0] + a[1]) + (a[2] + a[3]);
}

// gamma (the weight, or 1 + weight) in the accumulation type, once per call.
template <typename T, typename A = acc_t<T>>
std::vector<A> effective_gamma(const T* w, int64_t n, bool zero_centered) {
  std::vector<A> g(static_cast<size_t>(n));
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = math::norm_gamma(static_cast<A>(w[i]), zero_centered);
  }
  return g;
}

// Sum of (v - c)^2 over v[0..n), v read in the accumulation type. The lanes of a partial last
// chunk past n add exactly 0.
template <typename T, typename A = acc_t<T>>
inline A sum_sq_dev(const T* v, int64_t n, A c) {
  using V = at::vec::Vectorized<A>;
  constexpr int64_t W = V::size();
  const V cv(c);
  V s[kLanes] = {V(A(0)), V(A(0)), V(A(0)), V(A(0))};
  for_chunks_lanes<W>(n, s, [&](int64_t i, int64_t k, V& acc) {
    V d = load_acc<T>(v + i, k) - cv;
    if (k < W) d = V::set(V(A(0)), d, k);
    acc = at::vec::fmadd(d, d, acc);
  });
  return hsum<A>(combine_lanes(s));
}

// One chunk of a row's first visit: x[i, i + k) loaded from memory in the accumulation type and
// added (kSquares = false: sum(x)) or its squares added (true: sum(x^2)) into acc. A partial
// chunk loads zeros past the row's end, which add nothing.
template <bool kSquares, typename T, typename A = acc_t<T>>
C10_ALWAYS_INLINE void first_pass_chunk(const T* __restrict row, int64_t i, int64_t k,
                                        at::vec::Vectorized<A>& acc) {
  prefetch_ahead(row + i);
  const at::vec::Vectorized<A> v = load_acc<T>(row + i, k);
  acc = kSquares ? at::vec::fmadd(v, v, acc) : acc + v;
}

// ---- LayerNorm and RMSNorm, one kernel each way -------------------------------------------------
//
// kCentered = true is LayerNorm (subtract the mean, add beta), false is RMSNorm. The row
// formulas are common/norm_math.h's (shared with the CUDA kernels):
//   forward   xhat = (x - mu) * rstd, y = xhat * gamma (+ beta); mu = 0 for RMSNorm
//   backward  g = dy * gamma; dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) [+ dextra],
//             with the mean(g) term only for LayerNorm; dgamma = sum dy * xhat, dbeta = sum dy.
// Here the row sums are vector registers with their lanes summed at the end, and each row's
// tail goes through the vector formulas with partial loads.
//
// Forward row visit: (1) x read once from memory: sum(x) for LayerNorm, sum(x^2) for RMSNorm;
// (2) LayerNorm only: sum((x - mu)^2) over the cached row (two-pass variance); (3) y from the
// cached row. In bf16/fp16 each later pass converts the cached row again.

template <bool kCentered, typename T>
void norm_fwd_kernel(const NormFwdArgs& a) {
  using A = acc_t<T>;
  using V = AccVec<T>;
  constexpr int64_t W = V::size();
  const int64_t n = a.features;
  const int64_t rows = a.rows;
  const std::vector<A> gamma_v =
      effective_gamma<T>(static_cast<const T*>(a.weight), n, a.zero_centered_gamma);
  const AccRow<T> beta_v(kCentered ? static_cast<const T*>(a.bias) : nullptr, n);
  const A* gamma = gamma_v.data();
  const A* beta = beta_v.data();
  const T* xp = static_cast<const T*>(a.x);
  T* yp = static_cast<T*>(a.y);
  A* meanp = kCentered ? static_cast<A*>(a.mean) : nullptr;
  A* rstdp = static_cast<A*>(a.rstd);
  const A epsa = static_cast<A>(a.eps);
  const bool stream = cpu::stream_stores<T>(rows * n);
  at::parallel_for(0, rows, row_grain(n), [=](int64_t r0, int64_t r1) {
    const A* __restrict g = gamma;
    const A* __restrict be = beta;
    for (int64_t r = r0; r < r1; ++r) {
      const T* __restrict xr = xp + r * n;
      V lanes[kLanes] = {V(A(0)), V(A(0)), V(A(0)), V(A(0))};
      for_chunks_lanes<W>(n, lanes, [&](int64_t i, int64_t k, V& acc) {
        first_pass_chunk<!kCentered>(xr, i, k, acc);
      });
      const A s = hsum<A>(combine_lanes(lanes));
      A mu(0), var;
      if constexpr (kCentered) {
        mu = math::row_mean(s, n);
        var = math::row_mean(sum_sq_dev<T>(xr, n, mu), n);
        meanp[r] = mu;
      } else {
        var = math::row_mean(s, n);
      }
      const A rs = math::rsqrt_eps(var, epsa);
      rstdp[r] = rs;
      const V muv(mu), rsv(rs);
      T* __restrict yr = yp + r * n;
      for_chunks<W>(n, [&](int64_t i, int64_t k) {
        const V xh = math::norm_xhat<kCentered>(load_acc<T>(xr + i, k), muv, rsv);
        const V bv = kCentered ? V::loadu(be + i, k) : V(A(0));  // RMSNorm: no beta
        cpu::store_out<T>(yr + i, math::norm_out<kCentered>(xh, V::loadu(g + i, k), bv), k,
                          stream);
      });
    }
    cpu::stream_fence(stream);
  });
}

// dweight (and dbias for LayerNorm) are reduced deterministically over row blocks.
// Row visit: (1) from memory: xhat, g = dy * gamma, the row sums of g and g * xhat, and the
// row's dgamma/dbeta contributions added to its block's partial sums; (2) dx from the rows,
// now in L1.
// fp32 rows prefetch x and dy ahead in (1); bf16/fp16 rows leave them to the hardware
// prefetchers (faster so: docs/architecture.md).
template <bool kCentered, typename T>
void norm_bwd_kernel(const NormBwdArgs& a) {
  using A = acc_t<T>;
  using V = AccVec<T>;
  constexpr int64_t W = V::size();
  const int64_t n = a.features;
  const int64_t rows = a.rows;
  const std::vector<A> gamma_v =
      effective_gamma<T>(static_cast<const T*>(a.weight), n, a.zero_centered_gamma);
  const A* gamma = gamma_v.data();
  const T* xp = static_cast<const T*>(a.x);
  const T* dyp = static_cast<const T*>(a.dy);
  const T* dep = static_cast<const T*>(a.dextra);
  const A* meanp = kCentered ? static_cast<const A*>(a.mean) : nullptr;
  const A* rstdp = static_cast<const A*>(a.rstd);
  T* dxp = static_cast<T*>(a.dx);
  const bool stream = cpu::stream_stores<T>(rows * n);
  // acc[0, n): dgamma partials; for LayerNorm acc[n, 2n): dbeta partials.
  auto row_fn = [=](int64_t r, A* __restrict acc) {
    const T* __restrict xr = xp + r * n;
    const T* __restrict dyr = dyp + r * n;
    const T* __restrict der = dep ? dep + r * n : nullptr;
    const A* __restrict g = gamma;
    const V muv(kCentered ? meanp[r] : A(0)), rsv(rstdp[r]);
    // the row sums of g (LayerNorm) and g xhat, kLanes accumulators each
    struct Sums {
      V g, gx;
    } sums[kLanes];
    for (Sums& s : sums) s = {V(A(0)), V(A(0))};
    for_chunks_lanes<W>(n, sums, [&](int64_t i, int64_t k, Sums& s) {
      if constexpr (std::is_same_v<T, A>) {
        prefetch_ahead(xr + i);
        prefetch_ahead(dyr + i);
      }
      const V xh = math::norm_xhat<kCentered>(load_acc<T>(xr + i, k), muv, rsv);
      const V d = load_acc<T>(dyr + i, k);
      const V gd = d * V::loadu(g + i, k);
      s.gx = at::vec::fmadd(gd, xh, s.gx);
      at::vec::fmadd(d, xh, V::loadu(acc + i, k)).store(acc + i, k);
      if constexpr (kCentered) {
        s.g += gd;
        (V::loadu(acc + n + i, k) + d).store(acc + n + i, k);
      }
    });
    const V sg = (sums[0].g + sums[1].g) + (sums[2].g + sums[3].g);
    const V sgx = (sums[0].gx + sums[1].gx) + (sums[2].gx + sums[3].gx);
    // c1 = mean(g), c2 = mean(g xhat), and the row's scale (NaN for a LayerNorm row whose sums
    // are not finite)
    const math::NormBwdRow<A> co =
        math::norm_bwd_row<kCentered>(kCentered ? hsum<A>(sg) : A(0), hsum<A>(sgx), n, rstdp[r]);
    const V c1(co.c1), c2(co.c2), scale(co.scale);
    T* __restrict dxr = dxp + r * n;
    for_chunks<W>(n, [&](int64_t i, int64_t k) {
      const V xh = math::norm_xhat<kCentered>(load_acc<T>(xr + i, k), muv, rsv);
      const V gd = load_acc<T>(dyr + i, k) * V::loadu(g + i, k);
      cpu::store_out<T>(dxr + i,
                        der != nullptr
                            ? math::norm_dx_add(gd, xh, c1, c2, scale, load_acc<T>(der + i, k))
                            : math::norm_dx(gd, xh, c1, c2, scale),
                        k, stream);
    });
  };
  const std::vector<A> sums =
      cpu::blocked_column_sums<A>(rows, kCentered ? 2 * n : n, row_fn, stream);
  T* dwp = static_cast<T*>(a.dweight);
  T* dbp = kCentered ? static_cast<T*>(a.dbias) : nullptr;
  for (int64_t i = 0; i < n; ++i) {
    dwp[i] = static_cast<T>(sums[i]);
    if constexpr (kCentered) dbp[i] = static_cast<T>(sums[n + i]);
  }
}

void norm_fwd_cpu(const NormFwdArgs& a) {
  TE_DISPATCH_FLOAT(a.dtype, "norm_fwd", [&] {
    if (a.kind == NormKind::kLayerNorm) {
      norm_fwd_kernel<true, scalar_t>(a);
    } else {
      norm_fwd_kernel<false, scalar_t>(a);
    }
  });
}

void norm_bwd_cpu(const NormBwdArgs& a) {
  TE_DISPATCH_FLOAT(a.dtype, "norm_bwd", [&] {
    if (a.kind == NormKind::kLayerNorm) {
      norm_bwd_kernel<true, scalar_t>(a);
    } else {
      norm_bwd_kernel<false, scalar_t>(a);
    }
  });
}

}  // namespace

TE_REGISTER_KERNEL(norm_fwd_stub, CPU, norm_fwd_cpu);
TE_REGISTER_KERNEL(norm_bwd_stub, CPU, norm_bwd_cpu);

}  // namespace te_cpp
