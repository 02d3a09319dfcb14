// kill -9 of the real binary (each DRA driver on the shared core in turn: dra-compute-domain under
// HostManagedIMEX, dra-gpu for gpu.nvidia.com on a whole GPU and on a static MIG device of a GPU
// the fake NVML reports in MIG mode; the kube module against the API simulator, gpu-inventory on
// the fake NVML) at random instants while the kubelet
// simulator prepares and unprepares channel claims through real gRPC, over restarts (at least 5,
// more while the time budget lasts; a start of the ASan binary costs seconds on a loaded machine,
// so how many calls a run makes depends on it: the last line says). After every restart, before
// the kubelet retries anything:
//   - every claim whose prepare was acknowledged (and not since unprepared) has its CDI spec,
//     with exactly the content its record implies (no prepared claim is lost);
//   - no claim whose unprepare was acknowledged has a spec again, nor any claim never prepared;
//     only the one call in flight at the kill may have left its spec or not;
//   - no temp file of ours is left in the CDI directory.
// Then the kubelet's retry of the call in flight completes, and:
//   - the CDI directory holds exactly the specs of the prepared claims (none orphaned);
//   - a prepare retried for a prepared claim returns the same CDI device id;
//   - every new claim is on the same device as the last one: dra-gpu refuses a device held by
//     another prepared claim, so a claim the log kept after its unprepare was acknowledged (or
//     one prepared twice) fails the next prepare: the claim log is checked through the driver.
// The seed is printed; GNS_DRA_CRASH_SEED replays it, GNS_DRA_CRASH_SECONDS sets the budget
// (default 40 s of kills, so the test stays near a minute under ASan on a loaded machine).
#include "support/api_sim.hpp"
#include "channel_claim.h"
#include "kubelet_sim.h"
#include "support/subprocess.hpp"
#include "integration/process_paths.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace gns {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kCrashNs = "team-a";
constexpr const char* kNode = "node-crash";
constexpr const char* kCrashCluster = "5b0e9c3a-1d2f-4e6a-8b7c-9d0e1f2a3b4c";
constexpr uint32_t kMajor = 509;
const std::string kCrashDomains = "/apis/resource.nvidia.com/v1beta1/namespaces/team-a/computedomains";
const std::string kCrashClaims = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims";
// One driver under test: the same body runs on both (the core's crash safety is the same; what a
// claim is and what its spec holds are the driver's).
struct Driver {
  std::string label;        // the test's name
  std::string name;         // the DRA driver name
  std::string module;       // its module's config section
  std::string vendor;       // CDI vendor: spec files "<vendor>-claim_<uid>.json"
  std::string device;       // the device every claim is allocated
  std::string device_node;  // the spec's first device node of that device
  std::string ready_line;   // a log line after which prepares succeed ("" = registration is enough)
  std::vector<std::string> more_nodes = {};  // the spec's other device nodes of that device, in order
  bool mig = false;                          // the GPU is in MIG mode, the device one of its MIG devices
  std::string SpecPrefix() const { return vendor + "-claim_"; }
  std::string CdiId(const std::string& uid) const { return vendor + "/claim=" + uid + "-" + device; }
};

const Driver kComputeDomain{"ComputeDomain", "compute-domain.nvidia.com", "dra-compute-domain",
                            "k8s.compute-domain.nvidia.com", "channel-0", "/dev/nvidia-caps-imex-channels/channel0", ""};
const Driver kGpu{"Gpu", "gpu.nvidia.com", "dra-gpu", "k8s.gpu.nvidia.com", "gpu-0", "/dev/nvidia0",
                  "serving 1 GPU(s) through DRA"};
// GPU 0 in MIG mode with two 1g MIG devices (GPU instances 9 and 10, profile 19, placements 0
// and 1): every claim is on the first, gpu-0-mig-19-0-1; its spec holds /dev/nvidia0 and its GPU
// and compute instance's capability nodes (the host's mig-minors, written in SetUp).
const Driver kGpuMig{"GpuMig", "gpu.nvidia.com", "dra-gpu", "k8s.gpu.nvidia.com", "gpu-0-mig-19-0-1", "/dev/nvidia0",
                     "serving 1 GPU(s) through DRA: 2 device(s)",
                     {"/dev/nvidia-caps/nvidia-cap120", "/dev/nvidia-caps/nvidia-cap121"}, true};

// The spec as the supervisor must have it (WIRE-FACTS §6; cdi_spec.cpp, gpu_claims.cpp): parsed,
// not compared byte for byte with our own serializer, so the test states the content it expects.
bool SpecIsRight(const Driver& driver, const std::string& path, const std::string& uid, std::string& why) {
  std::ifstream in(path);
  if (!in) {
    why = "missing";
    return false;
  }
  std::stringstream text;
  text << in.rdbuf();
  const json spec = json::parse(text.str(), nullptr, false);
  if (spec.is_discarded()) {
    why = "not JSON: \"" + text.str().substr(0, 80) + "\"";
    return false;
  }
  const json nodes = spec.value("/devices/0/containerEdits/deviceNodes"_json_pointer, json());
  const json node = nodes.is_array() && !nodes.empty() ? nodes[0] : json();
  const bool channel = driver.device == "channel-0";
  if (spec.value("kind", "") != driver.vendor + "/claim" || spec.value("/devices"_json_pointer, json()).size() != 1 ||
      spec.value("/devices/0/name"_json_pointer, std::string()) != uid + "-" + driver.device || !node.is_object() ||
      node.value("path", "") != driver.device_node || (channel && node.value("major", 0u) != kMajor)) {
    why = "wrong content: " + spec.dump();
    return false;
  }
  for (std::size_t i = 0; i < driver.more_nodes.size(); ++i) {
    if (nodes.size() <= i + 1 || !nodes[i + 1].is_object() || nodes[i + 1].value("path", "") != driver.more_nodes[i]) {
      why = "device node " + std::to_string(i + 1) + " is not " + driver.more_nodes[i] + ": " + spec.dump();
      return false;
    }
  }
  return true;
}

struct CdiDir {
  std::set<std::string> uids;
  std::vector<std::string> temps;
};

CdiDir ListCdi(const fs::path& dir, const std::string& kSpecPrefix) {
  CdiDir out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kSpecPrefix, 0) != 0) continue;
    if (name.find(".tmp.") != std::string::npos) {
      out.temps.push_back(name);
    } else if (name.size() > kSpecPrefix.size() + 5 && name.substr(name.size() - 5) == ".json") {
      out.uids.insert(name.substr(kSpecPrefix.size(), name.size() - kSpecPrefix.size() - 5));
    }
  }
  return out;
}

// What the kubelet knows: the claims it was told are prepared, and the one call whose answer a
// kill may have swallowed.
struct Model {
  std::map<std::string, std::string> prepared;  // uid → CDI id it was answered
  std::map<std::string, sim::DraClaim> refs;    // uid → the claim reference the kubelet sends
  std::set<std::string> unprepared;             // acknowledged unprepares (and never again prepared)
  std::optional<sim::DraClaim> in_flight;
  bool in_flight_prepare = false;
};

class DraCrashTest : public ::testing::TestWithParam<Driver> {
 protected:
  const Driver& driver_ = GetParam();

  void SetUp() override {
    char pattern[] = "/tmp/gdc-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    api_ = std::make_unique<gns::test::ApiSim>(dir_ / "api");
    api_->Seed(json{{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", kNode}}}});
    api_->Seed(json{{"apiVersion", "resource.nvidia.com/v1beta1"},
                    {"kind", "ComputeDomain"},
                    {"metadata", {{"name", "train"}, {"namespace", kCrashNs}}},
                    {"spec", {{"numNodes", 0}, {"channel", {{"allocationMode", "Single"}}}}},
                    {"_resource", kCrashDomains}});
    domain_uid_ = api_->Call("GET", kCrashDomains + "/train").Json()["metadata"]["uid"].get<std::string>();

    fs::create_directories(dir_ / "host/proc");
    fs::create_directories(dir_ / "kubelet/plugins_registry");
    std::ofstream(dir_ / "host/proc/devices") << "Character devices:\n" << kMajor
                                              << " nvidia-caps-imex-channels\n\nBlock devices:\n";
    // One fabric-attached GPU: its fabric info is the node's clique.
    nvml_ = (dir_ / "gpus.json").string();
    std::ifstream shipped(Source("tools/sim/fake_nvml/gpus-8.json"));
    json gpus = json::parse(shipped);
    gpus["gpus"] = json::array({gpus["gpus"][0]});
    gpus["gpus"][0]["nvlinkPeers"] = json::array();
    gpus["gpus"][0]["fabric"]["clusterUuid"] = kCrashCluster;
    gpus["gpus"][0]["fabric"]["cliqueId"] = 1;
    if (driver_.mig) {
      gpus["gpus"][0]["migEnabled"] = true;
      gpus["gpus"][0]["migDevices"] = json::array();
      for (int i = 0; i < 2; ++i) {
        gpus["gpus"][0]["migDevices"].push_back(
            json{{"uuid", "MIG-0c0c0c0c-000" + std::to_string(i) + "-5000-8000-00000000000" + std::to_string(i)},
                 {"gpuInstanceId", 9 + i},
                 {"gpuInstanceSliceCount", 1},
                 {"memorySizeMB", 18176},
                 {"multiprocessorCount", 16},
                 {"gpuInstanceProfileId", 19},
                 {"placementStart", i},
                 {"placementSize", 1}});
      }
      // The driver's capability minors of GPU 0's instances (/proc/driver/nvidia-caps/mig-minors).
      fs::create_directories(dir_ / "host/proc/driver/nvidia-caps");
      std::ofstream(dir_ / "host/proc/driver/nvidia-caps/mig-minors")
          << "config 1\nmonitor 2\ngpu0/gi9/access 120\ngpu0/gi9/ci0/access 121\ngpu0/gi10/access 129\n"
             "gpu0/gi10/ci0/access 130\n";
    }
    std::ofstream(nvml_) << gpus.dump();
    config_ = (dir_ / "site.yaml").string();
    std::ofstream(config_) << "version: v1\nnodeName: " << kNode << "\npaths:\n  kubeletDir: "
                           << (dir_ / "kubelet").string() << "\n  cdiDir: " << (dir_ / "cdi").string()
                           << "\n  stateDir: " << (dir_ / "state").string()
                           << "\n  hostRoot: " << (dir_ / "host").string()
                           << "\nfeatureGates:\n  HostManagedIMEX: true\nmodules:\n"
                              "  kube:\n    enabled: true\n    kubeconfig: "
                           << (dir_ / "api/kubeconfig").string()
                           << "\n  gpu-inventory:\n    enabled: true\n    nvmlLibrary: "
                           << Built("tools/sim/fake_nvml/libnvidia-ml.so.1")
                           << "\n  " << driver_.module << ":\n    enabled: true\n";
    sim::KubeletSimOptions kubelet_options;
    kubelet_options.kubelet_dir = dir_ / "kubelet";
    kubelet_options.registration_retry_initial = milliseconds(50);
    kubelet_options.dra_call_timeout = seconds(30);
    kubelet_ = std::make_unique<sim::KubeletSim>(kubelet_options);
    kubelet_->Start();
  }

  void TearDown() override {
    if (proc_) {
      proc_->Signal(SIGKILL);
      proc_->Wait(seconds(30));
    }
    kubelet_.reset();
    api_->Stop();
    std::error_code ignored;  // best effort
    fs::remove_all(dir_, ignored);
  }

  // Starts the binary and waits until the kubelet simulator has registered it once more: the
  // module's start (load, replay, reconcile) is over by then.
  void Launch() {
    proc_ = std::make_unique<test::Subprocess>(
        std::vector<std::string>{std::getenv("GNS_SUPERVISOR_BIN"), "run", "--config", config_},
        std::map<std::string, std::string>{{"FAKE_NVML_CONFIG", nvml_}});
    // This process's own word that the kubelet registered it (a count of registrations could be
    // met by an earlier process's).
    ASSERT_TRUE(proc_->WaitForLine("registered with the kubelet as", seconds(60)).has_value()) << proc_->Output();
    if (!driver_.ready_line.empty()) {
      ASSERT_TRUE(proc_->WaitForLine(driver_.ready_line, seconds(60)).has_value()) << proc_->Output();
    }
  }

  sim::DraClaim NewClaim() {
    const std::string name = "claim-" + std::to_string(claims_++);
    json claim = sim::AllocatedChannelClaim(kCrashNs, name, kNode,
                                            json{{"apiVersion", "resource.nvidia.com/v1beta1"},
                                                 {"kind", "ComputeDomainChannelConfig"},
                                                 {"domainID", domain_uid_},
                                                 {"allocationMode", "Single"}},
                                            driver_.name);
    if (driver_.name == kGpu.name && !driver_.mig) {
      // The same shape for a GPU: its device, a GpuConfig (time-slicing at the default interval).
      claim["status"]["allocation"]["devices"]["results"][0]["device"] = driver_.device;
      claim["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"] =
          json{{"apiVersion", "resource.nvidia.com/v1beta1"},
               {"kind", "GpuConfig"},
               {"sharing", {{"strategy", "TimeSlicing"}, {"timeSlicingConfig", {{"interval", "Default"}}}}}};
    } else if (driver_.mig) {
      // A MIG device: a MigDeviceConfig (time-slicing; a MIG device has no interval).
      claim["status"]["allocation"]["devices"]["results"][0]["device"] = driver_.device;
      claim["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"] =
          json{{"apiVersion", "resource.nvidia.com/v1beta1"}, {"kind", "MigDeviceConfig"},
               {"sharing", {{"strategy", "TimeSlicing"}}}};
    }
    api_->Seed(claim);
    return sim::DraClaim{kCrashNs, api_->Call("GET", kCrashClaims + "/" + name).Json()["metadata"]["uid"].get<std::string>(),
                         name};
  }

  // One kubelet call: true when it was answered with success (the model records it), false
  // when the call failed (the process died under it: the kubelet retries it after the restart).
  bool Call(Model& model, const sim::DraClaim& claim, bool prepare, std::string* failure) {
    if (prepare) {
      const auto result = kubelet_->NodePrepareResources(driver_.name, {claim});
      if (!result.ok()) {
        last_rpc_error_ = result.status.ToString();
        return false;
      }
      const auto it = result.claims.find(claim.uid);
      if (it == result.claims.end() || !it->second.error.empty() || it->second.devices.size() != 1 ||
          it->second.devices[0].cdi_device_ids.size() != 1) {
        *failure = "prepare " + claim.name + " answered without success: " +
                   (it == result.claims.end() ? "<no entry>" : it->second.error);
        return false;
      }
      const std::string id = it->second.devices[0].cdi_device_ids[0];
      if (id != driver_.CdiId(claim.uid)) *failure = "prepare " + claim.name + " returned CDI id " + id;
      const auto before = model.prepared.find(claim.uid);
      if (before != model.prepared.end() && before->second != id) {
        *failure = "a retried prepare of " + claim.name + " returned " + id + ", first " + before->second;
      }
      model.prepared[claim.uid] = id;
      model.refs[claim.uid] = claim;
      model.unprepared.erase(claim.uid);
      return true;
    }
    const auto result = kubelet_->NodeUnprepareResources(driver_.name, {claim});
    if (!result.ok()) {
      last_rpc_error_ = result.status.ToString();
      return false;
    }
    const auto it = result.claims.find(claim.uid);
    if (it == result.claims.end() || !it->second.empty()) {
      *failure = "unprepare " + claim.name + " answered without success: " +
                 (it == result.claims.end() ? "<no entry>" : it->second);
      return false;
    }
    model.prepared.erase(claim.uid);
    model.unprepared.insert(claim.uid);
    return true;
  }

  // The kubelet's retry of a call that got no answer: again until it is answered (its gRPC
  // channel to the plugin may still be in reconnect backoff from the process that died).
  bool Retry(Model& model, const sim::DraClaim& claim, bool prepare, std::string* failure) {
    const auto end = std::chrono::steady_clock::now() + seconds(30);
    while (!Call(model, claim, prepare, failure)) {
      if (!failure->empty() || std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(milliseconds(100));  // the kubelet's retry interval, not a wait on state
    }
    return true;
  }

  fs::path dir_;
  std::unique_ptr<gns::test::ApiSim> api_;
  std::unique_ptr<sim::KubeletSim> kubelet_;
  std::unique_ptr<test::Subprocess> proc_;
  std::string config_;
  std::string nvml_;
  std::string domain_uid_;
  int claims_ = 0;
  std::string last_rpc_error_;
};

TEST_P(DraCrashTest, KillNineAtRandomInstantsLosesNoPreparedClaimAndOrphansNoSpec) {
  const std::string kSpecPrefix = driver_.SpecPrefix();
  const char* seed_env = std::getenv("GNS_DRA_CRASH_SEED");
  const uint64_t seed = seed_env ? std::strtoull(seed_env, nullptr, 10) : std::random_device{}();
  const char* seconds_env = std::getenv("GNS_DRA_CRASH_SECONDS");
  const auto budget = seconds(seconds_env ? std::atoi(seconds_env) : 40);
  std::printf("dra crash test: seed %llu (replay: GNS_DRA_CRASH_SEED=%llu)\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  std::mt19937_64 rng(seed);
  const fs::path cdi = dir_ / "cdi";

  Model model;
  sim::DraClaim current;  // the claim the next op works on
  bool current_prepared = false;
  int kills = 0;
  int acknowledged = 0;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < budget || kills < 5) {
    const auto launched = std::chrono::steady_clock::now();
    Launch();
    if (HasFatalFailure()) return;
    const auto up = std::chrono::steady_clock::now();

    // Right after the start, before any retry: nothing acknowledged is lost or resurrected.
    CdiDir listing = ListCdi(cdi, kSpecPrefix);
    EXPECT_TRUE(listing.temps.empty()) << "after kill " << kills << ": " << listing.temps.front();
    for (const auto& [uid, id] : model.prepared) {
      if (model.in_flight && model.in_flight->uid == uid) continue;
      std::string why;
      EXPECT_TRUE(SpecIsRight(driver_, (cdi / (kSpecPrefix + uid + ".json")).string(), uid, why))
          << "seed " << seed << ", after kill " << kills << ": prepared claim " << uid << " lost its spec: " << why;
    }
    for (const auto& uid : listing.uids) {
      const bool in_flight = model.in_flight && model.in_flight->uid == uid;
      EXPECT_TRUE(model.prepared.count(uid) > 0 || in_flight)
          << "seed " << seed << ", after kill " << kills << ": spec of claim " << uid << " that is not prepared ("
          << (model.unprepared.count(uid) ? "its unprepare was acknowledged" : "never acknowledged") << ")";
    }

    // The kubelet retries the call it got no answer for, until it succeeds.
    if (model.in_flight) {
      std::string failure;
      ASSERT_TRUE(Retry(model, *model.in_flight, model.in_flight_prepare, &failure))
          << "seed " << seed << ": the retry after kill " << kills << " failed: " << failure << last_rpc_error_ << "\n"
          << proc_->Output();
      ASSERT_EQ(failure, "") << "seed " << seed;
      current_prepared = model.in_flight_prepare;
      model.in_flight.reset();
    }
    // A retried prepare of a prepared claim: the same CDI id, from the record.
    for (const auto& [uid, id] : std::map<std::string, std::string>(model.prepared)) {
      std::string failure;
      EXPECT_TRUE(Retry(model, model.refs.at(uid), true, &failure) && failure.empty())
          << "seed " << seed << ", after kill " << kills << ": " << failure;
    }
    listing = ListCdi(cdi, kSpecPrefix);
    std::set<std::string> expected;
    for (const auto& [uid, id] : model.prepared) expected.insert(uid);
    EXPECT_EQ(listing.uids, expected) << "seed " << seed << ", after kill " << kills << " and the retries";
    if (HasFailure()) break;

    // Calls until the kill: prepare a new claim, unprepare it, and so on; the kill comes at a
    // random instant, anywhere in a call (its decision, the spec write, the log append).
    const auto ops_start = std::chrono::steady_clock::now();
    // The main thread touches the model only after joining this one.
    std::atomic<bool> stop{false};
    std::string failure;
    std::thread kubelet([&] {
      while (!stop.load()) {
        if (!current_prepared) current = NewClaim();
        const bool prepare = !current_prepared;
        model.in_flight = current;
        model.in_flight_prepare = prepare;
        const bool answered = Call(model, current, prepare, &failure);
        if (!answered || !failure.empty()) return;  // the process died under the call (or a bug: reported below)
        model.in_flight.reset();
        current_prepared = prepare;
        ++acknowledged;
      }
    });
    std::uniform_int_distribution<int> delay_us(0, 2000000);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));  // the random instant, not a wait
    proc_->Signal(SIGKILL);
    ASSERT_TRUE(proc_->Wait(seconds(30)).has_value());
    stop = true;
    kubelet.join();
    ++kills;
    std::printf("kill %d: start %lld ms, checks and retries %lld ms, then %d calls acknowledged in all\n", kills,
                static_cast<long long>(std::chrono::duration_cast<milliseconds>(up - launched).count()),
                static_cast<long long>(std::chrono::duration_cast<milliseconds>(ops_start - up).count()), acknowledged);
    ASSERT_EQ(failure, "") << "seed " << seed << " before kill " << kills << "\n" << proc_->Output();
  }
  std::printf("dra crash test: %d kills, %d acknowledged calls, %d claims, seed %llu\n", kills, acknowledged, claims_,
              static_cast<unsigned long long>(seed));
  EXPECT_GE(kills, 5);
}

INSTANTIATE_TEST_SUITE_P(BothDrivers, DraCrashTest, ::testing::Values(kComputeDomain, kGpu, kGpuMig),
                         [](const ::testing::TestParamInfo<Driver>& info) { return info.param.label; });

}  // namespace
}  // namespace gns
