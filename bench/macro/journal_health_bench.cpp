// Issue #7 figures, in one process:
//  (a) parse + classify rate beside raw journal iteration of the same real journal file (written
//      by Debian's systemd-journal-remote: kernel lines, mixed NVRM Xid variants and noise),
//      alternated in the same run: raw = sd_journal_next + sd_journal_get_data("MESSAGE");
//      classify = the same iteration + the entry's realtime stamp + ParseKernelLine + PCI → GPU
//      (GpuDirectory) + XidPolicy::Decide (catalog and site policy), the calls gpu-health makes
//      for a kernel line up to its decision. Target ≥ 0.8× raw;
//  (b) journal append → Unhealthy at the kubelet simulator: the real journald, gpu-health and
//      device-plugin modules on their own loop thread (the inventory of gpus-8.json published on
//      the bus), the kubelet simulator on its threads, a long-running systemd-journal-remote fed
//      through a pipe so appends are live. An XID 48 line is appended for one GPU, stamped just
//      before the write, and measured until the ListAndWatch update that marks that GPU
//      Unhealthy is read by the simulator (its `received` stamp); then a reset acknowledgement
//      (SYSLOG_IDENTIFIER=gpu-reset) until Healthy; rounds alternate over the GPUs. Target p99
//      ≤ 5 ms;
//  (c) memory under a flood of identical Xid KernelLine messages pushed through gpu-health on the
//      bus: VmRSS / RssAnon before and after (the process settles first), events emitted.
//
//   journal_health_bench --catalog config/xid-catalog.yaml --gpus tools/sim/fake_nvml/gpus-8.json
//                        [--lines N] [--passes N] [--rounds N] [--flood N]
#include "bench_util.hpp"
#include "journal_writer.h"
#include "kubelet_sim.h"
#include "loop/blocking_pool.hpp"
#include "loop/bus.hpp"
#include "loop/clock.hpp"
#include "loop/logging.hpp"
#include "loop/loop.hpp"
#include "loop/metrics_registry.hpp"
#include "loop/services.hpp"
#include "modules/device_plugin/device_plugin_module.hpp"
#include "modules/gpu_health/gpu_directory.hpp"
#include "modules/gpu_health/gpu_health_module.hpp"
#include "modules/gpu_health/kernel_line_parser.hpp"
#include "modules/gpu_health/messages.hpp"
#include "modules/gpu_health/xid_catalog.hpp"
#include "modules/gpu_health/xid_policy.hpp"
#include "modules/gpu_inventory/messages.hpp"
#include "modules/journald/journald_module.hpp"
#include "modules/journald/messages.hpp"

#include <nlohmann/json.hpp>
#include <systemd/sd-journal.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::seconds;

namespace {

using gns::bench::Ms;
using gns::bench::OnLoop;
using gns::bench::Report;

double Secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "journal_health_bench: %s\n", why.c_str());
  std::exit(1);
}

// "VmRSS" / "RssAnon" of this process, in KiB.
long StatusKiB(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return std::atol(line.c_str() + prefix.size());
  }
  return -1;
}

struct Gpu {
  std::string uuid;
  std::string pci;  // as Xid lines print it: "0000:18:00"
};

std::vector<Gpu> LoadGpus(const std::string& path, gns::gpu_inventory::GpuInventory& inventory) {
  std::ifstream in(path);
  if (!in) Fail("cannot read " + path);
  const auto doc = nlohmann::json::parse(in);
  std::vector<Gpu> gpus;
  inventory.available = true;
  inventory.driver_version = doc.value("driverVersion", "");
  uint32_t index = 0;
  for (const auto& g : doc.at("gpus")) {
    gns::gpu_inventory::GpuInfo info;
    info.index = index++;
    info.uuid = g.at("uuid").get<std::string>();
    info.name = g.value("name", "");
    info.pci_bus_id = g.at("pciBusId").get<std::string>();
    const auto pci = gns::gpu_inventory::PciAddress::Parse(info.pci_bus_id);
    if (!pci) Fail("bad pciBusId " + info.pci_bus_id);
    info.pci = *pci;
    info.minor = g.value("minor", info.index);
    info.memory_total_bytes = g.value("memoryTotalBytes", uint64_t{0});
    info.numa_node = g.value("numaNode", -1);
    inventory.gpus.push_back(info);
    std::string text = pci->ToString();  // "0000:18:00.0"
    gpus.push_back({info.uuid, text.substr(0, text.rfind('.'))});
  }
  if (gpus.empty()) Fail("no GPUs in " + path);
  return gpus;
}

std::string Replace(std::string text, const std::string& what, const std::string& with) {
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + with.size())) {
    text.replace(at, what.size(), with);
  }
  return text;
}

// Line i of the synthetic kernel log: a quarter NVRM Xid lines (every variant of WIRE-FACTS §9.3
// over the GPUs), an occasional "GPU at PCI" line, the rest ordinary kernel noise.
std::string KernelMessage(std::size_t i, const std::vector<Gpu>& gpus) {
  static const char* const kXids[] = {
      "NVRM: Xid (PCI:{pci}): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has "
      "been detected on GPU in the framebuffer at partition 6, subpartition 0.",
      "NVRM: Xid (PCI:{pci}): 13, pid=4242, name=train.py, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): "
      "Out Of Range Address",
      "NVRM: Xid (PCI:{pci} GPU-I:05): 31, pid=12345, name=python, Ch 00000008, intr 00000000. MMU Fault: ENGINE "
      "GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
      "NVRM: Xid (PCI:{pci} GPU-I:01 GPU-CI:02): 13, pid=4242, name=train.py, Graphics Exception: ESR "
      "0x514730=0x1000a 0x514734=0x0",
      "NVRM: Xid (PCI:{pci}): 79, pid=1, name=python3, GPU has fallen off the bus.",
      "NVRM: Xid (PCI:{pci}): 32, Channel ID 00000009 intr 00800000",
      "NVRM: Xid (PCI:{pci}): 63, pid=1896, Row Remapper: New row marked for remapping, reboot system to activate.",
      "NVRM: Xid (PCI:{pci}): 94, pid=5, name=a, Contained: SM (0x1). RST: No, D-RST: No",
      "NVRM: Xid (PCI:{pci}): 999, pid='<unknown>', name=<unknown>, an XID newer than the catalog",
      "[ 1234.567890] NVRM: Xid (PCI:{pci}): 43, pid=77, name=cuda_app, Ch 00000010",
  };
  static const char* const kNoise[] = {
      "usb 1-1.4: new high-speed USB device number 5 using xhci_hcd",
      "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
      "audit: type=1400 audit(1700000000.123:456): apparmor=\"STATUS\" operation=\"profile_load\" "
      "profile=\"unconfined\" name=\"nvidia_modprobe\" pid=1234 comm=\"apparmor_parser\"",
      "mlx5_core 0000:0c:00.0: mlx5_pcie_event:301:(pid 0): PCIe slot advertised sufficient power (75W).",
      "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07  Tue May 21 09:15:32 UTC 2024",
      "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  550.90.07",
      "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
      "perf: interrupt took too long (2503 > 2500), lowering kernel.perf_event_max_sample_rate to 79750",
  };
  const Gpu& gpu = gpus[(i / 40) % gpus.size()];
  if (i % 4 == 0) return Replace(kXids[(i / 4) % std::size(kXids)], "{pci}", gpu.pci);
  if (i % 64 == 1) return gns::sim::GpuUuidMessage(gpu.pci, gpu.uuid);
  return kNoise[i % std::size(kNoise)];
}

// sd_journal_get_data's "MESSAGE=..." without the field name.
bool Message(sd_journal* j, std::string_view& out) {
  const void* data = nullptr;
  size_t length = 0;
  if (sd_journal_get_data(j, "MESSAGE", &data, &length) < 0) return false;
  out = std::string_view(static_cast<const char*>(data), length);
  out.remove_prefix(std::min<std::size_t>(out.size(), 8));  // "MESSAGE="
  return true;
}

struct PassResult {
  std::size_t entries = 0;
  double seconds = 0;
  uint64_t checksum = 0;
  std::size_t verdicts[5] = {};  // by Verdict (kDuplicate never: one source)
  std::size_t unrelated = 0;
  std::size_t malformed = 0;
};

PassResult RawPass(sd_journal* j) {
  PassResult r;
  const auto start = Clock::now();
  if (sd_journal_seek_head(j) < 0) Fail("sd_journal_seek_head");
  std::string_view message;
  while (sd_journal_next(j) > 0) {
    if (Message(j, message)) r.checksum += message.size();
    ++r.entries;
  }
  r.seconds = Secs(Clock::now() - start);
  return r;
}

// What gpu-health does with one kernel line, minus publishing: the module's own calls
// (GpuHealthModule::OnKernelLine → HandleXid) up to the policy's decision; the metrics,
// events and DeviceHealth that follow a decision are left out.
PassResult ClassifyPass(sd_journal* j, gns::gpu_health::XidPolicy& policy,
                        const gns::gpu_inventory::GpuInventory& inventory) {
  using namespace gns::gpu_health;
  PassResult r;
  GpuDirectory directory;  // PCI → UUID: the inventory, then what the kernel log teaches
  directory.SetInventory(inventory.gpus);
  const auto start = Clock::now();
  if (sd_journal_seek_head(j) < 0) Fail("sd_journal_seek_head");
  std::string_view message;
  while (sd_journal_next(j) > 0) {
    ++r.entries;
    if (!Message(j, message)) continue;
    r.checksum += message.size();
    uint64_t realtime = 0;
    sd_journal_get_realtime_usec(j, &realtime);
    const Timestamp at(static_cast<int64_t>(realtime));
    const ParsedLine parsed = ParseKernelLine(message);
    switch (parsed.kind()) {
      case LineKind::kUnrelated:
        ++r.unrelated;
        break;
      case LineKind::kXid: {
        const XidLine& x = *parsed.xid();
        const XidSubject who = directory.SubjectFor(x.pci);
        ++r.verdicts[static_cast<int>(policy.Decide(who.policy_id(), x.xid, at).verdict)];
        break;
      }
      case LineKind::kGpuUuid:
        directory.Learn(parsed.gpu_uuid()->pci, parsed.gpu_uuid()->uuid);
        break;
      case LineKind::kFallenOffBus:
        if (parsed.fallen_off_bus()->pci) {
          const XidSubject who = directory.SubjectFor(*parsed.fallen_off_bus()->pci);
          ++r.verdicts[static_cast<int>(policy.Decide(who.policy_id(), 79, at).verdict)];
        }
        break;
      case LineKind::kResetAck: {  // HandleResetAck's policy part (a successful reset)
        const std::string& uuid = parsed.reset_ack()->uuid;
        policy.ForgetGpu(uuid);
        if (const std::string pci = directory.PciForUuid(uuid); !pci.empty()) policy.ForgetGpu(PciPolicyId(pci));
        break;
      }
      case LineKind::kMalformed:
        ++r.malformed;
        break;
      case LineKind::kSxid:  // the NVSwitch's: counted by the judge, no XID policy decision
        ++r.unrelated;
        break;
    }
  }
  r.seconds = Secs(Clock::now() - start);
  return r;
}

// A long-running systemd-journal-remote reading export text from a pipe: appends are live.
class LiveJournal {
 public:
  explicit LiveJournal(gns::sim::JournalWriter& writer) : writer_(writer) {
    const std::string command = std::string(gns::sim::kJournalRemote) + " --output=" + writer.Path() + " - 2>/dev/null";
    pipe_ = ::popen(command.c_str(), "w");
    if (pipe_ == nullptr) Fail("popen " + command);
  }
  ~LiveJournal() { Close(); }
  // Writes and flushes one entry; returns the steady_clock stamp taken just before the write.
  Clock::time_point Append(const gns::sim::JournalEntry& entry) {
    std::string text;
    writer_.AppendExport(text, entry);
    const auto at = Clock::now();
    if (std::fwrite(text.data(), 1, text.size(), pipe_) != text.size() || std::fflush(pipe_) != 0) {
      Fail("writing to systemd-journal-remote");
    }
    return at;
  }
  void Close() {
    if (pipe_ != nullptr) ::pclose(pipe_);
    pipe_ = nullptr;
  }

 private:
  gns::sim::JournalWriter& writer_;
  FILE* pipe_ = nullptr;
};

// The `received` stamp of the first ListAndWatch update of the trailing run in which `uuid` has
// `health`.
Clock::time_point SeenAt(const gns::sim::KubeletSim& kubelet, const std::string& resource, const std::string& uuid,
                         const std::string& health) {
  const auto state = kubelet.Resource(resource);
  Clock::time_point seen{};
  for (auto it = state->updates.rbegin(); it != state->updates.rend(); ++it) {
    const auto found = std::find_if(it->devices.begin(), it->devices.end(), [&](const auto& d) { return d.id == uuid; });
    if (found != it->devices.end() && found->health == health) seen = it->received;
    else break;
  }
  return seen;
}

}  // namespace

int main(int argc, char** argv) {
  std::string catalog_path, gpus_path;
  long lines = 200000, flood = 1000000;
  int passes = 3, rounds = 100;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--catalog" && i + 1 < argc) catalog_path = argv[++i];
    else if (a == "--gpus" && i + 1 < argc) gpus_path = argv[++i];
    else if (a == "--lines" && i + 1 < argc) lines = std::atol(argv[++i]);
    else if (a == "--passes" && i + 1 < argc) passes = std::atoi(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (a == "--flood" && i + 1 < argc) flood = std::atol(argv[++i]);
    else catalog_path.clear(), gpus_path.clear(), i = argc;
  }
  if (catalog_path.empty() || gpus_path.empty() || lines < 1 || passes < 1 || rounds < 1 || flood < 1) {
    std::fprintf(stderr, "usage: journal_health_bench --catalog YAML --gpus JSON [--lines N] [--passes N] "
                         "[--rounds N] [--flood N]\n");
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);  // a dead journal-remote is a write error, not a silent exit
  gns::LoggingConfig logging;
  logging.level = spdlog::level::err;  // the figures, not a flood of XID warnings
  gns::SetupLogging(logging);
  gns::gpu_health::GpuHealthModule::Config health_config;
  health_config.catalog_path = catalog_path;
  health_config.catalog = gns::gpu_health::XidCatalog::LoadFile(catalog_path);
  gns::gpu_inventory::GpuInventory inventory;
  const std::vector<Gpu> gpus = LoadGpus(gpus_path, inventory);

  char tmpl[] = "/tmp/gnsbench-XXXXXX";  // unix socket paths must stay short
  const std::string dir = ::mkdtemp(tmpl);

  // ---- (a) parse + classify beside raw iteration of the same journal file
  {
    const std::string journal_dir = dir + "/static";
    fs::create_directories(journal_dir);
    gns::sim::JournalWriter writer(journal_dir, "kernel.journal");
    std::vector<gns::sim::JournalEntry> entries;
    entries.reserve(static_cast<std::size_t>(lines));
    for (long i = 0; i < lines; ++i) {
      entries.push_back(gns::sim::JournalWriter::Kernel(KernelMessage(static_cast<std::size_t>(i), gpus)));
    }
    const auto write_start = Clock::now();
    writer.Append(entries);
    const double write_s = Secs(Clock::now() - write_start);
    entries.clear();
    entries.shrink_to_fit();
    std::uintmax_t bytes = 0;
    for (const auto& f : fs::directory_iterator(journal_dir)) bytes += f.file_size();

    sd_journal* j = nullptr;
    if (sd_journal_open_directory(&j, journal_dir.c_str(), 0) < 0) Fail("sd_journal_open_directory " + journal_dir);
    sd_journal_add_match(j, "_TRANSPORT=kernel", 0);  // as the journald module matches kernel lines
    RawPass(j);  // warm the page cache and the mmaps
    double raw_best = 0, classify_best = 0;
    PassResult raw, classified;
    for (int pass = 0; pass < passes; ++pass) {
      raw = RawPass(j);
      gns::gpu_health::XidPolicy policy(health_config.catalog, health_config.overrides);
      classified = ClassifyPass(j, policy, inventory);
      if (raw.entries != static_cast<std::size_t>(lines) || classified.entries != raw.entries ||
          classified.checksum != raw.checksum) {
        Fail("the passes saw " + std::to_string(raw.entries) + " / " + std::to_string(classified.entries) +
             " entries, " + std::to_string(lines) + " written");
      }
      raw_best = std::max(raw_best, raw.entries / raw.seconds);
      classify_best = std::max(classify_best, classified.entries / classified.seconds);
    }
    sd_journal_close(j);
    using gns::gpu_health::Verdict;
    std::printf("journal of %ld kernel lines (%.1f MB on disk, written by systemd-journal-remote in %.2f s): "
                "%zu Xid decisions (fatal %zu, non-fatal %zu, below threshold %zu, ignored %zu), %zu malformed\n",
                lines, static_cast<double>(bytes) / 1e6, write_s,
                classified.verdicts[0] + classified.verdicts[1] + classified.verdicts[2] + classified.verdicts[3],
                classified.verdicts[static_cast<int>(Verdict::kFatal)],
                classified.verdicts[static_cast<int>(Verdict::kNonFatal)],
                classified.verdicts[static_cast<int>(Verdict::kBelowThreshold)],
                classified.verdicts[static_cast<int>(Verdict::kIgnored)], classified.malformed);
    std::printf("raw sd_journal_next + sd_journal_get_data(MESSAGE): %.0f lines/s; + realtime stamp + "
                "ParseKernelLine + PCI->GPU + XidPolicy: %.0f lines/s (best of %d passes each, alternated)\n",
                raw_best, classify_best, passes);
    std::printf("parse+classify/raw rate ratio: %.2fx (target >= 0.8x)\n", classify_best / raw_best);
    std::fflush(stdout);
    fs::remove_all(journal_dir);
  }

  // ---- (b) journal append → Unhealthy at the kubelet simulator, and back
  gns::Loop loop;
  gns::SystemClock clock;
  gns::Bus bus(loop);
  gns::MetricsRegistry metrics;
  gns::Services services;
  gns::SiteConfig site;
  site.node_name = "bench";
  site.paths.kubelet_dir = dir + "/kubelet";
  site.paths.host_root = dir + "/host";
  site.paths.state_dir = dir + "/state";
  fs::create_directories(site.paths.kubelet_dir);
  fs::create_directories(site.paths.state_dir);
  const std::string live_dir = dir + "/live";  // journal files only
  fs::create_directories(live_dir);
  gns::sim::JournalWriter writer(live_dir, "live.journal");
  writer.Append(gns::sim::JournalWriter::Kernel("Linux version 6.1.0-bench"));
  LiveJournal live(writer);

  gns::BlockingPool pool(loop, 2);
  gns::bench::LoopThread loop_thread(loop, pool);
  gns::sim::KubeletSimOptions options;
  options.kubelet_dir = site.paths.kubelet_dir;
  gns::sim::KubeletSim kubelet(options);
  kubelet.Start();

  const gns::RuntimeParts parts{loop, bus, pool, clock, site, metrics, services};
  auto report_failure = [](std::string why) { std::fprintf(stderr, "module failure: %s\n", why.c_str()); };
  auto ignore_health = [](gns::ModuleHealth, std::string) {};
  std::unique_ptr<gns::ModuleContext> plugin_context, health_context, journal_context;
  std::unique_ptr<gns::Module> plugin, health, journal;
  OnLoop(loop, [&] {
    bus.Publish(inventory);
    plugin_context = std::make_unique<gns::ModuleContext>(parts, "device-plugin", report_failure, ignore_health);
    health_context = std::make_unique<gns::ModuleContext>(parts, "gpu-health", report_failure, ignore_health);
    journal_context = std::make_unique<gns::ModuleContext>(parts, "journald", report_failure, ignore_health);
    gns::device_plugin::DevicePluginModule::Config plugin_config;
    plugin = std::make_unique<gns::device_plugin::DevicePluginModule>(*plugin_context, plugin_config);
    health = std::make_unique<gns::gpu_health::GpuHealthModule>(*health_context, health_config);
    gns::journald::JournaldModule::Config journal_config;
    journal_config.directory = live_dir;
    journal = std::make_unique<gns::journald::JournaldModule>(*journal_context, journal_config);
    plugin->Start();
    health->Start();
    journal->Start();
  });

  const std::string resource = "nvidia.com/gpu";
  if (!kubelet.WaitForDevices(resource, [&](const auto& d) {
        return d.size() == gpus.size() &&
               std::all_of(d.begin(), d.end(), [](const auto& x) { return x.health == "Healthy"; });
      }, seconds(30))) {
    Fail("the kubelet simulator never saw " + std::to_string(gpus.size()) + " healthy GPUs");
  }

  std::vector<double> to_unhealthy, to_healthy;
  for (int round = 0; round < rounds; ++round) {
    const Gpu& gpu = gpus[static_cast<std::size_t>(round) % gpus.size()];
    const auto appended = live.Append(gns::sim::JournalWriter::Kernel(gns::sim::XidMessage(gpu.pci, 48)));
    if (!kubelet.WaitForDeviceHealth(resource, gpu.uuid, "Unhealthy", seconds(10))) {
      Fail("round " + std::to_string(round) + ": " + gpu.uuid + " never became Unhealthy");
    }
    to_unhealthy.push_back(Ms(SeenAt(kubelet, resource, gpu.uuid, "Unhealthy") - appended));
    const auto acked = live.Append(gns::sim::JournalWriter::Syslog("gpu-reset", gns::sim::ResetAckMessage(gpu.uuid)));
    if (!kubelet.WaitForDeviceHealth(resource, gpu.uuid, "Healthy", seconds(10))) {
      Fail("round " + std::to_string(round) + ": " + gpu.uuid + " never became Healthy again");
    }
    to_healthy.push_back(Ms(SeenAt(kubelet, resource, gpu.uuid, "Healthy") - acked));
  }
  Report("XID line appended to the live journal -> Unhealthy at the kubelet simulator (target p99 <= 5 ms)",
         to_unhealthy);
  Report("reset ack appended to the live journal -> Healthy at the kubelet simulator", to_healthy);
  std::fflush(stdout);

  // ---- (c) memory under a flood of identical Xid lines through gpu-health
  std::size_t health_events = 0, device_updates = 0;
  gns::Subscription event_sub, device_sub;
  OnLoop(loop, [&] {
    event_sub = bus.Subscribe<gns::gpu_health::HealthEvent>([&](const gns::gpu_health::HealthEvent&) { ++health_events; });
    device_sub = bus.Subscribe<gns::gpu_health::DeviceHealth>([&](const gns::gpu_health::DeviceHealth& d) {
      if (d.uuid == gpus[0].uuid) ++device_updates;
    });
  });
  OnLoop(loop, [&] {  // after what the subscriptions were handed on subscribing
    health_events = 0;
    device_updates = 0;
  });
  // Deliberate: let the process settle (allocator, gRPC threads) before reading memory.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const long rss_before = StatusKiB("VmRSS"), anon_before = StatusKiB("RssAnon");
  // gpu_node_supervisor_xid_errors_total of the flooded GPU and XID (the registry is the loop's).
  auto xid_counter = [&] {
    std::string rendered;
    OnLoop(loop, [&] { rendered = metrics.Render(); });
    const std::string counter = "gpu_node_supervisor_xid_errors_total{gpu=\"" + gpus[0].uuid + "\",xid=\"48\"} ";
    const auto at = rendered.find(counter);
    return at == std::string::npos ? 0.0 : std::atof(rendered.c_str() + at + counter.size());
  };
  const double counted_before = xid_counter();
  gns::journald::KernelLine line;
  line.message = gns::sim::XidMessage(gpus[0].pci, 48, "flood");
  line.boot_id = writer.BootId();
  constexpr long kChunk = 10000;
  const uint64_t base_usec = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  const auto flood_start = Clock::now();
  for (long sent = 0; sent < flood; sent += kChunk) {
    const long chunk = std::min(kChunk, flood - sent);
    OnLoop(loop, [&] {
      for (long i = 0; i < chunk; ++i) {
        // One second of journal time per 1000 lines: a million lines span ~17 minutes.
        line.realtime_usec = base_usec + static_cast<uint64_t>(sent + i) * 1000;
        bus.Publish(line);
      }
    });
    OnLoop(loop, [] {});  // the chunk's deliveries were queued before this
  }
  OnLoop(loop, [] {});
  const double flood_s = Secs(Clock::now() - flood_start);
  std::size_t events_seen = 0, updates_seen = 0;
  OnLoop(loop, [&] {
    events_seen = health_events;
    updates_seen = device_updates;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // deliberate: settle before reading memory
  const long rss_after = StatusKiB("VmRSS"), anon_after = StatusKiB("RssAnon");
  const double counted = xid_counter() - counted_before;
  std::printf("flood of %ld identical Xid 48 KernelLine messages through gpu-health on the bus: %.2f s (%.0f lines/s), "
              "%zu health events emitted, %zu DeviceHealth updates, xid_errors_total +%.0f\n",
              flood, flood_s, flood / flood_s, events_seen, updates_seen, counted);
  std::printf("memory under the flood: VmRSS %.1f -> %.1f MiB (%+.1f), RssAnon %.1f -> %.1f MiB (%+.1f)\n",
              rss_before / 1024.0, rss_after / 1024.0, (rss_after - rss_before) / 1024.0, anon_before / 1024.0,
              anon_after / 1024.0, (anon_after - anon_before) / 1024.0);
  std::fflush(stdout);

  std::promise<void> stopped;
  int running = 3;
  loop.Post([&] {
    event_sub.Reset();
    device_sub.Reset();
    auto one_stopped = [&] {
      if (--running == 0) stopped.set_value();
    };
    journal->Stop(one_stopped);
    health->Stop(one_stopped);
    plugin->Stop(one_stopped);
  });
  stopped.get_future().wait();
  live.Close();
  kubelet.Stop();
  OnLoop(loop, [&] {
    journal.reset();
    health.reset();
    plugin.reset();
  });
  loop_thread.Stop();
  fs::remove_all(dir);
  return 0;
}
