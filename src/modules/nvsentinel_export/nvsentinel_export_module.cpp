// The nvsentinel-export module: see nvsentinel_export_module.hpp.
#include "modules/nvsentinel_export/nvsentinel_export_module.hpp"

#include "loop/atomic_file.hpp"
#include "loop/state_file.hpp"
#include "modules/nvsentinel_export/connector_client.hpp"
#include "modules/nvsentinel_export/event_mapping.hpp"
#include "modules/nvsentinel_export/event_store.hpp"

#include <algorithm>
#include <utility>

namespace gns::nvsentinel_export {

namespace {

constexpr const char* kSources[] = {"xid", "checks", "imex", "resets", "verdicts"};
constexpr const char* kBookFile = "export-book.json";

struct LoadResult {
  std::vector<StoredEvent> events;
  std::optional<ExportBook> book;
  std::vector<std::string> problems;
};

struct WriteJob {
  std::vector<StoredEvent> events;
  std::vector<uint64_t> removals;
  std::optional<std::string> book;
};

}  // namespace

NvsentinelExportModule::Config NvsentinelExportModule::ParseConfig(ConfigMap& section, const SiteConfig&) {
  using std::chrono::milliseconds;
  Config config;
  config.socket = section.String("socket", config.socket);
  if (SocketPathOf(config.socket).empty() || SocketPathOf(config.socket).front() != '/') {
    section.Fail("socket", "must be unix:///<absolute path> or an absolute path");
  }
  config.processing_strategy =
      section.Enum("processingStrategy", {"EXECUTE_REMEDIATION", "STORE_ONLY"}, config.processing_strategy);
  config.max_queued = section.Int("maxQueuedEvents", 1, 1000000, config.max_queued);
  config.max_batch = section.Int("maxBatch", 1, 1000, config.max_batch);
  config.call_deadline = section.Duration("callDeadline", milliseconds(100), milliseconds(300000), config.call_deadline);
  config.replay_window =
      section.Duration("replayWindow", milliseconds(0), milliseconds(24LL * 3600 * 1000), config.replay_window);
  auto retry = section.Section("retry");
  config.retry.initial = retry.Duration("initial", milliseconds(10), milliseconds(60000), config.retry.initial);
  config.retry.max = retry.Duration("max", config.retry.initial, milliseconds(3600000), config.retry.max);
  retry.Finish();
  const std::vector<std::string> defaults(config.sources.begin(), config.sources.end());
  const auto sources = section.StringList("sources", defaults);
  config.sources.clear();
  for (const auto& source : sources) {
    if (std::find(std::begin(kSources), std::end(kSources), source) == std::end(kSources)) {
      section.Fail("sources", "unknown source \"" + source + "\" (xid, checks, imex, resets, verdicts)");
    }
    config.sources.insert(source);
  }
  return config;
}

NvsentinelExportModule::NvsentinelExportModule(ModuleContext& context, const Config& config)
    : context_(context),
      config_(config),
      dir_(context.Site().paths.state_dir + "/nvsentinel-export"),
      store_(std::make_unique<EventStore>(dir_ + "/queue")),
      book_(std::make_unique<ExportBook>()),
      backoff_(config.retry),
      retry_timer_(context.GetLoop().Io()),
      write_retry_timer_(context.GetLoop().Io()) {
  auto& m = context.Metrics();
  queued_ = &m.Gauge("gpu_node_supervisor_nvsentinel_export_queued", "Health events queued on disk, not yet delivered");
  delivered_total_ = &m.Counter("gpu_node_supervisor_nvsentinel_export_delivered_total",
                                "Health events the platform connector took");
  failed_calls_total_ = &m.Counter("gpu_node_supervisor_nvsentinel_export_failed_calls_total",
                                   "HealthEventOccurredV1 calls that failed (connector down, refusing, deadline)");
  queued_total_ = &m.Counter("gpu_node_supervisor_nvsentinel_export_queued_total",
                             "Health events written to the on-disk queue (taken)");
  dropped_total_ = &m.Counter("gpu_node_supervisor_nvsentinel_export_dropped_total",
                              "Health events dropped, oldest first, because the queue was full");
  damaged_total_ = &m.Counter("gpu_node_supervisor_nvsentinel_export_damaged_total",
                              "Damaged queue files moved aside (or events that did not parse)");
  replayed_total_ = &m.Counter("gpu_node_supervisor_nvsentinel_export_replayed_total",
                               "gpu-health events found at start in its event log that a kill -9 had kept from the queue");
  last_success_ = &m.Gauge("gpu_node_supervisor_nvsentinel_export_last_success_timestamp_seconds",
                           "Unix time of the last call the platform connector answered OK");
  state_.target = config_.socket;
}

NvsentinelExportModule::~NvsentinelExportModule() { lifetime_.Close(); }

int64_t NvsentinelExportModule::NowMs() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(context_.GetClock().WallNow().time_since_epoch()).count();
}

void NvsentinelExportModule::Start() {
  if (context_.Site().paths.state_dir.empty()) throw std::runtime_error("nvsentinel-export needs a state directory");
  if (context_.Site().node_name.empty()) throw std::runtime_error("nvsentinel-export needs the node name (site nodeName)");
  client_ = std::make_unique<ConnectorClient>(context_.GetLoop(), config_.socket);
  auto& bus = context_.GetBus();
  // The verdicts gpu-health holds once it serves (its first state: after it restored its
  // checkpoint, which it reads on the pool, so usually after we start): those changed since our
  // last run, or whose event a kill -9 took before it reached the queue, are diffed against the
  // book, once. Until then the book's verdicts are left as they are.
  // One source for the verdicts (the diff at start and the book): gpu-health's state, which it
  // publishes with every verdict change.
  state_sub_ = bus.Subscribe<gpu_health::GpuHealthState>([this](const gpu_health::GpuHealthState& s) {
    verdicts_ = s.devices;
    for (const auto& d : s.devices) {
      if (!d.pci.empty()) pci_of_[d.uuid] = d.pci;
    }
    for (const auto& [pci, uuid] : s.pci_to_uuid) pci_of_.try_emplace(uuid, pci);
    if (!start_verdicts_) {
      start_verdicts_ = s.devices;
      if (loaded_) DiffStartVerdicts();
    } else if (verdicts_diffed_) {
      book_dirty_ = true;
      ScheduleFlush();
    }
  });
  if (Exports("xid")) {
    events_sub_ = bus.Subscribe<gpu_health::HealthEvent>([this](const gpu_health::HealthEvent& e) {
      ExportSettings settings{context_.Site().node_name,
                              config_.processing_strategy == "STORE_ONLY" ? datamodels::STORE_ONLY
                                                                          : datamodels::EXECUTE_REMEDIATION};
      auto event = FromGpuHealthEvent(e, settings);
      const std::string id = event.id();
      Enqueue(std::vector<datamodels::HealthEvent>{std::move(event)});
      NoteTaken(id);
    });
    // Published by gpu-health after the events it carries went out on the event topic (above):
    // it gives us only what we missed, at our start or after a kill -9.
    log_sub_ = bus.Subscribe<gpu_health::HealthEventLog>([this](const gpu_health::HealthEventLog& log) {
      event_log_ = log;
      if (loaded_) ReplayEventLog();
    });
  }
  if (Exports("checks")) {
    checks_sub_ = bus.Subscribe<gpu_health::GpuHealthChecks>([this](const gpu_health::GpuHealthChecks& c) {
      checks_ = c;
      if (loaded_) Reconcile();
    });
  }
  if (Exports("imex")) {
    imex_sub_ = bus.Subscribe<imex_health::ImexHealth>([this](const imex_health::ImexHealth& i) {
      imex_ = i;
      if (loaded_) Reconcile();
    });
  }
  if (Exports("resets")) {
    resets_sub_ = bus.Subscribe<gpu_reset::GpuResetState>([this](const gpu_reset::GpuResetState& s) {
      resets_ = s;
      if (loaded_) Reconcile();
    });
  }
  UpdateState();
  // The queue and the book are read on the pool; until then events wait in memory (pending_).
  auto load = [store = *store_, book_path = dir_ + "/" + kBookFile, now_s = NowMs() / 1000]() {
    LoadResult result;
    EventStore::Loaded loaded = store.Load(now_s);
    if (!loaded.error.empty()) throw std::runtime_error(loaded.error);
    result.events = std::move(loaded.events);
    result.problems = std::move(loaded.damaged);
    const StateFileRead read = ReadStateFile(book_path);
    if (read.status == StateFileRead::Status::kRead) {
      try {
        result.book = BookFromJson(nlohmann::json::parse(read.content));
      } catch (const std::exception& e) {
        const MoveAsideResult moved = MoveStateFileAside(book_path, now_s);
        result.problems.push_back(book_path + ": " + e.what() +
                                  (moved.ok ? "; moved to " + moved.moved_to : "; could not move it: " + moved.error));
      }
    } else if (read.status == StateFileRead::Status::kRejected) {
      const MoveAsideResult moved = MoveStateFileAside(book_path, now_s);
      result.problems.push_back(read.error + (moved.ok ? "; moved to " + moved.moved_to : ""));
    } else if (read.status == StateFileRead::Status::kUnreadable) {
      throw std::runtime_error(read.error);
    } else {
      // A fresh node: nothing was ever taken, so what gpu-health's log holds inside
      // replayWindow is news (it may be what a kill -9 kept from our very first queue write).
      result.book = ExportBook{};
      result.book->taken_events.emplace();
    }
    return result;
  };
  context_.Pool().Run(std::move(load), lifetime_.Guard([this](LoadResult result, std::exception_ptr failure) {
    if (failure) {
      std::string why = "reading the queue failed";
      try {
        std::rethrow_exception(failure);
      } catch (const std::exception& e) {
        why = std::string("reading the queue: ") + e.what();
      }
      if (stop_done_) {
        std::exchange(stop_done_, nullptr)();
        return;
      }
      context_.ReportFailure(why);
      return;
    }
    Loaded(std::move(result.events), std::move(result.book), std::move(result.problems));
  }));
}

void NvsentinelExportModule::Loaded(std::vector<StoredEvent> events, std::optional<ExportBook> book,
                                    std::vector<std::string> problems) {
  for (const auto& problem : problems) {
    damaged_total_->Inc();
    context_.Log().error("damaged queue state: {}", problem);
  }
  if (!problems.empty()) context_.SetHealth(ModuleHealth::kDegraded, "damaged queue state moved aside: " + problems.front());
  // A damaged book reads as a fresh one: what is unhealthy now, and the log's events inside
  // replayWindow, are exported again (ids are stable: a receiver that has them dedupes).
  *book_ = book ? std::move(*book) : ExportBook{};
  if (!book) {
    book_->taken_events.emplace();
    book_dirty_ = true;
  }
  // Only a book written before taken ids were recorded makes the first log history: that
  // build delivered those events already.
  replay_allowed_ = book_->taken_events.has_value();
  if (book_->taken_events) taken_.insert(book_->taken_events->begin(), book_->taken_events->end());
  for (auto& event : events) {
    next_seq_ = std::max(next_seq_, event.seq + 1);
    // Two files of one id (a re-diff written before its book, then again): keep the first.
    if (!queued_ids_.insert(event.id).second) {
      to_remove_.push_back(event.seq);
      continue;
    }
    queue_.push_back(std::move(event));
  }
  loaded_ = true;
  for (const auto& id : std::exchange(taken_early_, {})) NoteTaken(id);
  if (!queue_.empty()) context_.Log().info("{} health events queued from an earlier run", queue_.size());
  // Events taken while the queue was read get their places now, after the older ones.
  for (auto& event : pending_) event.seq = next_seq_++;
  if (event_log_) ReplayEventLog();
  if (start_verdicts_) DiffStartVerdicts();
  Reconcile();
  ScheduleFlush();
  Deliver();
}

void NvsentinelExportModule::NoteTaken(const std::string& id) {
  if (!loaded_) {
    taken_early_.push_back(id);
    return;
  }
  if (!taken_.insert(id).second) return;
  auto& ids = book_->taken_events ? *book_->taken_events : book_->taken_events.emplace();
  ids.push_back(id);
  while (ids.size() > ExportBook::kMaxTakenEvents) {
    taken_.erase(ids.front());
    ids.erase(ids.begin());
  }
  // Written with (after) the event files of this turn: a crash before it finds the event again
  // in gpu-health's log, and its id already queued.
  book_dirty_ = true;
  ScheduleFlush();
}

void NvsentinelExportModule::ReplayEventLog() {
  ExportSettings settings{context_.Site().node_name, config_.processing_strategy == "STORE_ONLY"
                                                         ? datamodels::STORE_ONLY
                                                         : datamodels::EXECUTE_REMEDIATION};
  const int64_t now = NowMs();
  std::vector<datamodels::HealthEvent> missed;
  std::size_t history = 0;
  std::size_t too_old = 0;
  for (const auto& e : event_log_->events) {
    auto event = FromGpuHealthEvent(e, settings);
    const std::string id = event.id();
    if (Taken(id)) continue;
    NoteTaken(id);
    if (!replay_allowed_) {
      ++history;
    } else if (queued_ids_.count(id) != 0) {
      continue;  // on disk already (its book write was what the crash took)
    } else if (now - e.generated_seconds * 1000 > config_.replay_window.count()) {
      ++too_old;
    } else {
      missed.push_back(std::move(event));
    }
  }
  if (history > 0) {
    context_.Log().info("{} earlier gpu-health events recorded as taken, not sent (no record of what was taken before)",
                        history);
  }
  if (too_old > 0) {
    context_.Log().warn("{} gpu-health events we never took are older than replayWindow ({} s): not sent", too_old,
                        config_.replay_window.count() / 1000);
  }
  replay_allowed_ = true;  // from the next log on, what we did not take is news
  if (missed.empty()) return;
  context_.Log().warn("{} gpu-health events a stop or kill -9 kept from the queue: queued now", missed.size());
  replayed_total_->Inc(static_cast<double>(missed.size()));
  Enqueue(std::move(missed));
}

void NvsentinelExportModule::DiffStartVerdicts() {
  if (verdicts_diffed_) return;
  verdicts_diffed_ = true;
  ExportSettings settings{context_.Site().node_name, config_.processing_strategy == "STORE_ONLY"
                                                         ? datamodels::STORE_ONLY
                                                         : datamodels::EXECUTE_REMEDIATION};
  if (Exports("verdicts")) {
    Enqueue(DiffVerdicts(*book_, *start_verdicts_, settings, NowMs()));
  } else {
    RecordVerdicts(*book_, *start_verdicts_);
  }
  book_dirty_ = true;
  ScheduleFlush();
}

void NvsentinelExportModule::Reconcile() {
  ExportSettings settings{context_.Site().node_name, config_.processing_strategy == "STORE_ONLY"
                                                         ? datamodels::STORE_ONLY
                                                         : datamodels::EXECUTE_REMEDIATION};
  const ExportBook before = *book_;
  const int64_t now = NowMs();
  if (checks_) Enqueue(DiffConditions(*book_, *checks_, pci_of_, settings, now));
  if (imex_) Enqueue(DiffImex(*book_, *imex_, settings, now));
  if (resets_) Enqueue(DiffResets(*book_, *resets_, pci_of_, settings, now));
  if (!(*book_ == before)) {
    book_dirty_ = true;
    ScheduleFlush();
  }
}

template <typename Event>
void NvsentinelExportModule::Enqueue(std::vector<Event> events) {
  for (auto& event : events) {
    if (queued_ids_.count(event.id()) != 0) continue;  // already queued (a re-diff)
    StoredEvent stored;
    stored.id = event.id();
    event.SerializeToString(&stored.payload);
    if (loaded_) stored.seq = next_seq_++;
    // Full: the oldest goes (a call in flight may still deliver it).
    while (queue_.size() + pending_.size() >= static_cast<std::size_t>(config_.max_queued)) {
      if (!queue_.empty()) {
        queued_ids_.erase(queue_.front().id);
        to_remove_.push_back(queue_.front().seq);
        queue_.pop_front();
      } else {
        queued_ids_.erase(pending_.front().id);
        // Its file may be under way in a write job: removed after it.
        if (pending_.front().seq != 0) to_remove_.push_back(pending_.front().seq);
        pending_.erase(pending_.begin());
      }
      dropped_total_->Inc();
      ++state_.dropped;
      context_.Log().warn("queue full ({} events): dropped the oldest", config_.max_queued);
    }
    queued_ids_.insert(stored.id);
    pending_.push_back(std::move(stored));
  }
  if (!events.empty()) ScheduleFlush();
  UpdateState();
}

void NvsentinelExportModule::ScheduleFlush() {
  // Facts published together (a verdict and its event) go to disk in one job.
  if (flush_posted_) return;
  flush_posted_ = true;
  context_.GetLoop().Post(lifetime_.Guard([this] {
    flush_posted_ = false;
    Flush();
  }));
}

void NvsentinelExportModule::Flush() {
  if (!loaded_ || write_in_flight_) return;
  if (pending_.empty() && to_remove_.empty() && !book_dirty_) {
    // Stopping: all written, and no call in flight whose answer would remove files.
    if (stopping_ && stop_done_ && !call_in_flight_) {
      client_.reset();
      std::exchange(stop_done_, nullptr)();
    }
    return;
  }
  WriteJob job;
  job.events = pending_;  // kept in pending_ until written: a failed write is retried
  job.removals = std::move(to_remove_);
  to_remove_.clear();
  if (book_dirty_) {
    // The verdicts as they stand, once the start diff is done (the events of their changes were
    // taken with them: a verdict and its event are published in one turn, this runs later).
    if (verdicts_diffed_) RecordVerdicts(*book_, verdicts_);
    job.book = BookToJson(*book_).dump();
    book_dirty_ = false;
  }
  write_in_flight_ = true;
  std::set<uint64_t> written;
  for (const auto& event : job.events) written.insert(event.seq);
  auto write = [store = *store_, book_path = dir_ + "/" + kBookFile, job]() -> std::string {
    // Events first, then the book: a crash between leaves events whose facts the book does not
    // have yet; the next start's diff makes the same events again (same ids) and they are
    // queued once. The other order could lose them.
    if (auto r = store.Append(job.events); !r) return r.error;
    if (job.book) {
      if (auto r = WriteFileAtomically(book_path, *job.book); !r) return r.error;
    }
    if (auto r = store.Remove(job.removals); !r) return r.error;
    return {};
  };
  context_.Pool().Run(std::move(write), lifetime_.Guard([this, written = std::move(written), removals = job.removals,
                                                         had_book = job.book.has_value()](
                                                            std::string error, std::exception_ptr failure) {
    write_in_flight_ = false;
    if (failure) error = "write failed with an exception";
    if (!error.empty()) {
      // Kept in memory and retried: pending_ still holds the events, the removals go back.
      context_.Log().error("writing the queue failed: {}", error);
      context_.SetHealth(ModuleHealth::kDegraded, "queue not written: " + error);
      state_.last_error = error;
      to_remove_.insert(to_remove_.end(), removals.begin(), removals.end());
      if (had_book) book_dirty_ = true;
      // Its own timer: the delivery's retry may be waiting on retry_timer_.
      write_retry_timer_.expires_after(config_.retry.max);
      write_retry_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
        if (!ec) Flush();
      }));
      UpdateState();
      return;
    }
    // On disk now, in order (those dropped meanwhile, full, are not in pending_ any more).
    std::vector<StoredEvent> still_pending;
    for (auto& event : pending_) {
      if (written.count(event.seq) != 0) {
        queue_.push_back(std::move(event));
        queued_total_->Inc();
      } else {
        still_pending.push_back(std::move(event));
      }
    }
    pending_ = std::move(still_pending);
    UpdateState();
    Deliver();
    Flush();  // what came meanwhile (or the Stop that waits)
  }));
}

void NvsentinelExportModule::Deliver() {
  if (!loaded_ || stopping_ || call_in_flight_ || waiting_retry_ || queue_.empty() || !client_) return;
  datamodels::HealthEvents batch;
  batch.set_version(1);
  std::vector<uint64_t> seqs;
  for (const auto& stored : queue_) {
    if (seqs.size() >= static_cast<std::size_t>(config_.max_batch)) break;
    datamodels::HealthEvent event;
    if (!event.ParseFromString(stored.payload)) {
      // Its checksum held but it is no HealthEvent (written by another build?): not sendable.
      damaged_total_->Inc();
      context_.Log().error("queued event {} (seq {}) is not a HealthEvent: dropped", stored.id, stored.seq);
      seqs.push_back(stored.seq);
      continue;
    }
    *batch.add_events() = std::move(event);
    seqs.push_back(stored.seq);
  }
  call_in_flight_ = true;
  const bool started = client_->Send(batch, config_.call_deadline,
                                     lifetime_.Guard([this, seqs](bool ok, std::string error) {
                                       Delivered(seqs, ok, error);
                                     }));
  if (!started) call_in_flight_ = false;
}

void NvsentinelExportModule::Delivered(std::vector<uint64_t> seqs, bool ok, const std::string& error) {
  call_in_flight_ = false;
  if (!ok && stopping_) {
    Flush();  // no retry: the events stay queued for the next start
    return;
  }
  if (!ok) {
    failed_calls_total_->Inc();
    ++state_.failed_calls;
    const auto delay = backoff_.Next();
    if (state_.last_error != error) {
      context_.Log().warn("sending {} health events to {} failed: {}; retrying in {} ms", seqs.size(), config_.socket,
                          error, delay.count());
    }
    state_.last_error = error;
    context_.SetHealth(ModuleHealth::kDegraded, "platform connector: " + error);
    waiting_retry_ = true;
    retry_timer_.expires_after(delay);
    retry_timer_.async_wait(lifetime_.Guard([this](const boost::system::error_code& ec) {
      if (ec) return;
      waiting_retry_ = false;
      Deliver();
    }));
    UpdateState();
    return;
  }
  backoff_.Reset();
  std::size_t delivered = 0;
  for (const uint64_t seq : seqs) {
    // The queue may have dropped some of them meanwhile (full): those are removed already.
    auto it = std::find_if(queue_.begin(), queue_.end(), [seq](const StoredEvent& e) { return e.seq == seq; });
    if (it == queue_.end()) continue;
    queued_ids_.erase(it->id);
    queue_.erase(it);
    to_remove_.push_back(seq);
    ++delivered;
  }
  delivered_total_->Inc(static_cast<double>(delivered));
  state_.delivered += delivered;
  state_.last_success_unix_ms = NowMs();
  last_success_->Set(static_cast<double>(state_.last_success_unix_ms) / 1000.0);
  if (!state_.last_error.empty()) context_.Log().info("platform connector at {} takes events again", config_.socket);
  state_.last_error.clear();
  context_.SetHealth(ModuleHealth::kOk);
  UpdateState();
  if (stopping_) {
    Flush();  // the files of what was delivered, then done
    return;
  }
  ScheduleFlush();  // the files of what was delivered
  Deliver();
}

void NvsentinelExportModule::UpdateState() {
  // On disk only: an event being written is not queued yet (a test that kills the process
  // once everything is queued relies on that).
  queued_->Set(static_cast<double>(queue_.size()));
  state_.queued = queue_.size();
  state_.writing = pending_.size();
  context_.GetBus().Publish(state_);
}

void NvsentinelExportModule::Stop(std::function<void()> done) {
  stopping_ = true;
  retry_timer_.cancel();
  events_sub_.Reset();
  state_sub_.Reset();
  checks_sub_.Reset();
  imex_sub_.Reset();
  resets_sub_.Reset();
  log_sub_.Reset();
  // A call in flight is waited for (its deadline bounds it): cancelling it after the
  // connector took the events would send them again at the next start.
  // What was taken but not written yet is written before we go; a write in flight (or the
  // read of the queue) is waited for: a next instance must not read the directory while we
  // still write into it.
  // Before the queue is read, the events taken so far wait for it (Loaded flushes them).
  stop_done_ = std::move(done);
  if (loaded_) Flush();
}

}  // namespace gns::nvsentinel_export
