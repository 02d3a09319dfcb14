#pragma once
// The worker side of gpu-inventory: one initialised NVML (nvmlInit_v2 … nvmlShutdown) for
// reading the GPUs. Everything here blocks and runs on the blocking pool; NVML handles never
// leave it. The loop only holds the session to hand it back to the pool for Read() and Close(),
// one call at a time, and gets plain values (ReadResult) back. NVML's events are waited for in
// a child process (event_waiter.hpp), so no wait ever holds this session: closing it is one
// nvmlShutdown.

#include "modules/gpu_inventory/messages.hpp"
#include "modules/gpu_inventory/nvml_library.hpp"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gns::gpu_inventory {

// One read of every GPU, as plain values.
struct ReadResult {
  bool ok = false;
  std::string error;         // why not ok
  GpuInventory inventory;    // available = true when ok
  NodeClique clique;
  std::vector<std::string> warnings;          // non-fatal problems, for the log
  std::vector<std::string> failed_functions;  // NVML calls that failed, for nvml_errors_total
};

// GPUs released for their reset: NVML index (as last read) → UUID. Not touched at all at that
// index (no handle, no read, no events); a GPU found elsewhere with that UUID (the indices moved)
// is skipped too. They are absent from the read.
using ExcludedGpus = std::map<uint32_t, std::string>;

struct SessionOptions {
  std::string library;    // soname or path to dlopen
  std::string host_root;  // where the host's /sys is (NUMA fallback)
  ExcludedGpus excluded;
};

// Reads every GPU but the excluded ones through an initialised NVML. Blocking; thread-safe
// (NVML is).
ReadResult ReadInventory(const NvmlLibrary& library, const std::string& host_root,
                         const ExcludedGpus& excluded = {});

class NvmlSession {
 public:
  struct Opened {
    std::shared_ptr<NvmlSession> session;  // null when opening failed (read.error says why)
    ReadResult read;
  };
  struct Closed {
    std::vector<std::string> warnings;
    std::vector<std::string> failed_functions;
  };

  // dlopen, nvmlInit_v2, read every GPU. Blocking.
  static Opened Open(const SessionOptions& options);

  // Close() if Close was not called.
  ~NvmlSession();
  NvmlSession(const NvmlSession&) = delete;
  NvmlSession& operator=(const NvmlSession&) = delete;

  // Re-reads every GPU (refresh). Blocking.
  ReadResult Read() const { return ReadInventory(*library_, options_.host_root, options_.excluded); }
  // nvmlShutdown. Blocking; idempotent (a second call gets an empty Closed).
  Closed Close();
  // The GPUs this session leaves alone (its event waiter must too).
  const ExcludedGpus& Excluded() const { return options_.excluded; }

 private:
  NvmlSession(std::shared_ptr<const NvmlLibrary> library, SessionOptions options)
      : library_(std::move(library)), options_(std::move(options)) {}

  std::shared_ptr<const NvmlLibrary> library_;
  SessionOptions options_;
  bool initialized_ = false;
};

}  // namespace gns::gpu_inventory
