// The health verdict of each GPU as gpu-health decided it: Healthy or Unhealthy, why, with
// which XID and recommended action, since when. The one place the verdict lives; everything
// else (the device plugin, the Node condition, the state file) follows what changes here.
//
// MIG: a report that names a GPU instance gets a verdict of its own, beside the GPU's (keyed by
// DeviceHealth::RetainKey, "<uuid>/gi<N>"); the device plugin marks that MIG device alone. What
// heals a GPU (a reset, a new boot, set-healthy) heals its GPU instances with it: a reset takes
// the whole GPU.
//
// Pure state, no I/O, no clock: each call takes the time and returns the verdict when it
// changed, and the module publishes, persists and reports that change. Loop thread only.
#pragma once

#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_health/xid_catalog.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gpu_health {

class VerdictBook {
 public:
  // The verdict after the change, or nullptr when it was already so (Unhealthy for the same
  // XID and action) or when the device is Unhealthy with an action that ranks above `action`
  // (ActionRank): the recommended action only escalates until MarkHealthy. The pointer stays
  // valid until the next call that changes the book.
  // `gpu_instance`: kWholeGpu, or the GPU instance the report named. `sxid`: the NVSwitch SXid
  // behind a verdict no XID holds (xid 0), kept on the verdict as its cause.
  const DeviceHealth* MarkUnhealthy(const std::string& uuid, const std::string& pci, const std::string& reason,
                                    uint32_t xid, RecommendedAction action, int64_t now_unix_ms,
                                    uint32_t gpu_instance = kWholeGpu, uint32_t sxid = 0);
  // The GPU and every GPU instance of it that were Unhealthy, now Healthy (GPU first); empty
  // when none was.
  std::vector<DeviceHealth> MarkHealthy(const std::string& uuid, const std::string& reason, int64_t now_unix_ms);
  // An Unhealthy verdict restored from the state file of this boot. False (nothing changed)
  // when this run already decided about the GPU (or GPU instance): its verdict is newer.
  // `held_by`: what holds it (HeldBy as saved); absent in older files: the verdict's XID.
  bool Restore(const DeviceHealth& saved, const std::vector<uint32_t>* held_by = nullptr);
  // A clearing XID (the catalog's `clears`) saw `xid` resolved on the GPU (every GPU instance
  // too when `gpu_instance` is kWholeGpu, else that GPU instance): `xid` no longer holds those
  // verdicts, and each that nothing else holds turns Healthy. The verdicts that did (GPU first).
  std::vector<DeviceHealth> Clear(const std::string& uuid, uint32_t gpu_instance, uint32_t xid,
                                  const std::string& reason, int64_t now_unix_ms);
  // What holds an Unhealthy verdict: every XID that made it (or would have made it) Unhealthy
  // since it was last Healthy, 0 for a hold that is no XID (a reset in progress or failed).
  // Sorted; empty for a Healthy or unknown key.
  [[nodiscard]] const std::vector<uint32_t>& HeldBy(std::string_view retain_key) const;

  [[nodiscard]] const DeviceHealth* Find(std::string_view uuid, uint32_t gpu_instance = kWholeGpu) const;
  [[nodiscard]] bool IsUnhealthy(std::string_view uuid, uint32_t gpu_instance = kWholeGpu) const;
  // Every verdict of this run or restored, in key order (a GPU, then its GPU instances).
  [[nodiscard]] std::vector<DeviceHealth> All() const;
  // The GPUs with an Unhealthy verdict, whole or for one of their GPU instances; each once.
  [[nodiscard]] std::vector<std::string> UnhealthyUuids() const;
  // Unhealthy verdicts, GPU instances included.
  [[nodiscard]] std::size_t UnhealthyCount() const;
  [[nodiscard]] std::size_t size() const { return devices_.size(); }
  // A verdict's recommended action (UNKNOWN for a name this build does not know).
  [[nodiscard]] static RecommendedAction ActionOf(const DeviceHealth& health);

 private:
  std::map<std::string, DeviceHealth, std::less<>> devices_;  // by DeviceHealth::RetainKey
  // What holds each Unhealthy verdict (HeldBy), by the same key; at most kMaxHolders each
  // (distinct XIDs: a few per GPU).
  static constexpr std::size_t kMaxHolders = 64;
  std::map<std::string, std::vector<uint32_t>, std::less<>> held_by_;
};

}  // namespace gns::gpu_health
