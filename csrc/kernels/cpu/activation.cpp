// CPU backend of the activation family: the stubs of ops/activation.h (see there for the
// conventions) on contiguous buffers; the front end (ops/activation.cpp) did the checks,
// allocation and casts.
#include <ATen/cpu/vec/functional.h>

#include <vector>

#include "kernels/cpu/act_lookup.h"
#include "kernels/cpu/activation_math.h"
#include "kernels/cpu/reduce.h"
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
      cpu::with_act<K, T, cpu::ActUse::kValue>(cfg, total, [&](const auto& act) {
        at::parallel_for(0, total, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
          for_chunks<W>(i1 - i0, [&](int64_t i, int64_t k) {
            store_acc<T>(yp + i0 + i, act.f(xp + i0 + i, k), k);
          });
        });
      });
    } else {
      // y = act(a) * lin(b)
      const cpu::Gated<K, A> gated(cfg);
      const int64_t rows = a.rows, n = a.features;
      const GatedGeometry g(n, cfg.interleave);
      cpu::with_act<K, T, cpu::ActUse::kValue>(cfg, rows * n / 2, [&](const auto& act) {
        at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t s = 0; s < g.segments; ++s) {
              const T* xa = xp + r * n + s * g.stride;
              const T* xb = xa + g.len;
              T* yr = yp + r * (n / 2) + s * g.len;
              for_chunks<W>(g.len, [&](int64_t i, int64_t k) {
                prefetch_ahead(xa + i);
                prefetch_ahead(xb + i);
                prefetch_ahead_for_write(yr + i);
                const AccVec<T> vb = load_acc<T>(xb + i, k);
                store_acc<T>(yr + i, act.f(xa + i, k) * gated.lin.f(vb), k);
              });
            }
          }
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
      cpu::with_act<K, T, cpu::ActUse::kGrad>(cfg, total, [&](const auto& act) {
        at::parallel_for(0, total, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
          for_chunks<W>(i1 - i0, [&](int64_t i, int64_t k) {
            Vec f, gx;
            act.grad(xp + i0 + i, k, load_acc<T>(dyp + i0 + i, k), f, gx);
            store_acc<T>(dxp + i0 + i, gx, k);
          });
        });
      });
    } else {
      const cpu::Gated<K, A> gated(cfg);
      const int64_t rows = a.rows, n = a.features;
      const GatedGeometry g(n, cfg.interleave);
      cpu::with_act<K, T, cpu::ActUse::kGradValue>(cfg, rows * n / 2, [&](const auto& act) {
        at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t s = 0; s < g.segments; ++s) {
              const int64_t a_off = r * n + s * g.stride;
              const int64_t b_off = a_off + g.len;
              const T* dyr = dyp + r * (n / 2) + s * g.len;
              for_chunks<W>(g.len, [&](int64_t i, int64_t k) {
                prefetch_ahead(xp + a_off + i);
                prefetch_ahead(xp + b_off + i);
                prefetch_ahead(dyr + i);
                prefetch_ahead_for_write(dxp + a_off + i);
                prefetch_ahead_for_write(dxp + b_off + i);
                const T* xa = xp + a_off + i;
                Vec fa, fb, da, db;
                gated.grad_with(
                    load_acc<T>(xp + b_off + i, k), load_acc<T>(dyr + i, k),
                    [&](const Vec& ga, Vec& f, Vec& d) { act.grad(xa, k, ga, f, d); }, fa, fb,
                    da, db);
                store_acc<T>(dxp + a_off + i, da, k);
                store_acc<T>(dxp + b_off + i, db, k);
              });
            }
          }
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
    const T* bp = static_cast<const T*>(a.bias);
    T* yp = static_cast<T*>(a.y);
    cpu::with_act<K, T, cpu::ActUse::kValue>(a.cfg, rows * n, [&](const auto& act) {
      at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* xr = xp + r * n;
          T* yr = yp + r * n;
          for_chunks<W>(n, [&](int64_t i, int64_t k) {
            store_acc<T>(yr + i, act.f_rounded(load_acc<T>(xr + i, k) + load_acc<T>(bp + i, k)),
                         k);
          });
        }
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
    const T* bp = static_cast<const T*>(a.bias);
    const T* dyp = static_cast<const T*>(a.dy);
    T* dxp = static_cast<T*>(a.dx);
    cpu::with_act<K, T, cpu::ActUse::kGrad>(a.cfg, rows * n, [&](const auto& act) {
      auto run = [&](auto with_bias) {
        constexpr bool kBias = decltype(with_bias)::value;
        // dx = dy * act'(z) for row r, columns [i, i + k) (z = x + bias rounded to T, as
        // bias_fwd stores it): stored, and returned for the sums.
        auto dact = [&](int64_t r, int64_t i, int64_t k) {
          const int64_t off = r * n + i;
          const Vec dy = load_acc<T>(dyp + off, k);
          Vec f, d;
          if constexpr (kBias) {
            act.grad_rounded(load_acc<T>(xp + off, k) + load_acc<T>(bp + i, k), dy, f, d);
          } else {
            act.grad(xp + off, k, dy, f, d);
          }
          store_acc<T>(dxp + off, d, k);
          return d;
        };
        // One pass per row: dx stored and added to the row block's partial dbias row. Rows are
        // walked one after the other, so x, dy and dx are each one long sequential stream
        // (rows of a block walked together, with the partial sums in registers, measured
        // slower: more streams than the prefetchers follow, worst for short rows).
        auto row_fn = [&](int64_t r, A* acc) {
          for_chunks<W>(n, [&](int64_t i, int64_t k) {
            (Vec::loadu(acc + i, k) + dact(r, i, k)).store(acc + i, k);
          });
        };
        TE_DISPATCH_FLOAT(a.bias_dtype, "dbias_dact", [&] {
          const std::vector<A> sums = cpu::blocked_column_sums<A>(rows, n, row_fn);
          scalar_t* dbp = static_cast<scalar_t*>(a.dbias);
          for (int64_t f = 0; f < n; ++f) dbp[f] = static_cast<scalar_t>(sums[f]);
        });
      };
      if (bp != nullptr) {
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
        for (int64_t r = r0; r < r1; ++r) {
          const Vec sv(sp[r]);
          for (int64_t seg = 0; seg < g.segments; ++seg) {
            const T* xa = xp + r * n + seg * g.stride;
            T* yr = yp + r * n_out + seg * g.len;
            for_chunks<W>(g.len, [&](int64_t i, int64_t k) {
              Vec v = act.f(xa + i, k);
              if constexpr (is_gated(K)) v = v * gated.lin.f(load_acc<T>(xa + g.len + i, k));
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
        for (int64_t r = r0; r < r1; ++r) {
          const Vec sv(sp[r]);
          Vec acc(A(0));
          for (int64_t seg = 0; seg < g.segments; ++seg) {
            const int64_t a_off = r * n + seg * g.stride;
            const T* dyr = dyp + r * n_out + seg * g.len;
            for_chunks<W>(g.len, [&](int64_t i, int64_t k) {
              // Partial chunks load zeros past the row's end: d = 0 there, so the dscales
              // lanes of the tail add exactly 0 (the activations are finite at 0).
              const Vec d = load_acc<T>(dyr + i, k);
              const Vec gs = d * sv;
              const T* xa = xp + a_off + i;
              Vec fa, da;
              if constexpr (is_gated(K)) {
                const int64_t b_off = a_off + g.len;
                Vec fb, db;
                gated.grad_with(
                    load_acc<T>(xp + b_off + i, k), gs,
                    [&](const Vec& ga, Vec& f, Vec& dg) { act.grad(xa, k, ga, f, dg); }, fa, fb,
                    da, db);
                store_acc<T>(dxp + a_off + i, da, k);
                store_acc<T>(dxp + b_off + i, db, k);
                if (dsp != nullptr) acc += d * (fa * fb);
              } else {
                act.grad(xa, k, gs, fa, da);
                store_acc<T>(dxp + a_off + i, da, k);
                if (dsp != nullptr) acc += d * fa;
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
