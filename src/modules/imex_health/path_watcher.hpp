#pragma once
// Tells when anything changes in a few directories (the IMEX config directory, the channel
// directory), with inotify on the loop. A directory that does not exist yet is watched through
// its nearest existing ancestor, and the watches are laid again after every change, so a
// directory created later (mkdir -p /dev/nvidia-caps-imex-channels) is followed too. procfs has
// no inotify: /proc/devices is read at start and on unit (re)starts instead.

#include "loop/gate.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace gns::imex_health {

class PathWatcher {
 public:
  PathWatcher(boost::asio::io_context& io, std::vector<std::string> directories, std::function<void()> on_change);
  ~PathWatcher();
  PathWatcher(const PathWatcher&) = delete;
  PathWatcher& operator=(const PathWatcher&) = delete;

  // Throws std::system_error when inotify itself is unavailable.
  void Start();
  void Stop();
  // The directories actually watched now (the targets or their ancestors).
  const std::set<std::string>& Watched() const { return watched_paths_; }
  uint64_t Wakeups() const { return wakeups_; }

 private:
  void Lay();
  void Arm();

  std::vector<std::string> directories_;
  std::function<void()> on_change_;
  boost::asio::posix::stream_descriptor fd_;
  std::set<int> watches_;
  std::set<std::string> watched_paths_;
  Gate lifetime_;
  uint64_t wakeups_ = 0;
};

}  // namespace gns::imex_health
