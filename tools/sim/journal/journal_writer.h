#pragma once
// Writes real journal files for tests: entries in the journal export format piped into
// Debian's /lib/systemd/systemd-journal-remote, which appends them to DIR/<file>.journal (a
// reader waiting on the journal's fd wakes up and sees them). Every entry gets
// __REALTIME_TIMESTAMP (journal-remote silently drops entries without one), a
// __MONOTONIC_TIMESTAMP that only grows, and the writer's _BOOT_ID.
//
// Keep only journal files in the directory: the reader watches all of it.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <sys/wait.h>
#include <utility>
#include <vector>

namespace gns::sim {

inline constexpr const char* kJournalRemote = "/lib/systemd/systemd-journal-remote";

struct JournalEntry {
  std::vector<std::pair<std::string, std::string>> fields;  // FIELD=value, any bytes in value
};

class JournalWriter {
 public:
  // `file` must end in ".journal".
  explicit JournalWriter(std::string directory, std::string file = "sim.journal", std::string boot_id = NewBootId())
      : directory_(std::move(directory)), file_(std::move(file)), boot_id_(std::move(boot_id)) {}

  static std::string NewBootId() {
    std::random_device rd;
    static const char* hex = "0123456789abcdef";
    std::string id;
    for (int i = 0; i < 32; ++i) id += hex[rd() % 16];
    return id;
  }

  const std::string& BootId() const { return boot_id_; }
  void SetBootId(std::string boot_id) { boot_id_ = std::move(boot_id); }
  void SetFile(std::string file) { file_ = std::move(file); }
  std::string Path() const { return directory_ + "/" + file_; }

  static JournalEntry Kernel(std::string message, int priority = 3) {
    return {{{"_TRANSPORT", "kernel"}, {"SYSLOG_IDENTIFIER", "kernel"}, {"PRIORITY", std::to_string(priority)},
             {"MESSAGE", std::move(message)}}};
  }
  static JournalEntry Syslog(std::string identifier, std::string message, int priority = 6) {
    return {{{"_TRANSPORT", "syslog"}, {"SYSLOG_IDENTIFIER", std::move(identifier)},
             {"PRIORITY", std::to_string(priority)}, {"MESSAGE", std::move(message)}}};
  }
  static JournalEntry Unit(std::string unit, std::string message, int priority = 6) {
    return {{{"_TRANSPORT", "stdout"}, {"_SYSTEMD_UNIT", std::move(unit)}, {"PRIORITY", std::to_string(priority)},
             {"MESSAGE", std::move(message)}}};
  }

  // Appends the entries with one run of systemd-journal-remote; throws if it fails.
  void Append(const std::vector<JournalEntry>& entries) {
    std::string text;
    for (const auto& e : entries) AppendExport(text, e);
    const std::string command = std::string(kJournalRemote) + " --output=" + Path() + " - 2>/dev/null";
    FILE* pipe = ::popen(command.c_str(), "w");
    if (pipe == nullptr) throw std::runtime_error("popen " + command);
    const bool written = std::fwrite(text.data(), 1, text.size(), pipe) == text.size();
    const int status = ::pclose(pipe);
    if (!written || status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      throw std::runtime_error("systemd-journal-remote failed writing " + Path());
    }
  }
  void Append(const JournalEntry& entry) { Append(std::vector<JournalEntry>{entry}); }

  // The export text of one entry (timestamps and boot added), for callers that stream it.
  void AppendExport(std::string& out, const JournalEntry& e) {
    using namespace std::chrono;
    uint64_t realtime = static_cast<uint64_t>(duration_cast<microseconds>(system_clock::now().time_since_epoch()).count());
    if (realtime <= last_realtime_) realtime = last_realtime_ + 1;
    last_realtime_ = realtime;
    uint64_t monotonic = static_cast<uint64_t>(duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count());
    if (monotonic <= last_monotonic_) monotonic = last_monotonic_ + 1;
    last_monotonic_ = monotonic;
    out += "__REALTIME_TIMESTAMP=" + std::to_string(realtime) + "\n";
    out += "__MONOTONIC_TIMESTAMP=" + std::to_string(monotonic) + "\n";
    out += "_BOOT_ID=" + boot_id_ + "\n";
    for (const auto& [name, value] : e.fields) {
      if (value.find('\n') == std::string::npos) {
        out += name + "=" + value + "\n";
      } else {
        // The export format's binary form: NAME\n<64-bit little-endian size><bytes>\n
        out += name + "\n";
        uint64_t size = value.size();
        for (int i = 0; i < 8; ++i) out += static_cast<char>((size >> (8 * i)) & 0xff);
        out += value + "\n";
      }
    }
    out += "\n";
  }

 private:
  std::string directory_;
  std::string file_;
  std::string boot_id_;
  uint64_t last_realtime_ = 0;
  uint64_t last_monotonic_ = 0;
};

// The lines the gpu-health module understands (WIRE-FACTS §9.3, seed 003).
inline std::string XidMessage(const std::string& pci, int xid, const std::string& detail = "Ch 00000076") {
  return "NVRM: Xid (PCI:" + pci + "): " + std::to_string(xid) + ", pid='<unknown>', name=<unknown>, " + detail;
}
inline std::string GpuUuidMessage(const std::string& pci, const std::string& uuid) {
  return "NVRM: GPU at PCI:" + pci + ": " + uuid;
}
inline std::string ResetAckMessage(const std::string& uuid) { return "GPU reset occurred: " + uuid; }

}  // namespace gns::sim
