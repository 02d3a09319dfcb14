#pragma once
// This process's resource use as the kernel reports it (/proc/self): resident and private
// memory, CPU time, open file descriptors, threads.

#include <cstdint>
#include <string>

namespace gns::metrics {

struct ProcessStats {
  uint64_t vm_rss_bytes = 0;
  uint64_t rss_anon_bytes = 0;
  double cpu_seconds = 0.0;
  uint64_t open_fds = 0;
  uint64_t threads = 0;
};

// Reads /proc/self (or `proc_self`, for tests). Fields it cannot read stay 0.
ProcessStats ReadProcessStats(const std::string& proc_self = "/proc/self");

}  // namespace gns::metrics
