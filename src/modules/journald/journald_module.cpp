// The journald module: sd-journal on the loop.
#include "modules/journald/journald_module.hpp"

#include "loop/atomic_file.hpp"

#include <nlohmann/json.hpp>
#include <systemd/sd-id128.h>
#include <systemd/sd-journal.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace gns::journald {
namespace {

constexpr int kCursorFileVersion = 1;

std::string BootString(const sd_id128_t& id) {
  char text[SD_ID128_STRING_MAX];
  return sd_id128_to_string(id, text);
}

bool IsBootId(std::string_view text) {
  if (text.size() != 32) return false;
  for (const char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string Errno(int negative_errno) { return std::strerror(-negative_errno); }

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
  config.directory = section.OptionalString("directory").value_or("");
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

void JournaldModule::JournalCloser::operator()(sd_journal* j) const { sd_journal_close(j); }

JournaldModule::JournaldModule(ModuleContext& context, const Config& config)
    : context_(context),
      config_(config),
      flush_timer_(context.GetLoop().Io()),
      warn_(context.GetClock()),
      units_(config.units.begin(), config.units.end()) {
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
                     "Starts whose saved cursor was no longer in the journal (rotated or vacuumed)");
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
  state_.source = config_.directory.empty() ? "system" : config_.directory;
}

JournaldModule::~JournaldModule() {
  *alive_ = false;
  // The fd belongs to sd_journal: the waiter hands it back (releases, never closes it).
  waiter_.reset();
}

void JournaldModule::Open() {
  sd_journal* j = nullptr;
  int r = 0;
  if (config_.directory.empty()) {
    r = sd_journal_open(&j, SD_JOURNAL_LOCAL_ONLY);
  } else {
    r = sd_journal_open_directory(&j, config_.directory.c_str(), 0);
  }
  if (r < 0) {
    throw std::runtime_error("opening the journal (" + state_.source + "): " + Errno(r));
  }
  journal_.reset(j);
  // Decompression of a field stops at this size: an enormous field cannot make us allocate.
  sd_journal_set_data_threshold(j, config_.max_message_bytes + 16);
  // Matches of the same field OR; a disjunction separates the groups.
  bool first_group = true;
  auto group = [&] {
    if (!first_group) {
      if (const int rr = sd_journal_add_disjunction(j); rr < 0) {
        throw std::runtime_error("sd_journal_add_disjunction: " + Errno(rr));
      }
    }
    first_group = false;
  };
  auto match = [&](const std::string& m) {
    if (const int rr = sd_journal_add_match(j, m.data(), m.size()); rr < 0) {
      throw std::runtime_error("sd_journal_add_match(" + m + "): " + Errno(rr));
    }
  };
  if (config_.kernel) {
    group();
    match("_TRANSPORT=kernel");
  }
  if (!config_.units.empty()) {
    group();
    for (const auto& unit : config_.units) match("_SYSTEMD_UNIT=" + unit);
  }
  if (!config_.ack_identifier.empty()) {
    group();
    match("SYSLOG_IDENTIFIER=" + config_.ack_identifier);
  }
  const int fd = sd_journal_get_fd(j);
  if (fd < 0) throw std::runtime_error("sd_journal_get_fd: " + Errno(fd));
  waiter_ = std::make_unique<JournalWaiter>(
      context_.GetLoop().Io(), fd,
      JournalWaiter::Callbacks{
          [this] { return JournalTimeout(); },
          [this](JournalWaiter::Cause cause) { OnWake(cause); },
          [this](const std::string& why) {
            if (!stopping_) context_.ReportFailure(why);
          }});
}

std::string JournaldModule::CurrentBoot() {
  sd_journal* j = journal_.get();
  // The kernel's boot when the journal has entries of it (the host journal, mounted or not,
  // on the same kernel); otherwise the boot of the newest entry (a journal copied from
  // another machine, or the simulator's), and the kernel's boot for an empty journal.
  sd_id128_t kernel_boot{};
  const bool have_kernel_boot = sd_id128_get_boot(&kernel_boot) >= 0;
  if (have_kernel_boot && sd_journal_seek_monotonic_usec(j, kernel_boot, 0) >= 0 && sd_journal_next(j) > 0) {
    uint64_t mono = 0;
    sd_id128_t boot{};
    if (sd_journal_get_monotonic_usec(j, &mono, &boot) >= 0 && sd_id128_equal(boot, kernel_boot)) {
      return BootString(kernel_boot);
    }
  }
  if (sd_journal_seek_tail(j) >= 0 && sd_journal_previous(j) > 0) {
    uint64_t mono = 0;
    sd_id128_t boot{};
    if (sd_journal_get_monotonic_usec(j, &mono, &boot) >= 0) return BootString(boot);
  }
  return have_kernel_boot ? BootString(kernel_boot) : std::string(32, '0');
}

void JournaldModule::SeekBoot(const std::string& boot_id, uint64_t after_monotonic_usec) {
  sd_id128_t boot{};
  if (sd_id128_from_string(boot_id.c_str(), &boot) < 0 ||
      sd_journal_seek_monotonic_usec(journal_.get(), boot, after_monotonic_usec) < 0) {
    sd_journal_seek_head(journal_.get());
  }
}

void JournaldModule::Position() {
  sd_journal* j = journal_.get();
  const std::string boot = CurrentBoot();
  state_.boot_id = boot;

  std::optional<SavedPosition> saved;
  if (!cursor_path_.empty()) {
    std::string text;
    std::string error;
    if (ReadWholeFile(cursor_path_, text, error)) {
      saved = ParseSavedPosition(text, error);
      if (!saved) Bad("corrupt_cursor_file", cursor_path_ + ": " + error + "; reading the current boot from its head");
    } else if (std::filesystem::exists(cursor_path_)) {
      Bad("unreadable_cursor_file", error);
    }
  }

  const uint64_t now_usec = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(context_.GetClock().WallNow().time_since_epoch()).count());
  const uint64_t lookback = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(config_.boot_lookback).count());
  if (saved && saved->boot_id == boot) {
    last_ = *saved;
    if (sd_journal_seek_cursor(j, saved->cursor.c_str()) >= 0 && sd_journal_next(j) > 0 &&
        sd_journal_test_cursor(j, saved->cursor.c_str()) > 0) {
      // Standing on the last entry read: the next sd_journal_next() is the first new one.
      state_.start_mode = "cursor";
      context_.Log().info("resuming after the saved cursor (boot {})", boot);
      return;
    }
    // Rotated or vacuumed away. Within one boot the monotonic clock orders entries, so
    // everything at or before the saved time was read: resume after it.
    gaps_->Inc();
    ++state_.gaps;
    state_.start_mode = "gap";
    context_.Log().warn("the saved cursor is no longer in the journal (rotated or vacuumed): entries between it and "
                        "the oldest one kept may be lost; resuming boot {} after monotonic {} us",
                        boot, saved->monotonic_usec);
    SeekBoot(boot, saved->monotonic_usec + 1);
    return;
  }
  state_.start_mode = saved ? "new-boot" : "boot-head";
  if (saved) boot_changes_->Inc();
  skip_before_realtime_ = now_usec > lookback ? now_usec - lookback : 0;
  context_.Log().info("reading boot {} from its head ({}), entries newer than {}s", boot,
                      saved ? "new boot since the saved cursor" : "no saved cursor",
                      std::chrono::duration_cast<std::chrono::seconds>(config_.boot_lookback).count());
  SeekBoot(boot, 0);
}

void JournaldModule::Start() {
  if (!cursor_path_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(cursor_path_).parent_path(), ec);
    if (ec) throw std::runtime_error("creating " + cursor_path_ + "'s directory: " + ec.message());
  }
  Open();
  Position();
  PublishState();
  ReadSome();
}

void JournaldModule::ReadSome() {
  read_posted_ = false;
  if (stopping_ || !journal_) return;
  sd_journal* j = journal_.get();
  for (std::size_t n = 0; n < config_.batch; ++n) {
    const int r = sd_journal_next(j);
    if (r < 0) {
      // A corrupt region sd-journal could not step over: wait for the journal to change
      // rather than spin on the same error.
      Bad("journal_next_failed", Errno(r));
      Arm();  // not the re-post below: a region that fails every time would spin through the queue
      return;
    }
    if (r == 0) {
      skip_before_realtime_ = 0;  // caught up: the lookback only filters the catch-up
      Arm();
      const bool timeout_wait = waiter_ && waiter_->TimerDelay().has_value();
      // Published at the end of each woken round too, so that /debug/state shows the wake
      // counts (and entries, cursor) as of the last round, not as of the last transition.
      if (!state_.live || state_.timeout_wait != timeout_wait || woken_) {
        if (timeout_wait && !state_.timeout_wait) {
          context_.Log().info("sd-journal asks to be woken by a timeout too (its files are where inotify does not "
                              "reach): following the journal by polling");
        }
        state_.live = true;
        state_.timeout_wait = timeout_wait;
        woken_ = false;
        PublishState();
      }
      return;
    }
    HandleEntry();
  }
  if (state_.live) {
    state_.live = false;
    PublishState();
  }
  // More to read: let other work run first.
  read_posted_ = true;
  context_.GetLoop().Post([this, alive = alive_] {
    if (*alive) ReadSome();
  });
}

void JournaldModule::Arm() {
  // Asks sd-journal for its timeout again: after each processing round.
  if (stopping_ || !waiter_) return;
  waiter_->Arm();
}

uint64_t JournaldModule::JournalTimeout() {
  uint64_t timeout = JournalWaiter::kNoTimeout;
  if (const int r = sd_journal_get_timeout(journal_.get(), &timeout); r < 0) {
    Bad("journal_get_timeout_failed", Errno(r));
    return JournalWaiter::kNoTimeout;  // the fd alone, as before
  }
  return timeout;
}

void JournaldModule::OnWake(JournalWaiter::Cause cause) {
  if (cause == JournalWaiter::Cause::kFd) {
    fd_wakeups_->Inc();
    ++state_.fd_wakeups;
  } else {
    timeout_wakeups_->Inc();
    ++state_.timeout_wakeups;
  }
  woken_ = true;
  if (stopping_ || !journal_) return;
  // Consumes the inotify events; files added or removed are picked up here. After a timeout
  // it is what makes sd-journal look at files inotify cannot watch.
  const int r = sd_journal_process(journal_.get());
  if (r < 0) Bad("journal_process_failed", Errno(r));
  if (!read_posted_) ReadSome();
}

std::optional<std::string> JournaldModule::Field(std::string_view name, std::size_t max, bool* truncated) {
  const void* data = nullptr;
  size_t length = 0;
  const std::string key(name);
  const int r = sd_journal_get_data(journal_.get(), key.c_str(), &data, &length);
  if (r < 0) return std::nullopt;
  const auto* bytes = static_cast<const char*>(data);
  // "NAME=value"; anything else is a damaged entry.
  if (length < key.size() + 1 || std::memcmp(bytes, key.data(), key.size()) != 0 || bytes[key.size()] != '=') {
    Bad("malformed_field", key + " does not start with its name");
    return std::nullopt;
  }
  std::size_t value_length = length - key.size() - 1;
  if (value_length > max) {
    value_length = max;
    if (truncated) *truncated = true;
  }
  return std::string(bytes + key.size() + 1, value_length);
}

void JournaldModule::HandleEntry() {
  sd_journal* j = journal_.get();
  uint64_t realtime = 0;
  uint64_t monotonic = 0;
  sd_id128_t boot{};
  if (sd_journal_get_realtime_usec(j, &realtime) < 0 || sd_journal_get_monotonic_usec(j, &monotonic, &boot) < 0) {
    Bad("entry_without_timestamps", "an entry without realtime/monotonic timestamps was skipped");
    return;
  }
  char* cursor_raw = nullptr;
  if (const int r = sd_journal_get_cursor(j, &cursor_raw); r < 0 || cursor_raw == nullptr) {
    Bad("entry_without_cursor", Errno(r < 0 ? r : -EINVAL));
    return;
  }
  std::string cursor(cursor_raw);
  std::free(cursor_raw);

  const std::string boot_id = BootString(boot);
  last_ = SavedPosition{boot_id, cursor, monotonic, realtime};
  ++state_.entries;
  state_.cursor = cursor;
  MarkDirty();
  if (boot_id != state_.boot_id) {
    boot_changes_->Inc();
    context_.Log().info("journal moved on to boot {} (was {})", boot_id, state_.boot_id);
    state_.boot_id = boot_id;
    PublishState();
  }
  if (skip_before_realtime_ != 0 && realtime < skip_before_realtime_) {
    skipped_old_->Inc();
    return;
  }

  bool truncated = false;
  auto message = Field("MESSAGE", config_.max_message_bytes, &truncated);
  if (!message) {
    Bad("entry_without_message", "an entry without MESSAGE was skipped");
    return;
  }
  if (truncated) {
    truncated_->Inc();
    Bad("enormous_message", "MESSAGE longer than maxMessageBytes (" + std::to_string(config_.max_message_bytes) +
                                ") was cut");
  }
  int priority = -1;
  if (const auto p = Field("PRIORITY", 8, nullptr); p && p->size() == 1 && (*p)[0] >= '0' && (*p)[0] <= '7') {
    priority = (*p)[0] - '0';
  }
  const auto transport = Field("_TRANSPORT", 64, nullptr);
  auto fill = [&](JournalLine& line) {
    line.message = std::move(*message);
    line.truncated = truncated;
    line.boot_id = boot_id;
    line.realtime_usec = realtime;
    line.monotonic_usec = monotonic;
    line.priority = priority;
    line.cursor = cursor;
  };
  if (config_.kernel && transport && *transport == "kernel") {
    KernelLine line;
    fill(line);
    kernel_lines_->Inc();
    context_.GetBus().Publish(std::move(line));
    return;
  }
  UnitLine line;
  line.unit = Field("_SYSTEMD_UNIT", 256, nullptr).value_or("");
  line.identifier = Field("SYSLOG_IDENTIFIER", 256, nullptr).value_or("");
  line.acknowledgement = !config_.ack_identifier.empty() && line.identifier == config_.ack_identifier;
  if (!line.acknowledgement && !units_.contains(line.unit)) {
    // Our matches should not let this through; a damaged entry might.
    Bad("unexpected_entry", "an entry matching none of the configured sources was skipped");
    return;
  }
  fill(line);
  (line.acknowledgement ? ack_lines_ : unit_lines_)->Inc();
  context_.GetBus().Publish(std::move(line));
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
  flush_timer_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
    if (!*alive) return;
    flush_armed_ = false;
    if (ec || stopping_) return;  // cancelled by Stop, which flushes itself
    Flush();
  });
}

void JournaldModule::Flush() {
  if (!dirty_ || writing_ || cursor_path_.empty()) {
    if (stopping_ && !writing_) FinishStop();
    return;
  }
  dirty_ = false;
  writing_ = true;
  context_.Pool().Run(
      [path = cursor_path_, content = SerializeSavedPosition(last_)] { return WriteFileAtomically(path, content); },
      [this, alive = alive_](FileWriteResult result, std::exception_ptr error) {
        if (!*alive) return;
        writing_ = false;
        if (error || !result) {
          cursor_writes_failed_->Inc();
          warn_.Warn(context_.Log(), "cursor_write_failed", error ? "exception" : result.error);
        }
        if (stopping_) {
          Flush();  // whatever was read meanwhile, then finish
        } else if (dirty_) {
          MarkDirty();
        }
      });
}

void JournaldModule::FinishStop() {
  if (!stop_done_) return;
  auto done = std::move(stop_done_);
  stop_done_ = nullptr;
  journal_.reset();
  done();
}

void JournaldModule::Stop(std::function<void()> done) {
  stopping_ = true;
  stop_done_ = std::move(done);
  flush_timer_.cancel();
  if (waiter_) waiter_->Close();  // releases the fd before FinishStop closes the journal
  Flush();
}

void JournaldModule::PublishState() { context_.GetBus().Publish(state_); }

}  // namespace gns::journald
