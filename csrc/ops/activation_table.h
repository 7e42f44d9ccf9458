// The activation family as one table. Each row of TE_ACTIVATION_TABLE generates, for one
// activation: its enumerator of Act; its op names and schemas (csrc/registration.cpp); its
// kernel registrations for every backend (ActivationRegistrar in ops/activation.h); whether the
// kernels that take an activation by name (bias_act_fwd, linear_bias_act_fwd) accept its stem;
// and its dbias_d<stem> and scaled ops. Its math (the functors and the ActTraits entry of
// kernels/cpu/activation_math.h) and any validation of its parameters (check_config in
// ops/activation.cpp) are written by hand.
//
// The Python classes (transformer_engine_cpp/ops/basic/activation.py and swiglu.py) declare the
// same facts as class attributes: op_stem is STEM (SCALED for the scaled class), gated is
// KIND == GATED, fuses_bias_act is BIAS_ACT, fuses_linear_bias_act is LINEAR, fuses_dbias_dact
// is DBIAS. tests/test_activation_table.py checks the registered ops and the names the by-name
// kernels accept against the classes.
//
// X(ENUM, STEM, KIND, BIAS_ACT, LINEAR, DBIAS, SCALED, PARAMS):
//   ENUM      the enumerator of Act.
//   STEM      the ops <stem>_fwd and <stem>_bwd.
//   KIND      UNARY: <stem>_fwd(Tensor x, ...) -> Tensor, same shape.
//             GATED: y = act(a) * lin(b) over the two halves (or interleaved runs) of the last
//             dim; the ops end with `int glu_interleave_size=0`.
//   BIAS_ACT  1: bias_act_fwd takes the stem as its `activation` (ForwardBiasActivation).
//   LINEAR    1: linear_bias_act_fwd takes the stem (ForwardLinearBiasActivation's epilogue).
//   DBIAS     1: the op dbias_d<stem> exists (BackwardActivationBias).
//   SCALED    "": none; else the stem of the scaled variant, <scaled>_fwd(x, scales, ...) and
//             <scaled>_bwd(dy, x, scales, compute_dscales, ...), y = scales[..., None] * act(x).
//   PARAMS    the names of the activation's own `float` arguments, in the order of the
//             schemas and of ActConfig's p0, p1, p2 ("" for none). The scaled variant takes
//             the same ones.
// The by-name kernels and dbias_d<stem> take unary activations without parameters only
// (checked below).
#pragma once

#define TE_ACTIVATION_TABLE(X)                                                                    \
  /* X(ENUM, STEM, KIND, BIAS_ACT, LINEAR, DBIAS, SCALED, PARAMS) */                              \
  X(GELU,           "gelu",           UNARY, 1, 1, 1, "",                     "")                 \
  X(RELU,           "relu",           UNARY, 1, 1, 1, "",                     "")                 \
  X(SILU,           "silu",           UNARY, 1, 1, 1, "",                     "")                 \
  X(QGELU,          "qgelu",          UNARY, 1, 1, 1, "",                     "")                 \
  X(SRELU,          "srelu",          UNARY, 1, 1, 1, "scaled_srelu",         "")                 \
  X(GLU,            "glu",            GATED, 0, 0, 0, "",                     "")                 \
  X(GEGLU,          "geglu",          GATED, 0, 0, 0, "",                     "")                 \
  X(QGEGLU,         "qgeglu",         GATED, 0, 0, 0, "",                     "")                 \
  X(REGLU,          "reglu",          GATED, 0, 0, 0, "",                     "")                 \
  X(SREGLU,         "sreglu",         GATED, 0, 0, 0, "",                     "")                 \
  X(SWIGLU,         "swiglu",         GATED, 0, 0, 0, "scaled_swiglu",        "")                 \
  X(CLAMPED_SWIGLU, "clamped_swiglu", GATED, 0, 0, 0, "scaled_clamped_qgeglu",                    \
    "limit, alpha, glu_linear_offset")                                                            \
  X(SITUGLU,        "situglu",        GATED, 0, 0, 0, "scaled_situglu",                           \
    "beta1, beta2")

namespace te_cpp {

enum class Act : int {
#define TE_ACT_ENUM(ENUM, ...) ENUM,
  TE_ACTIVATION_TABLE(TE_ACT_ENUM)
#undef TE_ACT_ENUM
};

enum class ActKind : int { UNARY, GATED };

// One row of the table, with the names of its ops ("(none)" for an op it does not have).
struct ActInfo {
  const char* stem;
  bool gated;
  bool bias_act;         // bias_act_fwd takes it by name
  bool linear_bias_act;  // linear_bias_act_fwd takes it by name
  bool dbias_dact;       // dbias_d<stem> exists
  const char* scaled;    // the scaled variant's stem, "" for none
  const char* params;    // its float arguments' names, ", "-separated; "" for none
  const char* fwd;
  const char* bwd;
  const char* dbias;
  const char* scaled_fwd;
  const char* scaled_bwd;

  constexpr bool has_scaled() const { return scaled[0] != '\0'; }
  constexpr int num_params() const {
    if (params[0] == '\0') return 0;
    int n = 1;
    for (const char* p = params; *p != '\0'; ++p) n += *p == ',';
    return n;
  }
};

// One row per Act, in enum order (the enum is generated from the same rows).
inline constexpr ActInfo kActInfo[] = {
#define TE_ACT_INFO(ENUM, STEM, KIND, BIAS_ACT, LINEAR, DBIAS, SCALED, PARAMS)           \
  {STEM,                                                                               \
   ActKind::KIND == ActKind::GATED,                                                    \
   (BIAS_ACT) != 0,                                                                    \
   (LINEAR) != 0,                                                                      \
   (DBIAS) != 0,                                                                       \
   SCALED,                                                                             \
   PARAMS,                                                                             \
   STEM "_fwd",                                                                        \
   STEM "_bwd",                                                                        \
   (DBIAS) ? "dbias_d" STEM : "(none)",                                                \
   (SCALED)[0] != '\0' ? SCALED "_fwd" : "(none)",                                     \
   (SCALED)[0] != '\0' ? SCALED "_bwd" : "(none)"},
    TE_ACTIVATION_TABLE(TE_ACT_INFO)
#undef TE_ACT_INFO
};

constexpr int kNumActs = static_cast<int>(sizeof(kActInfo) / sizeof(kActInfo[0]));

constexpr const ActInfo& act_info(Act a) { return kActInfo[static_cast<int>(a)]; }

constexpr bool is_gated(Act a) { return act_info(a).gated; }

// ScaledSReLU, ScaledSwiGLU, ScaledClampedQGeGLU, ScaledSiTUGLU: the rows with a SCALED stem.
constexpr bool has_scaled(Act a) { return act_info(a).has_scaled(); }

namespace detail {
// The kernels taking an activation by name, and dbias_d<stem>, build ActConfig{act} (no
// parameters) and have unary schemas.
constexpr bool fused_rows_are_unary_without_params() {
  for (const ActInfo& a : kActInfo) {
    if ((a.bias_act || a.linear_bias_act || a.dbias_dact) && (a.gated || a.num_params() != 0)) {
      return false;
    }
  }
  return true;
}
constexpr int max_params() {
  int n = 0;
  for (const ActInfo& a : kActInfo) n = a.num_params() > n ? a.num_params() : n;
  return n;
}
}  // namespace detail
static_assert(detail::fused_rows_are_unary_without_params(),
              "only unary activations without parameters can set BIAS_ACT, LINEAR or DBIAS");
static_assert(detail::max_params() <= 3,
              "ActConfig holds at most three activation parameters (p0, p1, p2)");

// The custom-op names of an activation, for registrations and error messages: "gelu_fwd",
// "gelu_bwd", "dbias_dgelu" (string literals, no allocation on the hot path); "(none)" for a
// DBIAS op the activation does not have.
enum class ActOp : int { FWD, BWD, DBIAS };

constexpr const char* act_op_name(Act a, ActOp kind) {
  const ActInfo& info = act_info(a);
  return kind == ActOp::FWD ? info.fwd : kind == ActOp::BWD ? info.bwd : info.dbias;
}

// "scaled_swiglu_fwd", "scaled_clamped_qgeglu_bwd", ... (FWD and BWD only); "(none)" for an
// activation without a scaled variant.
constexpr const char* scaled_act_op_name(Act a, ActOp kind) {
  const ActInfo& info = act_info(a);
  return kind == ActOp::FWD ? info.scaled_fwd : kind == ActOp::BWD ? info.scaled_bwd : "(none)";
}

}  // namespace te_cpp
