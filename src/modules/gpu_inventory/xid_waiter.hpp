#pragma once
// The one thread gpu-inventory owns: it blocks in nvmlEventSetWait_v2 (there is no file
// descriptor to hand to the loop) and reports what it sees (XIDs, MIG reconfigurations) through callbacks, which must only
// post to the loop. Nobody ever joins it: a stop request takes effect when the current wait
// returns (at the latest after the timeout WaitPace gave it), and what must happen only after the wait ended
// (freeing the event set, nvmlShutdown) is handed to the thread with Finish(). So stopping never
// blocks: a process that exits leaves a blocked wait behind instead of sitting it out (SIGTERM
// exits at once), and the thread shares ownership of everything it touches, so it may outlive
// the module and its XidWaiter handle.

#include "modules/gpu_inventory/nvml_library.hpp"
#include "modules/gpu_inventory/wait_pace.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
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
  // All called on the waiter thread; they may run after the XidWaiter handle is gone, so they
  // must hold what they use (and only post to the loop through something that can be closed).
  struct Callbacks {
    // The first wait returned normally: the event set works (called once).
    std::function<void()> armed;
    std::function<void(XidEvent)> xid;
    // NVML reported a MIG reconfiguration (nvmlEventMigConfigChange) of the GPU with this UUID
    // (empty if unregistered): its MIG devices must be read again. Optional.
    std::function<void(std::string uuid)> mig_changed;
    // A wait failed with something other than TIMEOUT; the thread then ends.
    std::function<void(nvml::Return code, std::string message)> failed;
  };

  // Starts the (detached) thread at once. `devices` maps the handles NVML puts in events to UUIDs.
  XidWaiter(std::shared_ptr<const NvmlLibrary> library, nvml::EventSet set,
            std::vector<std::pair<nvml::Device, std::string>> devices, std::shared_ptr<WaitPace> pace,
            Callbacks callbacks);
  // Finish({}) unless Finish was called. Never blocks.
  ~XidWaiter();
  XidWaiter(const XidWaiter&) = delete;
  XidWaiter& operator=(const XidWaiter&) = delete;

  // Thread-safe, non-blocking, once: the thread ends after its current wait and then runs `last`
  // on itself. When the thread has ended already (a failed wait), `last` runs here, now.
  void Finish(std::function<void()> last);

 private:
  struct State;
  static void Run(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_;
  bool finished_ = false;
};

}  // namespace gns::gpu_inventory
