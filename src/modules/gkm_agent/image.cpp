// OCI image references, pull-secret credentials and manifests (see image.hpp).
#include "modules/gkm_agent/image.hpp"

#include <openssl/evp.h>

#include <array>

namespace gns::gkm {

namespace {

bool IsDomain(std::string_view first) {
  return first.find('.') != std::string_view::npos || first.find(':') != std::string_view::npos ||
         first == "localhost";
}

bool ValidRepository(std::string_view repo) {
  if (repo.empty() || repo.size() > 255) return false;
  for (const char c : repo) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' || c == '/';
    if (!ok) return false;
  }
  return repo.front() != '/' && repo.back() != '/' && repo.find("//") == std::string_view::npos;
}

bool ValidTag(std::string_view tag) {
  if (tag.empty() || tag.size() > 128) return false;
  for (const char c : tag) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return tag.front() != '.' && tag.front() != '-';
}

// "https://index.docker.io/v1/" → "index.docker.io"; "host:5000" stays.
std::string HostOfKey(std::string_view key) {
  if (const auto p = key.find("://"); p != std::string_view::npos) key.remove_prefix(p + 3);
  if (const auto slash = key.find('/'); slash != std::string_view::npos) key = key.substr(0, slash);
  return std::string(key);
}

bool SameRegistry(std::string_view a, std::string_view b) {
  auto canon = [](std::string_view h) -> std::string_view {
    if (h == "index.docker.io" || h == "registry-1.docker.io" || h == "docker.io") return "docker.io";
    return h;
  };
  return canon(a) == canon(b);
}

std::string Text(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_string()) throw PullError("BadManifest", std::string("manifest field \"") + key + "\" is not a string");
  return it->get<std::string>();
}

Descriptor ReadDescriptor(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw PullError("BadManifest", where + " is not an object");
  Descriptor d;
  d.media_type = Text(j, "mediaType");
  d.digest = Text(j, "digest");
  if (!IsSha256Digest(d.digest)) {
    throw PullError("BadManifest", where + ": digest \"" + d.digest + "\" is not sha256:<64 hex>");
  }
  const auto size = j.find("size");
  if (size == j.end() || !size->is_number_unsigned()) {
    throw PullError("BadManifest", where + ": size missing or not a non-negative integer");
  }
  d.size = size->get<uint64_t>();
  if (const auto p = j.find("platform"); p != j.end() && p->is_object()) {
    Platform platform;
    platform.os = Text(*p, "os");
    platform.architecture = Text(*p, "architecture");
    platform.variant = Text(*p, "variant");
    d.platform = std::move(platform);
  }
  return d;
}

}  // namespace

ImageRef ImageRef::Parse(std::string_view text) {
  const std::string whole(text);
  auto fail = [&](const std::string& why) { throw std::invalid_argument("image \"" + whole + "\": " + why); };
  if (text.empty()) fail("empty");
  ImageRef ref;
  if (const auto at = text.find('@'); at != std::string_view::npos) {
    ref.digest = std::string(text.substr(at + 1));
    text = text.substr(0, at);
    if (!IsSha256Digest(ref.digest)) fail("digest must be sha256:<64 lower-case hex>");
  }
  std::string_view rest = text;
  if (const auto slash = text.find('/'); slash != std::string_view::npos && IsDomain(text.substr(0, slash))) {
    ref.registry = std::string(text.substr(0, slash));
    rest = text.substr(slash + 1);
  } else {
    ref.registry = "docker.io";
  }
  // A tag is after the last ':' that follows the last '/'.
  const auto last_slash = rest.rfind('/');
  const auto colon = rest.rfind(':');
  if (colon != std::string_view::npos && (last_slash == std::string_view::npos || colon > last_slash)) {
    ref.tag = std::string(rest.substr(colon + 1));
    rest = rest.substr(0, colon);
    if (!ValidTag(ref.tag)) fail("bad tag \"" + ref.tag + "\"");
  }
  ref.repository = std::string(rest);
  if (ref.registry == "docker.io" && ref.repository.find('/') == std::string::npos) {
    ref.repository = "library/" + ref.repository;
  }
  if (!ValidRepository(ref.repository)) fail("bad repository \"" + ref.repository + "\"");
  if (ref.tag.empty() && ref.digest.empty()) ref.tag = "latest";
  return ref;
}

std::string ImageRef::Host() const { return registry == "docker.io" ? "registry-1.docker.io" : registry; }

std::string ImageRef::ToString() const {
  std::string out = registry + "/" + repository;
  if (!tag.empty()) out += ":" + tag;
  if (!digest.empty()) out += "@" + digest;
  return out;
}

std::string Base64Decode(std::string_view in) {
  std::string out((in.size() / 4 + 1) * 3, '\0');
  EVP_ENCODE_CTX* ctx = EVP_ENCODE_CTX_new();
  EVP_DecodeInit(ctx);
  int n = 0, total = 0;
  const int rc = EVP_DecodeUpdate(ctx, reinterpret_cast<unsigned char*>(out.data()), &n,
                                  reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  total = n;
  int rc2 = 0;
  if (rc >= 0) rc2 = EVP_DecodeFinal(ctx, reinterpret_cast<unsigned char*>(out.data()) + total, &n);
  EVP_ENCODE_CTX_free(ctx);
  if (rc < 0 || rc2 < 0) throw std::invalid_argument("not base64");
  out.resize(static_cast<std::size_t>(total + n));
  return out;
}

bool IsSha256Digest(std::string_view digest) {
  if (digest.size() != 71 || digest.substr(0, 7) != "sha256:") return false;
  for (const char c : digest.substr(7)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

namespace {

std::string FormatSha256Digest(const unsigned char* md, unsigned int len) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "sha256:";
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 15];
  }
  return out;
}

}  // namespace

std::string Sha256Digest(std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md.data(), &len, EVP_sha256(), nullptr);
  return FormatSha256Digest(md.data(), len);
}

std::string FinishSha256Digest(EVP_MD_CTX* md) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(md, out.data(), &len);
  return FormatSha256Digest(out.data(), len);
}

std::optional<Credentials> CredentialsFor(const nlohmann::json& docker_config, std::string_view registry) {
  if (!docker_config.is_object()) throw std::invalid_argument("dockerconfigjson is not an object");
  const auto auths = docker_config.find("auths");
  if (auths == docker_config.end() || !auths->is_object()) {
    throw std::invalid_argument("dockerconfigjson has no \"auths\" object");
  }
  for (const auto& [key, entry] : auths->items()) {
    if (!SameRegistry(HostOfKey(key), registry)) continue;
    if (!entry.is_object()) throw std::invalid_argument("auths[\"" + key + "\"] is not an object");
    Credentials c;
    auto text = [&](const char* k) -> std::string {
      const auto it = entry.find(k);
      if (it == entry.end() || it->is_null()) return {};
      if (!it->is_string()) throw std::invalid_argument("auths[\"" + key + "\"]." + k + " is not a string");
      return it->get<std::string>();
    };
    c.username = text("username");
    c.password = text("password");
    c.identity_token = text("identitytoken");
    if (const std::string auth = text("auth"); !auth.empty()) {
      const std::string plain = Base64Decode(auth);
      const auto colon = plain.find(':');
      if (colon == std::string::npos) throw std::invalid_argument("auths[\"" + key + "\"].auth is not user:password");
      c.username = plain.substr(0, colon);
      c.password = plain.substr(colon + 1);
    }
    if (c.username.empty() && c.identity_token.empty()) {
      throw std::invalid_argument("auths[\"" + key + "\"] has neither auth, username nor identitytoken");
    }
    return c;
  }
  return std::nullopt;
}

std::string ManifestAccept() {
  return std::string(kOciIndex) + ", " + std::string(kOciManifest) + ", " + std::string(kDockerList) + ", " +
         std::string(kDockerManifest);
}

Manifest ParseManifest(std::string_view body, std::string_view content_type) {
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw PullError("BadManifest", "manifest is not a JSON object");
  std::string type = Text(j, "mediaType");
  std::string header(content_type.substr(0, content_type.find(';')));
  while (!header.empty() && header.back() == ' ') header.pop_back();
  auto known = [](std::string_view t) { return t == kOciIndex || t == kOciManifest || t == kDockerList || t == kDockerManifest; };
  if (type.empty()) {
    type = header;
  } else if (known(header) && header != type) {
    throw PullError("BadManifest", "manifest mediaType " + type + " disagrees with Content-Type " + header);
  }
  if (type.empty()) {
    // An OCI manifest may omit mediaType: tell index from manifest by their fields.
    type = j.contains("manifests") ? std::string(kOciIndex) : std::string(kOciManifest);
  }
  Manifest m;
  if (type == kOciIndex || type == kDockerList) {
    m.is_index = true;
    const auto list = j.find("manifests");
    if (list == j.end() || !list->is_array()) throw PullError("BadManifest", "index without a manifests array");
    for (std::size_t i = 0; i < list->size(); ++i) {
      m.manifests.push_back(ReadDescriptor((*list)[i], "manifests[" + std::to_string(i) + "]"));
    }
    return m;
  }
  if (type != kOciManifest && type != kDockerManifest) {
    throw PullError("BadManifest", "unsupported manifest media type \"" + type + "\"");
  }
  const auto config = j.find("config");
  if (config == j.end()) throw PullError("BadManifest", "manifest without config");
  m.config = ReadDescriptor(*config, "config");
  const auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array()) throw PullError("BadManifest", "manifest without a layers array");
  for (std::size_t i = 0; i < layers->size(); ++i) {
    m.layers.push_back(ReadDescriptor((*layers)[i], "layers[" + std::to_string(i) + "]"));
  }
  return m;
}

const Descriptor* PickManifest(const Manifest& index, std::string_view os, std::string_view architecture) {
  for (const auto& d : index.manifests) {
    if (d.platform && d.platform->os == os && d.platform->architecture == architecture) return &d;
  }
  return index.manifests.empty() ? nullptr : &index.manifests.front();
}

}  // namespace gns::gkm
