#pragma once
// Runs the real binary in tests: argv + extra environment, stdout/stderr captured by a reader
// thread, lines waited for with a real-time limit, signals, exit status.

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace gns::test {

class Subprocess {
 public:
  Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env = {});
  ~Subprocess();

  // Waits until a line of stdout or stderr contains `needle`; returns that line.
  std::optional<std::string> WaitForLine(const std::string& needle,
                                         std::chrono::milliseconds limit = std::chrono::seconds(20));
  void Signal(int signal);
  // Waits for exit; returns the exit code (128+N for a signal), or nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds limit = std::chrono::seconds(20));
  std::string Output() const;
  int Pid() const { return pid_; }

 private:
  int pid_ = -1;
  int out_fd_ = -1;
  std::thread reader_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::string output_;
  bool eof_ = false;
  std::optional<int> exit_code_;
};

// Runs to completion (limit 60 s) and returns {exit code, combined output}.
std::pair<int, std::string> RunToCompletion(std::vector<std::string> argv,
                                            std::map<std::string, std::string> env = {});

}  // namespace gns::test
