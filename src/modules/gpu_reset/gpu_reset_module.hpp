#pragma once
// The `gpu-reset` module (issue #12, seed 003 Part 1): resets one GPU while the node keeps
// serving the others. Requests come from GPUReset objects (janitor.dgxc.nvidia.com/v1alpha1) for
// this node, from `gpu-node-supervisor reset-gpu` over <stateDir>/reset.sock, and optionally
// (`autoReset`) from a COMPONENT_RESET verdict on a GPU no pod holds. One maintenance at a time
// on the node: later requests wait in order; a request for a GPU already queued or resetting
// joins that job.
//
// Each GPU's reset is one coroutine of eight steps (reset_book.hpp), each logged, timed, kept
// in the durable record before it starts and shown in the object's status. The verdict stays
// with gpu-health, the one judge: a "GPU reset started" journal line holds the GPU Unhealthy,
// "GPU reset occurred" (after validation only) makes it Healthy, "GPU reset executed: …,
// success: false" keeps it Unhealthy with RESTART_BM. The journal is durable and gpu-health
// reads it at its checkpointed position, so the hold and the outcome survive kill -9 of either
// side. After a restart a job resumes at its step: before the reset command it starts again
// from the hold; after it, validation runs again — never Healthy without it.

#include "loop/admin_socket.hpp"
#include "loop/gate.hpp"
#include "loop/run_command.hpp"
#include "loop/state_file.hpp"
#include "loop/module.hpp"
#include "modules/gpu_reset/intake.hpp"
#include "modules/gpu_reset/messages.hpp"
#include "modules/gpu_reset/reset_book.hpp"
#include "modules/gpu_reset/reset_runner.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace gns::kube {
class KubeClient;
class Informer;
class EventRecorder;
struct ResourceEvent;
struct Result;
}  // namespace gns::kube

namespace gns::gpu_inventory {
class GpuMaintenance;
struct GpuMaintenanceRead;
}  // namespace gns::gpu_inventory

namespace gns::gpu_reset {

// The coordinator: the request sources, the node's maintenance slot (one job at a time, its GPUs
// one after another through ResetRunner), the record and the outputs. It is the runner's
// NodeMaintenance: the bus, gpu-inventory's NVML service, the reset command, the journal, the API.
class GpuResetModule final : public Module, private NodeMaintenance {
 public:
  static constexpr std::string_view kName = "gpu-reset";
  static constexpr std::string_view kSummary =
      "resets one GPU in place (GPUReset objects, reset-gpu, autoReset); one maintenance at a time";
  // NVML (holders, persistence, pending repairs) through gpu-inventory's GpuMaintenance.
  static constexpr std::array<std::string_view, 1> kUses = {"gpu-inventory"};
  // The API (GPUReset objects, status, evictions, Events) when it is there; resets asked for on
  // the node work without it.
  static constexpr std::array<std::string_view, 1> kFollows = {"kube"};

  using HolderPolicy = gpu_reset::HolderPolicy;

  struct Config {
    HolderPolicy holders = HolderPolicy::kWait;
    std::chrono::milliseconds holders_timeout{std::chrono::minutes(5)};
    // While waiting for holders to go: how often NVML's process list is read again (the pod
    // map needs no polling: its changes wake the wait).
    std::chrono::milliseconds holders_recheck{std::chrono::seconds(2)};
    std::chrono::milliseconds hold_timeout{std::chrono::seconds(10)};     // verdict turns Unhealthy
    std::chrono::milliseconds release_timeout{std::chrono::seconds(30)};  // NVML lets go / takes back
    // {uuid} and {pci} are replaced in each argument.
    std::vector<std::string> command{"nvidia-smi", "--gpu-reset", "-i", "{uuid}"};
    std::chrono::milliseconds command_timeout{std::chrono::minutes(5)};
    std::size_t command_output_bytes = 8192;
    // Watched after the GPU is back in service: an XID this long after the acknowledgement fails the reset.
    std::chrono::milliseconds settle{std::chrono::seconds(10)};
    std::chrono::milliseconds healthy_timeout{std::chrono::seconds(30)};  // verdict Healthy after the ack
    bool auto_reset = false;
    bool watch_objects = true;
    std::string journal_socket;  // "": <hostRoot>/run/systemd/journal/socket
    std::string ack_identifier;  // SYSLOG_IDENTIFIER of our journal lines
    bool admin_socket = true;    // <stateDir>/reset.sock
  };
  static Config ParseConfig(ConfigMap& section, const SiteConfig& site);

  GpuResetModule(ModuleContext& context, const Config& config);
  ~GpuResetModule() override;

  void Start() override;
  void Stop(std::function<void()> done) override;

 private:
  using Awaitable = boost::asio::awaitable<void>;

  // Requests.
  void OnObjectEvent(const kube::ResourceEvent& event);
  void OnObject(const nlohmann::json& object);
  // A GPUReset whose status another controller writes (intake.hpp, OtherStatusWriter): left
  // alone, said once in the log and the metrics; a job of ours for it writes no status.
  void LeaveToOtherExecutor(const ObjectIntake& intake, const std::string& name);
  void OnCliLine(std::string_view line, std::shared_ptr<AdminSocket::Reply> reply);
  void OnVerdictForAutoReset(const std::string& uuid);
  // Adds a job (or joins the one holding its GPU); returns the id of the job that will do it.
  std::string Enqueue(ResetJob job);
  void Kick();

  // The node's maintenance slot: one job at a time, each GPU's steps run by runner_.
  Awaitable RunJobs();
  Awaitable RunJob(ResetJob& job);
  void FinishJob(ResetJob& job);
  // Until the record is on disk at least as it was at version `wanted` (nullopt: as it is now;
  // a step that needs an earlier fact durable does not wait for later saves). False when a save
  // that covers it failed (read-only or full state dir; save_problem_ says why) or the module stops.
  boost::asio::awaitable<bool> SavedAtLeast(std::optional<uint64_t> wanted);
  // The module's health: degraded while the record cannot be written or reset.sock is missing.
  void UpdateModuleHealth();

  // NodeMaintenance: what the runner asks of the node (reset_runner.hpp).
  bool HealthRunning() const override;
  std::optional<Verdict> VerdictOf(const std::string& uuid) const override;
  GpuView Gpu(const std::string& uuid) const override;
  PodView Pods(const std::string& uuid) const override;
  std::string WriteJournal(const std::string& message, int priority, const std::string& uuid) override;
  void RequestRelease(const std::string& uuid, bool release, const std::string& why) override;
  void Evict(const std::string& pod_namespace, const std::string& pod_name) override;
  boost::asio::awaitable<gpu_inventory::GpuMaintenanceRead> Inspect(const std::string& uuid) override;
  boost::asio::awaitable<std::string> SetPersistence(const std::string& uuid, bool enabled) override;
  void RestorePersistence(const std::string& uuid) override;
  boost::asio::awaitable<CommandResult> RunResetCommand(const std::vector<std::string>& argv) override;
  void KillResetCommand() override;
  void Save() override { SaveBook(); }
  boost::asio::awaitable<bool> Persisted() override;
  boost::asio::awaitable<bool> JobRecorded(const std::string& job_id) override;
  std::string RecordPath() const override { return book_path_; }
  std::string RecordProblem() const override { return save_problem_; }
  void StepChanged(ResetJob& job) override;
  void Progress(const ResetJob& job, const std::string& line) override;
  void GpuEnded(const GpuReset& gpu) override;
  int64_t NowMs() const override;

  // Start, in two halves: the record is read on the pool (a slow or odd gpu-reset.json never
  // holds the loop), and the module takes no request until it is restored.
  void LoadBook();
  void ApplyBook(StateFileRead read);
  void Resume();
  // Runs `request` now, or once the record is restored (in the order requests came); `caller`:
  // the reset-gpu connection it answers, told when the module stops before taking it.
  void Intake(std::function<void()> request, std::shared_ptr<AdminSocket::Reply> caller = nullptr);

  // State and outputs.
  void SaveBook();
  void PublishState();     // coalesced: at most one GpuResetState queued
  void PublishStateNow();
  void AnnounceReleases();
  void WriteStatus(ResetJob& job);
  void SendStatus(const std::string& name);
  void OnStatusWritten(const std::string& name, const kube::Result& result);
  void RecordEvent(std::string_view type, std::string_view reason, const std::string& note);
  std::string DescribeGpu(const std::string& uuid) const;

  ModuleContext& context_;
  Config config_;
  std::string node_name_;
  std::string book_path_;
  std::string socket_path_;
  ResetBook book_;
  uint64_t book_version_ = 0;   // bumped by every change
  uint64_t saved_version_ = 0;  // the newest version on disk
  bool loading_ = false;        // gpu-reset.json is being read: not ready, requests held
  struct HeldRequest {
    std::function<void()> run;
    std::shared_ptr<AdminSocket::Reply> caller;
  };
  std::vector<HeldRequest> held_;  // requests that came while loading, in order
  // The record's version once each job accepted in this run was in it (a job loaded at start
  // is on disk already): what the hold waits for.
  std::map<std::string, uint64_t> accepted_version_;
  bool save_in_flight_ = false;
  std::string save_problem_;    // why the last save of the record failed ("" after a good one)
  std::string socket_problem_;  // why reset.sock could not be started ("" when it runs)

  std::shared_ptr<gpu_inventory::GpuMaintenance> maintenance_;
  std::shared_ptr<kube::KubeClient> kube_;
  std::shared_ptr<kube::Informer> objects_;
  std::string objects_key_;
  std::shared_ptr<kube::EventRecorder> events_;
  std::unique_ptr<AdminSocket> socket_;

  // The maintenance slot.
  std::unique_ptr<ResetRunner> runner_;
  bool running_ = false;
  bool stopping_ = false;
  std::function<void()> stop_done_;
  std::shared_ptr<RunningCommand> child_;
  ResetJob* current_job_ = nullptr;
  // CLI connections following a job (job id → replies).
  std::multimap<std::string, std::shared_ptr<AdminSocket::Reply>> followers_;
  // autoReset: the verdicts already acted on (uuid → since_unix_ms).
  std::map<std::string, int64_t> auto_seen_;

  // Status writes: one in flight per object; the latest wins.
  struct StatusSlot {
    std::string job_id;
    nlohmann::json status;
    bool in_flight = false;
    bool dirty = false;
    int failures = 0;
  };
  std::map<std::string, StatusSlot> status_;
  // Job ids ("GPUReset/<name>/<uid>") of objects another controller executes, while they exist.
  std::set<std::string, std::less<>> other_executor_;
  boost::asio::steady_timer status_retry_;
  boost::asio::steady_timer saved_wake_;  // SavedAtLeast waits on it; a finished save wakes it

  bool publish_pending_ = false;
  Gate lifetime_;
  MetricsRegistry::Series* resets_ok_;
  MetricsRegistry::Series* resets_failed_;
  MetricsRegistry::Series* resets_refused_;
  MetricsRegistry::Series* objects_other_executor_;
  MetricsRegistry::Series* queue_gauge_;
  MetricsRegistry::Series* last_overhead_seconds_;
  MetricsRegistry::Series* last_command_seconds_;
  std::vector<Subscription> subs_;
};

}  // namespace gns::gpu_reset
