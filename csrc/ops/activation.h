// Operator classes of the activation family: the unary activations (GELU, ReLU, SiLU, QGELU,
// SReLU), the gated ones (GLU, GEGLU, QGEGLU, ReGLU, SReGLU, SwiGLU, ClampedSwiGLU, SiTUGLU),
// the fused dbias+dact backward of Bias followed by a unary activation, and the scaled
// activations (ScaledSwiGLU, ScaledClampedQGeGLU, ScaledSiTUGLU, ScaledSReLU), which multiply
// each row of the activation's output by a per-row scale. The activations and their ops are
// the rows of ops/activation_table.h; this header turns them into dispatch and registrations.
//
// Gated convention (the anchor's): the last dim of x is split in halves (a, b) and the
// activation applies to the *first* half: y = act(a) * lin(b). With glu_interleave_size = s > 0
// the last dim is read as [n / 2s, 2, s] blocks: a and b alternate in runs of s elements.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "common/backend.h"
#include "common/common.h"
#include "ops/activation_table.h"

namespace te_cpp {

// Calls f(std::integral_constant<Act, K>{}) for the runtime value a == K, so a kernel is
// written once as a template over K. The cases are generated from the activation table; an
// out-of-range value falls through to an error rather than a silent no-op.
template <class F>
decltype(auto) visit_act(Act a, F&& f) {
  switch (a) {
#define TE_VISIT(ENUM, ...) \
  case Act::ENUM:           \
    return f(std::integral_constant<Act, Act::ENUM>{});
    TE_ACTIVATION_TABLE(TE_VISIT)
#undef TE_VISIT
  }
  TORCH_CHECK(false, "te_cpp: unknown activation ", static_cast<int>(a));
}

// visit_act for the stubs that only some activations reach: the unary ones (bias_act_fwd,
// dbias_d<stem>) and those with a scaled variant. The backends instantiate their kernels for
// those alone; any other value (the front end never sends one) is an error naming `op`.
template <class F>
void visit_unary_act(const char* op, Act a, F&& f) {
  visit_act(a, [&](auto k) {
    if constexpr (is_gated(decltype(k)::value)) {
      TORCH_CHECK(false, "te_cpp.", op, ": unary activations only, got ",
                  act_op_name(decltype(k)::value, ActOp::FWD));
    } else {
      f(k);
    }
  });
}

template <class F>
void visit_scaled_act(const char* op, Act a, F&& f) {
  visit_act(a, [&](auto k) {
    if constexpr (!has_scaled(decltype(k)::value)) {
      TORCH_CHECK(false, "te_cpp.", op, ": no scaled variant of ",
                  act_op_name(decltype(k)::value, ActOp::FWD));
    } else {
      f(k);
    }
  });
}

// The activation whose stem is `name`, among those a kernel taking an activation by name
// accepts (`takes`: the table's column of that kernel, &ActInfo::bias_act or
// &ActInfo::linear_bias_act), or a ValueError naming `op` that lists the accepted names.
Act activation_by_name(const char* op, bool ActInfo::*takes, c10::string_view name);

// Runtime configuration of one activation call. p0..p2 hold the activation's own parameters,
// in the order of its PARAMS in the activation table:
//   CLAMPED_SWIGLU: p0 = limit, p1 = alpha, p2 = glu_linear_offset
//   SITUGLU:        p0 = beta1, p1 = beta2
struct ActConfig {
  Act act;
  double p0 = 0, p1 = 0, p2 = 0;
  int64_t interleave = 0;  // glu_interleave_size; 0 = halves
};

struct ActivationFwd {
  static void check(const char* op, const Tensor& x, const ActConfig& cfg);
  static Tensor allocate(const Tensor& x, const ActConfig& cfg);
};

struct ActivationBwd {
  static void check(const char* op, const Tensor& dy, const Tensor& x, const ActConfig& cfg);
  static Tensor allocate(const Tensor& x);
};

// dbias_d<act>(dy, x, bias_dtype, bias=None) -> (dx, dbias): dx = dy * act'(z), dbias = dx
// summed over rows (in the accumulation type, then stored as bias_dtype).
//   bias None:  z = x, the activation's input (the bias op's output); dx has x's dtype.
//   bias given: x is the bias op's *input* and z = x + bias is recomputed on the fly, rounded
//               to the promoted dtype of (x, bias) exactly as bias_fwd stores it (the saved
//               operands of ForwardBiasActivation); dx has that promoted dtype.
struct DbiasDact {
  static void check(const char* op, const Tensor& dy, const Tensor& x, at::ScalarType bias_dtype,
                    const std::optional<Tensor>& bias);
  static std::tuple<Tensor, Tensor> allocate(const Tensor& x, at::ScalarType bias_dtype,
                                             const std::optional<Tensor>& bias);
};

// bias_act_fwd(x, bias, activation) -> y = act(z), z = x + bias rounded to the promoted dtype
// of (x, bias) as bias_fwd stores it; y has that dtype. One pass: reads x, writes y (the
// forward of ForwardBiasActivation; z is never stored).
struct BiasActFwd {
  static constexpr const char* kName = "bias_act_fwd";
  static void check(const Tensor& x, const Tensor& bias);
  static Tensor allocate(const Tensor& x, const Tensor& bias);
};

// Scaled activations: y = scales[..., None] * act(x), where scales has shape x.shape[:-1] (any
// supported float dtype, read in the accumulation type) and x.dim() >= 1. The backward returns
//   dx = scales[..., None] * act'(x) * dy   (the gated product rule as in ActivationBwd), and
//   dscales[r] = sum_j dy[r, j] * act(x)[r, j]   (in the scales' dtype, only if requested:
//   otherwise an empty [0] tensor, so the arity stays fixed).
// Defined for the activations with a SCALED stem in the table (has_scaled): SRELU (ScaledSReLU),
// SWIGLU (ScaledSwiGLU), CLAMPED_SWIGLU (ScaledClampedQGeGLU: the anchor's clamped quick-GEGLU
// uses ClampedSwiGLU's numerics, sigmoid(alpha a') with alpha = 1.702 by default being
// quick-GELU) and SITUGLU (ScaledSiTUGLU).

struct ScaledActivationFwd {
  static void check(const char* op, const Tensor& x, const Tensor& scales, const ActConfig& cfg);
  static Tensor allocate(const Tensor& x, const ActConfig& cfg);
};

struct ScaledActivationBwd {
  static void check(const char* op, const Tensor& dy, const Tensor& x, const Tensor& scales,
                    const ActConfig& cfg);
  // (dx, dscales); dscales is empty with shape [0] when compute_dscales is false.
  static std::tuple<Tensor, Tensor> allocate(const Tensor& x, const Tensor& scales,
                                             bool compute_dscales);
};

// ---- backend stubs (csrc/common/backend.h) ----
//
// The front end (ops/activation.cpp) runs the checks and the allocation above, brings every
// tensor to the compute dtype and a contiguous layout and returns early on empty work; the
// backends then see the call as `rows` x `features` buffers of `dtype` (features: the input's
// last dim; a 0-d input is one row of one feature) and the activation as data (cfg: Act,
// parameters, glu_interleave_size). A gated activation's output and grad_output rows have
// features / 2 elements; its row is read as runs of len = interleave (or features / 2 for
// halves): run s takes a at s * 2 len and b at s * 2 len + len, and writes y at s * len.
// Arithmetic is in the accumulation type (fp32 for fp32/bf16/fp16, fp64 for fp64), with one
// rounding to the output dtype.

// y = act(x) (unary, same shape) or act(a) * lin(b) (gated).
struct ActFwdArgs {
  at::ScalarType dtype;
  ActConfig cfg;
  int64_t rows, features;
  const void* x;
  void* y;
};
TE_DECLARE_STUB(activation_fwd_stub, void(const ActFwdArgs&));

// dx = dy * act'(x) (unary), or the gated product rule into both halves of dx.
struct ActBwdArgs {
  at::ScalarType dtype;
  ActConfig cfg;
  int64_t rows, features;
  const void* dy;
  const void* x;
  void* dx;
};
TE_DECLARE_STUB(activation_bwd_stub, void(const ActBwdArgs&));

// y = act(z), z = x + bias[f] rounded to dtype (unary activations only).
struct BiasActArgs {
  at::ScalarType dtype;
  ActConfig cfg;
  int64_t rows, features;
  const void* x;
  const void* bias;
  void* y;
};
TE_DECLARE_STUB(bias_act_fwd_stub, void(const BiasActArgs&));

// dx = dy * act'(z), z = x (bias null) or x + bias[f] rounded to dtype; dbias[f] = the column
// sums of dx before its rounding, in the accumulation type in an order fixed by the shape
// alone, stored once as bias_dtype. Unary activations only; rows >= 1 and features >= 1.
struct DbiasDactArgs {
  at::ScalarType dtype, bias_dtype;
  ActConfig cfg;
  int64_t rows, features;
  const void* dy;
  const void* x;
  const void* bias;  // null: z = x
  void* dx;
  void* dbias;
};
TE_DECLARE_STUB(dbias_dact_stub, void(const DbiasDactArgs&));

// y[r] = scales[r] * act(x[r]) (unary or gated); scales: `rows` values of the accumulation type.
struct ScaledActFwdArgs {
  at::ScalarType dtype;
  ActConfig cfg;
  int64_t rows, features;
  const void* x;
  const void* scales;
  void* y;
};
TE_DECLARE_STUB(scaled_act_fwd_stub, void(const ScaledActFwdArgs&));

// dx = the backward of the activation for the incoming gradient scales[r] * dy[r]; and, when
// dscales is not null, dscales[r] = sum over the row of dy * act(x) in the accumulation type
// (its own order per backend, fixed by the shape alone).
struct ScaledActBwdArgs {
  at::ScalarType dtype;
  ActConfig cfg;
  int64_t rows, features;
  const void* dy;
  const void* x;
  const void* scales;
  void* dx;
  void* dscales;  // null: not requested
};
TE_DECLARE_STUB(scaled_act_bwd_stub, void(const ScaledActBwdArgs&));

// Binds every activation op of the table to the static functions of a backend class B, which
// must provide fwd(x, cfg), bwd(dy, x, cfg), dbias_dact(dy, x, bias_dtype, bias, cfg),
// bias_act(x, bias, cfg), scaled_fwd(x, scales, cfg) and
// scaled_bwd(dy, x, scales, compute_dscales, cfg). The Meta kernels and the front end (the CPU
// and CUDA keys) both use it, so they register the same ops; each row's schemas
// (csrc/registration.cpp) and kernel signatures below come from the same columns (torch checks
// at load time that they agree).
template <class B>
struct ActivationRegistrar {
  using Grads = std::tuple<Tensor, Tensor>;
  template <std::size_t>
  using Param = double;

  // The activation's ActConfig from its PARAMS (p0, p1, p2 in order) and interleave size.
  template <Act A, std::size_t N>
  static ActConfig config(const std::array<double, N>& p, int64_t interleave) {
    ActConfig cfg{A};
    if constexpr (N > 0) cfg.p0 = p[0];
    if constexpr (N > 1) cfg.p1 = p[1];
    if constexpr (N > 2) cfg.p2 = p[2];
    cfg.interleave = interleave;
    return cfg;
  }

  // The kernels of activation A, one `double` per name in its PARAMS (I... indexes them), in
  // the argument order of its schemas: unary ones without glu_interleave_size, gated ones
  // with it last.
  template <Act A, class Params = std::make_index_sequence<act_info(A).num_params()>>
  struct Kernels;
  template <Act A, std::size_t... I>
  struct Kernels<A, std::index_sequence<I...>> {
    static constexpr std::size_t N = sizeof...(I);
    static Tensor fwd(const Tensor& x, Param<I>... p) {
      return B::fwd(x, config<A, N>({p...}, 0));
    }
    static Tensor bwd(const Tensor& dy, const Tensor& x, Param<I>... p) {
      return B::bwd(dy, x, config<A, N>({p...}, 0));
    }
    static Tensor fwd_gated(const Tensor& x, Param<I>... p, int64_t s) {
      return B::fwd(x, config<A, N>({p...}, s));
    }
    static Tensor bwd_gated(const Tensor& dy, const Tensor& x, Param<I>... p, int64_t s) {
      return B::bwd(dy, x, config<A, N>({p...}, s));
    }
    static Tensor scaled_fwd(const Tensor& x, const Tensor& scales, Param<I>... p) {
      return B::scaled_fwd(x, scales, config<A, N>({p...}, 0));
    }
    static Grads scaled_bwd(const Tensor& dy, const Tensor& x, const Tensor& scales,
                            bool compute_dscales, Param<I>... p) {
      return B::scaled_bwd(dy, x, scales, compute_dscales, config<A, N>({p...}, 0));
    }
    static Tensor scaled_fwd_gated(const Tensor& x, const Tensor& scales, Param<I>... p,
                                   int64_t s) {
      return B::scaled_fwd(x, scales, config<A, N>({p...}, s));
    }
    static Grads scaled_bwd_gated(const Tensor& dy, const Tensor& x, const Tensor& scales,
                                  bool compute_dscales, Param<I>... p, int64_t s) {
      return B::scaled_bwd(dy, x, scales, compute_dscales, config<A, N>({p...}, s));
    }
  };

  template <Act A>
  static Grads dbias_dact(const Tensor& dy, const Tensor& x, at::ScalarType bias_dtype,
                          const std::optional<Tensor>& bias) {
    return B::dbias_dact(dy, x, bias_dtype, bias, ActConfig{A});
  }
  static Tensor bias_act_fwd(const Tensor& x, const Tensor& bias, c10::string_view activation) {
    return B::bias_act(
        x, bias, ActConfig{activation_by_name(BiasActFwd::kName, &ActInfo::bias_act, activation)});
  }

  // The ops of one table row.
  template <Act A, class Lib>
  static void register_activation(Lib& m) {
    constexpr const ActInfo& info = act_info(A);
    using K = Kernels<A>;
    if constexpr (info.gated) {
      m.impl(info.fwd, &K::fwd_gated);
      m.impl(info.bwd, &K::bwd_gated);
    } else {
      m.impl(info.fwd, &K::fwd);
      m.impl(info.bwd, &K::bwd);
    }
    if constexpr (info.dbias_dact) m.impl(info.dbias, &dbias_dact<A>);
    if constexpr (info.has_scaled() && info.gated) {
      m.impl(info.scaled_fwd, &K::scaled_fwd_gated);
      m.impl(info.scaled_bwd, &K::scaled_bwd_gated);
    } else if constexpr (info.has_scaled()) {
      m.impl(info.scaled_fwd, &K::scaled_fwd);
      m.impl(info.scaled_bwd, &K::scaled_bwd);
    }
  }

  template <class Lib>
  static void register_all(Lib& m) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (register_activation<static_cast<Act>(I)>(m), ...);
    }(std::make_index_sequence<kNumActs>{});
    m.impl("bias_act_fwd", &bias_act_fwd);
  }
};

}  // namespace te_cpp
