// sd-bus on the loop: see unit_watcher.hpp.
#include "preflight/unit_watcher.hpp"

#include "loop/awaitables.hpp"

#include <systemd/sd-bus.h>

// GCC 12 at -O2 (GCC bug 109224) reports Asio's own coroutine frame new/delete pair as
// mismatched once both are inlined (as dra_module.cpp).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>

#include <poll.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace gns::imex_health {
namespace {

constexpr const char* kDestination = "org.freedesktop.systemd1";
constexpr const char* kManagerPath = "/org/freedesktop/systemd1";
constexpr const char* kManager = "org.freedesktop.systemd1.Manager";
constexpr const char* kUnitInterface = "org.freedesktop.systemd1.Unit";
constexpr const char* kServiceInterface = "org.freedesktop.systemd1.Service";
constexpr const char* kDefaultSystemBus = "unix:path=/run/dbus/system_bus_socket";

std::string ErrnoText(int r) { return std::strerror(r < 0 ? -r : r); }

std::string CallError(sd_bus_message* reply) {
  const sd_bus_error* e = sd_bus_message_get_error(reply);
  if (!e) return {};
  return std::string(e->name ? e->name : "error") + ": " + (e->message ? e->message : "");
}

// One value of an {sv} entry into the matching member when the type is the expected one.
template <typename T>
int ReadVariant(sd_bus_message* m, const char* contents, char want, T& out) {
  if (contents[0] != want || contents[1] != '\0') return sd_bus_message_skip(m, "v");
  int r = sd_bus_message_enter_container(m, 'v', contents);
  if (r < 0) return r;
  if constexpr (std::is_same_v<T, std::string>) {
    const char* s = nullptr;
    r = sd_bus_message_read_basic(m, want, &s);
    if (r >= 0) out = s ? s : "";
  } else {
    r = sd_bus_message_read_basic(m, want, &out);
  }
  if (r < 0) return r;
  return sd_bus_message_exit_container(m);
}

// The bus-level part of a connection made for us: an address, the bus-client handshake.
int OpenBus(const std::string& address, sd_bus** out) {
  sd_bus* bus = nullptr;
  int r = sd_bus_new(&bus);
  if (r < 0) return r;
  r = sd_bus_set_address(bus, address.c_str());
  if (r >= 0) r = sd_bus_set_bus_client(bus, 1);
  if (r >= 0) r = sd_bus_set_description(bus, "imex-health");
  if (r >= 0) r = sd_bus_start(bus);
  if (r < 0) {
    sd_bus_unref(bus);
    return r;
  }
  *out = bus;
  return 0;
}

// A method call whose answer goes to a std::function; the slot's destroy callback frees it and,
// when the connection went away unanswered, still reports on the loop.
struct PendingCall {
  boost::asio::io_context* io = nullptr;
  std::function<void(sd_bus_message*)> on_reply;
  std::function<void(std::string)> on_lost;
  bool answered = false;
};

int OnPendingReply(sd_bus_message* reply, void* userdata, sd_bus_error*) {
  auto* call = static_cast<PendingCall*>(userdata);
  call->answered = true;
  if (call->on_reply) call->on_reply(reply);
  return 0;
}

void OnPendingDestroy(void* userdata) {
  auto* call = static_cast<PendingCall*>(userdata);
  if (!call->answered && call->on_lost) {
    boost::asio::post(*call->io, [lost = std::move(call->on_lost)] {
      lost("the D-Bus connection closed before systemd answered");
    });
  }
  delete call;
}

template <typename... Args>
int CallAsync(sd_bus* bus, boost::asio::io_context& io, const char* path, const char* interface, const char* member,
              std::function<void(sd_bus_message*)> on_reply, std::function<void(std::string)> on_lost,
              const char* types, Args... args) {
  auto* call = new PendingCall{&io, std::move(on_reply), std::move(on_lost)};
  sd_bus_slot* slot = nullptr;
  const int r = sd_bus_call_method_async(bus, &slot, kDestination, path, interface, member, &OnPendingReply, call,
                                         types, args...);
  if (r < 0) {
    delete call;
    return r;
  }
  sd_bus_slot_set_destroy_callback(slot, &OnPendingDestroy);
  sd_bus_slot_set_floating(slot, 1);
  sd_bus_slot_unref(slot);  // the bus keeps the floating slot until the answer
  return r;
}

}  // namespace

int ReadUnitProperties(sd_bus_message* m, UnitState& state) {
  int r = sd_bus_message_enter_container(m, 'a', "{sv}");
  if (r < 0) return r;
  while ((r = sd_bus_message_enter_container(m, 'e', "sv")) > 0) {
    const char* name = nullptr;
    r = sd_bus_message_read_basic(m, 's', &name);
    if (r < 0) return r;
    char type = 0;
    const char* contents = nullptr;
    r = sd_bus_message_peek_type(m, &type, &contents);
    if (r < 0) return r;
    if (type != 'v' || !contents) return -EBADMSG;
    const std::string_view n(name);
    if (n == "LoadState") r = ReadVariant(m, contents, 's', state.load_state);
    else if (n == "ActiveState") r = ReadVariant(m, contents, 's', state.active_state);
    else if (n == "SubState") r = ReadVariant(m, contents, 's', state.sub_state);
    else if (n == "UnitFileState") r = ReadVariant(m, contents, 's', state.unit_file_state);
    else if (n == "Result") r = ReadVariant(m, contents, 's', state.result);
    else if (n == "NRestarts") r = ReadVariant(m, contents, 'u', state.n_restarts);
    else if (n == "ExecMainStatus") r = ReadVariant(m, contents, 'i', state.exec_main_status);
    else if (n == "ExecMainCode") r = ReadVariant(m, contents, 'i', state.exec_main_code);
    else if (n == "MainPID") r = ReadVariant(m, contents, 'u', state.main_pid);
    else if (n == "ActiveEnterTimestamp") r = ReadVariant(m, contents, 't', state.active_enter_usec);
    else r = sd_bus_message_skip(m, "v");
    if (r < 0) return r;
    r = sd_bus_message_exit_container(m);
    if (r < 0) return r;
  }
  if (r < 0) return r;
  return sd_bus_message_exit_container(m);
}

std::string UnitObjectPath(std::string_view unit) {
  char* path = nullptr;
  if (sd_bus_path_encode("/org/freedesktop/systemd1/unit", std::string(unit).c_str(), &path) < 0) return {};
  std::string out(path);
  std::free(path);
  return out;
}

std::string SystemBusAddress(std::string_view configured) {
  if (!configured.empty()) return std::string(configured);
  if (const char* env = std::getenv("DBUS_SYSTEM_BUS_ADDRESS"); env && *env) return env;
  return kDefaultSystemBus;
}

UnitState ReadUnitOnce(const std::string& bus_address, const std::string& unit, std::chrono::milliseconds timeout) {
  UnitState state;
  sd_bus* bus = nullptr;
  const std::string address = SystemBusAddress(bus_address);
  int r = OpenBus(address, &bus);
  if (r < 0) {
    state.error = "cannot connect to the system bus at " + address + ": " + ErrnoText(r);
    return state;
  }
  state.bus_connected = true;
  sd_bus_set_method_call_timeout(bus, static_cast<uint64_t>(timeout.count()) * 1000);
  sd_bus_error error = SD_BUS_ERROR_NULL;
  sd_bus_message* reply = nullptr;
  r = sd_bus_call_method(bus, kDestination, kManagerPath, kManager, "LoadUnit", &error, &reply, "s", unit.c_str());
  if (r < 0) {
    state.error = std::string("LoadUnit ") + unit + ": " + (error.message ? error.message : ErrnoText(r));
  } else {
    state.systemd_present = true;
    const char* path = nullptr;
    r = sd_bus_message_read(reply, "o", &path);
    const std::string object = r >= 0 && path ? path : UnitObjectPath(unit);
    for (const char* interface : {kUnitInterface, kServiceInterface}) {
      sd_bus_message_unref(reply);
      reply = nullptr;
      sd_bus_error_free(&error);
      r = sd_bus_call_method(bus, kDestination, object.c_str(), "org.freedesktop.DBus.Properties", "GetAll", &error,
                             &reply, "s", interface);
      if (r >= 0) r = ReadUnitProperties(reply, state);
      if (r < 0 && interface == kUnitInterface) {
        state.error = std::string("GetAll ") + interface + ": " + (error.message ? error.message : ErrnoText(r));
        break;
      }
    }
    state.known = state.error.empty();
  }
  sd_bus_message_unref(reply);
  sd_bus_error_free(&error);
  sd_bus_flush_close_unref(bus);
  return state;
}

SystemdUnitWatcher::SystemdUnitWatcher(boost::asio::io_context& io, Options options, OnChange on_change,
                                       std::shared_ptr<spdlog::logger> log)
    : io_(io),
      options_(std::move(options)),
      on_change_(std::move(on_change)),
      log_(std::move(log)),
      unit_path_(UnitObjectPath(options_.unit)),
      backoff_(options_.reconnect),
      fd_(io),
      timeout_timer_(io),
      reconnect_timer_(io) {}

SystemdUnitWatcher::~SystemdUnitWatcher() { Stop(); }

void SystemdUnitWatcher::Start() {
  stopped_ = false;
  Connect();
}

void SystemdUnitWatcher::Stop() {
  stopped_ = true;
  reconnect_timer_.cancel();
  if (bus_) {
    connection_.Close();
    timeout_timer_.cancel();
    fd_.cancel();
    fd_.release();  // sd-bus owns the fd and closes it
    sd_bus_flush_close_unref(bus_);
    bus_ = nullptr;
  }
}

void SystemdUnitWatcher::Connect() {
  if (stopped_) return;
  const std::string address = SystemBusAddress(options_.bus_address);
  sd_bus* bus = nullptr;
  const int r = OpenBus(address, &bus);
  if (r < 0) {
    state_.bus_connected = false;
    state_.systemd_present = false;
    state_.known = false;
    state_.error = "cannot connect to the system bus at " + address + ": " + ErrnoText(r);
    Notify();
    const auto delay = backoff_.Next();
    reconnect_timer_.expires_after(delay);
    reconnect_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) Connect();
    });
    return;
  }
  bus_ = bus;
  ++stats_.connects;
  connection_.Renew();
  fd_.assign(sd_bus_get_fd(bus_));
  read_armed_ = write_armed_ = false;
  state_.bus_connected = true;
  state_.error.clear();
  int m = sd_bus_match_signal_async(bus_, nullptr, kDestination, unit_path_.c_str(), "org.freedesktop.DBus.Properties",
                                    "PropertiesChanged", &OnPropertiesChanged, nullptr, this);
  if (m >= 0) {
    const std::string rule =
        "type='signal',sender='org.freedesktop.DBus',path='/org/freedesktop/DBus',"
        "interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='org.freedesktop.systemd1'";
    m = sd_bus_add_match_async(bus_, nullptr, rule.c_str(), &OnNameOwnerChanged, nullptr, this);
  }
  if (m < 0) {
    Disconnect("cannot add D-Bus matches: " + ErrnoText(m));
    return;
  }
  Refresh();
  Arm();
}

void SystemdUnitWatcher::Disconnect(const std::string& why) {
  if (!bus_) return;
  ++stats_.disconnects;
  connection_.Close();
  timeout_timer_.cancel();
  fd_.cancel();
  fd_.release();
  sd_bus_flush_close_unref(bus_);
  bus_ = nullptr;
  state_.bus_connected = false;
  state_.systemd_present = false;
  state_.known = false;
  state_.error = why;
  log_->warn("{}; reconnecting", why);
  Notify();
  if (stopped_) return;
  reconnect_timer_.expires_after(backoff_.Next());
  reconnect_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Connect();
  });
}

void SystemdUnitWatcher::Pump() {
  if (!bus_) return;
  ++stats_.wakeups;
  for (;;) {
    const int r = sd_bus_process(bus_, nullptr);
    if (r < 0) {
      Disconnect("the system bus connection broke: " + ErrnoText(r));
      return;
    }
    if (r == 0) break;
  }
  if (sd_bus_is_open(bus_) <= 0) {
    Disconnect("the system bus closed the connection");
    return;
  }
  Arm();
}

void SystemdUnitWatcher::Arm() {
  if (!bus_) return;
  const int events = sd_bus_get_events(bus_);
  if (events < 0) {
    Disconnect("the system bus connection is closing: " + ErrnoText(events));
    return;
  }
  auto alive = connection_.Watch();
  if ((events & POLLIN) && !read_armed_) {
    read_armed_ = true;
    fd_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                   [this, alive](const boost::system::error_code& ec) {
                     if (!alive) return;
                     read_armed_ = false;
                     if (!ec) Pump();
                   });
  }
  if ((events & POLLOUT) && !write_armed_) {
    write_armed_ = true;
    fd_.async_wait(boost::asio::posix::stream_descriptor::wait_write,
                   [this, alive](const boost::system::error_code& ec) {
                     if (!alive) return;
                     write_armed_ = false;
                     if (!ec) Pump();
                   });
  }
  uint64_t usec = UINT64_MAX;
  if (sd_bus_get_timeout(bus_, &usec) >= 0 && usec != UINT64_MAX) {
    // sd-bus answers in CLOCK_MONOTONIC µs, the clock steady_clock reads on Linux.
    timeout_timer_.expires_at(std::chrono::steady_clock::time_point(std::chrono::microseconds(usec)));
    timeout_timer_.async_wait([this, alive](const boost::system::error_code& ec) {
      if (!ec && alive) Pump();
    });
  } else {
    timeout_timer_.cancel();
  }
}

void SystemdUnitWatcher::Refresh() {
  if (!bus_) return;
  // A bug that throws in the read ends it and is rethrown on the loop, as from a callback.
  boost::asio::co_spawn(io_, ReadUnit(connection_.Watch()), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
}

boost::asio::awaitable<void> SystemdUnitWatcher::ReadUnit(Gate::Ticket connection) {
  // co_spawn begins this a loop turn after Refresh: the connection (or the watcher) may be gone.
  if (!connection) co_return;
  // Subscribe asks systemd to send unit signals at all (it does not otherwise); its answer
  // carries nothing we need.
  CallAsync(bus_, io_, kManagerPath, kManager, "Subscribe", nullptr, nullptr, "");
  const BusReply loaded = co_await Call(kManagerPath, kManager, "LoadUnit", options_.unit, connection);
  if (!loaded.sent) {
    log_->warn("LoadUnit {}: {}", options_.unit, loaded.error);
    co_return;
  }
  if (!loaded.error.empty()) {
    state_.systemd_present = false;
    state_.known = false;
    state_.error = "LoadUnit " + options_.unit + ": " + loaded.error;
    Notify();
    co_return;
  }
  state_.systemd_present = true;
  // Both asked at once; each answer is applied as it comes.
  GetAll(kUnitInterface);
  GetAll(kServiceInterface);
}

boost::asio::awaitable<SystemdUnitWatcher::BusReply> SystemdUnitWatcher::Call(const char* path, const char* interface,
                                                                              const char* member,
                                                                              const std::string& arg,
                                                                              Gate::Ticket connection) {
  // Not a coroutine: the call is made when awaited, on the connection of that moment (the
  // ticket is that connection's: a call that cannot be made answers with sent = false).
  auto start = [this, path, interface, member, arg](auto resume) {
    if (!bus_) {
      boost::asio::post(io_, [resume]() mutable { resume(BusReply{nullptr, "not connected", false}); });
      return;
    }
    const int r = CallAsync(
        bus_, io_, path, interface, member,
        [resume](sd_bus_message* reply) mutable {
          std::shared_ptr<sd_bus_message> held(sd_bus_message_ref(reply), &sd_bus_message_unref);
          resume(BusReply{std::move(held), CallError(reply), true});
        },
        [resume](std::string why) mutable { resume(BusReply{nullptr, std::move(why), true}); }, "s", arg.c_str());
    if (r < 0) {
      boost::asio::post(io_, [resume, r]() mutable { resume(BusReply{nullptr, ErrnoText(r), false}); });
      return;
    }
    Arm();  // the call is to be written, and its timeout waited for
  };
  return AwaitCallback<BusReply>(std::move(start), std::move(connection));
}

void SystemdUnitWatcher::GetAll(const char* interface) {
  auto alive = connection_.Watch();
  const bool unit_interface = std::strcmp(interface, kUnitInterface) == 0;
  CallAsync(
      bus_, io_, unit_path_.c_str(), "org.freedesktop.DBus.Properties", "GetAll",
      [this, alive, unit_interface](sd_bus_message* reply) {
        if (!alive) return;
        if (const auto error = CallError(reply); !error.empty()) {
          // A unit that is not a service has no Service interface: only the Unit one counts.
          if (unit_interface) {
            state_.error = "GetAll " + unit_path_ + ": " + error;
            state_.known = false;
            Notify();
          }
          return;
        }
        if (const int r = ReadUnitProperties(reply, state_); r < 0) {
          state_.error = "malformed GetAll answer from systemd: " + ErrnoText(r);
          Notify();
          return;
        }
        if (unit_interface) {
          state_.known = true;
          state_.error.clear();
          backoff_.Reset();
        }
        Notify();
      },
      nullptr, "s", interface);
}

void SystemdUnitWatcher::CallManager(const std::string& method, Done done) {
  if (!bus_ || !state_.systemd_present) {
    boost::asio::post(io_, [done = std::move(done), error = state_.error] {
      done("systemd is not reachable" + (error.empty() ? std::string() : ": " + error));
    });
    return;
  }
  auto shared = std::make_shared<Done>(std::move(done));
  const int r = CallAsync(
      bus_, io_, kManagerPath, kManager, method.c_str(),
      [shared, method](sd_bus_message* reply) {
        const auto error = CallError(reply);
        (*shared)(error.empty() ? std::string() : method + ": " + error);
      },
      [shared](std::string why) { (*shared)(std::move(why)); }, "ss", options_.unit.c_str(), "replace");
  if (r < 0) {
    boost::asio::post(io_, [shared, method, r] { (*shared)(method + ": " + ErrnoText(r)); });
    return;
  }
  Arm();
}

int SystemdUnitWatcher::OnPropertiesChanged(sd_bus_message* m, void* userdata, sd_bus_error*) {
  auto* self = static_cast<SystemdUnitWatcher*>(userdata);
  ++self->stats_.signals;
  const char* interface = nullptr;
  if (sd_bus_message_read_basic(m, 's', &interface) < 0) return 0;
  if (const int r = ReadUnitProperties(m, self->state_); r < 0) {
    self->log_->warn("malformed PropertiesChanged from systemd: {}", ErrnoText(r));
    return 0;
  }
  // Properties systemd only invalidates (no value) are read again.
  bool invalidated = false;
  if (sd_bus_message_enter_container(m, 'a', "s") > 0) {
    const char* name = nullptr;
    while (sd_bus_message_read_basic(m, 's', &name) > 0) invalidated = true;
    sd_bus_message_exit_container(m);
  }
  if (invalidated && interface) self->GetAll(interface);
  self->Notify();
  return 0;
}

int SystemdUnitWatcher::OnNameOwnerChanged(sd_bus_message* m, void* userdata, sd_bus_error*) {
  auto* self = static_cast<SystemdUnitWatcher*>(userdata);
  const char* name = nullptr;
  const char* old_owner = nullptr;
  const char* new_owner = nullptr;
  if (sd_bus_message_read(m, "sss", &name, &old_owner, &new_owner) < 0) return 0;
  if (new_owner && *new_owner) {
    self->log_->info("org.freedesktop.systemd1 is on the bus ({}): reading {} again", new_owner, self->options_.unit);
    self->Refresh();
  } else {
    self->state_.systemd_present = false;
    self->state_.known = false;
    self->state_.error = "org.freedesktop.systemd1 left the bus";
    self->Notify();
  }
  return 0;
}

void SystemdUnitWatcher::Notify() {
  if (on_change_) on_change_(state_);
}

}  // namespace gns::imex_health
