#include "inventory_command.hpp"

#include "modules/gpu_inventory/api/nvml_session.hpp"

#include <nlohmann/json.hpp>

#include <iostream>

namespace gns {

int RunInventory(const std::string& nvml_library, const std::string& host_root) {
  gpu_inventory::SessionOptions options;
  options.library = nvml_library;
  options.host_root = host_root;
  auto opened = gpu_inventory::NvmlSession::Open(options);
  if (!opened.session || !opened.read.ok) {
    std::cerr << "error: NVML (" << nvml_library << "): " << opened.read.error << "\n";
    return 1;
  }
  const auto closed = opened.session->Close();
  nlohmann::json out = {{"inventory", opened.read.inventory}, {"clique", opened.read.clique}};
  nlohmann::json warnings = opened.read.warnings;
  for (const auto& w : closed.warnings) warnings.push_back(w);
  out["warnings"] = std::move(warnings);
  if (!opened.read.failed_functions.empty()) out["failedFunctions"] = opened.read.failed_functions;
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace gns
