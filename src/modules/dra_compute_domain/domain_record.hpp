#pragma once
// The node's record of driver-managed ComputeDomains (issue #16), beside the DRA checkpoint in
// <stateDir>/dra-compute-domain/domains.json (0600): which domains this node registered in and
// which channel claims keep each one here. It is written before the node labels or registers
// itself, and a domain leaves it only after its daemon stopped and the node deregistered, so a
// kill -9 at any point leaves a record from which the next start finishes the job (resumes the
// domains that still have claims, tears down those that have none). A separate file from the
// DRA checkpoint on purpose: that one's shape belongs to the prepare path.

#include "loop/atomic_file.hpp"

#include <map>
#include <string>
#include <string_view>

namespace gns::dra {

struct RecordedClaim {
  std::string namespace_name;
  std::string name;
  bool operator==(const RecordedClaim&) const = default;
};

struct RecordedDomain {
  std::string namespace_name;
  std::string name;
  std::map<std::string, RecordedClaim> claims;  // by claim UID; empty: being torn down
  bool operator==(const RecordedDomain&) const = default;
};

struct DomainRecord {
  std::map<std::string, RecordedDomain> domains;  // by domain UID
  bool operator==(const DomainRecord&) const = default;
};

std::string SerializeDomainRecord(const DomainRecord& record);
// Parses the file's text; false with `error` (a JSON path and what is wrong) when it is not ours.
bool ParseDomainRecord(std::string_view text, DomainRecord& record, std::string& error);

enum class RecordLoad { kLoaded, kMissing, kCorrupt, kUnreadable };
struct DomainRecordLoad {
  RecordLoad status = RecordLoad::kMissing;
  DomainRecord record;
  std::string error;
};
// Blocking. Never throws.
DomainRecordLoad LoadDomainRecord(const std::string& path);
FileWriteResult SaveDomainRecord(const std::string& path, const DomainRecord& record);

}  // namespace gns::dra
