// NVML reads, the event set and the session lifecycle (worker side).
#include "modules/gpu_inventory/api/nvml_session.hpp"

#include "modules/gpu_inventory/clique.hpp"
#include "modules/gpu_inventory/nvml_fabric.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

namespace gns::gpu_inventory {

namespace {

// 16 words of 64 NUMA nodes each: more than any machine has.
constexpr unsigned int kNodeSetWords = 16;

// One active NVLink and the PCI address at its far end.
struct RemoteLink {
  uint32_t link = 0;
  PciAddress pci;
};

// A read that also remembers the handles it used (worker side only).
struct RawRead {
  ReadResult result;
  std::vector<nvml::Device> handles;  // parallel to result.inventory.gpus
};

class Reader {
 public:
  // `switch_ports`: also read which NVSwitch port each NVLink ends in (GpuInfo::nvswitch_links).
  Reader(const NvmlLibrary& library, const std::string& host_root, const ExcludedGpus& excluded, bool switch_ports)
      : library_(library), api_(library.Api()), host_root_(host_root), excluded_(excluded), switch_ports_(switch_ports) {}

  RawRead Run() {
    RawRead raw;
    if (!ReadAll(raw)) {
      raw.result.ok = false;
      raw.result.inventory = {};
      raw.handles.clear();
      return raw;
    }
    raw.result.ok = true;
    raw.result.inventory.available = true;
    return raw;
  }

 private:
  // Records a failed call for the error counter.
  void Count(const char* function, nvml::Return rc) {
    if (rc != nvml::kSuccess) out_->failed_functions.emplace_back(function);
  }

  bool Fatal(const char* function, nvml::Return rc, const std::string& what = {}) {
    Count(function, rc);
    out_->error = std::string(function) + " failed" + what + ": " + library_.Describe(rc);
    return false;
  }

  void Warn(const char* function, nvml::Return rc, const std::string& uuid) {
    Count(function, rc);
    out_->warnings.push_back(std::string(function) + " failed for " + uuid + ": " + library_.Describe(rc));
  }

  bool ReadAll(RawRead& raw) {
    out_ = &raw.result;
    GpuInventory& inventory = raw.result.inventory;

    char driver[nvml::kSystemDriverVersionBufferSize] = {};
    nvml::Return rc = api_.nvmlSystemGetDriverVersion(driver, sizeof(driver));
    if (rc != nvml::kSuccess) return Fatal("nvmlSystemGetDriverVersion", rc);
    inventory.driver_version = driver;
    if (api_.nvmlSystemGetCudaDriverVersion_v2) {
      rc = api_.nvmlSystemGetCudaDriverVersion_v2(&inventory.cuda_driver_version);
      if (rc != nvml::kSuccess) inventory.cuda_driver_version = 0;
    }

    unsigned int count = 0;
    rc = api_.nvmlDeviceGetCount_v2(&count);
    if (rc != nvml::kSuccess) return Fatal("nvmlDeviceGetCount_v2", rc);

    // Far end of each active NVLink, per GPU, resolved to local UUIDs once all GPUs are known.
    std::vector<std::vector<RemoteLink>> remotes(count);
    std::vector<std::string> fabric_errors;
    for (unsigned int i = 0; i < count; ++i) {
      // A GPU released for its reset is not touched: it may be resetting right now.
      if (excluded_.count(i) != 0) continue;
      const std::string which = " for GPU " + std::to_string(i);
      nvml::Device device = nullptr;
      rc = api_.nvmlDeviceGetHandleByIndex_v2(i, &device);
      if (rc != nvml::kSuccess) return Fatal("nvmlDeviceGetHandleByIndex_v2", rc, which);

      GpuInfo gpu;
      gpu.index = i;
      char uuid[nvml::kDeviceUuidV2BufferSize] = {};
      rc = api_.nvmlDeviceGetUUID(device, uuid, sizeof(uuid));
      if (rc != nvml::kSuccess) return Fatal("nvmlDeviceGetUUID", rc, which);
      gpu.uuid = uuid;
      if (IsExcluded(gpu.uuid)) continue;  // released, found at another index

      nvml::PciInfo pci{};
      rc = api_.nvmlDeviceGetPciInfo_v3(device, &pci);
      if (rc != nvml::kSuccess) return Fatal("nvmlDeviceGetPciInfo_v3", rc, " for " + gpu.uuid);
      gpu.pci_bus_id = std::string(pci.busId, strnlen(pci.busId, sizeof(pci.busId)));
      // NVML always prints function 0 in busId; the numeric fields are the source of truth.
      gpu.pci = PciAddress{pci.domain, static_cast<uint8_t>(pci.bus), static_cast<uint8_t>(pci.device), 0, true};

      rc = api_.nvmlDeviceGetMinorNumber(device, &gpu.minor);
      if (rc != nvml::kSuccess) return Fatal("nvmlDeviceGetMinorNumber", rc, " for " + gpu.uuid);

      char name[nvml::kDeviceNameV2BufferSize] = {};
      rc = api_.nvmlDeviceGetName(device, name, sizeof(name));
      if (rc == nvml::kSuccess) {
        gpu.name = name;
      } else {
        Warn("nvmlDeviceGetName", rc, gpu.uuid);
      }

      nvml::Memory memory{};
      rc = api_.nvmlDeviceGetMemoryInfo(device, &memory);
      if (rc == nvml::kSuccess) {
        gpu.memory_total_bytes = memory.total;
      } else {
        Warn("nvmlDeviceGetMemoryInfo", rc, gpu.uuid);
      }

      if (api_.nvmlDeviceGetCudaComputeCapability) {
        rc = api_.nvmlDeviceGetCudaComputeCapability(device, &gpu.cc_major, &gpu.cc_minor);
        if (rc != nvml::kSuccess) {
          gpu.cc_major = gpu.cc_minor = 0;
          Warn("nvmlDeviceGetCudaComputeCapability", rc, gpu.uuid);
        }
      }

      if (api_.nvmlDeviceGetBrand) {
        unsigned int brand = 0;
        rc = api_.nvmlDeviceGetBrand(device, &brand);
        if (rc == nvml::kSuccess) {
          gpu.brand = brand;
        } else if (rc != nvml::kErrorNotSupported) {
          Warn("nvmlDeviceGetBrand", rc, gpu.uuid);
        }
      }

      gpu.numa_node = NumaNode(device, gpu);
      remotes[i] = NvLinkRemotes(device, gpu.uuid);
      if (auto fabric = Fabric(device, gpu.uuid, fabric_errors)) gpu.fabric = std::move(*fabric);
      GpuEventBasis& basis = raw.result.event_basis[gpu.uuid];
      if (!ReadMig(device, gpu, basis)) return false;
      // Not warned about: the event waiter, which registers by it, reports its failure.
      unsigned long long supported = 0;
      rc = api_.nvmlDeviceGetSupportedEventTypes(device, &supported);
      if (rc == nvml::kSuccess) {
        basis.supported_events = supported;
      } else {
        Count("nvmlDeviceGetSupportedEventTypes", rc);
      }

      inventory.gpus.push_back(std::move(gpu));
      raw.handles.push_back(device);
    }

    for (std::size_t i = 0; i < inventory.gpus.size(); ++i) {
      auto& peers = inventory.gpus[i].nvlink_peers;
      std::vector<RemoteLink> switch_links;
      for (const auto& remote : remotes[inventory.gpus[i].index]) {  // by NVML index: released GPUs are skipped
        // Remotes that are no local GPU (NVSwitches) are not peers.
        const GpuInfo* peer = inventory.FindByPci(remote.pci);
        if (peer == nullptr) switch_links.push_back(remote);
        if (peer == nullptr || peer->index == inventory.gpus[i].index) continue;
        if (std::find(peers.begin(), peers.end(), peer->uuid) == peers.end()) peers.push_back(peer->uuid);
      }
      if (switch_ports_ && !switch_links.empty()) SwitchPorts(raw.handles[i], switch_links, inventory.gpus[i]);
    }
    raw.result.clique = ComputeClique(inventory.gpus, fabric_errors);
    if (!fabric_error_.empty()) raw.result.clique.reason += " (first error: " + fabric_error_ + ")";
    return true;
  }

  // nvmlDeviceGetNumaNodeId (where the driver has it), then the NODE-scope memory affinity, then
  // the PCI device's numa_node in sysfs; -1 when none knows.
  int NumaNode(nvml::Device device, const GpuInfo& gpu) {
    if (api_.nvmlDeviceGetNumaNodeId != nullptr) {
      unsigned int node = 0;
      const nvml::Return rc = api_.nvmlDeviceGetNumaNodeId(device, &node);
      if (rc == nvml::kSuccess) return static_cast<int>(node);
      if (rc != nvml::kErrorNotSupported) Count("nvmlDeviceGetNumaNodeId", rc);
    }
    if (api_.nvmlDeviceGetMemoryAffinity != nullptr) {
      unsigned long node_set[kNodeSetWords] = {};
      const nvml::Return rc =
          api_.nvmlDeviceGetMemoryAffinity(device, kNodeSetWords, node_set, nvml::kAffinityScopeNode);
      if (rc == nvml::kSuccess) {
        // Exactly one node is an answer; several (or none) say the GPU is not local to one node.
        int total = 0;
        int node = -1;
        for (unsigned int w = 0; w < kNodeSetWords; ++w) {
          const int bits = std::popcount(node_set[w]);
          if (bits > 0 && node < 0) node = static_cast<int>(w * 64 + std::countr_zero(node_set[w]));
          total += bits;
        }
        if (total == 1) return node;
      } else if (rc != nvml::kErrorNotSupported) {
        Count("nvmlDeviceGetMemoryAffinity", rc);
      }
    }
    const auto path = std::filesystem::path(host_root_.empty() ? "/" : host_root_) / "sys/bus/pci/devices" /
                      gpu.pci.ToString() / "numa_node";
    std::ifstream in(path);
    int node = -1;
    if (in >> node && node >= 0) return node;
    return -1;
  }

  std::vector<RemoteLink> NvLinkRemotes(nvml::Device device, const std::string& uuid) {
    std::vector<RemoteLink> out;
    for (unsigned int link = 0; link < nvml::kNvLinkMaxLinks; ++link) {
      nvml::EnableState active = nvml::kFeatureDisabled;
      nvml::Return rc = api_.nvmlDeviceGetNvLinkState(device, link, &active);
      // NOT_SUPPORTED / INVALID_ARGUMENT: no NVLink at all, or a link this GPU does not have.
      if (rc == nvml::kErrorNotSupported || rc == nvml::kErrorInvalidArgument) continue;
      if (rc != nvml::kSuccess) {
        Warn("nvmlDeviceGetNvLinkState", rc, uuid);
        break;
      }
      if (active != nvml::kFeatureEnabled) continue;
      nvml::PciInfo remote{};
      rc = api_.nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, &remote);
      if (rc == nvml::kErrorNotSupported) continue;
      if (rc != nvml::kSuccess) {
        Warn("nvmlDeviceGetNvLinkRemotePciInfo_v2", rc, uuid);
        break;
      }
      out.push_back(RemoteLink{
          link, PciAddress{remote.domain, static_cast<uint8_t>(remote.bus), static_cast<uint8_t>(remote.device), 0, true}});
    }
    return out;
  }

  // The port at the far end of each NVLink into a device that is no GPU of ours (an NVSwitch):
  // NVML_FI_DEV_NVLINK_REMOTE_NVLINK_ID with the link as scopeId, all links in one call. A link
  // whose port NVML cannot name is left out (its SXids stay node-level findings).
  void SwitchPorts(nvml::Device device, const std::vector<RemoteLink>& links, GpuInfo& gpu) {
    if (api_.nvmlDeviceGetFieldValues == nullptr) return;
    std::vector<nvml::FieldValue> fields(links.size());
    for (std::size_t k = 0; k < links.size(); ++k) {
      fields[k].fieldId = nvml::kFieldDevNvLinkRemoteNvLinkId;
      fields[k].scopeId = links[k].link;
    }
    const nvml::Return rc = api_.nvmlDeviceGetFieldValues(device, static_cast<int>(fields.size()), fields.data());
    if (rc == nvml::kErrorNotSupported) return;
    if (rc != nvml::kSuccess) {
      Warn("nvmlDeviceGetFieldValues", rc, gpu.uuid + " (NVLink remote link ids)");
      return;
    }
    nvml::Return field_error = nvml::kSuccess;
    for (std::size_t k = 0; k < links.size(); ++k) {
      const std::optional<uint32_t> port =
          fields[k].nvmlReturn == nvml::kSuccess ? FieldValueAsUnsigned(fields[k]) : std::nullopt;
      if (!port) {
        if (fields[k].nvmlReturn != nvml::kErrorNotSupported && field_error == nvml::kSuccess) {
          field_error = fields[k].nvmlReturn == nvml::kSuccess ? nvml::kErrorUnknown : fields[k].nvmlReturn;
        }
        continue;
      }
      gpu.nvswitch_links.push_back(NvSwitchLink{links[k].link, links[k].pci, *port});
    }
    // One warning per GPU, not one per link.
    if (field_error != nvml::kSuccess) Warn("nvmlDeviceGetFieldValues", field_error, gpu.uuid + " (NVLink remote link ids)");
  }

  // QueryFabric (V API v3, v2, then v1). nullopt when the GPU has no fabric.
  std::optional<FabricInfo> Fabric(nvml::Device device, const std::string& uuid,
                                    std::vector<std::string>& fabric_errors) {
    const FabricQuery query = QueryFabric(api_, device);
    if (query.function == nullptr || query.rc == nvml::kErrorNotSupported) return std::nullopt;
    if (query.rc != nvml::kSuccess) {
      Warn(query.function, query.rc, uuid);
      fabric_errors.push_back(uuid);
      if (fabric_error_.empty()) fabric_error_ = std::string(query.function) + ": " + library_.Describe(query.rc);
      return std::nullopt;
    }
    const auto& info = query.info;
    return FabricInfo{FormatClusterUuid(info.clusterUuid, nvml::kGpuFabricUuidLen), info.cliqueId,
                      static_cast<uint32_t>(info.state), static_cast<uint32_t>(info.status)};
  }

  // MIG mode and, when enabled, every MIG device in slot order. A driver or GPU without MIG
  // answers NOT_SUPPORTED (or lacks the symbols): MIG disabled. A MIG device that cannot be read
  // fails the whole read (advertising a partial set would hand out the wrong capacity).
  // The mode (current and pending) goes into `basis` too.
  bool ReadMig(nvml::Device device, GpuInfo& gpu, GpuEventBasis& basis) {
    if (api_.nvmlDeviceGetMigMode == nullptr) return true;
    unsigned int current = nvml::kDeviceMigDisable, pending = nvml::kDeviceMigDisable;
    nvml::Return rc = api_.nvmlDeviceGetMigMode(device, &current, &pending);
    if (rc == nvml::kErrorNotSupported) return true;
    if (rc != nvml::kSuccess) {
      Warn("nvmlDeviceGetMigMode", rc, gpu.uuid);
      return true;
    }
    basis.mig_current = current;
    basis.mig_pending = pending;
    if (current != nvml::kDeviceMigEnable) return true;
    gpu.mig_enabled = true;
    if (api_.nvmlDeviceGetMaxMigDeviceCount == nullptr || api_.nvmlDeviceGetMigDeviceHandleByIndex == nullptr ||
        api_.nvmlDeviceGetGpuInstanceId == nullptr || api_.nvmlDeviceGetComputeInstanceId == nullptr ||
        api_.nvmlDeviceGetAttributes_v2 == nullptr) {
      out_->error = gpu.uuid + " has MIG enabled but the driver lacks the MIG device functions";
      return false;
    }
    unsigned int max = 0;
    rc = api_.nvmlDeviceGetMaxMigDeviceCount(device, &max);
    if (rc != nvml::kSuccess) return Fatal("nvmlDeviceGetMaxMigDeviceCount", rc, " for " + gpu.uuid);
    for (unsigned int slot = 0; slot < max; ++slot) {
      nvml::Device mig = nullptr;
      rc = api_.nvmlDeviceGetMigDeviceHandleByIndex(device, slot, &mig);
      if (rc == nvml::kErrorNotFound) continue;  // an empty slot
      const std::string which = " for MIG slot " + std::to_string(slot) + " of " + gpu.uuid;
      if (rc != nvml::kSuccess) return Fatal("nvmlDeviceGetMigDeviceHandleByIndex", rc, which);
      MigDeviceInfo info;
      info.index = slot;
      char uuid[nvml::kDeviceUuidV2BufferSize] = {};
      rc = api_.nvmlDeviceGetUUID(mig, uuid, sizeof(uuid));
      if (rc != nvml::kSuccess) return Fatal("nvmlDeviceGetUUID", rc, which);
      info.uuid = uuid;
      rc = api_.nvmlDeviceGetGpuInstanceId(mig, &info.gpu_instance);
      if (rc != nvml::kSuccess) return Fatal("nvmlDeviceGetGpuInstanceId", rc, which);
      rc = api_.nvmlDeviceGetComputeInstanceId(mig, &info.compute_instance);
      if (rc != nvml::kSuccess) return Fatal("nvmlDeviceGetComputeInstanceId", rc, which);
      nvml::DeviceAttributes attributes{};
      rc = api_.nvmlDeviceGetAttributes_v2(mig, &attributes);
      if (rc != nvml::kSuccess) return Fatal("nvmlDeviceGetAttributes_v2", rc, which);
      info.profile = MigProfileName(attributes.gpuInstanceSliceCount, attributes.computeInstanceSliceCount,
                                    attributes.memorySizeMB, gpu.memory_total_bytes);
      info.memory_bytes = attributes.memorySizeMB * 1024ULL * 1024ULL;
      info.multiprocessors = attributes.multiprocessorCount;
      info.gpu_instance_slices = attributes.gpuInstanceSliceCount;
      info.compute_instance_slices = attributes.computeInstanceSliceCount;
      info.copy_engines = attributes.sharedCopyEngineCount;
      info.decoders = attributes.sharedDecoderCount;
      info.encoders = attributes.sharedEncoderCount;
      info.jpeg_engines = attributes.sharedJpegCount;
      info.ofa_engines = attributes.sharedOfaCount;
      ReadPlacement(device, info);
      gpu.mig_devices.push_back(std::move(info));
    }
    return true;
  }

  // The GPU instance's profile id and placement (the DRA driver's MIG device names). Optional: a
  // driver without the functions, or one that answers an error, leaves placement_known false.
  void ReadPlacement(nvml::Device parent, MigDeviceInfo& info) {
    if (api_.nvmlDeviceGetGpuInstanceById == nullptr || api_.nvmlGpuInstanceGetInfo == nullptr) return;
    nvml::GpuInstance instance = nullptr;
    if (api_.nvmlDeviceGetGpuInstanceById(parent, info.gpu_instance, &instance) != nvml::kSuccess) return;
    nvml::GpuInstanceInfo gi{};
    if (api_.nvmlGpuInstanceGetInfo(instance, &gi) != nvml::kSuccess) return;
    info.placement_known = true;
    info.gi_profile_id = gi.profileId;
    info.placement_start = gi.placement.start;
    info.placement_size = gi.placement.size;
  }

  bool IsExcluded(const std::string& uuid) const {
    for (const auto& [index, excluded] : excluded_)
      if (excluded == uuid) return true;
    return false;
  }

  const NvmlLibrary& library_;
  const nvml::Api& api_;
  const std::string& host_root_;
  const ExcludedGpus& excluded_;
  const bool switch_ports_;
  ReadResult* out_ = nullptr;
  std::string fabric_error_;  // the first fabric read error, for the clique's reason
};

void Append(std::vector<std::string>& to, const std::vector<std::string>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

}  // namespace

ReadResult ReadInventory(const NvmlLibrary& library, const std::string& host_root, const ExcludedGpus& excluded,
                         bool switch_ports) {
  return Reader(library, host_root, excluded, switch_ports).Run().result;
}

ReadResult NvmlSession::Read() const {
  ReadResult read = ReadInventory(*library_, options_.host_root, options_.excluded, /*switch_ports=*/false);
  // The NVSwitch ports as read when the session opened: the wiring does not change with the
  // driver loaded, and a link that went down since must keep naming its GPU.
  for (GpuInfo& gpu : read.inventory.gpus) {
    if (const auto it = switch_links_.find(gpu.uuid); it != switch_links_.end()) gpu.nvswitch_links = it->second;
  }
  return read;
}

NvmlSession::Opened NvmlSession::Open(const SessionOptions& options) {
  Opened out;
  std::string error;
  auto library = NvmlLibrary::Open(options.library, error);
  if (!library) {
    out.read.error = std::move(error);
    return out;
  }
  const auto& api = library->Api();
  nvml::Return rc = api.nvmlInit_v2();
  if (rc != nvml::kSuccess) {
    out.read.failed_functions.emplace_back("nvmlInit_v2");
    out.read.error = "nvmlInit_v2 failed (" + options.library + "): " + library->Describe(rc);
    return out;
  }
  std::shared_ptr<NvmlSession> session(new NvmlSession(library, options));
  session->initialized_ = true;

  RawRead raw = Reader(*library, options.host_root, options.excluded, /*switch_ports=*/true).Run();
  out.read = std::move(raw.result);
  for (const GpuInfo& gpu : out.read.inventory.gpus) {
    if (!gpu.nvswitch_links.empty()) session->switch_links_[gpu.uuid] = gpu.nvswitch_links;
  }
  if (!out.read.ok) {
    const auto closed = session->Close();
    Append(out.read.failed_functions, closed.failed_functions);
    Append(out.read.warnings, closed.warnings);
    return out;
  }
  out.session = std::move(session);
  return out;
}

NvmlSession::~NvmlSession() { Close(); }

NvmlSession::Closed NvmlSession::Close() {
  Closed closed;
  if (!std::exchange(initialized_, false)) return closed;
  const nvml::Return rc = library_->Api().nvmlShutdown();
  if (rc != nvml::kSuccess) {
    closed.failed_functions.emplace_back("nvmlShutdown");
    closed.warnings.push_back("nvmlShutdown failed: " + library_->Describe(rc));
  }
  return closed;
}

}  // namespace gns::gpu_inventory
