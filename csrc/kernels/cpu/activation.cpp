// CPU kernels of the activation family (see ops/activation.h for the conventions).
#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

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

template <Act K>
Tensor fwd_impl(const Tensor& x_in, const ActConfig& cfg) {
  const char* op = act_op_name(K, ActOp::FWD);
  ActivationFwd::check(op, x_in, cfg);
  Tensor y = ActivationFwd::allocate(x_in, cfg);
  const Tensor x = x_in.contiguous();
  TE_DISPATCH_FLOAT(x.scalar_type(), "activation", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    constexpr int64_t W = AccVec<T>::size();
    const T* xp = x.const_data_ptr<T>();
    T* yp = y.mutable_data_ptr<T>();
    if constexpr (!is_gated(K)) {
      const typename cpu::ActTraits<K, A>::Act act(cfg);
      at::parallel_for(0, x.numel(), kParallelGrainElems, [&](int64_t i0, int64_t i1) {
        for_chunks<W>(i1 - i0, [&](int64_t i, int64_t k) {
          store_acc<T>(yp + i0 + i, act.f(load_acc<T>(xp + i0 + i, k)), k);
        });
      });
    } else {
      const cpu::Gated<K, A> gated(cfg);
      const auto [rows, n] = rows_features(x);
      const GatedGeometry g(n, cfg.interleave);
      at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t s = 0; s < g.segments; ++s) {
            const T* a = xp + r * n + s * g.stride;
            const T* b = a + g.len;
            T* yr = yp + r * (n / 2) + s * g.len;
            for_chunks<W>(g.len, [&](int64_t i, int64_t k) {
              store_acc<T>(yr + i, gated.f(load_acc<T>(a + i, k), load_acc<T>(b + i, k)), k);
            });
          }
        }
      });
    }
  });
  return y;
}

template <Act K>
Tensor bwd_impl(const Tensor& dy_in, const Tensor& x_in, const ActConfig& cfg) {
  const char* op = act_op_name(K, ActOp::BWD);
  ActivationBwd::check(op, dy_in, x_in, cfg);
  Tensor dx = ActivationBwd::allocate(x_in);
  const Tensor x = x_in.contiguous();
  const Tensor dy = dy_in.to(x.scalar_type()).contiguous();
  TE_DISPATCH_FLOAT(x.scalar_type(), "activation", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using Vec = AccVec<T>;
    constexpr int64_t W = Vec::size();
    const T* xp = x.const_data_ptr<T>();
    const T* dyp = dy.const_data_ptr<T>();
    T* dxp = dx.mutable_data_ptr<T>();
    if constexpr (!is_gated(K)) {
      const typename cpu::ActTraits<K, A>::Act act(cfg);
      at::parallel_for(0, x.numel(), kParallelGrainElems, [&](int64_t i0, int64_t i1) {
        for_chunks<W>(i1 - i0, [&](int64_t i, int64_t k) {
          Vec f, gx;
          act.grad(load_acc<T>(xp + i0 + i, k), load_acc<T>(dyp + i0 + i, k), f, gx);
          store_acc<T>(dxp + i0 + i, gx, k);
        });
      });
    } else {
      const cpu::Gated<K, A> gated(cfg);
      const auto [rows, n] = rows_features(x);
      const GatedGeometry g(n, cfg.interleave);
      at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t s = 0; s < g.segments; ++s) {
            const int64_t a_off = r * n + s * g.stride;
            const int64_t b_off = a_off + g.len;
            const T* dyr = dyp + r * (n / 2) + s * g.len;
            for_chunks<W>(g.len, [&](int64_t i, int64_t k) {
              Vec fa, fb, da, db;
              gated.grad(load_acc<T>(xp + a_off + i, k), load_acc<T>(xp + b_off + i, k),
                         load_acc<T>(dyr + i, k), fa, fb, da, db);
              store_acc<T>(dxp + a_off + i, da, k);
              store_acc<T>(dxp + b_off + i, db, k);
            });
          }
        }
      });
    }
  });
  return dx;
}

// v rounded to T and back (identity for fp32/fp64): the value a T tensor would hold, as
// store_acc<T> then load_acc<T> would give, in registers.
template <typename T>
inline AccVec<T> round_to(const AccVec<T>& v) {
  if constexpr (std::is_same_v<T, acc_t<T>>) {
    return v;
  } else {
#if defined(CPU_CAPABILITY_AVX512)
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      // round to nearest even on the upper 16 bits (as at::vec::cvtfp32_bf16); NaN kept
      const __m512 f = v;
      const __m512i bits = _mm512_castps_si512(f);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
      __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
      r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
      return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(f, f, _CMP_ORD_Q), f,
                                  _mm512_castsi512_ps(r));
    } else if constexpr (std::is_same_v<T, c10::Half>) {
      __m512 out;
      at::vec::cvtfp16_fp32(at::vec::cvtfp32_fp16(v), out);
      return out;
    }
#elif defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      __m256 out;
      at::vec::cvtbf16_fp32(at::vec::cvtfp32_bf16(v), out);
      return out;
    } else if constexpr (std::is_same_v<T, c10::Half>) {
      __m256 out;
      at::vec::cvtfp16_fp32(at::vec::cvtfp32_fp16(v), out);
      return out;
    }
#endif
    alignas(64) T buf[AccVec<T>::size()];
    store_acc<T>(buf, v);
    return load_acc<T>(buf);
  }
}

// One pass over x (and bias): z = x + bias, rounded to T as bias_fwd stores it, then y = act(z).
template <Act K>
Tensor bias_act_impl(const Tensor& x_in, const Tensor& b_in, const ActConfig& cfg) {
  BiasActFwd::check(x_in, b_in);
  Tensor y = BiasActFwd::allocate(x_in, b_in);
  const Tensor x = x_in.to(y.scalar_type()).contiguous();
  const Tensor b = b_in.to(y.scalar_type()).contiguous();
  const auto [rows, n] = rows_features(x);
  TE_DISPATCH_FLOAT(x.scalar_type(), "bias_act_fwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    constexpr int64_t W = AccVec<T>::size();
    const typename cpu::ActTraits<K, A>::Act act(cfg);
    const T* xp = x.const_data_ptr<T>();
    const T* bp = b.const_data_ptr<T>();
    T* yp = y.mutable_data_ptr<T>();
    at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = xp + r * n;
        T* yr = yp + r * n;
        for_chunks<W>(n, [&](int64_t i, int64_t k) {
          const AccVec<T> z = load_acc<T>(xr + i, k) + load_acc<T>(bp + i, k);
          // ReLU commutes with rounding (max(round(z), 0) = round(max(z, 0))): the store's
          // rounding is enough; the others read z as bias_fwd would have stored it.
          store_acc<T>(yr + i, act.f(K == Act::RELU ? z : round_to<T>(z)), k);
        });
      }
    });
  });
  return y;
}

template <Act K>
std::tuple<Tensor, Tensor> dbias_dact_impl(const Tensor& dy_in, const Tensor& x_in,
                                           at::ScalarType bias_dtype,
                                           const std::optional<Tensor>& bias_in,
                                           const ActConfig& cfg) {
  const char* op = act_op_name(K, ActOp::DBIAS);
  DbiasDact::check(op, dy_in, x_in, bias_dtype, bias_in);
  auto [dx, db] = DbiasDact::allocate(x_in, bias_dtype, bias_in);
  const bool has_bias = bias_in.has_value() && bias_in->defined();
  const Tensor x = x_in.to(dx.scalar_type()).contiguous();
  const Tensor bias = has_bias ? bias_in->to(dx.scalar_type()).contiguous() : Tensor();
  const Tensor dy = dy_in.to(dx.scalar_type()).contiguous();
  const auto [rows, n] = rows_features(x);
  TE_DISPATCH_FLOAT(x.scalar_type(), "activation", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using Vec = AccVec<T>;
    constexpr int64_t W = Vec::size();
    const typename cpu::ActTraits<K, A>::Act act(cfg);
    const T* xp = x.const_data_ptr<T>();
    const T* bp = has_bias ? bias.const_data_ptr<T>() : nullptr;
    const T* dyp = dy.const_data_ptr<T>();
    T* dxp = dx.mutable_data_ptr<T>();
    auto run = [&](auto with_bias) {
      constexpr bool kBias = decltype(with_bias)::value;
      // dx = dy * act'(z) for row r, columns [i, i + k): stored, and returned for the sums.
      auto dact = [&](int64_t r, int64_t i, int64_t k) {
        const int64_t off = r * n + i;
        Vec z = load_acc<T>(xp + off, k);
        if constexpr (kBias) z = round_to<T>(z + load_acc<T>(bp + i, k));
        Vec f, d;
        act.grad(z, load_acc<T>(dyp + off, k), f, d);
        store_acc<T>(dxp + off, d, k);
        return d;
      };
      // One pass per row: dx stored and added to the row block's partial dbias row. Rows are
      // walked one after the other, so x, dy and dx are each one long sequential stream (rows
      // of a block walked together, with the partial sums in registers, measured slower: more
      // streams than the prefetchers follow, worst for short rows).
      auto row_fn = [&](int64_t r, A* acc) {
        for_chunks<W>(n, [&](int64_t i, int64_t k) {
          (Vec::loadu(acc + i, k) + dact(r, i, k)).store(acc + i, k);
        });
      };
      TE_DISPATCH_FLOAT(bias_dtype, "dbias_dact", [&] {
        const std::vector<A> sums = cpu::blocked_column_sums<A>(rows, n, row_fn);
        scalar_t* dbp = db.mutable_data_ptr<scalar_t>();
        for (int64_t f = 0; f < n; ++f) dbp[f] = static_cast<scalar_t>(sums[f]);
      });
    };
    if (has_bias) {
      run(std::true_type{});
    } else {
      run(std::false_type{});
    }
  });
  return {dx, db};
}

// Scaled activations (ops/activation.h): row r of the output is scales[r] * act(x_r). Rows run in
// parallel; each row is `segments` runs (one for a unary activation), vectorised as the plain
// kernels. dscales[r] is accumulated in one Vectorized<acc_t> register per row and its lanes
// summed once, so it depends only on the row, never on the thread count.
template <Act K>
Tensor scaled_fwd_impl(const Tensor& x_in, const Tensor& s_in, const ActConfig& cfg) {
  const char* op = scaled_act_op_name(K, ActOp::FWD);
  ScaledActivationFwd::check(op, x_in, s_in, cfg);
  Tensor y = ScaledActivationFwd::allocate(x_in, cfg);
  const Tensor x = x_in.contiguous();
  const Tensor s = s_in.to(at::toOpMathType(x.scalar_type())).contiguous();
  const int64_t n = x.size(-1);
  const int64_t rows = s.numel();
  const int64_t n_out = is_gated(K) ? n / 2 : n;
  const GatedGeometry g = is_gated(K) ? GatedGeometry(n, cfg.interleave) : GatedGeometry::unary(n);
  TE_DISPATCH_FLOAT(x.scalar_type(), "scaled_activation", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using Vec = AccVec<T>;
    constexpr int64_t W = Vec::size();
    const cpu::Gated<K, A> gated(cfg);  // for a unary K, gated.act alone
    const T* xp = x.const_data_ptr<T>();
    const A* sp = s.const_data_ptr<A>();
    T* yp = y.mutable_data_ptr<T>();
    at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const Vec sv(sp[r]);
        for (int64_t seg = 0; seg < g.segments; ++seg) {
          const T* a = xp + r * n + seg * g.stride;
          T* yr = yp + r * n_out + seg * g.len;
          for_chunks<W>(g.len, [&](int64_t i, int64_t k) {
            const Vec xa = load_acc<T>(a + i, k);
            Vec v;
            if constexpr (is_gated(K)) {
              v = gated.f(xa, load_acc<T>(a + g.len + i, k));
            } else {
              v = gated.act.f(xa);
            }
            store_acc<T>(yr + i, sv * v, k);
          });
        }
      }
    });
  });
  return y;
}

template <Act K>
std::tuple<Tensor, Tensor> scaled_bwd_impl(const Tensor& dy_in, const Tensor& x_in,
                                           const Tensor& s_in, bool compute_dscales,
                                           const ActConfig& cfg) {
  const char* op = scaled_act_op_name(K, ActOp::BWD);
  ScaledActivationBwd::check(op, dy_in, x_in, s_in, cfg);
  auto [dx, ds] = ScaledActivationBwd::allocate(x_in, s_in, compute_dscales);
  const Tensor x = x_in.contiguous();
  const Tensor dy = dy_in.to(x.scalar_type()).contiguous();
  const at::ScalarType acc_type = at::toOpMathType(x.scalar_type());
  const Tensor s = s_in.to(acc_type).contiguous();
  const int64_t n = x.size(-1);
  const int64_t rows = s.numel();
  const int64_t n_out = is_gated(K) ? n / 2 : n;
  const GatedGeometry g = is_gated(K) ? GatedGeometry(n, cfg.interleave) : GatedGeometry::unary(n);
  // dscales is reduced in the accumulation type, then stored in the scales' dtype.
  Tensor ds_acc;
  if (compute_dscales) {
    ds_acc = ds.scalar_type() == acc_type ? ds
                                          : at::empty(ds.sizes(), ds.options().dtype(acc_type));
  }
  TE_DISPATCH_FLOAT(x.scalar_type(), "scaled_activation", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    using Vec = AccVec<T>;
    constexpr int64_t W = Vec::size();
    const cpu::Gated<K, A> gated(cfg);  // for a unary K, gated.act alone
    const T* xp = x.const_data_ptr<T>();
    const T* dyp = dy.const_data_ptr<T>();
    const A* sp = s.const_data_ptr<A>();
    T* dxp = dx.mutable_data_ptr<T>();
    A* dsp = compute_dscales ? ds_acc.mutable_data_ptr<A>() : nullptr;
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
            Vec fa, da;
            if constexpr (is_gated(K)) {
              const int64_t b_off = a_off + g.len;
              Vec fb, db;
              gated.grad(load_acc<T>(xp + a_off + i, k), load_acc<T>(xp + b_off + i, k), gs, fa,
                         fb, da, db);
              store_acc<T>(dxp + a_off + i, da, k);
              store_acc<T>(dxp + b_off + i, db, k);
              if (dsp != nullptr) acc += d * (fa * fb);
            } else {
              gated.act.grad(load_acc<T>(xp + a_off + i, k), gs, fa, da);
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
  if (compute_dscales && !ds_acc.is_same(ds)) ds.copy_(ds_acc);
  return {dx, ds};
}

struct CpuBackend {
  static Tensor fwd(const Tensor& x, const ActConfig& cfg) {
    return visit_act(cfg.act, [&](auto k) { return fwd_impl<decltype(k)::value>(x, cfg); });
  }
  static Tensor bwd(const Tensor& dy, const Tensor& x, const ActConfig& cfg) {
    return visit_act(cfg.act, [&](auto k) { return bwd_impl<decltype(k)::value>(dy, x, cfg); });
  }
  static std::tuple<Tensor, Tensor> dbias_dact(const Tensor& dy, const Tensor& x,
                                               at::ScalarType bias_dtype,
                                               const std::optional<Tensor>& bias,
                                               const ActConfig& cfg) {
    return visit_act(cfg.act, [&](auto k) -> std::tuple<Tensor, Tensor> {
      constexpr Act K = decltype(k)::value;
      if constexpr (is_gated(K)) {
        TORCH_CHECK(false, "te_cpp: dbias+dact is fused for unary activations only, got ",
                    act_op_name(K, ActOp::FWD));
      } else {
        return dbias_dact_impl<K>(dy, x, bias_dtype, bias, cfg);
      }
    });
  }
  static Tensor bias_act(const Tensor& x, const Tensor& bias, const ActConfig& cfg) {
    return visit_act(cfg.act, [&](auto k) -> Tensor {
      constexpr Act K = decltype(k)::value;
      if constexpr (is_gated(K)) {
        TORCH_CHECK(false, "te_cpp.bias_act_fwd: unary activations only, got ",
                    act_op_name(K, ActOp::FWD));
      } else {
        return bias_act_impl<K>(x, bias, cfg);
      }
    });
  }
  static Tensor scaled_fwd(const Tensor& x, const Tensor& scales, const ActConfig& cfg) {
    return visit_act(cfg.act, [&](auto k) -> Tensor {
      constexpr Act K = decltype(k)::value;
      if constexpr (!has_scaled(K)) {
        TORCH_CHECK(false, "te_cpp: no scaled variant of ", act_op_name(K, ActOp::FWD));
      } else {
        return scaled_fwd_impl<K>(x, scales, cfg);
      }
    });
  }
  static std::tuple<Tensor, Tensor> scaled_bwd(const Tensor& dy, const Tensor& x,
                                               const Tensor& scales, bool compute_dscales,
                                               const ActConfig& cfg) {
    return visit_act(cfg.act, [&](auto k) -> std::tuple<Tensor, Tensor> {
      constexpr Act K = decltype(k)::value;
      if constexpr (!has_scaled(K)) {
        TORCH_CHECK(false, "te_cpp: no scaled variant of ", act_op_name(K, ActOp::BWD));
      } else {
        return scaled_bwd_impl<K>(dy, x, scales, compute_dscales, cfg);
      }
    });
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, CPU, m) { ActivationRegistrar<CpuBackend>::register_all(m); }

}  // namespace te_cpp
