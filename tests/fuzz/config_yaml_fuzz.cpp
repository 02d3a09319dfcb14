// libFuzzer target for the site config's YAML reader (src/loop/config.cpp over libfyaml): on
// every byte string ParseYaml either returns a tree or throws ConfigError with a position —
// never a crash, a hang or unbounded memory (issue #24: alias loops, billion laughs). Small
// limits so that the bounds themselves are reached often. Built by run-fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "loop/config_checks.hpp"

namespace {

std::size_t CountNodes(const gns::ConfigValue& value) {
  std::size_t n = 1;
  for (const auto& item : value.items) n += CountNodes(item);
  for (const auto& entry : value.entries) n += CountNodes(entry.value);
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  gns::YamlLimits limits;
  limits.max_nodes = 2000;
  limits.max_scalar_bytes = 64 * 1024;
  limits.max_depth = 32;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    gns::ConfigValue root = gns::ParseYaml(text, "fuzz.yaml", limits);
    // What came back is within the limits.
    if (CountNodes(root) > limits.max_nodes) std::abort();
    gns::ConfigValue copy = root;
    gns::MergeOverlay(copy, root);
  } catch (const gns::ConfigError& e) {
    // Every refusal names the file.
    if (std::string_view(e.what()).rfind("fuzz.yaml", 0) != 0) std::abort();
  }
  return 0;
}
