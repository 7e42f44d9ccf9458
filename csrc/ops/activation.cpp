// Checks, allocation, Meta kernels and front end of the activation family.
#include "ops/activation.h"

#include <ATen/OpMathType.h>
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

TE_DEFINE_STUB(activation_fwd_stub, void(const ActFwdArgs&));
TE_DEFINE_STUB(activation_bwd_stub, void(const ActBwdArgs&));
TE_DEFINE_STUB(bias_act_fwd_stub, void(const BiasActArgs&));
TE_DEFINE_STUB(dbias_dact_stub, void(const DbiasDactArgs&));
TE_DEFINE_STUB(scaled_act_fwd_stub, void(const ScaledActFwdArgs&));
TE_DEFINE_STUB(scaled_act_bwd_stub, void(const ScaledActBwdArgs&));

namespace {

// ---- front end (the CPU and CUDA dispatch keys) ----
//
// Each function runs the operator class's checks and allocation (those of the Meta kernels),
// takes the device guard, brings the inputs to the compute dtype and a contiguous layout,
// returns early when there is nothing to compute, and calls the family's stubs.
struct FrontEnd {
  static Tensor fwd(const Tensor& x_in, const ActConfig& cfg) {
    ActivationFwd::check(act_op_name(cfg.act, ActOp::FWD), x_in, cfg);
    const auto guard = device_guard(x_in);
    Tensor y = ActivationFwd::allocate(x_in, cfg);
    if (y.numel() == 0) return y;
    const Tensor x = x_in.contiguous();
    const auto [rows, features] = rows_features(x);
    activation_fwd_stub(x.device().type(),
                        ActFwdArgs{x.scalar_type(), cfg, rows, features, x.const_data_ptr(),
                                   y.mutable_data_ptr()});
    return y;
  }

  static Tensor bwd(const Tensor& dy_in, const Tensor& x_in, const ActConfig& cfg) {
    ActivationBwd::check(act_op_name(cfg.act, ActOp::BWD), dy_in, x_in, cfg);
    const auto guard = device_guard(x_in);
    Tensor dx = ActivationBwd::allocate(x_in);
    if (dx.numel() == 0) return dx;
    const Tensor x = x_in.contiguous();
    const Tensor dy = dy_in.to(x.scalar_type()).contiguous();
    const auto [rows, features] = rows_features(x);
    activation_bwd_stub(x.device().type(),
                        ActBwdArgs{x.scalar_type(), cfg, rows, features, dy.const_data_ptr(),
                                   x.const_data_ptr(), dx.mutable_data_ptr()});
    return dx;
  }

  static std::tuple<Tensor, Tensor> dbias_dact(const Tensor& dy_in, const Tensor& x_in,
                                               at::ScalarType bias_dtype,
                                               const std::optional<Tensor>& bias_in,
                                               const ActConfig& cfg) {
    DbiasDact::check(act_op_name(cfg.act, ActOp::DBIAS), dy_in, x_in, bias_dtype, bias_in);
    const auto guard = device_guard(x_in);
    auto [dx, db] = DbiasDact::allocate(x_in, bias_dtype, bias_in);
    if (dx.numel() == 0) {
      db.zero_();  // no rows: dbias is a sum over nothing
      return {dx, db};
    }
    const at::ScalarType dtype = dx.scalar_type();
    const Tensor x = x_in.to(dtype).contiguous();
    const Tensor bias = has_tensor(bias_in) ? bias_in->to(dtype).contiguous() : Tensor();
    const Tensor dy = dy_in.to(dtype).contiguous();
    const auto [rows, features] = rows_features(x);
    dbias_dact_stub(x.device().type(),
                    DbiasDactArgs{dtype, bias_dtype, cfg, rows, features, dy.const_data_ptr(),
                                  x.const_data_ptr(),
                                  bias.defined() ? bias.const_data_ptr() : nullptr,
                                  dx.mutable_data_ptr(), db.mutable_data_ptr()});
    return {dx, db};
  }

  static Tensor bias_act(const Tensor& x_in, const Tensor& bias_in, const ActConfig& cfg) {
    BiasActFwd::check(x_in, bias_in);
    const auto guard = device_guard(x_in);
    Tensor y = BiasActFwd::allocate(x_in, bias_in);
    if (y.numel() == 0) return y;
    const Tensor x = x_in.to(y.scalar_type()).contiguous();
    const Tensor bias = bias_in.to(y.scalar_type()).contiguous();
    const auto [rows, features] = rows_features(x);
    bias_act_fwd_stub(x.device().type(),
                      BiasActArgs{y.scalar_type(), cfg, rows, features, x.const_data_ptr(),
                                  bias.const_data_ptr(), y.mutable_data_ptr()});
    return y;
  }

  static Tensor scaled_fwd(const Tensor& x_in, const Tensor& scales_in, const ActConfig& cfg) {
    ScaledActivationFwd::check(scaled_act_op_name(cfg.act, ActOp::FWD), x_in, scales_in, cfg);
    const auto guard = device_guard(x_in);
    Tensor y = ScaledActivationFwd::allocate(x_in, cfg);
    if (y.numel() == 0) return y;
    const Tensor x = x_in.contiguous();
    // the scales are read in the accumulation type
    const Tensor scales = scales_in.to(at::toOpMathType(x.scalar_type())).contiguous();
    scaled_act_fwd_stub(x.device().type(),
                        ScaledActFwdArgs{x.scalar_type(), cfg, scales.numel(), x.size(-1),
                                         x.const_data_ptr(), scales.const_data_ptr(),
                                         y.mutable_data_ptr()});
    return y;
  }

  static std::tuple<Tensor, Tensor> scaled_bwd(const Tensor& dy_in, const Tensor& x_in,
                                               const Tensor& scales_in, bool compute_dscales,
                                               const ActConfig& cfg) {
    ScaledActivationBwd::check(scaled_act_op_name(cfg.act, ActOp::BWD), dy_in, x_in, scales_in,
                               cfg);
    const auto guard = device_guard(x_in);
    auto [dx, ds] = ScaledActivationBwd::allocate(x_in, scales_in, compute_dscales);
    const int64_t rows = scales_in.numel();
    if (rows == 0) return {dx, ds};
    if (dx.numel() == 0) {
      if (compute_dscales) ds.zero_();  // empty rows: each dscales is a sum over nothing
      return {dx, ds};
    }
    const Tensor x = x_in.contiguous();
    const Tensor dy = dy_in.to(x.scalar_type()).contiguous();
    const at::ScalarType acc_type = at::toOpMathType(x.scalar_type());
    const Tensor scales = scales_in.to(acc_type).contiguous();
    // dscales is reduced in the accumulation type, then stored in the scales' dtype
    Tensor ds_acc;
    if (compute_dscales) {
      ds_acc = ds.scalar_type() == acc_type ? ds
                                            : at::empty(ds.sizes(), ds.options().dtype(acc_type));
    }
    scaled_act_bwd_stub(x.device().type(),
                        ScaledActBwdArgs{x.scalar_type(), cfg, rows, x.size(-1),
                                         dy.const_data_ptr(), x.const_data_ptr(),
                                         scales.const_data_ptr(), dx.mutable_data_ptr(),
                                         compute_dscales ? ds_acc.mutable_data_ptr() : nullptr});
    if (compute_dscales && !ds_acc.is_same(ds)) ds.copy_(ds_acc);
    return {dx, ds};
  }
};

void register_front_ends(torch::Library& m) { ActivationRegistrar<FrontEnd>::register_all(m); }

}  // namespace

TE_REGISTER_FRONT_ENDS(register_front_ends)

}  // namespace te_cpp
