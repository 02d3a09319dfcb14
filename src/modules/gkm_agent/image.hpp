#pragma once
// OCI image facts the gkm-agent needs, free of I/O so they can be tested alone: image
// references ("registry/repo:tag@sha256:…"), credentials from a kubernetes.io/dockerconfigjson
// pull secret, manifests and image indexes (OCI and Docker v2 media types), digests.

#include <nlohmann/json.hpp>
#include <openssl/types.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gns::gkm {

// A precise reason (CamelCase, for the status) and a message (what, where, why).
struct PullError : std::runtime_error {
  PullError(std::string reason_text, const std::string& message)
      : std::runtime_error(message), reason(std::move(reason_text)) {}
  std::string reason;
};

struct ImageRef {
  std::string registry;    // "host[:port]" as written ("docker.io" when absent)
  std::string repository;  // "org/name" ("library/name" on docker.io)
  std::string tag;         // "latest" when neither tag nor digest is given
  std::string digest;      // "sha256:…" when pinned
  // Throws std::invalid_argument naming the reference.
  static ImageRef Parse(std::string_view text);
  // The host to connect to ("registry-1.docker.io" for docker.io).
  std::string Host() const;
  // The digest when pinned, else the tag.
  const std::string& Reference() const { return digest.empty() ? tag : digest; }
  std::string ToString() const;
};

// True for "sha256:" followed by 64 lower-case hex digits (the only algorithm we verify).
bool IsSha256Digest(std::string_view digest);
std::string Sha256Digest(std::string_view data);
// Finishes a SHA-256 fed with EVP_DigestUpdate: "sha256:<hex>".
std::string FinishSha256Digest(EVP_MD_CTX* md);
// Standard base64 (as in Secret data and dockerconfigjson "auth"); throws std::invalid_argument.
std::string Base64Decode(std::string_view in);

struct Credentials {
  std::string username;
  std::string password;
  std::string identity_token;  // sent as the refresh token to a token endpoint (not used here)
};

// Credentials for `registry` ("host[:port]") from a dockerconfigjson document ({"auths": {…}});
// nullopt when the document has none for it. Keys may carry a scheme and path
// ("https://index.docker.io/v1/"). Throws std::invalid_argument for a malformed entry.
std::optional<Credentials> CredentialsFor(const nlohmann::json& docker_config, std::string_view registry);

struct Platform {
  std::string os;
  std::string architecture;
  std::string variant;
};

struct Descriptor {
  std::string media_type;
  std::string digest;
  uint64_t size = 0;
  std::optional<Platform> platform;  // index entries only
};

inline constexpr std::string_view kOciIndex = "application/vnd.oci.image.index.v1+json";
inline constexpr std::string_view kOciManifest = "application/vnd.oci.image.manifest.v1+json";
inline constexpr std::string_view kDockerList = "application/vnd.docker.distribution.manifest.list.v2+json";
inline constexpr std::string_view kDockerManifest = "application/vnd.docker.distribution.manifest.v2+json";
// The Accept header of a manifest request: every type above.
std::string ManifestAccept();

struct Manifest {
  bool is_index = false;
  std::vector<Descriptor> manifests;  // index: the platform manifests
  Descriptor config;                  // image manifest
  std::vector<Descriptor> layers;     // image manifest
};

// Parses a manifest or index body; `content_type` is the response's (the body's mediaType
// wins when both are present and they disagree → error). Throws PullError("BadManifest").
Manifest ParseManifest(std::string_view body, std::string_view content_type);
// The manifest for `os`/`architecture` in an index, else the first one; nullptr if empty.
const Descriptor* PickManifest(const Manifest& index, std::string_view os, std::string_view architecture);

}  // namespace gns::gkm
