// One ComputeDomain reconcile as a chain of API calls (see reconciler.hpp).
#include "modules/compute_domain_controller/reconciler.hpp"

#include <algorithm>
#include <ctime>
#include <utility>

namespace gns::cd_controller {

using nlohmann::json;

namespace {

// The string at a path of object keys; empty when any step is missing or not an object/string.
std::string StringAt(const json& j, std::initializer_list<const char*> path) {
  const json* at = &j;
  for (const char* key : path) {
    if (!at->is_object()) return {};
    const auto it = at->find(key);
    if (it == at->end()) return {};
    at = &*it;
  }
  return at->is_string() ? at->get<std::string>() : std::string();
}

bool Deleting(const json& object) {
  const auto meta = object.find("metadata");
  return meta != object.end() && meta->is_object() && meta->contains("deletionTimestamp") &&
         !(*meta)["deletionTimestamp"].is_null();
}

std::vector<std::string> Finalizers(const json& object) {
  std::vector<std::string> out;
  const auto meta = object.find("metadata");
  if (meta == object.end() || !meta->is_object()) return out;
  const auto list = meta->find("finalizers");
  if (list == meta->end() || !list->is_array()) return out;
  for (const auto& f : *list) {
    if (f.is_string()) out.push_back(f.get<std::string>());
  }
  return out;
}

bool HasFinalizer(const json& object, std::string_view finalizer) {
  const auto list = Finalizers(object);
  return std::find(list.begin(), list.end(), finalizer) != list.end();
}

json WithFinalizer(json object, std::string_view finalizer, bool present) {
  auto list = Finalizers(object);
  list.erase(std::remove(list.begin(), list.end(), finalizer), list.end());
  if (present) list.emplace_back(finalizer);
  object["metadata"]["finalizers"] = list;
  return object;
}

// True when the domain's status already says NotReady for `reason`.
bool SaysNotReady(const json& domain, std::string_view reason) {
  if (StringAt(domain, {"status", "status"}) != "NotReady") return false;
  const auto& status = domain["status"];
  if (!status.contains("conditions") || !status["conditions"].is_array()) return false;
  for (const auto& c : status["conditions"]) {
    if (StringAt(c, {"type"}) == "Ready" && StringAt(c, {"reason"}) == reason) return true;
  }
  return false;
}

std::string JoinList(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

std::string_view ResourceApiVersion(ResourceApi api) {
  switch (api) {
    case ResourceApi::kV1: return "v1";
    case ResourceApi::kV1beta2: return "v1beta2";
    case ResourceApi::kV1beta1: return "v1beta1";
  }
  return "v1";
}

std::string_view ToString(Outcome::State state) {
  switch (state) {
    case Outcome::State::kReady: return "Ready";
    case Outcome::State::kNotReady: return "NotReady";
    case Outcome::State::kDeleted: return "Deleted";
    case Outcome::State::kGone: return "Gone";
  }
  return "Unknown";
}

json WorkloadTemplate(ResourceApi api, const std::string& ns, const std::string& name, const std::string& domain_uid,
                      const std::string& allocation_mode) {
  json request = {{"name", kChannelRequest}};
  if (api == ResourceApi::kV1beta1) {
    request["deviceClassName"] = kChannelDeviceClass;  // v1beta1: DeviceRequest is flat
  } else {
    request["exactly"] = {{"deviceClassName", kChannelDeviceClass}};
  }
  json parameters = {{"apiVersion", std::string(kGroup) + "/" + std::string(kVersion)},
                     {"kind", kChannelConfigKind},
                     {"domainID", domain_uid}};
  if (!allocation_mode.empty()) parameters["allocationMode"] = allocation_mode;
  return json{
      {"apiVersion", "resource.k8s.io/" + std::string(ResourceApiVersion(api))},
      {"kind", "ResourceClaimTemplate"},
      {"metadata",
       {{"name", name},
        {"namespace", ns},
        {"labels", {{kDomainLabel, domain_uid}, {kTargetLabel, kTargetWorkload}}},
        {"finalizers", json::array({kTemplateFinalizer})}}},
      {"spec",
       {{"spec",
         {{"devices",
           {{"requests", json::array({request})},
            {"config", json::array({{{"requests", json::array({kChannelRequest})},
                                     {"opaque", {{"driver", kDriverName}, {"parameters", parameters}}}}})}}}}}}}};
}

bool MadeForDomain(const json& tmpl, const std::string& domain_uid) {
  return !domain_uid.empty() && StringAt(tmpl, {"metadata", "labels", std::string(kDomainLabel).c_str()}) == domain_uid &&
         StringAt(tmpl, {"metadata", "labels", std::string(kTargetLabel).c_str()}) == kTargetWorkload;
}

struct Reconciler::Run {
  std::string key;
  std::string ns;
  std::string name;
  uint64_t epoch = 0;
  std::function<void(Outcome)> done;
  int conflicts = 0;
  int template_steps = 0;
  json domain;
  std::string uid;
  std::string template_name;
  std::string allocation_mode;
  bool nodes_released = false;  // driver-managed delete: the wait for the nodes is over

  std::string DomainPath() const {
    return kube::ResourcePath::Grouped(std::string(kGroup), std::string(kVersion), std::string(kResource), ns)
        .Object(name);
  }
};

Reconciler::Reconciler(std::shared_ptr<kube::KubeClient> client, std::shared_ptr<kube::EventRecorder> events,
                       std::shared_ptr<spdlog::logger> log, ReconcileSettings settings)
    : client_(std::move(client)), events_(std::move(events)), log_(std::move(log)), settings_(std::move(settings)) {}

Reconciler::~Reconciler() { lifetime_.Close(); }

void Reconciler::Cancel() {
  ++epoch_;
  stats_.abandoned += runs_.size();
  runs_.clear();
}

bool Reconciler::Current(const RunPtr& run) const { return run->epoch == epoch_; }

template <typename Send>
void Reconciler::Call(const RunPtr& run, Send send, std::function<void(kube::Result)> next) {
  send([this, run, alive = lifetime_.Watch(), next = std::move(next)](kube::Result r) {
    if (!alive || !Current(run)) return;  // cancelled (lease lost) or gone: drop the answer
    next(std::move(r));
  });
}

void Reconciler::Reconcile(const std::string& key, std::function<void(Outcome)> done) {
  auto run = std::make_shared<Run>();
  run->key = key;
  const auto slash = key.find('/');
  run->ns = slash == std::string::npos ? std::string() : key.substr(0, slash);
  run->name = slash == std::string::npos ? key : key.substr(slash + 1);
  run->epoch = epoch_;
  run->done = std::move(done);
  ++stats_.started;
  runs_.insert(run.get());
  if (run->ns.empty() || run->name.empty()) {
    Finish(run, Outcome{true, Outcome::State::kGone, "InvalidKey", "not a namespace/name key: " + key});
    return;
  }
  FetchDomain(run);
}

void Reconciler::Finish(const RunPtr& run, Outcome outcome) {
  runs_.erase(run.get());
  ++stats_.finished;
  auto done = std::move(run->done);
  run->done = nullptr;
  if (done) done(std::move(outcome));
}

void Reconciler::Fail(const RunPtr& run, std::string reason, std::string error) {
  Finish(run, Outcome{false, Outcome::State::kNotReady, std::move(reason), std::move(error)});
}

void Reconciler::Restart(const RunPtr& run, const kube::Result& r, std::string_view what) {
  if (r.http_status == 409) {
    ++stats_.conflicts;
    if (++run->conflicts <= settings_.conflict_retries) {
      log_->debug("{}: {}: conflict, reading again: {}", run->key, what, r.error);
      FetchDomain(run);
      return;
    }
    Fail(run, "Conflict", std::string(what) + ": " + r.error);
    return;
  }
  Fail(run, "ApiError",
       std::string(what) + ": " + (r.error.empty() ? "HTTP " + std::to_string(r.http_status) : r.error));
}

void Reconciler::FetchDomain(const RunPtr& run) {
  Call(run, [&](auto cb) { client_->Get(run->DomainPath(), std::move(cb)); },
       [this, run](kube::Result r) { OnDomain(run, std::move(r)); });
}

void Reconciler::OnDomain(const RunPtr& run, kube::Result r) {
  if (r.http_status == 404) {
    Finish(run, Outcome{true, Outcome::State::kGone, {}, {}});
    return;
  }
  if (!r.Ok() || !r.object.is_object()) {
    Restart(run, r, "get ComputeDomain");
    return;
  }
  run->domain = std::move(r.object);
  run->uid = StringAt(run->domain, {"metadata", "uid"});
  run->template_name = StringAt(run->domain, {"spec", "channel", "resourceClaimTemplate", "name"});
  run->allocation_mode = StringAt(run->domain, {"spec", "channel", "allocationMode"});
  run->template_steps = 0;
  if (Deleting(run->domain)) {
    if (!HasFinalizer(run->domain, kFinalizer)) {
      Finish(run, Outcome{true, Outcome::State::kDeleted, {}, {}});
      return;
    }
    DeleteTemplateStep(run);
    return;
  }
  if (run->template_name.empty()) {
    NotReady(run, "InvalidSpec", "spec.channel.resourceClaimTemplate.name is required", false);
    return;
  }
  if (!kube::IsValidObjectName(run->template_name)) {
    // It becomes a request path and an object name: never "../x" or "a?b".
    NotReady(run, "InvalidSpec",
             "spec.channel.resourceClaimTemplate.name \"" + run->template_name +
                 "\" is not a valid object name (lowercase letters, digits, '-' and '.', at most 253)",
             false);
    return;
  }
  EnsureFinalizer(run);
}

// --- add/update (§6.1)

void Reconciler::EnsureFinalizer(const RunPtr& run) {
  if (HasFinalizer(run->domain, kFinalizer)) {
    EnsureTemplate(run);
    return;
  }
  Call(run, [&](auto cb) { client_->Update(run->DomainPath(), WithFinalizer(run->domain, kFinalizer, true), std::move(cb)); },
       [this, run](kube::Result r) {
         if (!r.Ok()) return Restart(run, r, "add ComputeDomain finalizer");
         run->domain = std::move(r.object);
         EnsureTemplate(run);
       });
}

void Reconciler::EnsureTemplate(const RunPtr& run) {
  const auto path = kube::ResourcePath::Grouped("resource.k8s.io", std::string(ResourceApiVersion(settings_.resource_api)),
                                                "resourceclaimtemplates", run->ns)
                        .Object(run->template_name);
  Call(run, [&](auto cb) { client_->Get(path, std::move(cb)); }, [this, run, path](kube::Result r) {
    if (r.http_status == 404) return CreateTemplate(run);
    if (!r.Ok()) return Restart(run, r, "get ResourceClaimTemplate");
    if (!MadeForDomain(r.object, run->uid)) {
      NotReady(run, "ResourceClaimTemplateConflict",
               "ResourceClaimTemplate " + run->ns + "/" + run->template_name +
                   " exists but was not made for this ComputeDomain (labels " + std::string(kDomainLabel) + "=" +
                   run->uid + ", " + std::string(kTargetLabel) + "=" + std::string(kTargetWorkload) +
                   " expected); it is left as it is",
               true);
      return;
    }
    if (Deleting(r.object)) {
      if (!HasFinalizer(r.object, kTemplateFinalizer) || ++run->template_steps > 8) {
        Fail(run, "ResourceClaimTemplateTerminating",
             "ResourceClaimTemplate " + run->ns + "/" + run->template_name + " is being deleted");
        return;
      }
      // Deleted by hand while the domain lives: our finalizer would hold it in Terminating for
      // good. Let it go, then make it again (the GET after this finds 404).
      log_->info("{}: ResourceClaimTemplate {}/{} was deleted while its ComputeDomain lives: recreating it", run->key,
                 run->ns, run->template_name);
      Call(run, [&](auto cb) { client_->Update(path, WithFinalizer(r.object, kTemplateFinalizer, false), std::move(cb)); },
           [this, run](kube::Result u) {
             if (u.Ok() || u.http_status == 404 || u.http_status == 409) return EnsureTemplate(run);
             Restart(run, u, "remove ResourceClaimTemplate finalizer");
           });
      return;
    }
    Settle(run);
  });
}

void Reconciler::CreateTemplate(const RunPtr& run) {
  const auto collection = kube::ResourcePath::Grouped(
                              "resource.k8s.io", std::string(ResourceApiVersion(settings_.resource_api)),
                              "resourceclaimtemplates", run->ns)
                              .Collection();
  auto object = WorkloadTemplate(settings_.resource_api, run->ns, run->template_name, run->uid, run->allocation_mode);
  Call(run, [&](auto cb) { client_->Create(collection, object, std::move(cb)); }, [this, run](kube::Result r) {
    // 409 AlreadyExists: someone (a previous leader) created it meanwhile: read it again.
    if (!r.Ok()) return Restart(run, r, "create ResourceClaimTemplate");
    ++stats_.templates_created;
    log_->info("{}: created workload ResourceClaimTemplate {}/{} (domain {})", run->key, run->ns, run->template_name,
               run->uid);
    Settle(run);
  });
}

void Reconciler::WriteStatus(const RunPtr& run, bool ready, std::string reason, std::string message,
                             std::function<void()> then) {
  json current = run->domain.contains("status") && run->domain["status"].is_object() ? run->domain["status"]
                                                                                      : json::object();
  json desired = current;
  if (ready) {
    desired["status"] = "Ready";
    desired.erase("conditions");
  } else {
    desired["status"] = "NotReady";
    desired["conditions"] = json::array(
        {{{"type", "Ready"}, {"status", "False"}, {"reason", std::move(reason)}, {"message", std::move(message)}}});
  }
  if (desired == current) {
    then();
    return;
  }
  json object = run->domain;
  object["status"] = desired;
  Call(run, [&](auto cb) { client_->UpdateStatus(run->DomainPath(), object, std::move(cb)); },
       [this, run, then = std::move(then)](kube::Result r) {
         if (!r.Ok()) return Restart(run, r, "update ComputeDomain status");
         ++stats_.status_writes;
         run->domain = std::move(r.object);
         then();
       });
}

void Reconciler::NotReady(const RunPtr& run, std::string reason, std::string message, bool retry) {
  // A new state is announced; a conflict that persists is repeated (the recorder aggregates it).
  if (!SaysNotReady(run->domain, reason) || retry) Event(run, "Warning", reason, message);
  log_->warn("{}: {}: {}", run->key, reason, message);
  WriteStatus(run, false, reason, message, [this, run, reason, message, retry] {
    Finish(run, Outcome{!retry, Outcome::State::kNotReady, reason, retry ? message : std::string()});
  });
}

void Reconciler::Settle(const RunPtr& run) {
  if (!settings_.host_managed) {
    DriverManagedSettle(run);
    return;
  }
  WriteStatus(run, true, {}, {}, [this, run] { Finish(run, Outcome{true, Outcome::State::kReady, {}, {}}); });
}

void Reconciler::DriverManagedSettle(const RunPtr& run) {
  json current = run->domain.contains("status") && run->domain["status"].is_object() ? run->domain["status"]
                                                                                      : json::object();
  json desired = current;
  auto stale = std::make_shared<std::vector<StaleDaemons>>();
  json judged_domain;
  if (settings_.cliques) {
    const auto cliques = settings_.cliques_of ? settings_.cliques_of(run->ns, run->uid) : std::vector<json>{};
    if (!cliques) {
      // The clique cache's first list enqueues every domain again.
      Finish(run, Outcome{true, Outcome::State::kNotReady, "CliquesNotSynced", {}});
      return;
    }
    CliqueMirror mirror = MirrorCliques(run->domain, *cliques, settings_.node_exists);
    *stale = std::move(mirror.stale);
    desired["nodes"] = mirror.nodes;
    judged_domain = run->domain;
    judged_domain["status"] = desired;
    if (desired != current) {
      std::string per_clique;
      for (const auto& [clique, counts] : mirror.per_clique) {
        per_clique += (per_clique.empty() ? "" : ", ") + ("\"" + clique + "\": ") + std::to_string(counts.first) +
                      "/" + std::to_string(counts.second) + " Ready";
      }
      log_->info("{}: status.nodes from {} ComputeDomainClique object(s): {}", run->key, cliques->size(),
                 per_clique.empty() ? std::string("no nodes") : per_clique);
    }
  }
  const DriverManagedStatus judged =
      JudgeDriverManaged(settings_.cliques ? judged_domain : run->domain, settings_.node_exists);
  desired["status"] = judged.domain_ready ? "Ready" : "NotReady";
  desired.erase("conditions");
  if (judged.removed > 0) desired["nodes"] = judged.nodes;
  const Outcome outcome{true, judged.domain_ready ? Outcome::State::kReady : Outcome::State::kNotReady,
                        judged.domain_ready ? std::string() : std::string("NodesNotReady"), {}};
  if (desired == current) {
    PruneCliques(run, std::move(stale), outcome);
    return;
  }
  if (judged.removed > 0) {
    log_->info("{}: removed {} node(s) that no longer exist from status.nodes", run->key, judged.removed);
  }
  if (StringAt(current, {"status"}) != StringAt(desired, {"status"})) {
    log_->info("{}: {} ({} of {} node(s) of clique \"{}\" Ready, {} registered)", run->key,
               judged.domain_ready ? "Ready" : "NotReady", judged.ready, judged.num_nodes, judged.clique,
               judged.registered);
  }
  json object = run->domain;
  object["status"] = desired;
  Call(run, [&](auto cb) { client_->UpdateStatus(run->DomainPath(), object, std::move(cb)); },
       [this, run, outcome, stale](kube::Result r) {
         if (!r.Ok()) return Restart(run, r, "update ComputeDomain status");
         ++stats_.status_writes;
         run->domain = std::move(r.object);
         PruneCliques(run, stale, outcome);
       });
}

// The daemons of vanished Nodes leave their clique objects: one JSON patch per object, each
// removal guarded by a test of the entry's name (positions from the cache; a list that moved
// meanwhile fails the test, 422, and the next reconcile looks again).
void Reconciler::PruneCliques(const RunPtr& run, std::shared_ptr<std::vector<StaleDaemons>> stale, Outcome outcome) {
  if (stale->empty()) {
    Finish(run, std::move(outcome));
    return;
  }
  StaleDaemons next = std::move(stale->back());
  stale->pop_back();
  json patch = json::array();
  if (!next.uid.empty()) patch.push_back({{"op", "test"}, {"path", "/metadata/uid"}, {"value", next.uid}});
  // From the last position down, so earlier removals do not move later ones.
  std::sort(next.entries.begin(), next.entries.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [position, node] : next.entries) {
    const std::string at = "/daemons/" + std::to_string(position);
    patch.push_back({{"op", "test"}, {"path", at + "/nodeName"}, {"value", node}});
    patch.push_back({{"op", "remove"}, {"path", at}});
  }
  const auto path = kube::ResourcePath::Grouped(std::string(kGroup), std::string(kVersion), std::string(kCliqueResource),
                                                run->ns)
                        .Object(next.clique);
  log_->info("{}: removing {} entr{} of vanished node(s) from ComputeDomainClique {}/{}", run->key, next.entries.size(),
             next.entries.size() == 1 ? "y" : "ies", run->ns, next.clique);
  const std::size_t count = next.entries.size();
  Call(run, [&](auto cb) { client_->Patch(path, kube::PatchType::kJson, patch, settings_.field_manager, std::move(cb)); },
       [this, run, stale, outcome = std::move(outcome), count](kube::Result r) mutable {
         if (r.Ok()) stats_.clique_entries_removed += count;
         // 404: the object went; 422: its list moved (the next reconcile, which its change
         // triggers, looks again).
         if (!r.Ok() && r.http_status != 404 && r.http_status != 422) {
           return Restart(run, r, "remove stale entries from a ComputeDomainClique");
         }
         PruneCliques(run, std::move(stale), std::move(outcome));
       });
}

CliqueMirror MirrorCliques(const json& domain, const std::vector<json>& cliques,
                           const std::function<bool(const std::string&)>& node_exists) {
  CliqueMirror out;
  // The clique objects in creation order (RFC 3339 stamps of one width sort as strings).
  std::vector<const json*> ordered;
  for (const auto& c : cliques) ordered.push_back(&c);
  std::stable_sort(ordered.begin(), ordered.end(), [](const json* a, const json* b) {
    const auto ka = std::make_pair(StringAt(*a, {"metadata", "creationTimestamp"}), StringAt(*a, {"metadata", "name"}));
    const auto kb = std::make_pair(StringAt(*b, {"metadata", "creationTimestamp"}), StringAt(*b, {"metadata", "name"}));
    return ka < kb;
  });
  // Every live daemon entry as a status.nodes entry, in clique order.
  std::vector<std::pair<std::string, json>> entries;
  for (const json* c : ordered) {
    const auto daemons = c->find("daemons");
    if (daemons == c->end() || !daemons->is_array()) continue;
    StaleDaemons stale{StringAt(*c, {"metadata", "name"}), StringAt(*c, {"metadata", "uid"}), {}};
    for (std::size_t i = 0; i < daemons->size(); ++i) {
      const json& d = (*daemons)[i];
      const std::string name = StringAt(d, {"nodeName"});
      if (name.empty()) continue;
      if (node_exists && !node_exists(name)) {
        stale.entries.emplace_back(i, name);
        continue;
      }
      json entry{{"name", name},
                 {"ipAddress", StringAt(d, {"ipAddress"})},
                 {"cliqueID", StringAt(d, {"cliqueID"})},
                 {"index", d.value("index", json(0))}};
      entry["status"] = StringAt(d, {"status"}).empty() ? std::string("NotReady") : StringAt(d, {"status"});
      entries.emplace_back(name, std::move(entry));
    }
    if (!stale.entries.empty()) out.stale.push_back(std::move(stale));
  }
  // Entries already listed keep their place; the rest follow.
  std::vector<bool> placed(entries.size(), false);
  const json::json_pointer nodes_ptr("/status/nodes");
  if (domain.contains(nodes_ptr) && domain.at(nodes_ptr).is_array()) {
    for (const auto& listed : domain.at(nodes_ptr)) {
      const std::string name = StringAt(listed, {"name"});
      for (std::size_t i = 0; i < entries.size(); ++i) {
        if (!placed[i] && entries[i].first == name) {
          placed[i] = true;
          out.nodes.push_back(entries[i].second);
          break;
        }
      }
    }
  }
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (!placed[i]) out.nodes.push_back(entries[i].second);
  }
  for (const auto& entry : out.nodes) {
    auto& counts = out.per_clique[StringAt(entry, {"cliqueID"})];
    counts.first += StringAt(entry, {"status"}) == "Ready" ? 1 : 0;
    ++counts.second;
  }
  return out;
}

DriverManagedStatus JudgeDriverManaged(const json& domain, const std::function<bool(const std::string&)>& node_exists) {
  DriverManagedStatus out;
  const json::json_pointer nodes_ptr("/status/nodes");
  if (domain.contains(nodes_ptr) && domain.at(nodes_ptr).is_array()) {
    for (const auto& entry : domain.at(nodes_ptr)) {
      const std::string name = StringAt(entry, {"name"});
      if (!name.empty() && node_exists && !node_exists(name)) {
        ++out.removed;
        continue;
      }
      out.nodes.push_back(entry);
    }
  }
  out.registered = out.nodes.size();
  // The domain's clique is the first registered node's (the node side refuses the others).
  if (!out.nodes.empty()) out.clique = StringAt(out.nodes.front(), {"cliqueID"});
  for (const auto& entry : out.nodes) {
    if (StringAt(entry, {"cliqueID"}) == out.clique && StringAt(entry, {"status"}) == "Ready") ++out.ready;
  }
  const json::json_pointer num_ptr("/spec/numNodes");
  if (domain.contains(num_ptr) && domain.at(num_ptr).is_number_integer()) out.num_nodes = domain.at(num_ptr).get<int64_t>();
  out.domain_ready = out.ready > 0 && static_cast<int64_t>(out.ready) >= out.num_nodes;
  return out;
}

// --- delete (§6.2)

void Reconciler::DeleteTemplateStep(const RunPtr& run) {
  if (run->template_name.empty()) {
    RemoveDomainFinalizer(run);
    return;
  }
  // GET → DELETE → GET → PUT (finalizer off) → GET (404) is the longest honest path.
  if (++run->template_steps > 8) {
    Fail(run, "ResourceClaimTemplateNotGone",
         "ResourceClaimTemplate " + run->ns + "/" + run->template_name + " did not go away");
    return;
  }
  const auto path = kube::ResourcePath::Grouped("resource.k8s.io", std::string(ResourceApiVersion(settings_.resource_api)),
                                                "resourceclaimtemplates", run->ns)
                        .Object(run->template_name);
  Call(run, [&](auto cb) { client_->Get(path, std::move(cb)); }, [this, run, path](kube::Result r) {
    if (r.http_status == 404) return RemoveDomainFinalizer(run);  // confirmed gone
    if (!r.Ok()) return Restart(run, r, "get ResourceClaimTemplate");
    if (!MadeForDomain(r.object, run->uid)) {
      log_->info("{}: ResourceClaimTemplate {}/{} was not made for this domain: left alone", run->key, run->ns,
                 run->template_name);
      return RemoveDomainFinalizer(run);
    }
    const std::string template_uid = StringAt(r.object, {"metadata", "uid"});
    if (!Deleting(r.object)) {
      Call(run, [&](auto cb) { client_->Delete(path, kube::Preconditions{template_uid, {}}, std::move(cb)); },
           [this, run](kube::Result d) {
             // 404: already gone; 409: replaced meanwhile (uid precondition): look again.
             if (d.Ok()) ++stats_.templates_deleted;
             if (d.Ok() || d.http_status == 404 || d.http_status == 409) return DeleteTemplateStep(run);
             Restart(run, d, "delete ResourceClaimTemplate");
           });
      return;
    }
    if (HasFinalizer(r.object, kTemplateFinalizer)) {
      Call(run, [&](auto cb) { client_->Update(path, WithFinalizer(r.object, kTemplateFinalizer, false), std::move(cb)); },
           [this, run](kube::Result u) {
             if (u.Ok() || u.http_status == 404 || u.http_status == 409) return DeleteTemplateStep(run);
             Restart(run, u, "remove ResourceClaimTemplate finalizer");
           });
      return;
    }
    Fail(run, "ResourceClaimTemplateNotGone",
         "ResourceClaimTemplate " + run->ns + "/" + run->template_name + " is still held by finalizers [" +
             JoinList(Finalizers(r.object)) + "]");
  });
}

void Reconciler::RemoveDomainFinalizer(const RunPtr& run) {
  if (!settings_.host_managed && !run->nodes_released) {
    std::optional<std::vector<json>> cliques;
    std::size_t registered = 0;
    if (settings_.cliques) {
      cliques = settings_.cliques_of ? settings_.cliques_of(run->ns, run->uid) : std::vector<json>{};
      if (!cliques) {
        Finish(run, Outcome{false, Outcome::State::kNotReady, "CliquesNotSynced",
                            "the ComputeDomainClique cache has not listed yet"});
        return;
      }
      registered = MirrorCliques(run->domain, *cliques, settings_.node_exists).nodes.size();
    } else {
      registered = JudgeDriverManaged(run->domain, settings_.node_exists).registered;
    }
    if (registered > 0 && !DeregisterWaitOver(run, registered)) return;
    run->nodes_released = true;
    if (cliques && !cliques->empty()) {
      DeleteCliques(run, std::make_shared<std::vector<json>>(std::move(*cliques)));
      return;
    }
  }
  Call(run,
       [&](auto cb) { client_->Update(run->DomainPath(), WithFinalizer(run->domain, kFinalizer, false), std::move(cb)); },
       [this, run](kube::Result r) {
         if (r.http_status == 404) return Finish(run, Outcome{true, Outcome::State::kGone, {}, {}});
         if (!r.Ok()) return Restart(run, r, "remove ComputeDomain finalizer");
         log_->info("{}: deleted (template and finalizers removed)", run->key);
         Finish(run, Outcome{true, Outcome::State::kDeleted, {}, {}});
       });
}

// Driver-managed delete: the nodes deregister when their claims are unprepared (their IMEX
// daemons stop then). The finalizer waits for that, up to deregister_timeout after the
// deletionTimestamp; then it goes anyway (a node that is down cannot answer).
bool Reconciler::DeregisterWaitOver(const RunPtr& run, std::size_t registered) {
  std::tm tm{};
  const std::string stamp = StringAt(run->domain, {"metadata", "deletionTimestamp"});
  std::chrono::system_clock::time_point deleted_at = settings_.wall_now();
  if (::strptime(stamp.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) != nullptr) {
    deleted_at = std::chrono::system_clock::from_time_t(::timegm(&tm));
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(settings_.wall_now() - deleted_at);
  if (waited < settings_.deregister_timeout) {
    Finish(run, Outcome{false, Outcome::State::kNotReady, "WaitingForNodesToDeregister",
                        std::to_string(registered) + " node(s) still registered; waiting up to " +
                            std::to_string(settings_.deregister_timeout.count() / 1000) + " s"});
    return false;
  }
  log_->warn("{}: {} node(s) still registered {} s after the delete: removing the finalizer anyway", run->key,
             registered, waited.count() / 1000);
  return true;
}

// The domain's clique objects go before its finalizer (their owner reference would let the
// garbage collector do it too, but only once the domain is gone, and not where there is none).
void Reconciler::DeleteCliques(const RunPtr& run, std::shared_ptr<std::vector<json>> cliques) {
  if (cliques->empty()) {
    RemoveDomainFinalizer(run);
    return;
  }
  const json clique = std::move(cliques->back());
  cliques->pop_back();
  const std::string name = StringAt(clique, {"metadata", "name"});
  const auto path =
      kube::ResourcePath::Grouped(std::string(kGroup), std::string(kVersion), std::string(kCliqueResource), run->ns)
          .Object(name);
  Call(run,
       [&](auto cb) {
         client_->Delete(path, kube::Preconditions{StringAt(clique, {"metadata", "uid"}), {}}, std::move(cb));
       },
       [this, run, cliques, name](kube::Result r) {
         // 404: already gone; 409: replaced meanwhile (uid precondition): not the one we saw.
         if (!r.Ok() && r.http_status != 404 && r.http_status != 409) {
           return Restart(run, r, "delete ComputeDomainClique");
         }
         if (r.Ok()) {
           ++stats_.cliques_deleted;
           log_->info("{}: deleted ComputeDomainClique {}/{}", run->key, run->ns, name);
         }
         DeleteCliques(run, cliques);
       });
}

void Reconciler::Event(const RunPtr& run, std::string_view type, std::string_view reason, std::string_view note) {
  if (!events_) return;
  kube::ObjectReference regarding;
  regarding.api_version = std::string(kGroup) + "/" + std::string(kVersion);
  regarding.kind = "ComputeDomain";
  regarding.ns = run->ns;
  regarding.name = run->name;
  regarding.uid = run->uid;
  events_->Record(regarding, type, reason, "Reconcile", note);
}

}  // namespace gns::cd_controller
