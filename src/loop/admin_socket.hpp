#pragma once
// A local admin socket: a unix stream socket (mode 0600, so only root, or whoever runs the
// supervisor, can talk to it) that takes one request line per connection and answers with lines:
// at once and one line (`OneShot`: "set-healthy GPU-…" → "ok: …"), or as work progresses (a
// streaming handler keeps its Reply and sends lines until Finish: "reset-gpu GPU-…" prints each
// step). Connections are bounded in number and in request length; the request must arrive
// within kDeadline; a streaming answer lasts as long as its handler says.

#include "loop/gate.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace gns {

class AdminSocket {
 public:
  // One connection's answer. Loop thread only; harmless after the client went away.
  class Reply {
   public:
    virtual ~Reply() = default;
    // A line of progress (no newline).
    virtual void Line(std::string line) = 0;
    // The last line; the connection closes once it is written.
    virtual void Finish(std::string line) = 0;
    // False once the client closed its end or the socket stopped.
    virtual bool Connected() const = 0;
  };
  using Handler = std::function<void(std::string_view line, std::shared_ptr<Reply> reply)>;
  // A handler answering every request with one line at once.
  static Handler OneShot(std::function<std::string(std::string_view line)> answer);

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
  Gate lifetime_;
  std::shared_ptr<std::size_t> open_ = std::make_shared<std::size_t>(0);
  bool started_ = false;
};

}  // namespace gns
