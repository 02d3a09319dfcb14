// gns-sim-nvsentinel: the simulated NVSentinel platform connector as a process, for `make run`
// and the integration tests. Prints "serving <socket>" once it listens, and a line per call.
// SIGUSR1: fail calls with UNAVAILABLE (the connector restarting); SIGUSR2: take them again.
// SIGINT/SIGTERM stop it (the record file keeps what it took; a new run appends).
#include "platform_connector_sim.h"

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>
#include <unistd.h>

namespace {

constexpr std::string_view kUsage =
    "usage: gns-sim-nvsentinel --socket PATH [--record FILE] [--delay-ms N] [--failing]\n"
    "Serves PlatformConnector.HealthEventOccurredV1 on PATH; records each event as a JSON line in FILE.\n"
    "SIGUSR1: fail calls (UNAVAILABLE); SIGUSR2: take them again; SIGTERM: stop.\n";

[[noreturn]] void Usage(const std::string& error) {
  if (!error.empty()) std::cerr << "gns-sim-nvsentinel: " << error << '\n';
  std::cerr << kUsage;
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  std::string record;
  long delay_ms = 0;
  bool failing = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--socket") {
      socket = value();
    } else if (arg == "--record") {
      record = value();
    } else if (arg == "--delay-ms") {
      delay_ms = std::strtol(value().c_str(), nullptr, 10);
    } else if (arg == "--failing") {
      failing = true;
    } else {
      Usage("unknown argument " + arg);
    }
  }
  if (socket.empty()) Usage("--socket is required");
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGINT, SIGTERM, SIGUSR1, SIGUSR2}) sigaddset(&signals, s);
  // Blocked before gRPC starts its threads, so they inherit the mask and sigwait gets them all.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  try {
    gns::sim::PlatformConnectorSim sim(socket, record);
    sim.SetDelay(std::chrono::milliseconds(delay_ms));
    sim.SetFailing(failing);
    std::cout << "serving " << socket << (failing ? " (failing calls)" : "") << std::endl;
    for (;;) {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0) continue;
      if (sig == SIGUSR1) {
        sim.SetFailing(true);
        std::cout << "failing calls with UNAVAILABLE" << std::endl;
      } else if (sig == SIGUSR2) {
        sim.SetFailing(false);
        std::cout << "taking calls again" << std::endl;
      } else {
        break;
      }
    }
    std::cout << "stopping: " << sim.Calls() << " calls, " << sim.FailedCalls() << " failed, " << sim.Events().size()
              << " events recorded" << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "gns-sim-nvsentinel: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
