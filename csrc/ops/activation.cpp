// Checks, allocation and Meta kernels of the activation family.
#include "ops/activation.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <torch/library.h>

#include <c10/util/safe_numerics.h>

#include <cmath>
#include <string>

namespace te_cpp {

Act activation_by_name(const char* op, bool ActInfo::*takes, c10::string_view name) {
  for (int i = 0; i < kNumActs; ++i) {
    const ActInfo& a = kActInfo[i];
    if (a.*takes && name == c10::string_view(a.stem)) return static_cast<Act>(i);
  }
  std::string accepted;
  for (const ActInfo& a : kActInfo) {
    if (!(a.*takes)) continue;
    if (!accepted.empty()) accepted += ", ";
    accepted += a.stem;
  }
  TE_CHECK_VALUE(false, op, "activation must be one of ", accepted, ", got '", std::string(name),
                 "'");
  return Act::GELU;
}

namespace {

// The gated block width: 2 * glu_interleave_size (2 for halves), which must fit in int64.
int64_t gated_block(const char* op, int64_t interleave) {
  TE_CHECK_VALUE(interleave >= 0, op, "glu_interleave_size must be >= 0, got ", interleave);
  int64_t block = 2;
  if (interleave > 0) {
    TE_CHECK_VALUE(!c10::mul_overflows(interleave, int64_t{2}, &block), op,
                   "glu_interleave_size ", interleave,
                   " is too large: 2 * glu_interleave_size overflows int64");
  }
  return block;
}

void check_config(const char* op, const ActConfig& cfg) {
  if (!is_gated(cfg.act)) return;
  gated_block(op, cfg.interleave);
  if (cfg.act == Act::CLAMPED_SWIGLU) {
    TE_CHECK_VALUE(std::isfinite(cfg.p0) && cfg.p0 > 0, op, "limit must be finite and > 0, got ",
                   cfg.p0);
    TE_CHECK_VALUE(std::isfinite(cfg.p1), op, "alpha must be finite, got ", cfg.p1);
    TE_CHECK_VALUE(std::isfinite(cfg.p2), op, "glu_linear_offset must be finite, got ", cfg.p2);
  }
  if (cfg.act == Act::SITUGLU) {
    TE_CHECK_VALUE(std::isfinite(cfg.p0) && cfg.p0 > 0, op, "beta1 must be finite and > 0, got ",
                   cfg.p0);
    TE_CHECK_VALUE(std::isfinite(cfg.p1) && cfg.p1 > 0, op, "beta2 must be finite and > 0, got ",
                   cfg.p1);
  }
}

void check_gated_width(const char* op, const Tensor& x, const ActConfig& cfg) {
  if (!is_gated(cfg.act)) return;
  const c10::SymInt& n = x.sym_size(-1);
  const int64_t block = gated_block(op, cfg.interleave);
  TE_CHECK((n % block) == 0, op, "the last dimension of the input (shape ", shape_str(x),
           ") must be divisible by ", block,
           cfg.interleave > 0 ? " (2 * glu_interleave_size)" : " (gated activations split it "
                                                               "in two halves)");
}

}  // namespace

void ActivationFwd::check(const char* op, const Tensor& x, const ActConfig& cfg) {
  check_config(op, cfg);
  check_float(op, "input", x);
  if (is_gated(cfg.act)) {
    check_min_dim(op, "input", x, 1);
    check_gated_width(op, x, cfg);
  }
}

Tensor ActivationFwd::allocate(const Tensor& x, const ActConfig& cfg) {
  if (!is_gated(cfg.act)) return at::empty_symint(x.sym_sizes(), x.options());
  return at::empty_symint(sizes_with_last(x, x.sym_size(-1) / 2), x.options());
}

void ActivationBwd::check(const char* op, const Tensor& dy, const Tensor& x,
                          const ActConfig& cfg) {
  ActivationFwd::check(op, x, cfg);
  check_float(op, "grad_output", dy);
  check_same_device(op, "grad_output", dy, "input", x);
  if (is_gated(cfg.act)) {
    // x's last dim is even (checked above): compare with its half, as 2 * dy's could overflow
  TE_CHECK(dy.dim() == x.dim() && dy.sym_sizes().slice(0, x.dim() - 1) ==
                                         x.sym_sizes().slice(0, x.dim() - 1) &&
                 dy.sym_size(-1) == x.sym_size(-1) / 2,
             op, "grad_output shape ", shape_str(dy),
             " does not match the gated output shape of input ", shape_str(x));
  } else {
    check_same_shape(op, "grad_output", dy, "input", x);
  }
}

Tensor ActivationBwd::allocate(const Tensor& x) {
  return at::empty_symint(x.sym_sizes(), x.options());
}

namespace {

// A bias added to the last dim of x: float, 1-D, x's device and last-dim size.
void check_bias_operand(const char* op, const Tensor& x, const Tensor& bias) {
  check_float(op, "bias", bias);
  check_same_device(op, "input", x, "bias", bias);
  TE_CHECK(bias.dim() == 1, op, "bias must be 1-D, got shape ", shape_str(bias));
  TE_CHECK(x.sym_size(-1) == bias.sym_size(0), op, "input's last dimension (shape ",
           shape_str(x), ") must equal the bias size ", bias.sym_size(0));
}

bool has_tensor(const std::optional<Tensor>& t) { return t.has_value() && t->defined(); }

}  // namespace

void DbiasDact::check(const char* op, const Tensor& dy, const Tensor& x,
                      at::ScalarType bias_dtype, const std::optional<Tensor>& bias) {
  check_float(op, "grad_output", dy);
  check_float(op, "input", x);
  check_min_dim(op, "input", x, 1);
  check_same_device(op, "grad_output", dy, "input", x);
  check_same_shape(op, "grad_output", dy, "input", x);
  TE_CHECK(is_supported_float(bias_dtype), op,
           "bias dtype must be float32, float64, bfloat16 or float16, got ", bias_dtype);
  if (has_tensor(bias)) check_bias_operand(op, x, *bias);
}

std::tuple<Tensor, Tensor> DbiasDact::allocate(const Tensor& x, at::ScalarType bias_dtype,
                                               const std::optional<Tensor>& bias) {
  const at::ScalarType dx_dtype =
      has_tensor(bias) ? c10::promoteTypes(x.scalar_type(), bias->scalar_type())
                       : x.scalar_type();
  return {at::empty_symint(x.sym_sizes(), x.options().dtype(dx_dtype)),
          at::empty_symint({x.sym_size(-1)}, x.options().dtype(bias_dtype))};
}

void BiasActFwd::check(const Tensor& x, const Tensor& bias) {
  check_float(kName, "input", x);
  check_min_dim(kName, "input", x, 1);
  check_bias_operand(kName, x, bias);
}

Tensor BiasActFwd::allocate(const Tensor& x, const Tensor& bias) {
  return at::empty_symint(x.sym_sizes(),
                          x.options().dtype(c10::promoteTypes(x.scalar_type(),
                                                              bias.scalar_type())));
}

namespace {

// scales: a float tensor of shape x.shape[:-1], on x's device.
void check_scales(const char* op, const Tensor& x, const Tensor& scales) {
  check_float(op, "scales", scales);
  check_same_device(op, "scales", scales, "input", x);
  TE_CHECK(scales.sym_sizes() == x.sym_sizes().slice(0, x.dim() - 1), op, "scales shape ",
           shape_str(scales), " must equal the input's leading dims (input shape ", shape_str(x),
           ")");
}

}  // namespace

void ScaledActivationFwd::check(const char* op, const Tensor& x, const Tensor& scales,
                                const ActConfig& cfg) {
  TE_CHECK(has_scaled(cfg.act), op, "no scaled variant of ", act_op_name(cfg.act, ActOp::FWD));
  ActivationFwd::check(op, x, cfg);
  check_min_dim(op, "input", x, 1);
  check_scales(op, x, scales);
}

Tensor ScaledActivationFwd::allocate(const Tensor& x, const ActConfig& cfg) {
  return ActivationFwd::allocate(x, cfg);
}

void ScaledActivationBwd::check(const char* op, const Tensor& dy, const Tensor& x,
                                const Tensor& scales, const ActConfig& cfg) {
  TE_CHECK(has_scaled(cfg.act), op, "no scaled variant of ", act_op_name(cfg.act, ActOp::BWD));
  ActivationBwd::check(op, dy, x, cfg);
  check_min_dim(op, "input", x, 1);
  check_scales(op, x, scales);
}

std::tuple<Tensor, Tensor> ScaledActivationBwd::allocate(const Tensor& x, const Tensor& scales,
                                                         bool compute_dscales) {
  Tensor dscales = compute_dscales ? at::empty_symint(scales.sym_sizes(), scales.options())
                                   : at::empty_symint({c10::SymInt(0)}, scales.options());
  return {at::empty_symint(x.sym_sizes(), x.options()), std::move(dscales)};
}

namespace {

struct MetaBackend {
  static Tensor fwd(const Tensor& x, const ActConfig& cfg) {
    ActivationFwd::check(act_op_name(cfg.act, ActOp::FWD), x, cfg);
    return ActivationFwd::allocate(x, cfg);
  }
  static Tensor bwd(const Tensor& dy, const Tensor& x, const ActConfig& cfg) {
    ActivationBwd::check(act_op_name(cfg.act, ActOp::BWD), dy, x, cfg);
    return ActivationBwd::allocate(x);
  }
  static std::tuple<Tensor, Tensor> dbias_dact(const Tensor& dy, const Tensor& x,
                                               at::ScalarType bias_dtype,
                                               const std::optional<Tensor>& bias,
                                               const ActConfig& cfg) {
    DbiasDact::check(act_op_name(cfg.act, ActOp::DBIAS), dy, x, bias_dtype, bias);
    return DbiasDact::allocate(x, bias_dtype, bias);
  }
  static Tensor bias_act(const Tensor& x, const Tensor& bias, const ActConfig&) {
    BiasActFwd::check(x, bias);
    return BiasActFwd::allocate(x, bias);
  }
  static Tensor scaled_fwd(const Tensor& x, const Tensor& scales, const ActConfig& cfg) {
    ScaledActivationFwd::check(scaled_act_op_name(cfg.act, ActOp::FWD), x, scales, cfg);
    return ScaledActivationFwd::allocate(x, cfg);
  }
  static std::tuple<Tensor, Tensor> scaled_bwd(const Tensor& dy, const Tensor& x,
                                               const Tensor& scales, bool compute_dscales,
                                               const ActConfig& cfg) {
    ScaledActivationBwd::check(scaled_act_op_name(cfg.act, ActOp::BWD), dy, x, scales, cfg);
    return ScaledActivationBwd::allocate(x, scales, compute_dscales);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, Meta, m) { ActivationRegistrar<MetaBackend>::register_all(m); }

}  // namespace te_cpp
