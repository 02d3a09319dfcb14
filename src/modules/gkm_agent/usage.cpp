// usage.json and the cache-use lock: see api/usage.hpp.
#include "modules/gkm_agent/api/usage.hpp"

#include "loop/atomic_file.hpp"
#include "loop/state_file.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <system_error>

namespace gns::gkm {

namespace {

constexpr std::size_t kMaxUsageBytes = 4u << 20;

std::string Field(const nlohmann::json& e, const char* key) {
  const auto it = e.find(key);
  return it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

UsageRead ParseUsage(std::string_view text) {
  UsageRead out;
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) {
    out.ok = false;
    out.error = "not a JSON object";
    return out;
  }
  for (const auto& [pod, entries] : j.items()) {
    if (!entries.is_array()) continue;
    for (const auto& e : entries) {
      if (!e.is_object()) continue;
      UsageRecord r;
      r.volume_id = Field(e, "volumeId");
      if (r.volume_id.empty()) continue;
      r.pod_name = Field(e, "podName");
      r.pod_namespace = Field(e, "podNamespace");
      r.pod_uid = Field(e, "podUid");
      r.target_path = Field(e, "targetPath");
      r.start_time = Field(e, "startTime");
      if (const auto s = e.find("volumeSize"); s != e.end() && s->is_number_unsigned()) r.volume_size = s->get<uint64_t>();
      if (const auto ro = e.find("readOnly"); ro != e.end() && ro->is_boolean()) r.read_only = ro->get<bool>();
      out.records.push_back(std::move(r));
    }
  }
  return out;
}

std::string SerializeUsage(const std::vector<UsageRecord>& records) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& r : records) {
    const std::string key = r.pod_name.empty() ? r.volume_id : r.pod_name;
    auto& list = j[key];
    if (list.is_null()) list = nlohmann::json::array();
    list.push_back({{"podName", r.pod_name},
                    {"podNamespace", r.pod_namespace},
                    {"podUid", r.pod_uid},
                    {"volumeId", r.volume_id},
                    {"volumeSize", r.volume_size},
                    {"targetPath", r.target_path},
                    {"startTime", r.start_time},
                    {"readOnly", r.read_only}});
  }
  return j.dump(2) + "\n";
}

UsageRead ReadUsageFile(const std::string& usage_dir) {
  const std::string path = usage_dir + "/usage.json";
  const auto read = ReadStateFile(path, kMaxUsageBytes);
  if (read.status == StateFileRead::Status::kMissing) return {};
  if (read.status != StateFileRead::Status::kRead) {
    UsageRead out;
    out.ok = false;
    out.error = read.error;
    return out;
  }
  auto out = ParseUsage(read.content);
  if (!out.ok) out.error = path + ": " + out.error;
  return out;
}

void WriteUsageFile(const std::string& usage_dir, const std::vector<UsageRecord>& records) {
  // 0644: the agent reads it, and an operator may (seed 002: "Read-only access to the files").
  const auto written = WriteFileAtomically(usage_dir + "/usage.json", SerializeUsage(records), 0644);
  if (!written) throw std::runtime_error(written.error);
}

std::vector<std::string> CacheKeysInUse(const std::string& usage_root) {
  namespace fs = std::filesystem;
  std::vector<std::string> keys;
  auto check = [&](const std::string& key, const fs::path& dir) {
    const auto usage = ReadUsageFile(dir.string());
    if (!usage.ok || !usage.records.empty()) keys.push_back(key);
  };
  std::error_code ec;
  for (fs::directory_iterator it(fs::path(usage_root) / "cluster", ec), end; !ec && it != end; it.increment(ec)) {
    check("cluster/" + it->path().filename().string(), it->path());
  }
  ec.clear();
  for (fs::directory_iterator ns(fs::path(usage_root) / "namespaced", ec), end; !ec && ns != end; ns.increment(ec)) {
    std::error_code inner;
    for (fs::directory_iterator it(ns->path(), inner), e2; !inner && it != e2; it.increment(inner)) {
      check("namespaced/" + ns->path().filename().string() + "/" + it->path().filename().string(), it->path());
    }
  }
  return keys;
}

CacheUseLock::CacheUseLock(const std::string& usage_dir) {
  std::error_code ec;
  std::filesystem::create_directories(usage_dir, ec);
  if (ec) throw std::system_error(ec, "mkdir " + usage_dir);
  fd_ = ::open(usage_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "open " + usage_dir);
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int e = errno;
    ::close(fd_);
    throw std::system_error(e, std::generic_category(), "flock " + usage_dir);
  }
}

CacheUseLock::~CacheUseLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace gns::gkm
