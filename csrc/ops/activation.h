// Operator classes of the activation family: the unary activations (GELU, ReLU, SiLU, QGELU,
// SReLU), the gated ones (GLU, GEGLU, QGEGLU, ReGLU, SReGLU, SwiGLU, ClampedSwiGLU, SiTUGLU)
// and the fused dbias+dact backward of Bias followed by a unary activation.
//
// Gated convention (the anchor's): the last dim of x is split in halves (a, b) and the
// activation applies to the *first* half: y = act(a) * lin(b). With glu_interleave_size = s > 0
// the last dim is read as [n / 2s, 2, s] blocks: a and b alternate in runs of s elements.
#pragma once

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

// dbias_d<act>(dy, x, bias_dtype) -> (dx, dbias): dx = dy * act'(x), dbias = dx summed over
// rows. x is the activation's input (the bias op's output).
struct DbiasDact {
  static void check(const char* op, const Tensor& dy, const Tensor& x, at::ScalarType bias_dtype);
  static std::tuple<Tensor, Tensor> allocate(const Tensor& x, at::ScalarType bias_dtype);
};

// Binds every activation op name to the static functions of a backend class B, which must
// provide fwd(op, x, cfg), bwd(op, dy, x, cfg) and dbias_dact(op, dy, x, bias_dtype, cfg).
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
                                               at::ScalarType bias_dtype) {
    return B::dbias_dact(dy, x, bias_dtype, ActConfig{A});
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
  }
};

}  // namespace te_cpp
