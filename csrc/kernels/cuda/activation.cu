// CUDA backend of the activation family: the stubs of ops/activation.h (see there for the
// conventions) on contiguous buffers; the front end (ops/activation.cpp) did the checks,
// allocation and casts, made the tensors' device current and skipped empty work.
//
// The math is the CPU's: the functors of common/activation_math.h, built on the host from the
// call's ActConfig and instantiated on the accumulation type (float for fp32/bf16/fp16, double
// for fp64), one element per lane; one rounding to the output dtype (round to nearest even).
// Kernels launch on the current stream, never synchronise the host and allocate only scratch
// through Workspace (the dbias partial sums), so they are safe under CUDA graph capture.
//
// Loads and stores are 16 bytes wide (N = 16 / sizeof(T) elements) where every pointer is
// 16-byte aligned and the run a vector covers cannot straddle a row or a gated half (features,
// or the gated run length, a multiple of N); otherwise the same kernels run one element at a
// time. Indices are 64-bit and grids are capped (grid-stride loops), so any size launches.
#include <cstdint>

#include "common/activation_math.h"
#include "kernels/cuda/column_reduce.cuh"
#include "kernels/cuda/launch.cuh"
#include "ops/activation.h"

namespace te_cpp {
namespace {

// ---- vector access ----

template <typename T, int M>
struct alignas(sizeof(T) * M) Pack {
  T v[M];
};

template <int M, typename T>
__device__ inline Pack<T, M> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, M>*>(p);
}

template <int M, typename T>
__device__ inline void store_pack(T* p, const Pack<T, M>& v) {
  *reinterpret_cast<Pack<T, M>*>(p) = v;
}

// T rounded once from the accumulation type, and read back.
template <typename T>
__device__ inline T to_t(Acc<T> v) {
  return static_cast<T>(v);
}
template <typename T>
__device__ inline Acc<T> to_acc(T v) {
  return static_cast<Acc<T>>(v);
}

// a / b for a >= 0, b > 0: in 32 bits where both fit (a 64-bit division is a long software
// sequence on the GPU; the 32-bit one a few instructions), else in 64 bits.
__device__ inline int64_t div_index(int64_t a, int64_t b) {
  if (((a | b) >> 32) == 0) {
    return static_cast<int64_t>(static_cast<uint32_t>(a) / static_cast<uint32_t>(b));
  }
  return a / b;
}

// ---- flat kernels: one vector of M outputs per step ----

// body.template run<M>(i) handles outputs [i, i + M). The n / N full vectors first (i a
// multiple of N), then the n % N tail one element at a time.
template <int N, typename Body>
__global__ void flat_kernel(Body body, int64_t n) {
  const int64_t vecs = n / N;
  for (int64_t v = grid_start(); v < vecs; v += grid_stride()) body.template run<N>(v * N);
  if constexpr (N > 1) {
    for (int64_t i = vecs * N + grid_start(); i < n; i += grid_stride()) body.template run<1>(i);
  }
}

template <int N, typename Body>
void launch_flat(const Body& body, int64_t n) {
  flat_kernel<N><<<blocks_for((n + N - 1) / N), kThreads, 0, current_stream()>>>(body, n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, typename Body>
void launch_flat(bool vectorised, const Body& body, int64_t n) {
  if (vectorised) {
    launch_flat<kVec<T>>(body, n);
  } else {
    launch_flat<1>(body, n);
  }
}

// y = act(x), elementwise.
template <typename T, typename F>
struct UnaryFwd {
  F act;
  const T* x;
  T* y;
  template <int M>
  __device__ void run(int64_t i) const {
    const Pack<T, M> xv = load_pack<M>(x + i);
    Pack<T, M> yv;
#pragma unroll
    for (int k = 0; k < M; ++k) yv.v[k] = to_t<T>(act.f(to_acc(xv.v[k])));
    store_pack<M>(y + i, yv);
  }
};

// dx = dy * act'(x), elementwise.
template <typename T, typename F>
struct UnaryBwd {
  F act;
  const T* dy;
  const T* x;
  T* dx;
  template <int M>
  __device__ void run(int64_t i) const {
    const Pack<T, M> xv = load_pack<M>(x + i);
    const Pack<T, M> gv = load_pack<M>(dy + i);
    Pack<T, M> out;
#pragma unroll
    for (int k = 0; k < M; ++k) {
      Acc<T> f, gx;
      act.grad(to_acc(xv.v[k]), to_acc(gv.v[k]), f, gx);
      out.v[k] = to_t<T>(gx);
    }
    store_pack<M>(dx + i, out);
  }
};

// Output o of a gated activation lies in run q = o / len (the runs of all rows are numbered
// consecutively: a row holds features / (2 len) of them), at i = o % len; it reads a at
// q * 2 len + i and b len further.
__device__ inline int64_t gated_a_offset(int64_t o, int64_t len) {
  const int64_t q = div_index(o, len);
  return q * 2 * len + (o - q * len);
}

template <typename T, typename G>
struct GatedFwd {
  G gated;
  const T* x;
  T* y;
  int64_t len;
  template <int M>
  __device__ void run(int64_t o) const {
    const int64_t ia = gated_a_offset(o, len);
    const Pack<T, M> av = load_pack<M>(x + ia);
    const Pack<T, M> bv = load_pack<M>(x + ia + len);
    Pack<T, M> yv;
#pragma unroll
    for (int k = 0; k < M; ++k) yv.v[k] = to_t<T>(gated.f(to_acc(av.v[k]), to_acc(bv.v[k])));
    store_pack<M>(y + o, yv);
  }
};

template <typename T, typename G>
struct GatedBwd {
  G gated;
  const T* dy;
  const T* x;
  T* dx;
  int64_t len;
  template <int M>
  __device__ void run(int64_t o) const {
    const int64_t ia = gated_a_offset(o, len);
    const Pack<T, M> av = load_pack<M>(x + ia);
    const Pack<T, M> bv = load_pack<M>(x + ia + len);
    const Pack<T, M> gv = load_pack<M>(dy + o);
    Pack<T, M> da, db;
#pragma unroll
    for (int k = 0; k < M; ++k) {
      Acc<T> fa, fb, dav, dbv;
      gated.grad(to_acc(av.v[k]), to_acc(bv.v[k]), to_acc(gv.v[k]), fa, fb, dav, dbv);
      da.v[k] = to_t<T>(dav);
      db.v[k] = to_t<T>(dbv);
    }
    store_pack<M>(dx + ia, da);
    store_pack<M>(dx + ia + len, db);
  }
};

// z = x + bias[f] rounded to T (as bias_fwd stores it), in the accumulation type.
template <typename T>
__device__ inline Acc<T> biased(T x, T b) {
  return to_acc(to_t<T>(to_acc(x) + to_acc(b)));
}

// y = act(x + bias), bias along the last dim of `features`.
template <typename T, typename F>
struct BiasActFwd {
  F act;
  const T* x;
  const T* bias;
  T* y;
  int64_t features;
  template <int M>
  __device__ void run(int64_t i) const {
    const Pack<T, M> xv = load_pack<M>(x + i);
    const Pack<T, M> bv = load_pack<M>(bias + (i - div_index(i, features) * features));
    Pack<T, M> yv;
#pragma unroll
    for (int k = 0; k < M; ++k) yv.v[k] = to_t<T>(act.f(biased(xv.v[k], bv.v[k])));
    store_pack<M>(y + i, yv);
  }
};

// dbias+dact: row r, columns [col, col + M): dx = dy * act'(z) stored, and returned unrounded
// for the column sums (as the CPU kernel sums it).
template <typename T, typename F, bool kBias>
struct DbiasDactRow {
  F act;
  const T* dy;
  const T* x;
  const T* bias;
  T* dx;
  int64_t features;
  template <int M>
  __device__ void run(int64_t r, int64_t col, Acc<T> (&d)[M]) const {
    const int64_t off = r * features + col;
    const Pack<T, M> xv = load_pack<M>(x + off);
    const Pack<T, M> gv = load_pack<M>(dy + off);
    Pack<T, M> bv;
    if constexpr (kBias) bv = load_pack<M>(bias + col);
    Pack<T, M> out;
#pragma unroll
    for (int k = 0; k < M; ++k) {
      Acc<T> z;
      if constexpr (kBias) {
        z = biased(xv.v[k], bv.v[k]);
      } else {
        z = to_acc(xv.v[k]);
      }
      Acc<T> f;
      act.grad(z, to_acc(gv.v[k]), f, d[k]);
      out.v[k] = to_t<T>(d[k]);
    }
    store_pack<M>(dx + off, out);
  }
};

// y[o] = scales[r] * act(x) for output o of row r. Unary: len = features, one run per row.
template <typename T, typename G, bool kGated>
struct ScaledFwd {
  G gated;  // for a unary activation, gated.act alone
  const T* x;
  const Acc<T>* scales;
  T* y;
  int64_t len, runs_per_row;
  template <int M>
  __device__ void run(int64_t o) const {
    const int64_t r = div_index(div_index(o, len), runs_per_row);
    const Acc<T> s = scales[r];
    Pack<T, M> yv;
    if constexpr (kGated) {
      const int64_t ia = gated_a_offset(o, len);
      const Pack<T, M> av = load_pack<M>(x + ia);
      const Pack<T, M> bv = load_pack<M>(x + ia + len);
#pragma unroll
      for (int k = 0; k < M; ++k) yv.v[k] = to_t<T>(s * gated.f(to_acc(av.v[k]), to_acc(bv.v[k])));
    } else {
      const Pack<T, M> xv = load_pack<M>(x + o);
#pragma unroll
      for (int k = 0; k < M; ++k) yv.v[k] = to_t<T>(s * gated.act.f(to_acc(xv.v[k])));
    }
    store_pack<M>(y + o, yv);
  }
};

// ---- scaled backward: TPR threads per row (a warp, or the whole block), so dscales is a
// fixed-order reduction: a row's outputs are cut into chunks of C = kVec<T>; thread `lane` takes
// chunks lane, lane + TPR, ... and adds their elements in order, then a shuffle butterfly
// within each warp and, for a block, the warps' sums in warp order. M (C for 16-byte loads, 1
// when a pointer or the run length is not aligned) changes only the loads, never which thread
// adds an element or when, so dscales depends on the shape alone, not on the alignment. ----

template <typename A>
__device__ inline A warp_sum(A v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Outputs [j, j + M) of row r (within one gated run): dx stored; with dscales, dy * act(x)
// added to acc in element order.
template <int M, bool kGated, typename T, typename G>
__device__ inline void scaled_bwd_step(const G& gated, const T* __restrict__ dy,
                                       const T* __restrict__ x, T* __restrict__ dx, Acc<T> s,
                                       bool with_ds, int64_t r, int64_t j, int64_t features,
                                       int64_t n_out, int64_t len, Acc<T>& acc) {
  using A = Acc<T>;
  const Pack<T, M> gv = load_pack<M>(dy + r * n_out + j);
  if constexpr (kGated) {
    const int64_t ia = r * features + gated_a_offset(j, len);
    const Pack<T, M> av = load_pack<M>(x + ia);
    const Pack<T, M> bv = load_pack<M>(x + ia + len);
    Pack<T, M> da, db;
#pragma unroll
    for (int k = 0; k < M; ++k) {
      const A d = to_acc(gv.v[k]);
      A fa, fb, dav, dbv;
      gated.grad(to_acc(av.v[k]), to_acc(bv.v[k]), d * s, fa, fb, dav, dbv);
      da.v[k] = to_t<T>(dav);
      db.v[k] = to_t<T>(dbv);
      if (with_ds) acc += d * (fa * fb);
    }
    store_pack<M>(dx + ia, da);
    store_pack<M>(dx + ia + len, db);
  } else {
    const int64_t ia = r * features + j;
    const Pack<T, M> xv = load_pack<M>(x + ia);
    Pack<T, M> da;
#pragma unroll
    for (int k = 0; k < M; ++k) {
      const A d = to_acc(gv.v[k]);
      A fa, dav;
      gated.act.grad(to_acc(xv.v[k]), d * s, fa, dav);
      da.v[k] = to_t<T>(dav);
      if (with_ds) acc += d * fa;
    }
    store_pack<M>(dx + ia, da);
  }
}

template <int TPR, int M, bool kGated, typename T, typename G>
__global__ void scaled_bwd_kernel(G gated, const T* __restrict__ dy, const T* __restrict__ x,
                                  const Acc<T>* __restrict__ scales, T* __restrict__ dx,
                                  Acc<T>* __restrict__ dscales, int64_t rows, int64_t features,
                                  int64_t len) {
  using A = Acc<T>;
  constexpr int C = kVec<T>;
  static_assert(TPR == 32 || TPR == kThreads, "a warp or a block per row");
  static_assert(M == C || M == 1, "whole chunks, or one element at a time");
  constexpr int kRowsPerBlock = kThreads / TPR;
  __shared__ A warp_sums[kThreads / 32];
  const int lane = static_cast<int>(threadIdx.x) % TPR;
  const int group = static_cast<int>(threadIdx.x) / TPR;
  const int64_t n_out = kGated ? features / 2 : features;
  const bool with_ds = dscales != nullptr;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t r = r0 + group;
    A acc(0);
    if (r < rows) {
      const A s = scales[r];
      for (int64_t j = static_cast<int64_t>(lane) * C; j < n_out; j += int64_t{TPR} * C) {
        if constexpr (M == C) {  // len % C == 0: the chunk lies in one run
          scaled_bwd_step<C, kGated, T>(gated, dy, x, dx, s, with_ds, r, j, features, n_out,
                                        len, acc);
        } else {
          const int64_t j1 = j + C < n_out ? j + C : n_out;
          for (int64_t e = j; e < j1; ++e) {
            scaled_bwd_step<1, kGated, T>(gated, dy, x, dx, s, with_ds, r, e, features, n_out,
                                          len, acc);
          }
        }
      }
    }
    if (dscales != nullptr) {
      A total = warp_sum(acc);
      if constexpr (TPR == kThreads) {
        if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = total;
        __syncthreads();
        if (threadIdx.x == 0) {
          total = warp_sums[0];
          for (int w = 1; w < kThreads / 32; ++w) total += warp_sums[w];
        }
        __syncthreads();  // warp_sums is reused by the next row
      }
      if (lane == 0 && r < rows) dscales[r] = total;
    }
  }
}

// ---- the stubs' CUDA kernels ----

// The gated run length: glu_interleave_size, or half the row.
int64_t gated_len(const ActConfig& cfg, int64_t features) {
  return cfg.interleave > 0 ? cfg.interleave : features / 2;
}

void activation_fwd_cuda(const ActFwdArgs& a) {
  visit_act(a.cfg.act, [&](auto k) {
    constexpr Act K = decltype(k)::value;
    TE_DISPATCH_FLOAT(a.dtype, "activation", [&] {
      using T = scalar_t;
      using A = Acc<T>;
      const T* x = static_cast<const T*>(a.x);
      T* y = static_cast<T*>(a.y);
      const bool vec = aligned(x) && aligned(y);
      if constexpr (!is_gated(K)) {
        using F = typename math::ActMath<K, A>::Act;
        launch_flat<T>(vec, UnaryFwd<T, F>{F(a.cfg), x, y}, a.rows * a.features);
      } else {
        const int64_t len = gated_len(a.cfg, a.features);
        launch_flat<T>(vec && len % kVec<T> == 0,
                       GatedFwd<T, math::Gated<K, A>>{math::Gated<K, A>(a.cfg), x, y, len},
                       a.rows * (a.features / 2));
      }
    });
  });
}

void activation_bwd_cuda(const ActBwdArgs& a) {
  visit_act(a.cfg.act, [&](auto k) {
    constexpr Act K = decltype(k)::value;
    TE_DISPATCH_FLOAT(a.dtype, "activation", [&] {
      using T = scalar_t;
      using A = Acc<T>;
      const T* dy = static_cast<const T*>(a.dy);
      const T* x = static_cast<const T*>(a.x);
      T* dx = static_cast<T*>(a.dx);
      const bool vec = aligned(dy) && aligned(x) && aligned(dx);
      if constexpr (!is_gated(K)) {
        using F = typename math::ActMath<K, A>::Act;
        launch_flat<T>(vec, UnaryBwd<T, F>{F(a.cfg), dy, x, dx}, a.rows * a.features);
      } else {
        const int64_t len = gated_len(a.cfg, a.features);
        launch_flat<T>(vec && len % kVec<T> == 0,
                       GatedBwd<T, math::Gated<K, A>>{math::Gated<K, A>(a.cfg), dy, x, dx, len},
                       a.rows * (a.features / 2));
      }
    });
  });
}

void bias_act_fwd_cuda(const BiasActArgs& a) {
  visit_unary_act("bias_act_fwd", a.cfg.act, [&](auto k) {
    constexpr Act K = decltype(k)::value;
    TE_DISPATCH_FLOAT(a.dtype, "bias_act_fwd", [&] {
      using T = scalar_t;
      using F = typename math::ActMath<K, Acc<T>>::Act;
      const T* x = static_cast<const T*>(a.x);
      const T* bias = static_cast<const T*>(a.bias);
      T* y = static_cast<T*>(a.y);
      const bool vec = aligned(x) && aligned(bias) && aligned(y) &&
                       a.features % kVec<T> == 0;
      launch_flat<T>(vec, BiasActFwd<T, F>{F(a.cfg), x, bias, y, a.features},
                     a.rows * a.features);
    });
  });
}

template <int M, typename T, typename F>
void dbias_dact_launch(const DbiasDactArgs& a, const F& act) {
  const T* dy = static_cast<const T*>(a.dy);
  const T* x = static_cast<const T*>(a.x);
  const T* bias = static_cast<const T*>(a.bias);
  T* dx = static_cast<T*>(a.dx);
  const auto stream = current_stream();
  TE_DISPATCH_FLOAT(a.bias_dtype, "dbias_dact", [&] {
    scalar_t* db = static_cast<scalar_t*>(a.dbias);
    if (bias != nullptr) {
      cuda::column_reduce<M, Acc<T>>(DbiasDactRow<T, F, true>{act, dy, x, bias, dx, a.features},
                                     a.rows, a.features, db, stream);
    } else {
      cuda::column_reduce<M, Acc<T>>(DbiasDactRow<T, F, false>{act, dy, x, bias, dx, a.features},
                                     a.rows, a.features, db, stream);
    }
  });
}

void dbias_dact_cuda(const DbiasDactArgs& a) {
  visit_unary_act("dbias_dact", a.cfg.act, [&](auto k) {
    constexpr Act K = decltype(k)::value;
    TE_DISPATCH_FLOAT(a.dtype, "dbias_dact", [&] {
      using T = scalar_t;
      using F = typename math::ActMath<K, Acc<T>>::Act;
      const F act(a.cfg);
      const bool vec = aligned(a.dy) && aligned(a.x) && aligned(a.dx) &&
                       (a.bias == nullptr || aligned(a.bias)) && a.features % kVec<T> == 0;
      if (vec) {
        dbias_dact_launch<kVec<T>, T>(a, act);
      } else {
        dbias_dact_launch<1, T>(a, act);
      }
    });
  });
}

void scaled_act_fwd_cuda(const ScaledActFwdArgs& a) {
  visit_scaled_act("scaled_act_fwd", a.cfg.act, [&](auto k) {
    constexpr Act K = decltype(k)::value;
    TE_DISPATCH_FLOAT(a.dtype, "scaled_activation", [&] {
      using T = scalar_t;
      using A = Acc<T>;
      using G = math::Gated<K, A>;
      const T* x = static_cast<const T*>(a.x);
      T* y = static_cast<T*>(a.y);
      const A* scales = static_cast<const A*>(a.scales);
      const int64_t len = is_gated(K) ? gated_len(a.cfg, a.features) : a.features;
      const int64_t n_out = is_gated(K) ? a.features / 2 : a.features;
      const bool vec = aligned(x) && aligned(y) && len % kVec<T> == 0;
      launch_flat<T>(vec,
                     ScaledFwd<T, G, is_gated(K)>{G(a.cfg), x, scales, y, len, n_out / len},
                     a.rows * n_out);
    });
  });
}

template <int TPR, int M, bool kGated, typename T, typename G>
void scaled_bwd_launch(const ScaledActBwdArgs& a, const G& gated, int64_t len) {
  constexpr int64_t kRowsPerBlock = kThreads / TPR;
  const unsigned blocks = static_cast<unsigned>(
      std::clamp<int64_t>((a.rows + kRowsPerBlock - 1) / kRowsPerBlock, 1, kMaxBlocks));
  scaled_bwd_kernel<TPR, M, kGated, T><<<blocks, kThreads, 0, current_stream()>>>(
      gated, static_cast<const T*>(a.dy), static_cast<const T*>(a.x),
      static_cast<const Acc<T>*>(a.scales), static_cast<T*>(a.dx),
      static_cast<Acc<T>*>(a.dscales), a.rows, a.features, len);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void scaled_act_bwd_cuda(const ScaledActBwdArgs& a) {
  visit_scaled_act("scaled_act_bwd", a.cfg.act, [&](auto k) {
    constexpr Act K = decltype(k)::value;
    TE_DISPATCH_FLOAT(a.dtype, "scaled_activation", [&] {
      using T = scalar_t;
      using G = math::Gated<K, Acc<T>>;
      constexpr bool kGated = is_gated(K);
      constexpr int N = kVec<T>;
      const G gated(a.cfg);
      const int64_t len = kGated ? gated_len(a.cfg, a.features) : a.features;
      const int64_t n_out = kGated ? a.features / 2 : a.features;
      const bool vec = aligned(a.dy) && aligned(a.x) && aligned(a.dx) && len % N == 0;
      // a warp per row while a row fits in a few of its passes, else a block per row; from
      // the shape alone (not vec), as it sets dscales' order of additions
      const bool warp = n_out <= int64_t{4} * 32 * N;
      if (vec) {
        if (warp) {
          scaled_bwd_launch<32, N, kGated, T>(a, gated, len);
        } else {
          scaled_bwd_launch<kThreads, N, kGated, T>(a, gated, len);
        }
      } else if (warp) {
        scaled_bwd_launch<32, 1, kGated, T>(a, gated, len);
      } else {
        scaled_bwd_launch<kThreads, 1, kGated, T>(a, gated, len);
      }
    });
  });
}

}  // namespace

TE_REGISTER_KERNEL(activation_fwd_stub, CUDA, activation_fwd_cuda);
TE_REGISTER_KERNEL(activation_bwd_stub, CUDA, activation_bwd_cuda);
TE_REGISTER_KERNEL(bias_act_fwd_stub, CUDA, bias_act_fwd_cuda);
TE_REGISTER_KERNEL(dbias_dact_stub, CUDA, dbias_dact_cuda);
TE_REGISTER_KERNEL(scaled_act_fwd_stub, CUDA, scaled_act_fwd_cuda);
TE_REGISTER_KERNEL(scaled_act_bwd_stub, CUDA, scaled_act_bwd_cuda);

}  // namespace te_cpp
