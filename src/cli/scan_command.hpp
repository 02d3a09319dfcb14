#pragma once
// `gpu-node-supervisor scan`: every polled health check once, now, through NVML as gpu-inventory
// reads it and judged as gpu-health judges it (modules/gpu_health/api/scan.hpp) — the quick
// answer on a node an operator suspects, without the daemon. Exit 0 when every GPU is healthy,
// 1 when one (or the node: a GPU missing from NVML) is not, 2 when NVML cannot be read.

#include <chrono>
#include <string>

namespace gns {

struct ScanOptions {
  std::string nvml_library = "libnvidia-ml.so.1";
  std::string host_root = "/";
  std::string output = "table";  // table | json
  std::string bus_address;       // the system bus for the host services ("": $DBUS_SYSTEM_BUS_ADDRESS, else the well-known socket)
  // A second pass this long after the first: counter checks are judged on the growth between
  // the two (0: one pass, states only).
  std::chrono::milliseconds window{0};
};

int RunScan(const ScanOptions& options);

}  // namespace gns
