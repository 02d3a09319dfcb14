// The admin socket on the loop.
#include "modules/gpu_health/admin_socket.hpp"

#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace gns::gpu_health {

namespace asio = boost::asio;
using asio::local::stream_protocol;

struct AdminSocket::Session : std::enable_shared_from_this<Session> {
  Session(asio::io_context& io, stream_protocol::socket s)
      : socket(std::move(s)), timer(io), buffer(kMaxLineBytes + 1) {}
  stream_protocol::socket socket;
  asio::steady_timer timer;
  asio::streambuf buffer;
  std::string answer;
};

AdminSocket::AdminSocket(asio::io_context& io, std::string path, Handler handler)
    : io_(io), path_(std::move(path)), handler_(std::move(handler)), acceptor_(io) {}

AdminSocket::~AdminSocket() {
  *alive_ = false;
  Stop();
}

void AdminSocket::Start() {
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      throw std::system_error(EEXIST, std::generic_category(), path_ + " exists and is not a socket");
    }
    ::unlink(path_.c_str());  // a stale socket of an earlier run
  }
  stream_protocol::endpoint endpoint(path_);
  acceptor_.open(endpoint.protocol());
  acceptor_.bind(endpoint);
  if (::chmod(path_.c_str(), 0600) != 0) {
    const int err = errno;
    acceptor_.close();
    ::unlink(path_.c_str());
    throw std::system_error(err, std::generic_category(), "chmod 0600 " + path_);
  }
  acceptor_.listen(static_cast<int>(kMaxConnections));
  started_ = true;
  Accept();
}

void AdminSocket::Stop() {
  if (!started_) return;
  started_ = false;
  boost::system::error_code ignored;  // closing during shutdown: nothing to do on failure
  acceptor_.close(ignored);
  ::unlink(path_.c_str());
}

void AdminSocket::Accept() {
  acceptor_.async_accept([this, alive = alive_](const boost::system::error_code& ec, stream_protocol::socket socket) {
    if (!*alive || !started_) return;
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      if (open_ >= kMaxConnections) {
        boost::system::error_code ignored;  // refusing a connection over the cap
        socket.close(ignored);
      } else {
        ++open_;
        auto session = std::make_shared<Session>(io_, std::move(socket));
        auto finish = [this, alive, session] {
          boost::system::error_code ignored;  // the peer may already be gone
          session->timer.cancel();
          session->socket.close(ignored);
          if (*alive) --open_;
        };
        session->timer.expires_after(kDeadline);
        session->timer.async_wait([session](const boost::system::error_code& tec) {
          if (tec) return;
          boost::system::error_code ignored;  // a slow client: cut it off
          session->socket.close(ignored);
        });
        asio::async_read_until(
            session->socket, session->buffer, '\n',
            [this, alive, session, finish](const boost::system::error_code& rec, std::size_t n) {
              if (!*alive) return;
              if (rec && rec != asio::error::eof) {
                finish();
                return;
              }
              // At EOF without a newline, the request is whatever arrived.
              const std::size_t take = rec == asio::error::eof ? session->buffer.size() : n;
              std::string line(asio::buffers_begin(session->buffer.data()),
                               asio::buffers_begin(session->buffer.data()) + static_cast<std::ptrdiff_t>(take));
              while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
              session->answer = line.empty() ? std::string("error: empty request") : handler_(line);
              session->answer += "\n";
              asio::async_write(session->socket, asio::buffer(session->answer),
                                [session, finish](const boost::system::error_code&, std::size_t) { finish(); });
            });
      }
    }
    Accept();
  });
}

}  // namespace gns::gpu_health
