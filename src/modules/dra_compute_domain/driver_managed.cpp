// Driver-managed IMEX on this node: domains, registration, files, daemons.
#include "modules/dra_compute_domain/driver_managed.hpp"

#include "loop/awaitables.hpp"
#include "loop/json_fields.hpp"
#include "loop/state_file.hpp"

#include "modules/dra_compute_domain/driver_paths.hpp"
#include "modules/kube/api/client.hpp"
#include "modules/kube/api/informer.hpp"
#include "modules/kube/messages.hpp"

// GCC 12 at -O2 (GCC bug 109224) reports Asio's own coroutine frame new/delete pair as
// mismatched once both are inlined (as dra_module.cpp).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <boost/asio/co_spawn.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>

namespace gns::dra {

namespace asio = boost::asio;
using nlohmann::json;
using std::chrono::milliseconds;

namespace {

// The calls below have no deadline of their own: the client's bounds (request_timeout per
// attempt, its RetryPolicy) end them, and a failed one is retried with the domain's backoff.
const kube::Deadline kClientBounds{};

// resourceVersions are opaque, but etcd's (and the simulator's) are increasing integers: an
// object older than the one we hold (a late watch event after our own write) is skipped; any
// other shape is taken as newer.
bool OlderVersion(const std::string& got, const std::string& have) {
  const auto digits = [](const std::string& v) {
    return !v.empty() && v.size() < 19 && v.find_first_not_of("0123456789") == std::string::npos;
  };
  return digits(got) && digits(have) && std::stoull(got) < std::stoull(have);
}

// The hosts file is bind-mounted over the running daemon's /etc/hosts: the mount holds the
// inode, so a rename would leave the daemon reading the old file. Once it exists it is
// rewritten in place (truncate, write, fsync), as upstream's daemon rewrites /etc/hosts; a
// resolver reading at that instant may see it short, and IMEX retries its connections.
std::string WriteHostsFile(const std::string& path, const std::string& content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) return "open " + path + ": " + std::strerror(errno);
    const auto r = WriteFileAtomically(path, content, 0644);
    return r ? std::string{} : r.error;
  }
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string error = "write " + path + ": " + std::strerror(errno);
      ::close(fd);
      return error;
    }
    done += static_cast<std::size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const std::string error = synced ? std::string{} : "fsync " + path + ": " + std::strerror(errno);
  ::close(fd);
  return error;
}

std::string DomainsPath(const std::string& ns) {
  return kube::ResourcePath::Grouped("resource.nvidia.com", "v1beta1", "computedomains", ns).Collection();
}

std::string CliquesPath(const std::string& ns) {
  return kube::ResourcePath::Grouped("resource.nvidia.com", "v1beta1", "computedomaincliques", ns).Collection();
}

// Whether `got` is to be kept over `have` (see OlderVersion).
bool NotOlder(const json& got, const std::shared_ptr<const json>& have) {
  return !have || !OlderVersion(JsonStringAt(got, "/metadata/resourceVersion"), JsonStringAt(*have, "/metadata/resourceVersion"));
}

}  // namespace

DriverManagedSettings ParseDriverManagedSection(ConfigMap& module_section) {
  DriverManagedSettings s;
  auto section = module_section.Section("driverManaged");
  s.daemon.daemon_path = section.String("imexDaemonPath", "/usr/bin/nvidia-imex");
  s.daemon.ctl_path = section.String("imexCtlPath", "/usr/bin/nvidia-imex-ctl");
  for (const char* key : {"imexDaemonPath", "imexCtlPath"}) {
    const std::string& path = std::string_view(key) == "imexDaemonPath" ? s.daemon.daemon_path : s.daemon.ctl_path;
    if (path.empty() || path.front() != '/') section.Fail(key, "must be an absolute path, got \"" + path + "\"");
  }
  s.server_port = static_cast<uint16_t>(section.Int("serverPort", 1, 65535, 50000));
  s.cmd_port = static_cast<uint16_t>(section.Int("cmdPort", 1, 65535, 50005));
  if (s.server_port == s.cmd_port) section.Fail("cmdPort", "must differ from serverPort");
  s.node_address = section.String("nodeAddress", "");
  s.ready_wait = section.Duration("readyWait", milliseconds(0), milliseconds(30000), milliseconds(10000));
  s.daemon.probe_interval = section.Duration("readyProbeInterval", milliseconds(50), milliseconds(60000),
                                             milliseconds(1000));
  s.daemon.health_interval = section.Duration("healthProbeInterval", milliseconds(1000), milliseconds(3600000),
                                              milliseconds(30000));
  s.daemon.ctl_timeout = section.Duration("ctlTimeout", milliseconds(100), milliseconds(60000), milliseconds(5000));
  s.daemon.stop_grace = section.Duration("stopGrace", milliseconds(100), milliseconds(60000), milliseconds(5000));
  s.daemon.restart.initial =
      section.Duration("restartInitial", milliseconds(10), milliseconds(60000), milliseconds(1000));
  s.daemon.restart.max = section.Duration("restartMax", milliseconds(100), milliseconds(3600000), milliseconds(60000));
  if (s.daemon.restart.max < s.daemon.restart.initial) section.Fail("restartMax", "must not be below restartInitial");
  section.Finish();
  return s;
}

struct DriverManagedDomains::Waiter {
  std::function<void(DomainVerdict)> done;
  std::unique_ptr<boost::asio::steady_timer> timer;
};

struct DriverManagedDomains::Domain {
  explicit Domain(BackoffPolicy policy) : backoff(policy) {}
  std::string uid;
  std::string ns;
  std::string name;
  std::map<std::string, RecordedClaim> claims;
  std::string dir;
  std::shared_ptr<kube::Informer> informer;
  std::string informer_key;
  std::shared_ptr<const json> object;  // the latest state seen (watch or our own write)
  // ComputeDomainCliques: the clique object this node registers in (made for `clique_id`).
  std::string clique_id;
  std::string clique_name;
  std::shared_ptr<kube::Informer> clique_informer;
  std::string clique_informer_key;
  std::shared_ptr<const json> clique_object;  // the latest state seen
  std::unique_ptr<ImexDaemon> daemon;
  bool active = false;
  bool leaving = false;
  bool gone = false;  // the ComputeDomain was deleted: nothing to deregister from
  bool labelled = false;
  bool entry_busy = false;
  bool entry_again = false;
  Backoff backoff;
  uint64_t retry_epoch = 0;  // bumped to drop the retries already scheduled
  std::string written_config, written_map, written_hosts;
  bool files_busy = false;
  bool files_again = false;
  std::vector<std::shared_ptr<Waiter>> waiters;
  std::string error;
  int teardown_step = 0;
  std::string Label() const { return ns + "/" + name; }
  std::string Path() const { return DomainsPath(ns) + "/" + name; }
  std::string CliquePath(const std::string& object_name) const { return CliquesPath(ns) + "/" + object_name; }
  bool Deleting() const {
    return object && object->contains(json::json_pointer("/metadata/deletionTimestamp")) &&
           !object->at(json::json_pointer("/metadata/deletionTimestamp")).is_null();
  }
};

DriverManagedDomains::DriverManagedDomains(ModuleContext& context, DriverManagedSettings settings,
                                           std::shared_ptr<kube::KubeClient> client,
                                           std::shared_ptr<kube::InformerRegistry> informers)
    : context_(context),
      settings_(std::move(settings)),
      client_(std::move(client)),
      informers_(std::move(informers)),
      field_manager_(EntryFieldManager(settings_.node_name)),
      node_address_(settings_.node_address),
      record_file_(RecordFile(settings_.state_dir)) {
  events_sub_ = context_.GetBus().Subscribe<kube::ResourceEvent>(
      [this](const kube::ResourceEvent& event) { OnEvent(event); });
}

DriverManagedDomains::~DriverManagedDomains() { lifetime_.Close(); }

// ---------------------------------------------------------------------------------- start

std::string DriverManagedDomains::RecordFile(const std::string& state_dir) {
  return JoinPath(state_dir, "domains.json");
}

void DriverManagedDomains::Load(DomainRecordLoad loaded) {
  switch (loaded.status) {
    case RecordLoad::kLoaded:
      loaded_ = std::move(loaded.record);
      context_.Log().info("driver-managed IMEX: {} domain(s) in {}", loaded_.domains.size(), record_file_);
      break;
    case RecordLoad::kMissing:
      loaded_ = {};
      break;
    case RecordLoad::kCorrupt: {
      loaded_ = {};
      // A name of its own: an earlier corrupt record is evidence too.
      const auto moved = MoveStateFileAside(
          record_file_,
          std::chrono::duration_cast<std::chrono::seconds>(context_.GetClock().WallNow().time_since_epoch()).count());
      if (!moved.ok) throw std::runtime_error("domain record " + loaded.error + " and cannot be moved aside: " + moved.error);
      const std::string& aside = moved.moved_to;
      context_.Log().error("driver-managed IMEX: the domain record was corrupt ({}); moved to {}; starting with no "
                           "domains (check the Node's {} label and the domains' status.nodes by hand)",
                           loaded.error, aside, kComputeDomainLabel);
      break;
    }
    case RecordLoad::kUnreadable:
      throw std::runtime_error("cannot read the domain record " + record_file_ + ": " + loaded.error);
  }
}

void DriverManagedDomains::Resume(const std::vector<std::string>& prepared_claim_uids) {
  const std::set<std::string> prepared(prepared_claim_uids.begin(), prepared_claim_uids.end());
  for (const auto& [uid, recorded] : loaded_.domains) {
    DomainPtr d = Ensure(uid, recorded.namespace_name, recorded.name);
    d->claims = recorded.claims;
    // A claim attached but never answered as prepared may have been deleted meanwhile (its pod
    // gone while we were down): ask the API, so no registration outlives its last claim.
    std::vector<std::pair<std::string, RecordedClaim>> unsure;
    for (const auto& [cuid, claim] : d->claims) {
      if (prepared.count(cuid) == 0) unsure.emplace_back(cuid, claim);
    }
    if (unsure.empty()) {
      ResumeOrTeardown(d);
      continue;
    }
    Spawn(ResumeDomain(d, std::move(unsure), lifetime_.Watch()));
  }
  loaded_ = {};
}

asio::awaitable<void> DriverManagedDomains::ResumeDomain(DomainPtr d,
                                                         std::vector<std::pair<std::string, RecordedClaim>> unsure,
                                                         Gate::Ticket ticket) {
  // co_spawn begins this a loop turn after Resume: the owner may be gone by now.
  if (!ticket) co_return;
  // Every claim is asked at once (a restart does not wait a round trip per claim); the answers
  // are read in the order asked.
  std::vector<std::shared_ptr<Pending<kube::Result>>> answers;
  for (const auto& [cuid, claim] : unsure) {
    const std::string path =
        kube::ResourcePath::Grouped("resource.k8s.io", "v1", "resourceclaims", claim.namespace_name).Object(claim.name);
    auto answer = std::make_shared<Pending<kube::Result>>(context_.GetLoop().Io());
    ++api_requests_;
    client_->Get(path, [answer](kube::Result r) { answer->Complete(std::move(r)); });
    answers.push_back(std::move(answer));
  }
  for (std::size_t i = 0; i < unsure.size(); ++i) {
    const std::shared_ptr<Pending<kube::Result>>& answer = answers[i];
    kube::Result r = co_await Pending<kube::Result>::Wait(answer);
    // A Pending takes no ticket: the owner may have gone while this waited.
    if (!ticket) co_return;
    const std::string& cuid = unsure[i].first;
    const bool gone = r.http_status == 404 || (r.Ok() && JsonStringAt(r.object, "/metadata/uid") != cuid);
    if (gone) {
      context_.Log().info("driver-managed IMEX: claim uid {} of ComputeDomain {} is gone: detached", cuid, d->Label());
      d->claims.erase(cuid);
    }
  }
  ResumeOrTeardown(d);
}

void DriverManagedDomains::ResumeOrTeardown(const DomainPtr& d) {
  if (d->claims.empty()) {
    context_.Log().info("driver-managed IMEX: ComputeDomain {} has no claims left on this node: tearing down",
                        d->Label());
    d->leaving = true;
    Persist([](std::string) {});
    Teardown(d);
  } else {
    context_.Log().info("driver-managed IMEX: resuming ComputeDomain {} ({} claim(s))", d->Label(), d->claims.size());
    Activate(d);
  }
}

void DriverManagedDomains::Spawn(asio::awaitable<void> run) {
  // A bug that throws in a run ends it and is rethrown on the loop, as from a callback.
  asio::co_spawn(context_.GetLoop().Io(), std::move(run), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
}

void DriverManagedDomains::SetClique(const std::string& clique_id) {
  if (clique_id == clique_id_) return;
  clique_id_ = clique_id;
  for (auto& [uid, d] : domains_) {
    if (d->active && !d->leaving) SyncEntry(d);
  }
}

// ---------------------------------------------------------------------------------- attach

DriverManagedDomains::DomainPtr DriverManagedDomains::Ensure(const std::string& uid, const std::string& ns,
                                                             const std::string& name) {
  auto& slot = domains_[uid];
  if (!slot) {
    slot = std::make_shared<Domain>(settings_.api_retry);
    slot->uid = uid;
    slot->ns = ns;
    slot->name = name;
    slot->dir = JoinPath(JoinPath(settings_.state_dir, "domains"), uid);
  }
  return slot;
}

void DriverManagedDomains::Attach(const std::string& claim_uid, const std::string& claim_namespace,
                                  const std::string& claim_name, const ComputeDomainInfo& domain,
                                  std::function<void(DomainVerdict)> done) {
  if (stopping_) {
    done({DomainVerdict::Kind::kNotReady, "the plugin is stopping"});
    return;
  }
  for (const auto& [uid, other] : domains_) {
    if (uid == domain.uid) continue;
    // One IMEX channel set per node: the node serves one domain at a time.
    done({DomainVerdict::Kind::kNotReady, "this node serves ComputeDomain " + other->Label() + " (UID " + uid +
                                              ") until its last claim is unprepared" +
                                              (other->leaving ? " (it is being torn down)" : "")});
    return;
  }
  DomainPtr d = Ensure(domain.uid, domain.namespace_name, domain.name);
  if (d->leaving) {
    done({DomainVerdict::Kind::kNotReady,
          "ComputeDomain " + d->Label() + " is being torn down on this node (its last claim was unprepared)"});
    return;
  }
  auto answer = [this, alive = lifetime_.Watch(), d, done = std::move(done)](std::string error) mutable {
    if (!alive) return;
    if (!error.empty()) {
      done({DomainVerdict::Kind::kNotReady, "cannot record the domain on this node: " + error});
      return;
    }
    if (!d->active) Activate(d);
    DomainVerdict verdict = Verdict(*d);
    if (verdict.kind != DomainVerdict::Kind::kNotReady || settings_.ready_wait.count() == 0 || stopping_) {
      done(std::move(verdict));
      return;
    }
    auto waiter = std::make_shared<Waiter>();
    waiter->done = std::move(done);
    waiter->timer = std::make_unique<boost::asio::steady_timer>(context_.GetLoop().Io(), settings_.ready_wait);
    waiter->timer->async_wait([this, alive, d, w = std::weak_ptr<Waiter>(waiter)](const boost::system::error_code& ec) {
      if (ec || !alive) return;
      auto waiter = w.lock();
      if (!waiter) return;
      std::erase(d->waiters, waiter);
      if (auto fn = std::move(waiter->done)) fn(Verdict(*d));
    });
    d->waiters.push_back(std::move(waiter));
  };
  if (d->claims.count(claim_uid) != 0) {
    answer({});
    return;
  }
  d->claims[claim_uid] = RecordedClaim{claim_namespace, claim_name};
  Persist(std::move(answer));
}

DomainVerdict DriverManagedDomains::Verdict(const Domain& d) const {
  using Kind = DomainVerdict::Kind;
  const std::string ref = "ComputeDomain " + d.Label();
  if (d.leaving) return {Kind::kNotReady, ref + " is being torn down on this node"};
  if (d.gone) return {Kind::kNotReady, ref + " was deleted"};
  const std::string where =
      settings_.cliques ? "ComputeDomainClique " + d.ns + "/" + CliqueObjectName(d.uid, clique_id_) + " of " + ref : ref;
  if (!d.object) {
    return {Kind::kNotReady, "registering this node in " + where + (d.error.empty() ? "" : " (last error: " + d.error + ")")};
  }
  const auto registered = Registered(d);
  if (!registered.ok()) return {Kind::kNotReady, where + ": " + registered.error};
  const DomainNode* me = FindNode(registered.nodes, settings_.node_name);
  if (me == nullptr) {
    return {Kind::kNotReady, "registering this node in " + where + (d.error.empty() ? "" : " (last error: " + d.error + ")")};
  }
  // The domain's clique and its Ready count come from status.nodes: the nodes' own entries
  // (gate off) or the controller's mirror of the clique objects (gate on).
  const auto parsed = ParseDomainNodes(*d.object);
  if (!parsed.ok()) return {Kind::kNotReady, ref + ": " + parsed.error};
  if (parsed.nodes.empty()) {
    return {Kind::kNotReady, ref + " is not Ready yet: the controller has not listed its nodes in status.nodes yet"};
  }
  const std::string clique = DomainClique(parsed.nodes);
  if (clique != clique_id_) {
    return {Kind::kRefused, "this node's NVLink clique \"" + clique_id_ + "\" is not " + ref + "'s clique \"" + clique +
                                "\" (of node " + parsed.nodes.front().name +
                                ", the first to register): IMEX cannot span cliques; schedule the workload onto "
                                "nodes of clique \"" + clique + "\""};
  }
  if (JsonStringAt(*d.object, "/status/status") == "Ready") {
    // The domain's verdict is the controller's; this node's daemon must be ready too (a domain
    // that was Ready before this node joined, or one whose numNodes is 0).
    if (me->Ready()) return {Kind::kReady, ref + " is Ready"};
    return {Kind::kNotReady, ref + " is Ready, but this node's IMEX daemon is not ready yet"};
  }
  std::size_t ready = 0;
  for (const auto& n : CliquePeers(parsed.nodes, clique)) ready += n.Ready() ? 1 : 0;
  const json num = d.object->value(json::json_pointer("/spec/numNodes"), json(0));
  return {Kind::kNotReady, ref + " is not Ready yet: " + std::to_string(ready) + " of " +
                               (num.is_number_integer() ? std::to_string(num.get<int64_t>()) : "?") +
                               " node(s) ready (this node: " + (me->Ready() ? "Ready" : "NotReady") + ")"};
}

void DriverManagedDomains::AnswerWaiters(const DomainPtr& d, bool at_deadline) {
  if (d->waiters.empty()) return;
  const DomainVerdict verdict = Verdict(*d);
  if (verdict.kind == DomainVerdict::Kind::kNotReady && !at_deadline) return;
  auto waiters = std::move(d->waiters);
  d->waiters.clear();
  for (auto& w : waiters) {
    w->timer->cancel();
    if (auto fn = std::move(w->done)) fn(verdict);
  }
}

// ---------------------------------------------------------------------------------- activate

void DriverManagedDomains::Activate(const DomainPtr& d) {
  d->active = true;
  const kube::InformerSpec spec{DomainsPath(d->ns), "", "metadata.name=" + d->name};
  d->informer_key = spec.Key();
  api_requests_ += 2;  // its list and its watch
  d->informer = informers_->Acquire(spec);
  if (auto cached = d->informer->Get(d->ns + "/" + d->name)) OnDomainObject(d, cached);
  WatchClique(d);
  Label(d, true);
  Spawn(Register(d, lifetime_.Watch()));
}

// The node's address (read once), then its entry.
asio::awaitable<void> DriverManagedDomains::Register(DomainPtr d, Gate::Ticket ticket) {
  if (!ticket) co_return;
  const std::string error = co_await EnsureAddress(ticket);
  if (d->leaving) co_return;
  if (!error.empty()) {
    d->error = error;
    RetryLater(d, [this, d] { Spawn(Register(d, lifetime_.Watch())); });
    co_return;
  }
  SyncEntry(d);
}

asio::awaitable<std::string> DriverManagedDomains::EnsureAddress(Gate::Ticket ticket) {
  if (!node_address_.empty()) co_return std::string{};
  const std::string path = kube::ResourcePath::Core("nodes").Object(settings_.node_name);
  ++api_requests_;
  const kube::Result r = co_await client_->Get(path, kClientBounds, ticket);
  if (!r.Ok()) co_return "cannot read Node " + settings_.node_name + " for its address: " + r.error;
  const json addresses = r.object.value(json::json_pointer("/status/addresses"), json::array());
  for (const auto& a : addresses) {
    if (a.is_object() && a.value("type", "") == "InternalIP" && a.value("address", "") != "") {
      node_address_ = a.value("address", "");
      break;
    }
  }
  if (node_address_.empty()) {
    co_return "Node " + settings_.node_name +
        " has no InternalIP in status.addresses (set modules.dra-compute-domain.imex.nodeAddress)";
  }
  context_.Log().info("driver-managed IMEX: this node's IMEX address is {}", node_address_);
  co_return std::string{};
}

void DriverManagedDomains::OnEvent(const kube::ResourceEvent& event) {
  for (auto& [uid, d] : domains_) {
    if (!event.object) continue;
    if (!d->clique_informer_key.empty() && event.informer_key == d->clique_informer_key) {
      if (JsonStringAt(*event.object, "/metadata/name") != d->clique_name) continue;
      if (event.type == kube::ResourceEvent::Type::kDeleted) {
        d->clique_object.reset();
        // Deleted under us (by hand, or by the controller once the domain is going): made again
        // by this node's next apply, unless the node leaves or the domain goes.
        if (!d->leaving && !d->gone && !d->Deleting() && !stopping_) {
          context_.Log().warn("driver-managed IMEX: ComputeDomainClique {}/{} was deleted: registering again", d->ns,
                              d->clique_name);
          SyncEntry(d);
        }
        return;
      }
      OnCliqueObject(d, event.object);
      return;
    }
    if (event.informer_key != d->informer_key) continue;
    if (JsonStringAt(*event.object, "/metadata/uid") != d->uid) continue;  // a namesake
    if (event.type == kube::ResourceEvent::Type::kDeleted) {
      context_.Log().warn("driver-managed IMEX: ComputeDomain {} was deleted", d->Label());
      d->gone = true;
      d->object.reset();
      AnswerWaiters(d, true);
      return;
    }
    OnDomainObject(d, event.object);
    return;
  }
}

void DriverManagedDomains::OnDomainObject(const DomainPtr& d, std::shared_ptr<const json> object) {
  if (JsonStringAt(*object, "/metadata/uid") != d->uid) return;
  // Keep the newer of the watch's object and our own write's answer (a newer one already
  // holds our write).
  const bool newer = NotOlder(*object, d->object);
  if (newer) {
    d->object = std::move(object);
    d->gone = false;
  }
  if (d->leaving || stopping_) return;
  if (!settings_.cliques) CheckEntry(d);
  if (!newer) return;
  RenderFiles(d);
  AnswerWaiters(d, false);
}

void DriverManagedDomains::WatchClique(const DomainPtr& d) {
  if (!settings_.cliques || clique_id_.empty() || d->clique_id == clique_id_) return;
  // A changed clique (rare: a fabric change) moves the node to the new clique's object; the
  // entry in the old one is withdrawn at teardown, which withdraws from every clique object of
  // the domain.
  d->clique_id = clique_id_;
  d->clique_name = CliqueObjectName(d->uid, clique_id_);
  d->clique_object.reset();
  const kube::InformerSpec spec{CliquesPath(d->ns), "", "metadata.name=" + d->clique_name};
  d->clique_informer_key = spec.Key();
  api_requests_ += 2;  // its list and its watch
  d->clique_informer = informers_->Acquire(spec);
  if (auto cached = d->clique_informer->Get(d->ns + "/" + d->clique_name)) OnCliqueObject(d, cached);
}

void DriverManagedDomains::OnCliqueObject(const DomainPtr& d, std::shared_ptr<const json> object) {
  if (JsonStringAt(*object, "/metadata/name") != d->clique_name) return;
  const bool newer = NotOlder(*object, d->clique_object);
  if (newer) d->clique_object = std::move(object);
  if (d->leaving || stopping_) return;
  CheckEntry(d);
  if (!newer) return;
  RenderFiles(d);
  AnswerWaiters(d, false);
}

DomainNodesParse DriverManagedDomains::Registered(const Domain& d) const {
  if (settings_.cliques) return d.clique_object ? ParseCliqueDaemons(*d.clique_object) : DomainNodesParse{};
  return d.object ? ParseDomainNodes(*d.object) : DomainNodesParse{};
}

DomainNode DriverManagedDomains::Me(const Domain& d) const {
  DomainNode me;
  me.name = settings_.node_name;
  me.ip_address = node_address_;
  me.clique_id = clique_id_;
  me.status = std::string(d.daemon && d.daemon->Ready() ? kNodeReady : kNodeNotReady);
  return me;
}

// Our entry must say what is true: missing (someone removed it) or stale → write it again.
// (A duplicate index from a concurrent registration counts as stale: see ResolveIndices.)
void DriverManagedDomains::CheckEntry(const DomainPtr& d) {
  if (node_address_.empty()) return;
  const auto parsed = Registered(*d);
  if (parsed.ok() && RegisterNode(parsed.nodes, Me(*d)).changed) SyncEntry(d);
}

// ---------------------------------------------------------------------------------- API writes

void DriverManagedDomains::Label(const DomainPtr& d, bool set) { Spawn(WriteLabel(d, set, lifetime_.Watch())); }

asio::awaitable<void> DriverManagedDomains::WriteLabel(DomainPtr d, bool set, Gate::Ticket ticket) {
  if (!ticket) co_return;
  if (set && d->leaving) co_return;
  const std::string path = kube::ResourcePath::Core("nodes").Object(settings_.node_name);
  if (!set) {
    // Removed only while it names this domain (another domain's may have replaced it).
    ++api_requests_;
    const kube::Result r = co_await client_->Get(path, kClientBounds, ticket);
    if (r.http_status == 404) {
      if (d->teardown_step == 3) TeardownStep(d);
      co_return;
    }
    if (!r.Ok()) {
      RetryLater(d, [this, d] { Label(d, false); });
      co_return;
    }
    const json labels = r.object.value(json::json_pointer("/metadata/labels"), json::object());
    if (!labels.is_object() || labels.value(std::string(kComputeDomainLabel), std::string()) != d->uid) {
      d->labelled = false;
      if (d->teardown_step == 3) TeardownStep(d);
      co_return;
    }
  }
  json labels = json::object();
  labels[std::string(kComputeDomainLabel)] = set ? json(d->uid) : json(nullptr);
  const json body{{"metadata", {{"labels", labels}}}};
  const std::string manager = "gpu-node-supervisor";
  ++api_requests_;
  const kube::Result r = co_await client_->Patch(path, kube::PatchType::kMerge, body, manager, kClientBounds, ticket);
  if (!r.Ok()) {
    context_.Log().warn("driver-managed IMEX: cannot {} label {} on Node {}: {}", set ? "set" : "remove",
                        kComputeDomainLabel, settings_.node_name, r.error);
    RetryLater(d, [this, d, set] { Label(d, set); });
    co_return;
  }
  d->labelled = set;
  if (!set && d->teardown_step == 3) TeardownStep(d);
}

// The node's entry in status.nodes is written with server-side apply on the status
// subresource, under a field manager of this node's own: status.nodes is a list-map keyed by
// `name` (the CRD declares it so, as upstream's), so each node owns its entry and no write
// conflicts with another node's or waits for a fresh read. The applied configuration is the
// whole intent of this node: its entry, or (leaving) nothing, which removes the entry the
// manager owned. `force`: this node is the only rightful writer of its entry.
void DriverManagedDomains::SyncEntry(const DomainPtr& d) {
  if (stopping_ && !d->leaving) return;
  // Registered only with the node's clique known (right after a start gpu-inventory may not
  // have read it yet): SetClique writes the entry then. An entry with an empty clique would
  // take this node out of its peers' maps.
  if (!d->leaving && clique_id_.empty()) return;
  if (!d->leaving) WatchClique(d);
  if (d->entry_busy) {
    d->entry_again = true;
    return;
  }
  d->entry_busy = true;
  // Each write ends in SyncEntryDone (which clears entry_busy), whatever its outcome.
  if (!settings_.cliques) {
    Spawn(ApplyEntry(d, lifetime_.Watch()));
  } else if (d->leaving) {
    Spawn(WithdrawFromCliques(d, lifetime_.Watch()));
  } else {
    Spawn(ApplyCliqueEntry(d, lifetime_.Watch()));
  }
}

asio::awaitable<void> DriverManagedDomains::ApplyEntry(DomainPtr d, Gate::Ticket ticket) {
  if (!ticket) co_return;
  const json body_meta{{"name", d->name}, {"namespace", d->ns}};
  json body{{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "ComputeDomain"}, {"metadata", body_meta}};
  DomainNode me;
  if (!d->leaving) {
    // The index from the latest list seen (the informer's or our last write's answer): the
    // lowest free one, or ours resolved against concurrent registrations (ResolveIndices).
    std::vector<DomainNode> seen;
    if (d->object) {
      auto parsed = ParseDomainNodes(*d->object);
      if (parsed.ok()) seen = std::move(parsed.nodes);
    }
    me = RegisterNode(seen, Me(*d)).me;
    body["status"]["nodes"] = NodesToJson({me});
  }
  // What this write is (a teardown may start while a registration is in flight: its answer is
  // still a registration's; the withdrawal queued behind it follows through entry_again).
  const bool withdrawal = d->leaving;
  const std::string path = d->Path();
  ++api_requests_;
  kube::Result r =
      co_await client_->PatchStatus(path, kube::PatchType::kApply, body, field_manager_, kClientBounds, ticket,
                                    /*force=*/true);
  if (r.http_status == 404) {
    d->gone = true;
    SyncEntryDone(d, d->leaving, "ComputeDomain " + d->Label() + " not found");
    co_return;
  }
  if (!r.Ok()) {
    SyncEntryDone(d, false, "cannot apply this node's entry in ComputeDomain " + d->Label() + " status: " + r.error);
    co_return;
  }
  if (JsonStringAt(r.object, "/metadata/uid") != d->uid) {
    // Deleted and recreated under the same name: not the domain our claims name. What we just
    // wrote there is withdrawn (best effort, not awaited: its own nodes' controller judges it).
    d->gone = true;
    if (!d->leaving) {
      const json nothing{{"apiVersion", "resource.nvidia.com/v1beta1"},
                         {"kind", "ComputeDomain"},
                         {"metadata", body_meta}};
      ++api_requests_;
      client_->PatchStatus(path, kube::PatchType::kApply, nothing, field_manager_, [](kube::Result) {}, true);
    }
    SyncEntryDone(d, d->leaving, "ComputeDomain " + d->Label() + " now has another UID");
    co_return;
  }
  if (withdrawal) {
    const auto parsed = ParseDomainNodes(r.object);
    if (parsed.ok() && FindNode(parsed.nodes, settings_.node_name) != nullptr) {
      // Still there: an entry this manager never owned (written by an update, e.g. by an
      // earlier version of this plugin). Removed by position, guarded by a test of its name.
      const std::string error = co_await RemoveForeignEntry(path, true, r.object, "/status/nodes", "name", ticket);
      if (error.empty()) {
        context_.Log().info("driver-managed IMEX: node {} deregistered from ComputeDomain {}", settings_.node_name,
                            d->Label());
      }
      SyncEntryDone(d, error.empty(), error);
      co_return;
    }
    context_.Log().info("driver-managed IMEX: node {} deregistered from ComputeDomain {}", settings_.node_name,
                        d->Label());
    SyncEntryDone(d, true, {});
    co_return;
  }
  context_.Log().info("driver-managed IMEX: node {} in ComputeDomain {}: index {}, clique {}, {}", settings_.node_name,
                      d->Label(), me.index, me.clique_id, me.status);
  auto object = std::make_shared<const json>(std::move(r.object));
  SyncEntryDone(d, true, {});
  OnDomainObject(d, std::move(object));
}

// ComputeDomainCliques: the node's entry in the `daemons` of its clique's object, applied on the
// main resource (the object has no status) under the same field manager; the apply creates the
// object when it is missing. Every node applies the same metadata (labels, owner reference): a
// shared ownership, so the object keeps it until the last of them withdraws.
asio::awaitable<void> DriverManagedDomains::ApplyCliqueEntry(DomainPtr d, Gate::Ticket ticket) {
  if (!ticket) co_return;
  if (d->gone) {
    // An apply would make the object again, owned by a domain that no longer exists.
    SyncEntryDone(d, false, "ComputeDomain " + d->Label() + " was deleted");
    co_return;
  }
  json body{{"apiVersion", "resource.nvidia.com/v1beta1"},
            {"kind", "ComputeDomainClique"},
            {"metadata", CliqueObjectMeta(d->ns, d->name, d->uid, d->clique_id)}};
  std::vector<DomainNode> seen;
  if (d->clique_object) {
    auto parsed = ParseCliqueDaemons(*d->clique_object);
    if (parsed.ok()) seen = std::move(parsed.nodes);
  }
  const DomainNode me = RegisterNode(seen, Me(*d)).me;
  body["daemons"] = DaemonsToJson({me});
  const std::string object_name = d->clique_name;
  const std::string path = d->CliquePath(object_name);
  ++api_requests_;
  kube::Result r =
      co_await client_->Patch(path, kube::PatchType::kApply, body, field_manager_, kClientBounds, ticket,
                              /*force=*/true);
  if (!r.Ok()) {
    SyncEntryDone(d, false, "cannot apply this node's entry in ComputeDomainClique " + d->ns + "/" + object_name +
                                ": " + r.error);
    co_return;
  }
  context_.Log().info("driver-managed IMEX: node {} in ComputeDomainClique {}/{}: index {}, {}", settings_.node_name,
                      d->ns, object_name, me.index, me.status);
  auto object = std::make_shared<const json>(std::move(r.object));
  SyncEntryDone(d, true, {});
  OnCliqueObject(d, std::move(object));
}

// Leaving (gate on): the node's entry goes from every clique object of the domain that holds it
// (listed by the domain label: this works after a restart before the clique is known, and after
// a clique change). Only objects that exist and hold the entry are written, so no apply makes a
// clique object again after the controller deleted it.
asio::awaitable<void> DriverManagedDomains::WithdrawFromCliques(DomainPtr d, Gate::Ticket ticket) {
  if (!ticket) co_return;
  kube::ListOptions options;
  options.label_selector = std::string(kComputeDomainLabel) + "=" + d->uid;
  const std::string collection = CliquesPath(d->ns);
  ++api_requests_;
  const kube::Result listed = co_await client_->List(collection, options, kClientBounds, ticket);
  if (!listed.Ok()) {
    SyncEntryDone(d, false, "cannot list the ComputeDomainCliques of ComputeDomain " + d->Label() + ": " + listed.error);
    co_return;
  }
  std::vector<json> holding;
  for (const auto& item : listed.object.value("items", json::array())) {
    const auto parsed = ParseCliqueDaemons(item);
    if (parsed.ok() && FindNode(parsed.nodes, settings_.node_name) != nullptr) holding.push_back(item);
  }
  // One object at a time, the last listed first; the first failure ends the withdrawal (retried
  // whole by SyncEntryDone).
  for (auto clique = holding.rbegin(); clique != holding.rend(); ++clique) {
    const std::string object_name = JsonStringAt(*clique, "/metadata/name");
    const json labels = clique->value(json::json_pointer("/metadata/labels"), json::object());
    const std::string clique_id =
        labels.is_object() ? labels.value(std::string(kCliqueLabel), std::string()) : std::string();
    // The same metadata as the registration (so the labels stay while others still own them),
    // and no daemons: the entry this manager owned goes.
    const json body{{"apiVersion", "resource.nvidia.com/v1beta1"},
                    {"kind", "ComputeDomainClique"},
                    {"metadata", CliqueObjectMeta(d->ns, d->name, d->uid, clique_id)}};
    const std::string path = d->CliquePath(object_name);
    ++api_requests_;
    const kube::Result r =
        co_await client_->Patch(path, kube::PatchType::kApply, body, field_manager_, kClientBounds, ticket,
                                /*force=*/true);
    if (!r.Ok()) {
      SyncEntryDone(d, false, "cannot withdraw this node's entry from ComputeDomainClique " + d->ns + "/" +
                                  object_name + ": " + r.error);
      co_return;
    }
    const auto parsed = ParseCliqueDaemons(r.object);
    if (parsed.ok() && FindNode(parsed.nodes, settings_.node_name) != nullptr) {
      const std::string error = co_await RemoveForeignEntry(path, false, r.object, "/daemons", "nodeName", ticket);
      if (!error.empty()) {
        SyncEntryDone(d, false, error);
        co_return;
      }
    }
  }
  context_.Log().info("driver-managed IMEX: node {} deregistered from the ComputeDomainCliques of ComputeDomain {}",
                      settings_.node_name, d->Label());
  SyncEntryDone(d, true, {});
}

asio::awaitable<std::string> DriverManagedDomains::RemoveForeignEntry(std::string path, bool status_subresource,
                                                                      json object, const char* list_pointer,
                                                                      const char* name_key, Gate::Ticket ticket) {
  const json nodes = object.value(json::json_pointer(list_pointer), json::array());
  std::size_t position = 0;
  while (position < nodes.size() &&
         !(nodes[position].is_object() && nodes[position].value(name_key, "") == settings_.node_name)) {
    ++position;
  }
  const std::string at = std::string(list_pointer) + "/" + std::to_string(position);
  const json patch = json::array({json{{"op", "test"}, {"path", at + "/" + name_key}, {"value", settings_.node_name}},
                                  json{{"op", "remove"}, {"path", at}}});
  ++api_requests_;
  kube::Result r;
  if (status_subresource) {
    r = co_await client_->PatchStatus(path, kube::PatchType::kJson, patch, field_manager_, kClientBounds, ticket);
  } else {
    r = co_await client_->Patch(path, kube::PatchType::kJson, patch, field_manager_, kClientBounds, ticket);
  }
  // 422: the list moved under us (the test failed): read it again next time.
  if (!r.Ok() && r.http_status != 404) co_return "cannot remove this node's entry from " + path + ": " + r.error;
  co_return std::string{};
}

void DriverManagedDomains::SyncEntryDone(const DomainPtr& d, bool ok, const std::string& error) {
  d->entry_busy = false;
  if (!ok) {
    d->error = error;
    context_.Log().warn("driver-managed IMEX: {}", error);
    if (d->gone && !d->leaving) {
      AnswerWaiters(d, true);
      return;  // a deleted domain: its claims' unprepares end it here
    }
    RetryLater(d, [this, d] { SyncEntry(d); });
    return;
  }
  d->error.clear();
  d->backoff.Reset();
  if (d->entry_again) {
    d->entry_again = false;
    // Leaving: the withdrawal asked for meanwhile still has to go out. Registered: the caller
    // hands this write's answer to OnDomainObject next, which writes again only if the entry
    // is still not what is true (a readiness change meanwhile, a duplicate index).
    if (d->leaving) {
      SyncEntry(d);
      return;
    }
  }
  // Teardown step 1 (the deregistration) issued this write or one queued behind it.
  if (d->leaving && d->teardown_step == 2) TeardownStep(d);
}

void DriverManagedDomains::RetryLater(const DomainPtr& d, std::function<void()> fn) {
  if (stopping_) return;
  // A timer per retry: a label retry and a status retry may wait at the same time.
  auto timer = std::make_shared<boost::asio::steady_timer>(context_.GetLoop().Io(), d->backoff.Next());
  timer->async_wait(lifetime_.Guard([this, timer, d, epoch = d->retry_epoch,
                                     fn = std::move(fn)](const boost::system::error_code& ec) {
    if (ec || stopping_ || epoch != d->retry_epoch) return;
    fn();
  }));
}

// ---------------------------------------------------------------------------------- files, daemon

void DriverManagedDomains::RenderFiles(const DomainPtr& d) {
  if (!d->object || d->leaving || stopping_ || node_address_.empty()) return;
  const auto registered = Registered(*d);
  if (!registered.ok()) return;
  if (FindNode(registered.nodes, settings_.node_name) == nullptr) return;
  // A node of another clique than the domain's is registered, but runs no daemon: it is in no
  // map, and its prepares are refused. (Gate on: the domain's clique is read from the
  // controller's mirror, so the daemon starts once the controller has listed the node.)
  const auto parsed = ParseDomainNodes(*d->object);
  if (!parsed.ok() || DomainClique(parsed.nodes) != clique_id_) return;
  if (d->files_busy) {
    d->files_again = true;
    return;
  }
  const auto peers = CliquePeers(registered.nodes, clique_id_);
  ImexSettings imex;
  imex.server_port = settings_.server_port;
  imex.cmd_port = settings_.cmd_port;
  imex.bind_ip = node_address_;
  imex.node_map_file = JoinPath(d->dir, "nodes_config.cfg");
  imex.log_file = JoinPath(d->dir, "nvidia-imex.log");
  imex.dns_names = settings_.dns_names;
  const std::string config = RenderImexConfig(imex);
  const std::string map = RenderNodeMap(peers, settings_.dns_names);
  const std::string hosts = settings_.dns_names ? RenderHostsFile(peers) : std::string{};
  if (config == d->written_config && map == d->written_map && hosts == d->written_hosts) {
    return;
  }
  d->files_busy = true;
  Spawn(WriteFiles(d, config, map, hosts, lifetime_.Watch()));
}

asio::awaitable<void> DriverManagedDomains::WriteFiles(DomainPtr d, std::string config, std::string map,
                                                       std::string hosts, Gate::Ticket ticket) {
  if (!ticket) co_return;
  auto write = [dir = d->dir, config, map, hosts, dns = settings_.dns_names]() -> std::string {
    std::string error;
    if (!EnsureDirectory(dir, 0700, error)) return error;
    if (auto r = WriteFileAtomically(JoinPath(dir, "config.cfg"), config, 0644); !r) return r.error;
    if (auto r = WriteFileAtomically(JoinPath(dir, "nodes_config.cfg"), map, 0644); !r) return r.error;
    if (dns) {
      if (auto error = WriteHostsFile(JoinPath(dir, "hosts"), hosts); !error.empty()) return error;
    }
    return {};
  };
  JobResult<std::string> written = co_await OnPool(context_.Pool(), std::move(write), ticket);
  d->files_busy = false;
  std::string error = std::move(written.value);
  if (written.failure && error.empty()) error = "unexpected failure writing the IMEX files";
  if (!error.empty()) {
    d->error = error;
    context_.Log().error("driver-managed IMEX: ComputeDomain {}: {}", d->Label(), error);
    RetryLater(d, [this, d] { RenderFiles(d); });
    co_return;
  }
  const bool map_changed = !d->written_map.empty() && map != d->written_map;
  d->written_config = config;
  d->written_map = map;
  d->written_hosts = hosts;
  if (d->leaving || stopping_) co_return;
  if (!d->daemon) {
    ImexDaemonSettings daemon = settings_.daemon;
    daemon.label = d->Label();
    daemon.config_file = JoinPath(d->dir, "config.cfg");
    if (settings_.dns_names) daemon.hosts_file = JoinPath(d->dir, "hosts");
    d->daemon = std::make_unique<ImexDaemon>(
        context_.GetLoop().Io(), context_.Logger(), daemon,
        // Weak: the domain owns the daemon that owns this callback.
        [this, alive = ticket, weak = std::weak_ptr<Domain>(d)](bool, const std::string&) {
          const auto d = weak.lock();
          if (alive && d && !d->leaving && !stopping_) SyncEntry(d);
        });
    d->daemon->Start();
  } else if (map_changed) {
    d->daemon->Reload();
  }
  if (d->files_again) {
    d->files_again = false;
    RenderFiles(d);
  }
}

// ---------------------------------------------------------------------------------- detach, teardown

void DriverManagedDomains::Detach(const std::string& claim_uid, std::function<void(std::string)> done) {
  for (auto& [uid, d] : domains_) {
    if (d->claims.erase(claim_uid) == 0) continue;
    const bool last = d->claims.empty();
    if (last) d->leaving = true;
    DomainPtr keep = d;
    Persist(lifetime_.Guard([this, keep, last, done = std::move(done)](std::string error) {
      if (last) {
        AnswerWaiters(keep, true);
        Teardown(keep);
      }
      done(error.empty() ? std::string{} : "cannot record the claim's detach: " + error);
    }));
    return;
  }
  done({});
}

void DriverManagedDomains::Teardown(const DomainPtr& d) {
  context_.Log().info("driver-managed IMEX: last claim of ComputeDomain {} unprepared: stopping its daemon, "
                      "deregistering, removing the label",
                      d->Label());
  ++d->retry_epoch;
  d->teardown_step = 0;
  TeardownStep(d);
}

// Each step's completion calls TeardownStep again: daemon stopped → entry removed → label
// removed → informer released, files removed → out of the record.
void DriverManagedDomains::TeardownStep(const DomainPtr& d) {
  if (!d->leaving) return;
  switch (d->teardown_step++) {
    case 0:
      if (d->daemon) {
        d->daemon->Stop(lifetime_.Guard([this, d] { if (d->teardown_step == 1) TeardownStep(d); }));
      } else {
        TeardownStep(d);
      }
      return;
    case 1:
      if (d->gone) {
        TeardownStep(d);
      } else {
        SyncEntry(d);  // leaving: removes the entry, then SyncEntryDone → TeardownStep
      }
      return;
    case 2:
      Label(d, false);
      return;
    case 3: {
      d->informer.reset();
      d->informer_key.clear();
      d->clique_informer.reset();
      d->clique_informer_key.clear();
      d->daemon.reset();
      context_.Pool().Run(
          [dir = d->dir]() {
            std::error_code ec;
            std::filesystem::remove_all(dir, ec);
            return ec ? "cannot remove " + dir + ": " + ec.message() : std::string{};
          },
          lifetime_.Guard([this, d](std::string error, std::exception_ptr) {
            if (!error.empty()) context_.Log().warn("driver-managed IMEX: {}", error);
            TeardownStep(d);
          }));
      return;
    }
    case 4: {
      const auto it = domains_.find(d->uid);
      if (it != domains_.end() && it->second == d) domains_.erase(it);
      Persist(lifetime_.Guard([this, d](std::string error) {
        if (!error.empty()) {
          context_.Log().error("driver-managed IMEX: cannot drop ComputeDomain {} from the record: {}", d->Label(),
                               error);
          return;
        }
        context_.Log().info("driver-managed IMEX: ComputeDomain {} left this node", d->Label());
      }));
      return;
    }
    default:
      return;
  }
}

// ---------------------------------------------------------------------------------- stop

void DriverManagedDomains::Stop(std::function<void()> done) {
  stopping_ = true;
  events_sub_.Reset();
  auto left = std::make_shared<std::size_t>(1);
  auto finish = std::make_shared<std::function<void()>>(std::move(done));
  auto one_done = [left, finish] {
    if (--*left == 0 && *finish) (*finish)();
  };
  for (auto& [uid, d] : domains_) {
    ++d->retry_epoch;
    for (auto& w : d->waiters) {
      w->timer->cancel();
      if (auto fn = std::move(w->done)) fn({DomainVerdict::Kind::kNotReady, "the plugin is stopping"});
    }
    d->waiters.clear();
    d->informer.reset();
    d->clique_informer.reset();
    if (d->daemon) {
      ++*left;
      d->daemon->Stop([alive = lifetime_.Watch(), one_done] { one_done(); });
    }
  }
  one_done();
}

// ---------------------------------------------------------------------------------- record

DomainRecord DriverManagedDomains::Snapshot() const {
  DomainRecord record;
  for (const auto& [uid, d] : domains_) record.domains[uid] = RecordedDomain{d->ns, d->name, d->claims};
  return record;
}

void DriverManagedDomains::Persist(std::function<void(std::string)> done) {
  persist_waiting_.push_back(std::move(done));
  if (!persist_busy_) PersistNext();
}

void DriverManagedDomains::PersistNext() {
  if (persist_waiting_.empty()) return;
  persist_busy_ = true;
  persist_inflight_ = std::move(persist_waiting_);
  persist_waiting_.clear();
  context_.Pool().Run(
      [file = record_file_, dir = settings_.state_dir, record = Snapshot()]() -> std::string {
        std::string error;
        if (!EnsureDirectory(dir, 0700, error)) return error;
        if (auto r = SaveDomainRecord(file, record); !r) return r.error;
        return {};
      },
      lifetime_.Guard([this](std::string error, std::exception_ptr ex) {
        if (ex && error.empty()) error = "unexpected failure";
        persist_busy_ = false;
        auto callbacks = std::move(persist_inflight_);
        persist_inflight_.clear();
        for (auto& cb : callbacks) cb(error);
        PersistNext();
      }));
}

json DriverManagedDomains::DebugState() const {
  json out = json::object();
  for (const auto& [uid, d] : domains_) {
    json claims = json::array();
    for (const auto& [cuid, c] : d->claims) claims.push_back(c.namespace_name + "/" + c.name);
    out[uid] = {{"domain", d->Label()},
                {"claims", std::move(claims)},
                {"leaving", d->leaving},
                {"daemonRunning", d->daemon && d->daemon->Running()},
                {"daemonReady", d->daemon && d->daemon->Ready()},
                {"daemonStarts", d->daemon ? d->daemon->Starts() : 0},
                {"cliqueObject", d->clique_name},
                {"verdict", Verdict(*d).message},
                {"lastError", d->error}};
  }
  return out;
}

}  // namespace gns::dra
