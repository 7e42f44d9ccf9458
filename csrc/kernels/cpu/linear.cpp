// CPU backend of the linear family. Every GEMM is ATen's (at::mm_out / at::addmm_out: MKL or
// oneDNN) on views of the front end's buffers; what is ours is the epilogue that follows it in
// one pass over the output. The FP8 GEMM is emulated exactly: both operands dequantized to fp32
// (our fp8_dequantize op), multiplied with fp32 accumulation, rounded once to the output dtype.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>

#include "kernels/cpu/activation_math.h"
#include "ops/elementwise.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/vec.h"
#include "ops/linear.h"

namespace te_cpp {
namespace {

using cpu::for_chunks;

// The logical [rows, cols] matrix at p: rows ld elements apart, or (trans) stored transposed,
// columns ld apart. A CPU tensor over the front end's memory (no dispatcher call).
Tensor matrix(at::ScalarType dtype, const void* p, int64_t rows, int64_t cols, bool trans,
              int64_t ld) {
  const int64_t strides[2] = {trans ? 1 : ld, trans ? ld : 1};
  return at::from_blob(const_cast<void*>(p), {rows, cols}, strides,
                       at::TensorOptions().dtype(dtype).device(at::kCPU));
}

Tensor vector(at::ScalarType dtype, const void* p, int64_t n) {
  return at::from_blob(const_cast<void*>(p), {n}, at::TensorOptions().dtype(dtype));
}

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

// D = alpha op(A) op(B) + beta C with ATen's GEMM (beta 0: C is not read).
void product(const Tensor& D, const Tensor& A, const Tensor& B, const GemmArgs& g) {
  Tensor out = D;
  if (g.beta == 0.0) {
    if (g.alpha == 1.0) {
      at::mm_out(out, A, B);
    } else {
      at::addmm_out(out, D, A, B, 0.0, g.alpha);  // beta = 0: D is not read
    }
  } else {
    const Tensor C =
        g.c == g.d && g.ldc == g.ldd ? D : matrix(g.dtype, g.c, g.m, g.n, false, g.ldc);
    at::addmm_out(out, C, A, B, g.beta, g.alpha);
  }
}

bool gemm_cpu(const GemmArgs& g) {
  const Tensor A = matrix(g.dtype, g.a, g.m, g.k, g.trans_a, g.lda);
  const Tensor B = matrix(g.dtype, g.b, g.k, g.n, g.trans_b, g.ldb);
  Tensor D = matrix(g.dtype, g.d, g.m, g.n, false, g.ldd);
  switch (g.epilogue) {
    case GemmEpilogue::kNone:
      product(D, A, B, g);
      return true;
    case GemmEpilogue::kBiasGrad:
      product(D, A, B, g);
      // bgrad = the row sums of op(A) = dy^T: the column sums of the stored, contiguous dy
      TORCH_INTERNAL_ASSERT(g.trans_a && g.lda == g.m, "gemm_cpu: kBiasGrad needs A = dy^T");
      column_sum_stub(c10::DeviceType::CPU,
                      ColumnSumArgs{g.dtype, g.bias_dtype, g.k, g.m, g.a, g.bgrad});
      return true;
    case GemmEpilogue::kBias:
      if (g.beta == 0.0) {
        // addmm's C operand is the broadcast bias: the GEMM library fuses it into its output
        at::addmm_out(D, vector(g.dtype, g.bias, g.n), A, B, 1.0, g.alpha);
        return true;
      }
      // the GEMM accumulates into C, then the bias pass over its rounded output
      product(D, A, B, g);
      TORCH_INTERNAL_ASSERT(g.ldd == g.n, "gemm_cpu: the bias pass needs a contiguous D");
      TE_DISPATCH_FLOAT(g.dtype, "linear_fwd_add", [&] {
        using T = scalar_t;
        const cpu::Identity<acc_t<T>>* no_act = nullptr;
        bias_act_epilogue<T>(static_cast<T*>(g.d), static_cast<const T*>(g.bias), nullptr, g.m,
                             g.n, no_act);
      });
      return true;
    case GemmEpilogue::kBiasAct: {
      // z = alpha x W^T + bias from the GEMM (bias as its C operand: one rounding), then one
      // pass y = act(z)
      TORCH_INTERNAL_ASSERT(g.beta == 0.0 && g.ldd == g.n, "gemm_cpu: kBiasAct needs beta 0");
      Tensor Z = matrix(g.dtype, g.aux, g.m, g.n, false, g.ldd);
      if (g.bias != nullptr) {
        at::addmm_out(Z, vector(g.dtype, g.bias, g.n), A, B, 1.0, g.alpha);
      } else {
        product(Z, A, B, g);
      }
      TE_DISPATCH_FLOAT(g.dtype, "linear_bias_act_fwd", [&] {
        using T = scalar_t;
        visit_act(g.act, [&](auto k) {
          constexpr Act K = decltype(k)::value;
          const typename cpu::ActTraits<K, acc_t<T>>::Act act_fn(ActConfig{K});
          bias_act_epilogue<T>(static_cast<T*>(g.aux), nullptr, static_cast<T*>(g.d), g.m, g.n,
                               &act_fn);
        });
      });
      return true;
    }
    case GemmEpilogue::kDActBiasGrad:
      break;
  }
  TORCH_CHECK(false, "te_cpp: the CPU GEMM has no epilogue ", static_cast<int>(g.epilogue));
}

void fp8_gemm_cpu(const Fp8GemmArgs& g) {
  static const auto dequantize =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("te_cpp::fp8_dequantize", "")
          .typed<Tensor(const Tensor&, const Tensor&, at::ScalarType, at::ScalarType)>();
  const auto operand = [&](const void* p, int64_t rows, const float* scale_inv,
                           at::ScalarType fp8) {
    return dequantize.call(matrix(at::kByte, p, rows, g.k, false, g.k),
                           vector(at::kFloat, scale_inv, 1), fp8, at::kFloat);
  };
  const Tensor a = operand(g.a, g.m, g.a_scale_inv, g.a_fp8);
  const Tensor b = operand(g.b, g.n, g.b_scale_inv, g.b_fp8);
  const Tensor bt = matrix(at::kFloat, b.const_data_ptr(), g.k, g.n, true, g.k);
  Tensor d = matrix(g.out_dtype, g.d, g.m, g.n, false, g.n);
  if (g.out_dtype == at::kFloat) {
    at::mm_out(d, a, bt);
  } else {
    d.copy_(at::mm(a, bt));  // one rounding of the fp32 product to the output dtype
  }
}

}  // namespace

TE_REGISTER_KERNEL(gemm_stub, CPU, gemm_cpu);
TE_REGISTER_KERNEL(fp8_gemm_stub, CPU, fp8_gemm_cpu);

}  // namespace te_cpp
