// The driver-managed domain record.
#include "modules/dra_compute_domain/domain_record.hpp"

#include "loop/state_file.hpp"

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace gns::dra {

using nlohmann::json;

namespace {
constexpr int kRecordVersion = 1;

bool Str(const json& obj, const char* key, const std::string& where, std::string& out, std::string& error) {
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_string() || it->get<std::string>().empty()) {
    error = where + "." + key + ": expected a non-empty string";
    return false;
  }
  out = it->get<std::string>();
  return true;
}
}  // namespace

std::string SerializeDomainRecord(const DomainRecord& record) {
  json domains = json::object();
  for (const auto& [uid, d] : record.domains) {
    json claims = json::object();
    for (const auto& [cuid, c] : d.claims) claims[cuid] = {{"namespace", c.namespace_name}, {"name", c.name}};
    domains[uid] = {{"namespace", d.namespace_name}, {"name", d.name}, {"claims", std::move(claims)}};
  }
  return json{{"version", kRecordVersion}, {"domains", std::move(domains)}}.dump(2) + "\n";
}

bool ParseDomainRecord(std::string_view text, DomainRecord& record, std::string& error) {
  record = {};
  const json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    error = "not a JSON object";
    return false;
  }
  if (doc.value("version", json()) != json(kRecordVersion)) {
    error = "version: expected " + std::to_string(kRecordVersion) + ", got " + doc.value("version", json()).dump();
    return false;
  }
  const auto domains = doc.find("domains");
  if (domains == doc.end() || !domains->is_object()) {
    error = "domains: expected an object";
    return false;
  }
  for (const auto& [uid, d] : domains->items()) {
    const std::string where = "domains." + uid;
    if (uid.empty() || !d.is_object()) {
      error = where + ": expected an object under a non-empty key";
      return false;
    }
    RecordedDomain domain;
    if (!Str(d, "namespace", where, domain.namespace_name, error) || !Str(d, "name", where, domain.name, error)) {
      return false;
    }
    const auto claims = d.find("claims");
    if (claims == d.end() || !claims->is_object()) {
      error = where + ".claims: expected an object";
      return false;
    }
    for (const auto& [cuid, c] : claims->items()) {
      const std::string cwhere = where + ".claims." + cuid;
      RecordedClaim claim;
      if (cuid.empty() || !c.is_object() || !Str(c, "namespace", cwhere, claim.namespace_name, error) ||
          !Str(c, "name", cwhere, claim.name, error)) {
        if (error.empty()) error = cwhere + ": expected an object under a non-empty key";
        return false;
      }
      domain.claims[cuid] = std::move(claim);
    }
    record.domains[uid] = std::move(domain);
  }
  return true;
}

DomainRecordLoad LoadDomainRecord(const std::string& path) {
  DomainRecordLoad out;
  // Regular file, bounded (loop/state_file.hpp): anything else is corrupt.
  auto read = ReadStateFile(path, 1u << 20);
  if (read.status == StateFileRead::Status::kMissing) return out;
  if (read.status == StateFileRead::Status::kUnreadable) {
    out.status = RecordLoad::kUnreadable;
    out.error = read.error;
    return out;
  }
  if (read.status == StateFileRead::Status::kRejected) {
    out.status = RecordLoad::kCorrupt;
    out.error = read.error;
    return out;
  }
  if (!ParseDomainRecord(read.content, out.record, out.error)) {
    out.status = RecordLoad::kCorrupt;
    out.error = path + ": " + out.error;
    return out;
  }
  out.status = RecordLoad::kLoaded;
  return out;
}

FileWriteResult SaveDomainRecord(const std::string& path, const DomainRecord& record) {
  return WriteFileAtomically(path, SerializeDomainRecord(record), 0600);
}

}  // namespace gns::dra
