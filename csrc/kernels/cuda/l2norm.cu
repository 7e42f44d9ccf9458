// CUDA backend of L2Normalization, forward and backward (see ops/l2norm.h for the math; the
// row formulas are common/norm_math.h's, as in the CPU kernels). One warp or one block per row
// (kernels/cuda/row_reduce.cuh), sums in the accumulation type in an order fixed by the shape,
// one rounding to the output dtype.
#include <limits>

#include "common/norm_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/row_reduce.cuh"
#include "ops/l2norm.h"

namespace te_cpp {
namespace {

using namespace rowwise;  // NOLINT(build/namespaces): the row helpers of this family

template <typename T>
struct L2FwdParams {
  const T* x;
  T* y;
  Acc<T>* rnorm;
  int64_t rows, n;
  Acc<T> eps;
  bool aligned;
};

// rnorm = 1 / sqrt(sum x^2 + eps), y = x rnorm; x read from memory once (cached) per row.
template <bool kWarpRow, bool kCached, typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    l2norm_fwd_kernel(const L2FwdParams<T> p) {
  using A = Acc<T>;
  constexpr int V = kVec<T>;
  __shared__ A scratch[kWarp];
  const Group<kWarpRow> g;
  const int64_t n = p.n;
  A cache[kFwdCacheChunks][V];
  for (int64_t r = g.id; r < p.rows; r += g.count) {
    const T* xr = p.x + r * n;
    A ss(0);
    for_my_chunks<kCached>(xr, n, p.aligned, g.lane, g.size, cache, true,
                           [&](int64_t start, const A(&v)[V]) {
#pragma unroll
                             for (int j = 0; j < V; ++j) {
                               if (start + j < n) ss += v[j] * v[j];
                             }
                           });
    const A rs = math::rsqrt_eps(group_sum<kWarpRow>(ss, scratch), p.eps);
    if (g.lane == 0) p.rnorm[r] = rs;
    T* yr = p.y + r * n;
    for_my_chunks<kCached>(xr, n, p.aligned, g.lane, g.size, cache, false,
                           [&](int64_t start, const A(&v)[V]) {
                             A out[V];
#pragma unroll
                             for (int j = 0; j < V; ++j) out[j] = math::l2norm_out(v[j], rs);
                             store_chunk<T>(yr, start, n, p.aligned, out);
                           });
  }
}

template <typename T>
struct L2BwdParams {
  const T* dy;
  const T* x;
  const Acc<T>* rnorm;
  T* dx;
  int64_t rows, n;
  bool aligned;
};

// k = dy . y (y = x rnorm), dx = rnorm (dy - k y); a row whose rnorm is infinite is all NaN.
template <bool kWarpRow, bool kCached, typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    l2norm_bwd_kernel(const L2BwdParams<T> p) {
  using A = Acc<T>;
  constexpr int V = kVec<T>;
  constexpr int C = kCached ? kBwdCacheChunks : 1;
  __shared__ A scratch[kWarp];
  const Group<kWarpRow> g;
  const int64_t n = p.n;
  const int64_t nchunks = (n + V - 1) / V;
  auto for_chunks = [&](const auto& f) {
    if constexpr (kCached) {
#pragma unroll
      for (int k = 0; k < C; ++k) {
        const int64_t c = g.lane + static_cast<int64_t>(k) * g.size;
        if (c < nchunks) f(k, c * V);
      }
    } else {
      for (int64_t c = g.lane; c < nchunks; c += g.size) f(0, c * V);
    }
  };
  A xc[C][V], dc[C][V];
  for (int64_t r = g.id; r < p.rows; r += g.count) {
    const A rs = p.rnorm[r];
    T* dxr = p.dx + r * n;
    if (math::l2norm_bwd_row_is_nan(rs)) {  // the same for the whole group: no barrier skipped
      for_chunks([&](int, int64_t start) {
        A out[V];
#pragma unroll
        for (int j = 0; j < V; ++j) out[j] = std::numeric_limits<A>::quiet_NaN();
        store_chunk<T>(dxr, start, n, p.aligned, out);
      });
      continue;
    }
    const T* xr = p.x + r * n;
    const T* dyr = p.dy + r * n;
    A k_dot(0);
    for_chunks([&](int k, int64_t start) {
      load_chunk<T>(xr, start, n, p.aligned, xc[k]);
      load_chunk<T>(dyr, start, n, p.aligned, dc[k]);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (start + j < n) k_dot += dc[k][j] * math::l2norm_out(xc[k][j], rs);
      }
    });
    k_dot = group_sum<kWarpRow>(k_dot, scratch);
    for_chunks([&](int k, int64_t start) {
      if constexpr (!kCached) {
        load_chunk<T>(xr, start, n, p.aligned, xc[k]);
        load_chunk<T>(dyr, start, n, p.aligned, dc[k]);
      }
      A out[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        out[j] = math::l2norm_dx(dc[k][j], math::l2norm_out(xc[k][j], rs), k_dot, rs);
      }
      store_chunk<T>(dxr, start, n, p.aligned, out);
    });
  }
}

void l2norm_fwd_cuda(const L2NormFwdArgs& a) {
  TE_DISPATCH_FLOAT(a.dtype, "l2normalization_fwd", [&] {
    using T = scalar_t;
    using A = Acc<T>;
    const L2FwdParams<T> p{static_cast<const T*>(a.x), static_cast<T*>(a.y),
                           static_cast<A*>(a.rsqrt_norm), a.rows, a.features,
                           static_cast<A>(a.eps), rows_aligned<T>(a.features, {a.x, a.y})};
    const RowPlan plan = plan_rows(a.features, sizeof(T), kFwdCacheChunks, a.rows);
    const auto stream = current_stream();
    if (plan.warp_per_row) {
      l2norm_fwd_kernel<true, true, T><<<plan.blocks(), plan.threads, 0, stream>>>(p);
    } else if (plan.cached) {
      l2norm_fwd_kernel<false, true, T><<<plan.blocks(), plan.threads, 0, stream>>>(p);
    } else {
      l2norm_fwd_kernel<false, false, T><<<plan.blocks(), plan.threads, 0, stream>>>(p);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void l2norm_bwd_cuda(const L2NormBwdArgs& a) {
  TE_DISPATCH_FLOAT(a.dtype, "l2normalization_bwd", [&] {
    using T = scalar_t;
    using A = Acc<T>;
    const L2BwdParams<T> p{static_cast<const T*>(a.dy), static_cast<const T*>(a.x),
                           static_cast<const A*>(a.rsqrt_norm), static_cast<T*>(a.dx), a.rows,
                           a.features, rows_aligned<T>(a.features, {a.dy, a.x, a.dx})};
    const RowPlan plan = plan_rows(a.features, sizeof(T), kBwdCacheChunks, a.rows);
    const auto stream = current_stream();
    if (plan.warp_per_row) {
      l2norm_bwd_kernel<true, true, T><<<plan.blocks(), plan.threads, 0, stream>>>(p);
    } else if (plan.cached) {
      l2norm_bwd_kernel<false, true, T><<<plan.blocks(), plan.threads, 0, stream>>>(p);
    } else {
      l2norm_bwd_kernel<false, false, T><<<plan.blocks(), plan.threads, 0, stream>>>(p);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TE_REGISTER_KERNEL(l2norm_fwd_stub, CUDA, l2norm_fwd_cuda);
TE_REGISTER_KERNEL(l2norm_bwd_stub, CUDA, l2norm_bwd_cuda);

}  // namespace te_cpp
