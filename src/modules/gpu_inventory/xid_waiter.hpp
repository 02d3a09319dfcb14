#pragma once
// The one thread gpu-inventory owns: it blocks in nvmlEventSetWait_v2 (there is no file
// descriptor to hand to the loop) and reports what it sees through callbacks, which must only
// post to the loop. It wakes at least every `timeout` to notice a stop request, so stopping
// takes at most one timeout.

#include "modules/gpu_inventory/nvml_library.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gns::gpu_inventory {

struct XidEvent {
  std::string uuid;  // empty if NVML named a device we did not register
  uint64_t xid = 0;
  uint32_t gpu_instance = nvml::kInstanceIdNone;
  uint32_t compute_instance = nvml::kInstanceIdNone;
};

class XidWaiter {
 public:
  // All called on the waiter thread.
  struct Callbacks {
    // The first wait returned normally: the event set works (called once).
    std::function<void()> armed;
    std::function<void(XidEvent)> xid;
    // A wait failed with something other than TIMEOUT; the thread then ends.
    std::function<void(nvml::Return code, std::string message)> failed;
  };

  // Starts the thread at once. `devices` maps the handles NVML puts in events to UUIDs.
  XidWaiter(std::shared_ptr<const NvmlLibrary> library, nvml::EventSet set,
            std::vector<std::pair<nvml::Device, std::string>> devices, std::chrono::milliseconds timeout,
            Callbacks callbacks);
  // Requests a stop and joins (blocks up to one timeout): owners join off the loop first.
  ~XidWaiter();
  XidWaiter(const XidWaiter&) = delete;
  XidWaiter& operator=(const XidWaiter&) = delete;

  // Thread-safe and non-blocking: the thread ends after its current wait.
  void RequestStop() noexcept { stop_.store(true); }
  // Blocks until the thread has ended. Not on the loop.
  void Join();

 private:
  void Run();
  std::string UuidOf(nvml::Device device) const;

  std::shared_ptr<const NvmlLibrary> library_;
  nvml::EventSet set_;
  std::vector<std::pair<nvml::Device, std::string>> devices_;
  unsigned int timeout_ms_;
  Callbacks callbacks_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: started after everything it reads is set
};

}  // namespace gns::gpu_inventory
