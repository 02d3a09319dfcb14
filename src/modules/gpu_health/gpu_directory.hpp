// Which GPU a kernel line is about, for the gpu-health module: PCI address → UUID from the
// inventory's GPUs first, then from what the kernel log taught ("NVRM: GPU at PCI:… GPU-<uuid>",
// at most kMaxLearned addresses). Addresses are compared numerically (PciAddress::DeviceKey),
// never as text. Every Xid line goes through UuidForPci/SubjectFor, so those neither allocate
// nor format; the benchmark of the module's per-line path (journal_health_bench) calls them too.
// One owner (the module's loop), not thread-safe.
#pragma once

#include "modules/gpu_health/kernel_line_parser.hpp"
#include "modules/gpu_inventory/messages.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gns::gpu_health {

// Who one XID occurrence is about: the GPU's UUID when it is known, and its PCI address when
// the report carried one. policy_id() is the name XidPolicy keys the GPU by: the UUID, or
// "PCI:dddd:bb:dd" until the UUID is known. Holds a view of the UUID: keep it no longer than
// the string it was made from (the directory's entry, or the caller's). Formats nothing when
// the UUID is known (the common case).
class XidSubject {
 public:
  XidSubject(std::string_view uuid, const std::optional<PciAddress>& pci);

  [[nodiscard]] std::string_view uuid() const noexcept { return uuid_; }
  [[nodiscard]] const std::optional<PciAddress>& address() const noexcept { return address_; }
  // "dddd:bb:dd", empty when the report had no PCI address.
  [[nodiscard]] std::string pci() const { return address_ ? address_->DeviceString() : std::string(); }
  [[nodiscard]] std::string_view policy_id() const noexcept;

 private:
  std::string_view uuid_;
  std::optional<PciAddress> address_;
  std::string pci_id_;  // "PCI:dddd:bb:dd" while the UUID is unknown (short: no allocation)
};

// "PCI:dddd:bb:dd": what XidPolicy keys a GPU by while its UUID is unknown.
[[nodiscard]] std::string PciPolicyId(std::string_view pci_text);

class GpuDirectory {
 public:
  static constexpr std::size_t kMaxLearned = 256;

  // Replaces the inventory's GPUs (the first one listed at an address wins).
  void SetInventory(const std::vector<gpu_inventory::GpuInfo>& gpus);

  // The UUID of the GPU at `pci`, empty when unknown. The view stays valid until the next
  // SetInventory or Learn.
  [[nodiscard]] std::string_view UuidForPci(const PciAddress& pci) const noexcept;
  // UuidForPci(pci) and the address, as HandleXid wants them.
  [[nodiscard]] XidSubject SubjectFor(const PciAddress& pci) const { return XidSubject(UuidForPci(pci), pci); }
  // "dddd:bb:dd" of the GPU with this UUID (inventory first, then learned), empty when unknown.
  [[nodiscard]] std::string PciForUuid(std::string_view uuid) const;

  enum class LearnResult {
    kKnown,    // the address already maps to this UUID
    kLearned,  // new or changed
    kFull,     // kMaxLearned other addresses are known: ignored
  };
  LearnResult Learn(const PciAddress& pci, std::string_view uuid);
  // What the kernel log taught, by address: ("dddd:bb:dd", UUID).
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> Learned() const;

 private:
  struct Known {
    std::string uuid;
    std::string pci;  // "dddd:bb:dd"
  };
  std::vector<std::pair<uint64_t, Known>> inventory_;  // in inventory order
  std::map<uint64_t, Known> learned_;                  // by PciAddress::DeviceKey
};

}  // namespace gns::gpu_health
