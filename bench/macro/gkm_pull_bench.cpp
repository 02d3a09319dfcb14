// gkm-agent: pull + extract of a large kernel-cache image from a real registry (Debian's
// docker-registry on loopback, TLS) beside `skopeo copy` of the same image to a directory, in
// the same run; and the process's private memory while the pull streams (bounded by the
// chunk size, not the image size).
//
//   gkm_pull_bench [--bytes N] [--source-dir DIR]
#include "loop/blocking_pool.hpp"
#include "loop/loop.hpp"
#include "bench_util.hpp"
#include "modules/gkm_agent/extract.hpp"
#include "modules/gkm_agent/registry_client.hpp"
#include "unit/modules/gkm_agent/registry_fixture.hpp"

#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <thread>

namespace {

// RssAnon of this process in KiB.
long RssAnonKb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stol(line.substr(8));
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t bytes = 256ull << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--bytes") == 0) bytes = std::stoull(argv[i + 1]);
    if (std::strcmp(argv[i], "--source-dir") == 0) ::setenv("GNS_SOURCE_DIR", argv[i + 1], 1);
  }
  namespace fs = std::filesystem;
  const fs::path dir = gns::gkm::test::TempDir("gkm-bench");
  int rc = 0;
  {
    fs::create_directories(dir / "registry");
    gns::gkm::test::TestRegistry registry(dir / "registry");
    std::printf("pushing an image with a %llu-byte layer...\n", static_cast<unsigned long long>(bytes));
    const auto pushed = registry.Push("caches/bench", "v1", {"--triton", "90", "--random-bytes", std::to_string(bytes)});
    const uint64_t layer = pushed["layerSize"];

    // skopeo copy of the same image to a directory (its CA in a cert dir).
    fs::create_directories(dir / "certs");
    fs::copy_file(registry.CaFile(), dir / "certs/ca.crt");
    const auto s0 = std::chrono::steady_clock::now();
    const auto [skopeo_rc, skopeo_out] = gns::test::RunToCompletion(
        {"/usr/bin/skopeo", "copy", "--src-cert-dir", (dir / "certs").string(),
         "docker://" + registry.Host() + "/caches/bench:v1", "dir:" + (dir / "skopeo").string()});
    const double skopeo_ms = gns::bench::Ms(std::chrono::steady_clock::now() - s0);
    if (skopeo_rc != 0) {
      std::fprintf(stderr, "skopeo copy failed: %s\n", skopeo_out.c_str());
      return 1;
    }

    // Ours: pull (verify while streaming) + extract, the loop on its own thread.
    gns::Loop loop;
    gns::BlockingPool pool(loop, 2);
    gns::bench::LoopThread thread(loop, pool);
    auto log = std::make_shared<spdlog::logger>("bench", std::make_shared<spdlog::sinks::null_sink_mt>());
    gns::gkm::RegistryOptions options;
    options.ca_pem = registry.CaPem();
    options.system_roots = false;
    options.max_image_bytes = bytes * 2;
    std::unique_ptr<gns::gkm::RegistryClient> client;
    gns::bench::OnLoop(loop, [&] { client = std::make_unique<gns::gkm::RegistryClient>(loop, pool, log, options); });
    fs::create_directories(dir / "ours/blobs");
    const long rss_before = RssAnonKb();
    std::atomic<long> rss_peak{rss_before};
    std::atomic<bool> sampling{true};
    std::thread sampler([&] {
      while (sampling) {
        rss_peak = std::max(rss_peak.load(), RssAnonKb());
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a sampler, not a sync
      }
    });
    std::promise<gns::gkm::PullResult> result;
    const auto t0 = std::chrono::steady_clock::now();
    gns::bench::OnLoop(loop, [&] {
      client->Pull(gns::gkm::PullRequest{gns::gkm::ImageRef::Parse(registry.Host() + "/caches/bench:v1"), {},
                                         std::nullopt, (dir / "ours/blobs").string()},
                   [&](gns::gkm::PullResult r) { result.set_value(std::move(r)); });
    });
    const auto r = result.get_future().get();
    const auto t1 = std::chrono::steady_clock::now();
    sampling = false;
    sampler.join();
    if (!r.Ok()) {
      std::fprintf(stderr, "pull failed: %s: %s\n", r.reason.c_str(), r.error.c_str());
      rc = 1;
    } else {
      gns::gkm::ExtractLayers(r.layer_files, (dir / "ours/cache").string(), bytes * 2);
      const auto t2 = std::chrono::steady_clock::now();
      const double pull_ms = gns::bench::Ms(t1 - t0);
      const double total_ms = gns::bench::Ms(t2 - t0);
      std::printf("layer %.1f MiB: skopeo copy %.0f ms; ours pull %.0f ms + extract %.0f ms = %.0f ms\n",
                  static_cast<double>(layer) / (1 << 20), skopeo_ms, pull_ms, total_ms - pull_ms, total_ms);
      std::printf("ours (pull+extract) / skopeo copy: %.2fx (target <= 1.2x); pull alone %.2fx\n",
                  total_ms / skopeo_ms, pull_ms / skopeo_ms);
      std::printf("RssAnon during the pull: %ld KiB before, %ld KiB peak (+%ld KiB for a %.1f MiB layer)\n",
                  rss_before, rss_peak.load(), rss_peak.load() - rss_before, static_cast<double>(layer) / (1 << 20));
    }
    gns::bench::OnLoop(loop, [&] { client.reset(); });
    thread.Stop();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return rc;
}
