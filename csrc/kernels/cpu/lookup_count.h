// The number of activation lookup tables (kernels/cpu/act_lookup.h) built in this process, for
// the extension module's build information (tests check which calls build one).
#pragma once

#include <cstdint>

namespace te_cpp::cpu {

int64_t activation_lookup_tables();

}  // namespace te_cpp::cpu
