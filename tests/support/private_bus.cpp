// A private system bus with the fake systemd: see private_bus.hpp.
#include "support/private_bus.hpp"

#include <systemd/sd-bus.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string.h>
#include <unistd.h>

namespace gns::test {
namespace {

std::string FakeSystemdBinary() {
  const char* dir = std::getenv("GNS_BINARY_DIR");
  return std::string(dir ? dir : ".") + "/tools/sim/systemd/gns-fake-systemd";
}

std::string CallOn(const std::string& address, const char* interface, const char* method,
                   const std::function<int(sd_bus_message*)>& append) {
  sd_bus* bus = nullptr;
  int r = sd_bus_new(&bus);
  if (r >= 0) r = sd_bus_set_address(bus, address.c_str());
  if (r >= 0) r = sd_bus_set_bus_client(bus, 1);
  if (r >= 0) r = sd_bus_start(bus);
  if (r < 0) {
    sd_bus_unref(bus);
    return std::string("connect: ") + strerror(-r);
  }
  sd_bus_message* m = nullptr;
  sd_bus_message* reply = nullptr;
  sd_bus_error error = SD_BUS_ERROR_NULL;
  r = sd_bus_message_new_method_call(bus, &m, "org.freedesktop.systemd1", "/org/freedesktop/systemd1", interface, method);
  if (r >= 0) r = append(m);
  if (r >= 0) r = sd_bus_call(bus, m, 10'000'000, &error, &reply);
  std::string out = r >= 0 ? "" : std::string(error.message ? error.message : strerror(-r));
  sd_bus_error_free(&error);
  sd_bus_message_unref(reply);
  sd_bus_message_unref(m);
  sd_bus_flush_close_unref(bus);
  return out;
}

}  // namespace

PrivateBus::PrivateBus(std::string dir) : dir_(std::move(dir)), socket_(dir_ + "/bus.sock") {
  std::ofstream conf(dir_ + "/bus.conf");
  conf << "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\"\n"
          " \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n"
          "<busconfig>\n  <type>system</type>\n  <listen>unix:path="
       << socket_
       << "</listen>\n  <auth>EXTERNAL</auth>\n  <policy context=\"default\">\n"
          "    <allow user=\"*\"/>\n    <allow own=\"*\"/>\n    <allow send_destination=\"*\"/>\n"
          "    <allow receive_sender=\"*\"/>\n  </policy>\n</busconfig>\n";
}

PrivateBus::~PrivateBus() {
  StopSystemd();
  StopBus();
}

bool PrivateBus::Available() {
  return ::access("/usr/bin/dbus-daemon", X_OK) == 0 && ::access(FakeSystemdBinary().c_str(), X_OK) == 0;
}

void PrivateBus::StartBus() {
  ::unlink(socket_.c_str());
  daemon_ = std::make_unique<Subprocess>(std::vector<std::string>{
      "/usr/bin/dbus-daemon", "--config-file=" + dir_ + "/bus.conf", "--nofork", "--print-address=1", "--nopidfile"});
  ASSERT_TRUE(daemon_->WaitForLine("unix:path=")) << daemon_->Output();
}

void PrivateBus::StopBus() {
  if (!daemon_) return;
  daemon_->Signal(SIGTERM);
  daemon_->Wait();
  daemon_.reset();
}

void PrivateBus::StartSystemd(const std::vector<std::string>& units) {
  units_ = units;
  std::vector<std::string> argv{FakeSystemdBinary(), "--address", Address()};
  for (const auto& unit : units) {
    argv.push_back("--unit");
    argv.push_back(unit);
  }
  systemd_ = std::make_unique<Subprocess>(argv);
  ASSERT_TRUE(systemd_->WaitForLine("ready")) << systemd_->Output();
}

void PrivateBus::StopSystemd() {
  if (!systemd_) return;
  systemd_->Signal(SIGTERM);
  systemd_->Wait();
  systemd_.reset();
}

std::string PrivateBus::ManagerCall(const std::string& method, const std::string& unit) {
  return CallOn(Address(), "org.freedesktop.systemd1.Manager", method.c_str(), [&](sd_bus_message* m) {
    return sd_bus_message_append(m, "ss", unit.c_str(), "replace");
  });
}

std::string PrivateBus::Crash(const std::string& unit, int status, bool restart) {
  return CallOn(Address(), "org.gnssim.FakeSystemd", "Crash", [&](sd_bus_message* m) {
    return sd_bus_message_append(m, "sib", unit.c_str(), status, restart ? 1 : 0);
  });
}

std::string PrivateBus::Property(const std::string& unit, const std::string& interface, const std::string& name) {
  sd_bus* bus = nullptr;
  int r = sd_bus_new(&bus);
  if (r >= 0) r = sd_bus_set_address(bus, Address().c_str());
  if (r >= 0) r = sd_bus_set_bus_client(bus, 1);
  if (r >= 0) r = sd_bus_start(bus);
  if (r < 0) {
    sd_bus_unref(bus);
    return "error: connect";
  }
  char* path = nullptr;
  sd_bus_path_encode("/org/freedesktop/systemd1/unit", unit.c_str(), &path);
  sd_bus_error error = SD_BUS_ERROR_NULL;
  char* value = nullptr;
  std::string out;
  r = sd_bus_get_property_string(bus, "org.freedesktop.systemd1", path, interface.c_str(), name.c_str(), &error, &value);
  out = r >= 0 ? std::string(value) : "error: " + std::string(error.message ? error.message : strerror(-r));
  free(value);
  free(path);
  sd_bus_error_free(&error);
  sd_bus_flush_close_unref(bus);
  return out;
}

}  // namespace gns::test
