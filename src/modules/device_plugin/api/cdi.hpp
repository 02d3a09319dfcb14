#pragma once
// The device plugin's CDI spec builder on the module's public surface (library
// gns_device_plugin_cdi): what a GPU or MIG device needs in a container (its device nodes) and
// what every NVIDIA container needs (control nodes, driver files, GSP firmware, the toolkit's
// hooks), read from the host once and built as pure functions. The device plugin writes one
// spec for its resource from it; the DRA `gpu.nvidia.com` driver (dra-gpu) writes one per
// prepared claim, so both hand a container the same devices, files and hooks.
// Declarations: ../cdi_spec.hpp (CdiHostFacts, CdiSettings, DiscoverCdiHostFacts,
// BuildCdiSpec, ValidateCdiSpec) and ../resource_plan.hpp (PhysicalDevice).

#include "modules/device_plugin/cdi_spec.hpp"
#include "modules/device_plugin/resource_plan.hpp"
