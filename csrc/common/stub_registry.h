// The list of every KernelStub (common/backend.h), for build checks: which ops' backends this
// build has. Kept free of torch headers, so that module.cpp stays light.
#pragma once

#include <vector>

namespace te_cpp {

struct StubEntry {
  const char* name;
  bool (*has_cpu)(const void* stub);
  bool (*has_cuda)(const void* stub);
  const void* stub;
};

// Adds a stub (TE_DEFINE_STUB, at static initialisation); returns true.
bool register_stub(const StubEntry& entry);
const std::vector<StubEntry>& registered_stubs();

}  // namespace te_cpp
