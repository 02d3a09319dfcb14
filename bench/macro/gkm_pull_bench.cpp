// gkm-agent: pull + extract of a large kernel-cache image from a real registry (Debian's
// docker-registry on loopback, TLS) beside `skopeo copy` of the same image to a directory, in
// the same run; and the process's private memory while the pull streams (bounded by the
// chunk size, not the image size), for two layer sizes side by side. The module's way is the
// extraction while the layers stream; the pull to layer files and an extraction after it is
// shown beside it for reference.
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

struct Measured {
  bool ok = false;
  std::string error;
  double pull_ms = 0;
  double extract_ms = 0;
  long rss_before = 0;
  long rss_peak = 0;  // over the pull and the extraction
};

// Pulls `image` into `dir` and extracts it (while it streams, or after the pull from layer
// files), sampling RssAnon every 5 ms throughout.
Measured PullAndExtract(gns::Loop& loop, gns::gkm::RegistryClient& client, const std::string& image,
                        const std::filesystem::path& dir, uint64_t limit, bool streamed) {
  namespace fs = std::filesystem;
  Measured m;
  fs::create_directories(dir / "blobs");
  m.rss_before = RssAnonKb();
  std::atomic<long> peak{m.rss_before};
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    while (sampling) {
      peak = std::max(peak.load(), RssAnonKb());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a sampler, not a sync
    }
  });
  std::promise<gns::gkm::PullResult> result;
  const auto t0 = std::chrono::steady_clock::now();
  gns::bench::OnLoop(loop, [&] {
    client.Pull(gns::gkm::PullRequest{gns::gkm::ImageRef::Parse(image), {}, std::nullopt, (dir / "blobs").string(),
                                      streamed ? (dir / "cache").string() : std::string(), limit},
                [&](gns::gkm::PullResult r) { result.set_value(std::move(r)); });
  });
  const auto r = result.get_future().get();
  const auto t1 = std::chrono::steady_clock::now();
  if (!r.Ok()) {
    m.error = r.reason + ": " + r.error;
  } else {
    if (!streamed) gns::gkm::ExtractLayers(r.layer_files, (dir / "cache").string(), limit);
    m.ok = true;
  }
  const auto t2 = std::chrono::steady_clock::now();
  sampling = false;
  sampler.join();
  m.pull_ms = gns::bench::Ms(t1 - t0);
  m.extract_ms = gns::bench::Ms(t2 - t1);
  m.rss_peak = peak.load();
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t bytes = 256ull << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--bytes") == 0) bytes = std::stoull(argv[i + 1]);
    if (std::strcmp(argv[i], "--source-dir") == 0) ::setenv("GNS_SOURCE_DIR", argv[i + 1], 1);
  }
  namespace fs = std::filesystem;
  const fs::path dir = gns::test::MakeTempDir("gkm-bench");
  const uint64_t small = std::max<uint64_t>(bytes / 8, 1 << 20);
  int rc = 0;
  {
    fs::create_directories(dir / "registry");
    gns::gkm::test::TestRegistry registry(dir / "registry");
    std::printf("pushing images with a %llu-byte and a %llu-byte layer...\n", static_cast<unsigned long long>(bytes),
                static_cast<unsigned long long>(small));
    const auto pushed = registry.Push("caches/bench", "v1", {"--triton", "90", "--random-bytes", std::to_string(bytes)});
    const uint64_t layer = pushed["layerSize"];
    const auto pushed_small =
        registry.Push("caches/small", "v1", {"--triton", "90", "--random-bytes", std::to_string(small)});
    const uint64_t small_layer = pushed_small["layerSize"];

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

    // Ours: pull (verify while streaming) + extract, the loop on its own thread; the small
    // image first, so the large one cannot profit from a heap the small one grew.
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
    const auto s = PullAndExtract(loop, *client, registry.Host() + "/caches/small:v1", dir / "small", bytes * 2, true);
    const auto m = PullAndExtract(loop, *client, registry.Host() + "/caches/bench:v1", dir / "ours", bytes * 2, true);
    fs::remove_all(dir / "ours");
    const auto f = PullAndExtract(loop, *client, registry.Host() + "/caches/bench:v1", dir / "files", bytes * 2, false);
    if (!s.ok || !m.ok || !f.ok) {
      std::fprintf(stderr, "pull failed: %s\n", (!s.ok ? s.error : !m.ok ? m.error : f.error).c_str());
      rc = 1;
    } else {
      const double total_ms = m.pull_ms + m.extract_ms;
      const double files_ms = f.pull_ms + f.extract_ms;
      std::printf("layer %.1f MiB: skopeo copy %.0f ms; ours, extracted while it streams, %.0f ms "
                  "(for reference: pull to a file %.0f ms + extract after %.0f ms = %.0f ms, %.2fx)\n",
                  static_cast<double>(layer) / (1 << 20), skopeo_ms, total_ms, f.pull_ms, f.extract_ms, files_ms,
                  files_ms / skopeo_ms);
      std::printf("ours (pull+extract) / skopeo copy: %.2fx (target <= 1.2x)\n", total_ms / skopeo_ms);
      const double bound_kib = 2.0 * static_cast<double>(options.chunk_bytes) / 1024.0;
      std::printf("RssAnon peak over pull+extract: +%ld KiB for %.1f MiB, +%ld KiB for %.1f MiB "
                  "(bound by design: 2 chunks = %.0f KiB + TLS/parser buffers, independent of the layer size)\n",
                  s.rss_peak - s.rss_before, static_cast<double>(small_layer) / (1 << 20), m.rss_peak - m.rss_before,
                  static_cast<double>(layer) / (1 << 20), bound_kib);
    }
    gns::bench::OnLoop(loop, [&] { client.reset(); });
    thread.Stop();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return rc;
}
