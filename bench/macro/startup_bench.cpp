// Whole-binary figures: process start → READY=1 (sd_notify) with only `metrics` enabled, and
// idle memory (VmRSS, RssAnon) once it is up. Target (issue #2): READY ≤ 50 ms, RssAnon ≤ 4 MiB.
// And SIGTERM → exit of every run, with its exit code. Target (issue #11): exit 0 within 1 s,
// always (a DaemonSet rolling update pays it on every node).
//
//   startup_bench --binary PATH [--runs N] [--idle-ms MS] [--settle-ms MS] [--config FILE --label TEXT]
// --settle-ms waits that long after READY=1 before SIGTERM (so gpu-inventory's NVML event
// waiter is blocked in its wait when the signal comes).
// With --config, that site file is used (the environment passes through) instead of a
// generated metrics-only one: `make bench` measures the 8-GPU device-plugin node this way.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::string StatusField(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) {
      auto v = line.substr(key.size() + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  std::string binary;
  int runs = 20;
  int idle_ms = 1000;
  int settle_ms = 0;
  std::string given_config;
  std::string label = "metrics only";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--binary" && i + 1 < argc) binary = argv[++i];
    else if (a == "--config" && i + 1 < argc) given_config = argv[++i];
    else if (a == "--label" && i + 1 < argc) label = argv[++i];
    else if (a == "--runs" && i + 1 < argc) runs = std::atoi(argv[++i]);
    else if (a == "--idle-ms" && i + 1 < argc) idle_ms = std::atoi(argv[++i]);
    else if (a == "--settle-ms" && i + 1 < argc) settle_ms = std::atoi(argv[++i]);
  }
  if (binary.empty()) {
    std::fprintf(stderr,
                 "usage: startup_bench --binary PATH [--runs N] [--idle-ms MS] [--settle-ms MS] "
                 "[--config FILE --label TEXT]\n");
    return 2;
  }
  const fs::path dir = fs::temp_directory_path() / ("gns-startup-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string config = given_config.empty() ? (dir / "site.yaml").string() : given_config;
  if (given_config.empty()) std::ofstream(config) << "version: v1\nnodeName: bench\npaths:\n  kubeletDir: " << dir.string()
                        << "\n  cdiDir: " << dir.string() << "\n  stateDir: " << dir.string()
                        << "\n  hostRoot: /\nlogging: {level: warn}\nmodules:\n  metrics: {enabled: true, listen: "
                           "127.0.0.1:0}\n";
  const std::string notify_path = (dir / "notify.sock").string();
  const int sock = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", notify_path.c_str());
  if (::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("bind notify socket");
    return 1;
  }
  timeval tv{10, 0};
  ::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setenv("NOTIFY_SOCKET", notify_path.c_str(), 1);

  std::vector<double> ready_ms;
  std::vector<double> exit_ms;
  int clean_exits = 0;
  std::string vm_rss, rss_anon, threads;
  for (int run = 0; run < runs; ++run) {
    const auto start = std::chrono::steady_clock::now();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execl(binary.c_str(), binary.c_str(), "run", "--config", config.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    char buf[256];
    const ssize_t n = ::recv(sock, buf, sizeof(buf), 0);
    const auto ready = std::chrono::steady_clock::now();
    if (n <= 0 || std::string(buf, static_cast<std::size_t>(n)) != "READY=1") {
      std::fprintf(stderr, "run %d: no READY=1 from the supervisor\n", run);
      ::kill(pid, SIGKILL);
      return 1;
    }
    ready_ms.push_back(std::chrono::duration<double, std::milli>(ready - start).count());
    if (run == runs - 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));  // settle: this is a benchmark, not a test
      vm_rss = StatusField(pid, "VmRSS");
      rss_anon = StatusField(pid, "RssAnon");
      threads = StatusField(pid, "Threads");
    }
    if (settle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));
    const auto term = std::chrono::steady_clock::now();
    ::kill(pid, SIGTERM);
    int status = 0;
    ::waitpid(pid, &status, 0);
    exit_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - term).count());
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ++clean_exits;
    ::recv(sock, buf, sizeof(buf), MSG_DONTWAIT);  // drop STOPPING=1
  }
  std::sort(ready_ms.begin(), ready_ms.end());
  std::sort(exit_ms.begin(), exit_ms.end());
  const auto pct = [](const std::vector<double>& v, double p) {
    return v[std::min(v.size() - 1, static_cast<std::size_t>(p * v.size()))];
  };
  std::printf("startup (%s): exec -> READY=1 over %d runs: p50 %.1f ms, p90 %.1f ms, max %.1f ms (target <= 50 ms)\n",
              label.c_str(), runs, pct(ready_ms, 0.5), pct(ready_ms, 0.9), ready_ms.back());
  std::printf("shutdown (%s): SIGTERM -> exit over %d runs: p50 %.1f ms, max %.1f ms (target <= 1000 ms), "
              "exit 0 in %d of %d\n",
              label.c_str(), runs, pct(exit_ms, 0.5), exit_ms.back(), clean_exits, runs);
  std::printf("idle memory (%s) after %d ms: VmRSS %s, RssAnon %s, threads %s\n", label.c_str(), idle_ms,
              vm_rss.c_str(), rss_anon.c_str(), threads.c_str());
  ::close(sock);
  fs::remove_all(dir);
  return 0;
}
