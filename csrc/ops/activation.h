// Operator classes of the activation family: the unary activations (GELU, ReLU, SiLU, QGELU,
// SReLU), the gated ones (GLU, GEGLU, QGEGLU, ReGLU, SReGLU, SwiGLU, ClampedSwiGLU, SiTUGLU),
// the fused dbias+dact backward of Bias followed by a unary activation, and the scaled
// activations (ScaledSwiGLU, ScaledClampedQGeGLU, ScaledSiTUGLU, ScaledSReLU), which multiply
// each row of the activation's output by a per-row scale.
//
// Gated convention (the anchor's): the last dim of x is split in halves (a, b) and the
// activation applies to the *first* half: y = act(a) * lin(b). With glu_interleave_size = s > 0
// the last dim is read as [n / 2s, 2, s] blocks: a and b alternate in runs of s elements.
#pragma once

#include <optional>
#include <tuple>
#include <type_traits>

#include "common/common.h"

namespace te_cpp {

// Unary activations first, then gated ones (is_gated relies on the order).
enum class Act : int {
  GELU, RELU, SILU, QGELU, SRELU,                                 // unary
  GLU, GEGLU, QGEGLU, REGLU, SREGLU, SWIGLU, CLAMPED_SWIGLU, SITUGLU  // gated
};
constexpr int kNumActs = static_cast<int>(Act::SITUGLU) + 1;

constexpr bool is_gated(Act a) { return static_cast<int>(a) >= static_cast<int>(Act::GLU); }

// Calls f(std::integral_constant<Act, K>{}) for the runtime value a == K, so a kernel is
// written once as a template over K. A missing case is a -Wswitch warning, and falls through
// to an error rather than a silent no-op.
template <class F>
decltype(auto) visit_act(Act a, F&& f) {
#define TE_VISIT(K) \
  case K:           \
    return f(std::integral_constant<Act, K>{});
  switch (a) {
    TE_VISIT(Act::GELU) TE_VISIT(Act::RELU) TE_VISIT(Act::SILU) TE_VISIT(Act::QGELU)
    TE_VISIT(Act::SRELU) TE_VISIT(Act::GLU) TE_VISIT(Act::GEGLU) TE_VISIT(Act::QGEGLU)
    TE_VISIT(Act::REGLU) TE_VISIT(Act::SREGLU) TE_VISIT(Act::SWIGLU)
    TE_VISIT(Act::CLAMPED_SWIGLU) TE_VISIT(Act::SITUGLU)
  }
#undef TE_VISIT
  TORCH_CHECK(false, "te_cpp: unknown activation ", static_cast<int>(a));
}

// The custom-op names of an activation, for error messages: "gelu_fwd", "gelu_bwd",
// "dbias_dgelu" (string literals, no allocation on the hot path). Gated activations have no
// dbias op; their DBIAS name is "(none)".
enum class ActOp : int { FWD, BWD, DBIAS };
const char* act_op_name(Act a, ActOp kind);

// The unary activation named by `name` ("gelu", "relu", "silu", "qgelu", "srelu"), for the ops
// that take the activation as a string (bias_act_fwd, linear_bias_act_fwd), or an error naming
// `op`.
Act unary_activation(const char* op, c10::string_view name);

// Runtime configuration of one activation call. p0..p2 hold the activation's own parameters:
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
// Defined for SRELU (ScaledSReLU), SWIGLU (ScaledSwiGLU), CLAMPED_SWIGLU (ScaledClampedQGeGLU:
// the anchor's clamped quick-GEGLU uses ClampedSwiGLU's numerics, sigmoid(alpha a') with
// alpha = 1.702 by default being quick-GELU) and SITUGLU (ScaledSiTUGLU).
constexpr bool has_scaled(Act a) {
  return a == Act::SRELU || a == Act::SWIGLU || a == Act::CLAMPED_SWIGLU || a == Act::SITUGLU;
}

// "scaled_swiglu_fwd", "scaled_clamped_qgeglu_bwd", ... (FWD and BWD only); "(none)" for an
// activation without a scaled variant.
const char* scaled_act_op_name(Act a, ActOp kind);

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

// Binds every activation op name to the static functions of a backend class B, which must
// provide fwd(x, cfg), bwd(dy, x, cfg), dbias_dact(dy, x, bias_dtype, bias, cfg),
// bias_act(x, bias, cfg),
// scaled_fwd(x, scales, cfg) and scaled_bwd(dy, x, scales, compute_dscales, cfg).
// The Meta, CPU and CUDA registrations all use it, so the three stay in step.
template <class B>
struct ActivationRegistrar {
  template <Act A>
  static Tensor fwd_unary(const Tensor& x) { return B::fwd(x, ActConfig{A}); }
  template <Act A>
  static Tensor bwd_unary(const Tensor& dy, const Tensor& x) {
    return B::bwd(dy, x, ActConfig{A});
  }
  template <Act A>
  static std::tuple<Tensor, Tensor> dbias_dact(const Tensor& dy, const Tensor& x,
                                               at::ScalarType bias_dtype,
                                               const std::optional<Tensor>& bias) {
    return B::dbias_dact(dy, x, bias_dtype, bias, ActConfig{A});
  }
  static Tensor bias_act_fwd(const Tensor& x, const Tensor& bias, c10::string_view activation) {
    return B::bias_act(x, bias, ActConfig{unary_activation(BiasActFwd::kName, activation)});
  }
  template <Act A>
  static Tensor fwd_gated(const Tensor& x, int64_t s) {
    return B::fwd(x, ActConfig{A, 0, 0, 0, s});
  }
  template <Act A>
  static Tensor bwd_gated(const Tensor& dy, const Tensor& x, int64_t s) {
    return B::bwd(dy, x, ActConfig{A, 0, 0, 0, s});
  }
  static Tensor clamped_swiglu_fwd(const Tensor& x, double limit, double alpha, double offset,
                                   int64_t s) {
    return B::fwd(x, ActConfig{Act::CLAMPED_SWIGLU, limit, alpha, offset, s});
  }
  static Tensor clamped_swiglu_bwd(const Tensor& dy, const Tensor& x, double limit,
                                   double alpha, double offset, int64_t s) {
    return B::bwd(dy, x, ActConfig{Act::CLAMPED_SWIGLU, limit, alpha, offset, s});
  }
  static Tensor situglu_fwd(const Tensor& x, double beta1, double beta2, int64_t s) {
    return B::fwd(x, ActConfig{Act::SITUGLU, beta1, beta2, 0, s});
  }
  static Tensor situglu_bwd(const Tensor& dy, const Tensor& x, double beta1, double beta2,
                            int64_t s) {
    return B::bwd(dy, x, ActConfig{Act::SITUGLU, beta1, beta2, 0, s});
  }

  using Grads = std::tuple<Tensor, Tensor>;
  static Tensor scaled_swiglu_fwd(const Tensor& x, const Tensor& scales, int64_t s) {
    return B::scaled_fwd(x, scales, ActConfig{Act::SWIGLU, 0, 0, 0, s});
  }
  static Grads scaled_swiglu_bwd(const Tensor& dy, const Tensor& x, const Tensor& scales,
                                 bool compute_dscales, int64_t s) {
    return B::scaled_bwd(dy, x, scales, compute_dscales, ActConfig{Act::SWIGLU, 0, 0, 0, s});
  }
  static Tensor scaled_clamped_qgeglu_fwd(const Tensor& x, const Tensor& scales, double limit,
                                          double alpha, double offset, int64_t s) {
    return B::scaled_fwd(x, scales, ActConfig{Act::CLAMPED_SWIGLU, limit, alpha, offset, s});
  }
  static Grads scaled_clamped_qgeglu_bwd(const Tensor& dy, const Tensor& x, const Tensor& scales,
                                         bool compute_dscales, double limit, double alpha,
                                         double offset, int64_t s) {
    return B::scaled_bwd(dy, x, scales, compute_dscales,
                         ActConfig{Act::CLAMPED_SWIGLU, limit, alpha, offset, s});
  }
  static Tensor scaled_situglu_fwd(const Tensor& x, const Tensor& scales, double beta1,
                                   double beta2, int64_t s) {
    return B::scaled_fwd(x, scales, ActConfig{Act::SITUGLU, beta1, beta2, 0, s});
  }
  static Grads scaled_situglu_bwd(const Tensor& dy, const Tensor& x, const Tensor& scales,
                                  bool compute_dscales, double beta1, double beta2, int64_t s) {
    return B::scaled_bwd(dy, x, scales, compute_dscales,
                         ActConfig{Act::SITUGLU, beta1, beta2, 0, s});
  }
  static Tensor scaled_srelu_fwd(const Tensor& x, const Tensor& scales) {
    return B::scaled_fwd(x, scales, ActConfig{Act::SRELU});
  }
  static Grads scaled_srelu_bwd(const Tensor& dy, const Tensor& x, const Tensor& scales,
                                bool compute_dscales) {
    return B::scaled_bwd(dy, x, scales, compute_dscales, ActConfig{Act::SRELU});
  }

  template <class Lib>
  static void register_all(Lib& m) {
#define TE_UNARY(STEM, A)                                  \
  m.impl(STEM "_fwd", &fwd_unary<A>);                      \
  m.impl(STEM "_bwd", &bwd_unary<A>);                      \
  m.impl("dbias_d" STEM, &dbias_dact<A>);
    TE_UNARY("gelu", Act::GELU)
    TE_UNARY("relu", Act::RELU)
    TE_UNARY("silu", Act::SILU)
    TE_UNARY("qgelu", Act::QGELU)
    TE_UNARY("srelu", Act::SRELU)
#undef TE_UNARY
    m.impl("bias_act_fwd", &bias_act_fwd);
#define TE_GATED(STEM, A)                  \
  m.impl(STEM "_fwd", &fwd_gated<A>);      \
  m.impl(STEM "_bwd", &bwd_gated<A>);
    TE_GATED("glu", Act::GLU)
    TE_GATED("geglu", Act::GEGLU)
    TE_GATED("qgeglu", Act::QGEGLU)
    TE_GATED("reglu", Act::REGLU)
    TE_GATED("sreglu", Act::SREGLU)
    TE_GATED("swiglu", Act::SWIGLU)
#undef TE_GATED
    m.impl("clamped_swiglu_fwd", &clamped_swiglu_fwd);
    m.impl("clamped_swiglu_bwd", &clamped_swiglu_bwd);
    m.impl("situglu_fwd", &situglu_fwd);
    m.impl("situglu_bwd", &situglu_bwd);
    m.impl("scaled_swiglu_fwd", &scaled_swiglu_fwd);
    m.impl("scaled_swiglu_bwd", &scaled_swiglu_bwd);
    m.impl("scaled_clamped_qgeglu_fwd", &scaled_clamped_qgeglu_fwd);
    m.impl("scaled_clamped_qgeglu_bwd", &scaled_clamped_qgeglu_bwd);
    m.impl("scaled_situglu_fwd", &scaled_situglu_fwd);
    m.impl("scaled_situglu_bwd", &scaled_situglu_bwd);
    m.impl("scaled_srelu_fwd", &scaled_srelu_fwd);
    m.impl("scaled_srelu_bwd", &scaled_srelu_bwd);
  }
};

}  // namespace te_cpp
