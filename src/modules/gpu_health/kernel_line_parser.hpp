// Classifies one kernel log message (journald MESSAGE) for the gpu-health module: NVRM Xid
// reports, NVSwitch SXid reports, the "GPU at PCI:… GPU-<uuid>" line that teaches PCI → UUID,
// "fallen off the bus" reports and the GPU reset acknowledgement written by the reset job.
//
// The parser is pure and framework-free (no Asio, no logging) so the fuzz target can compile
// it alone. It never throws on input and never allocates except for the strings it returns,
// whose sizes are capped (kMax*Bytes), so a hostile or corrupted message cannot make it grow.
// An Xid line's free text (process name, detail) comes back as views into the message and is
// sanitised only when asked for (XidLine::detail() …): the module reads it only for the few
// occurrences it reports, and Xid floods arrive by the thousand. A ParsedLine must therefore
// not outlive the message it was parsed from.
#pragma once

#include "loop/pci_address.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace gns::gpu_health {

// Caps on what a parsed line may carry. Longer text is cut at a UTF-8 boundary and flagged.
inline constexpr std::size_t kMaxDetailBytes = 1024;
inline constexpr std::size_t kMaxProcessNameBytes = 256;
// "GPU-" + 36 characters is what drivers print today; leave room for longer forms.
inline constexpr std::size_t kMaxUuidBytes = 64;

// PCI addresses (src/loop/pci_address.hpp): Xid lines print domain:bus:device without the
// function ("0000:3b:00", PciAddress::DeviceString()); compare GPUs with SameDevice()/DeviceKey().
using gns::ParsePciAddress;
using gns::PciAddress;

enum class LineKind : uint8_t {
  kUnrelated,     // not one of ours: the common case
  kXid,           // NVRM: Xid (PCI:…): N, …
  kGpuUuid,       // NVRM: GPU at PCI:…: GPU-<uuid>
  kFallenOffBus,  // NVRM: GPU … has fallen off the bus / … fallen off the bus and is not responding
  kResetAck,      // GPU reset executed|occurred|started: GPU-<uuid>[, success: true|false]
  kMalformed,     // began like one of the above but did not parse
  kSxid,          // nvidia-nvswitchN: SXid (PCI:…): N, Fatal|Non-fatal|Correctable[, Link L] …
};

[[nodiscard]] std::string_view LineKindName(LineKind kind) noexcept;

// `text` as printable, valid UTF-8 of at most `cap` bytes, cut at a character boundary:
// invalid bytes and control characters become '?', tabs become spaces. *truncated (when given)
// says whether it was cut. What XidLine's text accessors return.
[[nodiscard]] std::string SanitizedText(std::string_view text, std::size_t cap, bool* truncated = nullptr);

struct XidLine {
  PciAddress pci;
  uint32_t xid = 0;
  // Absent when the driver printed pid='<unknown>' or an old format without pid=.
  std::optional<uint32_t> pid;
  // MIG attribution ("GPU-I:nn", "GPU-CI:nn") when the driver printed it.
  std::optional<uint32_t> gpu_instance;
  std::optional<uint32_t> compute_instance;
  // The process name as the message has it: absent when the driver printed name=<unknown> or
  // an old format without name=; cut at the first ", " (the driver does not escape it). A
  // view into the message, raw bytes: valid only while the message is.
  std::optional<std::string_view> raw_process_name;
  // The free text after the fixed fields, up to the end of the line, blanks around it trimmed:
  // a view into the message, raw bytes, like raw_process_name.
  std::string_view raw_detail;

  // The process name sanitised (SanitizedText), at most kMaxProcessNameBytes.
  [[nodiscard]] std::optional<std::string> process_name() const;
  // The detail sanitised (SanitizedText), at most kMaxDetailBytes.
  [[nodiscard]] std::string detail() const;
  // True when detail() had to be cut.
  [[nodiscard]] bool detail_truncated() const;
};

struct GpuUuidLine {
  PciAddress pci;
  std::string uuid;  // "GPU-…"
};

struct FallenOffBusLine {
  // Absent when only the continuation line "NVRM: fallen off the bus and is not responding
  // to commands." arrived (a syslog forwarder split the message).
  std::optional<PciAddress> pci;
};

struct ResetAckLine {
  std::string uuid;  // "GPU-…"
  // The reset job's newer form says ", success: true|false"; the older forms say nothing.
  std::optional<bool> success;
  // "GPU reset started: GPU-…" (ours): the GPU is under maintenance until the outcome line.
  bool started = false;
};

// An NVSwitch error report. The driver prints each SXid as a group of lines with the same
// number: "…, Non-fatal, Link 44 <what>" (this one), "…, Severity 0 Engine instance 44 …" and
// "…, Data {0x…, …}" (companions, kUnrelated: they add nothing the judge uses). An error of the
// switch itself names no link: "…, Fatal, Unexpected PRI error".
struct SxidLine {
  std::optional<uint32_t> nvswitch;  // N of "nvidia-nvswitchN:", when the prefix is there
  PciAddress pci;                    // the NVSwitch's PCI function
  uint32_t sxid = 0;
  bool fatal = false;                // the driver's own "Fatal" (false: "Non-fatal", "Correctable")
  std::optional<uint32_t> link;      // the NVSwitch port ("Link L"), when the report names one
  // The text after the severity and "Link L", blanks trimmed: a view into the message, raw bytes.
  std::string_view raw_detail;

  // The detail sanitised (SanitizedText), at most kMaxDetailBytes.
  [[nodiscard]] std::string detail() const;
};

struct MalformedLine {
  LineKind attempted = LineKind::kXid;  // what the line started like
  std::size_t offset = 0;               // byte offset in the message where parsing stopped
  std::string_view expected;            // static text: what should have been there
  // "Xid line, byte 23: expected ':' after the PCI domain"
  [[nodiscard]] std::string Reason() const;
};

struct ParsedLine {
  std::variant<std::monostate, XidLine, GpuUuidLine, FallenOffBusLine, ResetAckLine, MalformedLine, SxidLine>
      payload;

  [[nodiscard]] LineKind kind() const noexcept;
  [[nodiscard]] const XidLine* xid() const noexcept { return std::get_if<XidLine>(&payload); }
  [[nodiscard]] const GpuUuidLine* gpu_uuid() const noexcept {
    return std::get_if<GpuUuidLine>(&payload);
  }
  [[nodiscard]] const FallenOffBusLine* fallen_off_bus() const noexcept {
    return std::get_if<FallenOffBusLine>(&payload);
  }
  [[nodiscard]] const ResetAckLine* reset_ack() const noexcept {
    return std::get_if<ResetAckLine>(&payload);
  }
  [[nodiscard]] const MalformedLine* malformed() const noexcept {
    return std::get_if<MalformedLine>(&payload);
  }
  [[nodiscard]] const SxidLine* sxid() const noexcept { return std::get_if<SxidLine>(&payload); }
};

// Classifies one message. The markers are searched, not anchored, because the text may
// carry a "[  123.456] " or syslog prefix. The result may point into `message` (XidLine's raw
// text): keep it no longer than the message. A message holding several NVRM lines (journald
// keeps a multi-line printk together) is classified by its first Xid line if it has one.
// noexcept: every allocation is bounded by the caps above; running out of memory for a
// kilobyte string terminates, like everywhere else in the daemon.
[[nodiscard]] ParsedLine ParseKernelLine(std::string_view message) noexcept;

}  // namespace gns::gpu_health
