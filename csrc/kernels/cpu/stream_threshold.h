// The streaming-store threshold of the CPU kernels (kernels/cpu/stream.h), without the vector
// headers, for the extension module's getter and setter.
#pragma once

#include <cstdint>

namespace te_cpp::cpu {

// Outputs of at least this many bytes are written with non-temporal stores: by default the
// size of the CPU's last-level cache (sysfs), at most 32 MiB (and 32 MiB where it cannot be
// read).
int64_t stream_store_min_bytes();
// Sets the threshold for the process (negative: the default again); returns the value set
// before (-1 where it was the default), so that a caller can restore it.
int64_t set_stream_store_min_bytes(int64_t bytes);

}  // namespace te_cpp::cpu
