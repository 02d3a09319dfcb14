#pragma once
// Watches one directory with inotify, on the loop: the inotify fd is an Asio stream
// descriptor waited on with async_wait — no polling. Used for the kubelet's socket
// directories (device-plugins/, plugins_registry/), where a kubelet restart shows up as our
// socket being deleted and kubelet.sock being created again.

#include "loop/gate.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include <functional>
#include <memory>
#include <string>
#include <system_error>

namespace gns {

class DirWatcher {
 public:
  enum class Change { kCreated, kDeleted, kDirectoryGone, kOverflow };
  // `name` is the entry's file name (empty for kDirectoryGone / kOverflow).
  using Callback = std::function<void(Change change, const std::string& name)>;

  DirWatcher(boost::asio::io_context& io, std::string directory, Callback callback);
  ~DirWatcher();
  DirWatcher(const DirWatcher&) = delete;
  DirWatcher& operator=(const DirWatcher&) = delete;

  // Starts watching; throws std::system_error if the directory cannot be watched.
  void Start();
  void Stop();
  const std::string& Directory() const { return directory_; }

 private:
  void Arm();
  void Drain();

  std::string directory_;
  Callback callback_;
  boost::asio::posix::stream_descriptor descriptor_;
  Gate lifetime_;
  int watch_ = -1;
};

}  // namespace gns
