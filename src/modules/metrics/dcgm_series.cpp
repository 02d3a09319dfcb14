// dcgm-exporter compatible GPU series (see dcgm_series.hpp).
#include "modules/metrics/dcgm_series.hpp"

#include "loop/metrics_registry.hpp"
#include "modules/dra_gpu/messages.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <tuple>

namespace gns::metrics {

namespace inv = gns::gpu_inventory;
namespace pr = gns::pod_resources;

namespace {

// A device-plugin ID names `uuid` itself or one of its replicas ("<uuid>::<n>").
bool NamesDevice(std::string_view id, std::string_view uuid) {
  if (!id.starts_with(uuid)) return false;
  return id.size() == uuid.size() || id.substr(uuid.size()).starts_with("::");
}

using Reading = std::optional<double>;
template <typename T>
Reading Of(const std::optional<T>& value) {
  if (!value) return std::nullopt;
  return static_cast<double>(*value);
}

constexpr double kMiB = 1024.0 * 1024.0;

Reading MiB(const std::optional<uint64_t>& bytes) {
  if (!bytes) return std::nullopt;
  return std::floor(static_cast<double>(*bytes) / kMiB);
}

// Sum of one NVLink counter over the GPU's links; nothing when no link reports it.
Reading NvLinkSum(const inv::GpuHealthReading& gpu, std::optional<uint64_t> inv::NvLinkReading::*counter) {
  std::optional<double> sum;
  for (const auto& link : gpu.nvlinks) {
    if (link.*counter) sum = sum.value_or(0.0) + static_cast<double>(*(link.*counter));
  }
  return sum;
}

struct DeviceView {
  const inv::GpuHealthReading* gpu = nullptr;
  const inv::MigUsageReading* mig = nullptr;  // null: the whole GPU
  uint64_t last_xid = 0;
};

struct Family {
  std::string_view name;
  bool counter;
  std::string_view help;
  std::function<Reading(const DeviceView&)> read;
};

// dcgm-exporter's default counters (etc/default-counters.csv), in its order, and the ECC and
// NVLink error counters it ships commented out; help texts as it writes them.
const std::vector<Family>& Families() {
  static const std::vector<Family> kFamilies = {
      {"DCGM_FI_DEV_SM_CLOCK", false, "SM clock frequency (in MHz).",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->usage.sm_clock_mhz); }},
      {"DCGM_FI_DEV_MEM_CLOCK", false, "Memory clock frequency (in MHz).",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->usage.mem_clock_mhz); }},
      {"DCGM_FI_DEV_MEMORY_TEMP", false, "Memory temperature (in C).",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->thermal.memory_temperature_c); }},
      {"DCGM_FI_DEV_GPU_TEMP", false, "GPU temperature (in C).",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->thermal.gpu_temperature_c); }},
      {"DCGM_FI_DEV_POWER_USAGE", false, "Power draw (in W).",
       [](const DeviceView& d) -> Reading {
         if (d.mig || !d.gpu->usage.power_mw) return std::nullopt;
         return static_cast<double>(*d.gpu->usage.power_mw) / 1000.0;
       }},
      {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", true, "Total energy consumption since boot (in mJ).",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->usage.energy_mj); }},
      {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", true, "Total number of PCIe retries.",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->pcie.replay_counter); }},
      {"DCGM_FI_DEV_GPU_UTIL", false, "GPU utilization (in %).",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->usage.gpu_util_percent); }},
      {"DCGM_FI_DEV_MEM_COPY_UTIL", false, "Memory utilization (in %).",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->usage.memory_util_percent); }},
      {"DCGM_FI_DEV_ENC_UTIL", false, "Encoder utilization (in %).",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->usage.encoder_util_percent); }},
      {"DCGM_FI_DEV_DEC_UTIL", false, "Decoder utilization (in %).",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->usage.decoder_util_percent); }},
      {"DCGM_FI_DEV_XID_ERRORS", false, "Value of the last XID error encountered.",
       [](const DeviceView& d) -> Reading {
         if (d.mig) return std::nullopt;
         return static_cast<double>(d.last_xid);
       }},
      {"DCGM_FI_DEV_FB_FREE", false, "Framebuffer memory free (in MiB).",
       [](const DeviceView& d) { return MiB(d.mig ? d.mig->fb_free_bytes : d.gpu->usage.fb_free_bytes); }},
      {"DCGM_FI_DEV_FB_USED", false, "Framebuffer memory used (in MiB).",
       [](const DeviceView& d) { return MiB(d.mig ? d.mig->fb_used_bytes : d.gpu->usage.fb_used_bytes); }},
      {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", true, "Number of remapped rows for uncorrectable errors",
       [](const DeviceView& d) -> Reading {
         if (d.mig || !d.gpu->remapped_rows) return std::nullopt;
         return static_cast<double>(d.gpu->remapped_rows->uncorrected);
       }},
      {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", true, "Number of remapped rows for correctable errors",
       [](const DeviceView& d) -> Reading {
         if (d.mig || !d.gpu->remapped_rows) return std::nullopt;
         return static_cast<double>(d.gpu->remapped_rows->corrected);
       }},
      {"DCGM_FI_DEV_ROW_REMAP_FAILURE", false, "Whether remapping of rows has failed",
       [](const DeviceView& d) -> Reading {
         if (d.mig || !d.gpu->remapped_rows) return std::nullopt;
         return d.gpu->remapped_rows->failed ? 1.0 : 0.0;
       }},
      {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", true, "Total number of single-bit volatile ECC errors.",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->ecc.corrected_volatile); }},
      {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", true, "Total number of double-bit volatile ECC errors.",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->ecc.uncorrected_volatile); }},
      {"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", true, "Total number of single-bit persistent ECC errors.",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->ecc.corrected_aggregate); }},
      {"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", true, "Total number of double-bit persistent ECC errors.",
       [](const DeviceView& d) { return d.mig ? std::nullopt : Of(d.gpu->ecc.uncorrected_aggregate); }},
      {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", true, "Total number of NVLink flow-control CRC errors.",
       [](const DeviceView& d) { return d.mig ? std::nullopt : NvLinkSum(*d.gpu, &inv::NvLinkReading::crc_flit); }},
      {"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", true, "Total number of NVLink data CRC errors.",
       [](const DeviceView& d) { return d.mig ? std::nullopt : NvLinkSum(*d.gpu, &inv::NvLinkReading::crc_data); }},
      {"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", true, "Total number of NVLink retries.",
       [](const DeviceView& d) { return d.mig ? std::nullopt : NvLinkSum(*d.gpu, &inv::NvLinkReading::replay); }},
      {"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", true, "Total number of NVLink recovery errors.",
       [](const DeviceView& d) { return d.mig ? std::nullopt : NvLinkSum(*d.gpu, &inv::NvLinkReading::recovery); }},
      // dcgm-exporter's default counter, filled from NVML's throughput fields: data sent plus
      // received over all links, in KiB. Both or nothing, so the sum never jumps when one of them
      // comes or goes. Whether DCGM's unit is the same is still to check (README).
      {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", true, "Total number of NVLink bandwidth counters for all lanes.",
       [](const DeviceView& d) -> Reading {
         const auto& u = d.gpu->usage;
         if (d.mig || !u.nvlink_data_tx_kib || !u.nvlink_data_rx_kib) return std::nullopt;
         return static_cast<double>(*u.nvlink_data_tx_kib) + static_cast<double>(*u.nvlink_data_rx_kib);
       }},
  };
  return kFamilies;
}

void AppendLabel(std::string& out, std::string_view name, std::string_view value) {
  if (out.back() != '{') out += ',';
  out += name;
  out += "=\"";
  out += EscapeLabelValue(value);
  out += '"';
}

void AppendNumber(std::string& out, double value) {
  char buf[32];
  std::to_chars_result r{};
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    r = std::to_chars(buf, buf + sizeof buf, static_cast<long long>(value));
  } else {
    r = std::to_chars(buf, buf + sizeof buf, value);
  }
  out.append(buf, r.ptr);
}

// The label sets of one device: its own labels, then one set per holder (or one without).
std::vector<std::string> LabelSets(const std::string& base, const std::vector<DcgmHolder>& holders,
                                   const std::string& hostname) {
  std::vector<std::string> sets;
  auto start = [&] {
    std::string s = "{" + base;
    AppendLabel(s, "Hostname", hostname);
    return s;
  };
  if (holders.empty()) {
    sets.push_back(start() + "}");
    return sets;
  }
  for (const DcgmHolder& h : holders) {
    std::string s = start();
    AppendLabel(s, "container", h.container);
    AppendLabel(s, "namespace", h.namespace_name);
    AppendLabel(s, "pod", h.pod);
    if (!h.dra_claim_name.empty()) {
      AppendLabel(s, "dra_claim_name", h.dra_claim_name);
      AppendLabel(s, "dra_claim_namespace", h.dra_claim_namespace);
      AppendLabel(s, "dra_driver_name", h.dra_driver_name);
      AppendLabel(s, "dra_pool_name", h.dra_pool_name);
      AppendLabel(s, "dra_device_name", h.dra_device_name);
    }
    sets.push_back(s + "}");
  }
  return sets;
}

}  // namespace

std::vector<DcgmHolder> HoldersOf(const pr::GpuPodMap& pods, std::string_view uuid, const std::string& dra_name) {
  std::vector<DcgmHolder> out;
  if (!pods.listed || uuid.empty()) return out;
  for (const auto& [id, refs] : pods.gpus) {
    if (!NamesDevice(id, uuid)) continue;
    for (const pr::PodContainerRef& ref : refs) {
      DcgmHolder h;
      h.pod = ref.name;
      h.namespace_name = ref.namespace_name;
      h.container = ref.container;
      out.push_back(std::move(h));
    }
  }
  for (const pr::PodClaimRef& claim : pods.claims) {
    for (const std::string& device : claim.devices) {
      const auto slash = device.find('/');
      const std::string pool = slash == std::string::npos ? std::string() : device.substr(0, slash);
      const std::string name = slash == std::string::npos ? device : device.substr(slash + 1);
      const bool ours = name == uuid || (!dra_name.empty() && claim.driver == kGpuDraDriver && name == dra_name);
      if (!ours) continue;
      DcgmHolder h;
      h.pod = claim.name;
      h.namespace_name = claim.namespace_name;
      h.container = claim.container;
      const auto cut = claim.claim.find('/');
      h.dra_claim_namespace = cut == std::string::npos ? claim.namespace_name : claim.claim.substr(0, cut);
      h.dra_claim_name = cut == std::string::npos ? claim.claim : claim.claim.substr(cut + 1);
      h.dra_driver_name = claim.driver;
      h.dra_pool_name = pool;
      h.dra_device_name = name;
      out.push_back(std::move(h));
    }
  }
  auto key = [](const DcgmHolder& h) {
    return std::tie(h.namespace_name, h.pod, h.container, h.dra_claim_namespace, h.dra_claim_name, h.dra_pool_name,
                    h.dra_device_name, h.dra_driver_name);
  };
  std::sort(out.begin(), out.end(), [&](const DcgmHolder& a, const DcgmHolder& b) { return key(a) < key(b); });
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string RenderDcgmFamilies(const DcgmInputs& in) {
  std::string out;
  if (in.sample == nullptr || !in.sample->ok || in.sample->gpus.empty()) return out;
  static const pr::GpuPodMap kNoPods;
  const pr::GpuPodMap& pods = in.pods != nullptr ? *in.pods : kNoPods;

  // Each device once, with its label sets.
  struct Device {
    DeviceView view;
    std::vector<std::string> label_sets;
  };
  std::vector<Device> devices;
  for (const inv::GpuHealthReading& gpu : in.sample->gpus) {
    if (gpu.lost || gpu.uuid.empty()) continue;  // a lost GPU reads nothing: no stale series
    const inv::GpuInfo* info = nullptr;
    if (in.inventory != nullptr) {
      for (const auto& candidate : in.inventory->gpus) {
        if (candidate.uuid == gpu.uuid) info = &candidate;
      }
    }
    std::string base = "{";
    AppendLabel(base, "gpu", std::to_string(gpu.index));
    AppendLabel(base, "UUID", gpu.uuid);
    AppendLabel(base, "pci_bus_id", gpu.pci_bus_id);
    AppendLabel(base, "device", info != nullptr ? "nvidia" + std::to_string(info->minor) : std::string());
    AppendLabel(base, "modelName", info != nullptr ? info->name : std::string());
    base.erase(0, 1);
    uint64_t xid = 0;
    if (in.last_xid != nullptr) {
      const auto it = in.last_xid->find(gpu.uuid);
      if (it != in.last_xid->end()) xid = it->second;
    }
    // dra-gpu names a GPU by its device node ("gpu-<minor>") and a MIG device by its parent's
    // minor and placement: known from the inventory.
    const std::string gpu_dra_name = info != nullptr ? dra_gpu::GpuDeviceName(info->minor) : std::string();
    devices.push_back(
        Device{DeviceView{&gpu, nullptr, xid}, LabelSets(base, HoldersOf(pods, gpu.uuid, gpu_dra_name), in.hostname)});
    for (const inv::MigUsageReading& mig : gpu.mig_devices) {
      std::string profile;
      std::string mig_dra_name;
      if (info != nullptr) {
        for (const auto& m : info->mig_devices) {
          if (m.uuid != mig.uuid) continue;
          profile = m.profile;
          if (m.placement_known) mig_dra_name = dra_gpu::MigDeviceName(info->minor, m);
        }
      }
      std::string mig_base = "{" + base;
      AppendLabel(mig_base, "GPU_I_PROFILE", profile);
      AppendLabel(mig_base, "GPU_I_ID", std::to_string(mig.gpu_instance));
      mig_base.erase(0, 1);
      devices.push_back(
          Device{DeviceView{&gpu, &mig, xid}, LabelSets(mig_base, HoldersOf(pods, mig.uuid, mig_dra_name), in.hostname)});
    }
  }

  out.reserve(devices.size() * Families().size() * 256);
  for (const Family& family : Families()) {
    bool header = false;
    for (const Device& device : devices) {
      const Reading value = family.read(device.view);
      if (!value) continue;
      if (!header) {
        out += "# HELP ";
        out += family.name;
        out += ' ';
        out += family.help;
        out += "\n# TYPE ";
        out += family.name;
        out += family.counter ? " counter\n" : " gauge\n";
        header = true;
      }
      for (const std::string& labels : device.label_sets) {
        out += family.name;
        out += labels;
        out += ' ';
        AppendNumber(out, *value);
        out += '\n';
      }
    }
  }
  return out;
}

std::size_t CountSeries(std::string_view text) {
  std::size_t n = 0;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    if (!text.starts_with('#')) ++n;
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return n;
}

}  // namespace gns::metrics
