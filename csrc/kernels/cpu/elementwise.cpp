// CPU kernels of the elementwise family: bias add and dbias, constant scale, residual adds.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/vec.h"
#include "ops/elementwise.h"

namespace te_cpp {
namespace {

// out[i] = f(a[i], b[i]) over n contiguous elements, in parallel chunks; f works on AccVec.
template <typename T, typename F>
void binary_map(const T* a, const T* b, T* out, int64_t n, const F& f) {
  constexpr int64_t W = AccVec<T>::size();
  at::parallel_for(0, n, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
    int64_t i = i0;
    for (; i + W <= i1; i += W) store_acc<T>(out + i, f(load_acc<T>(a + i), load_acc<T>(b + i)));
    if (i < i1) {
      const int64_t k = i1 - i;
      store_acc<T>(out + i, f(load_acc<T>(a + i, k), load_acc<T>(b + i, k)), k);
    }
  });
}

template <typename T, typename F>
void unary_map(const T* a, T* out, int64_t n, const F& f) {
  constexpr int64_t W = AccVec<T>::size();
  at::parallel_for(0, n, kParallelGrainElems, [&](int64_t i0, int64_t i1) {
    int64_t i = i0;
    for (; i + W <= i1; i += W) store_acc<T>(out + i, f(load_acc<T>(a + i)));
    if (i < i1) store_acc<T>(out + i, f(load_acc<T>(a + i, i1 - i)), i1 - i);
  });
}

Tensor bias_fwd_cpu(const Tensor& x_in, const Tensor& bias_in) {
  BiasFwd::check(x_in, bias_in);
  Tensor out = BiasFwd::allocate(x_in, bias_in);
  const Tensor x = x_in.to(out.scalar_type()).contiguous();
  const Tensor bias = bias_in.to(out.scalar_type()).contiguous();
  const auto [rows, features] = rows_features(x);
  TE_DISPATCH_FLOAT(x.scalar_type(), "bias_fwd", [&] {
    using T = scalar_t;
    constexpr int64_t W = AccVec<T>::size();
    const T* xp = x.const_data_ptr<T>();
    const T* bp = bias.const_data_ptr<T>();
    T* yp = out.mutable_data_ptr<T>();
    at::parallel_for(0, rows, row_grain(features), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = xp + r * features;
        T* yr = yp + r * features;
        int64_t f = 0;
        for (; f + W <= features; f += W) {
          store_acc<T>(yr + f, load_acc<T>(xr + f) + load_acc<T>(bp + f));
        }
        if (f < features) {
          const int64_t k = features - f;
          store_acc<T>(yr + f, load_acc<T>(xr + f, k) + load_acc<T>(bp + f, k), k);
        }
      }
    });
  });
  return out;
}

Tensor bias_bwd_cpu(const Tensor& dy, at::ScalarType bias_dtype) {
  BiasBwd::check(dy, bias_dtype);
  Tensor db = BiasBwd::allocate(dy, bias_dtype);
  cpu::bias_grad_into(db, dy);
  return db;
}

Tensor scale_cpu(const char* op, const Tensor& x_in, double scale) {
  ConstantScale::check(op, x_in);
  Tensor out = ConstantScale::allocate(x_in);
  const Tensor x = x_in.contiguous();
  TE_DISPATCH_FLOAT(x.scalar_type(), "constant_scale", [&] {
    using T = scalar_t;
    const AccVec<T> s(static_cast<acc_t<T>>(scale));
    unary_map<T>(x.const_data_ptr<T>(), out.mutable_data_ptr<T>(), x.numel(),
                 [&](const AccVec<T>& v) { return v * s; });
  });
  return out;
}

Tensor constant_scale_fwd_cpu(const Tensor& x, double scale) {
  return scale_cpu("constant_scale_fwd", x, scale);
}

Tensor constant_scale_bwd_cpu(const Tensor& dy, double scale) {
  return scale_cpu("constant_scale_bwd", dy, scale);
}

// out = a + b, all three contiguous and of one dtype.
void add_into(const Tensor& a, const Tensor& b, const Tensor& out) {
  TE_DISPATCH_FLOAT(out.scalar_type(), "residual_add", [&] {
    using T = scalar_t;
    binary_map<T>(a.const_data_ptr<T>(), b.const_data_ptr<T>(), out.mutable_data_ptr<T>(),
                  out.numel(), [](const AccVec<T>& u, const AccVec<T>& v) { return u + v; });
  });
}

Tensor residual_add_cpu(const char* op, const char* na, const Tensor& a, const char* nb,
                        const Tensor& b) {
  ResidualAdd::check(op, na, a, nb, b);
  Tensor out = ResidualAdd::allocate(a, b);
  add_into(a.to(out.scalar_type()).contiguous(), b.to(out.scalar_type()).contiguous(), out);
  return out;
}

// buffer += other, in the buffer's dtype; a non-contiguous buffer is updated through a copy.
void residual_add_inplace_cpu(const char* op, const char* nbuf, const Tensor& buffer,
                              const char* nother, const Tensor& other) {
  ResidualAdd::check_inplace(op, nbuf, buffer, nother, other);
  const Tensor o = other.to(buffer.scalar_type()).contiguous();
  if (buffer.is_contiguous()) {
    add_into(buffer, o, buffer);
  } else {
    Tensor tmp = buffer.contiguous();
    add_into(tmp, o, tmp);
    const_cast<Tensor&>(buffer).copy_(tmp);
  }
}

Tensor add_extra_input_fwd_cpu(const Tensor& x, const Tensor& extra) {
  return residual_add_cpu("add_extra_input_fwd", "input", x, "extra_input", extra);
}

void add_extra_input_fwd_inplace_cpu(const Tensor& extra, const Tensor& x) {
  residual_add_inplace_cpu("add_extra_input_fwd_inplace", "extra_input", extra, "input", x);
}

Tensor make_extra_output_bwd_cpu(const Tensor& dy, const Tensor& dextra) {
  return residual_add_cpu("make_extra_output_bwd", "grad_output", dy, "grad_extra_output",
                          dextra);
}

void make_extra_output_bwd_inplace_cpu(const Tensor& dextra, const Tensor& dy) {
  residual_add_inplace_cpu("make_extra_output_bwd_inplace", "grad_extra_output", dextra,
                           "grad_output", dy);
}

}  // namespace

void cpu::bias_grad_into(const Tensor& db, const Tensor& dy_in) {
  const Tensor dy = dy_in.contiguous();
  const auto [rows, features] = rows_features(dy);
  TE_DISPATCH_FLOAT(dy.scalar_type(), "bias_bwd", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const T* dyp = dy.const_data_ptr<T>();
    TE_DISPATCH_FLOAT(db.scalar_type(), "bias_bwd", [&] {
      cpu::blocked_column_sum<A>(rows, features, db.mutable_data_ptr<scalar_t>(),
                                 [&](int64_t r, A* acc) {
                                   cpu::accumulate_row<T>(acc, dyp + r * features, features);
                                 });
    });
  });
}

TORCH_LIBRARY_IMPL(te_cpp, CPU, m) {
  m.impl("bias_fwd", bias_fwd_cpu);
  m.impl("bias_bwd", bias_bwd_cpu);
  m.impl("constant_scale_fwd", constant_scale_fwd_cpu);
  m.impl("constant_scale_bwd", constant_scale_bwd_cpu);
  m.impl("add_extra_input_fwd", add_extra_input_fwd_cpu);
  m.impl("add_extra_input_fwd_inplace", add_extra_input_fwd_inplace_cpu);
  m.impl("make_extra_output_bwd", make_extra_output_bwd_cpu);
  m.impl("make_extra_output_bwd_inplace", make_extra_output_bwd_inplace_cpu);
}

}  // namespace te_cpp
