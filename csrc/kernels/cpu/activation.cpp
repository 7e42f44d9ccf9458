// CPU backend of the activation family: the stubs of ops/activation.h (see there for the
// conventions) on contiguous buffers; the front end (ops/activation.cpp) did the checks,
// allocation and casts.
#include <ATen/cpu/vec/functional.h>

#include <vector>

#include "kernels/cpu/act_lookup.h"
#include "kernels/cpu/activation_math.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/stream.h"
#include "kernels/cpu/vec.h"
#include "ops/activation.h"

namespace te_cpp {
namespace {

// Geometry of a gated row: `segments` runs of `len` outputs; run s reads a at s*stride and b at
// s*stride + len, and writes y at s*len. Halves: one run of n/2 (stride n). Interleaved with
// size s: n/(2s) runs of s (stride 2s).
struct GatedGeometry {
  int64_t len, segments, stride;
  GatedGeometry(int64_t n, int64_t interleave) {
    len = interleave > 0 ? interleave : n / 2;
    segments = len == 0 ? 0 : (n / 2) / len;
    stride = 2 * len;
  }
  // Where run s of a row starting at p begins: its a half, and its b half len later.
  template <typename P>
  P a(P p, int64_t s) const {
    return p + s * stride;
  }
  template <typename P>
  P b(P p, int64_t s) const {
    return p + s * stride + len;
  }
  // A unary activation's row seen as one run of n (used by the row-wise scaled kernels).
  static GatedGeometry unary(int64_t n) {
    GatedGeometry g(0, 0);
    g.len = n;
    g.segments = n > 0 ? 1 : 0;
    g.stride = n;
    return g;
  }
};

using cpu::for_chunks;

// Each parallel body copies the activation functor and its row or chunk pointers into locals
// before its vector loop: the vector stores may alias any memory, so state read through the
// lambdas' captures would be loaded again for every vector.

// The unary kernels run over the rows * features elements as one flat range.

template <Act K>
void fwd_kernel(const ActFwdArgs& a) {
  const ActConfig& cfg = a.cfg;
  TE_DISPATCH_FLOAT(a.dtype, "activation", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    constexpr int64_t W = AccVec<T>::size();
    const T* xp = static_cast<const T*>(a.x);
    T* yp = static_cast<T*>(a.y);
    if constexpr (!is_gated(K)) {
      const int64_t total = a.rows * a.features;
      const bool stream = cpu::stream_stores<T>(total);
      cpu::with_act<K, T, cpu::ActUse::kValue>(cfg, total, [&](const auto& act) {
        at::parallel_for(0, total, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
          const auto local_act = act;
          const T* x0 = xp + i0;
          T* y0 = yp + i0;
          for_chunks<W>(i1 - i0, [&](int64_t i, int64_t k) {
            cpu::store_out<T>(y0 + i, local_act.f(x0 + i, k), k, stream);
          });
          cpu::stream_fence(stream);
        });
      });
    } else {
      // y = act(a) * lin(b)
      const cpu::Gated<K, A> gated(cfg);
      const int64_t rows = a.rows, n = a.features;
      const GatedGeometry g(n, cfg.interleave);
      const bool stream = cpu::stream_stores<T>(rows * (n / 2));
      cpu::with_act<K, T, cpu::ActUse::kValue>(cfg, rows * n / 2, [&](const auto& act) {
        at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
          const auto local_act = act;
          const auto local_gated = gated;
          const GatedGeometry lg = g;
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t s = 0; s < lg.segments; ++s) {
              const T* xa = lg.a(xp + r * n, s);
              const T* xb = lg.b(xp + r * n, s);
              T* yr = yp + r * (n / 2) + s * lg.len;
              for_chunks<W>(lg.len, [&](int64_t i, int64_t k) {
                prefetch_ahead(xa + i);
                prefetch_ahead(xb + i);
                if (!stream) prefetch_ahead_for_write(yr + i);
                const AccVec<T> vb = load_acc<T>(xb + i, k);
                cpu::store_out<T>(yr + i, local_act.f(xa + i, k) * local_gated.lin.f(vb), k,
                                  stream);
              });
            }
          }
          cpu::stream_fence(stream);
        });
      });
    }
  });
}

template <Act K>
void bwd_kernel(const ActBwdArgs& a) {
  const ActConfig& cfg = a.cfg;
  TE_DISPATCH_FLOAT(a.dtype, "activation", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using Vec = AccVec<T>;
    constexpr int64_t W = Vec::size();
    const T* xp = static_cast<const T*>(a.x);
    const T* dyp = static_cast<const T*>(a.dy);
    T* dxp = static_cast<T*>(a.dx);
    if constexpr (!is_gated(K)) {
      const int64_t total = a.rows * a.features;
      const bool stream = cpu::stream_stores<T>(total);
      cpu::with_act<K, T, cpu::ActUse::kGrad>(cfg, total, [&](const auto& act) {
        at::parallel_for(0, total, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
          const auto local_act = act;
          const T* x0 = xp + i0;
          const T* dy0 = dyp + i0;
          T* dx0 = dxp + i0;
          for_chunks<W>(i1 - i0, [&](int64_t i, int64_t k) {
            Vec f, gx;
            local_act.grad(x0 + i, k, load_acc<T>(dy0 + i, k), f, gx);
            cpu::store_out<T>(dx0 + i, gx, k, stream);
          });
          cpu::stream_fence(stream);
        });
      });
    } else {
      const cpu::Gated<K, A> gated(cfg);
      const int64_t rows = a.rows, n = a.features;
      const GatedGeometry g(n, cfg.interleave);
      const bool stream = cpu::stream_stores<T>(rows * n);
      cpu::with_act<K, T, cpu::ActUse::kGradValue>(cfg, rows * n / 2, [&](const auto& act) {
        at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
          const auto local_act = act;
          const auto local_gated = gated;
          const GatedGeometry lg = g;
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t s = 0; s < lg.segments; ++s) {
              const T* xa0 = lg.a(xp + r * n, s);
              const T* xb0 = lg.b(xp + r * n, s);
              T* dxa0 = lg.a(dxp + r * n, s);
              T* dxb0 = lg.b(dxp + r * n, s);
              const T* dyr = dyp + r * (n / 2) + s * lg.len;
              for_chunks<W>(lg.len, [&](int64_t i, int64_t k) {
                prefetch_ahead(xa0 + i);
                prefetch_ahead(xb0 + i);
                prefetch_ahead(dyr + i);
                if (!stream) {
                  prefetch_ahead_for_write(dxa0 + i);
                  prefetch_ahead_for_write(dxb0 + i);
                }
                const T* xa = xa0 + i;
                Vec fa, fb, da, db;
                local_gated.grad_with(
                    load_acc<T>(xb0 + i, k), load_acc<T>(dyr + i, k),
                    [&](const Vec& ga, Vec& f, Vec& d) { local_act.grad(xa, k, ga, f, d); },
                    fa, fb, da, db);
                cpu::store_out<T>(dxa0 + i, da, k, stream);
                cpu::store_out<T>(dxb0 + i, db, k, stream);
              });
            }
          }
          cpu::stream_fence(stream);
        });
      });
    }
  });
}

// One pass over x (and bias): z = x + bias, rounded to T as bias_fwd stores it, then y = act(z).
template <Act K>
void bias_act_kernel(const BiasActArgs& a) {
  const int64_t rows = a.rows, n = a.features;
  TE_DISPATCH_FLOAT(a.dtype, "bias_act_fwd", [&] {
    using T = scalar_t;
    constexpr int64_t W = AccVec<T>::size();
    const T* xp = static_cast<const T*>(a.x);
    const AccRow<T> bias(static_cast<const T*>(a.bias), n);
    T* yp = static_cast<T*>(a.y);
    const bool stream = cpu::stream_stores<T>(rows * n);
    cpu::with_act<K, T, cpu::ActUse::kValue>(a.cfg, rows * n, [&](const auto& act) {
      at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
        const auto local_act = act;
        const acc_t<T>* b = bias.data();
        for (int64_t r = r0; r < r1; ++r) {
          const T* xr = xp + r * n;
          T* yr = yp + r * n;
          for_chunks<W>(n, [&](int64_t i, int64_t k) {
            cpu::store_out<T>(
                yr + i, local_act.f_rounded(load_acc<T>(xr + i, k) + load_acc(b + i, k)), k,
                stream);
          });
        }
        cpu::stream_fence(stream);
      });
    });
  });
}

template <Act K>
void dbias_dact_kernel(const DbiasDactArgs& a) {
  const int64_t rows = a.rows, n = a.features;
  TE_DISPATCH_FLOAT(a.dtype, "activation", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using Vec = AccVec<T>;
    constexpr int64_t W = Vec::size();
    const T* xp = static_cast<const T*>(a.x);
    const AccRow<T> bias(static_cast<const T*>(a.bias), n);
    const T* dyp = static_cast<const T*>(a.dy);
    T* dxp = static_cast<T*>(a.dx);
    const bool stream = cpu::stream_stores<T>(rows * n);
    cpu::with_act<K, T, cpu::ActUse::kGrad>(a.cfg, rows * n, [&](const auto& act) {
      auto run = [&](auto with_bias) {
        constexpr bool kBias = decltype(with_bias)::value;
        // One pass per row: dx = dy * act'(z) (z = x + bias rounded to T, as bias_fwd stores
        // it) stored and added to the row block's partial dbias row. Rows are walked one after
        // the other, so x, dy and dx are each one long sequential stream (rows of a block
        // walked together, with the partial sums in registers, measured slower: more streams
        // than the prefetchers follow, worst for short rows).
        auto row_fn = [&](int64_t r, A* acc) {
          const auto row_act = act;
          const T* xr = xp + r * n;
          const T* dyr = dyp + r * n;
          const A* br = bias.data();
          T* dxr = dxp + r * n;
          for_chunks<W>(n, [&](int64_t i, int64_t k) {
            const Vec dy = load_acc<T>(dyr + i, k);
            Vec f, d;
            if constexpr (kBias) {
              row_act.grad_rounded(load_acc<T>(xr + i, k) + load_acc(br + i, k), dy, f, d);
            } else {
              row_act.grad(xr + i, k, dy, f, d);
            }
            cpu::store_out<T>(dxr + i, d, k, stream);
            (Vec::loadu(acc + i, k) + d).store(acc + i, k);
          });
        };
        TE_DISPATCH_FLOAT(a.bias_dtype, "dbias_dact", [&] {
          const std::vector<A> sums = cpu::blocked_column_sums<A>(rows, n, row_fn, stream);
          scalar_t* dbp = static_cast<scalar_t*>(a.dbias);
          for (int64_t f = 0; f < n; ++f) dbp[f] = static_cast<scalar_t>(sums[f]);
        });
      };
      if (a.bias != nullptr) {
        run(std::true_type{});
      } else {
        run(std::false_type{});
      }
    });
  });
}

// Scaled activations (ops/activation.h): row r of the output is scales[r] * act(x_r). Rows run in
// parallel; each row is `segments` runs (one for a unary activation), vectorised as the plain
// kernels. dscales[r] is accumulated in one Vectorized<acc_t> register per row and its lanes
// summed once, so it depends only on the row, never on the thread count.
template <Act K>
void scaled_fwd_kernel(const ScaledActFwdArgs& a) {
  const ActConfig& cfg = a.cfg;
  const int64_t rows = a.rows, n = a.features;
  const int64_t n_out = is_gated(K) ? n / 2 : n;
  const GatedGeometry g = is_gated(K) ? GatedGeometry(n, cfg.interleave) : GatedGeometry::unary(n);
  TE_DISPATCH_FLOAT(a.dtype, "scaled_activation", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using Vec = AccVec<T>;
    constexpr int64_t W = Vec::size();
    const cpu::Gated<K, A> gated(cfg);  // for a unary K, unused
    const T* xp = static_cast<const T*>(a.x);
    const A* sp = static_cast<const A*>(a.scales);
    T* yp = static_cast<T*>(a.y);
    cpu::with_act<K, T, cpu::ActUse::kValue>(cfg, rows * n_out, [&](const auto& act) {
      at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
        const auto local_act = act;
        const auto local_gated = gated;
        const GatedGeometry lg = g;
        for (int64_t r = r0; r < r1; ++r) {
          const Vec sv(sp[r]);
          for (int64_t seg = 0; seg < lg.segments; ++seg) {
            const T* xa = lg.a(xp + r * n, seg);
            const T* xb = lg.b(xp + r * n, seg);
            T* yr = yp + r * n_out + seg * lg.len;
            for_chunks<W>(lg.len, [&](int64_t i, int64_t k) {
              Vec v = local_act.f(xa + i, k);
              if constexpr (is_gated(K)) v = v * local_gated.lin.f(load_acc<T>(xb + i, k));
              store_acc<T>(yr + i, sv * v, k);
            });
          }
        }
      });
    });
  });
}

template <Act K>
void scaled_bwd_kernel(const ScaledActBwdArgs& a) {
  const ActConfig& cfg = a.cfg;
  const int64_t rows = a.rows, n = a.features;
  const int64_t n_out = is_gated(K) ? n / 2 : n;
  const GatedGeometry g = is_gated(K) ? GatedGeometry(n, cfg.interleave) : GatedGeometry::unary(n);
  TE_DISPATCH_FLOAT(a.dtype, "scaled_activation", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using Vec = AccVec<T>;
    constexpr int64_t W = Vec::size();
    const cpu::Gated<K, A> gated(cfg);  // for a unary K, unused
    const T* xp = static_cast<const T*>(a.x);
    const T* dyp = static_cast<const T*>(a.dy);
    const A* sp = static_cast<const A*>(a.scales);
    T* dxp = static_cast<T*>(a.dx);
    A* dsp = static_cast<A*>(a.dscales);
    // the value too: dscales sums dy * act(x)
    cpu::with_act<K, T, cpu::ActUse::kGradValue>(cfg, rows * n_out, [&](const auto& act) {
      at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
        const auto local_act = act;
        const auto local_gated = gated;
        const GatedGeometry lg = g;
        const bool with_dscales = dsp != nullptr;
        for (int64_t r = r0; r < r1; ++r) {
          const Vec sv(sp[r]);
          Vec acc(A(0));
          for (int64_t seg = 0; seg < lg.segments; ++seg) {
            const T* xa0 = lg.a(xp + r * n, seg);
            const T* xb0 = lg.b(xp + r * n, seg);
            T* dxa0 = lg.a(dxp + r * n, seg);
            T* dxb0 = lg.b(dxp + r * n, seg);
            const T* dyr = dyp + r * n_out + seg * lg.len;
            for_chunks<W>(lg.len, [&](int64_t i, int64_t k) {
              // Partial chunks load zeros past the row's end: d = 0 there, so the dscales
              // lanes of the tail add exactly 0 (the activations are finite at 0).
              const Vec d = load_acc<T>(dyr + i, k);
              const Vec gs = d * sv;
              const T* xa = xa0 + i;
              Vec fa, da;
              if constexpr (is_gated(K)) {
                Vec fb, db;
                local_gated.grad_with(
                    load_acc<T>(xb0 + i, k), gs,
                    [&](const Vec& ga, Vec& f, Vec& dg) { local_act.grad(xa, k, ga, f, dg); },
                    fa, fb, da, db);
                store_acc<T>(dxa0 + i, da, k);
                store_acc<T>(dxb0 + i, db, k);
                if (with_dscales) acc += d * (fa * fb);
              } else {
                local_act.grad(xa, k, gs, fa, da);
                store_acc<T>(dxa0 + i, da, k);
                if (with_dscales) acc += d * fa;
              }
            });
          }
          if (dsp != nullptr) {
            dsp[r] = at::vec::vec_reduce_all<A>([](Vec& u, Vec& v) { return u + v; }, acc);
          }
        }
      });
    });
  });
}

// The stubs' CPU kernels: the activation is data (cfg.act), turned into the template argument
// K here. The front end only sends unary activations to bias_act / dbias_dact and activations
// with a scaled variant to the scaled ones (the activation table's registrations).
void activation_fwd_cpu(const ActFwdArgs& a) {
  visit_act(a.cfg.act, [&](auto k) { fwd_kernel<decltype(k)::value>(a); });
}

void activation_bwd_cpu(const ActBwdArgs& a) {
  visit_act(a.cfg.act, [&](auto k) { bwd_kernel<decltype(k)::value>(a); });
}

void bias_act_fwd_cpu(const BiasActArgs& a) {
  visit_unary_act("bias_act_fwd", a.cfg.act, [&](auto k) {
    constexpr Act K = decltype(k)::value;
    bias_act_kernel<K>(a);
  });
}

void dbias_dact_cpu(const DbiasDactArgs& a) {
  visit_unary_act("dbias_dact", a.cfg.act, [&](auto k) {
    constexpr Act K = decltype(k)::value;
    dbias_dact_kernel<K>(a);
  });
}

void scaled_act_fwd_cpu(const ScaledActFwdArgs& a) {
  visit_scaled_act("scaled_act_fwd", a.cfg.act, [&](auto k) {
    constexpr Act K = decltype(k)::value;
    scaled_fwd_kernel<K>(a);
  });
}

void scaled_act_bwd_cpu(const ScaledActBwdArgs& a) {
  visit_scaled_act("scaled_act_bwd", a.cfg.act, [&](auto k) {
    constexpr Act K = decltype(k)::value;
    scaled_bwd_kernel<K>(a);
  });
}

}  // namespace

int64_t cpu::activation_lookup_tables() {
  return cpu::lookup_tables_built.load(std::memory_order_relaxed);
}

int cpu::activation_lookup_use() { return cpu::lookup_use_now(); }

int cpu::set_activation_lookup_use(int use) {
  return cpu::lookup_use.exchange(use < 0 ? -1 : use);
}

TE_REGISTER_KERNEL(activation_fwd_stub, CPU, activation_fwd_cpu);
TE_REGISTER_KERNEL(activation_bwd_stub, CPU, activation_bwd_cpu);
TE_REGISTER_KERNEL(bias_act_fwd_stub, CPU, bias_act_fwd_cpu);
TE_REGISTER_KERNEL(dbias_dact_stub, CPU, dbias_dact_cpu);
TE_REGISTER_KERNEL(scaled_act_fwd_stub, CPU, scaled_act_fwd_cpu);
TE_REGISTER_KERNEL(scaled_act_bwd_stub, CPU, scaled_act_bwd_cpu);

}  // namespace te_cpp
