#pragma once
// A real OCI registry for tests: Debian's docker-registry on loopback with TLS (a fresh
// self-signed certificate per run), images pushed by tools/sim/oci_push.py, and optionally
// tools/sim/registry_proxy.py in front of it for bearer auth, 5xx, hangs and cut transfers.

#include "support/subprocess.hpp"
#include "support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace gns::gkm::test {

inline std::string SourceDir() {
  const char* dir = std::getenv("GNS_SOURCE_DIR");
  return dir ? dir : ".";
}

inline std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class TestRegistry {
 public:
  explicit TestRegistry(std::filesystem::path dir) : dir_(std::move(dir)) {
    const auto [rc, out] = gns::test::RunToCompletion(
        {"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
         (dir_ / "key.pem").string(), "-out", (dir_ / "cert.pem").string(), "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"});
    if (rc != 0) throw std::runtime_error("openssl: " + out);
    // Port 0: the registry binds a port the kernel picks and logs it ("listening on
    // 127.0.0.1:PORT, tls"); that line is read back below.
    std::ofstream(dir_ / "config.yml") << "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n"
                                       << "    rootdirectory: " << (dir_ / "data").string() << "\n"
                                       << "http:\n  addr: 127.0.0.1:0\n  tls:\n"
                                       << "    certificate: " << (dir_ / "cert.pem").string() << "\n"
                                       << "    key: " << (dir_ / "key.pem").string() << "\n";
    process_ = std::make_unique<gns::test::Subprocess>(
        std::vector<std::string>{"/usr/bin/docker-registry", "serve", (dir_ / "config.yml").string()});
    // The registry logs this line after it has bound its socket.
    const auto line = process_->WaitForLine("listening on 127.0.0.1:");
    if (!line) throw std::runtime_error("docker-registry did not start: " + process_->Output());
    port_ = std::stoi(line->substr(line->find("listening on 127.0.0.1:") + 23));
    if (port_ <= 0) throw std::runtime_error("docker-registry reported no port: " + *line);
  }

  ~TestRegistry() {
    if (process_) {
      process_->Signal(SIGTERM);
      process_->Wait();
    }
  }

  std::string Host() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string CaFile() const { return (dir_ / "cert.pem").string(); }
  std::string CaPem() const { return ReadText(dir_ / "cert.pem"); }
  const std::filesystem::path& Dir() const { return dir_; }

  // Pushes an image with tools/sim/oci_push.py; returns its JSON line.
  nlohmann::json Push(const std::string& repo, const std::string& tag, std::vector<std::string> extra) {
    std::vector<std::string> argv{"/usr/bin/python3", SourceDir() + "/tools/sim/oci_push.py", "--registry", Host(),
                                  "--cacert", CaFile(), "--repo", repo, "--tag", tag};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto [rc, out] = gns::test::RunToCompletion(argv);
    if (rc != 0) throw std::runtime_error("oci_push.py: " + out);
    return nlohmann::json::parse(out.substr(out.find('{')));
  }

  // Where the registry keeps a blob's bytes (to tamper with them).
  std::filesystem::path BlobData(const std::string& digest) const {
    const std::string hex = digest.substr(7);
    return dir_ / "data/docker/registry/v2/blobs/sha256" / hex.substr(0, 2) / hex / "data";
  }

 private:
  std::filesystem::path dir_;
  int port_ = 0;
  std::unique_ptr<gns::test::Subprocess> process_;
};

// tools/sim/registry_proxy.py in front of a TestRegistry (same certificate).
class TestProxy {
 public:
  TestProxy(const TestRegistry& upstream, std::vector<std::string> flags) {
    std::vector<std::string> argv{"/usr/bin/python3", SourceDir() + "/tools/sim/registry_proxy.py", "--upstream",
                                  upstream.Host(), "--cacert", upstream.CaFile(), "--cert", upstream.CaFile(), "--key",
                                  (upstream.Dir() / "key.pem").string()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    process_ = std::make_unique<gns::test::Subprocess>(argv);
    const auto line = process_->WaitForLine("listening on");
    if (!line) throw std::runtime_error("registry_proxy.py did not start: " + process_->Output());
    port_ = std::stoi(line->substr(line->find("listening on") + 13));
  }
  ~TestProxy() {
    process_->Signal(SIGKILL);
    process_->Wait();
  }
  std::string Host() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  std::unique_ptr<gns::test::Subprocess> process_;
  int port_ = 0;
};

}  // namespace gns::gkm::test
