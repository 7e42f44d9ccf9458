// The activation lookup tables (kernels/cpu/act_lookup.h) as the extension module shows them:
// how many this process built (tests check which calls build one), and which calls read them.
#pragma once

#include <cstdint>

namespace te_cpp::cpu {

int64_t activation_lookup_tables();

// Which calls read the tables, as flags: per 16-bit dtype, the forwards (value tables) and the
// backwards.
constexpr int kLookupBf16Forward = 1;
constexpr int kLookupBf16Backward = 2;
constexpr int kLookupFp16Forward = 4;
constexpr int kLookupFp16Backward = 8;
constexpr int kLookupAll = 15;

// The flags in force.
int activation_lookup_use();
// Sets them for the process (-1: the CPU's choice again); returns the value set before (-1
// where it was the CPU's choice), so that a caller can restore it.
int set_activation_lookup_use(int use);

}  // namespace te_cpp::cpu
