// The journald module: sd-journal on the loop.
#include "modules/journald/journald_module.hpp"

#include "loop/atomic_file.hpp"
#include "loop/config_checks.hpp"
#include "loop/state_file.hpp"
#include "loop/state_load.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <system_error>

namespace gns::journald {

namespace {
// cursor.json holds two journal cursors and a boot ID: a few hundred bytes.
constexpr std::size_t kMaxCursorFileBytes = 64 * 1024;
}  // namespace
namespace {

constexpr int kCursorFileVersion = 1;

bool IsBootId(std::string_view text) {
  if (text.size() != 32) return false;
  for (const char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::optional<SavedPosition> ParseSavedPosition(std::string_view text, std::string& error) {
  const auto doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    error = "not a JSON object";
    return std::nullopt;
  }
  const auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer() || version->get<int>() != kCursorFileVersion) {
    error = "missing or unknown version";
    return std::nullopt;
  }
  SavedPosition out;
  const auto boot = doc.find("bootId");
  const auto cursor = doc.find("cursor");
  const auto mono = doc.find("monotonicUsec");
  const auto real = doc.find("realtimeUsec");
  if (boot == doc.end() || !boot->is_string() || !IsBootId(boot->get<std::string>())) {
    error = "bootId is not a 32-digit boot ID";
    return std::nullopt;
  }
  if (cursor == doc.end() || !cursor->is_string() || cursor->get<std::string>().empty() ||
      cursor->get<std::string>().size() > 1024) {
    error = "cursor missing or not a plausible journal cursor";
    return std::nullopt;
  }
  if (mono == doc.end() || !mono->is_number_unsigned() || real == doc.end() || !real->is_number_unsigned()) {
    error = "monotonicUsec/realtimeUsec missing or not unsigned integers";
    return std::nullopt;
  }
  out.boot_id = boot->get<std::string>();
  out.cursor = cursor->get<std::string>();
  out.monotonic_usec = mono->get<uint64_t>();
  out.realtime_usec = real->get<uint64_t>();
  return out;
}

std::string SerializeSavedPosition(const SavedPosition& p) {
  return nlohmann::json{{"version", kCursorFileVersion},
                        {"bootId", p.boot_id},
                        {"cursor", p.cursor},
                        {"monotonicUsec", p.monotonic_usec},
                        {"realtimeUsec", p.realtime_usec}}
             .dump() +
         "\n";
}

JournaldModule::Config JournaldModule::ParseConfig(ConfigMap& section, const SiteConfig&) {
  using std::chrono::milliseconds;
  Config config;
  config.directory = ReadAbsolutePath(section, "directory", "", /*allow_empty=*/true);
  config.kernel = section.Bool("kernel", true);
  config.units = section.StringList("units", std::vector<std::string>{});
  for (const auto& unit : config.units) {
    if (unit.empty() || unit.find('=') != std::string::npos || unit.find('\n') != std::string::npos) {
      section.Fail("units", "not a unit name: \"" + unit + "\"");
    }
  }
  config.ack_identifier = section.String("ackIdentifier", config.ack_identifier);
  if (config.ack_identifier.find('\n') != std::string::npos) section.Fail("ackIdentifier", "must be one line");
  if (!config.kernel && config.units.empty() && config.ack_identifier.empty()) {
    section.Fail("kernel", "nothing to read: kernel is false, no units and no ackIdentifier");
  }
  config.cursor_flush_interval =
      section.Duration("cursorFlushInterval", milliseconds(10), milliseconds(600000), milliseconds(5000));
  config.boot_lookback = section.Duration("bootLookback", milliseconds(1000), std::chrono::hours(24 * 30),
                                          std::chrono::hours(24));
  config.max_message_bytes =
      static_cast<std::size_t>(section.Int("maxMessageBytes", 256, 1 << 20, 16384));
  config.batch = static_cast<std::size_t>(section.Int("batch", 1, 100000, 512));
  return config;
}

JournaldModule::JournaldModule(ModuleContext& context, const Config& config)
    : context_(context),
      config_(config),
      flush_timer_(context.GetLoop().Io()),
      warn_(context.GetClock()),
      unit_names_(config.units.begin(), config.units.end()) {
  if (!context.Site().paths.state_dir.empty()) {
    cursor_path_ = context.Site().paths.state_dir + "/journald/cursor.json";
  }
  auto& m = context.Metrics();
  const std::string lines = "gpu_node_supervisor_journald_lines_total";
  const char* lines_help = "Journal entries published, by kind";
  kernel_lines_ = &m.Counter(lines, lines_help, {{"kind", "kernel"}});
  unit_lines_ = &m.Counter(lines, lines_help, {{"kind", "unit"}});
  ack_lines_ = &m.Counter(lines, lines_help, {{"kind", "ack"}});
  skipped_old_ = &m.Counter("gpu_node_supervisor_journald_skipped_old_total",
                            "Entries of the current boot skipped as older than bootLookback");
  gaps_ = &m.Counter("gpu_node_supervisor_journald_cursor_gaps_total",
                     "Positions no longer in the journal at a (re)start (rotated or vacuumed)");
  truncated_ = &m.Counter("gpu_node_supervisor_journald_truncated_total",
                          "MESSAGE fields cut at maxMessageBytes");
  boot_changes_ = &m.Counter("gpu_node_supervisor_journald_boot_changes_total",
                             "Entries of a new boot seen while reading");
  cursor_writes_failed_ = &m.Counter("gpu_node_supervisor_journald_cursor_write_failures_total",
                                     "Failed writes of cursor.json");
  const std::string wakeups = "gpu_node_supervisor_journald_wakeups_total";
  const char* wakeups_help =
      "Wakes to process the journal, by cause: its fd readable, or the timeout sd-journal asked for";
  fd_wakeups_ = &m.Counter(wakeups, wakeups_help, {{"cause", "fd"}});
  timeout_wakeups_ = &m.Counter(wakeups, wakeups_help, {{"cause", "timeout"}});
  health_requests_ = &m.Counter("gpu_node_supervisor_journald_health_requests_total",
                                "Requests for the health stream taken (its consumer's position)");
  state_.source = config_.directory.empty() ? "system" : config_.directory;
  // A new instance, a new name: requests made for an earlier one are not ours.
  std::random_device random;
  char reader[17];
  std::snprintf(reader, sizeof reader, "%08x%08x", random(), random());
  state_.reader = reader;
}

JournaldModule::~JournaldModule() { lifetime_.Close(); }

JournalStream::Hooks JournaldModule::HooksFor(bool health) {
  JournalStream::Hooks hooks;
  if (health) {
    hooks.entry = [this](JournalEntry&& entry) { OnHealthEntry(std::move(entry)); };
  } else {
    hooks.entry = [this](JournalEntry&& entry) { OnUnitEntry(std::move(entry)); };
  }
  hooks.bad = [this](std::string_view kind, std::string_view what) {
    if (kind == "cursor_gap") gaps_->Inc();
    Bad(kind, what);
  };
  hooks.failed = [this](const std::string& why) {
    if (!stopping_) context_.ReportFailure(why);
  };
  hooks.changed = [this] { PublishState(); };
  hooks.woke = [this](JournalWaiter::Cause cause) {
    (cause == JournalWaiter::Cause::kFd ? fd_wakeups_ : timeout_wakeups_)->Inc();
  };
  hooks.skipped_old = [this] { skipped_old_->Inc(); };
  return hooks;
}

void JournaldModule::Start() {
  // Only the units stream keeps a position of ours. A state directory that cannot take it
  // (read-only, full) costs that position after a restart, never the streams: the health stream
  // is positioned by its consumer and must keep flowing.
  if (!cursor_path_.empty() && !config_.units.empty()) {
    // 0700 whatever the umask: nobody else may plant a cursor here.
    const auto dir = std::filesystem::path(cursor_path_).parent_path().string();
    std::string error;
    if (!EnsureDirectory(dir, 0700, error)) CursorNotPersisted("creating " + dir + ": " + error);
  }
  auto options = [&](std::string name, std::vector<std::vector<std::string>> groups) {
    return JournalStream::Options{std::move(name), config_.directory, std::move(groups), config_.max_message_bytes,
                                  config_.batch, config_.boot_lookback};
  };
  std::vector<std::vector<std::string>> health_groups;
  if (config_.kernel) health_groups.push_back({"_TRANSPORT=kernel"});
  if (!config_.ack_identifier.empty()) health_groups.push_back({"SYSLOG_IDENTIFIER=" + config_.ack_identifier});
  if (!health_groups.empty()) {
    health_ = std::make_unique<JournalStream>(context_.GetLoop().Io(), context_.GetClock(),
                                              options("health", std::move(health_groups)), HooksFor(true));
    health_->Open();
    state_.boot_id = health_->CurrentBoot();
  }
  if (!config_.units.empty()) {
    std::vector<std::string> units;
    for (const auto& unit : config_.units) units.push_back("_SYSTEMD_UNIT=" + unit);
    units_ = std::make_unique<JournalStream>(context_.GetLoop().Io(), context_.GetClock(),
                                             options("units", {units}), HooksFor(false));
    units_->Open();
    if (cursor_path_.empty()) {
      PositionUnits(std::nullopt);
    } else {
      // cursor.json is read on the pool, not on the loop (a slow disk); the units stream starts
      // reading only once it knows where to, so no line is published twice or skipped.
      loading_ = true;
      LoadStateOffLoop(
          context_, lifetime_.Watch(), cursor_path_,
          [path = cursor_path_] { return ReadStateFile(path, kMaxCursorFileBytes); },
          [this](StateFileRead read) {
            if (stopping_) return;
            loading_ = false;
            PositionUnits(CursorFrom(std::move(read)));
            UpdateHealth();
            PublishState();
          });
    }
  }
  PublishState();
  // The health stream waits for its consumer: a request of this instance may already be
  // retained (never: the reader is new) or comes once the consumer sees this state.
  request_sub_ = context_.GetBus().Subscribe<HealthStreamRequest>(
      [this](const HealthStreamRequest& request) { OnHealthRequest(request); });
  if (health_) {
    context_.Log().info("health stream (kernel lines{}): waiting for its consumer's position (reader {})",
                        config_.ack_identifier.empty() ? "" : ", " + config_.ack_identifier + " acknowledgements",
                        state_.reader);
  }
}

void JournaldModule::PositionUnits(const std::optional<SavedPosition>& saved) {
  const std::string mode = units_->Position(saved, "cursor.json");
  if (state_.boot_id.empty()) state_.boot_id = units_->PositionedBoot();
  context_.Log().info("units stream: {} ({})", mode, mode == "cursor" ? "after the saved cursor" : "boot " + state_.boot_id);
  units_->Resume();
}

void JournaldModule::OnHealthRequest(const HealthStreamRequest& request) {
  if (!health_ || stopping_ || request.reader != state_.reader) return;
  if (!request.active) {
    if (generation_ == 0) return;
    context_.Log().info("health stream: {} stopped; pausing at {}", request.consumer,
                        health_->Last().cursor.empty() ? "the start" : "its last entry");
    health_->Pause();
    generation_ = 0;
    state_.health = health_->State();
    PublishState();
    return;
  }
  if (request.generation == 0 || request.generation == generation_) return;
  health_requests_->Inc();
  generation_ = request.generation;
  std::optional<JournalPosition> after;
  if (!request.after.cursor.empty()) after = request.after;
  const std::string mode = health_->Position(after, request.consumer + "'s position");
  context_.Log().info("health stream for {} (generation {}): {}", request.consumer, request.generation,
                      mode == "cursor" ? "after its last handled entry"
                                       : mode + ", boot " + health_->PositionedBoot());
  state_.health = health_->State();
  state_.health.consumer = request.consumer;
  state_.health.generation = generation_;
  health_->Resume();
  PublishState();
}

void JournaldModule::SeenBoot(const std::string& boot_id) {
  if (boot_id == state_.boot_id) return;
  boot_changes_->Inc();
  context_.Log().info("journal moved on to boot {} (was {})", boot_id, state_.boot_id);
  state_.boot_id = boot_id;
  PublishState();
}

void JournaldModule::OnHealthEntry(JournalEntry&& entry) {
  SeenBoot(entry.boot_id);
  if (entry.truncated) {
    truncated_->Inc();
    Bad("enormous_message", "MESSAGE longer than maxMessageBytes (" + std::to_string(config_.max_message_bytes) +
                                ") was cut");
  }
  auto fill = [&](JournalLine& line) {
    line.message = std::move(entry.message);
    line.truncated = entry.truncated;
    line.boot_id = std::move(entry.boot_id);
    line.realtime_usec = entry.realtime_usec;
    line.monotonic_usec = entry.monotonic_usec;
    line.priority = entry.priority;
    line.cursor = std::move(entry.cursor);
    line.generation = generation_;
  };
  if (config_.kernel && entry.transport == "kernel") {
    KernelLine line;
    fill(line);
    kernel_lines_->Inc();
    context_.GetBus().Publish(std::move(line));
    return;
  }
  if (config_.ack_identifier.empty() || entry.identifier != config_.ack_identifier) {
    // Our matches should not let this through; a damaged entry might.
    Bad("unexpected_entry", "an entry matching none of the health stream's sources was skipped");
    return;
  }
  UnitLine line;
  line.unit = std::move(entry.unit);
  line.identifier = std::move(entry.identifier);
  line.acknowledgement = true;
  fill(line);
  ack_lines_->Inc();
  context_.GetBus().Publish(std::move(line));
}

void JournaldModule::OnUnitEntry(JournalEntry&& entry) {
  SeenBoot(entry.boot_id);
  MarkDirty();
  if (!unit_names_.contains(entry.unit)) {
    Bad("unexpected_entry", "an entry matching none of the configured units was skipped");
    return;
  }
  if (entry.truncated) {
    truncated_->Inc();
    Bad("enormous_message", "MESSAGE longer than maxMessageBytes (" + std::to_string(config_.max_message_bytes) +
                                ") was cut");
  }
  UnitLine line;
  line.message = std::move(entry.message);
  line.truncated = entry.truncated;
  line.boot_id = std::move(entry.boot_id);
  line.realtime_usec = entry.realtime_usec;
  line.monotonic_usec = entry.monotonic_usec;
  line.priority = entry.priority;
  line.cursor = std::move(entry.cursor);
  line.unit = std::move(entry.unit);
  line.identifier = std::move(entry.identifier);
  // Acknowledgements are the health stream's, even when their unit is listed here too.
  line.acknowledgement = false;
  unit_lines_->Inc();
  context_.GetBus().Publish(std::move(line));
}

std::optional<SavedPosition> JournaldModule::CursorFrom(StateFileRead read) {
  std::string error;
  switch (read.status) {
    case StateFileRead::Status::kMissing:
      return std::nullopt;
    case StateFileRead::Status::kUnreadable:
      Bad("unreadable_cursor_file", read.error);
      return std::nullopt;
    case StateFileRead::Status::kRejected:
      error = read.error;
      break;
    case StateFileRead::Status::kRead:
      if (auto saved = ParseSavedPosition(read.content, error)) return saved;
      break;
  }
  // Kept for the operator under a name of its own; the next flush writes a good one.
  const auto moved = MoveStateFileAside(
      cursor_path_, std::chrono::duration_cast<std::chrono::seconds>(context_.GetClock().WallNow().time_since_epoch()).count());
  Bad("corrupt_cursor_file", cursor_path_ + ": " + error + "; " +
                                 (moved.ok ? "moved to " + moved.moved_to : "not moved aside: " + moved.error) +
                                 "; reading the current boot from its head");
  return std::nullopt;
}

void JournaldModule::CursorNotPersisted(const std::string& why) {
  if (why == cursor_problem_) return;
  const bool first = cursor_problem_.empty();
  cursor_problem_ = why;
  if (first) context_.Log().error("the units stream's position is not persisted ({}): the streams keep flowing", why);
  // Posted: CursorNotPersisted may be called from Start.
  context_.GetLoop().Post(lifetime_.Guard([this] { UpdateHealth(); }));
}

void JournaldModule::UpdateHealth() {
  if (loading_) return;  // "loading cursor.json" stands until it is back
  if (!cursor_problem_.empty()) {
    context_.SetHealth(ModuleHealth::kDegraded, "units stream position not persisted: " + cursor_problem_);
  } else {
    context_.SetHealth(ModuleHealth::kOk);
  }
}

void JournaldModule::Bad(std::string_view kind, std::string_view what) {
  ++state_.bad_entries;
  context_.Metrics()
      .Counter("gpu_node_supervisor_journald_bad_input_total", "Bad journal input, by kind",
               {{"kind", std::string(kind)}})
      .Inc();
  warn_.Warn(context_.Log(), kind, what);
}

void JournaldModule::MarkDirty() {
  if (cursor_path_.empty()) return;
  dirty_ = true;
  if (flush_armed_ || writing_ || stopping_) return;
  flush_armed_ = true;
  flush_timer_.expires_after(config_.cursor_flush_interval);
  flush_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
    flush_armed_ = false;
    if (ec || stopping_) return;  // cancelled by Stop, which flushes itself
    Flush();
  }));
}

void JournaldModule::Flush() {
  if (!dirty_ || writing_ || cursor_path_.empty() || !units_) {
    if (stopping_ && !writing_) FinishStop();
    return;
  }
  dirty_ = false;
  writing_ = true;
  context_.Pool().Run(
      [path = cursor_path_, content = SerializeSavedPosition(units_->Last())] {
        return WriteFileAtomically(path, content);
      },
      lifetime_.Guard([this](FileWriteResult result, std::exception_ptr error) {
        writing_ = false;
        if (error || !result) {
          cursor_writes_failed_->Inc();
          warn_.Warn(context_.Log(), "cursor_write_failed", error ? "exception" : result.error);
          CursorNotPersisted(error ? "exception writing " + cursor_path_ : result.error);
        } else if (!cursor_problem_.empty()) {
          context_.Log().info("{} written again: the units stream's position is persisted", cursor_path_);
          cursor_problem_.clear();
          UpdateHealth();
        }
        if (stopping_) {
          Flush();  // whatever was read meanwhile, then finish
        } else if (dirty_) {
          MarkDirty();
        }
      }));
}

void JournaldModule::FinishStop() {
  if (!stop_done_) return;
  auto done = std::move(stop_done_);
  stop_done_ = nullptr;
  health_.reset();
  units_.reset();
  done();
}

void JournaldModule::Stop(std::function<void()> done) {
  stopping_ = true;
  stop_done_ = std::move(done);
  request_sub_.Reset();
  flush_timer_.cancel();
  // Releases the fds before FinishStop closes the journals.
  if (health_) health_->Close();
  if (units_) units_->Close();
  Flush();
}

void JournaldModule::PublishState() {
  if (health_) {
    const auto consumer = state_.health.consumer;
    state_.health = health_->State();
    state_.health.consumer = generation_ != 0 ? consumer : std::string();
    state_.health.generation = generation_;
  }
  if (units_) state_.units = units_->State();
  context_.GetBus().Publish(state_);
}

}  // namespace gns::journald
