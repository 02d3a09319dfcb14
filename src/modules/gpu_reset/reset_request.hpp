#pragma once
// What a GPUReset object's spec.selector asks for, checked field by field before anything on the
// node is looked up. Only a selector that names GPUs (uuids, pciBusIDs) or says `all: true`
// selects any: a selector that is missing, empty, of the wrong type, or has a misspelt key (which
// a structural schema prunes to {}) is an invalid request, never "every GPU" (NVSentinel's
// janitor reads an omitted or empty selector as every GPU of the node; we do not, see
// src/modules/gpu_reset/README.md). Pure: no I/O, no inventory.

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_reset {

struct GpuSelection {
  bool all = false;                      // selector: {all: true}: every GPU of the node
  std::vector<std::string> uuids;        // spec.selector.uuids, each shaped like a GPU UUID
  std::vector<std::string> pci_bus_ids;  // spec.selector.pciBusIDs, each a PCI address
  // Non-empty: the request is invalid, and this says why, naming the field
  // ("spec.selector.uuids: expected a non-empty list of GPU UUIDs, got a string").
  std::string error;
};

// `spec` is the object's spec (an object). Never throws.
[[nodiscard]] GpuSelection ParseGpuSelector(const nlohmann::json& spec);

// "GPU-" followed by hex digits and dashes (what reset-gpu and spec.selector.uuids take).
[[nodiscard]] bool LooksLikeGpuUuid(std::string_view text);

}  // namespace gns::gpu_reset
