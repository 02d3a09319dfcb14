// The admin socket on the loop (see admin_socket.hpp).
#include "loop/admin_socket.hpp"

#include "loop/socket_path.hpp"

#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace gns {

namespace asio = boost::asio;
using asio::local::stream_protocol;

struct AdminSocket::Session : AdminSocket::Reply, std::enable_shared_from_this<Session> {
  Session(asio::io_context& io, stream_protocol::socket s, std::shared_ptr<std::size_t> open)
      : socket(std::move(s)), timer(io), buffer(kMaxLineBytes + 1), open_count(std::move(open)) {
    ++*open_count;
  }
  ~Session() override { --*open_count; }

  void Line(std::string line) override { Queue(std::move(line), false); }
  void Finish(std::string line) override { Queue(std::move(line), true); }
  bool Connected() const override { return socket.is_open() && !finished; }

  void Queue(std::string line, bool last) {
    if (finished || !socket.is_open()) return;
    finished = last;
    pending.push_back(std::move(line) + "\n");
    if (!writing) WriteNext();
  }

  void WriteNext() {
    if (pending.empty()) {
      writing = false;
      if (finished) Close();
      return;
    }
    writing = true;
    asio::async_write(socket, asio::buffer(pending.front()),
                      [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
                        self->pending.pop_front();
                        if (ec) {
                          self->pending.clear();
                          self->writing = false;
                          self->Close();
                          return;
                        }
                        self->WriteNext();
                      });
  }

  // Notices a client that hangs up while a streaming answer is pending.
  void WatchPeer() {
    socket.async_wait(stream_protocol::socket::wait_read, [self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec || !self->socket.is_open()) return;
      char c;
      boost::system::error_code rec;
      const std::size_t n = self->socket.receive(asio::buffer(&c, 1), stream_protocol::socket::message_peek, rec);
      if (rec || n == 0) {
        self->Close();
        return;
      }
      // More bytes from the client: ignored (one request per connection); drain and watch on.
      char sink[256];
      self->socket.receive(asio::buffer(sink), 0, rec);
      if (!rec) self->WatchPeer();
    });
  }

  void Close() {
    boost::system::error_code ignored;  // the peer may already be gone
    timer.cancel();
    socket.close(ignored);
  }

  stream_protocol::socket socket;
  asio::steady_timer timer;
  asio::streambuf buffer;
  std::shared_ptr<std::size_t> open_count;
  std::deque<std::string> pending;
  bool writing = false;
  bool finished = false;
};

AdminSocket::Handler AdminSocket::OneShot(std::function<std::string(std::string_view line)> answer) {
  return [answer = std::move(answer)](std::string_view line, std::shared_ptr<Reply> reply) {
    reply->Finish(answer(line));
  };
}

AdminSocket::AdminSocket(asio::io_context& io, std::string path, Handler handler)
    : io_(io), path_(std::move(path)), handler_(std::move(handler)), acceptor_(io) {}

AdminSocket::~AdminSocket() {
  lifetime_.Close();
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
  // Bound where nobody else can reach it, made 0600, then renamed into place: the root CLI never
  // talks to a socket that someone else could have connected to or replaced (socket_path.hpp).
  PrivateSocketBind bind(path_);
  stream_protocol::endpoint endpoint(bind.BindPath());
  acceptor_.open(endpoint.protocol());
  acceptor_.bind(endpoint);
  acceptor_.listen(static_cast<int>(kMaxConnections));
  try {
    bind.Publish(0600);
  } catch (const std::exception& e) {
    boost::system::error_code ignored;  // failing the start anyway
    acceptor_.close(ignored);
    throw std::system_error(EACCES, std::generic_category(), e.what());
  }
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
  acceptor_.async_accept([this, alive = lifetime_.Watch()](const boost::system::error_code& ec,
                                                           stream_protocol::socket socket) {
    if (!alive || !started_) return;
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      if (*open_ >= kMaxConnections) {
        boost::system::error_code ignored;  // refusing a connection over the cap
        socket.close(ignored);
      } else {
        auto session = std::make_shared<Session>(io_, std::move(socket), open_);
        session->timer.expires_after(kDeadline);
        session->timer.async_wait([session](const boost::system::error_code& tec) {
          if (tec) return;
          session->Close();  // a slow client: cut it off
        });
        asio::async_read_until(
            session->socket, session->buffer, '\n',
            [this, alive, session](const boost::system::error_code& rec, std::size_t n) {
              if (!alive) return;
              if (rec && rec != asio::error::eof) {
                session->Close();
                return;
              }
              session->timer.cancel();
              // At EOF without a newline, the request is whatever arrived.
              const std::size_t take = rec == asio::error::eof ? session->buffer.size() : n;
              std::string line(asio::buffers_begin(session->buffer.data()),
                               asio::buffers_begin(session->buffer.data()) + static_cast<std::ptrdiff_t>(take));
              while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
              if (line.empty()) {
                session->Finish("error: empty request");
                return;
              }
              if (rec != asio::error::eof) session->WatchPeer();
              handler_(line, session);
            });
      }
    }
    Accept();
  });
}

}  // namespace gns
