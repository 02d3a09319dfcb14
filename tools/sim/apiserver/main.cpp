// gns-sim-apiserver: the simulated kube-apiserver as a process, for `make run` and for tests
// that drive the supervisor binary. Runs until SIGINT or SIGTERM.
#include <signal.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "apiserver.h"
#include "resources.h"

namespace {

constexpr std::string_view kUsage =
    "usage: gns-sim-apiserver [--listen HOST:PORT] [--state-dir DIR] [--seed FILE]...\n"
    "                         [--token TOKEN] [--bookmark-interval-ms N] [--no-client-cert] [-v]\n"
    "\n"
    "  --listen HOST:PORT        address to listen on (default 127.0.0.1:0, any free port)\n"
    "  --state-dir DIR           write ca.crt, token, namespace, kubeconfig, client.crt/.key\n"
    "  --seed FILE               YAML or JSON objects to create at start (repeatable)\n"
    "  --token TOKEN             the bearer token (default: random; see DIR/token)\n"
    "  --bookmark-interval-ms N  how often watches with allowWatchBookmarks get a BOOKMARK\n"
    "  --no-client-cert          do not accept client certificates\n"
    "  -v, --log-requests        one line per request on stderr\n"
    "\n"
    "Faults and stats: POST /_sim/faults, GET /_sim/stats (see README.md).\n"
    "Seed objects map kind to resource with this table (or carry \"_resource\"):\n";

bool ParseListen(std::string_view text, std::string* host, std::uint16_t* port) {
  std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return false;
  std::string_view host_part = text.substr(0, colon);
  if (host_part.size() >= 2 && host_part.front() == '[' && host_part.back() == ']') {
    host_part = host_part.substr(1, host_part.size() - 2);
  }
  std::string_view port_part = text.substr(colon + 1);
  unsigned value = 0;
  auto [ptr, ec] = std::from_chars(port_part.data(), port_part.data() + port_part.size(), value);
  if (ec != std::errc() || ptr != port_part.data() + port_part.size() || value > 65535) return false;
  *host = host_part.empty() ? "127.0.0.1" : std::string(host_part);
  *port = static_cast<std::uint16_t>(value);
  return true;
}

[[noreturn]] void Usage(int code, std::string_view error = {}) {
  if (!error.empty()) std::cerr << "gns-sim-apiserver: " << error << "\n\n";
  (code == 0 ? std::cout : std::cerr) << kUsage << gns::sim::api::KindTableMarkdown();
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  gns::sim::ApiServerOptions options;
  std::vector<std::string> seeds;
  std::vector<std::string_view> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    std::string_view value;
    std::size_t eq = arg.find('=');
    bool inline_value = arg.starts_with("--") && eq != std::string_view::npos;
    if (inline_value) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    auto next = [&]() -> std::string_view {
      if (inline_value) return value;
      if (i + 1 >= args.size()) Usage(2, std::string(arg) + " needs a value");
      return args[++i];
    };
    if (arg == "-h" || arg == "--help") {
      Usage(0);
    } else if (arg == "--listen") {
      if (!ParseListen(next(), &options.listen_address, &options.port)) Usage(2, "bad --listen (HOST:PORT)");
    } else if (arg == "--state-dir") {
      options.state_dir = std::string(next());
    } else if (arg == "--seed") {
      seeds.emplace_back(next());
    } else if (arg == "--token") {
      options.token = std::string(next());
    } else if (arg == "--bookmark-interval-ms") {
      std::string_view text = next();
      unsigned ms = 0;
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), ms);
      if (ec != std::errc() || ptr != text.data() + text.size() || ms == 0) Usage(2, "bad --bookmark-interval-ms");
      options.bookmark_interval = std::chrono::milliseconds(ms);
    } else if (arg == "--no-client-cert") {
      options.client_cert_auth = false;
    } else if (arg == "-v" || arg == "--log-requests") {
      options.log_requests = true;
    } else {
      Usage(2, "unknown argument " + std::string(arg));
    }
  }

  // Block the stop signals before any thread starts, so only sigwait() below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  try {
    gns::sim::ApiServer server(options);
    for (const auto& seed : seeds) server.SeedFile(seed);
    server.Start();
    std::cout << "gns-sim-apiserver listening on " << server.BaseUrl();
    if (!options.state_dir.empty()) std::cout << " (state in " << options.state_dir.string() << ")";
    std::cout << std::endl;
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    std::cout << "gns-sim-apiserver: stopping on signal " << signal_number << std::endl;
    server.Stop();
  } catch (const std::exception& e) {
    std::cerr << "gns-sim-apiserver: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
