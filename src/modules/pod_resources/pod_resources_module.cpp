// The pod-resources module.
#include "modules/pod_resources/pod_resources_module.hpp"

#include "loop/awaitables.hpp"
#include "loop/config_checks.hpp"
#include "loop/json_fields.hpp"
#include "modules/dra_compute_domain/messages.hpp"
#include "modules/dra_gpu/messages.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/informer.hpp"
#include "modules/kube/messages.hpp"

// GCC 12 at -O2 (GCC bug 109224) reports Asio's own coroutine frame new/delete pair as
// mismatched once both are inlined (as dra_module.cpp).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>

namespace gns::pod_resources {

namespace asio = boost::asio;
using nlohmann::json;
using std::chrono::milliseconds;

namespace {

// The kubelet records an allocation after Allocate returns: a List made in between does not
// show it. Lists tried (with growing waits) before an allocated device is given up on.
constexpr int kExpectAttempts = 5;
// A deleted pod the kubelet still lists is looked for again this many times (backoff up to retryMax).
constexpr int kDepartingAttempts = 12;

std::optional<std::string> AnnotationOf(const json& pod) {
  const json::json_pointer ptr("/metadata/annotations");
  if (!pod.contains(ptr)) return std::nullopt;
  const json& annotations = pod.at(ptr);
  if (!annotations.is_object()) return std::nullopt;
  const auto it = annotations.find(std::string(kDevicesAnnotation));
  if (it == annotations.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

}  // namespace

PodResourcesModule::Config PodResourcesModule::ParseConfig(ConfigMap& section, const SiteConfig& site) {
  Config config;
  config.socket = ReadSocketPath(section, "socket", "", /*allow_empty=*/true);
  if (config.socket.empty()) {
    config.socket = (std::filesystem::path(site.paths.kubelet_dir) / "pod-resources" / "kubelet.sock").string();
    if (const auto problem = SocketPathProblem(config.socket); !problem.empty()) {
      section.Fail("socket", "the default under paths.kubeletDir: " + problem);
    }
  }
  config.resource_names = section.StringList("resourceNames", config.resource_names);
  if (config.resource_names.empty()) section.Fail("resourceNames", "must name at least one resource");
  for (const auto& name : config.resource_names) {
    // "prefix*" names every resource that starts with the prefix (nvidia.com/mig-*): the prefix
    // must start a valid name.
    const std::string checked = name.ends_with('*') ? name.substr(0, name.size() - 1) + "x" : name;
    if (const auto problem = ExtendedResourceNameProblem(checked); !problem.empty()) {
      section.Fail("resourceNames", name.ends_with('*') ? "\"" + name + "\": " + problem : problem);
    }
  }
  config.call_timeout = section.Duration("callTimeout", milliseconds(100), milliseconds(60000), config.call_timeout);
  config.coalesce = section.Duration("coalesce", milliseconds(0), milliseconds(10000), config.coalesce);
  config.resync = section.Duration("resync", milliseconds(1000), milliseconds(86400000), config.resync);
  config.retry_max = section.Duration("retryMax", milliseconds(100), milliseconds(600000), config.retry_max);
  config.annotate = section.Bool("annotate", config.annotate);
  return config;
}

PodResourcesModule::PodResourcesModule(ModuleContext& context, const Config& config)
    : context_(context),
      config_(config),
      socket_(config.socket),
      resources_(config.resource_names.begin(), config.resource_names.end()),
      node_name_(context.Site().node_name),
      list_timer_(context.GetLoop().Io()),
      resync_timer_(context.GetLoop().Io()),
      list_backoff_(BackoffPolicy{std::min(milliseconds(250), config.retry_max), config.retry_max, 2.0, 0.5}),
      write_backoff_(BackoffPolicy{std::min(milliseconds(500), config.retry_max), config.retry_max, 2.0, 0.5}),
      write_timer_(context.GetLoop().Io()) {
  auto& m = context_.Metrics();
  const auto lists = [&m](const char* result) -> MetricsRegistry::Series& {
    return m.Counter("gpu_node_supervisor_pod_resources_lists_total", "PodResourcesLister List calls, by result",
                     {{"result", result}});
  };
  lists_ok_ = &lists("ok");
  lists_failed_ = &lists("error");
  problems_ = &m.Counter("gpu_node_supervisor_pod_resources_list_problems_total",
                         "Entries of List answers left out (malformed, unknown device IDs)");
  const auto writes = [&m](const char* result) -> MetricsRegistry::Series& {
    return m.Counter("gpu_node_supervisor_pod_resources_annotation_writes_total",
                     "dgxc.nvidia.com/devices annotation patches, by result", {{"result", result}});
  };
  writes_set_ = &writes("set");
  writes_removed_ = &writes("removed");
  writes_gone_ = &writes("pod_gone");
  writes_failed_ = &writes("error");
  pods_with_gpus_ = &m.Gauge("gpu_node_supervisor_pod_resources_pods_with_gpus", "Pods the kubelet reports holding GPUs");
}

PodResourcesModule::~PodResourcesModule() { lifetime_.Close(); }

// ---------------------------------------------------------------------------------- start/stop

void PodResourcesModule::Start() {
  if (node_name_.empty()) throw std::runtime_error("the node name is not set; the pod informer is scoped to it");
  auto& services = context_.GetServices();
  kube_ = services.Find<kube::KubeClient>();
  const auto informers = services.Find<kube::InformerRegistry>();
  if (!kube_ || !informers) {
    throw std::runtime_error("the kube module's client is not available (is the `kube` module enabled?)");
  }
  lister_ = std::make_unique<ListerClient>(context_.GetLoop(), socket_, config_.call_timeout);

  auto& bus = context_.GetBus();
  allocated_sub_ = bus.Subscribe<DevicesAllocated>([this](const DevicesAllocated& a) {
    if (!IsOurResource(resources_, a.resource_name)) return;
    // The map holds what a replica stands for: wait for that.
    for (const auto& id : a.device_ids) expected_.emplace(std::string(PhysicalDeviceId(id)), 0);
    RequestList("device-plugin Allocate");
  });
  dra_sub_ = bus.Subscribe<dra::DraComputeDomainState>([this](const dra::DraComputeDomainState& state) {
    std::set<std::string> claims;
    for (const auto& claim : state.prepared_claims) claims.insert(claim.uid + "/" + claim.state);
    OnPreparedClaims(prepared_claims_, std::move(claims));
  });
  dra_gpu_sub_ = bus.Subscribe<dra_gpu::DraGpuState>([this](const dra_gpu::DraGpuState& state) {
    std::set<std::string> claims;
    std::vector<PreparedGpuClaim> prepared;
    for (const auto& claim : state.prepared_claims) {
      claims.insert(claim.uid);
      prepared.push_back(PreparedGpuClaim{claim.namespace_name + "/" + claim.name, claim.devices});
    }
    // A claim just prepared holds its GPU now, before the kubelet lists its pod.
    if (prepared != prepared_gpus_) {
      prepared_gpus_ = std::move(prepared);
      PublishMap();
    }
    OnPreparedClaims(prepared_gpu_claims_, std::move(claims));
  });
  inventory_sub_ = bus.Subscribe<gpu_inventory::GpuInventory>([this](const gpu_inventory::GpuInventory& inventory) {
    std::set<std::string> known;
    GpuTopology topology;
    topology.known = true;
    for (const auto& gpu : inventory.gpus) {
      known.insert(gpu.uuid);
      for (const auto& mig : gpu.mig_devices) known.insert(mig.uuid);  // MIG strategies hand these out
      topology.Add(gpu);
    }
    if (known == known_gpus_ && topology == topology_) return;
    topology_ = std::move(topology);
    if (known == known_gpus_) {
      PublishMap();
      return;
    }
    known_gpus_ = std::move(known);
    RebuildView();
  });

  const kube::InformerSpec spec{kube::ResourcePath::Core("pods").Collection(), "", "spec.nodeName=" + node_name_};
  pods_key_ = spec.Key();
  pod_sub_ = bus.Subscribe<kube::ResourceEvent>([this](const kube::ResourceEvent& event) {
    if (event.informer_key == pods_key_ && event.object) OnPodEvent(event);
  });
  synced_sub_ = bus.Subscribe<kube::InformerSynced>([this](const kube::InformerSynced& synced) {
    if (synced.informer_key != pods_key_ || !synced.synced) return;
    PublishMap();
    Reconcile();
  });
  pods_ = informers->Acquire(spec);

  WatchSocketDirectory();
  context_.SetHealth(ModuleHealth::kDegraded, "no List answer yet from " + socket_);
  context_.Log().info("listing pod resources from {} (resources {}), pods of node {}", socket_,
                      fmt::join(config_.resource_names, ","), node_name_);
  // A bug that throws in the run ends it and is rethrown on the loop, as from a callback.
  asio::co_spawn(context_.GetLoop().Io(), ListLoop(lifetime_.Watch()), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  RequestList("start");
  ScheduleResync();
}

void PodResourcesModule::Stop(std::function<void()> done) {
  lifetime_.Renew();
  allocated_sub_ = {};
  dra_sub_ = {};
  dra_gpu_sub_ = {};
  inventory_sub_ = {};
  pod_sub_ = {};
  synced_sub_ = {};
  list_timer_.cancel();
  resync_timer_.cancel();
  write_timer_.cancel();
  if (socket_watcher_) socket_watcher_->Stop();
  socket_watcher_.reset();
  lister_.reset();  // cancels the calls in flight
  pods_.reset();
  kube_.reset();
  list_in_flight_ = false;
  timer_armed_ = false;
  writing_.clear();
  done();
}

// ---------------------------------------------------------------------------------- listing

void PodResourcesModule::RequestList(std::string_view why) {
  context_.Log().debug("List requested: {}", why);
  if (list_in_flight_) {
    list_again_ = true;
    return;
  }
  ArmListTimer(config_.coalesce);
}

void PodResourcesModule::ArmListTimer(milliseconds delay) {
  const auto due = std::chrono::steady_clock::now() + delay;
  // Coalesce: an earlier List already planned serves this trigger too.
  if (timer_armed_ && timer_due_ <= due) return;
  timer_armed_ = true;
  timer_due_ = due;
  list_timer_.expires_at(due);  // wakes ListDue, which waits again for the new time
}

asio::awaitable<void> PodResourcesModule::ListLoop(Gate::Ticket ticket) {
  // co_spawn begins the run a loop turn after Start: a module stopped (or destroyed) in between
  // must not be touched.
  if (!ticket) co_return;
  for (;;) {
    co_await ListDue(ticket);
    if (!ticket) co_return;  // stopped while it waited (a later Start has a run of its own)
    co_await ListOnce(ticket);
    if (!ticket) co_return;
  }
}

asio::awaitable<void> PodResourcesModule::ListDue(Gate::Ticket ticket) {
  for (;;) {
    if (!timer_armed_) list_timer_.expires_at(std::chrono::steady_clock::time_point::max());  // nothing planned
    boost::system::error_code ec;
    co_await list_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    // Stop (or the destructor) closed the ticket before it cancelled the timer.
    if (!ticket) co_return;
    if (!ec) break;
    // operation_aborted: ArmListTimer moved the time earlier; wait for the new one.
  }
  timer_armed_ = false;
}

asio::awaitable<void> PodResourcesModule::ListOnce(Gate::Ticket ticket) {
  if (!lister_) co_return;
  list_in_flight_ = true;
  list_again_ = false;
  // The allocatable count is answered on its own (it does not hold the List up).
  if (need_allocatable_) {
    lister_->GetAllocatableResources(lifetime_.Guard([this](CallOutcome<v1::AllocatableResourcesResponse> outcome) {
      OnAllocatable(std::move(outcome));
    }));
  }
  // Stop destroys the lister, which drops the call's outcome: the run is then dropped with it.
  auto list = [lister = lister_.get()](auto resume) { lister->List(std::move(resume)); };
  auto outcome = co_await AwaitCallback<CallOutcome<v1::ListPodResourcesResponse>>(std::move(list), ticket);
  OnList(std::move(outcome));
}

void PodResourcesModule::OnAllocatable(CallOutcome<v1::AllocatableResourcesResponse> outcome) {
  if (!outcome.ok) {
    context_.Log().debug("GetAllocatableResources on {}: {}", socket_, outcome.error);
    return;
  }
  need_allocatable_ = false;
  const auto count = CountAllocatable(outcome.response, resources_);
  if (count != allocatable_) {
    context_.Log().info("the kubelet can allocate {} device(s) of {}", count, fmt::join(config_.resource_names, ","));
  }
  allocatable_ = count;
  PublishMap();
}

void PodResourcesModule::OnList(CallOutcome<v1::ListPodResourcesResponse> outcome) {
  list_in_flight_ = false;
  if (!outcome.ok) {
    OnListFailed("List on " + socket_ + ": " + outcome.error);
    return;
  }
  lists_ok_->Inc();
  ++lists_;
  listed_at_ms_ =
      std::chrono::duration_cast<milliseconds>(context_.GetClock().WallNow().time_since_epoch()).count();
  if (failures_in_row_ > 0) {
    context_.Log().info("{} answers again (after {} failed List call(s))", socket_, failures_in_row_);
  }
  failures_in_row_ = 0;
  last_error_.clear();
  list_backoff_.Reset();
  context_.SetHealth(ModuleHealth::kOk);
  last_response_ = std::move(outcome.response);
  RebuildView();
  CheckExpected();
  if (list_again_) {
    list_again_ = false;
    ArmListTimer(config_.coalesce);
  }
}

void PodResourcesModule::OnListFailed(const std::string& error) {
  lists_failed_->Inc();
  ++failures_in_row_;
  need_allocatable_ = true;
  // One warning per distinct error (and a reminder every 20 attempts), not one per retry.
  if (error != last_error_ || failures_in_row_ % 20 == 1) {
    context_.Log().warn("{} (attempt {}); the GPU -> pod map keeps its last answer and annotations are left as they "
                        "are until the kubelet answers",
                        error, failures_in_row_);
  }
  last_error_ = error;
  context_.SetHealth(ModuleHealth::kDegraded, error);
  PublishMap();
  if (!socket_watcher_) WatchSocketDirectory();
  list_again_ = false;
  ArmListTimer(list_backoff_.Next());
}

void PodResourcesModule::WatchSocketDirectory() {
  const std::string directory = std::filesystem::path(socket_).parent_path().string();
  const std::string name = std::filesystem::path(socket_).filename().string();
  auto watcher = std::make_unique<DirWatcher>(
      context_.GetLoop().Io(), directory,
      [this, alive = lifetime_.Watch(), name](DirWatcher::Change change, const std::string& entry) {
        if (!alive) return;
        if (change == DirWatcher::Change::kCreated && entry == name) {
          need_allocatable_ = true;
          RequestList("the kubelet's socket appeared");
        } else if (change == DirWatcher::Change::kDirectoryGone) {
          // Watched again after the next failed List; not destroyed inside its own callback.
          context_.GetLoop().Post([this, alive] {
            if (alive) socket_watcher_.reset();
          });
        }
      });
  try {
    watcher->Start();
    socket_watcher_ = std::move(watcher);
  } catch (const std::exception& e) {
    // No directory yet (a kubelet that never served the API): the backoff retries cover it.
    context_.Log().debug("cannot watch {} yet: {}", directory, e.what());
  }
}

void PodResourcesModule::ScheduleResync() {
  resync_timer_.expires_after(config_.resync);
  resync_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    if (ec) return;
    // The informer cache is the truth again for pods whose write echo we may have missed.
    acked_.clear();
    RequestList("resync");
    ScheduleResync();
  }));
}

void PodResourcesModule::RebuildView() {
  if (!last_response_) return;
  KnownDevice known;
  if (!known_gpus_.empty()) known = [this](std::string_view id) { return known_gpus_.contains(std::string(id)); };
  view_ = ReadList(*last_response_, resources_, known);
  std::set<std::string> problems(view_.problems.begin(), view_.problems.end());
  for (const auto& problem : problems) {
    if (!logged_problems_.contains(problem)) {
      problems_->Inc();
      context_.Log().warn("pod resources from {}: {}", socket_, problem);
    }
  }
  logged_problems_ = std::move(problems);
  PublishMap();
  Reconcile();
}

void PodResourcesModule::CheckExpected() {
  // Pods the API deleted that the kubelet still lists (their containers are stopping): listed
  // again with backoff until they are gone, since no other event will say so — a GPU reset waits
  // on exactly this.
  int departing_most = -1;
  for (auto it = departing_.begin(); it != departing_.end();) {
    const bool listed = std::any_of(view_.pods.begin(), view_.pods.end(),
                                    [&](const PodView& pod) { return pod.Key() == it->first; });
    if (!listed || ++it->second >= kDepartingAttempts) {
      it = departing_.erase(it);
    } else {
      departing_most = std::max(departing_most, it->second);
      ++it;
    }
  }
  if (departing_most >= 0) {
    ArmListTimer(std::min(config_.retry_max, std::max(config_.coalesce, milliseconds(50)) * (1 << std::min(departing_most, 8))));
  }
  if (expected_.empty()) return;
  std::set<std::string> held;
  for (const auto& pod : view_.pods) {
    for (const auto& device : pod.devices) held.insert(device.id);
  }
  int most = 0;
  for (auto it = expected_.begin(); it != expected_.end();) {
    if (held.contains(it->first)) {
      it = expected_.erase(it);
    } else if (++it->second >= kExpectAttempts) {
      context_.Log().info("device {} was allocated but no pod holds it after {} List calls (the pod's admission may "
                          "have failed)",
                          it->first, it->second);
      it = expected_.erase(it);
    } else {
      most = std::max(most, it->second);
      ++it;
    }
  }
  if (!expected_.empty()) ArmListTimer(std::max(config_.coalesce, milliseconds(20)) * (1 << most));
}

// ---------------------------------------------------------------------------------- inputs

void PodResourcesModule::OnPreparedClaims(std::set<std::string>& held, std::set<std::string> claims) {
  if (claims == held) return;
  held = std::move(claims);
  RequestList("DRA prepared claims changed");
}

void PodResourcesModule::OnPodEvent(const kube::ResourceEvent& event) {
  const json& pod = *event.object;
  const std::string key = JsonStringAt(pod, "/metadata/namespace") + "/" + JsonStringAt(pod, "/metadata/name");
  bool echo = false;
  if (event.type == kube::ResourceEvent::Type::kDeleted) {
    acked_.erase(key);
    departing_.emplace(key, 0);
  } else if (const auto it = acked_.find(key); it != acked_.end()) {
    if (JsonStringAt(pod, "/metadata/resourceVersion") == it->second.resource_version) {
      acked_.erase(it);  // the watch shows our own write: the cache is current again
      echo = true;
    } else if (JsonStringAt(pod, "/metadata/uid") != it->second.uid) {
      acked_.erase(it);  // another pod under the same name
    }
  }
  // Our own annotation write changes nothing the kubelet reports.
  if (!echo) RequestList("pod " + key + " changed");
  PublishMap();  // a UID may have become known
  Reconcile();
}

// ---------------------------------------------------------------------------------- outputs

std::string PodResourcesModule::PodUid(const std::string& namespace_name, const std::string& name) const {
  if (!pods_) return {};
  const auto pod = pods_->Get(namespace_name + "/" + name);
  return pod ? JsonStringAt(*pod, "/metadata/uid") : std::string();
}

void PodResourcesModule::PublishMap() {
  GpuPodMap map;
  map.listed = lists_ > 0;
  map.fresh = map.listed && last_error_.empty();
  map.error = last_error_;
  map.listed_at_ms = listed_at_ms_;
  map.lists = lists_;
  map.allocatable = allocatable_;
  map.gpus = BuildGpuMap(view_, [this](const std::string& ns, const std::string& name) { return PodUid(ns, name); });
  map.claims = AllClaims(view_);
  auto indirect = BuildIndirectHolders(map.gpus, map.claims, prepared_gpus_, topology_,
                                       [this](const std::string& ns, const std::string& name) { return PodUid(ns, name); });
  map.via = std::move(indirect.via);
  map.pending = std::move(indirect.pending);
  map.unplaced = std::move(indirect.unplaced);
  // Each holder whose GPU cannot be told is said once (gpu-reset counts it against every GPU).
  std::set<std::string> unplaced;
  for (const auto& h : map.unplaced) {
    std::string line = (h.pod.empty() ? "" : "pod " + h.pod + " ") + (h.claim.empty() ? "" : "claim " + h.claim + " ") +
                       "device " + h.device + ": " + h.why;
    if (!logged_unplaced_.contains(line)) {
      // Before the first inventory this is expected for a moment at start: no warning then.
      context_.Log().log(topology_.known ? spdlog::level::warn : spdlog::level::info,
                         "{}; counted as a holder of every GPU until it can be placed", line);
    }
    unplaced.insert(std::move(line));
  }
  logged_unplaced_ = std::move(unplaced);
  std::size_t with_gpus = 0;
  for (const auto& pod : view_.pods) with_gpus += pod.devices.empty() ? 0 : 1;
  pods_with_gpus_->Set(static_cast<double>(with_gpus));
  // Publish what changed, not every List: the counters alone are no news.
  if (published_) {
    GpuPodMap a = map;
    GpuPodMap b = *published_;
    a.lists = b.lists = 0;
    a.listed_at_ms = b.listed_at_ms = 0;
    if (a == b) return;
  }
  published_ = map;
  context_.GetBus().Publish(std::move(map));
}

void PodResourcesModule::Reconcile() {
  if (!config_.annotate || !kube_ || !pods_ || !pods_->Synced()) return;
  // Only a fresh answer may remove annotations: a kubelet that does not answer says nothing.
  if (lists_ == 0 || !last_error_.empty() || writes_paused_) return;
  const auto desired = DesiredAnnotations(view_);
  std::map<std::string, PodAnnotationState> pods;
  for (const auto& [key, object] : pods_->Items()) {
    if (writing_.contains(key)) continue;
    PodAnnotationState state{JsonStringAt(*object, "/metadata/namespace"), JsonStringAt(*object, "/metadata/name"),
                             JsonStringAt(*object, "/metadata/uid"), AnnotationOf(*object)};
    if (!JsonStringAt(*object, "/metadata/deletionTimestamp").empty()) continue;  // going away: leave it be
    if (const auto acked = acked_.find(key); acked != acked_.end() && acked->second.uid == state.uid) {
      state.current = acked->second.value;
    }
    pods.emplace(key, std::move(state));
  }
  for (const auto& write : PlanAnnotationWrites(desired, pods)) Write(write);
}

void PodResourcesModule::Write(const AnnotationWrite& write) {
  writing_.insert(write.Key());
  const std::string path = kube::ResourcePath::Core("pods", write.namespace_name).Object(write.name);
  kube_->Patch(path, kube::PatchType::kMerge, AnnotationPatch(write), std::string(kName),
               lifetime_.Guard([this, write](kube::Result result) {
                 OnWritten(write, result);
               }));
}

void PodResourcesModule::OnWritten(const AnnotationWrite& write, const kube::Result& result) {
  writing_.erase(write.Key());
  if (result.Ok()) {
    write_backoff_.Reset();
    (write.value ? writes_set_ : writes_removed_)->Inc();
    acked_[write.Key()] = Acked{JsonStringAt(result.object, "/metadata/uid"), write.value,
                                JsonStringAt(result.object, "/metadata/resourceVersion")};
    if (write.value) {
      context_.Log().info("annotated pod {}: {}={}", write.Key(), kDevicesAnnotation, *write.value);
    } else {
      context_.Log().info("removed {} from pod {} (it holds no GPU)", kDevicesAnnotation, write.Key());
    }
    Reconcile();
    return;
  }
  if (result.http_status == 404 || result.http_status == 409) {
    // Deleted, or replaced by a pod of the same name (the UID in the patch did not match): the
    // informer brings the new state and the next plan handles it.
    writes_gone_->Inc();
    context_.Log().info("pod {} changed under the annotation write ({}): {}", write.Key(), result.http_status,
                        result.error);
    Reconcile();
    return;
  }
  writes_failed_->Inc();
  const auto delay = write_backoff_.Next();
  context_.Log().warn("cannot annotate pod {} (HTTP {}): {}; retrying in {} ms", write.Key(), result.http_status,
                      result.error, delay.count());
  if (writes_paused_) return;
  writes_paused_ = true;
  write_timer_.expires_after(delay);
  write_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    if (ec) return;
    writes_paused_ = false;
    Reconcile();
  }));
}

}  // namespace gns::pod_resources
