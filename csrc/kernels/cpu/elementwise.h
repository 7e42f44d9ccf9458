// CPU kernel pieces of the elementwise family that other families reuse.
#pragma once

#include "common/common.h"

namespace te_cpp::cpu {

// db = dy summed over all but its last dim (fp32 accumulation for reduced-precision dy), written
// into db ([features], any supported float dtype). bias_bwd's kernel; linear_bwd's dbias.
void bias_grad_into(const Tensor& db, const Tensor& dy);

}  // namespace te_cpp::cpu
