// The NVML event waiter thread.
#include "modules/gpu_inventory/xid_waiter.hpp"

#include <algorithm>

namespace gns::gpu_inventory {

namespace {
// The first wait only proves that the event set works before the inventory is announced (a
// set that fails at once must not make the inventory flap to available). 1 ms, not 0: NVML does
// not document what a zero timeout means.
constexpr unsigned int kProbeTimeoutMs = 1;
}  // namespace

XidWaiter::XidWaiter(std::shared_ptr<const NvmlLibrary> library, nvml::EventSet set,
                     std::vector<std::pair<nvml::Device, std::string>> devices, std::chrono::milliseconds timeout,
                     Callbacks callbacks)
    : library_(std::move(library)),
      set_(set),
      devices_(std::move(devices)),
      timeout_ms_(static_cast<unsigned int>(std::max<std::chrono::milliseconds::rep>(timeout.count(), 1))),
      callbacks_(std::move(callbacks)),
      thread_([this] { Run(); }) {}

XidWaiter::~XidWaiter() {
  RequestStop();
  Join();
}

void XidWaiter::Join() {
  if (thread_.joinable()) thread_.join();
}

std::string XidWaiter::UuidOf(nvml::Device device) const {
  for (const auto& [handle, uuid] : devices_) {
    if (handle == device) return uuid;
  }
  return {};
}

void XidWaiter::Run() {
  const auto wait = library_->Api().nvmlEventSetWait_v2;
  bool armed = false;
  while (!stop_.load()) {
    nvml::EventData data{};
    const nvml::Return rc = wait(set_, &data, armed ? timeout_ms_ : kProbeTimeoutMs);
    if (rc == nvml::kSuccess || rc == nvml::kErrorTimeout) {
      if (!armed) {
        armed = true;
        callbacks_.armed();
      }
      // Only XIDs are published; SBE/DBE are not registered, and anything else is ignored.
      if (rc == nvml::kSuccess && (data.eventType & nvml::kEventTypeXidCriticalError) != 0) {
        callbacks_.xid(XidEvent{UuidOf(data.device), data.eventData, data.gpuInstanceId, data.computeInstanceId});
      }
      continue;
    }
    // An error while stopping is expected (the owner may be tearing NVML down): not a failure.
    if (stop_.load()) return;
    callbacks_.failed(rc, "nvmlEventSetWait_v2 failed: " + library_->Describe(rc));
    return;
  }
}

}  // namespace gns::gpu_inventory
