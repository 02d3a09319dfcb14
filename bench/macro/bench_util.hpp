#pragma once
// Small pieces the whole-module benchmarks share: their integer options, quiet logging, a short
// scratch directory and a node's site in it, milliseconds from a duration, one printed line of
// percentiles, a loop turned by a thread of its own, and running a function on it.

#include "loop/blocking_pool.hpp"
#include "loop/logging.hpp"
#include "loop/loop.hpp"
#include "loop/site.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gns::bench {

// "--name N" options, each setting its int; false (after printing `usage`) for anything else.
inline bool ParseIntOptions(int argc, char** argv, const char* usage,
                            const std::vector<std::pair<std::string, int*>>& options) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool known = false;
    for (const auto& [name, value] : options) {
      if (a == name && i + 1 < argc) {
        *value = std::atoi(argv[++i]);
        known = true;
        break;
      }
    }
    if (!known) {
      std::fprintf(stderr, "usage: %s\n", usage);
      return false;
    }
  }
  return true;
}

// The module's logs at error only (the figures, not a line per call), and a logger that drops
// everything for the parts the bench builds itself.
inline std::shared_ptr<spdlog::logger> QuietLogging() {
  LoggingConfig logging;
  logging.level = spdlog::level::err;
  SetupLogging(logging);
  return std::make_shared<spdlog::logger>("bench", std::make_shared<spdlog::sinks::null_sink_mt>());
}

// A fresh directory with a short path (unix socket paths must stay short).
inline std::string ScratchDir() {
  char tmpl[] = "/tmp/gnsbench-XXXXXX";
  const char* made = ::mkdtemp(tmpl);
  return made != nullptr ? std::string(made) : std::string();
}

// A node's site under `dir`: kubelet, CDI, state and host-root folders, the feature gates as
// given, resolved.
inline SiteConfig BenchSite(const std::string& node, const std::string& dir, FeatureGates gates = {}) {
  SiteConfig site;
  site.node_name = node;
  site.paths.kubelet_dir = dir + "/kubelet";
  site.paths.cdi_dir = dir + "/cdi";
  site.paths.state_dir = dir + "/state";
  site.paths.host_root = dir + "/host";
  site.gates = std::move(gates);
  site.gates.Resolve();
  return site;
}

inline double Ms(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// `sorted` must be sorted and non-empty.
inline double Percentile(const std::vector<double>& sorted, double p) {
  return sorted[std::min(sorted.size() - 1, static_cast<std::size_t>(p * static_cast<double>(sorted.size())))];
}

// Prints "WHAT over N samples: p50 …, p90 …, p99 …, max …" and returns the median.
inline double Report(const char* what, std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  std::printf("%s over %zu samples: p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms\n", what, samples.size(),
              Percentile(samples, 0.50), Percentile(samples, 0.90), Percentile(samples, 0.99), samples.back());
  return Percentile(samples, 0.50);
}

// Runs `fn` on the loop thread (turned by another thread) and waits for it.
template <typename Fn>
void OnLoop(Loop& loop, Fn fn) {
  std::promise<void> done;
  loop.Post([&] {
    fn();
    done.set_value();
  });
  done.get_future().wait();
}

// Turns `loop` on a thread of its own until Stop(), while the benchmark's main thread plays
// the kubelet, the journal writer or the API client. Stop() lets the pool finish first.
class LoopThread {
 public:
  LoopThread(Loop& loop, BlockingPool& pool)
      : loop_(loop), pool_(pool), guard_(boost::asio::make_work_guard(loop.Io())), thread_([this] {
          loop_.BindToCurrentThread();
          loop_.Io().run();
        }) {}
  ~LoopThread() { Stop(); }
  LoopThread(const LoopThread&) = delete;
  LoopThread& operator=(const LoopThread&) = delete;

  void Stop() {
    if (!thread_.joinable()) return;
    guard_.reset();
    pool_.Join();
    loop_.Io().stop();
    thread_.join();
  }

 private:
  Loop& loop_;
  BlockingPool& pool_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_;
  std::thread thread_;
};

}  // namespace gns::bench
