#pragma once
// The seam between the DRA kubelet-plugin core (kubelet_plugin.hpp) and a driver: what a driver
// brings, and nothing else. The core owns the kubelet's side (sockets, the FIFO of calls, the
// claim state on disk, the start-up reconcile, the ResourceSlice's publishing, the counters);
// a driver answers four questions:
//   - its names: the driver name, its state folder, its CDI vendor and class (KubeletPlugin::Options);
//   - what a claim's devices become in a container: ClaimSpecIo, pure functions of a record that
//     run on the BlockingPool, so the start-up reconcile can re-make a spec from the record alone;
//   - how it decides a claim (its opaque config, the allocation it checks, what it waits for):
//     DecideClaim, on the loop, answering a record to commit or an error;
//   - what its slice holds: SliceDevices.
// Optional hooks: AfterUnprepare (per claim, once its record is gone) and StopBeforeServers; and
// the health of its devices (KEP-4680): ServesDeviceHealth + DeviceHealth.

#include "dra_plugin/checkpoint.hpp"
#include "dra_plugin/claim_commit.hpp"
#include "dra_plugin/dra_server.hpp"

#include <boost/asio/awaitable.hpp>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>

namespace gns::dra {

// A driver's answer for one claim of a NodePrepareResources call.
struct ClaimDecision {
  enum class Kind {
    kPrepare,          // commit `entry` (PrepareCompleted), then answer with its devices
    kAlreadyPrepared,  // answer with `entry`, touch nothing
    kPermanentError,   // answer `error`; the kubelet reports it on the pod
    kRetryableError,   // answer `error`; the kubelet retries
    kStopped,          // the module is stopping: no answer (the DRA server's shutdown answers)
  };
  Kind kind = Kind::kPermanentError;
  PreparedClaim entry;
  std::string error;  // the whole answer text (it names the claim)

  static ClaimDecision Prepare(PreparedClaim entry) { return {Kind::kPrepare, std::move(entry), {}}; }
  static ClaimDecision Already(PreparedClaim entry) { return {Kind::kAlreadyPrepared, std::move(entry), {}}; }
  static ClaimDecision Permanent(std::string error) { return {Kind::kPermanentError, {}, std::move(error)}; }
  static ClaimDecision Retryable(std::string error) { return {Kind::kRetryableError, {}, std::move(error)}; }
  static ClaimDecision Stopped() { return {Kind::kStopped, {}, {}}; }
};

class DraDriver {
 public:
  virtual ~DraDriver() = default;

  // The driver's per-claim specs as the pool writes, checks and removes them (claim_commit.hpp).
  // Called on the loop; the functions it returns run on the pool.
  virtual ClaimSpecIo SpecIo() const = 0;

  // One claim of a prepare call, on the loop. The core has already answered a claim the claim
  // state holds as PrepareCompleted and refused an invalid reference; the driver reads the
  // claim state as this call sees it through KubeletPlugin::DecideView (claims decided earlier
  // in the same call included). A kPrepare entry needs uid, namespace, name, its devices and
  // cdi_spec_file; the core stamps state and times.
  virtual boost::asio::awaitable<ClaimDecision> DecideClaim(ClaimRef claim) = 0;

  // On the loop, once an unprepare call's records are durable, for each claim it held (or held
  // no record of), last first; the error text for the claim, or empty.
  virtual boost::asio::awaitable<std::string> AfterUnprepare(ClaimRef claim);

  // The ResourceSlice's devices (the core's SlicePublisher keeps the slice true) and a note for
  // its log lines.
  virtual nlohmann::json SliceDevices() const = 0;
  virtual std::string SliceNote() const { return {}; }

  // The claim state, the registration or the last error changed: the driver republishes its
  // bus state if it has one.
  virtual void StateChanged() {}
  // A prepared claim just became durable (for the driver's own log line; the core counts it).
  virtual void Prepared(const PreparedClaim& entry) { (void)entry; }

  // KEP-4680 (optional). A driver that says its devices' health serves v1alpha1.DRAResourceHealth
  // on its DRA socket and advertises it at registration; one that does not (the default)
  // neither serves nor advertises it. Asked once, at Serve.
  virtual bool ServesDeviceHealth() const { return false; }
  // Its complete device list with each device's health (loop thread): sent at each stream's
  // start, and again after KubeletPlugin::DeviceHealthChanged when it differs.
  virtual DeviceHealthList DeviceHealth() const { return {}; }

  // KubeletPlugin::Stop: what of the driver must end before the servers go (driver-managed IMEX
  // daemons); `done` on the loop.
  virtual void StopBeforeServers(std::function<void()> done) { done(); }
};

}  // namespace gns::dra
