// The fake kubelet's CSI part (tools/sim/kubelet/csi.h) against a fake CSI node plugin built on
// the CSI spec's own csi.proto: a CSIPlugin registers through the plugin watcher (versions
// validated as the kubelet's CSI handler does, NodeGetInfo at registration), and a pod's inline
// ephemeral volume is published and unpublished with what the kubelet sends (volume handle,
// target under the pod's directory, readonly, the mount capability, the volume context with the
// pod's keys). Its own executable: our csi.proto text must never share a process with the spec's.
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "csi.grpc.pb.h"
#include "csi.h"
#include "kubelet_sim.h"
#include "pluginregistration/v1/api.grpc.pb.h"
#include "support/temp_dir.hpp"

namespace gns::sim {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

constexpr auto kWait = 10s;
constexpr const char* kDriver = "csi.example.com";

// A CSI node plugin: the registration socket (plugins_registry/<driver>-reg.sock, type
// CSIPlugin) and the Node service on plugins/<driver>/csi.sock. It records what it is sent and
// answers what the test tells it to.
class FakeCsiPlugin {
 public:
  FakeCsiPlugin(const fs::path& kubelet_dir, std::vector<std::string> versions)
      : versions_(std::move(versions)),
        registration_socket_(kubelet_dir / "plugins_registry" / (std::string(kDriver) + "-reg.sock")),
        csi_socket_(kubelet_dir / "plugins" / kDriver / "csi.sock") {}
  ~FakeCsiPlugin() {
    Stop(registration_server_, registration_socket_);
    Stop(csi_server_, csi_socket_);
  }

  void Serve() {
    fs::create_directories(csi_socket_.parent_path());
    grpc::ServerBuilder csi;
    csi.AddListeningPort("unix:" + csi_socket_.string(), grpc::InsecureServerCredentials());
    csi.RegisterService(&node_);
    csi_server_ = csi.BuildAndStart();
    ASSERT_TRUE(csi_server_);
    fs::create_directories(registration_socket_.parent_path());
    grpc::ServerBuilder reg;
    reg.AddListeningPort("unix:" + registration_socket_.string(), grpc::InsecureServerCredentials());
    reg.RegisterService(&registration_);
    registration_server_ = reg.BuildAndStart();
    ASSERT_TRUE(registration_server_);
  }
  void Leave() { Stop(registration_server_, registration_socket_); }

  std::vector<pluginregistration::RegistrationStatus> WaitForNotifications(std::size_t count) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, kWait, [&] { return notifications_.size() >= count; });
    return notifications_;
  }
  void FailNodeGetInfo(bool fail) {
    std::lock_guard lock(mutex_);
    fail_node_info_ = fail;
  }
  void FailPublish(grpc::StatusCode code) {
    std::lock_guard lock(mutex_);
    publish_code_ = code;
  }
  std::vector<csi::v1::NodePublishVolumeRequest> Published() {
    std::lock_guard lock(mutex_);
    return published_;
  }
  std::vector<csi::v1::NodeUnpublishVolumeRequest> Unpublished() {
    std::lock_guard lock(mutex_);
    return unpublished_;
  }
  std::string CsiSocket() const { return csi_socket_.string(); }

 private:
  static void Stop(std::unique_ptr<grpc::Server>& server, const fs::path& socket) {
    if (!server) return;
    server->Shutdown(std::chrono::system_clock::now() + 2s);
    server->Wait();
    server.reset();
    std::error_code ec;
    fs::remove(socket, ec);
  }

  class Registration final : public pluginregistration::Registration::Service {
   public:
    explicit Registration(FakeCsiPlugin& p) : p_(p) {}
    grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                         pluginregistration::PluginInfo* info) override {
      info->set_type("CSIPlugin");
      info->set_name(kDriver);
      info->set_endpoint(p_.csi_socket_.string());
      for (const auto& v : p_.versions_) info->add_supported_versions(v);
      return grpc::Status::OK;
    }
    grpc::Status NotifyRegistrationStatus(grpc::ServerContext*, const pluginregistration::RegistrationStatus* status,
                                          pluginregistration::RegistrationStatusResponse*) override {
      std::lock_guard lock(p_.mutex_);
      p_.notifications_.push_back(*status);
      p_.changed_.notify_all();
      return grpc::Status::OK;
    }

   private:
    FakeCsiPlugin& p_;
  };

  class Node final : public csi::v1::Node::Service {
   public:
    explicit Node(FakeCsiPlugin& p) : p_(p) {}
    grpc::Status NodeGetInfo(grpc::ServerContext*, const csi::v1::NodeGetInfoRequest*,
                             csi::v1::NodeGetInfoResponse* response) override {
      std::lock_guard lock(p_.mutex_);
      if (p_.fail_node_info_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not ready");
      response->set_node_id("node-a");
      return grpc::Status::OK;
    }
    grpc::Status NodeGetCapabilities(grpc::ServerContext*, const csi::v1::NodeGetCapabilitiesRequest*,
                                     csi::v1::NodeGetCapabilitiesResponse*) override {
      return grpc::Status::OK;
    }
    grpc::Status NodePublishVolume(grpc::ServerContext*, const csi::v1::NodePublishVolumeRequest* request,
                                   csi::v1::NodePublishVolumeResponse*) override {
      std::lock_guard lock(p_.mutex_);
      p_.published_.push_back(*request);
      if (p_.publish_code_ != grpc::StatusCode::OK) return grpc::Status(p_.publish_code_, "refused by the test");
      // The plugin makes the target (the kubelet makes its parent), as ours does.
      std::error_code ec;
      fs::create_directory(request->target_path(), ec);
      return ec ? grpc::Status(grpc::StatusCode::INTERNAL, ec.message()) : grpc::Status::OK;
    }
    grpc::Status NodeUnpublishVolume(grpc::ServerContext*, const csi::v1::NodeUnpublishVolumeRequest* request,
                                     csi::v1::NodeUnpublishVolumeResponse*) override {
      std::lock_guard lock(p_.mutex_);
      p_.unpublished_.push_back(*request);
      std::error_code ec;
      fs::remove(request->target_path(), ec);
      return grpc::Status::OK;
    }

   private:
    FakeCsiPlugin& p_;
  };

  std::vector<std::string> versions_;
  fs::path registration_socket_;
  fs::path csi_socket_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<pluginregistration::RegistrationStatus> notifications_;
  bool fail_node_info_ = false;
  grpc::StatusCode publish_code_ = grpc::StatusCode::OK;
  std::vector<csi::v1::NodePublishVolumeRequest> published_;
  std::vector<csi::v1::NodeUnpublishVolumeRequest> unpublished_;
  Registration registration_{*this};
  Node node_{*this};
  std::unique_ptr<grpc::Server> registration_server_;
  std::unique_ptr<grpc::Server> csi_server_;
};

class KubeletCsiTest : public ::testing::Test {
 protected:
  KubeletCsiTest() {
    options_.kubelet_dir = temp_.Path() / "kubelet";
    options_.dial_timeout = 2s;
    options_.registration_retry_initial = 0ms;  // one attempt per socket: the test counts them
    EnableCsi(options_, 2s);
  }
  ~KubeletCsiTest() override {
    if (sim_) sim_->Stop();
    plugin_.reset();
    sim_.reset();
  }
  KubeletSim& StartSim() {
    sim_ = std::make_unique<KubeletSim>(options_);
    sim_->Start();
    return *sim_;
  }
  FakeCsiPlugin& AddPlugin(std::vector<std::string> versions) {
    plugin_ = std::make_unique<FakeCsiPlugin>(options_.kubelet_dir, std::move(versions));
    plugin_->Serve();
    return *plugin_;
  }
  static CsiPodVolume Volume() {
    CsiPodVolume v;
    v.pod_namespace = "ml";
    v.pod_name = "trainer";
    v.pod_uid = "0f6c7f0e-1111-2222-3333-444455556666";
    v.volume_name = "kernel-cache";
    v.driver = kDriver;
    v.attributes = {{"cacheName", "llama"}, {"cacheNamespace", "ml"}};
    return v;
  }

  gns::test::TempDir temp_{"gkc"};  // short: unix socket paths must stay under 108 bytes
  KubeletSimOptions options_;
  std::unique_ptr<KubeletSim> sim_;
  std::unique_ptr<FakeCsiPlugin> plugin_;
};

TEST_F(KubeletCsiTest, ACsiPluginRegistersWithItsNodeIdAndLeavesWithItsSocket) {
  KubeletSim& sim = StartSim();
  FakeCsiPlugin& plugin = AddPlugin({"0.3.0", "1.0.0", "1.9.0", "2.0.0"});
  const auto notes = plugin.WaitForNotifications(1);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_TRUE(notes[0].plugin_registered()) << notes[0].error();
  const auto state = sim.State();
  ASSERT_TRUE(state.csi_drivers.count(kDriver));
  const CsiDriverState& d = state.csi_drivers.at(kDriver);
  EXPECT_EQ(d.endpoint, plugin.CsiSocket());
  EXPECT_EQ(d.highest_version, "1.9.0");  // 2.x skipped, 0.x lower
  EXPECT_EQ(d.node_id, "node-a");         // NodeGetInfo, as the kubelet calls it at registration

  plugin.Leave();
  ASSERT_TRUE(sim.WaitFor([](const KubeletState& s) { return s.csi_drivers.empty(); }, kWait));
  const auto r = CsiPublish(sim, Volume(), 2s);
  EXPECT_EQ(r.status.code, grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(r.status.message, "driver name csi.example.com not found in the list of registered CSI drivers");
}

TEST_F(KubeletCsiTest, VersionsAndNodeInfoDecideTheRegistration) {
  StartSim();
  {
    FakeCsiPlugin& plugin = AddPlugin({"0.3.0"});
    const auto notes = plugin.WaitForNotifications(1);
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_FALSE(notes[0].plugin_registered());
    EXPECT_NE(notes[0].error().find("highest supported version reported by driver is 0.3.0, must be v1.x"),
              std::string::npos)
        << notes[0].error();
  }
  plugin_.reset();
  {
    options_.registration_retry_initial = 0ms;
    plugin_ = std::make_unique<FakeCsiPlugin>(options_.kubelet_dir, std::vector<std::string>{"1.0.0"});
    plugin_->FailNodeGetInfo(true);
    plugin_->Serve();
    const auto notes = plugin_->WaitForNotifications(1);
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_FALSE(notes[0].plugin_registered());
    EXPECT_NE(notes[0].error().find("NodeGetInfo of csi.example.com: UNAVAILABLE: not ready"), std::string::npos)
        << notes[0].error();
    EXPECT_TRUE(sim_->State().csi_drivers.empty());
  }
}

TEST_F(KubeletCsiTest, AnInlineVolumeIsPublishedAndUnpublishedAsTheKubeletDoes) {
  KubeletSim& sim = StartSim();
  FakeCsiPlugin& plugin = AddPlugin({"1.0.0"});
  ASSERT_TRUE(sim.WaitFor([](const KubeletState& s) { return s.csi_drivers.count(kDriver) > 0; }, kWait));

  CsiPodVolume volume = Volume();
  volume.read_only = true;
  const auto r = CsiPublish(sim, volume, 2s);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  const fs::path target = options_.kubelet_dir / "pods" / volume.pod_uid / "volumes/kubernetes.io~csi/kernel-cache/mount";
  EXPECT_EQ(r.target_path, target.string());
  // makeVolumeHandle: "csi-" + sha256(pod uid + volume name), hex.
  EXPECT_EQ(r.volume_id, CsiVolumeHandle(volume.pod_uid, "kernel-cache"));
  EXPECT_EQ(r.volume_id.size(), 4u + 64u);
  EXPECT_NE(r.volume_id, CsiVolumeHandle(volume.pod_uid, "other"));
  const auto sent = plugin.Published();
  ASSERT_EQ(sent.size(), 1u);
  const auto& q = sent[0];
  EXPECT_EQ(q.volume_id(), r.volume_id);
  EXPECT_EQ(q.target_path(), target.string());
  EXPECT_TRUE(q.readonly());
  EXPECT_TRUE(q.staging_target_path().empty());
  EXPECT_TRUE(q.volume_capability().has_mount());
  EXPECT_EQ(q.volume_capability().access_mode().mode(), csi::v1::VolumeCapability::AccessMode::SINGLE_NODE_WRITER);
  const std::map<std::string, std::string> context(q.volume_context().begin(), q.volume_context().end());
  EXPECT_EQ(context, (std::map<std::string, std::string>{{"cacheName", "llama"},
                                                         {"cacheNamespace", "ml"},
                                                         {"csi.storage.k8s.io/ephemeral", "true"},
                                                         {"csi.storage.k8s.io/pod.name", "trainer"},
                                                         {"csi.storage.k8s.io/pod.namespace", "ml"},
                                                         {"csi.storage.k8s.io/pod.uid", volume.pod_uid},
                                                         {"csi.storage.k8s.io/serviceAccount.name", "default"}}));
  // The kubelet's part: the volume's directory (0750) with vol_data.json.
  const fs::path dir = target.parent_path();
  EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms(0750));
  std::ifstream in(dir / "vol_data.json");
  const json data = json::parse(in);
  EXPECT_EQ(data["driverName"], kDriver);
  EXPECT_EQ(data["volumeHandle"], r.volume_id);
  EXPECT_EQ(data["volumeLifecycleMode"], "Ephemeral");

  // Through the control socket's command, as kubeletctl sends it: listed, then unpublished.
  const json listed = json::parse(*HandleCsiCommand(sim, "csi-volumes", nullptr));
  ASSERT_EQ(listed["volumes"].size(), 1u) << listed.dump();
  EXPECT_EQ(listed["volumes"][0]["volume_id"], r.volume_id);
  const json gone = json::parse(*HandleCsiCommand(sim, "csi-unpublish " + volume.pod_uid + " kernel-cache", nullptr));
  EXPECT_TRUE(gone["ok"]) << gone.dump();
  const auto unsent = plugin.Unpublished();
  ASSERT_EQ(unsent.size(), 1u);
  EXPECT_EQ(unsent[0].volume_id(), r.volume_id);
  EXPECT_EQ(unsent[0].target_path(), target.string());
  EXPECT_FALSE(fs::exists(dir)) << "vol_data.json and the volume's directory go after the unpublish";
  // Again: nothing to tear down, no call.
  EXPECT_TRUE(CsiUnpublish(sim, volume.pod_uid, "kernel-cache", 2s).status.ok());
  EXPECT_EQ(plugin.Unpublished().size(), 1u);
  EXPECT_FALSE(HandleCsiCommand(sim, "state", nullptr)) << "other commands are the kubelet's";
}

TEST_F(KubeletCsiTest, ARefusedPublishLeavesNothingAndTheCommandSaysWhy) {
  KubeletSim& sim = StartSim();
  FakeCsiPlugin& plugin = AddPlugin({"1.0.0"});
  ASSERT_TRUE(sim.WaitFor([](const KubeletState& s) { return s.csi_drivers.count(kDriver) > 0; }, kWait));
  plugin.FailPublish(grpc::StatusCode::FAILED_PRECONDITION);
  const CsiPodVolume v = Volume();
  const json reply = json::parse(*HandleCsiCommand(
      sim, "csi-publish --no-pod-info csi.example.com ml/trainer " + v.pod_uid + R"( kernel-cache {"cacheName": "llama"})",
      nullptr));
  EXPECT_FALSE(reply["ok"]);
  EXPECT_EQ(reply["code"], "FAILED_PRECONDITION");
  EXPECT_EQ(reply["error"], "refused by the test");
  EXPECT_EQ(reply["request"]["volume_context"], json::parse(R"({"cacheName":"llama"})"));  // no pod keys
  EXPECT_FALSE(reply["request"].contains("readonly"));  // false: proto3 JSON leaves it out
  EXPECT_FALSE(fs::exists(options_.kubelet_dir / "pods" / v.pod_uid / "volumes/kubernetes.io~csi/kernel-cache"));
  const json bad = json::parse(*HandleCsiCommand(sim, "csi-publish csi.example.com trainer", nullptr));
  EXPECT_FALSE(bad["ok"]);
  EXPECT_NE(bad["error"].get<std::string>().find("usage: csi-publish"), std::string::npos);
}

}  // namespace
}  // namespace gns::sim
