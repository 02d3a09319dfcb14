// Per-claim CDI specs for the IMEX channel.
#include "modules/dra_compute_domain/cdi_spec.hpp"

#include <algorithm>

namespace gns::dra {

const ClaimSpecNames& ChannelSpecNames() {
  static const ClaimSpecNames kNames{std::string(kCdiVendor), std::string(kCdiClass)};
  return kNames;
}

std::string CdiSpecFileName(std::string_view claim_uid) { return ChannelSpecNames().FileName(claim_uid); }

std::string CdiDeviceName(std::string_view claim_uid) {
  return std::string(claim_uid) + "-" + std::string(kChannelDeviceName);
}

std::string CdiQualifiedDeviceId(std::string_view claim_uid) {
  return ChannelSpecNames().QualifiedDeviceId(CdiDeviceName(claim_uid));
}

nlohmann::json BuildChannelCdiSpec(std::string_view claim_uid, uint32_t channel_major, uint32_t channel_count) {
  const std::string device_name = CdiDeviceName(claim_uid);
  nlohmann::json nodes = nlohmann::json::array();
  for (uint32_t minor = kChannelMinor; minor < kChannelMinor + std::max<uint32_t>(channel_count, 1); ++minor) {
    nodes.push_back({{"path", minor == kChannelMinor ? std::string(kChannelPath)
                                                     : std::string(kChannelDir) + "/channel" + std::to_string(minor)},
                     {"type", "c"},
                     {"major", channel_major},
                     {"minor", minor},
                     {"fileMode", kChannelFileMode}});
  }
  nlohmann::json device{{"name", device_name}, {"containerEdits", {{"deviceNodes", std::move(nodes)}}}};
  return nlohmann::json{{"cdiVersion", MinimumCdiVersion(device_name)},
                        {"kind", kCdiKind},
                        {"devices", nlohmann::json::array({std::move(device)})}};
}

std::string ChannelCdiSpecContent(std::string_view claim_uid, uint32_t channel_major, uint32_t channel_count) {
  return BuildChannelCdiSpec(claim_uid, channel_major, channel_count).dump(2) + "\n";
}

bool CdiSpecIsCurrent(const std::string& cdi_dir, std::string_view claim_uid, uint32_t channel_major,
                      uint32_t channel_count) {
  if (!IsValidClaimUid(claim_uid)) return false;
  return ClaimSpecIsCurrent(cdi_dir, ChannelSpecNames(), claim_uid,
                            ChannelCdiSpecContent(claim_uid, channel_major, channel_count));
}

FileWriteResult WriteChannelCdiSpec(const std::string& cdi_dir, std::string_view claim_uid, uint32_t channel_major,
                                    uint32_t channel_count, SpecDurability durability) {
  if (!IsValidClaimUid(claim_uid)) {
    return FileWriteResult{false, "invalid claim UID for a CDI spec name: \"" + std::string(claim_uid) + "\""};
  }
  return WriteClaimSpec(cdi_dir, ChannelSpecNames(), claim_uid,
                        ChannelCdiSpecContent(claim_uid, channel_major, channel_count), durability);
}

FileWriteResult DeleteCdiSpec(const std::string& cdi_dir, std::string_view claim_uid) {
  return DeleteClaimSpec(cdi_dir, ChannelSpecNames(), claim_uid);
}

std::optional<std::string_view> ClaimUidOfCdiSpecFile(std::string_view name) {
  return ChannelSpecNames().ClaimUidOf(name);
}

TempSweep RemoveInterruptedCdiSpecWrites(const std::string& cdi_dir) {
  return RemoveInterruptedClaimSpecWrites(cdi_dir, ChannelSpecNames());
}

CdiListing ListCdiSpecClaimUids(const std::string& cdi_dir) { return ListClaimSpecs(cdi_dir, ChannelSpecNames()); }

}  // namespace gns::dra
