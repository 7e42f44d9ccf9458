// Which 16-bit GEMMs the CPU linear backend runs as ATen's fp32 GEMM (kernels/cpu/linear.cpp):
// those ATen has no fast GEMM for on this CPU. The extension module shows it.
#pragma once

namespace te_cpp::cpu {

constexpr int kGemmBf16InFp32 = 1;
constexpr int kGemmFp16InFp32 = 2;

// The flags in force now (TECPP_GEMM_16BIT_IN_FP32, where set, forces both dtypes).
int gemm_16bit_in_fp32_flags();

}  // namespace te_cpp::cpu
