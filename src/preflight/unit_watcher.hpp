#pragma once
// Follows one systemd unit over D-Bus (sd-bus) on the loop: the connection's fd is an Asio
// stream descriptor waited on for the events sd-bus asks for (sd_bus_get_events), and the
// deadline it asks for (sd_bus_get_timeout) is a steady_timer — no polling; an idle unit costs
// no wake-ups. It reads the Unit and Service properties (GetAll), then follows
// PropertiesChanged on the unit's object and org.freedesktop.systemd1's owner
// (NameOwnerChanged: a systemd re-exec, or the fake going away). A connection that breaks is
// dropped and made again with backoff; while it is down the state says so.
//
// systemd facts (org.freedesktop.systemd1(5)): unit objects live at
// /org/freedesktop/systemd1/unit/<name escaped as sd_bus_path_encode does>; Manager.LoadUnit(s)
// returns that path even for a unit that does not exist (LoadState "not-found"); time
// properties are µs (ActiveEnterTimestamp: since the epoch, 0 = never).

#include "loop/backoff.hpp"
#include "loop/gate.hpp"
#include "preflight/unit_state.hpp"

#include <utility>  // before awaitable.hpp: Boost 1.74's uses std::exchange without including it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <spdlog/logger.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <systemd/sd-bus.h>

namespace gns::imex_health {

// Reads the a{sv} of a GetAll reply or a PropertiesChanged signal into `state` (unknown names
// and unexpected types are skipped). Returns a negative errno on a malformed message.
int ReadUnitProperties(sd_bus_message* message, UnitState& state);

// The D-Bus object path of a unit name.
std::string UnitObjectPath(std::string_view unit);

// The address used for `configured` ("" → $DBUS_SYSTEM_BUS_ADDRESS, else the well-known socket).
std::string SystemBusAddress(std::string_view configured);

// A blocking one-shot read (for `preflight`): connect, LoadUnit, GetAll, with a deadline.
UnitState ReadUnitOnce(const std::string& bus_address, const std::string& unit, std::chrono::milliseconds timeout);

class SystemdUnitWatcher {
 public:
  struct Options {
    std::string bus_address;  // "" → SystemBusAddress("")
    std::string unit = "nvidia-imex.service";
    BackoffPolicy reconnect{std::chrono::milliseconds(200), std::chrono::seconds(30), 2.0, 0.5};
  };
  struct Stats {
    uint64_t wakeups = 0;       // fd/timer wake-ups
    uint64_t connects = 0;
    uint64_t disconnects = 0;
    uint64_t signals = 0;       // PropertiesChanged handled
  };
  using OnChange = std::function<void(const UnitState&)>;
  using Done = std::function<void(std::string error)>;  // "" on success

  SystemdUnitWatcher(boost::asio::io_context& io, Options options, OnChange on_change,
                     std::shared_ptr<spdlog::logger> log);
  ~SystemdUnitWatcher();
  SystemdUnitWatcher(const SystemdUnitWatcher&) = delete;
  SystemdUnitWatcher& operator=(const SystemdUnitWatcher&) = delete;

  void Start();
  void Stop();
  // Manager.<method>(unit, "replace") — "RestartUnit", "StartUnit", "StopUnit". `done` runs on
  // the loop (with an error when not connected or when systemd refused).
  void CallManager(const std::string& method, Done done);

  const UnitState& State() const { return state_; }
  const Stats& GetStats() const { return stats_; }

 private:
  // A method call's outcome: its reply (referenced), or why there is none.
  struct BusReply {
    std::shared_ptr<sd_bus_message> message;  // null when no reply came
    std::string error;                        // the reply's D-Bus error, or why no reply came
    bool sent = true;                         // false: the call could not be queued at all
  };

  static int OnPropertiesChanged(sd_bus_message* m, void* userdata, sd_bus_error* error);
  static int OnNameOwnerChanged(sd_bus_message* m, void* userdata, sd_bus_error* error);

  void Connect();
  void Disconnect(const std::string& why);
  void Pump();
  void Arm();
  void Refresh();
  // LoadUnit, then the unit's properties; spawned by Refresh with a ticket of the connection.
  boost::asio::awaitable<void> ReadUnit(Gate::Ticket connection);
  // `member`(arg) on `path`/`interface`, awaited: resumes on the loop with the reply, or not at
  // all once `connection` is closed (the coroutine is dropped with its connection).
  boost::asio::awaitable<BusReply> Call(const char* path, const char* interface, const char* member,
                                        const std::string& arg, Gate::Ticket connection);
  void GetAll(const char* interface);
  void Notify();

  boost::asio::io_context& io_;
  Options options_;
  OnChange on_change_;
  std::shared_ptr<spdlog::logger> log_;
  std::string unit_path_;
  Backoff backoff_;
  sd_bus* bus_ = nullptr;
  boost::asio::posix::stream_descriptor fd_;
  boost::asio::steady_timer timeout_timer_;
  boost::asio::steady_timer reconnect_timer_;
  bool read_armed_ = false;
  bool write_armed_ = false;
  bool stopped_ = true;
  // Open while the current connection is: renewed by Connect, closed by Disconnect and Stop,
  // so nothing started for one connection (an fd wait, a timer, a call) touches the next.
  Gate connection_;
  UnitState state_;
  Stats stats_;
};

}  // namespace gns::imex_health
