#pragma once
// Keeps our CDI spec file in step with the advertised devices: on each change of the device
// set it reads the host (pool), builds the spec, and writes it atomically only when its text
// changed; one write in flight, a change during it is written next. Removes the file at stop
// when configured.

#include "loop/gate.hpp"
#include "loop/module.hpp"
#include "modules/device_plugin/cdi_spec.hpp"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gns::device_plugin {

class CdiWriter {
 public:
  struct Settings {
    bool enabled = false;
    std::string dir;  // the CDI directory (/var/run/cdi)
    CdiSettings spec;
    bool remove_on_stop = false;
  };
  struct Status {
    std::string path;
    int writes = 0;          // files written (not counting unchanged specs)
    std::string last_error;  // empty when the last attempt succeeded
    std::size_t devices = 0;
  };

  CdiWriter(ModuleContext& context, Settings settings, std::function<void()> changed);
  ~CdiWriter();

  // The devices to describe (each physical device once).
  void Update(std::vector<PhysicalDevice> devices);
  // Removes the file when configured (on the pool); `done` on the loop.
  void Stop(std::function<void()> done);
  const Status& GetStatus() const { return status_; }
  bool Enabled() const { return settings_.enabled; }

 private:
  void WriteNext();
  void Remove(std::function<void()> done);

  ModuleContext& context_;
  Settings settings_;
  std::function<void()> changed_;
  Status status_;
  std::vector<PhysicalDevice> wanted_;
  bool have_wanted_ = false;
  bool in_flight_ = false;
  bool stopped_ = false;
  std::function<void()> stop_done_;
  std::string written_;  // the text on disk, as we last wrote it
  Gate lifetime_;
};

}  // namespace gns::device_plugin
