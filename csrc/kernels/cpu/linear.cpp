// CPU backend of the linear family. Every GEMM is ATen's (at::mm_out / at::addmm_out: MKL or
// oneDNN) on views of the front end's buffers; what is ours is the epilogue that follows it in
// one pass over the output. A bf16 / fp16 GEMM on a CPU for which ATen has no fast 16-bit GEMM
// runs as its fp32 GEMM of the same values, rounded once (gemm_16bit_in_fp32). The FP8 GEMM is
// emulated with fp32 accumulation and one rounding to the output dtype, one of two ways
// (fp8_gemm_in_bf16): both operands dequantized to fp32 (our fp8_dequantize op) and multiplied
// in fp32, or, where the CPU multiplies bfloat16 natively, the raw FP8 values multiplied in
// bfloat16 and the sum scaled once, as cuBLASLt's FP8 GEMM does.
#include <cstdlib>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/cpu/Utils.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>

#include "ops/activation.h"
#include "ops/elementwise.h"
#include "kernels/cpu/gemm_16bit.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/vec.h"
#include "ops/linear.h"

namespace te_cpp {
namespace {

bool cpu_has(const char* key) {
  static const auto caps = at::cpu::get_cpu_capabilities();
  const auto it = caps.find(key);
  return it != caps.end() && it->second.isBool() && it->second.toBool();
}

// Whether a GEMM of this 16-bit dtype runs as the fp32 GEMM of its operands' values (each
// product of two bf16 / fp16 values is exact in fp32), rounded once to the dtype: what ATen's
// 16-bit GEMM computes too (fp32 accumulation, one rounding), in another summation order. By
// default where ATen's 16-bit GEMM is not oneDNN's, which needs AVX-512 BW/VL/DQ, AVX-NE-CONVERT
// or AMX for bf16 and AVX512-FP16, AVX-NE-CONVERT or AMX-FP16 for fp16: ATen's fallback is a
// scalar loop, tens of times slower than its fp32 GEMM. TECPP_GEMM_16BIT_IN_FP32=1 / 0 (read at
// every call) forces either.
bool gemm_16bit_in_fp32(at::ScalarType dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  if (const char* force = std::getenv("TECPP_GEMM_16BIT_IN_FP32")) return force[0] == '1';
  static const bool bf16_native =
      (cpu_has("avx512_bw") && cpu_has("avx512_vl") && cpu_has("avx512_dq")) ||
      cpu_has("avx_ne_convert") || cpu_has("amx_bf16");
  static const bool fp16_native =
      cpu_has("avx512_fp16") || cpu_has("avx_ne_convert") || cpu_has("amx_fp16");
  return !(dtype == at::kBFloat16 ? bf16_native : fp16_native);
}

}  // namespace

namespace cpu {

int gemm_16bit_in_fp32_flags() {
  return (gemm_16bit_in_fp32(at::kBFloat16) ? kGemmBf16InFp32 : 0) |
         (gemm_16bit_in_fp32(at::kHalf) ? kGemmFp16InFp32 : 0);
}

}  // namespace cpu

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

// z [rows, n] += bias in place.
template <typename T>
void bias_epilogue(T* z, const T* bias, int64_t rows, int64_t n) {
  constexpr int64_t W = AccVec<T>::size();
  const AccRow<T> b(bias, n);
  const acc_t<T>* bp = b.data();
  at::parallel_for(0, rows, row_grain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* zr = z + r * n;
      for_chunks<W>(n, [&](int64_t i, int64_t k) {
        store_acc<T>(zr + i, load_acc<T>(zr + i, k) + load_acc(bp + i, k), k);
      });
    }
  });
}

// out = beta C + alpha A B (beta 0: C is not read) with ATen's GEMM, or its fp32 GEMM rounded
// once to out's dtype (gemm_16bit_in_fp32).
void addmm_into(Tensor& out, const Tensor& C, const Tensor& A, const Tensor& B, double beta,
                double alpha) {
  if (!gemm_16bit_in_fp32(out.scalar_type())) {
    if (beta == 0.0 && alpha == 1.0) {
      at::mm_out(out, A, B);
    } else {
      at::addmm_out(out, C, A, B, beta, alpha);
    }
    return;
  }
  const Tensor a = A.to(at::kFloat), b = B.to(at::kFloat);
  if (beta == 0.0 && alpha == 1.0) {
    out.copy_(at::mm(a, b));
  } else {
    const Tensor c = beta == 0.0 ? at::zeros({}, a.options()) : C.to(at::kFloat);
    out.copy_(at::addmm(c, a, b, beta, alpha));
  }
}

// D = alpha op(A) op(B) + beta C (beta 0: C is not read).
void product(const Tensor& D, const Tensor& A, const Tensor& B, const GemmArgs& g) {
  Tensor out = D;
  const Tensor C = g.beta == 0.0 || (g.c == g.d && g.ldc == g.ldd)
                       ? D
                       : matrix(g.dtype, g.c, g.m, g.n, false, g.ldc);
  addmm_into(out, C, A, B, g.beta, g.alpha);
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
        addmm_into(D, vector(g.dtype, g.bias, g.n), A, B, 1.0, g.alpha);
        return true;
      }
      // the GEMM accumulates into C, then the bias pass over its rounded output
      product(D, A, B, g);
      TORCH_INTERNAL_ASSERT(g.ldd == g.n, "gemm_cpu: the bias pass needs a contiguous D");
      TE_DISPATCH_FLOAT(g.dtype, "linear_fwd_add", [&] {
        using T = scalar_t;
        bias_epilogue<T>(static_cast<T*>(g.d), static_cast<const T*>(g.bias), g.m, g.n);
      });
      return true;
    case GemmEpilogue::kBiasAct: {
      // z = alpha x W^T + bias from the GEMM (bias as its C operand: one rounding), then the
      // activation's own CPU kernel, y = act(z), in one pass
      TORCH_INTERNAL_ASSERT(g.beta == 0.0 && g.ldd == g.n, "gemm_cpu: kBiasAct needs beta 0");
      Tensor Z = matrix(g.dtype, g.aux, g.m, g.n, false, g.ldd);
      if (g.bias != nullptr) {
        addmm_into(Z, vector(g.dtype, g.bias, g.n), A, B, 1.0, g.alpha);
      } else {
        product(Z, A, B, g);
      }
      activation_fwd_stub(c10::DeviceType::CPU,
                          ActFwdArgs{g.dtype, ActConfig{g.act}, g.m, g.n, g.aux, g.d});
      return true;
    }
    case GemmEpilogue::kDActBiasGrad:
      break;
  }
  TORCH_CHECK(false, "te_cpp: the CPU GEMM has no epilogue ", static_cast<int>(g.epilogue));
}

// Whether the FP8 GEMM runs as a bfloat16 GEMM of the raw FP8 values. TECPP_FP8_GEMM_BF16=1 /
// 0 forces either way; by default where this CPU multiplies bfloat16 natively (AVX512_BF16 or
// AMX), and only for a bfloat16 output, the one dtype ATen's bfloat16 GEMM writes.
bool fp8_gemm_in_bf16(at::ScalarType out_dtype) {
  if (out_dtype != at::kBFloat16) return false;
  if (const char* force = std::getenv("TECPP_FP8_GEMM_BF16")) return force[0] == '1';
  static const bool native = cpu_has("avx512_bf16") || cpu_has("amx_bf16");
  return native;
}

void fp8_gemm_cpu(const Fp8GemmArgs& g) {
  static const auto dequantize =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("te_cpp::fp8_dequantize", "")
          .typed<Tensor(const Tensor&, const Tensor&, at::ScalarType, at::ScalarType)>();
  const auto operand = [&](const void* p, int64_t rows, const float* scale_inv,
                           at::ScalarType fp8, at::ScalarType dtype) {
    return dequantize.call(matrix(at::kByte, p, rows, g.k, false, g.k),
                           vector(at::kFloat, scale_inv, 1), fp8, dtype);
  };
  Tensor d = matrix(g.out_dtype, g.d, g.m, g.n, false, g.n);
  const Tensor bias = g.bias == nullptr ? Tensor() : vector(g.out_dtype, g.bias, g.n);
  if (fp8_gemm_in_bf16(g.out_dtype)) {
    // Every FP8 value is exact in bfloat16 and so is every product of two, so the bfloat16
    // GEMM with fp32 accumulation sums the exact products; the scales multiply that sum once
    // (addmm's alpha, in fp32), and the bias joins before the one rounding (beta = 1).
    static const float one = 1.0f;
    const Tensor a = operand(g.a, g.m, &one, g.a_fp8, at::kBFloat16);
    const Tensor bt = operand(g.b, g.n, &one, g.b_fp8, at::kBFloat16).t();
    const double alpha = static_cast<double>(*g.a_scale_inv * *g.b_scale_inv);
    if (bias.defined()) {
      d.copy_(bias.expand({g.m, g.n}));
      at::addmm_out(d, d, a, bt, /*beta=*/1, alpha);
    } else {
      at::addmm_out(d, d, a, bt, /*beta=*/0, alpha);
    }
    return;
  }
  const Tensor a = operand(g.a, g.m, g.a_scale_inv, g.a_fp8, at::kFloat);
  const Tensor b = operand(g.b, g.n, g.b_scale_inv, g.b_fp8, at::kFloat);
  const Tensor bt = matrix(at::kFloat, b.const_data_ptr(), g.k, g.n, true, g.k);
  const Tensor bias32 = bias.defined() ? bias.to(at::kFloat) : Tensor();
  if (g.out_dtype == at::kFloat) {
    if (bias32.defined()) {
      at::addmm_out(d, bias32, a, bt);
    } else {
      at::mm_out(d, a, bt);
    }
  } else {  // one rounding of the fp32 result to the output dtype
    d.copy_(bias32.defined() ? at::addmm(bias32, a, bt) : at::mm(a, bt));
  }
}

}  // namespace

TE_REGISTER_KERNEL(gemm_stub, CPU, gemm_cpu);
TE_REGISTER_KERNEL(fp8_gemm_stub, CPU, fp8_gemm_cpu);

}  // namespace te_cpp
