// inotify over a few directories: see path_watcher.hpp.
#include "modules/imex_health/path_watcher.hpp"

#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <climits>
#include <system_error>

namespace gns::imex_health {

PathWatcher::PathWatcher(boost::asio::io_context& io, std::vector<std::string> directories,
                         std::function<void()> on_change)
    : directories_(std::move(directories)), on_change_(std::move(on_change)), fd_(io) {}

PathWatcher::~PathWatcher() { Stop(); }

void PathWatcher::Start() {
  const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "inotify_init1");
  fd_.assign(fd);
  Lay();
  Arm();
}

void PathWatcher::Stop() {
  lifetime_.Renew();
  if (fd_.is_open()) {
    boost::system::error_code ec;
    fd_.close(ec);  // closing drops every watch; nothing to do on error
  }
  watches_.clear();
  watched_paths_.clear();
}

void PathWatcher::Lay() {
  // inotify_add_watch on a path already watched returns the same descriptor; only watches no
  // longer wanted are removed (each removal queues one IN_IGNORED, which lays the same set).
  constexpr uint32_t kMask = IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM | IN_CLOSE_WRITE | IN_ATTRIB |
                             IN_DELETE_SELF | IN_MOVE_SELF;
  std::map<std::string, int> wanted;
  for (std::string dir : directories_) {
    for (;;) {
      const int wd = ::inotify_add_watch(fd_.native_handle(), dir.c_str(), kMask | IN_ONLYDIR);
      if (wd >= 0) {
        wanted.emplace(dir, wd);
        break;
      }
      if (dir == "/" || dir.empty()) break;
      const auto slash = dir.find_last_of('/');
      dir = slash == 0 || slash == std::string::npos ? "/" : dir.substr(0, slash);
    }
  }
  std::set<int> keep;
  for (const auto& [path, wd] : wanted) keep.insert(wd);
  for (const int wd : watches_) {
    if (!keep.contains(wd)) ::inotify_rm_watch(fd_.native_handle(), wd);
  }
  watches_ = std::move(keep);
  watched_paths_.clear();
  for (const auto& [path, wd] : wanted) watched_paths_.insert(path);
}

void PathWatcher::Arm() {
  fd_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                 [this, alive = lifetime_.Watch()](const boost::system::error_code& ec) {
                   if (ec || !alive) return;
                   ++wakeups_;
                   alignas(inotify_event) char buffer[16 * (sizeof(inotify_event) + NAME_MAX + 1)];
                   while (::read(fd_.native_handle(), buffer, sizeof(buffer)) > 0) {
                   }
                   Lay();  // a directory may have appeared or gone
                   on_change_();
                   if (alive && fd_.is_open()) Arm();
                 });
}

}  // namespace gns::imex_health
