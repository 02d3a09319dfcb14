// The NVML event waiter thread.
#include "modules/gpu_inventory/xid_waiter.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

namespace gns::gpu_inventory {

namespace {
// The first wait only proves that the event set works before the inventory is announced (a
// set that fails at once must not make the inventory flap to available). 1 ms, not 0: NVML does
// not document what a zero timeout means.
constexpr unsigned int kProbeTimeoutMs = 1;
}  // namespace

// Shared by the handle and the thread; the thread's reference keeps it (and the library it
// holds, so NVML stays loaded) alive for as long as it runs.
struct XidWaiter::State {
  std::shared_ptr<const NvmlLibrary> library;
  nvml::EventSet set = nullptr;
  std::vector<std::pair<nvml::Device, std::string>> devices;
  std::shared_ptr<WaitPace> pace;
  Callbacks callbacks;

  std::atomic<bool> stop{false};
  std::mutex mutex;
  bool ended = false;               // the thread left its loop (guarded by mutex)
  std::function<void()> last;       // what the thread runs once it leaves (guarded by mutex)

  std::string UuidOf(nvml::Device device) const {
    for (const auto& [handle, uuid] : devices) {
      if (handle == device) return uuid;
    }
    return {};
  }
};

XidWaiter::XidWaiter(std::shared_ptr<const NvmlLibrary> library, nvml::EventSet set,
                     std::vector<std::pair<nvml::Device, std::string>> devices, std::shared_ptr<WaitPace> pace,
                     Callbacks callbacks)
    : state_(std::make_shared<State>()) {
  state_->library = std::move(library);
  state_->set = set;
  state_->devices = std::move(devices);
  state_->pace = std::move(pace);
  state_->callbacks = std::move(callbacks);
  // Detached: the thread owns its share of the state; nothing waits for a blocked wait.
  std::thread([state = state_] { Run(state); }).detach();
}

XidWaiter::~XidWaiter() {
  if (!finished_) Finish({});
}

void XidWaiter::Finish(std::function<void()> last) {
  if (finished_) return;
  finished_ = true;
  {
    std::lock_guard lock(state_->mutex);
    state_->stop.store(true);
    if (!state_->ended) {
      state_->last = std::move(last);
      return;
    }
  }
  if (last) last();
}

void XidWaiter::Run(const std::shared_ptr<State>& state) {
  const auto wait = state->library->Api().nvmlEventSetWait_v2;
  bool armed = false;
  while (!state->stop.load()) {
    nvml::EventData data{};
    const nvml::Return rc = wait(state->set, &data, armed ? state->pace->NextTimeoutMs() : kProbeTimeoutMs);
    if (rc == nvml::kSuccess || rc == nvml::kErrorTimeout) {
      if (state->stop.load()) break;  // nobody listens any more
      if (!armed) {
        armed = true;
        state->callbacks.armed();
      }
      // XIDs and MIG reconfigurations; SBE/DBE are not registered, and anything else is ignored.
      if (rc == nvml::kSuccess && (data.eventType & nvml::kEventTypeXidCriticalError) != 0) {
        state->pace->AfterXid();
        state->callbacks.xid(
            XidEvent{state->UuidOf(data.device), data.eventData, data.gpuInstanceId, data.computeInstanceId});
      }
      if (rc == nvml::kSuccess && (data.eventType & nvml::kEventMigConfigChange) != 0 && state->callbacks.mig_changed) {
        state->callbacks.mig_changed(state->UuidOf(data.device));
      }
      continue;
    }
    // An error while stopping is expected (the owner may be tearing NVML down): not a failure.
    if (!state->stop.load()) state->callbacks.failed(rc, "nvmlEventSetWait_v2 failed: " + state->library->Describe(rc));
    break;
  }
  std::function<void()> last;
  {
    std::lock_guard lock(state->mutex);
    state->ended = true;
    last = std::move(state->last);
  }
  if (last) last();
}

}  // namespace gns::gpu_inventory
