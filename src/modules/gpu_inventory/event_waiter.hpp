#pragma once
// NVML's XID and MIG events, waited for in a child process. NVML cannot interrupt
// nvmlEventSetWait_v2, and a GPU can only be reset once nothing holds it: an event set on it (or
// its handle) keeps it held until the wait on that set returned and NVML was shut down. In a
// thread of ours that meant a per-GPU release sat out the current wait. In a child process the
// wait is ended by ending the process: SIGKILL, and once it is reaped the kernel has closed
// every handle it held. So a release takes as long as a kill and a reap, whatever the wait's
// timeout, which is then free to be long (few wake-ups at rest).
//
// The child is this binary again (`gpu-node-supervisor nvml-events …`, RunEventWaiter): it opens
// NVML itself, registers XIDs, MIG reconfigurations, SBE/DBE ECC errors and clock events (each
// where nvmlDeviceGetSupportedEventTypes says the GPU reports it) on every GPU it is not told to
// leave alone, and writes one line per event on its stdout, a pipe the loop reads (no
// thread, no polling). It dies with us (PR_SET_PDEATHSIG), and its exit is awaited through a
// pidfd on the loop.
//
// Lines (fields separated by one space; UUIDs contain none, "-" when NVML named a device the
// child did not register):
//   armed                                  the event set answered its first wait
//   xid <uuid> <xid> <gpu instance> <compute instance>
//   mig <uuid>                             a MIG reconfiguration of that GPU
//   health <uuid> <kind> <data>            an ECC or clock event (kind singleBitEcc,
//                                          doubleBitEcc or clock; data: eventData)
//   registered <uuid> <types> <supported> <mig current> <mig pending>
//                                          once per GPU at start: the event types registered on
//                                          it (a mask of nvmlEventType*, decimal; 0 for none),
//                                          those it supports, and its MIG mode ("-" where NVML
//                                          did not say): what the registration followed
//   warn <text>                            a GPU whose events cannot be registered (not fatal)
//   error <function> <text>                it failed (<function> "-" when no NVML call); it exits

#include "modules/gpu_inventory/api/nvml_events_command.hpp"
#include "modules/gpu_inventory/api/nvml_abi.hpp"
#include "modules/gpu_inventory/api/health_events.hpp"
#include "modules/gpu_inventory/api/nvml_session.hpp"

#include <boost/asio/io_context.hpp>

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gns::gpu_inventory {

struct HealthEventLine {
  std::string uuid;  // empty if NVML named a device the waiter did not register
  NvmlHealthEvent::Kind kind = NvmlHealthEvent::Kind::kDoubleBitEcc;
  uint64_t data = 0;
};

struct XidEvent {
  std::string uuid;  // empty if NVML named a device the waiter did not register
  uint64_t xid = 0;
  uint32_t gpu_instance = nvml::kInstanceIdNone;
  uint32_t compute_instance = nvml::kInstanceIdNone;
};

// The event types the waiter registers, where a GPU supports them.
inline constexpr unsigned long long kWaitedEventTypes =
    nvml::kEventTypeXidCriticalError | nvml::kEventMigConfigChange | nvml::kEventTypeSingleBitEccError |
    nvml::kEventTypeDoubleBitEccError | nvml::kEventTypeClock;

// The GPUs (UUIDs) whose basis in `read` differs from the one the running waiter registered by
// (`registered`, from its `registered` lines): a MIG mode (current or pending) or a set of
// supported event types (of those it waits for) that changed. Its registrations are out of date
// for them: it has to register again. A value one side does not know (a failed call) and a GPU
// one side lacks are no difference, so a call that keeps failing never restarts it on each read.
std::vector<std::string> GpusWithNewEventBasis(const std::map<std::string, GpuEventBasis>& registered,
                                               const std::map<std::string, GpuEventBasis>& read);

// The child's side (EventWaiterOptions, RunEventWaiter) is in api/nvml_events_command.hpp.
// The arguments after the program for `options` (the parent side builds them).
std::vector<std::string> EventWaiterArgs(const EventWaiterOptions& options);

// The parent's side: one child, on the loop.
class EventWaiterProcess : public std::enable_shared_from_this<EventWaiterProcess> {
 public:
  // All run on the loop, never after Kill().
  struct Callbacks {
    std::function<void()> armed;
    std::function<void(XidEvent)> xid;
    std::function<void(std::string uuid)> mig_changed;
    std::function<void(HealthEventLine)> health;
    std::function<void(std::string uuid, uint64_t types, GpuEventBasis basis)> registered;
    std::function<void(std::string text)> warning;
    // It failed: an `error` line, or it ended without being asked to. `function` is the NVML
    // call that failed ("" when none). Called once; the process is gone or going.
    std::function<void(std::string function, std::string message)> failed;
  };

  // Forks and execs `program nvml-events <args>`. Throws std::runtime_error when it cannot
  // (a failed exec is reported through `failed`).
  static std::shared_ptr<EventWaiterProcess> Start(boost::asio::io_context& io, const std::string& program,
                                                   const EventWaiterOptions& options, Callbacks callbacks);

  // SIGKILL, callbacks silenced; `reaped` runs on the loop once the process was reaped (the
  // kernel has closed every NVML handle it held). Each `reaped` given runs once: a second Kill
  // (a session closed while a restart waits for the reap) is told too.
  void Kill(std::function<void()> reaped);
  pid_t Pid() const { return pid_; }

  // Kills and reaps a child still there (a blocking waitpid after SIGKILL: quick).
  ~EventWaiterProcess();
  EventWaiterProcess(const EventWaiterProcess&) = delete;
  EventWaiterProcess& operator=(const EventWaiterProcess&) = delete;

 private:
  struct Io;
  EventWaiterProcess(boost::asio::io_context& io, Callbacks callbacks);
  void ReadMore();
  void OnLine(const std::string& line);
  void AwaitExit();
  void MaybeEnded();
  void Fail(std::string function, std::string message);

  Callbacks callbacks_;
  std::unique_ptr<Io> io_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
  bool eof_ = false;
  bool killing_ = false;
  bool failed_ = false;
  std::string partial_;  // an unfinished line
  std::vector<std::function<void()>> on_reaped_;
};

}  // namespace gns::gpu_inventory
