// nvidia-imex-ctl domain readiness: see domain_check.hpp.
#include "preflight/domain_check.hpp"

#include <sstream>

namespace gns::imex_health {
namespace {

std::string TrimmedString(std::string_view s) {
  const auto begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return {};
  const auto end = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(begin, end - begin + 1));
}

// The first line of what a command said (stdout, else stderr), cut short for a message.
std::string Said(const CommandResult& r) {
  std::string text = TrimmedString(r.out).empty() ? TrimmedString(r.err) : TrimmedString(r.out);
  if (const auto nl = text.find('\n'); nl != std::string::npos) text = text.substr(0, nl);
  if (text.size() > 200) text = text.substr(0, 200) + "…";
  return text.empty() ? "nothing" : "\"" + text + "\"";
}

std::string CommandLine(const DomainCheckOptions& options, const char* flag) {
  return "nvidia-imex-ctl " + std::string(flag) + (options.config_file.empty() ? "" : " -c " + options.config_file);
}

CommandSpec ImexCtlSpec(const DomainCheckOptions& options, const char* flag) {
  CommandSpec spec;
  spec.argv = {options.command, flag};
  if (!options.config_file.empty()) {
    spec.argv.push_back("-c");
    spec.argv.push_back(options.config_file);
  }
  spec.timeout = options.timeout;
  return spec;
}

}  // namespace

std::string ParseImexCtlQuery(std::string_view out) {
  std::istringstream in{std::string(out)};
  std::string line;
  while (std::getline(in, line)) {
    auto t = TrimmedString(line);
    if (!t.empty()) return t;
  }
  return {};
}

ImexCtlNodes ParseImexCtlNodes(std::string_view out) {
  ImexCtlNodes result;
  std::istringstream in{std::string(out)};
  std::string line;
  while (std::getline(in, line)) {
    const std::string t = TrimmedString(line);
    if (t.rfind("Domain State:", 0) == 0) {
      result.parsed = true;
      result.domain_state = TrimmedString(std::string_view(t).substr(13));
      continue;
    }
    // "Node #0   - 10.136.206.48   - READY"
    if (t.rfind("Node #", 0) != 0) continue;
    const auto first = t.find(" - ");
    if (first == std::string::npos) continue;
    const auto second = t.find(" - ", first + 3);
    if (second == std::string::npos) continue;
    ImexCtlNode node;
    node.address = TrimmedString(std::string_view(t).substr(first + 3, second - first - 3));
    node.state = TrimmedString(std::string_view(t).substr(second + 3));
    if (!node.address.empty()) result.nodes.push_back(std::move(node));
  }
  return result;
}

DomainResult JudgeDomain(const DomainCheckOptions& options, const CommandResult& query, const CommandResult* nodes) {
  DomainResult r;
  auto fail = [&](const char* reason, std::string message) {
    r.ready = false;
    r.reason = reason;
    r.message = std::move(message);
    return r;
  };
  const std::string q = CommandLine(options, "-q");
  if (!query.started) return fail("DomainCheckFailed", q + ": " + query.error);
  if (query.timed_out) return fail("DomainCheckTimeout", q + ": " + query.Describe() + "; IMEX does not answer");
  const std::string answer = ParseImexCtlQuery(query.out);
  r.state = answer;
  if (!query.Ok() || answer != "READY") {
    return fail("DomainNotReady", q + " answered " + Said(query) + " (" + query.Describe() + "), not READY");
  }
  if (!nodes) {
    r.ready = true;
    return r;
  }
  const std::string n = CommandLine(options, "-N");
  if (!nodes->started) return fail("DomainCheckFailed", n + ": " + nodes->error);
  if (nodes->timed_out) return fail("DomainCheckTimeout", n + ": " + nodes->Describe() + "; IMEX does not answer");
  const auto parsed = ParseImexCtlNodes(nodes->out);
  r.nodes = parsed.nodes;
  if (!nodes->Ok() || !parsed.parsed) {
    return fail("DomainNotReady", n + " answered " + Said(*nodes) + " (" + nodes->Describe() + "), no Domain State");
  }
  r.state += "/" + parsed.domain_state;
  if (parsed.domain_state != "UP") {
    std::string down;
    for (const auto& node : parsed.nodes) {
      if (node.state != "READY") down += (down.empty() ? "" : ", ") + node.address + " " + node.state;
    }
    return fail("DomainNotReady", n + ": Domain State " + parsed.domain_state +
                                      (down.empty() ? std::string() : "; peers not READY: " + down));
  }
  r.ready = true;
  return r;
}

DomainCheck::DomainCheck(boost::asio::io_context& io, DomainCheckOptions options, std::function<void(DomainResult)> done)
    : io_(io), options_(std::move(options)), done_(std::move(done)) {}

std::shared_ptr<DomainCheck> DomainCheck::Start(boost::asio::io_context& io, DomainCheckOptions options,
                                                std::function<void(DomainResult)> done) {
  std::shared_ptr<DomainCheck> check(new DomainCheck(io, std::move(options), std::move(done)));
  check->running_ = RunCommand(io, ImexCtlSpec(check->options_, "-q"), [check](CommandResult query) {
    if (check->cancelled_) return;
    const bool ask_nodes = check->options_.nodes && query.Ok() && ParseImexCtlQuery(query.out) == "READY";
    if (!ask_nodes) {
      auto done = std::move(check->done_);
      done(JudgeDomain(check->options_, query, nullptr));
      return;
    }
    check->query_ = std::move(query);
    check->running_ = RunCommand(check->io_, ImexCtlSpec(check->options_, "-N"), [check](CommandResult nodes) {
      if (check->cancelled_) return;
      auto done = std::move(check->done_);
      done(JudgeDomain(check->options_, check->query_, &nodes));
    });
  });
  return check;
}

void DomainCheck::Cancel() {
  cancelled_ = true;
  if (running_) running_->Cancel();
}

bool DomainCheck::Alive() const { return running_ && running_->Alive(); }

DomainResult RunDomainCheckBlocking(const DomainCheckOptions& options) {
  const CommandResult query = RunCommandBlocking(ImexCtlSpec(options, "-q"));
  if (!options.nodes || !query.Ok() || ParseImexCtlQuery(query.out) != "READY") {
    return JudgeDomain(options, query, nullptr);
  }
  const CommandResult nodes = RunCommandBlocking(ImexCtlSpec(options, "-N"));
  return JudgeDomain(options, query, &nodes);
}

}  // namespace gns::imex_health
