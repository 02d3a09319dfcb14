// inotify on the loop.
#include "loop/dir_watcher.hpp"

#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

namespace gns {

DirWatcher::DirWatcher(boost::asio::io_context& io, std::string directory, Callback callback)
    : directory_(std::move(directory)), callback_(std::move(callback)), descriptor_(io) {}

DirWatcher::~DirWatcher() { Stop(); }

void DirWatcher::Start() {
  const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "inotify_init1");
  watch_ = ::inotify_add_watch(fd, directory_.c_str(),
                               IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE_SELF | IN_MOVE_SELF);
  if (watch_ < 0) {
    const int err = errno;
    ::close(fd);
    throw std::system_error(err, std::generic_category(), "inotify_add_watch " + directory_);
  }
  descriptor_.assign(fd);
  Arm();
}

void DirWatcher::Stop() {
  lifetime_.Renew();
  if (descriptor_.is_open()) {
    boost::system::error_code ec;
    descriptor_.close(ec);  // cancels the pending wait; nothing useful to do on error
  }
}

void DirWatcher::Arm() {
  descriptor_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                         [this, alive = lifetime_.Watch()](const boost::system::error_code& ec) {
                           if (ec || !alive) return;
                           Drain();
                           if (alive && descriptor_.is_open()) Arm();
                         });
}

void DirWatcher::Drain() {
  alignas(inotify_event) char buffer[16 * (sizeof(inotify_event) + NAME_MAX + 1)];
  auto alive = lifetime_.Watch();
  for (;;) {
    const ssize_t n = ::read(descriptor_.native_handle(), buffer, sizeof(buffer));
    if (n <= 0) return;  // EAGAIN: drained
    for (char* p = buffer; p < buffer + n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(p);
      p += sizeof(inotify_event) + event->len;
      const std::string name = event->len > 0 ? std::string(event->name) : std::string();
      if (event->mask & IN_Q_OVERFLOW) {
        callback_(Change::kOverflow, {});
      } else if (event->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED)) {
        callback_(Change::kDirectoryGone, {});
      } else if (event->mask & (IN_CREATE | IN_MOVED_TO)) {
        callback_(Change::kCreated, name);
      } else if (event->mask & (IN_DELETE | IN_MOVED_FROM)) {
        callback_(Change::kDeleted, name);
      }
      if (!alive) return;  // the callback stopped or destroyed us
    }
  }
}

}  // namespace gns
