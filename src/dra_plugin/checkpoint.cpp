// The DRA driver's checkpoint: format, verification and file handling.
//
// File layout (version 1):
//   {"kind": "gns-dra-compute-domain-checkpoint", "version": 1, "checksum": <crc32>,
//    "data": {"preparedClaims": {"<uid>": {...}}}}
// The checksum covers data's compact serialization, which nlohmann emits with sorted keys, so it
// survives a parse/dump round trip.
#include "dra_plugin/checkpoint.hpp"


#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace gns::dra {

namespace {

constexpr std::string_view kKind = "gns-dra-compute-domain-checkpoint";

using nlohmann::json;

// Reads one field with a precise complaint on a wrong type; the shape checks below turn every
// complaint into kCorrupt.
struct ShapeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const json& Field(const json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end()) throw ShapeError(where + "." + key + ": missing");
  return *it;
}

std::string StringField(const json& object, const char* key, const std::string& where, bool required_non_empty) {
  const json& value = Field(object, key, where);
  if (!value.is_string()) throw ShapeError(where + "." + key + ": expected a string, got " + value.type_name());
  std::string out = value.get<std::string>();
  if (required_non_empty && out.empty()) throw ShapeError(where + "." + key + ": empty");
  return out;
}

int64_t IntField(const json& object, const char* key, const std::string& where) {
  const json& value = Field(object, key, where);
  if (!value.is_number_integer()) throw ShapeError(where + "." + key + ": expected an integer, got " + value.type_name());
  return value.get<int64_t>();
}

json DataOf(const Checkpoint& checkpoint) {
  json claims = json::object();
  for (const auto& [uid, claim] : checkpoint.claims) {
    json entry;
    to_json(entry, claim);
    entry.erase("uid");  // the key is the UID
    claims[uid] = std::move(entry);
  }
  json data{{"preparedClaims", std::move(claims)}};
  if (checkpoint.log_seq != 0) data["logSeq"] = checkpoint.log_seq;
  return data;
}

std::string Compact(const json& value) {
  // replace: a stray invalid UTF-8 byte must not make a save throw.
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The members of a record the core reads and writes; the rest are the driver's (driver_data).
bool IsCoreMember(std::string_view key) {
  static constexpr std::array<std::string_view, 12> kCore = {
      "uid",         "namespace",   "name",           "state",           "device",     "poolName",
      "requestNames", "cdiSpecFile", "cdiDeviceID", "startedAtUnixMs", "completedAtUnixMs", "moreDevices"};
  for (const auto core : kCore) {
    if (key == core) return true;
  }
  return false;
}

PreparedClaim ParseEntry(const std::string& uid, const json& entry, const std::string& where) {
  if (!entry.is_object()) throw ShapeError(where + ": expected an object, got " + std::string(entry.type_name()));
  PreparedClaim claim;
  claim.uid = uid;
  claim.namespace_name = StringField(entry, "namespace", where, true);
  claim.name = StringField(entry, "name", where, true);
  const std::string state = StringField(entry, "state", where, true);
  const auto parsed_state = ParseClaimState(state);
  if (!parsed_state) throw ShapeError(where + ".state: unknown state \"" + state + "\"");
  claim.state = *parsed_state;
  claim.device = StringField(entry, "device", where, true);
  claim.pool_name = StringField(entry, "poolName", where, false);
  const json& requests = Field(entry, "requestNames", where);
  if (!requests.is_array()) throw ShapeError(where + ".requestNames: expected an array");
  for (const json& request : requests) {
    if (!request.is_string()) throw ShapeError(where + ".requestNames[]: expected strings");
    claim.request_names.push_back(request.get<std::string>());
  }
  claim.cdi_spec_file = StringField(entry, "cdiSpecFile", where, false);
  claim.cdi_device_id = StringField(entry, "cdiDeviceID", where, false);
  claim.started_unix_ms = IntField(entry, "startedAtUnixMs", where);
  claim.completed_unix_ms = IntField(entry, "completedAtUnixMs", where);
  if (const auto more = entry.find("moreDevices"); more != entry.end()) {
    if (!more->is_array()) throw ShapeError(where + ".moreDevices: expected an array");
    for (const json& device : *more) {
      const std::string at = where + ".moreDevices[]";
      if (!device.is_object()) throw ShapeError(at + ": expected an object");
      PreparedClaimDevice d;
      d.device = StringField(device, "device", at, true);
      const json& names = Field(device, "requestNames", at);
      if (!names.is_array()) throw ShapeError(at + ".requestNames: expected an array");
      for (const json& n : names) {
        if (!n.is_string()) throw ShapeError(at + ".requestNames[]: expected strings");
        d.request_names.push_back(n.get<std::string>());
      }
      d.cdi_device_id = StringField(device, "cdiDeviceID", at, false);
      claim.more_devices.push_back(std::move(d));
    }
  }
  // The driver's own members: everything the core does not name.
  for (const auto& [key, value] : entry.items()) {
    if (IsCoreMember(key)) continue;
    claim.driver_data[key] = value;
  }
  return claim;
}

CheckpointLoadResult Corrupt(std::string why) {
  CheckpointLoadResult result;
  result.status = CheckpointStatus::kCorrupt;
  result.error = std::move(why);
  return result;
}

}  // namespace

std::string_view ToString(ClaimState state) {
  switch (state) {
    case ClaimState::kPrepareStarted:
      return "PrepareStarted";
    case ClaimState::kPrepareCompleted:
      return "PrepareCompleted";
  }
  return "unknown";
}

std::optional<ClaimState> ParseClaimState(std::string_view text) {
  if (text == "PrepareStarted") return ClaimState::kPrepareStarted;
  if (text == "PrepareCompleted") return ClaimState::kPrepareCompleted;
  return std::nullopt;
}

std::string_view ToString(CheckpointStatus status) {
  switch (status) {
    case CheckpointStatus::kLoaded:
      return "loaded";
    case CheckpointStatus::kMissing:
      return "missing";
    case CheckpointStatus::kCorrupt:
      return "corrupt";
    case CheckpointStatus::kUnreadable:
      return "unreadable";
  }
  return "unknown";
}

const PreparedClaim* Checkpoint::Find(std::string_view uid) const {
  const auto it = claims.find(std::string(uid));
  return it == claims.end() ? nullptr : &it->second;
}

const PreparedClaim* Checkpoint::CompletedHolderOf(std::string_view device, std::string_view except_uid) const {
  for (const auto& [uid, claim] : claims) {
    if (uid == except_uid) continue;
    if (claim.state != ClaimState::kPrepareCompleted) continue;
    if (claim.device == device) return &claim;
    for (const auto& more : claim.more_devices) {
      if (more.device == device) return &claim;
    }
  }
  return nullptr;
}

std::vector<PreparedClaimDevice> PreparedClaim::Devices() const {
  std::vector<PreparedClaimDevice> devices;
  devices.push_back(PreparedClaimDevice{device, request_names, cdi_device_id});
  devices.insert(devices.end(), more_devices.begin(), more_devices.end());
  return devices;
}

void to_json(nlohmann::json& j, const PreparedClaim& claim) {
  j = json::object();
  // The driver's members first: a core member of the same name (a driver bug) is overwritten.
  if (claim.driver_data.is_object()) {
    for (const auto& [key, value] : claim.driver_data.items()) j[key] = value;
  }
  j["uid"] = claim.uid;
  j["namespace"] = claim.namespace_name;
  j["name"] = claim.name;
  j["state"] = ToString(claim.state);
  j["device"] = claim.device;
  j["poolName"] = claim.pool_name;
  j["requestNames"] = claim.request_names;
  j["cdiSpecFile"] = claim.cdi_spec_file;
  j["cdiDeviceID"] = claim.cdi_device_id;
  j["startedAtUnixMs"] = claim.started_unix_ms;
  j["completedAtUnixMs"] = claim.completed_unix_ms;
  if (!claim.more_devices.empty()) {
    json more = json::array();
    for (const auto& d : claim.more_devices) {
      more.push_back(json{{"device", d.device}, {"requestNames", d.request_names}, {"cdiDeviceID", d.cdi_device_id}});
    }
    j["moreDevices"] = std::move(more);
  }
}

PreparedClaim ClaimFromJson(const std::string& uid, const nlohmann::json& entry, const std::string& where) {
  return ParseEntry(uid, entry, where);
}

uint32_t Crc32(std::string_view data) {
  static const std::array<uint32_t, 256> kTable = [] {
    std::array<uint32_t, 256> table{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    return table;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (const char ch : data) crc = kTable[(crc ^ static_cast<unsigned char>(ch)) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

std::string SerializeCheckpoint(const Checkpoint& checkpoint) {
  const json data = DataOf(checkpoint);
  const json file{{"kind", kKind}, {"version", kCheckpointVersion}, {"checksum", Crc32(Compact(data))}, {"data", data}};
  // Indented for the operator who opens it; the checksum is over data's compact form.
  return file.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

CheckpointLoadResult ParseCheckpoint(std::string_view text) {
  json file = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (file.is_discarded()) return Corrupt("not valid JSON (truncated or overwritten?)");
  if (!file.is_object()) return Corrupt(std::string("top level is ") + file.type_name() + ", expected an object");
  try {
    const std::string kind = StringField(file, "kind", "checkpoint", true);
    if (kind != kKind) return Corrupt("kind is \"" + kind + "\", expected \"" + std::string(kKind) + "\"");
    const int64_t version = IntField(file, "version", "checkpoint");
    if (version != kCheckpointVersion) {
      return Corrupt("unknown version " + std::to_string(version) + " (this build reads version " +
                     std::to_string(kCheckpointVersion) + ")");
    }
    const json& checksum = Field(file, "checksum", "checkpoint");
    if (!checksum.is_number_unsigned() || checksum.get<uint64_t>() > 0xFFFFFFFFu) {
      return Corrupt("checkpoint.checksum: expected a 32-bit unsigned integer");
    }
    const json& data = Field(file, "data", "checkpoint");
    if (!data.is_object()) return Corrupt(std::string("checkpoint.data: expected an object, got ") + data.type_name());
    const uint32_t actual = Crc32(Compact(data));
    if (actual != checksum.get<uint64_t>()) {
      return Corrupt("checksum mismatch: file says " + std::to_string(checksum.get<uint64_t>()) + ", content has " +
                     std::to_string(actual));
    }
    const json& claims = Field(data, "preparedClaims", "data");
    if (!claims.is_object()) return Corrupt("data.preparedClaims: expected an object");
    CheckpointLoadResult result;
    result.status = CheckpointStatus::kLoaded;
    for (const auto& [uid, entry] : claims.items()) {
      if (uid.empty()) return Corrupt("data.preparedClaims: empty claim UID");
      result.checkpoint.claims.emplace(uid, ParseEntry(uid, entry, "data.preparedClaims[\"" + uid + "\"]"));
    }
    if (data.contains("logSeq")) {
      const json& seq = data["logSeq"];
      if (!seq.is_number_unsigned()) return Corrupt("data.logSeq: expected an unsigned integer");
      result.checkpoint.log_seq = seq.get<uint64_t>();
    }
    return result;
  } catch (const ShapeError& e) {
    return Corrupt(e.what());
  } catch (const std::exception& e) {
    // nlohmann type errors we did not foresee: still a file we cannot trust.
    return Corrupt(std::string("unexpected content: ") + e.what());
  }
}

CheckpointLoadResult LoadCheckpoint(const std::string& path) {
  CheckpointLoadResult result;
  try {
    auto read = ReadStateFile(path);
    switch (read.status) {
      case StateFileRead::Status::kMissing:
        result.status = CheckpointStatus::kMissing;
        return result;
      case StateFileRead::Status::kRejected:
        // Not a regular file, or far too large: nothing in it can be trusted.
        return Corrupt(read.error);
      case StateFileRead::Status::kUnreadable:
        result.status = CheckpointStatus::kUnreadable;
        result.error = read.error;
        return result;
      case StateFileRead::Status::kRead:
        break;
    }
    result = ParseCheckpoint(read.content);
    if (result.status == CheckpointStatus::kCorrupt) result.error = path + ": " + result.error;
    return result;
  } catch (const std::exception& e) {
    result = CheckpointLoadResult{};
    result.status = CheckpointStatus::kUnreadable;
    result.error = path + ": " + e.what();
    return result;
  }
}

FileWriteResult SaveCheckpoint(const std::string& path, const Checkpoint& checkpoint) {
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    std::string error;
    // 0700: claim names and namespaces are nobody else's business on the host.
    if (!EnsureDirectory(path.substr(0, slash), 0700, error)) return FileWriteResult{false, error};
  }
  std::string content;
  try {
    content = SerializeCheckpoint(checkpoint);
  } catch (const std::exception& e) {
    return FileWriteResult{false, std::string("serialize checkpoint: ") + e.what()};
  }
  return WriteFileAtomically(path, content, 0600);
}

MoveAsideResult MoveCorruptCheckpointAside(const std::string& path, int64_t unix_seconds) {
  return MoveStateFileAside(path, unix_seconds);
}

}  // namespace gns::dra
