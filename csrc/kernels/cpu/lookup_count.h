// The activation lookup tables (kernels/cpu/act_lookup.h) as the extension module shows them:
// how many this process built (tests check which calls build one), and which calls read them.
#pragma once

#include <cstdint>

namespace te_cpp::cpu {

int64_t activation_lookup_tables();

// The calls that read the tables, as flags: 1 bf16's forwards, 2 bf16's backwards, 4 fp16's
// forwards, 8 fp16's backwards.
int activation_lookup_use();
// Sets them for the process (-1: the CPU's choice again); returns the value set before (-1
// where it was the CPU's choice), so that a caller can restore it.
int set_activation_lookup_use(int use);

}  // namespace te_cpp::cpu
