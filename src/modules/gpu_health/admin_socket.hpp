#pragma once
// The local admin socket: a unix stream socket (mode 0600, so only root, or whoever runs the
// supervisor, can talk to it) speaking one request line and one answer line per connection:
//   set-healthy <GPU-uuid>|all   →   ok: … | error: …
// Connections are bounded in number, in line length and in time.

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace gns::gpu_health {

class AdminSocket {
 public:
  // Gets one request line (without the newline) and returns the answer (without it).
  using Handler = std::function<std::string(std::string_view line)>;

  static constexpr std::size_t kMaxLineBytes = 4096;
  static constexpr std::size_t kMaxConnections = 8;
  static constexpr std::chrono::seconds kDeadline{5};

  AdminSocket(boost::asio::io_context& io, std::string path, Handler handler);
  ~AdminSocket();
  AdminSocket(const AdminSocket&) = delete;
  AdminSocket& operator=(const AdminSocket&) = delete;

  // Replaces a stale socket file, binds, sets 0600, listens. Throws std::system_error.
  void Start();
  // Stops accepting, closes open connections and removes the socket file.
  void Stop();
  const std::string& Path() const { return path_; }

 private:
  struct Session;
  void Accept();

  boost::asio::io_context& io_;
  std::string path_;
  Handler handler_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::size_t open_ = 0;
  bool started_ = false;
};

}  // namespace gns::gpu_health
