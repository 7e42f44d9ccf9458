// The registry of KernelStubs (common/stub_registry.h).
#include "common/stub_registry.h"

namespace te_cpp {
namespace {

std::vector<StubEntry>& stubs() {
  static std::vector<StubEntry> list;  // built at static initialisation, read-only after
  return list;
}

}  // namespace

bool register_stub(const StubEntry& entry) {
  stubs().push_back(entry);
  return true;
}

const std::vector<StubEntry>& registered_stubs() { return stubs(); }

}  // namespace te_cpp
