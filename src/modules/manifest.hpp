#pragma once
// The modules this binary can run, in start order. Listed explicitly (no static
// self-registration): adding a module means adding one line in manifest.cpp.

#include "loop/module.hpp"

#include <vector>

namespace gns {

const std::vector<ModuleDescriptor>& ModuleManifest();

}  // namespace gns
