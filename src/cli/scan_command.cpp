#include "scan_command.hpp"

#include "modules/gpu_health/api/scan.hpp"
#include "modules/gpu_inventory/api/nvml_session.hpp"
#include "preflight/unit_watcher.hpp"

#include <iostream>
#include <thread>

namespace gns {

int RunScan(const ScanOptions& options) {
  gpu_inventory::SessionOptions session_options;
  session_options.library = options.nvml_library;
  session_options.host_root = options.host_root;
  auto opened = gpu_inventory::NvmlSession::Open(session_options);
  if (!opened.session || !opened.read.ok) {
    std::cerr << "error: NVML (" << options.nvml_library << "): " << opened.read.error << "\n";
    return 2;
  }
  const auto& known = opened.read.inventory.gpus;
  std::optional<gpu_inventory::HealthSample> first;
  if (options.window.count() > 0) {
    first = opened.session->ReadHealth(gpu_inventory::kHealthAll, known);
    // A one-shot command, not the daemon's loop: waiting here blocks nothing else.
    std::this_thread::sleep_for(options.window);
  }
  const gpu_inventory::HealthSample sample = opened.session->ReadHealth(gpu_inventory::kHealthAll, known);
  (void)opened.session->Close();
  gpu_health::ScanReport report = gpu_health::Scan(sample, known.size(), first ? &*first : nullptr);
  const std::string bus = imex_health::SystemBusAddress(options.bus_address);
  gpu_health::ScanHostServices(report, [&](const std::string& unit) {
    return imex_health::ReadUnitOnce(bus, unit, std::chrono::seconds(2));
  });
  if (options.output == "json") {
    std::cout << gpu_health::ToJson(report).dump(2) << "\n";
  } else {
    std::cout << gpu_health::ToTable(report);
  }
  if (!report.ok) {
    std::cerr << "error: NVML health read: " << report.error << "\n";
    return 2;
  }
  return report.healthy ? 0 : 1;
}

}  // namespace gns
