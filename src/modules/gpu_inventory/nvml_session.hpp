#pragma once
// The worker side of gpu-inventory: one initialised NVML (nvmlInit_v2 … nvmlShutdown) with its
// event set and XID waiter. Everything here blocks and runs on the blocking pool (or the waiter
// thread); NVML handles never leave it. The loop only holds the session to hand it back to the
// pool for Read() and Close(), one call at a time, and gets plain values (ReadResult) back.
// Closing never waits for a blocked event wait: with the waiter running, the teardown (event set
// freed, nvmlShutdown) is handed to the waiter thread, which runs it when its wait returns.

#include "modules/gpu_inventory/messages.hpp"
#include "modules/gpu_inventory/nvml_library.hpp"
#include "modules/gpu_inventory/xid_waiter.hpp"

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
  // Timeouts of the waiter's waits; null: 5 s waits, never shortened (one-shot commands).
  std::shared_ptr<WaitPace> pace;
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

  // dlopen, nvmlInit_v2, read every GPU, create the event set, register XIDs (and MIG
  // reconfigurations where supported). Blocking.
  static Opened Open(const SessionOptions& options);

  // Close({}) if Close was not called. Never blocks on the waiter.
  ~NvmlSession();
  NvmlSession(const NvmlSession&) = delete;
  NvmlSession& operator=(const NvmlSession&) = delete;

  // Starts the XID waiter thread (its callbacks run on that thread). Does not block, so the
  // loop calls it once it holds the session: a report can then never overtake the session.
  void StartWaiter(XidWaiter::Callbacks callbacks);
  // Re-reads every GPU (refresh). Blocking; may run while the waiter waits.
  ReadResult Read() const { return ReadInventory(*library_, options_.host_root, options_.excluded); }
  // Stops the waiter, frees the event set, nvmlShutdown, then `done(closed)` — here and now
  // without a waiter thread (or once it ended), else on the waiter thread once its current wait
  // returns (at most one wait timeout later). Does not wait for it; idempotent (a second call
  // gets an empty Closed at once). Blocking NVML calls: run it on the pool.
  void Close(std::function<void(Closed)> done);
  // The same, waiting for the teardown: for sessions whose waiter never started (a failed
  // open, the `inventory` command).
  Closed Close();

 private:
  NvmlSession(std::shared_ptr<const NvmlLibrary> library, SessionOptions options)
      : library_(std::move(library)), options_(std::move(options)) {}

  std::shared_ptr<const NvmlLibrary> library_;
  SessionOptions options_;
  bool initialized_ = false;
  nvml::EventSet event_set_ = nullptr;
  std::vector<std::pair<nvml::Device, std::string>> devices_;  // event handle → UUID
  std::unique_ptr<XidWaiter> waiter_;
};

}  // namespace gns::gpu_inventory
