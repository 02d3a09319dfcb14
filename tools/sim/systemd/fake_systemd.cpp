// gns-fake-systemd: a stand-in for PID 1's D-Bus API on a private system bus (tests and
// `make run`), so the supervisor's sd-bus client runs over the real D-Bus wire. It owns
// org.freedesktop.systemd1 and serves what imex-health and imex-peers call:
//   Manager  /org/freedesktop/systemd1: GetUnit(s)→o, LoadUnit(s)→o, Subscribe(), Unsubscribe(),
//            StartUnit(ss)→o, StopUnit(ss)→o, RestartUnit(ss)→o; signal JobRemoved(uoss)
//   Unit     /org/freedesktop/systemd1/unit/<escaped>: Id, LoadState, ActiveState, SubState,
//            UnitFileState (s), ActiveEnterTimestamp (t, µs since the epoch)
//   Service  same object: NRestarts (u), ExecMainStatus (i), ExecMainCode (i), MainPID (u), Result (s)
// Every state change emits PropertiesChanged with the new values, as systemd does.
// A test-only interface org.gnssim.FakeSystemd (same path as the Manager) drives failures:
//   Crash(s unit, i status, b restart): the main process exited with `status`; with restart the
//     unit comes back (NRestarts+1, as Restart=on-failure), without it the unit is failed.
//   SetUnitFileState(s unit, s state)
// Usage: gns-fake-systemd --address unix:path=… [--unit NAME[:inactive]]…   prints "ready".
#include <systemd/sd-bus.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr const char* kManagerPath = "/org/freedesktop/systemd1";
constexpr const char* kUnitPrefix = "/org/freedesktop/systemd1/unit";

struct Unit {
  std::string id;
  std::string path;
  std::string load_state = "loaded";
  std::string active_state = "inactive";
  std::string sub_state = "dead";
  std::string unit_file_state = "enabled";
  std::string result = "success";
  uint64_t active_enter_usec = 0;
  uint32_t n_restarts = 0;
  int32_t exec_main_status = 0;
  int32_t exec_main_code = 0;  // CLD_EXITED = 1 once a process exited
  uint32_t main_pid = 0;
  sd_bus_slot* unit_slot = nullptr;
  sd_bus_slot* service_slot = nullptr;
};

sd_bus* g_bus = nullptr;
std::map<std::string, std::unique_ptr<Unit>> g_units;
uint32_t g_next_job = 1;
uint32_t g_next_pid = 4000;

uint64_t NowUsec() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

int Append(sd_bus_message* reply, const char* sig, const std::string& value) {
  return sd_bus_message_append(reply, sig, value.c_str());
}
template <typename T>
int Append(sd_bus_message* reply, const char* sig, T value) {
  return sd_bus_message_append(reply, sig, value);
}

// One getter per property, reading the Unit the object was registered with (Unit is not
// standard-layout, so sd-bus's offset-based getters are not used).
#define UNIT_PROPERTY(name, sig, member)                                                     \
  SD_BUS_PROPERTY(name, sig,                                                                 \
                  [](sd_bus*, const char*, const char*, const char*, sd_bus_message* r, void* u, \
                     sd_bus_error*) { return Append(r, sig, static_cast<Unit*>(u)->member); }, \
                  0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE)
#define UNIT_STRING(name, member) UNIT_PROPERTY(name, "s", member)

const sd_bus_vtable kUnitVtable[] = {
    SD_BUS_VTABLE_START(0),
    UNIT_STRING("Id", id),
    UNIT_STRING("LoadState", load_state),
    UNIT_STRING("ActiveState", active_state),
    UNIT_STRING("SubState", sub_state),
    UNIT_STRING("UnitFileState", unit_file_state),
    UNIT_PROPERTY("ActiveEnterTimestamp", "t", active_enter_usec),
    SD_BUS_VTABLE_END};

const sd_bus_vtable kServiceVtable[] = {
    SD_BUS_VTABLE_START(0),
    UNIT_PROPERTY("NRestarts", "u", n_restarts),
    UNIT_PROPERTY("ExecMainStatus", "i", exec_main_status),
    UNIT_PROPERTY("ExecMainCode", "i", exec_main_code),
    UNIT_PROPERTY("MainPID", "u", main_pid),
    UNIT_STRING("Result", result),
    SD_BUS_VTABLE_END};

Unit* FindUnit(const std::string& name) {
  const auto it = g_units.find(name);
  return it == g_units.end() ? nullptr : it->second.get();
}

Unit* AddUnit(const std::string& name, bool loaded) {
  auto unit = std::make_unique<Unit>();
  unit->id = name;
  char* path = nullptr;
  if (sd_bus_path_encode(kUnitPrefix, name.c_str(), &path) < 0) return nullptr;
  unit->path = path;
  free(path);
  if (!loaded) {
    unit->load_state = "not-found";
    unit->unit_file_state = "";
  }
  Unit* raw = unit.get();
  sd_bus_add_object_vtable(g_bus, &raw->unit_slot, raw->path.c_str(), "org.freedesktop.systemd1.Unit", kUnitVtable,
                           raw);
  if (name.ends_with(".service")) {
    sd_bus_add_object_vtable(g_bus, &raw->service_slot, raw->path.c_str(), "org.freedesktop.systemd1.Service",
                             kServiceVtable, raw);
  }
  g_units.emplace(name, std::move(unit));
  return raw;
}

// The Service properties go first, so a client that reacts to ActiveState already has the
// exit status that goes with it.
void Changed(Unit& unit) {
  if (unit.service_slot) {
    sd_bus_emit_properties_changed(g_bus, unit.path.c_str(), "org.freedesktop.systemd1.Service", "NRestarts",
                                   "ExecMainStatus", "ExecMainCode", "MainPID", "Result", nullptr);
  }
  sd_bus_emit_properties_changed(g_bus, unit.path.c_str(), "org.freedesktop.systemd1.Unit", "ActiveState",
                                 "SubState", "ActiveEnterTimestamp", "UnitFileState", nullptr);
}

void Activate(Unit& unit) {
  unit.active_state = "active";
  unit.sub_state = "running";
  unit.result = "success";
  unit.main_pid = g_next_pid++;
  unit.active_enter_usec = NowUsec();
}

void Deactivate(Unit& unit) {
  unit.active_state = "inactive";
  unit.sub_state = "dead";
  unit.main_pid = 0;
}

int ReplyJob(sd_bus_message* m, const Unit& unit, const char* result) {
  const uint32_t id = g_next_job++;
  const std::string job = std::string(kManagerPath) + "/job/" + std::to_string(id);
  const int r = sd_bus_reply_method_return(m, "o", job.c_str());
  sd_bus_emit_signal(g_bus, kManagerPath, "org.freedesktop.systemd1.Manager", "JobRemoved", "uoss", id, job.c_str(),
                     unit.id.c_str(), result);
  return r;
}

Unit* LoadedUnit(sd_bus_message* m, sd_bus_error* error, const char** name_out) {
  const char* name = nullptr;
  const char* mode = nullptr;
  if (sd_bus_message_read(m, "ss", &name, &mode) < 0) {
    sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "expected (ss)");
    return nullptr;
  }
  *name_out = name;
  Unit* unit = FindUnit(name);
  if (!unit || unit->load_state != "loaded") {
    sd_bus_error_setf(error, "org.freedesktop.systemd1.NoSuchUnit", "Unit %s not found.", name);
    return nullptr;
  }
  return unit;
}

int MethodGetUnit(sd_bus_message* m, void*, sd_bus_error* error) {
  const char* name = nullptr;
  if (sd_bus_message_read(m, "s", &name) < 0) return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "expected s");
  Unit* unit = FindUnit(name);
  if (!unit) return sd_bus_error_setf(error, "org.freedesktop.systemd1.NoSuchUnit", "Unit %s not loaded.", name);
  return sd_bus_reply_method_return(m, "o", unit->path.c_str());
}

int MethodLoadUnit(sd_bus_message* m, void*, sd_bus_error* error) {
  const char* name = nullptr;
  if (sd_bus_message_read(m, "s", &name) < 0) return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "expected s");
  Unit* unit = FindUnit(name);
  if (!unit) unit = AddUnit(name, false);
  if (!unit) return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "bad unit name %s", name);
  return sd_bus_reply_method_return(m, "o", unit->path.c_str());
}

int MethodEmpty(sd_bus_message* m, void*, sd_bus_error*) { return sd_bus_reply_method_return(m, ""); }

int MethodStart(sd_bus_message* m, void*, sd_bus_error* error) {
  const char* name = nullptr;
  Unit* unit = LoadedUnit(m, error, &name);
  if (!unit) return -ENOENT;
  if (unit->active_state != "active") {
    Activate(*unit);
    Changed(*unit);
  }
  return ReplyJob(m, *unit, "done");
}

int MethodStop(sd_bus_message* m, void*, sd_bus_error* error) {
  const char* name = nullptr;
  Unit* unit = LoadedUnit(m, error, &name);
  if (!unit) return -ENOENT;
  Deactivate(*unit);
  Changed(*unit);
  return ReplyJob(m, *unit, "done");
}

int MethodRestart(sd_bus_message* m, void*, sd_bus_error* error) {
  const char* name = nullptr;
  Unit* unit = LoadedUnit(m, error, &name);
  if (!unit) return -ENOENT;
  Activate(*unit);  // a manual restart does not count in NRestarts (only Restart= does)
  Changed(*unit);
  return ReplyJob(m, *unit, "done");
}

int MethodCrash(sd_bus_message* m, void*, sd_bus_error* error) {
  const char* name = nullptr;
  int32_t status = 0;
  int restart = 0;
  if (sd_bus_message_read(m, "sib", &name, &status, &restart) < 0) {
    return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "expected (sib)");
  }
  Unit* unit = FindUnit(name);
  if (!unit) return sd_bus_error_setf(error, "org.freedesktop.systemd1.NoSuchUnit", "Unit %s not loaded.", name);
  unit->exec_main_status = status;
  unit->exec_main_code = 1;
  if (restart) {
    ++unit->n_restarts;
    Activate(*unit);
  } else {
    unit->active_state = "failed";
    unit->sub_state = "failed";
    unit->result = "exit-code";
    unit->main_pid = 0;
  }
  Changed(*unit);
  return sd_bus_reply_method_return(m, "");
}

int MethodSetUnitFileState(sd_bus_message* m, void*, sd_bus_error* error) {
  const char* name = nullptr;
  const char* state = nullptr;
  if (sd_bus_message_read(m, "ss", &name, &state) < 0) {
    return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "expected (ss)");
  }
  Unit* unit = FindUnit(name);
  if (!unit) return sd_bus_error_setf(error, "org.freedesktop.systemd1.NoSuchUnit", "Unit %s not loaded.", name);
  unit->unit_file_state = state;
  Changed(*unit);
  return sd_bus_reply_method_return(m, "");
}

const sd_bus_vtable kManagerVtable[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_METHOD("GetUnit", "s", "o", MethodGetUnit, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_METHOD("LoadUnit", "s", "o", MethodLoadUnit, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_METHOD("Subscribe", "", "", MethodEmpty, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_METHOD("Unsubscribe", "", "", MethodEmpty, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_METHOD("StartUnit", "ss", "o", MethodStart, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_METHOD("StopUnit", "ss", "o", MethodStop, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_METHOD("RestartUnit", "ss", "o", MethodRestart, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_SIGNAL("JobRemoved", "uoss", 0),
    SD_BUS_VTABLE_END};

const sd_bus_vtable kControlVtable[] = {
    SD_BUS_VTABLE_START(0),
    SD_BUS_METHOD("Crash", "sib", "", MethodCrash, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_METHOD("SetUnitFileState", "ss", "", MethodSetUnitFileState, SD_BUS_VTABLE_UNPRIVILEGED),
    SD_BUS_VTABLE_END};

int Fail(const char* what, int r) {
  std::fprintf(stderr, "gns-fake-systemd: %s: %s\n", what, std::strerror(-r));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string address;
  std::vector<std::pair<std::string, bool>> units;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--address" && i + 1 < argc) {
      address = argv[++i];
    } else if (arg == "--unit" && i + 1 < argc) {
      std::string spec = argv[++i];
      bool active = true;
      if (spec.ends_with(":inactive")) {
        spec.resize(spec.size() - 9);
        active = false;
      }
      units.emplace_back(spec, active);
    } else {
      std::fprintf(stderr, "usage: gns-fake-systemd --address ADDRESS [--unit NAME[:inactive]]...\n");
      return 2;
    }
  }
  if (address.empty()) {
    if (const char* env = std::getenv("DBUS_SYSTEM_BUS_ADDRESS")) address = env;
  }
  if (address.empty()) {
    std::fprintf(stderr, "gns-fake-systemd: no --address and no DBUS_SYSTEM_BUS_ADDRESS\n");
    return 2;
  }
  int r = sd_bus_new(&g_bus);
  if (r < 0) return Fail("sd_bus_new", r);
  sd_bus_set_address(g_bus, address.c_str());
  sd_bus_set_bus_client(g_bus, 1);
  r = sd_bus_start(g_bus);
  if (r < 0) return Fail(("connect " + address).c_str(), r);
  for (const auto& [name, active] : units) {
    Unit* unit = AddUnit(name, true);
    if (!unit) return Fail(("unit " + name).c_str(), -EINVAL);
    if (active) Activate(*unit);
  }
  r = sd_bus_add_object_vtable(g_bus, nullptr, kManagerPath, "org.freedesktop.systemd1.Manager", kManagerVtable,
                               nullptr);
  if (r < 0) return Fail("manager vtable", r);
  r = sd_bus_add_object_vtable(g_bus, nullptr, kManagerPath, "org.gnssim.FakeSystemd", kControlVtable, nullptr);
  if (r < 0) return Fail("control vtable", r);
  r = sd_bus_request_name(g_bus, "org.freedesktop.systemd1", 0);
  if (r < 0) return Fail("request name org.freedesktop.systemd1", r);
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) {
    r = sd_bus_process(g_bus, nullptr);
    if (r < 0) return Fail("process", r);
    if (r > 0) continue;
    r = sd_bus_wait(g_bus, UINT64_MAX);
    if (r < 0 && r != -EINTR) return Fail("wait", r);
  }
}
