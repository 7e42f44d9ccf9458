// CPU kernels of the linear family. Every GEMM is ATen's (at::mm_out / at::addmm_out: MKL or
// oneDNN); what is ours is the epilogue that follows it in one pass over the output.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include "kernels/cpu/activation_math.h"
#include "ops/elementwise.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/vec.h"
#include "ops/linear.h"

namespace te_cpp {
namespace {

using cpu::for_chunks;

// The ATen calls inside these kernels run below autograd: the ops are not differentiable on
// their own (Autograd falls through to here), and out= GEMMs refuse inputs that require grad.
using BelowAutograd = at::AutoDispatchBelowADInplaceOrView;

// 2-D [rows, features] view of a contiguous tensor (the tensor itself when already 2-D: a view
// is a dispatcher call, which the small GEMMs of a host-bound step notice).
Tensor as_2d(const Tensor& t) { return t.dim() == 2 ? t : t.view({-1, t.size(-1)}); }

// Over z [rows, n]: z += bias in place (when bias is given); then y = act(z) (when act is).
template <typename T, typename ActF>
void bias_act_epilogue(T* z, const T* bias, T* y, int64_t rows, int64_t n, const ActF* act) {
  using A = acc_t<T>;
  constexpr int64_t W = AccVec<T>::size();
  at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* zr = z + r * n;
      T* yr = y ? y + r * n : nullptr;
      for_chunks<W>(n, [&](int64_t i, int64_t k) {
        AccVec<T> v = load_acc<T>(zr + i, k);
        if (bias) {
          v += load_acc<T>(bias + i, k);
          store_acc<T>(zr + i, v, k);
        }
        if (act) {
          // the activation reads the stored (rounded) pre-activation, as the unfused ops do
          if constexpr (!std::is_same_v<T, A>) {
            if (bias) v = load_acc<T>(zr + i, k);
          }
          store_acc<T>(yr + i, act->f(v), k);
        }
      });
    }
  });
}

Tensor linear_fwd_cpu(const Tensor& x_in, const Tensor& weight, const std::optional<Tensor>& bias) {
  BelowAutograd below_autograd;
  LinearShapes::check_fwd("linear_fwd", x_in, weight, bias);
  Tensor y = LinearShapes::allocate_out(x_in, weight);
  const Tensor x = x_in.contiguous();
  Tensor y2 = as_2d(y);
  if (bias.has_value()) {
    // addmm's C operand is the broadcast bias: the GEMM library fuses it into its output
    at::addmm_out(y2, *bias, as_2d(x), weight.t());
  } else {
    at::mm_out(y2, as_2d(x), weight.t());
  }
  return y;
}

std::tuple<Tensor, Tensor> linear_bias_act_fwd_cpu(const Tensor& x_in, const Tensor& weight,
                                                   const std::optional<Tensor>& bias,
                                                   c10::string_view activation) {
  BelowAutograd below_autograd;
  const char* op = "linear_bias_act_fwd";
  const Act act_kind = linear_activation(op, activation);
  LinearShapes::check_fwd(op, x_in, weight, bias);
  Tensor y = LinearShapes::allocate_out(x_in, weight);
  // z = x W^T + bias from the GEMM (bias as its C operand: one rounding), then one pass
  // y = act(z); z is also returned, as the activation's saved input.
  Tensor z = linear_fwd_cpu(x_in, weight, bias);
  const int64_t n = weight.size(0);
  const int64_t rows = n == 0 ? 0 : z.numel() / n;
  TE_DISPATCH_FLOAT(z.scalar_type(), "linear_bias_act_fwd", [&] {
    using T = scalar_t;
    visit_act(act_kind, [&](auto k) {
      constexpr Act K = decltype(k)::value;
      const typename cpu::ActTraits<K, acc_t<T>>::Act act_fn(ActConfig{K});
      bias_act_epilogue<T>(z.mutable_data_ptr<T>(), nullptr, y.mutable_data_ptr<T>(), rows, n,
                           &act_fn);
    });
  });
  return {y, z};
}

// out = extra + alpha * (x W^T) [+ bias], in extra's dtype; out may be extra itself.
void linear_add_into(const Tensor& out, const Tensor& x_in, const Tensor& weight,
                     const std::optional<Tensor>& bias_in, const Tensor& extra, double alpha) {
  const Tensor x = x_in.contiguous();
  Tensor out2 = as_2d(out);
  if (extra.scalar_type() == x.scalar_type()) {
    // the GEMM accumulates into the residual: C = extra, beta = 1
    at::addmm_out(out2, as_2d(extra.contiguous()), as_2d(x), weight.t(), 1.0, alpha);
  } else {
    // a residual stream in another dtype: GEMM in the compute dtype, add in the extra's
    const Tensor prod = at::mm(as_2d(x), weight.t());
    if (!out.is_same(extra)) out2.copy_(as_2d(extra.contiguous()));
    out2.add_(prod.to(out.scalar_type()), alpha);
  }
  if (bias_in.has_value()) {
    const Tensor bias = bias_in->to(out.scalar_type()).contiguous();
    const int64_t n = weight.size(0);
    const int64_t rows = n == 0 ? 0 : out.numel() / n;
    TE_DISPATCH_FLOAT(out.scalar_type(), "linear_fwd_add", [&] {
      using T = scalar_t;
      const cpu::Identity<acc_t<T>>* no_act = nullptr;
      bias_act_epilogue<T>(out.mutable_data_ptr<T>(), bias.const_data_ptr<T>(), nullptr, rows,
                           n, no_act);
    });
  }
}

Tensor linear_fwd_add_cpu(const Tensor& x, const Tensor& weight, const std::optional<Tensor>& bias,
                          const Tensor& extra, double alpha) {
  BelowAutograd below_autograd;
  LinearShapes::check_fwd("linear_fwd_add", x, weight, bias);
  LinearShapes::check_extra("linear_fwd_add", extra, x, weight);
  Tensor out = at::empty_symint(extra.sym_sizes(), extra.options());
  linear_add_into(out, x, weight, bias, extra, alpha);
  return out;
}

void linear_fwd_add_inplace_cpu(const Tensor& extra, const Tensor& x, const Tensor& weight,
                                const std::optional<Tensor>& bias, double alpha) {
  BelowAutograd below_autograd;
  LinearShapes::check_fwd("linear_fwd_add_inplace", x, weight, bias);
  LinearShapes::check_extra_inplace("linear_fwd_add_inplace", extra, x, weight, bias);
  if (extra.is_contiguous()) {
    linear_add_into(extra, x, weight, bias, extra, alpha);
  } else {
    // a non-contiguous buffer is updated through a contiguous copy (as the residual adds are;
    // the Meta kernel accepts any strides, so the real kernel must too)
    Tensor tmp = extra.contiguous();
    linear_add_into(tmp, x, weight, bias, tmp, alpha);
    const_cast<Tensor&>(extra).copy_(tmp);
  }
}

Tensor linear_dgrad_cpu(const Tensor& dy_in, const Tensor& weight, double alpha) {
  BelowAutograd below_autograd;
  LinearShapes::check_dgrad("linear_dgrad", dy_in, weight);
  Tensor dx = LinearShapes::allocate_dgrad(dy_in, weight);
  const Tensor dy = dy_in.contiguous();
  Tensor dx2 = as_2d(dx);
  if (alpha == 1.0) {
    at::mm_out(dx2, as_2d(dy), weight);
  } else {
    at::addmm_out(dx2, dx2, as_2d(dy), weight, 0.0, alpha);  // beta = 0: dx is not read
  }
  return dx;
}

Tensor linear_dgrad_add_cpu(const Tensor& dy_in, const Tensor& weight, const Tensor& dextra,
                            double alpha) {
  BelowAutograd below_autograd;
  LinearShapes::check_dgrad("linear_dgrad_add", dy_in, weight);
  LinearShapes::check_dextra("linear_dgrad_add", dextra, dy_in, weight);
  Tensor dx = at::empty_symint(dextra.sym_sizes(), dextra.options());
  const Tensor dy = dy_in.contiguous();
  Tensor dx2 = as_2d(dx);
  if (dextra.scalar_type() == dy.scalar_type()) {
    // the dgrad GEMM accumulates onto the residual branch's gradient: C = dextra, beta = 1
    at::addmm_out(dx2, as_2d(dextra.contiguous()), as_2d(dy), weight, 1.0, alpha);
  } else {
    dx2.copy_(as_2d(dextra.contiguous()));
    dx2.add_(at::mm(as_2d(dy), weight).to(dx.scalar_type()), alpha);
  }
  return dx;
}

Tensor linear_wgrad_cpu(const Tensor& dy_in, const Tensor& x_in, double alpha) {
  BelowAutograd below_autograd;
  LinearShapes::check_wgrad("linear_wgrad", dy_in, x_in);
  Tensor dw = LinearShapes::allocate_wgrad(dy_in, x_in);
  const Tensor dy = dy_in.contiguous(), x = x_in.contiguous();
  if (alpha == 1.0) {
    at::mm_out(dw, as_2d(dy).t(), as_2d(x));
  } else {
    at::addmm_out(dw, dw, as_2d(dy).t(), as_2d(x), 0.0, alpha);
  }
  return dw;
}

// dgrad, wgrad and (optionally) dbias of one linear in one call: the backward of BasicLinear
// and of BackwardLinearBias, three dispatcher calls fewer per step than dgrad + wgrad + bias_bwd.
std::tuple<Tensor, Tensor, Tensor> linear_bwd_cpu(const Tensor& dy_in, const Tensor& x_in,
                                                  const Tensor& weight, double alpha,
                                                  std::optional<at::ScalarType> bias_dtype) {
  BelowAutograd below_autograd;
  LinearShapes::check_bwd("linear_bwd", dy_in, x_in, weight, bias_dtype);
  Tensor dx = LinearShapes::allocate_dgrad(dy_in, weight);
  Tensor dw = LinearShapes::allocate_wgrad(dy_in, x_in);
  Tensor db = LinearShapes::allocate_dbias(dy_in, weight, bias_dtype);
  const Tensor dy2 = as_2d(dy_in.contiguous());
  const Tensor x2 = as_2d(x_in.contiguous());
  Tensor dx2 = as_2d(dx);
  if (alpha == 1.0) {
    at::mm_out(dx2, dy2, weight);
    at::mm_out(dw, dy2.t(), x2);
  } else {
    at::addmm_out(dx2, dx2, dy2, weight, 0.0, alpha);  // beta = 0: the outputs are not read
    at::addmm_out(dw, dw, dy2.t(), x2, 0.0, alpha);
  }
  if (bias_dtype.has_value()) bias_grad_into(db, dy2);
  return {dx, dw, db};
}

}  // namespace

TORCH_LIBRARY_IMPL(te_cpp, CPU, m) {
  m.impl("linear_fwd", linear_fwd_cpu);
  m.impl("linear_bias_act_fwd", linear_bias_act_fwd_cpu);
  m.impl("linear_fwd_add", linear_fwd_add_cpu);
  m.impl("linear_fwd_add_inplace", linear_fwd_add_inplace_cpu);
  m.impl("linear_dgrad", linear_dgrad_cpu);
  m.impl("linear_dgrad_add", linear_dgrad_add_cpu);
  m.impl("linear_wgrad", linear_wgrad_cpu);
  m.impl("linear_bwd", linear_bwd_cpu);
}

}  // namespace te_cpp
