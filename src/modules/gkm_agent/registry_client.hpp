#pragma once
// An OCI distribution (v2) client over the process's Beast HTTPS stack: manifests by digest
// or tag, image indexes (this node's platform, else the first manifest), the config blob and
// the layers streamed to files, or extracted as they stream (streaming_extraction.hpp). Every
// byte is checked: manifests and blobs against their digests (sha256 while streaming, on the
// blocking pool, beside the file write or the extraction), blob sizes
// against the manifest, the image against a size limit. A broken transfer is resumed with a
// Range request; 5xx and timeouts are retried with backoff; 401 answers are met with the
// registry's challenge (Basic, or Bearer through its token endpoint). TLS is always verified
// (the registry CA, else the system's trust store). Completions run on the loop.

#include "loop/blocking_pool.hpp"
#include "loop/loop.hpp"
#include "modules/gkm_agent/extract.hpp"
#include "modules/gkm_agent/image.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gns::gkm {

struct RegistryOptions {
  std::string ca_pem;         // the registry CA (added to the system's trust store)
  bool system_roots = true;   // trust the system's CAs too
  uint64_t max_manifest_bytes = 4 * 1024 * 1024;
  uint64_t max_image_bytes = 8ull * 1024 * 1024 * 1024;  // the sum of the layers
  std::chrono::milliseconds request_timeout{30000};       // per request, and per body read
  int max_attempts = 4;                                   // per request (retries + 1)
  std::chrono::milliseconds retry_delay{500};             // doubled after each failed attempt
  std::size_t chunk_bytes = 1024 * 1024;  // one read; two per blob in memory (one filling, one hashed and written)
  std::string os = "linux";
  std::string architecture = "amd64";
  std::string user_agent = "gpu-node-supervisor";
  // > 0: the client's own threads for the extractions that follow pulls (each holds a thread
  // while its pull streams), so that concurrent pulls never take the shared blocking pool's
  // threads from other work; size it to the pulls that may run at once. 0: the given pool.
  std::size_t extraction_threads = 0;
};

struct PullRequest {
  ImageRef image;
  std::string digest;  // the manifest digest to pull (status.resolvedDigest); empty: resolve the tag
  std::optional<Credentials> credentials;
  std::string dir;     // existing directory for layer-<i> files (when not extracting)
  // When set, the layers are extracted into this directory (it must not exist) while they
  // stream (streaming_extraction.hpp) and no layer file is written: the pull's result is an
  // extracted tree, flushed. Its files count against `max_extract_bytes`.
  std::string extract_to;
  uint64_t max_extract_bytes = 0;
  // The whole pull, every request and retry included (0: none). A pull still running then is
  // stopped (its connections closed, its extraction aborted) and ends with reason
  // "DeadlineExceeded", naming the registry and the limit.
  std::chrono::milliseconds deadline{0};
};

struct PullResult {
  std::string reason;   // empty on success; else CamelCase (DigestMismatch, SizeMismatch, …)
  std::string error;    // what, where, why
  std::string digest;   // the manifest digest pulled (sha256 of its bytes)
  nlohmann::json config;  // the image config
  std::vector<std::string> layer_files;  // in manifest order (none when extracting)
  std::vector<std::string> layer_media_types;
  uint64_t bytes_pulled = 0;  // bytes received (retried ones included)
  ExtractStats extracted;     // when extracting
  bool Ok() const { return reason.empty(); }
};

class RegistryClient {
 public:
  // Throws std::runtime_error for an unusable CA.
  RegistryClient(Loop& loop, BlockingPool& pool, std::shared_ptr<spdlog::logger> log, RegistryOptions options);
  ~RegistryClient();
  RegistryClient(const RegistryClient&) = delete;
  RegistryClient& operator=(const RegistryClient&) = delete;

  // `done` runs on the loop exactly once (with reason "Stopped" after Shutdown).
  void Pull(PullRequest request, std::function<void(PullResult)> done);
  // Closes every connection; pulls in flight end with "Stopped".
  void Shutdown();

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// Splits a WWW-Authenticate header into its scheme and parameters (quoted or not).
struct Challenge {
  std::string scheme;  // lower-case: "bearer", "basic"
  std::vector<std::pair<std::string, std::string>> params;
  std::string Param(std::string_view name) const;
};
std::optional<Challenge> ParseChallenge(std::string_view header);

}  // namespace gns::gkm
