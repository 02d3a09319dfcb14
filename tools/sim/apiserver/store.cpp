// The simulator's object store (see store.h). Every public method takes the mutex; the
// *Locked helpers expect it held.
#include "store.h"

#include <algorithm>
#include <regex>
#include <stdexcept>

#include "apply.h"

namespace gns::sim::api {
namespace {

constexpr std::string_view kMergePatch = "application/merge-patch+json";
constexpr std::string_view kJsonPatch = "application/json-patch+json";
constexpr std::string_view kStrategicPatch = "application/strategic-merge-patch+json";
constexpr std::string_view kApplyPatch = "application/apply-patch+yaml";

std::string Dump(const Json& value) {
  // Strings from YAML input may hold invalid UTF-8: replace rather than throw.
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string EventLine(std::string_view type, const Json& object) {
  Json event = {{"type", type}, {"object", object}};
  return Dump(event) + "\n";
}

Json& Meta(Json& object) {
  Json& meta = object["metadata"];
  if (!meta.is_object()) meta = Json::object();
  return meta;
}

const Json* MetaField(const Json& object, std::string_view field) {
  auto meta = object.find("metadata");
  if (meta == object.end() || !meta->is_object()) return nullptr;
  auto it = meta->find(field);
  return it == meta->end() ? nullptr : &*it;
}

std::vector<std::string> Finalizers(const Json& object) {
  std::vector<std::string> out;
  const Json* list = MetaField(object, "finalizers");
  if (list && list->is_array()) {
    for (const auto& item : *list) {
      if (item.is_string()) out.push_back(item.get<std::string>());
    }
  }
  return out;
}

bool HasField(const Json& object, std::string_view field) {
  const Json* value = MetaField(object, field);
  return value && !value->is_null();
}

// Everything a spec change means for metadata.generation: not metadata, not status.
Json SpecPart(const Json& object) {
  Json copy = object;
  copy.erase("metadata");
  copy.erase("status");
  return copy;
}

// What must differ for an update not to be a no-op (no new RV, no event).
Json NoopView(const Json& object) {
  Json copy = object;
  Json& meta = Meta(copy);
  meta.erase("resourceVersion");
  auto managed = meta.find("managedFields");
  if (managed != meta.end() && managed->is_array()) {
    for (auto& entry : *managed) {
      if (entry.is_object()) entry.erase("time");
    }
  }
  return copy;
}

bool ValidName(const ResourceKey& key, const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  if (key.group == "rbac.authorization.k8s.io") {
    // RBAC names are path segments ("system:node"), not DNS subdomains.
    return name != "." && name != ".." && name.find('/') == std::string::npos &&
           name.find('%') == std::string::npos;
  }
  static const std::regex kSubdomain("[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  return std::regex_match(name, kSubdomain);
}

Outcome TooLarge(std::uint64_t requested, std::uint64_t current) {
  return Fail(504, "Timeout",
              "Too large resource version: " + std::to_string(requested) +
                  ", current: " + std::to_string(current),
              Json{{"causes", Json::array({Json{{"reason", "ResourceVersionTooLarge"},
                                                {"message", "Too large resource version"}}})},
                   {"retryAfterSeconds", 1}});
}

}  // namespace

Store::Store(StoreOptions options)
    : options_(std::move(options)),
      rng_(options_.seed ? options_.seed
                         : (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()),
      rv_(options_.initial_resource_version),
      compacted_rv_(options_.initial_resource_version) {}

std::string Store::Now() const { return FormatTime(options_.now()); }

bool Store::HasStatusSubresource(const ResourceKey& key) const {
  return !options_.resources_without_status.contains(key.resource) &&
         !options_.resources_without_status.contains(key.Qualified());
}

std::string Store::KindFor(const ResourceKey& key) const {
  if (const KindInfo* info = FindKindByResource(key.group, key.resource)) return std::string(info->kind);
  auto it = learned_kinds_.find(key);
  if (it != learned_kinds_.end()) return it->second;
  return GuessKind(key.resource);
}

Json Store::ListItem(const ResourceKey& key, const Json& object) const {
  // The real server omits apiVersion/kind in items of built-in lists (typed objects) and
  // keeps them for CRDs (unstructured). Mirror that so clients depend on neither.
  if (!IsBuiltinGroup(key.group)) return object;
  Json copy = object;
  copy.erase("apiVersion");
  copy.erase("kind");
  return copy;
}

std::optional<Outcome> Store::CheckScope(const ApiPath& path) const {
  if (!path.subresource.empty() && path.subresource != "status") return NotFoundPath();
  if (!path.subresource.empty() && path.name.empty()) return NotFoundPath();
  const KindInfo* info = FindKindByResource(path.key.group, path.key.resource);
  if (!info) return std::nullopt;
  if (!info->namespaced && path.namespaced) return NotFoundPath();
  // A namespaced kind on a cluster URL: only list/watch/deletecollection (the callers decide
  // about the collection verbs); a named object needs its namespace.
  if (info->namespaced && !path.namespaced && !path.name.empty()) return NotFoundPath();
  return std::nullopt;
}

std::optional<Outcome> Store::CheckShape(const Json& object) const {
  if (!object.is_object()) return BadRequest("the request body is not a JSON object");
  auto meta = object.find("metadata");
  if (meta == object.end() || meta->is_null()) return std::nullopt;
  if (!meta->is_object()) return BadRequest("metadata: expected an object");
  for (const char* field : {"name", "generateName", "namespace", "resourceVersion", "uid",
                            "creationTimestamp", "deletionTimestamp"}) {
    auto it = meta->find(field);
    if (it != meta->end() && !it->is_null() && !it->is_string()) {
      return BadRequest(std::string("metadata.") + field + ": expected a string");
    }
  }
  for (const char* field : {"labels", "annotations"}) {
    auto it = meta->find(field);
    if (it == meta->end() || it->is_null()) continue;
    if (!it->is_object()) return BadRequest(std::string("metadata.") + field + ": expected an object");
    for (const auto& [key, value] : it->items()) {
      if (!value.is_string()) {
        return BadRequest(std::string("metadata.") + field + "." + key + ": expected a string");
      }
    }
  }
  auto finalizers = meta->find("finalizers");
  if (finalizers != meta->end() && !finalizers->is_null()) {
    if (!finalizers->is_array() ||
        !std::all_of(finalizers->begin(), finalizers->end(), [](const Json& f) { return f.is_string(); })) {
      return BadRequest("metadata.finalizers: expected a list of strings");
    }
  }
  return std::nullopt;
}

std::optional<Outcome> Store::CheckApiVersionAndKind(const ApiPath& path, Json& object) {
  const std::string gv = path.key.GroupVersion();
  auto api_version = object.find("apiVersion");
  if (api_version != object.end() && !api_version->is_null()) {
    if (!api_version->is_string() || api_version->get<std::string>() != gv) {
      return BadRequest("the API version in the data (" +
                        (api_version->is_string() ? api_version->get<std::string>() : Dump(*api_version)) +
                        ") does not match the expected API version (" + gv + ")");
    }
  }
  object["apiVersion"] = gv;
  auto kind = object.find("kind");
  const KindInfo* info = FindKindByResource(path.key.group, path.key.resource);
  if (kind != object.end() && !kind->is_null()) {
    if (!kind->is_string() || kind->get<std::string>().empty()) return BadRequest("kind: expected a string");
    if (info && kind->get<std::string>() != info->kind) {
      return BadRequest("the kind in the data (" + kind->get<std::string>() +
                        ") does not match the expected kind (" + std::string(info->kind) + ")");
    }
    if (!info && !learned_kinds_.contains(path.key)) learned_kinds_[path.key] = kind->get<std::string>();
  } else {
    object["kind"] = KindFor(path.key);
  }
  return std::nullopt;
}

ObjPtr Store::Find(const ApiPath& path) const {
  auto coll = collections_.find(path.key);
  if (coll == collections_.end()) return nullptr;
  auto it = coll->second.find({path.namespaced ? path.ns : "", path.name});
  return it == coll->second.end() ? nullptr : it->second;
}

ListMapKeys Store::ListMapsFor(const ResourceKey& key) const {
  auto crds = collections_.find(ResourceKey{"apiextensions.k8s.io", "v1", "customresourcedefinitions"});
  if (crds == collections_.end()) return {};
  for (const auto& [unused, crd] : crds->second) {
    const Json& spec = crd->value("spec", Json::object());
    if (!spec.is_object() || spec.value("group", Json()) != key.group) continue;
    const Json names = spec.value("names", Json::object());
    if (!names.is_object() || names.value("plural", Json()) != key.resource) continue;
    for (const auto& version : spec.value("versions", Json::array())) {
      if (!version.is_object() || version.value("name", Json()) != key.version) continue;
      const Json::json_pointer schema("/schema/openAPIV3Schema");
      if (version.contains(schema)) return ListMapsFromSchema(version.at(schema));
    }
  }
  return {};
}

Store::Collection Store::Snapshot(const ResourceKey& key, std::uint64_t rv) const {
  Collection snapshot;
  auto coll = collections_.find(key);
  if (coll != collections_.end()) snapshot = coll->second;
  // Roll newer events back, newest first.
  for (auto it = history_.rbegin(); it != history_.rend() && it->rv > rv; ++it) {
    if (it->key != key) continue;
    ObjectKey object_key{it->ns, it->name};
    if (it->type == EventType::kAdded) {
      snapshot.erase(object_key);
    } else {
      snapshot[object_key] = it->prev;
    }
  }
  return snapshot;
}

Outcome Store::Get(const ApiPath& path) {
  std::lock_guard lock(mu_);
  if (auto error = CheckScope(path)) return *error;
  ObjPtr object = Find(path);
  if (!object) return NotFound(path.key, path.name);
  return Outcome{200, *object, {}, {}};
}

Outcome Store::List(const ApiPath& path, const ListParams& params) {
  std::lock_guard lock(mu_);
  if (auto error = CheckScope(path)) return *error;
  LabelSelector labels;
  FieldSelector fields;
  std::string error;
  if (!labels.Parse(params.label_selector, &error)) return BadRequest(error);
  if (!fields.Parse(params.field_selector, &error)) return BadRequest(error);
  if (auto field = fields.Unsupported(path.key); !field.empty()) {
    return BadRequest("field label not supported: " + field);
  }

  std::uint64_t list_rv = rv_;
  std::optional<Collection> snapshot;
  std::optional<ObjectKey> start;
  const std::string rv = params.resource_version.value_or("");
  if (!params.continue_token.empty()) {
    if (!rv.empty()) return BadRequest("specifying resource version is not allowed when using continue");
    auto raw = Base64UrlDecode(params.continue_token);
    Json token = raw ? Json::parse(*raw, nullptr, false) : Json();
    if (!token.is_object() || !token.value("rv", Json()).is_number_unsigned() ||
        !token.value("start", Json()).is_string()) {
      return BadRequest("continue key is not valid: the continue token is malformed");
    }
    std::uint64_t token_rv = token["rv"].get<std::uint64_t>();
    std::string key = token["start"].get<std::string>();
    if (!key.empty() && key.back() == '\0') key.pop_back();
    std::size_t slash = key.find('/');
    if (slash == std::string::npos) return BadRequest("continue key is not valid: no start key");
    if (token_rv < compacted_rv_) {
      return Fail(410, "Expired",
                  "The provided continue parameter is too old to display a consistent list "
                  "result. You can start a new list without the continue parameter.");
    }
    snapshot = Snapshot(path.key, token_rv);
    list_rv = token_rv;
    start = ObjectKey{key.substr(0, slash), key.substr(slash + 1)};
  } else if (!params.resource_version_match.empty()) {
    if (!params.resource_version) {
      return BadRequest("resourceVersionMatch is forbidden unless resourceVersion is provided");
    }
    auto requested = ParseUint(rv);
    if (!requested) return BadRequest("resourceVersion: Invalid value: \"" + rv + "\": must be an integer");
    if (params.resource_version_match == "Exact") {
      if (*requested == 0) return BadRequest("resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"");
      if (*requested > rv_) return TooLarge(*requested, rv_);
      if (*requested < compacted_rv_) {
        return Fail(410, "Expired", "The resourceVersion for the provided list is too old.");
      }
      snapshot = Snapshot(path.key, *requested);
      list_rv = *requested;
    } else if (params.resource_version_match == "NotOlderThan") {
      if (*requested > rv_) return TooLarge(*requested, rv_);
    } else {
      return BadRequest("resourceVersionMatch: Unsupported value: \"" + params.resource_version_match +
                        "\": supported values: \"Exact\", \"NotOlderThan\"");
    }
  } else if (!rv.empty() && rv != "0") {
    // Legacy semantics of a plain resourceVersion: not older than.
    auto requested = ParseUint(rv);
    if (!requested) return BadRequest("resourceVersion: Invalid value: \"" + rv + "\": must be an integer");
    if (*requested > rv_) return TooLarge(*requested, rv_);
  }

  static const Collection kEmpty;
  const Collection* source = &kEmpty;
  if (snapshot) {
    source = &*snapshot;
  } else if (auto it = collections_.find(path.key); it != collections_.end()) {
    source = &it->second;
  }
  const bool count_remaining = labels.Empty() && fields.Empty();
  const auto limit = static_cast<std::size_t>(std::max<std::int64_t>(params.limit, 0));
  Json items = Json::array();
  std::optional<ObjectKey> last;
  bool more = false;
  std::int64_t remaining = 0;
  for (auto it = start ? source->upper_bound(*start) : source->begin(); it != source->end(); ++it) {
    if (path.namespaced && it->first.first != path.ns) continue;
    const Json& object = *it->second;
    if (!labels.Matches(object) || !fields.Matches(object)) continue;
    if (limit > 0 && items.size() >= limit) {
      more = true;
      ++remaining;
      if (!count_remaining) break;
      continue;
    }
    items.push_back(ListItem(path.key, object));
    last = it->first;
  }
  Json meta = {{"resourceVersion", std::to_string(list_rv)}};
  if (more && last) {
    Json token = {{"v", "meta.k8s.io/v1"},
                  {"rv", list_rv},
                  {"start", last->first + "/" + last->second + std::string(1, '\0')}};
    meta["continue"] = Base64UrlEncode(Dump(token));
    if (count_remaining) meta["remainingItemCount"] = remaining;
  }
  Json list = {{"kind", KindFor(path.key) + "List"},
               {"apiVersion", path.key.GroupVersion()},
               {"metadata", std::move(meta)},
               {"items", std::move(items)}};
  return Outcome{200, std::move(list), {}, {}};
}

Outcome Store::Create(const ApiPath& path, Json object, bool keep_status) {
  std::lock_guard lock(mu_);
  return CreateLocked(path, std::move(object), keep_status);
}

Outcome Store::CreateLocked(const ApiPath& path, Json object, bool keep_status) {
  if (auto error = CheckScope(path)) return *error;
  if (const KindInfo* info = FindKindByResource(path.key.group, path.key.resource);
      info && info->namespaced && !path.namespaced) {
    return MethodNotAllowed();
  }
  if (auto error = CheckShape(object)) return *error;
  if (auto error = CheckApiVersionAndKind(path, object)) return *error;
  const std::string kind = object["kind"].get<std::string>();
  Json& meta = Meta(object);
  if (path.namespaced) {
    std::string ns = MetaString(object, "namespace");
    if (!ns.empty() && ns != path.ns) {
      return BadRequest("the namespace of the provided object does not match the namespace sent on the request");
    }
    meta["namespace"] = path.ns;
  } else {
    meta.erase("namespace");
  }
  std::string name = MetaString(object, "name");
  const std::string generate_name = MetaString(object, "generateName");
  Collection& collection = collections_[path.key];
  const std::string ns = path.namespaced ? path.ns : "";
  if (name.empty()) {
    if (generate_name.empty()) {
      return Invalid(kind, path.key, "", "metadata.name",
                     "Required value: name or generateName is required");
    }
    // Retry on the (unlikely) collision, as the real generator's callers do.
    for (int attempt = 0; attempt < 8; ++attempt) {
      name = generate_name + RandomSuffix(rng_);
      if (!collection.contains({ns, name})) break;
    }
  }
  if (!ValidName(path.key, name)) {
    return Invalid(kind, path.key, name, "metadata.name",
                   "Invalid value: \"" + name +
                       "\": a lowercase RFC 1123 subdomain must consist of lower case "
                       "alphanumeric characters, '-' or '.', and must start and end with an "
                       "alphanumeric character");
  }
  if (collection.contains({ns, name})) return AlreadyExists(path.key, name);
  if (!keep_status && HasStatusSubresource(path.key)) object.erase("status");
  meta["name"] = name;
  meta["uid"] = RandomUuid(rng_);
  meta["creationTimestamp"] = Now();
  meta["generation"] = 1;
  meta["resourceVersion"] = std::to_string(++rv_);
  meta.erase("deletionTimestamp");
  meta.erase("deletionGracePeriodSeconds");
  meta.erase("selfLink");
  auto stored = std::make_shared<const Json>(std::move(object));
  collection[{ns, name}] = stored;
  Emit(EventType::kAdded, ApiPath{path.key, path.namespaced, path.ns, name, ""}, stored, nullptr);
  return Outcome{201, *stored, {}, {}};
}

Outcome Store::Update(const ApiPath& path, Json object) {
  std::lock_guard lock(mu_);
  if (auto error = CheckScope(path)) return *error;
  if (auto error = CheckShape(object)) return *error;
  if (auto error = CheckApiVersionAndKind(path, object)) return *error;
  std::string name = MetaString(object, "name");
  if (name != path.name) {
    return BadRequest("the name of the object (" + name + ") does not match the name on the URL (" +
                      path.name + ")");
  }
  std::string ns = MetaString(object, "namespace");
  if (path.namespaced && !ns.empty() && ns != path.ns) {
    return BadRequest("the namespace of the provided object does not match the namespace sent on the request");
  }
  ObjPtr current = Find(path);
  if (!current) return NotFound(path.key, path.name);
  std::string rv = MetaString(object, "resourceVersion");
  if (!rv.empty() && rv != MetaString(*current, "resourceVersion")) {
    return Conflict(path.key, path.name,
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again");
  }
  std::string uid = MetaString(object, "uid");
  if (!uid.empty() && uid != MetaString(*current, "uid")) {
    return Conflict(path.key, path.name,
                    "Precondition failed: UID in precondition: " + uid +
                        ", UID in object meta: " + MetaString(*current, "uid"));
  }
  return Commit(path, current, std::move(object), path.subresource == "status");
}

Outcome Store::Commit(const ApiPath& path, const ObjPtr& current, Json next, bool status_write) {
  Json result;
  if (status_write) {
    // The status subresource changes .status only (and apply's managedFields bookkeeping).
    result = *current;
    if (next.contains("status")) {
      result["status"] = next["status"];
    } else {
      result.erase("status");
    }
    if (const Json* managed = MetaField(next, "managedFields")) Meta(result)["managedFields"] = *managed;
  } else {
    result = std::move(next);
    if (HasStatusSubresource(path.key)) {
      if (current->contains("status")) {
        result["status"] = (*current)["status"];
      } else {
        result.erase("status");
      }
    }
    Json& meta = Meta(result);
    for (const char* field : {"uid", "creationTimestamp", "name", "namespace", "generation",
                              "deletionTimestamp", "deletionGracePeriodSeconds"}) {
      if (const Json* value = MetaField(*current, field)) {
        meta[field] = *value;
      } else {
        meta.erase(field);
      }
    }
    if (!meta.contains("managedFields")) {
      if (const Json* managed = MetaField(*current, "managedFields")) meta["managedFields"] = *managed;
    }
    if (HasField(*current, "deletionTimestamp")) {
      auto old_list = Finalizers(*current);
      std::vector<std::string> added;
      for (const auto& f : Finalizers(result)) {
        if (std::find(old_list.begin(), old_list.end(), f) == old_list.end()) added.push_back(f);
      }
      if (!added.empty()) {
        return Fail(422, "Invalid",
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the object "
                    "is being deleted, found new finalizers " + Dump(Json(added)));
      }
    }
    if (SpecPart(result) != SpecPart(*current)) {
      const Json* generation = MetaField(*current, "generation");
      meta["generation"] =
          generation && generation->is_number_integer() ? generation->get<std::int64_t>() + 1 : 1;
    }
  }
  // The type of a stored object never changes (the URL fixes it).
  result["apiVersion"] = current->at("apiVersion");
  result["kind"] = current->at("kind");
  Meta(result)["resourceVersion"] = MetaString(*current, "resourceVersion");
  if (NoopView(result) == NoopView(*current)) return Outcome{200, *current, {}, {}};

  Meta(result)["resourceVersion"] = std::to_string(++rv_);
  Collection& collection = collections_[path.key];
  ObjectKey key{path.namespaced ? path.ns : "", path.name};
  if (HasField(result, "deletionTimestamp") && Finalizers(result).empty()) {
    // The last finalizer is gone: the object is removed now, with a DELETED event only.
    auto final_state = std::make_shared<const Json>(std::move(result));
    collection.erase(key);
    Emit(EventType::kDeleted, path, final_state, current);
    return Outcome{200, *final_state, {}, {}};
  }
  auto stored = std::make_shared<const Json>(std::move(result));
  collection[key] = stored;
  Emit(EventType::kModified, path, stored, current);
  return Outcome{200, *stored, {}, {}};
}

Outcome Store::Patch(const ApiPath& path, std::string_view media_type, std::string_view body,
                     const PatchParams& params) {
  std::lock_guard lock(mu_);
  if (auto error = CheckScope(path)) return *error;
  const std::string media = LowerMediaType(media_type);
  const bool builtin = IsBuiltinGroup(path.key.group);
  const std::string accepted = std::string(kJsonPatch) + ", " + std::string(kMergePatch) + ", " +
                               std::string(kApplyPatch) +
                               (builtin ? ", " + std::string(kStrategicPatch) : "");
  if (media == kApplyPatch) return ApplyLocked(path, body, params);
  const bool merge = media == kMergePatch || (media == kStrategicPatch && builtin);
  if (!merge && media != kJsonPatch) return UnsupportedMediaType(accepted);
  ObjPtr current = Find(path);
  if (!current) return NotFound(path.key, path.name);
  Json patch = Json::parse(body, nullptr, false);
  if (patch.is_discarded()) return BadRequest("error decoding patch: invalid JSON");
  Json patched;
  if (merge) {
    // Strategic merge is treated as a JSON merge patch (lists replace, no $patch keys).
    patched = *current;
    patched.merge_patch(patch);
  } else {
    if (!patch.is_array()) return BadRequest("json: cannot unmarshal object into Go value of type jsonpatch.Patch");
    try {
      patched = current->patch(patch);
    } catch (const Json::out_of_range& e) {
      return Fail(422, "Invalid", std::string("the server rejected our request: ") + e.what());
    } catch (const Json::other_error& e) {
      // A failed "test" operation.
      return Fail(422, "Invalid", std::string("the server rejected our request: ") + e.what());
    } catch (const Json::exception& e) {
      return BadRequest(std::string("error decoding patch: ") + e.what());
    }
  }
  if (auto error = CheckShape(patched)) return *error;
  const std::string gv = path.key.GroupVersion();
  if (patched.value("apiVersion", Json(gv)) != Json(gv)) {
    return BadRequest("the API version in the data does not match the expected API version (" + gv + ")");
  }
  const std::string kind = current->value("kind", "");
  if (MetaString(patched, "name") != path.name) {
    return Invalid(kind, path.key, path.name, "metadata.name", "Invalid value: field is immutable");
  }
  if (path.namespaced && MetaString(patched, "namespace") != path.ns) {
    return Invalid(kind, path.key, path.name, "metadata.namespace", "Invalid value: field is immutable");
  }
  std::string rv = MetaString(patched, "resourceVersion");
  if (!rv.empty() && rv != MetaString(*current, "resourceVersion")) {
    return Conflict(path.key, path.name,
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again");
  }
  std::string uid = MetaString(patched, "uid");
  if (!uid.empty() && uid != MetaString(*current, "uid")) {
    return Conflict(path.key, path.name,
                    "Precondition failed: UID in precondition: " + uid +
                        ", UID in object meta: " + MetaString(*current, "uid"));
  }
  return Commit(path, current, std::move(patched), path.subresource == "status");
}

Outcome Store::ApplyLocked(const ApiPath& path, std::string_view body, const PatchParams& params) {
  if (params.field_manager.empty()) {
    return Fail(422, "Invalid",
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is "
                "required for apply patch",
                Json{{"group", "meta.k8s.io"},
                     {"kind", "PatchOptions"},
                     {"causes", Json::array({Json{{"reason", "FieldValueRequired"},
                                                  {"message", "Required value: is required for apply patch"},
                                                  {"field", "fieldManager"}}})}});
  }
  std::vector<Json> documents;
  std::string error;
  if (!YamlToJson(body, &documents, &error)) return BadRequest("error decoding YAML: " + error);
  if (documents.size() != 1 || !documents[0].is_object()) {
    return BadRequest("error decoding YAML: the apply body must be exactly one object");
  }
  Json& applied = documents[0];
  if (auto shape_error = CheckShape(applied)) return *shape_error;
  const std::string gv = path.key.GroupVersion();
  if (!applied.value("apiVersion", Json()).is_string()) return BadRequest("apiVersion must be set in the apply body");
  if (!applied.value("kind", Json()).is_string()) return BadRequest("kind must be set in the apply body");
  if (applied["apiVersion"] != gv) {
    return BadRequest("the API version in the data (" + applied["apiVersion"].get<std::string>() +
                      ") does not match the expected API version (" + gv + ")");
  }
  if (const KindInfo* info = FindKindByResource(path.key.group, path.key.resource);
      info && applied["kind"] != info->kind) {
    return BadRequest("the kind in the data (" + applied["kind"].get<std::string>() +
                      ") does not match the expected kind (" + std::string(info->kind) + ")");
  }
  std::string name = MetaString(applied, "name");
  if (!name.empty() && name != path.name) {
    return BadRequest("the name of the object (" + name + ") does not match the name on the URL (" +
                      path.name + ")");
  }
  std::string ns = MetaString(applied, "namespace");
  if (path.namespaced && !ns.empty() && ns != path.ns) {
    return BadRequest("the namespace of the provided object does not match the namespace sent on the request");
  }
  Json& meta = Meta(applied);
  meta["name"] = path.name;
  if (path.namespaced) meta["namespace"] = path.ns;

  ApplyScope scope = path.subresource == "status" ? ApplyScope::kStatus
                     : HasStatusSubresource(path.key) ? ApplyScope::kMainWithStatusSubresource
                                                      : ApplyScope::kMainWithoutStatusSubresource;
  ObjPtr current = Find(path);
  if (!current && scope == ApplyScope::kStatus) return NotFound(path.key, path.name);
  std::string rv = MetaString(applied, "resourceVersion");
  if (current && !rv.empty() && rv != MetaString(*current, "resourceVersion")) {
    return Conflict(path.key, path.name,
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again");
  }
  const ListMapKeys list_maps = ListMapsFor(path.key);
  ApplyRequest request{current.get(), &applied, params.field_manager, params.force, scope, gv, Now(), &list_maps};
  ApplyResult result = ApplyMerge(request);
  if (!result.invalid.empty()) {
    return Fail(422, "Invalid", std::string(applied.value("kind", "")) + " \"" + path.name + "\" is invalid: " +
                                    result.invalid);
  }
  if (!result.conflicts.empty()) {
    std::string message = "Apply failed with " + std::to_string(result.conflicts.size()) +
                          (result.conflicts.size() == 1 ? " conflict:" : " conflicts:");
    Json causes = Json::array();
    for (const auto& [manager, field] : result.conflicts) {
      message += " conflict with \"" + manager + "\": " + field;
      causes.push_back(Json{{"reason", "FieldManagerConflict"},
                            {"message", "conflict with \"" + manager + "\""},
                            {"field", field}});
    }
    Json details = {{"name", path.name}, {"kind", path.key.resource}, {"causes", std::move(causes)}};
    if (!path.key.group.empty()) details["group"] = path.key.group;
    return Fail(409, "Conflict", message, std::move(details));
  }
  if (!current) {
    ApiPath collection = path;
    collection.name.clear();
    return CreateLocked(collection, std::move(result.object), true);
  }
  return Commit(path, current, std::move(result.object), scope == ApplyScope::kStatus);
}

Outcome Store::Delete(const ApiPath& path, const Json& options) {
  std::lock_guard lock(mu_);
  if (auto error = CheckScope(path)) return *error;
  ObjPtr current = Find(path);
  if (!current) return NotFound(path.key, path.name);
  if (options.is_object()) {
    auto pre = options.find("preconditions");
    if (pre != options.end() && pre->is_object()) {
      auto uid = pre->find("uid");
      if (uid != pre->end() && uid->is_string() && *uid != MetaString(*current, "uid")) {
        return Conflict(path.key, path.name,
                        "Precondition failed: UID in precondition: " + uid->get<std::string>() +
                            ", UID in object meta: " + MetaString(*current, "uid"));
      }
      auto rv = pre->find("resourceVersion");
      if (rv != pre->end() && rv->is_string() && *rv != MetaString(*current, "resourceVersion")) {
        return Conflict(path.key, path.name,
                        "Precondition failed: ResourceVersion in precondition: " + rv->get<std::string>() +
                            ", ResourceVersion in object meta: " + MetaString(*current, "resourceVersion"));
      }
    }
  }
  return DeleteLocked(path, current);
}

Outcome Store::DeleteLocked(const ApiPath& path, const ObjPtr& current) {
  Collection& collection = collections_[path.key];
  ObjectKey key{path.namespaced ? path.ns : "", path.name};
  if (!Finalizers(*current).empty()) {
    // Graceful: mark, keep, and let whoever owns the finalizers finish the deletion.
    if (HasField(*current, "deletionTimestamp")) return Outcome{200, *current, {}, {}};
    Json next = *current;
    Json& meta = Meta(next);
    meta["deletionTimestamp"] = Now();
    meta["deletionGracePeriodSeconds"] = 0;
    if (meta.contains("generation") && meta["generation"].is_number_integer()) {
      meta["generation"] = meta["generation"].get<std::int64_t>() + 1;
    }
    meta["resourceVersion"] = std::to_string(++rv_);
    auto stored = std::make_shared<const Json>(std::move(next));
    collection[key] = stored;
    Emit(EventType::kModified, path, stored, current);
    return Outcome{200, *stored, {}, {}};
  }
  Json final_state = *current;
  Meta(final_state)["resourceVersion"] = std::to_string(++rv_);
  auto stored = std::make_shared<const Json>(std::move(final_state));
  collection.erase(key);
  Emit(EventType::kDeleted, path, stored, current);
  Json details = {{"name", path.name}, {"kind", path.key.resource}, {"uid", MetaString(*current, "uid")}};
  if (!path.key.group.empty()) details["group"] = path.key.group;
  Json status = {{"kind", "Status"},
                 {"apiVersion", "v1"},
                 {"metadata", Json::object()},
                 {"status", "Success"},
                 {"details", std::move(details)}};
  return Outcome{200, std::move(status), {}, {}};
}

Outcome Store::DeleteCollection(const ApiPath& path, const ListParams& params) {
  std::lock_guard lock(mu_);
  if (auto error = CheckScope(path)) return *error;
  LabelSelector labels;
  FieldSelector fields;
  std::string error;
  if (!labels.Parse(params.label_selector, &error)) return BadRequest(error);
  if (!fields.Parse(params.field_selector, &error)) return BadRequest(error);
  if (auto field = fields.Unsupported(path.key); !field.empty()) {
    return BadRequest("field label not supported: " + field);
  }
  Collection snapshot = collections_[path.key];
  Json items = Json::array();
  for (const auto& [key, object] : snapshot) {
    if (path.namespaced && key.first != path.ns) continue;
    if (!labels.Matches(*object) || !fields.Matches(*object)) continue;
    ApiPath one{path.key, !key.first.empty(), key.first, key.second, ""};
    DeleteLocked(one, object);
    items.push_back(ListItem(path.key, *object));
  }
  Json list = {{"kind", KindFor(path.key) + "List"},
               {"apiVersion", path.key.GroupVersion()},
               {"metadata", Json{{"resourceVersion", std::to_string(rv_)}}},
               {"items", std::move(items)}};
  return Outcome{200, std::move(list), {}, {}};
}

void Store::Seed(Json object) {
  std::lock_guard lock(mu_);
  if (!object.is_object()) throw std::runtime_error("seed: an item is not an object");
  std::string hint;
  if (auto it = object.find("_resource"); it != object.end()) {
    if (!it->is_string()) throw std::runtime_error("seed: _resource must be a string");
    hint = it->get<std::string>();
    object.erase(it);
  }
  if (!object.value("apiVersion", Json()).is_string() || !object.value("kind", Json()).is_string()) {
    throw std::runtime_error("seed: every object needs apiVersion and kind");
  }
  const std::string api_version = object["apiVersion"].get<std::string>();
  const std::string kind = object["kind"].get<std::string>();
  ApiPath path;
  if (!hint.empty() && hint.front() == '/') {
    auto parsed = ParseApiPath(hint);
    if (!parsed || !parsed->name.empty()) {
      throw std::runtime_error("seed: _resource \"" + hint + "\" is not a collection path");
    }
    path = *parsed;
  } else {
    std::size_t slash = api_version.find('/');
    path.key.group = slash == std::string::npos ? "" : api_version.substr(0, slash);
    path.key.version = slash == std::string::npos ? api_version : api_version.substr(slash + 1);
    const KindInfo* info = FindKindByKind(path.key.group, kind);
    path.key.resource = !hint.empty() ? hint : info ? std::string(info->resource) : GuessPlural(kind);
    if (const KindInfo* by_resource = FindKindByResource(path.key.group, path.key.resource)) info = by_resource;
    std::string ns = MetaString(object, "namespace");
    path.namespaced = info ? info->namespaced : !ns.empty();
    if (path.namespaced) path.ns = ns.empty() ? "default" : ns;
  }
  if (!FindKindByResource(path.key.group, path.key.resource)) learned_kinds_[path.key] = kind;
  Outcome outcome = CreateLocked(path, std::move(object), true);
  if (!outcome.ok()) {
    throw std::runtime_error("seed: " + outcome.body.value("message", std::string("rejected")));
  }
}

// ---- watch

Store::WatchStart Store::Watch(const ApiPath& path, const WatchParams& params,
                               std::function<void()> wake) {
  std::lock_guard lock(mu_);
  if (auto error = CheckScope(path)) return {*error, nullptr};
  auto watcher = std::make_shared<Watcher>();
  std::string error;
  if (!watcher->labels.Parse(params.label_selector, &error)) return {BadRequest(error), nullptr};
  if (!watcher->fields.Parse(params.field_selector, &error)) return {BadRequest(error), nullptr};
  if (auto field = watcher->fields.Unsupported(path.key); !field.empty()) {
    return {BadRequest("field label not supported: " + field), nullptr};
  }
  // A watch on a named URL is the old form of fieldSelector=metadata.name=<name>.
  if (!path.name.empty()) watcher->fields.RequireName(path.name);
  const std::string rv = params.resource_version.value_or("");
  if (!params.resource_version_match.empty()) {
    if (!params.resource_version) {
      return {BadRequest("resourceVersionMatch is forbidden unless resourceVersion is provided"), nullptr};
    }
    if (params.resource_version_match != "NotOlderThan") {
      return {BadRequest("resourceVersionMatch: Unsupported value: \"" + params.resource_version_match +
                         "\" for watch"),
              nullptr};
    }
  }
  if (params.send_initial_events) {
    if (params.resource_version_match != "NotOlderThan") {
      return {BadRequest("sendInitialEvents is forbidden for watch unless resourceVersionMatch is NotOlderThan"),
              nullptr};
    }
    if (*params.send_initial_events && !params.bookmarks) {
      return {BadRequest("sendInitialEvents requires setting allowWatchBookmarks to true"), nullptr};
    }
  }
  std::optional<std::uint64_t> requested;
  if (!rv.empty()) {
    requested = ParseUint(rv);
    if (!requested) return {BadRequest("resourceVersion: Invalid value: \"" + rv + "\": must be an integer"), nullptr};
  }

  watcher->id = next_watch_id_++;
  watcher->path = path;
  watcher->path.name.clear();
  watcher->kind = KindFor(path.key);
  watcher->api_version = path.key.GroupVersion();
  watcher->wake = std::move(wake);
  watcher->info.id = watcher->id;
  watcher->info.path = path.key.CollectionPath(path.namespaced, path.ns);
  watcher->info.resource_version = rv;
  watcher->info.label_selector = params.label_selector;
  watcher->info.field_selector = params.field_selector;
  watcher->info.bookmarks = params.bookmarks;

  bool initial = !requested || *requested == 0;
  if (params.send_initial_events) initial = *params.send_initial_events;
  if (!initial && requested && *requested != 0) {
    if (*requested < compacted_rv_) {
      if (expired_mode_ == ExpiredWatchMode::kHttpStatus) {
        return {Fail(410, "Expired",
                     "too old resource version: " + rv + " (" + std::to_string(compacted_rv_) + ")"),
                nullptr};
      }
      QueueExpired(*watcher, rv);
    } else {
      for (const auto& event : history_) {
        if (event.rv <= *requested || event.key != path.key) continue;
        if (path.namespaced && event.ns != path.ns) continue;
        Deliver(*watcher, event.type, event.object, event.prev, event.rv);
      }
    }
  } else if (initial) {
    auto coll = collections_.find(path.key);
    if (coll != collections_.end()) {
      for (const auto& [key, object] : coll->second) {
        if (path.namespaced && key.first != path.ns) continue;
        if (!watcher->labels.Matches(*object) || !watcher->fields.Matches(*object)) continue;
        QueueLine(*watcher, EventLine("ADDED", *object));
      }
    }
    if (params.send_initial_events.value_or(false)) {
      Json bookmark = {{"kind", watcher->kind},
                       {"apiVersion", watcher->api_version},
                       {"metadata", Json{{"resourceVersion", std::to_string(rv_)},
                                         {"annotations", Json{{"k8s.io/initial-events-end", "true"}}}}}};
      QueueLine(*watcher, EventLine("BOOKMARK", bookmark));
    }
  }
  watchers_[watcher->id] = watcher;
  return {std::nullopt, watcher};
}

void Store::QueueLine(Watcher& watcher, std::string line) {
  watcher.lines.push_back(std::move(line));
  if (watcher.lines.size() > options_.max_watch_queue) {
    // The real server drops watchers that fall this far behind; the client reconnects.
    watcher.cut = true;
  }
  if (watcher.wake) watcher.wake();
}

void Store::QueueExpired(Watcher& watcher, const std::string& requested) {
  Json status = MakeStatus(410, "Expired",
                           "too old resource version: " + requested + " (" +
                               std::to_string(compacted_rv_) + ")");
  watcher.ended = true;
  QueueLine(watcher, EventLine("ERROR", status));
}

void Store::Deliver(Watcher& watcher, EventType type, const ObjPtr& object, const ObjPtr& prev,
                    std::uint64_t rv) {
  if (watcher.ended || watcher.cut) return;
  auto matches = [&](const Json& o) { return watcher.labels.Matches(o) && watcher.fields.Matches(o); };
  if (type == EventType::kDeleted) {
    if (matches(*object)) QueueLine(watcher, EventLine("DELETED", *object));
    return;
  }
  bool now_matches = matches(*object);
  bool was_matching = prev && matches(*prev);
  if (now_matches && was_matching) {
    QueueLine(watcher, EventLine("MODIFIED", *object));
  } else if (now_matches) {
    QueueLine(watcher, EventLine("ADDED", *object));
  } else if (was_matching) {
    // As the real watch cache does: the previous state, with the event's resourceVersion.
    Json gone = *prev;
    Meta(gone)["resourceVersion"] = std::to_string(rv);
    QueueLine(watcher, EventLine("DELETED", gone));
  }
}

void Store::Emit(EventType type, const ApiPath& path, const ObjPtr& object, const ObjPtr& prev) {
  const std::string ns = path.namespaced ? path.ns : "";
  const auto now = std::chrono::steady_clock::now();
  history_.push_back(Event{rv_, path.key, ns, path.name, type, object, prev, now});
  while (history_.size() > options_.max_history ||
         (history_.size() > 1 && now - history_.front().at > options_.history_window)) {
    compacted_rv_ = history_.front().rv;
    history_.pop_front();
  }
  for (auto& [id, watcher] : watchers_) {
    if (watcher->path.key != path.key) continue;
    if (watcher->path.namespaced && watcher->path.ns != ns) continue;
    Deliver(*watcher, type, object, prev, rv_);
  }
}

WatchBatch Store::Take(Watcher& watcher) {
  std::lock_guard lock(mu_);
  WatchBatch batch;
  batch.lines.assign(std::make_move_iterator(watcher.lines.begin()),
                     std::make_move_iterator(watcher.lines.end()));
  watcher.lines.clear();
  watcher.info.lines_sent += batch.lines.size();
  batch.ended = watcher.ended;
  batch.cut = watcher.cut;
  return batch;
}

void Store::QueueBookmark(Watcher& watcher) {
  std::lock_guard lock(mu_);
  if (watcher.ended || watcher.cut) return;
  // rv_ is safe to announce: every event up to it is already queued (same mutex).
  Json bookmark = {{"kind", watcher.kind},
                   {"apiVersion", watcher.api_version},
                   {"metadata", Json{{"resourceVersion", std::to_string(rv_)}}}};
  QueueLine(watcher, EventLine("BOOKMARK", bookmark));
}

void Store::Unwatch(const Watcher& watcher) {
  std::lock_guard lock(mu_);
  watchers_.erase(watcher.id);
}

std::vector<WatchInfo> Store::OpenWatches() {
  std::lock_guard lock(mu_);
  std::vector<WatchInfo> out;
  for (const auto& [id, watcher] : watchers_) out.push_back(watcher->info);
  return out;
}

void Store::Compact() {
  std::lock_guard lock(mu_);
  compacted_rv_ = rv_;
  history_.clear();
}

void Store::ExpireWatches() {
  std::lock_guard lock(mu_);
  compacted_rv_ = rv_;
  history_.clear();
  for (auto& [id, watcher] : watchers_) {
    if (watcher->ended || watcher->cut) continue;
    QueueExpired(*watcher, watcher->info.resource_version);
  }
}

void Store::CutWatches() {
  std::lock_guard lock(mu_);
  for (auto& [id, watcher] : watchers_) {
    watcher->cut = true;
    if (watcher->wake) watcher->wake();
  }
}

void Store::SetExpiredWatchMode(ExpiredWatchMode mode) {
  std::lock_guard lock(mu_);
  expired_mode_ = mode;
}

std::uint64_t Store::CurrentResourceVersion() {
  std::lock_guard lock(mu_);
  return rv_;
}

std::vector<ResourceSummary> Store::Resources() {
  std::lock_guard lock(mu_);
  std::map<ResourceKey, ResourceSummary> out;
  for (const auto& info : AllKinds()) {
    for (const auto& version : ServedVersions(info.group)) {
      ResourceKey key{std::string(info.group), std::string(version), std::string(info.resource)};
      out[key] = ResourceSummary{key, std::string(info.kind), info.namespaced, HasStatusSubresource(key)};
    }
  }
  for (const auto& [key, collection] : collections_) {
    if (out.contains(key)) continue;
    bool namespaced = std::any_of(collection.begin(), collection.end(),
                                  [](const auto& entry) { return !entry.first.first.empty(); });
    if (const KindInfo* info = FindKindByResource(key.group, key.resource)) namespaced = info->namespaced;
    out[key] = ResourceSummary{key, KindFor(key), namespaced, HasStatusSubresource(key)};
  }
  std::vector<ResourceSummary> list;
  for (auto& [key, summary] : out) list.push_back(std::move(summary));
  return list;
}

std::uint64_t Store::CompactedResourceVersion() {
  std::lock_guard lock(mu_);
  return compacted_rv_;
}

}  // namespace gns::sim::api
