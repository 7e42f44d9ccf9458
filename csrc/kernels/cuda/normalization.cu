// CUDA backend of LayerNorm and RMSNorm, forward and backward (BackwardAddRMSNorm's + dextra
// included); see ops/normalization.h for the conventions and kernels/cuda/row_reduce.cuh for
// how a row is shared among a warp or a block.
//
// The row formulas are common/norm_math.h's, as in the CPU kernels: statistics in the
// accumulation type (fp32 for fp32/bf16/fp16, fp64 for fp64), LayerNorm's variance in two
// passes (sum x, then sum (x - mu)^2), one rounding to the output dtype. The row sums are this
// backend's own order (fixed by the shape), so results agree with the CPU's to rounding.
//
// dweight and dbias are deterministic without atomics: the rows are cut into `groups` ranges
// of consecutive rows (from the shape alone); the warp or block of a range adds its rows'
// contributions in row order into its own partial row of a Workspace, and a second kernel adds
// the partial rows in an order fixed by the shape (each thread a strided set of ranges in
// order, then the threads' sums in thread order).
#include <algorithm>

#include "common/norm_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/row_reduce.cuh"
#include "ops/normalization.h"

namespace te_cpp {
namespace {

using namespace rowwise;  // NOLINT(build/namespaces): the row helpers of this family

template <typename T>
struct FwdParams {
  const T* x;
  const T* weight;
  const T* bias;
  T* y;
  Acc<T>* mean;
  Acc<T>* rstd;
  int64_t rows, n;
  Acc<T> eps;
  bool zero_centered_gamma;
  bool aligned;  // every row and the parameters start on 16 bytes
};

// One row per group (warp or block), the groups striding over the rows.
template <bool kCentered, bool kWarpRow, bool kCached, typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    norm_fwd_kernel(const FwdParams<T> p) {
  using A = Acc<T>;
  constexpr int V = kVec<T>;
  __shared__ A scratch[kWarp];
  const Group<kWarpRow> g;
  const int64_t n = p.n;
  A cache[kFwdCacheChunks][V];
  for (int64_t r = g.id; r < p.rows; r += g.count) {
    const T* xr = p.x + r * n;
    // (1) sum x (LayerNorm) or sum x^2 (RMSNorm), x read from memory once
    A s(0);
    for_my_chunks<kCached>(xr, n, p.aligned, g.lane, g.size, cache, true,
                           [&](int64_t start, const A(&v)[V]) {
#pragma unroll
                             for (int j = 0; j < V; ++j) {
                               if (start + j < n) {
                                 s = kCentered ? s + v[j] : math::Ops<A>::fma(v[j], v[j], s);
                               }
                             }
                           });
    s = group_sum<kWarpRow>(s, scratch);
    A mu(0), var;
    if constexpr (kCentered) {
      // (2) LayerNorm: sum (x - mu)^2
      mu = math::row_mean(s, n);
      A q(0);
      for_my_chunks<kCached>(xr, n, p.aligned, g.lane, g.size, cache, false,
                             [&](int64_t start, const A(&v)[V]) {
#pragma unroll
                               for (int j = 0; j < V; ++j) {
                                 if (start + j < n) {
                                   const A d = v[j] - mu;
                                   q = math::Ops<A>::fma(d, d, q);
                                 }
                               }
                             });
      var = math::row_mean(group_sum<kWarpRow>(q, scratch), n);
    } else {
      var = math::row_mean(s, n);
    }
    const A rs = math::rsqrt_eps(var, p.eps);
    if (g.lane == 0) {
      if constexpr (kCentered) p.mean[r] = mu;
      p.rstd[r] = rs;
    }
    // (3) y
    T* yr = p.y + r * n;
    for_my_chunks<kCached>(
        xr, n, p.aligned, g.lane, g.size, cache, false, [&](int64_t start, const A(&v)[V]) {
          A w[V], b[V], out[V];
          load_chunk<T>(p.weight, start, n, p.aligned, w);
          if constexpr (kCentered) load_chunk<T>(p.bias, start, n, p.aligned, b);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const A xh = math::norm_xhat<kCentered>(v[j], mu, rs);
            out[j] = math::norm_out<kCentered>(
                xh, math::norm_gamma(w[j], p.zero_centered_gamma), kCentered ? b[j] : A(0));
          }
          store_chunk<T>(yr, start, n, p.aligned, out);
        });
  }
}

template <typename T>
struct BwdParams {
  const T* dy;
  const T* x;
  const Acc<T>* mean;
  const Acc<T>* rstd;
  const T* weight;
  const T* dextra;  // or null
  T* dx;
  // [groups][width]: per row range, the dweight partial sums, then (LayerNorm) the dbias ones
  Acc<T>* partial;
  int64_t rows, n, rows_per_group, groups;
  bool zero_centered_gamma;
  bool aligned;
};

// Group g (a warp or a block) handles rows [g rows_per_group, (g + 1) rows_per_group).
// Per row: (1) x and dy from memory: g = dy gamma, xhat, the row sums of g (LayerNorm) and
// g xhat, and the row's dweight / dbias terms added to this thread's columns; (2) dx.
// kCached: x and dy stay in registers between the passes and the dweight / dbias sums of the
// thread's columns stay in registers until the range is done; otherwise they are added into
// the group's partial row in memory (the same order of additions).
template <bool kCentered, bool kWarpRow, bool kCached, typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    norm_bwd_kernel(const BwdParams<T> p) {
  using A = Acc<T>;
  constexpr int V = kVec<T>;
  constexpr int C = kCached ? kBwdCacheChunks : 1;
  __shared__ A scratch[kWarp];
  const Group<kWarpRow> g;
  // the surplus warps of the last block (uniform per warp; the warp kernels have no block
  // barrier, and a block group's id is always < groups)
  if (g.id >= p.groups) return;
  const int64_t n = p.n;
  const int64_t nchunks = (n + V - 1) / V;
  A* part = p.partial + g.id * (kCentered ? 2 * n : n);
  const int64_t r0 = g.id * p.rows_per_group;
  const int64_t r1 = std::min(p.rows, r0 + p.rows_per_group);

  // Calls f(k, start) for this thread's chunks, k the chunk's cache slot (0 when uncached).
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

  A xc[C][V], dc[C][V], gm[C][V], dw[C][V], db[C][V];
  // gamma of this thread's columns, once per range when cached
  auto load_gamma = [&](int k, int64_t start) {
    load_chunk<T>(p.weight, start, n, p.aligned, gm[k]);
#pragma unroll
    for (int j = 0; j < V; ++j) gm[k][j] = math::norm_gamma(gm[k][j], p.zero_centered_gamma);
  };
  if constexpr (kCached) {
    for_chunks([&](int k, int64_t start) {
      load_gamma(k, start);
#pragma unroll
      for (int j = 0; j < V; ++j) dw[k][j] = db[k][j] = A(0);
    });
  } else {
    for_chunks([&](int, int64_t start) {
      for (int j = 0; j < V && start + j < n; ++j) {
        part[start + j] = A(0);
        if constexpr (kCentered) part[n + start + j] = A(0);
      }
    });
  }

  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = p.x + r * n;
    const T* dyr = p.dy + r * n;
    const A mu = kCentered ? p.mean[r] : A(0);
    const A rs = p.rstd[r];
    A sg(0), sgx(0);
    for_chunks([&](int k, int64_t start) {
      load_chunk<T>(xr, start, n, p.aligned, xc[k]);
      load_chunk<T>(dyr, start, n, p.aligned, dc[k]);
      if constexpr (!kCached) load_gamma(k, start);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (start + j < n) {
          const A xh = math::norm_xhat<kCentered>(xc[k][j], mu, rs);
          const A d = dc[k][j];
          const A gd = d * gm[k][j];
          sgx = math::Ops<A>::fma(gd, xh, sgx);
          if constexpr (kCentered) sg += gd;
          if constexpr (kCached) {
            dw[k][j] = math::Ops<A>::fma(d, xh, dw[k][j]);
            if constexpr (kCentered) db[k][j] += d;
          } else {
            part[start + j] = math::Ops<A>::fma(d, xh, part[start + j]);
            if constexpr (kCentered) part[n + start + j] += d;
          }
        }
      }
    });
    if constexpr (kCentered) sg = group_sum<kWarpRow>(sg, scratch);
    sgx = group_sum<kWarpRow>(sgx, scratch);
    // mean(g), mean(g xhat) and the row's scale (NaN for a LayerNorm row whose sums are not
    // finite), as on CPU
    const math::NormBwdRow<A> co = math::norm_bwd_row<kCentered>(sg, sgx, n, rs);
    T* dxr = p.dx + r * n;
    const T* der = p.dextra != nullptr ? p.dextra + r * n : nullptr;
    for_chunks([&](int k, int64_t start) {
      if constexpr (!kCached) {
        load_chunk<T>(xr, start, n, p.aligned, xc[k]);
        load_chunk<T>(dyr, start, n, p.aligned, dc[k]);
        load_gamma(k, start);
      }
      A de[V], out[V];
      if (der != nullptr) load_chunk<T>(der, start, n, p.aligned, de);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const A xh = math::norm_xhat<kCentered>(xc[k][j], mu, rs);
        const A gd = dc[k][j] * gm[k][j];
        out[j] = der != nullptr ? math::norm_dx_add(gd, xh, co.c1, co.c2, co.scale, de[j])
                                : math::norm_dx(gd, xh, co.c1, co.c2, co.scale);
      }
      store_chunk<T>(dxr, start, n, p.aligned, out);
    });
  }

  if constexpr (kCached) {
    for_chunks([&](int k, int64_t start) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (start + j < n) {
          part[start + j] = dw[k][j];
          if constexpr (kCentered) part[n + start + j] = db[k][j];
        }
      }
    });
  }
}

// out[i] = sum over groups of partial[group][offset + i], in group order, rounded once to T.
// Block (kTileCols x kTileRows): thread (tx, ty) adds groups ty, ty + kTileRows, ... in order;
// then thread row 0 adds the kTileRows sums in ty order.
constexpr int kTileCols = 32;
constexpr int kTileRows = 16;

template <typename A, typename T>
__global__ void partial_rows_sum_kernel(const A* __restrict__ partial, T* __restrict__ out,
                                        int64_t groups, int64_t width, int64_t offset,
                                        int64_t n) {
  __shared__ A tile[kTileRows][kTileCols];
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kTileCols; base < n;
       base += static_cast<int64_t>(gridDim.x) * kTileCols) {
    const int64_t i = base + threadIdx.x;
    A s(0);
    if (i < n) {
      for (int64_t gi = threadIdx.y; gi < groups; gi += kTileRows) {
        s += partial[gi * width + offset + i];
      }
    }
    tile[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && i < n) {
      A total = tile[0][threadIdx.x];
      for (int k = 1; k < kTileRows; ++k) total += tile[k][threadIdx.x];
      out[i] = static_cast<T>(total);
    }
    __syncthreads();
  }
}

// Row ranges for the parameter gradients, from the shape alone: at least kMinRowsPerGroup
// rows per range, at most kMaxGroupsWarp (warp per row) or kMaxGroupsBlock ranges, and a
// partial buffer of at most kMaxPartialElems values.
constexpr int64_t kMinRowsPerGroup = 8;
constexpr int64_t kMaxGroupsWarp = 2048;
constexpr int64_t kMaxGroupsBlock = 512;
constexpr int64_t kMaxPartialElems = int64_t{1} << 22;

template <bool kCentered, typename T>
void launch_fwd(const NormFwdArgs& a) {
  using A = Acc<T>;
  const FwdParams<T> p{static_cast<const T*>(a.x),
                       static_cast<const T*>(a.weight),
                       static_cast<const T*>(a.bias),
                       static_cast<T*>(a.y),
                       static_cast<A*>(a.mean),
                       static_cast<A*>(a.rstd),
                       a.rows,
                       a.features,
                       static_cast<A>(a.eps),
                       a.zero_centered_gamma,
                       rows_aligned<T>(a.features, {a.x, a.weight, a.bias, a.y})};
  const RowPlan plan = plan_rows(a.features, sizeof(T), kFwdCacheChunks, a.rows);
  const auto stream = current_stream();
  if (plan.warp_per_row) {
    norm_fwd_kernel<kCentered, true, true, T><<<plan.blocks(), plan.threads, 0, stream>>>(p);
  } else if (plan.cached) {
    norm_fwd_kernel<kCentered, false, true, T><<<plan.blocks(), plan.threads, 0, stream>>>(p);
  } else {
    norm_fwd_kernel<kCentered, false, false, T><<<plan.blocks(), plan.threads, 0, stream>>>(p);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <bool kCentered, typename T>
void launch_bwd(const NormBwdArgs& a) {
  using A = Acc<T>;
  const int64_t n = a.features;
  const int64_t width = kCentered ? 2 * n : n;
  const bool warp = plan_rows(n, sizeof(T), kBwdCacheChunks, 1).warp_per_row;
  const int64_t max_groups = std::min(warp ? kMaxGroupsWarp : kMaxGroupsBlock,
                                      std::max<int64_t>(1, kMaxPartialElems / width));
  const int64_t want = std::clamp<int64_t>((a.rows + kMinRowsPerGroup - 1) / kMinRowsPerGroup,
                                           1, max_groups);
  const int64_t rows_per_group = (a.rows + want - 1) / want;
  const int64_t groups = (a.rows + rows_per_group - 1) / rows_per_group;  // none empty
  const RowPlan plan = plan_rows(n, sizeof(T), kBwdCacheChunks, groups);
  const Workspace partial(groups * width * static_cast<int64_t>(sizeof(A)));
  const BwdParams<T> p{static_cast<const T*>(a.dy),
                       static_cast<const T*>(a.x),
                       static_cast<const A*>(a.mean),
                       static_cast<const A*>(a.rstd),
                       static_cast<const T*>(a.weight),
                       static_cast<const T*>(a.dextra),
                       static_cast<T*>(a.dx),
                       static_cast<A*>(partial.get()),
                       a.rows,
                       n,
                       rows_per_group,
                       groups,
                       a.zero_centered_gamma,
                       rows_aligned<T>(n, {a.dy, a.x, a.weight, a.dextra, a.dx})};
  const auto stream = current_stream();
  if (plan.warp_per_row) {
    norm_bwd_kernel<kCentered, true, true, T><<<plan.blocks(), plan.threads, 0, stream>>>(p);
  } else if (plan.cached) {
    norm_bwd_kernel<kCentered, false, true, T><<<plan.blocks(), plan.threads, 0, stream>>>(p);
  } else {
    norm_bwd_kernel<kCentered, false, false, T><<<plan.blocks(), plan.threads, 0, stream>>>(p);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const unsigned col_blocks = static_cast<unsigned>(
      std::clamp<int64_t>((n + kTileCols - 1) / kTileCols, 1, kMaxBlocks));
  const dim3 tile(kTileCols, kTileRows);
  partial_rows_sum_kernel<A, T><<<col_blocks, tile, 0, stream>>>(
      p.partial, static_cast<T*>(a.dweight), groups, width, 0, n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if constexpr (kCentered) {
    partial_rows_sum_kernel<A, T><<<col_blocks, tile, 0, stream>>>(
        p.partial, static_cast<T*>(a.dbias), groups, width, n, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

void norm_fwd_cuda(const NormFwdArgs& a) {
  TE_DISPATCH_FLOAT(a.dtype, "norm_fwd", [&] {
    if (a.kind == NormKind::kLayerNorm) {
      launch_fwd<true, scalar_t>(a);
    } else {
      launch_fwd<false, scalar_t>(a);
    }
  });
}

void norm_bwd_cuda(const NormBwdArgs& a) {
  TE_DISPATCH_FLOAT(a.dtype, "norm_bwd", [&] {
    if (a.kind == NormKind::kLayerNorm) {
      launch_bwd<true, scalar_t>(a);
    } else {
      launch_bwd<false, scalar_t>(a);
    }
  });
}

}  // namespace

TE_REGISTER_KERNEL(norm_fwd_stub, CUDA, norm_fwd_cuda);
TE_REGISTER_KERNEL(norm_bwd_stub, CUDA, norm_bwd_cuda);

}  // namespace te_cpp
