#pragma once
// A simulated NVSentinel platform connector: PlatformConnector.HealthEventOccurredV1 on a unix
// socket (our datamodels proto, the wire of the real one). Records every event it takes, one
// JSON line each, to a file opened for appending (so a restarted simulator adds to what an
// earlier run recorded), and can be told to fail calls with UNAVAILABLE (the connector
// restarting) or to answer slowly. For in-process tests and the gns-sim-nvsentinel binary.

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace gns::sim {

class PlatformConnectorSim {
 public:
  // Serves `socket` (a stale socket file is replaced); records to `record` when not empty.
  PlatformConnectorSim(std::filesystem::path socket, std::filesystem::path record);
  ~PlatformConnectorSim();
  PlatformConnectorSim(const PlatformConnectorSim&) = delete;
  PlatformConnectorSim& operator=(const PlatformConnectorSim&) = delete;

  // Calls fail with UNAVAILABLE while set (nothing recorded).
  void SetFailing(bool failing) { failing_ = failing; }
  // Each call waits this long before it records and answers.
  void SetDelay(std::chrono::milliseconds delay) { delay_ms_ = delay.count(); }

  struct Received {
    uint64_t call = 0;
    std::string id;
    std::string check_name;
    bool is_healthy = false;
    std::string json;  // the event as recorded
  };
  std::vector<Received> Events() const;
  uint64_t Calls() const { return calls_; }
  uint64_t FailedCalls() const { return failed_calls_; }

  class Service;

 private:
  friend class Service;
  void Record(uint64_t call, const std::vector<Received>& events);

  std::filesystem::path socket_;
  std::filesystem::path record_;
  std::atomic<bool> failing_{false};
  std::atomic<int64_t> delay_ms_{0};
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> failed_calls_{0};
  mutable std::mutex mutex_;
  std::vector<Received> events_;
  std::unique_ptr<Service> service_;
  struct Server;
  std::unique_ptr<Server> server_;
};

}  // namespace gns::sim
