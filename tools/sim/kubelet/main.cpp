// gns-sim-kubelet: the fake kubelet as a process, for `make run` and manual testing. Logs every
// registration and ListAndWatch update on stdout and answers line commands on an optional unix
// control socket (one JSON line per command; kubeletctl.py sends them). SIGINT/SIGTERM stop it.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "control.h"
#include "csi.h"
#include "kubelet_sim.h"

namespace {

namespace fs = std::filesystem;
using gns::sim::KubeletSim;

constexpr std::string_view kUsage =
    "usage: gns-sim-kubelet --kubelet-dir DIR [--control-socket PATH] [--probe-interval SECONDS]\n"
    "                       [--dra-services v1.DRAPlugin,v1beta1.DRAPlugin]\n"
    "Serves DIR/device-plugins/kubelet.sock and watches DIR/plugins_registry like a kubelet.\n";

struct Args {
  fs::path kubelet_dir;
  fs::path control_socket;
  int probe_interval_s = 10;  // the kubelet's plugin monitor period
  std::vector<std::string> dra_services;
};

[[noreturn]] void Usage(const std::string& error) {
  if (!error.empty()) std::cerr << "gns-sim-kubelet: " << error << '\n';
  std::cerr << kUsage;
  std::exit(2);
}

Args ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--kubelet-dir") {
      args.kubelet_dir = value();
    } else if (arg == "--control-socket") {
      args.control_socket = value();
    } else if (arg == "--probe-interval") {
      try {
        args.probe_interval_s = std::stoi(value());
      } catch (const std::exception&) {
        Usage("--probe-interval needs a number of seconds");
      }
    } else if (arg == "--dra-services") {
      const std::string list = value();
      std::size_t start = 0;
      for (;;) {
        const std::size_t comma = list.find(',', start);
        const std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (!item.empty()) args.dra_services.push_back(item);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else {
      Usage("unknown argument " + arg);
    }
  }
  if (args.kubelet_dir.empty()) Usage("--kubelet-dir is required");
  return args;
}

void PrintLine(std::string_view line) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &local);
  std::cout << stamp << ' ' << line << std::endl;  // flushed: `make run` interleaves outputs
}

// The control socket: a unix stream socket, one command per line, one JSON line back. Commands
// run one at a time on this thread; clients are served in turn.
class ControlServer {
 public:
  ControlServer(KubeletSim& sim, fs::path path) : sim_(sim), path_(std::move(path)) {}
  ~ControlServer() { Stop(); }

  void Start() {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (path_.string().size() >= sizeof(address.sun_path)) throw std::runtime_error("control socket path too long");
    std::strncpy(address.sun_path, path_.c_str(), sizeof(address.sun_path) - 1);
    std::error_code ec;
    fs::remove(path_, ec);  // a stale socket from an earlier run
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (listen_fd_ < 0 || wake_fd_ < 0 ||
        ::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
        ::listen(listen_fd_, 8) != 0) {
      throw std::runtime_error("control socket " + path_.string() + ": " + std::strerror(errno));
    }
    thread_ = std::thread([this] { Loop(); });
  }

  void Stop() {
    if (wake_fd_ >= 0) {
      const std::uint64_t one = 1;
      // An eventfd write of 1 cannot fail short; the loop only needs to wake.
      [[maybe_unused]] ssize_t written = ::write(wake_fd_, &one, sizeof(one));
    }
    if (thread_.joinable()) thread_.join();
    for (const Client& client : clients_) ::close(client.fd);
    clients_.clear();
    if (listen_fd_ >= 0) {
      ::close(listen_fd_);
      std::error_code ec;
      fs::remove(path_, ec);  // best effort: the socket is ours
    }
    if (wake_fd_ >= 0) ::close(wake_fd_);
    listen_fd_ = wake_fd_ = -1;
  }

 private:
  struct Client {
    int fd;
    std::string buffer;
  };

  void Loop() {
    for (;;) {
      std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      for (const Client& client : clients_) fds.push_back({client.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[0].revents != 0) return;
      if (fds[1].revents & POLLIN) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) clients_.push_back(Client{fd, {}});
      }
      // Walk backwards so closing a client does not shift the ones still to visit.
      for (std::size_t i = fds.size(); i-- > 2;) {
        if (fds[i].revents == 0) continue;
        if (!Serve(clients_[i - 2])) {
          ::close(clients_[i - 2].fd);
          clients_.erase(clients_.begin() + static_cast<std::ptrdiff_t>(i - 2));
        }
      }
    }
  }

  // Reads what is there and answers every complete line; false when the client is gone.
  bool Serve(Client& client) {
    char chunk[4096];
    const ssize_t n = ::recv(client.fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    client.buffer.append(chunk, static_cast<std::size_t>(n));
    for (std::size_t newline; (newline = client.buffer.find('\n')) != std::string::npos;) {
      const std::string line = client.buffer.substr(0, newline);
      client.buffer.erase(0, newline + 1);
      auto csi = gns::sim::HandleCsiCommand(sim_, line, PrintLine);  // csi-publish, csi-unpublish, csi-volumes
      if (!Send(client.fd, (csi ? *csi : gns::sim::HandleKubeletCommand(sim_, line)) + "\n")) return false;
    }
    return client.buffer.size() < 1024 * 1024;  // a client that never ends its line is dropped
  }

  static bool Send(int fd, std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  KubeletSim& sim_;
  fs::path path_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::vector<Client> clients_;
};

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);

  // Signals are taken synchronously by sigwait below; block them before any thread exists so
  // none of gRPC's threads gets them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  gns::sim::KubeletSimOptions options;
  options.kubelet_dir = args.kubelet_dir;
  options.probe_interval = std::chrono::seconds(args.probe_interval_s);
  if (!args.dra_services.empty()) options.dra_services = args.dra_services;
  options.log = PrintLine;
  gns::sim::EnableCsi(options);  // a CSIPlugin's registration calls NodeGetInfo, as the kubelet's

  try {
    KubeletSim sim(options);
    sim.Start();
    ControlServer control(sim, args.control_socket);
    if (!args.control_socket.empty()) {
      control.Start();
      PrintLine("kubelet: control socket " + args.control_socket.string());
    }
    int signal = 0;
    sigwait(&signals, &signal);
    PrintLine(std::string("kubelet: ") + (signal == SIGINT ? "SIGINT" : "SIGTERM") + ", stopping");
    control.Stop();
    sim.Stop();
  } catch (const std::exception& e) {
    std::cerr << "gns-sim-kubelet: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
