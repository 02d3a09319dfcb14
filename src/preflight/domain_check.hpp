#pragma once
// IMEX domain readiness from nvidia-imex-ctl (seed 000 guide §3.5, §8.3, §9; upstream's
// host-managed mode refuses channel claims while `nvidia-imex-ctl -q` is not READY):
//  - `nvidia-imex-ctl -q [-c CONFIG]` prints READY when the local daemon is ready;
//  - `nvidia-imex-ctl -N [-c CONFIG]` prints the peers ("Node #0 - 10.0.0.1 - READY") and
//    "Domain State: UP" once every peer is connected.
// The parsers are pure; DomainCheck runs the two commands one after the other as supervised
// children (loop/run_command) with a deadline each. Shared by the module and `preflight`.

#include "loop/run_command.hpp"

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gns::imex_health {

struct ImexCtlNode {
  std::string address;
  std::string state;  // READY, UNAVAILABLE, …
};

struct ImexCtlNodes {
  bool parsed = false;        // a "Domain State:" line was found
  std::string domain_state;   // UP, DOWN, DEGRADED, …
  std::vector<ImexCtlNode> nodes;
};

// `-q`: the first non-empty line, trimmed ("READY" when ready).
std::string ParseImexCtlQuery(std::string_view out);
ImexCtlNodes ParseImexCtlNodes(std::string_view out);

struct DomainResult {
  bool ready = false;
  std::string reason;   // "" when ready; DomainNotReady, DomainCheckTimeout, DomainCheckFailed
  std::string message;  // what, naming the command and its answer
  std::string state;    // the -q answer, then the Domain State when -N ran ("READY/UP")
  std::vector<ImexCtlNode> nodes;
};

struct DomainCheckOptions {
  std::string command;      // the binary, as seen from here (under hostRoot)
  std::string config_file;  // -c, as seen from here; "" → none
  bool nodes = true;        // also run -N and ask for Domain State UP
  std::chrono::milliseconds timeout{5000};  // per command
};

// Judges the outputs of one check (a pure function: the module and preflight word it alike).
DomainResult JudgeDomain(const DomainCheckOptions& options, const CommandResult& query,
                         const CommandResult* nodes);

// Runs -q, then (when ready and asked) -N; `done` on `io` once, unless the handle is cancelled.
class DomainCheck : public std::enable_shared_from_this<DomainCheck> {
 public:
  static std::shared_ptr<DomainCheck> Start(boost::asio::io_context& io, DomainCheckOptions options,
                                            std::function<void(DomainResult)> done);
  void Cancel();
  // A child of an earlier check is still not reaped (killed but stuck): do not start another.
  bool Alive() const;

 private:
  DomainCheck(boost::asio::io_context& io, DomainCheckOptions options, std::function<void(DomainResult)> done);

  boost::asio::io_context& io_;
  DomainCheckOptions options_;
  std::function<void(DomainResult)> done_;
  std::shared_ptr<RunningCommand> running_;
  CommandResult query_;
  bool cancelled_ = false;
};

// Blocking (preflight): both commands on a private io_context.
DomainResult RunDomainCheckBlocking(const DomainCheckOptions& options);

}  // namespace gns::imex_health
