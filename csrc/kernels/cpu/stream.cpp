// The streaming-store threshold (kernels/cpu/stream.h).
#include "kernels/cpu/stream_threshold.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <string>

namespace te_cpp::cpu {
namespace {

// The most of the last-level cache the threshold counts on one process keeping. sysfs lists
// the whole cache, which on a large server part all of its cores share: 480 MiB on an Intel
// Xeon VM whose 2 cores see a copy fall to memory's bandwidth between 64 and 128 MiB moved.
constexpr int64_t kMaxResidentBytes = int64_t(32) << 20;

// The default threshold: the largest cache that cpu0's sysfs entries list (index0, index1,
// ...: "32768K"), at most kMaxResidentBytes; kMaxResidentBytes where none can be read.
int64_t default_threshold_bytes() {
  int64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    std::string s;
    if (!(f >> s) || s.empty()) break;
    int64_t scale = 1;
    if (s.back() == 'K') scale = int64_t(1) << 10;
    if (s.back() == 'M') scale = int64_t(1) << 20;
    try {
      best = std::max<int64_t>(best, std::stoll(s) * scale);
    } catch (...) {
      break;
    }
  }
  return best > 0 ? std::min(best, kMaxResidentBytes) : kMaxResidentBytes;
}

std::atomic<int64_t> threshold{-1};

}  // namespace

int64_t stream_store_min_bytes() {
  static const int64_t kDefault = default_threshold_bytes();
  const int64_t t = threshold.load(std::memory_order_relaxed);
  return t < 0 ? kDefault : t;
}

int64_t set_stream_store_min_bytes(int64_t bytes) {
  return threshold.exchange(bytes < 0 ? -1 : bytes);
}

}  // namespace te_cpp::cpu
