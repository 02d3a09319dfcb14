// The NVML event waiter child process: its own side (RunEventWaiter) and ours (EventWaiterProcess).
#include "modules/gpu_inventory/event_waiter.hpp"

#include "modules/gpu_inventory/nvml_library.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string_view>

namespace gns::gpu_inventory {

namespace {

// The first wait only proves that the event set works before the inventory is announced (a
// set that fails at once must not make the inventory flap to available). 1 ms, not 0: NVML does
// not document what a zero timeout means.
constexpr unsigned int kProbeTimeoutMs = 1;
constexpr std::string_view kSubcommand = "nvml-events";
// The health events and their names in `health` lines (HealthEventKindName).
constexpr std::array<std::pair<unsigned long long, std::string_view>, 3> kHealthEventNames{{
    {nvml::kEventTypeSingleBitEccError, "singleBitEcc"},
    {nvml::kEventTypeDoubleBitEccError, "doubleBitEcc"},
    {nvml::kEventTypeClock, "clock"},
}};

// One whole line to stdout; a parent that is gone (EPIPE) ends us.
void Emit(std::string line) {
  line += '\n';
  std::string_view rest = line;
  while (!rest.empty()) {
    const ssize_t n = ::write(STDOUT_FILENO, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(0);
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
}

std::string UuidField(const std::string& uuid) { return uuid.empty() ? "-" : uuid; }

int EmitError(const std::string& function, const std::string& message) {
  Emit("error " + (function.empty() ? std::string("-") : function) + " " + message);
  return 1;
}

template <typename T>
bool ParseNumber(std::string_view text, T& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

std::string OptionalField(const std::optional<uint32_t>& value) { return value ? std::to_string(*value) : "-"; }

// "-" is unknown; false for anything else that is not a number.
bool ParseOptional(std::string_view text, std::optional<uint32_t>& out) {
  if (text == "-") {
    out.reset();
    return true;
  }
  uint32_t value = 0;
  if (!ParseNumber(text, value)) return false;
  out = value;
  return true;
}

std::vector<std::string_view> Fields(std::string_view line, std::size_t max) {
  std::vector<std::string_view> out;
  while (!line.empty() && out.size() + 1 < max) {
    const auto space = line.find(' ');
    if (space == std::string_view::npos) break;
    out.push_back(line.substr(0, space));
    line.remove_prefix(space + 1);
  }
  out.push_back(line);
  return out;
}

}  // namespace

std::vector<std::string> GpusWithNewEventBasis(const std::map<std::string, GpuEventBasis>& registered,
                                               const std::map<std::string, GpuEventBasis>& read) {
  const auto differ = [](const auto& a, const auto& b) { return a && b && *a != *b; };
  std::vector<std::string> out;
  for (const auto& [uuid, now] : read) {
    const auto it = registered.find(uuid);
    if (it == registered.end()) continue;
    const GpuEventBasis& then = it->second;
    const bool events_changed = then.supported_events && now.supported_events &&
                                ((*then.supported_events ^ *now.supported_events) & kWaitedEventTypes) != 0;
    if (events_changed || differ(then.mig_current, now.mig_current) || differ(then.mig_pending, now.mig_pending)) {
      out.push_back(uuid);
    }
  }
  return out;
}

std::vector<std::string> EventWaiterArgs(const EventWaiterOptions& options) {
  std::vector<std::string> args{std::string(kSubcommand), "--library", options.library, "--wait-ms",
                                std::to_string(options.wait_ms)};
  for (const auto index : options.excluded_indices) {
    args.push_back("--exclude-index");
    args.push_back(std::to_string(index));
  }
  for (const auto& uuid : options.excluded_uuids) {
    args.push_back("--exclude-uuid");
    args.push_back(uuid);
  }
  return args;
}

int RunEventWaiter(const EventWaiterOptions& options) {
  std::string error;
  const auto library = NvmlLibrary::Open(options.library, error);
  if (!library) return EmitError("", error);
  const auto& api = library->Api();
  nvml::Return rc = api.nvmlInit_v2();
  if (rc != nvml::kSuccess) return EmitError("nvmlInit_v2", "nvmlInit_v2 failed: " + library->Describe(rc));
  unsigned int count = 0;
  rc = api.nvmlDeviceGetCount_v2(&count);
  if (rc != nvml::kSuccess) return EmitError("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount_v2 failed: " + library->Describe(rc));
  nvml::EventSet set = nullptr;
  rc = api.nvmlEventSetCreate(&set);
  if (rc != nvml::kSuccess) return EmitError("nvmlEventSetCreate", "nvmlEventSetCreate failed: " + library->Describe(rc));

  std::vector<std::pair<nvml::Device, std::string>> devices;  // event handle → UUID
  const auto excluded_uuid = [&](const std::string& uuid) {
    return std::find(options.excluded_uuids.begin(), options.excluded_uuids.end(), uuid) != options.excluded_uuids.end();
  };
  for (unsigned int i = 0; i < count; ++i) {
    // A GPU released for its reset is not touched: looking up its handle would attach it.
    if (std::find(options.excluded_indices.begin(), options.excluded_indices.end(), i) != options.excluded_indices.end()) {
      continue;
    }
    const std::string which = " for GPU " + std::to_string(i);
    nvml::Device device = nullptr;
    rc = api.nvmlDeviceGetHandleByIndex_v2(i, &device);
    if (rc != nvml::kSuccess) {
      return EmitError("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex_v2 failed" + which + ": " + library->Describe(rc));
    }
    char uuid_buffer[nvml::kDeviceUuidV2BufferSize] = {};
    rc = api.nvmlDeviceGetUUID(device, uuid_buffer, sizeof(uuid_buffer));
    if (rc != nvml::kSuccess) return EmitError("nvmlDeviceGetUUID", "nvmlDeviceGetUUID failed" + which + ": " + library->Describe(rc));
    const std::string uuid = uuid_buffer;
    if (excluded_uuid(uuid)) continue;  // released, found at another index
    // XIDs, MIG reconfigurations, SBE/DBE ECC errors and clock events, each where the GPU
    // reports it: registering a type the GPU does not support fails the whole call, and a GPU
    // without the ECC or clock events keeps the poll alone for those checks.
    unsigned long long supported = 0;
    rc = api.nvmlDeviceGetSupportedEventTypes(device, &supported);
    if (rc != nvml::kSuccess) {
      return EmitError("nvmlDeviceGetSupportedEventTypes",
                  "nvmlDeviceGetSupportedEventTypes failed for " + uuid + ": " + library->Describe(rc));
    }
    // The MIG mode the registration follows (the parent compares it with its reads): a GPU
    // without MIG, or a driver without the call, says nothing.
    std::optional<uint32_t> mig_current, mig_pending;
    if (api.nvmlDeviceGetMigMode != nullptr) {
      unsigned int current = 0, pending = 0;
      if (api.nvmlDeviceGetMigMode(device, &current, &pending) == nvml::kSuccess) {
        mig_current = current;
        mig_pending = pending;
      }
    }
    const auto registered = [&](unsigned long long types) {
      Emit("registered " + uuid + " " + std::to_string(types) + " " + std::to_string(supported) + " " +
           OptionalField(mig_current) + " " + OptionalField(mig_pending));
    };
    const unsigned long long types = supported & kWaitedEventTypes;
    if ((types & nvml::kEventTypeXidCriticalError) == 0) Emit("warn " + uuid + " does not report XID events through NVML");
    if (types == 0) {
      registered(0);
      continue;
    }
    rc = api.nvmlDeviceRegisterEvents(device, types, set);
    if (rc == nvml::kErrorNotSupported) {
      Emit("warn " + uuid + ": nvmlDeviceRegisterEvents: " + library->Describe(rc));
      registered(0);
      continue;
    }
    if (rc != nvml::kSuccess) {
      return EmitError("nvmlDeviceRegisterEvents", "nvmlDeviceRegisterEvents failed for " + uuid + ": " + library->Describe(rc));
    }
    registered(types);
    devices.emplace_back(device, uuid);
  }
  const auto uuid_of = [&](nvml::Device device) {
    for (const auto& [handle, uuid] : devices) {
      if (handle == device) return uuid;
    }
    return std::string();
  };

  bool armed = false;
  while (true) {
    nvml::EventData data{};
    rc = api.nvmlEventSetWait_v2(set, &data, armed ? options.wait_ms : kProbeTimeoutMs);
    if (rc != nvml::kSuccess && rc != nvml::kErrorTimeout) {
      return EmitError("nvmlEventSetWait_v2", "nvmlEventSetWait_v2 failed: " + library->Describe(rc));
    }
    if (!armed) {
      armed = true;
      Emit("armed");
    }
    if (rc != nvml::kSuccess) continue;
    // XIDs and MIG reconfigurations; anything else is ignored.
    if ((data.eventType & nvml::kEventTypeXidCriticalError) != 0) {
      Emit("xid " + UuidField(uuid_of(data.device)) + " " + std::to_string(data.eventData) + " " +
           std::to_string(data.gpuInstanceId) + " " + std::to_string(data.computeInstanceId));
    }
    if ((data.eventType & nvml::kEventMigConfigChange) != 0) Emit("mig " + UuidField(uuid_of(data.device)));
    for (const auto& [type, name] : kHealthEventNames) {
      if ((data.eventType & type) != 0) {
        Emit("health " + UuidField(uuid_of(data.device)) + " " + std::string(name) + " " + std::to_string(data.eventData));
      }
    }
  }
}

// ---------------------------------------------------------------------------- parent side

struct EventWaiterProcess::Io {
  explicit Io(boost::asio::io_context& io) : out(io), exit(io) {}
  boost::asio::posix::stream_descriptor out;   // the child's stdout
  boost::asio::posix::stream_descriptor exit;  // its pidfd: readable once it exited
  std::array<char, 4096> buffer{};
};

EventWaiterProcess::EventWaiterProcess(boost::asio::io_context& io, Callbacks callbacks)
    : callbacks_(std::move(callbacks)), io_(std::make_unique<Io>(io)) {}

std::shared_ptr<EventWaiterProcess> EventWaiterProcess::Start(boost::asio::io_context& io, const std::string& program,
                                                              const EventWaiterOptions& options, Callbacks callbacks) {
  std::shared_ptr<EventWaiterProcess> self(new EventWaiterProcess(io, std::move(callbacks)));
  // Everything the child needs is made before fork: after it, async-signal-safe calls only.
  std::vector<std::string> args = EventWaiterArgs(options);
  args.insert(args.begin(), program);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string exec_failed = "error - cannot run " + program + " (the NVML event waiter): errno ";

  int out[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  // fork, not posix_spawn: it must die with us (PR_SET_PDEATHSIG), or a kill -9 of the
  // supervisor would leave NVML handles held. From the loop thread, which lives as long as the
  // process (the death signal follows the thread that forked).
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    // Nothing of ours may stay open in it: an NVML handle of the supervisor's own session
    // inherited by the child would hold that GPU after the session let go of it.
    ::syscall(SYS_close_range, 3U, ~0U, 0U);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(argv[0], argv.data());
    // errno in digits (strerror is not async-signal-safe).
    char digits[16];
    int at = static_cast<int>(sizeof(digits));
    digits[--at] = '\n';
    for (int e = errno; at > 0;) {
      digits[--at] = static_cast<char>('0' + e % 10);
      e /= 10;
      if (e == 0) break;
    }
    [[maybe_unused]] ssize_t n = ::write(STDOUT_FILENO, exec_failed.data(), exec_failed.size());
    n = ::write(STDOUT_FILENO, digits + at, sizeof(digits) - static_cast<std::size_t>(at));
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(out[1]);
  if (pid < 0) {
    ::close(out[0]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(fork_errno));
  }
  self->pid_ = pid;
  self->io_->out.assign(out[0]);
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    const int e = errno;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    self->reaped_ = true;
    throw std::runtime_error(std::string("pidfd_open: ") + std::strerror(e));
  }
  self->io_->exit.assign(pidfd);
  self->ReadMore();
  self->AwaitExit();
  return self;
}

EventWaiterProcess::~EventWaiterProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

void EventWaiterProcess::Kill(std::function<void()> reaped) {
  if (reaped) on_reaped_.push_back(std::move(reaped));
  if (killing_) {
    MaybeEnded();  // reaped already: told at once
    return;
  }
  killing_ = true;
  callbacks_ = {};
  if (!reaped_) ::kill(pid_, SIGKILL);
  boost::system::error_code ignored;
  io_->out.close(ignored);  // its output no longer matters
  MaybeEnded();
}

void EventWaiterProcess::ReadMore() {
  io_->out.async_read_some(boost::asio::buffer(io_->buffer),
                           [self = shared_from_this()](const boost::system::error_code& ec, std::size_t n) {
                             if (ec || n == 0) {
                               self->eof_ = true;
                               self->MaybeEnded();
                               return;
                             }
                             self->partial_.append(self->io_->buffer.data(), n);
                             std::size_t start = 0;
                             for (auto end = self->partial_.find('\n'); end != std::string::npos && !self->killing_;
                                  end = self->partial_.find('\n', start)) {
                               self->OnLine(self->partial_.substr(start, end - start));
                               start = end + 1;
                             }
                             self->partial_.erase(0, start);
                             if (self->partial_.size() > 64 * 1024) self->partial_.clear();  // not ours
                             if (!self->killing_) self->ReadMore();
                           });
}

void EventWaiterProcess::OnLine(const std::string& line) {
  // Each callback is called through a copy: it may Kill() us, which drops callbacks_.
  const auto fields = Fields(line, 6);
  const std::string_view kind = fields[0];
  const auto uuid = [&](std::string_view field) { return field == "-" ? std::string() : std::string(field); };
  if (kind == "armed") {
    if (auto armed = callbacks_.armed) armed();
  } else if (kind == "xid" && fields.size() == 5) {
    XidEvent event;
    event.uuid = uuid(fields[1]);
    if (ParseNumber(fields[2], event.xid) && ParseNumber(fields[3], event.gpu_instance) &&
        ParseNumber(fields[4], event.compute_instance)) {
      if (auto xid = callbacks_.xid) xid(std::move(event));
    }
  } else if (kind == "health" && fields.size() >= 4) {
    HealthEventLine event;
    event.uuid = uuid(fields[1]);
    bool known = false;
    for (const auto& [type, name] : kHealthEventNames) {
      if (fields[2] != name) continue;
      known = true;
      event.kind = type == nvml::kEventTypeSingleBitEccError   ? NvmlHealthEvent::Kind::kSingleBitEcc
                   : type == nvml::kEventTypeDoubleBitEccError ? NvmlHealthEvent::Kind::kDoubleBitEcc
                                                               : NvmlHealthEvent::Kind::kClock;
    }
    if (known && ParseNumber(fields[3], event.data)) {
      if (auto health = callbacks_.health) health(std::move(event));
    }
  } else if (kind == "registered" && fields.size() == 6) {
    unsigned long long types = 0;
    uint64_t supported = 0;
    GpuEventBasis basis;
    if (ParseNumber(fields[2], types) && ParseNumber(fields[3], supported) && ParseOptional(fields[4], basis.mig_current) &&
        ParseOptional(fields[5], basis.mig_pending)) {
      basis.supported_events = supported;
      if (auto registered = callbacks_.registered) registered(uuid(fields[1]), types, std::move(basis));
    }
  } else if (kind == "mig" && fields.size() >= 2) {
    if (auto mig_changed = callbacks_.mig_changed) mig_changed(uuid(fields[1]));
  } else if (kind == "warn" && fields.size() >= 2) {
    if (auto warning = callbacks_.warning) warning(line.substr(5));
  } else if (kind == "error") {
    const auto parts = Fields(line, 3);
    Fail(parts.size() > 1 && parts[1] != "-" ? std::string(parts[1]) : std::string(),
         parts.size() > 2 ? std::string(parts[2]) : line);
  }
}

void EventWaiterProcess::AwaitExit() {
  io_->exit.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                       [self = shared_from_this()](const boost::system::error_code& ec) {
                         if (ec) return;  // closed: the object is going away
                         int status = 0;
                         pid_t got;
                         do {
                           got = ::waitpid(self->pid_, &status, WNOHANG);
                         } while (got < 0 && errno == EINTR);
                         if (got == 0) {  // not yet (cannot happen once the pidfd is readable)
                           self->AwaitExit();
                           return;
                         }
                         self->reaped_ = true;
                         self->status_ = status;
                         boost::system::error_code ignored;
                         self->io_->exit.close(ignored);
                         self->MaybeEnded();
                       });
}

void EventWaiterProcess::MaybeEnded() {
  if (!reaped_) return;
  if (killing_) {
    auto reaped = std::move(on_reaped_);
    on_reaped_.clear();
    for (auto& done : reaped) boost::asio::post(io_->exit.get_executor(), std::move(done));
    return;
  }
  if (!eof_) return;  // its last lines (an error) first
  std::string how = WIFEXITED(status_)     ? "exited with " + std::to_string(WEXITSTATUS(status_))
                    : WIFSIGNALED(status_) ? "was killed by signal " + std::to_string(WTERMSIG(status_))
                                           : "ended";
  Fail("", "the NVML event waiter (pid " + std::to_string(pid_) + ") " + how);
}

void EventWaiterProcess::Fail(std::string function, std::string message) {
  if (failed_ || killing_) return;
  failed_ = true;
  if (auto failed = callbacks_.failed) failed(std::move(function), std::move(message));
}

}  // namespace gns::gpu_inventory
