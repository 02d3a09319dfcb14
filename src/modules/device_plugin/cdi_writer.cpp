// CDI spec file upkeep.
#include "modules/device_plugin/cdi_writer.hpp"

#include "loop/atomic_file.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

namespace gns::device_plugin {

namespace {

struct WriteOutcome {
  bool wrote = false;
  std::string text;
  std::string error;
  std::vector<std::string> warnings;
};

}  // namespace

CdiWriter::CdiWriter(ModuleContext& context, Settings settings, std::function<void()> changed)
    : context_(context), settings_(std::move(settings)), changed_(std::move(changed)) {
  status_.path = settings_.dir + "/" + CdiSpecFileName(settings_.spec.kind);
}

CdiWriter::~CdiWriter() { lifetime_.Close(); }

void CdiWriter::Update(std::vector<PhysicalDevice> devices) {
  if (!settings_.enabled || stopped_) return;
  if (have_wanted_ && devices == wanted_) return;
  wanted_ = std::move(devices);
  have_wanted_ = true;
  WriteNext();
}

void CdiWriter::WriteNext() {
  if (in_flight_ || stopped_) return;
  in_flight_ = true;
  auto devices = wanted_;
  const std::size_t count = devices.size();
  context_.Pool().Run(
      [settings = settings_, path = status_.path, devices = std::move(devices), written = written_,
       host_root = context_.Site().paths.host_root]() {
        WriteOutcome out;
        const CdiHostFacts facts = DiscoverCdiHostFacts(host_root, settings.spec);
        out.warnings = facts.warnings;
        out.text = BuildCdiSpec(settings.spec, devices, facts).dump(2) + "\n";
        if (out.text == written) return out;
        std::string mkdir_error;
        // Runtimes read it: 0755 whatever the umask (WriteFileAtomically reports a failure).
        EnsureDirectory(settings.dir, 0755, mkdir_error);
        // Runtimes read the spec as root; 0644 as nvidia-ctk writes it (no secrets in it).
        const auto result = WriteFileAtomically(path, out.text, 0644);
        if (!result) out.error = result.error;
        else out.wrote = true;
        return out;
      },
      lifetime_.Guard([this, wanted = wanted_, count](WriteOutcome out, std::exception_ptr error) {
        in_flight_ = false;
        if (error) out.error = "CDI spec write threw";
        for (const auto& w : out.warnings) context_.Log().warn("CDI spec: {}", w);
        if (!out.error.empty()) {
          context_.Log().error("cannot write the CDI spec: {}", out.error);
          status_.last_error = out.error;
        } else {
          status_.last_error.clear();
          if (out.wrote) {
            written_ = out.text;
            ++status_.writes;
            status_.devices = count;
            context_.Log().info("CDI spec {} written: {} devices", status_.path, count);
          }
        }
        if (stopped_) {
          if (stop_done_) Remove(std::exchange(stop_done_, nullptr));  // Stop waited for this write
          return;
        }
        if (changed_) changed_();
        // A change that came in meanwhile.
        if (wanted != wanted_) WriteNext();
      }));
}

void CdiWriter::Stop(std::function<void()> done) {
  stopped_ = true;
  if (!settings_.enabled || !settings_.remove_on_stop) {
    done();
    return;
  }
  if (in_flight_) {
    stop_done_ = std::move(done);  // removed once the write in flight is done
    return;
  }
  Remove(std::move(done));
}

void CdiWriter::Remove(std::function<void()> done) {
  context_.Pool().Run(
      [path = status_.path]() -> std::string {
        if (::unlink(path.c_str()) != 0 && errno != ENOENT) return "unlink " + path + ": " + std::strerror(errno);
        return {};
      },
      [this, alive = lifetime_.Watch(), done = std::move(done)](std::string error, std::exception_ptr) {
        if (alive && !error.empty()) context_.Log().warn("cannot remove the CDI spec: {}", error);
        done();
      });
}

}  // namespace gns::device_plugin
