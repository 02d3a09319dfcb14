// Tests of the fake kubelet (tools/sim/kubelet) against tiny fake plugins written here directly
// with the gRPC C++ API: a device plugin (callback API, a real ListAndWatch stream) and a DRA
// plugin (registration socket in plugins_registry + a DRA socket serving v1 and/or v1beta1).
// Everything runs over real unix sockets in a short /tmp directory; waits are condition
// variables with timeouts, never sleeps.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "control.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "dra/v1/api.grpc.pb.h"
#include "dra/v1beta1/api.grpc.pb.h"
#include "kubelet_sim.h"
#include "support/temp_dir.hpp"
#include "pluginregistration/v1/api.grpc.pb.h"
#include "podresources/v1/api.grpc.pb.h"

namespace gns::sim {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr std::chrono::milliseconds kWait = 10s;
constexpr const char* kGpu = "nvidia.com/gpu";
constexpr const char* kDriver = "gpu.example.com";

// A unix socket file nobody listens on (what a crashed plugin leaves behind).
void MakeStaleSocket(const fs::path& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  ::close(fd);
}

// ---- a fake device plugin ------------------------------------------------------------------

class FakeDevicePlugin {
 public:
  struct Config {
    std::string resource = kGpu;
    std::string endpoint = "fake-gpu.sock";
    DevicePluginOptions options;
    std::vector<DeviceInfo> devices;
  };

  FakeDevicePlugin(fs::path dir, Config config) : dir_(std::move(dir)), config_(std::move(config)) {}
  ~FakeDevicePlugin() { Stop(); }

  fs::path SocketPath() const { return dir_ / config_.endpoint; }

  void Serve() {
    service_ = std::make_unique<Service>(*this);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + SocketPath().string(), grpc::InsecureServerCredentials());
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_) << SocketPath();
  }

  // The plugin goes away: its server stops at once, which ends every ListAndWatch stream.
  void Stop() {
    if (!server_) return;
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
    service_.reset();
    std::lock_guard lock(mutex_);
    streams_.clear();
  }

  grpc::Status Register(const fs::path& kubelet_socket, const std::string& version = "v1beta1",
                        std::string resource = "") {
    auto stub = v1beta1::Registration::NewStub(
        grpc::CreateChannel("unix:" + kubelet_socket.string(), grpc::InsecureChannelCredentials()));
    v1beta1::RegisterRequest request;
    request.set_version(version);
    request.set_endpoint(config_.endpoint);
    request.set_resource_name(resource.empty() ? config_.resource : resource);
    request.mutable_options()->set_pre_start_required(config_.options.pre_start_required);
    request.mutable_options()->set_get_preferred_allocation_available(config_.options.get_preferred_allocation_available);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kWait);
    v1beta1::Empty empty;
    return stub->Register(&context, request, &empty);
  }

  void SetDevices(std::vector<DeviceInfo> devices) {
    std::vector<std::shared_ptr<Stream>> streams;
    {
      std::lock_guard lock(mutex_);
      config_.devices = std::move(devices);
      streams = streams_;
    }
    // Sent unlocked: a write may complete (and its reactions run) on this very thread.
    for (const auto& stream : streams) stream->Send(CurrentList());
  }

  // Until exactly `count` ListAndWatch streams are open.
  bool WaitForOpenStreams(int count) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, kWait, [&] { return OpenStreamsLocked() == count; });
  }

  std::vector<std::vector<std::string>> PreStartCalls() {
    std::lock_guard lock(mutex_);
    return prestart_calls_;
  }
  int PreferredCalls() {
    std::lock_guard lock(mutex_);
    return preferred_calls_;
  }

 private:
  // One ListAndWatch stream: at most one write in flight, the rest queued.
  class Stream final : public grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse> {
   public:
    explicit Stream(FakeDevicePlugin& plugin) : plugin_(plugin) {}

    void Send(v1beta1::ListAndWatchResponse message) {
      {
        std::lock_guard lock(mutex_);
        if (finished_) return;
        queue_.push_back(std::move(message));
        if (writing_) return;
        current_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
      }
      StartWrite(&current_);
    }
    bool Open() {
      std::lock_guard lock(mutex_);
      return !finished_ && !done_;
    }

    void OnWriteDone(bool ok) override {
      {
        std::lock_guard lock(mutex_);
        writing_ = false;
        if (!ok || queue_.empty() || finished_) return;
        current_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
      }
      StartWrite(&current_);
    }
    void OnCancel() override {
      {
        std::lock_guard lock(mutex_);
        if (finished_) return;
        finished_ = true;
      }
      Finish(grpc::Status::CANCELLED);
      plugin_.Changed();
    }
    void OnDone() override {
      // The plugin owns the object (shared_ptr) and frees it after its server has stopped.
      {
        std::lock_guard lock(mutex_);
        done_ = true;
      }
      plugin_.Changed();
    }

   private:
    FakeDevicePlugin& plugin_;
    std::mutex mutex_;
    std::deque<v1beta1::ListAndWatchResponse> queue_;
    v1beta1::ListAndWatchResponse current_;
    bool writing_ = false;
    bool finished_ = false;
    bool done_ = false;
  };

  class Service final : public v1beta1::DevicePlugin::CallbackService {
   public:
    explicit Service(FakeDevicePlugin& plugin) : plugin_(plugin) {}

    grpc::ServerUnaryReactor* GetDevicePluginOptions(grpc::CallbackServerContext* context, const v1beta1::Empty*,
                                                     v1beta1::DevicePluginOptions* response) override {
      response->set_pre_start_required(plugin_.config_.options.pre_start_required);
      response->set_get_preferred_allocation_available(plugin_.config_.options.get_preferred_allocation_available);
      auto* reactor = context->DefaultReactor();
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }

    grpc::ServerWriteReactor<v1beta1::ListAndWatchResponse>* ListAndWatch(grpc::CallbackServerContext*,
                                                                         const v1beta1::Empty*) override {
      auto stream = std::make_shared<Stream>(plugin_);
      {
        std::lock_guard lock(plugin_.mutex_);
        plugin_.streams_.push_back(stream);
      }
      stream->Send(plugin_.CurrentList());
      plugin_.Changed();
      return stream.get();
    }

    grpc::ServerUnaryReactor* GetPreferredAllocation(grpc::CallbackServerContext* context,
                                                     const v1beta1::PreferredAllocationRequest* request,
                                                     v1beta1::PreferredAllocationResponse* response) override {
      {
        std::lock_guard lock(plugin_.mutex_);
        ++plugin_.preferred_calls_;
      }
      // Must-include first, then the available ones in order, up to the size.
      for (const auto& container : request->container_requests()) {
        auto* out = response->add_container_responses();
        std::vector<std::string> picked(container.must_include_deviceids().begin(),
                                        container.must_include_deviceids().end());
        for (const std::string& id : container.available_deviceids()) {
          if (static_cast<int>(picked.size()) >= container.allocation_size()) break;
          if (std::find(picked.begin(), picked.end(), id) == picked.end()) picked.push_back(id);
        }
        for (const std::string& id : picked) out->add_deviceids(id);
      }
      auto* reactor = context->DefaultReactor();
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }

    grpc::ServerUnaryReactor* Allocate(grpc::CallbackServerContext* context, const v1beta1::AllocateRequest* request,
                                       v1beta1::AllocateResponse* response) override {
      auto* reactor = context->DefaultReactor();
      for (const auto& container : request->container_requests()) {
        std::string visible;
        auto* out = response->add_container_responses();
        for (const std::string& id : container.devices_ids()) {
          if (!plugin_.Knows(id)) {
            reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "unknown device " + id));
            return reactor;
          }
          visible += (visible.empty() ? "" : ",") + id;
          out->add_cdi_devices()->set_name("nvidia.com/gpu=" + id);
        }
        (*out->mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = visible;
      }
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }

    grpc::ServerUnaryReactor* PreStartContainer(grpc::CallbackServerContext* context,
                                                const v1beta1::PreStartContainerRequest* request,
                                                v1beta1::PreStartContainerResponse*) override {
      {
        std::lock_guard lock(plugin_.mutex_);
        plugin_.prestart_calls_.emplace_back(request->devices_ids().begin(), request->devices_ids().end());
      }
      auto* reactor = context->DefaultReactor();
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }

   private:
    FakeDevicePlugin& plugin_;
  };

  v1beta1::ListAndWatchResponse CurrentList() {
    std::lock_guard lock(mutex_);
    v1beta1::ListAndWatchResponse list;
    for (const DeviceInfo& device : config_.devices) {
      auto* out = list.add_devices();
      out->set_id(device.id);
      out->set_health(device.health);
      for (std::int64_t node : device.numa_nodes) out->mutable_topology()->add_nodes()->set_id(node);
    }
    return list;
  }
  bool Knows(const std::string& id) {
    std::lock_guard lock(mutex_);
    return std::any_of(config_.devices.begin(), config_.devices.end(), [&](const DeviceInfo& d) { return d.id == id; });
  }
  int OpenStreamsLocked() {
    return static_cast<int>(std::count_if(streams_.begin(), streams_.end(), [](const auto& s) { return s->Open(); }));
  }
  void Changed() {
    std::lock_guard lock(mutex_);
    changed_.notify_all();
  }

  fs::path dir_;
  std::mutex mutex_;
  std::condition_variable changed_;
  Config config_;
  std::vector<std::shared_ptr<Stream>> streams_;
  std::vector<std::vector<std::string>> prestart_calls_;
  int preferred_calls_ = 0;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
};

// ---- a fake DRA plugin ----------------------------------------------------------------------

namespace dra1 = k8s::io::kubelet::pkg::apis::dra::v1;
namespace dra1beta1 = k8s::io::kubelet::pkg::apis::dra::v1beta1;

class FakeDraPlugin {
 public:
  struct Config {
    std::string driver = kDriver;
    std::string type = "DRAPlugin";
    std::vector<std::string> supported_versions{"v1.DRAPlugin", "v1beta1.DRAPlugin"};
    bool serve_v1 = true;
    bool serve_v1beta1 = true;
    std::string endpoint;  // empty: <kubelet>/plugins/<driver>/dra.sock
    std::string socket_name;  // in plugins_registry; empty: <driver>-reg.sock
  };

  FakeDraPlugin(const fs::path& kubelet_dir, Config config)
      : config_(std::move(config)),
        registration_socket_(kubelet_dir / "plugins_registry" /
                             (config_.socket_name.empty() ? config_.driver + "-reg.sock" : config_.socket_name)),
        dra_socket_(config_.endpoint.empty() ? kubelet_dir / "plugins" / config_.driver / "dra.sock"
                                             : fs::path(config_.endpoint)) {}
  ~FakeDraPlugin() {
    StopRegistration();
    StopDra();
  }

  const fs::path& RegistrationSocket() const { return registration_socket_; }
  const fs::path& DraSocket() const { return dra_socket_; }

  // The DRA service first, then the registration socket (the kubelet may dial it at once).
  void ServeDra() {
    fs::create_directories(dra_socket_.parent_path());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + dra_socket_.string(), grpc::InsecureServerCredentials());
    if (config_.serve_v1) builder.RegisterService(&v1_);
    if (config_.serve_v1beta1) builder.RegisterService(&v1beta1_);
    dra_server_ = builder.BuildAndStart();
    ASSERT_TRUE(dra_server_);
  }
  void ServeRegistration() {
    fs::create_directories(registration_socket_.parent_path());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + registration_socket_.string(), grpc::InsecureServerCredentials());
    builder.RegisterService(&registration_);
    registration_server_ = builder.BuildAndStart();
    ASSERT_TRUE(registration_server_);
  }
  void Serve() {
    ServeDra();
    ServeRegistration();
  }
  // The plugin leaves: its registration socket goes away.
  void StopRegistration() {
    if (!registration_server_) return;
    registration_server_->Shutdown(std::chrono::system_clock::now() + 2s);
    registration_server_->Wait();
    registration_server_.reset();
    std::error_code ec;
    fs::remove(registration_socket_, ec);
  }
  void StopDra() {
    if (!dra_server_) return;
    dra_server_->Shutdown(std::chrono::system_clock::now() + 2s);
    dra_server_->Wait();
    dra_server_.reset();
  }

  void AnswerGetInfo(bool answer) {
    std::lock_guard lock(mutex_);
    answer_getinfo_ = answer;
  }

  // Until the kubelet has sent `count` NotifyRegistrationStatus calls; returns them.
  std::vector<pluginregistration::RegistrationStatus> WaitForNotifications(std::size_t count) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, kWait, [&] { return notifications_.size() >= count; });
    return notifications_;
  }

  int Calls(const std::string& what) {
    std::lock_guard lock(mutex_);
    return calls_[what];
  }

 private:
  class Registration final : public pluginregistration::Registration::Service {
   public:
    explicit Registration(FakeDraPlugin& plugin) : plugin_(plugin) {}
    grpc::Status GetInfo(grpc::ServerContext*, const pluginregistration::InfoRequest*,
                         pluginregistration::PluginInfo* info) override {
      std::lock_guard lock(plugin_.mutex_);
      ++plugin_.calls_["GetInfo"];
      if (!plugin_.answer_getinfo_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not answering");
      info->set_type(plugin_.config_.type);
      info->set_name(plugin_.config_.driver);
      info->set_endpoint(plugin_.dra_socket_.string());
      for (const std::string& version : plugin_.config_.supported_versions) info->add_supported_versions(version);
      return grpc::Status::OK;
    }
    grpc::Status NotifyRegistrationStatus(grpc::ServerContext*, const pluginregistration::RegistrationStatus* status,
                                          pluginregistration::RegistrationStatusResponse*) override {
      std::lock_guard lock(plugin_.mutex_);
      plugin_.notifications_.push_back(*status);
      plugin_.changed_.notify_all();
      // As the upstream kubeletplugin helper does.
      if (!status->plugin_registered()) return grpc::Status(grpc::StatusCode::UNKNOWN, "failed registration: " + status->error());
      return grpc::Status::OK;
    }

   private:
    FakeDraPlugin& plugin_;
  };

  // Claims named "bad" fail, claims named "skip" get no entry at all.
  template <typename Api, typename PrepareRequest, typename PrepareResponse, typename UnprepareRequest,
            typename UnprepareResponse>
  class Dra final : public Api::Service {
   public:
    Dra(FakeDraPlugin& plugin, std::string version) : plugin_(plugin), version_(std::move(version)) {}
    grpc::Status NodePrepareResources(grpc::ServerContext*, const PrepareRequest* request,
                                      PrepareResponse* response) override {
      plugin_.Count("prepare-" + version_);
      for (const auto& claim : request->claims()) {
        if (claim.name() == "skip") continue;
        auto& out = (*response->mutable_claims())[claim.uid()];
        if (claim.name() == "bad") {
          out.set_error("cannot prepare " + claim.namespace_() + "/" + claim.name());
          continue;
        }
        auto* device = out.add_devices();
        device->add_request_names("gpu");
        device->set_pool_name("node-0");
        device->set_device_name("gpu-0");
        device->add_cdi_device_ids("k8s.gpu.example.com/claim=" + claim.uid());
      }
      return grpc::Status::OK;
    }
    grpc::Status NodeUnprepareResources(grpc::ServerContext*, const UnprepareRequest* request,
                                        UnprepareResponse* response) override {
      plugin_.Count("unprepare-" + version_);
      for (const auto& claim : request->claims()) {
        auto& out = (*response->mutable_claims())[claim.uid()];
        if (claim.name() == "bad") out.set_error("cannot unprepare");
      }
      return grpc::Status::OK;
    }

   private:
    FakeDraPlugin& plugin_;
    std::string version_;
  };

  void Count(const std::string& what) {
    std::lock_guard lock(mutex_);
    ++calls_[what];
  }

  Config config_;
  fs::path registration_socket_;
  fs::path dra_socket_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool answer_getinfo_ = true;
  std::vector<pluginregistration::RegistrationStatus> notifications_;
  std::map<std::string, int> calls_;
  Registration registration_{*this};
  Dra<dra1::DRAPlugin, dra1::NodePrepareResourcesRequest, dra1::NodePrepareResourcesResponse,
      dra1::NodeUnprepareResourcesRequest, dra1::NodeUnprepareResourcesResponse>
      v1_{*this, "v1"};
  Dra<dra1beta1::DRAPlugin, dra1beta1::NodePrepareResourcesRequest, dra1beta1::NodePrepareResourcesResponse,
      dra1beta1::NodeUnprepareResourcesRequest, dra1beta1::NodeUnprepareResourcesResponse>
      v1beta1_{*this, "v1beta1"};
  std::unique_ptr<grpc::Server> dra_server_;
  std::unique_ptr<grpc::Server> registration_server_;
};

FakeDraPlugin::Config DraConfig(std::string driver,
                                std::vector<std::string> versions = {"v1.DRAPlugin", "v1beta1.DRAPlugin"},
                                std::string type = "DRAPlugin", bool serve_v1 = true) {
  FakeDraPlugin::Config config;
  config.driver = std::move(driver);
  config.supported_versions = std::move(versions);
  config.type = std::move(type);
  config.serve_v1 = serve_v1;
  return config;
}

// ---- fixture --------------------------------------------------------------------------------

class KubeletSimTest : public ::testing::Test {
 protected:
  KubeletSimTest() {
    options_.kubelet_dir = temp_.Path() / "kubelet";
    options_.dial_timeout = 2s;
    options_.log = [this](std::string_view line) {
      std::lock_guard lock(log_mutex_);
      log_.emplace_back(line);
    };
  }
  ~KubeletSimTest() override {
    // The simulator first: its connections go before the plugins' servers.
    if (sim_) sim_->Stop();
    plugins_.clear();
    dra_plugins_.clear();
    sim_.reset();
  }

  KubeletSim& StartSim() {
    sim_ = std::make_unique<KubeletSim>(options_);
    sim_->Start();
    return *sim_;
  }

  FakeDevicePlugin& AddDevicePlugin(FakeDevicePlugin::Config config = {}) {
    if (config.devices.empty()) config.devices = {{"GPU-0", "Healthy", {0}}, {"GPU-1", "Healthy", {1}}};
    plugins_.push_back(std::make_unique<FakeDevicePlugin>(options_.kubelet_dir / "device-plugins", std::move(config)));
    return *plugins_.back();
  }

  FakeDraPlugin& AddDraPlugin(FakeDraPlugin::Config config = {}) {
    dra_plugins_.push_back(std::make_unique<FakeDraPlugin>(options_.kubelet_dir, std::move(config)));
    return *dra_plugins_.back();
  }

  std::vector<std::string> Log() {
    std::lock_guard lock(log_mutex_);
    return log_;
  }

  gns::test::TempDir temp_{"gks"};  // short: unix socket paths must stay under 108 bytes
  KubeletSimOptions options_;
  std::mutex log_mutex_;
  std::vector<std::string> log_;
  std::unique_ptr<KubeletSim> sim_;
  std::vector<std::unique_ptr<FakeDevicePlugin>> plugins_;
  std::vector<std::unique_ptr<FakeDraPlugin>> dra_plugins_;
};

// ---- device plugin side ---------------------------------------------------------------------

TEST(IsExtendedResourceNameTest, FollowsTheKubeletRules) {
  EXPECT_TRUE(IsExtendedResourceName("nvidia.com/gpu"));
  EXPECT_TRUE(IsExtendedResourceName("example.com/foo-bar_baz.1"));
  EXPECT_FALSE(IsExtendedResourceName("gpu"));                    // no domain: native
  EXPECT_FALSE(IsExtendedResourceName("kubernetes.io/gpu"));      // prefixed native
  EXPECT_FALSE(IsExtendedResourceName("foo.kubernetes.io/gpu"));
  EXPECT_FALSE(IsExtendedResourceName("requests.example.com/x")); // reserved for quota
  EXPECT_FALSE(IsExtendedResourceName("example.com/"));
  EXPECT_FALSE(IsExtendedResourceName("Example.com/gpu"));        // prefix must be DNS-1123
  EXPECT_FALSE(IsExtendedResourceName("nvidia.com/gpu/x"));
  EXPECT_FALSE(IsExtendedResourceName("nvidia.com/-gpu"));
  EXPECT_FALSE(IsExtendedResourceName("nvidia.com/" + std::string(64, 'g')));
  EXPECT_TRUE(IsExtendedResourceName("nvidia.com/" + std::string(63, 'g')));
}

TEST_F(KubeletSimTest, PreparesDevicePluginDirectoryLikeTheKubelet) {
  const fs::path dir = options_.kubelet_dir / "device-plugins";
  fs::create_directories(dir / "subdir");
  MakeStaleSocket(dir / "stale.sock");
  std::ofstream(dir / "junk").put('x');
  std::ofstream(dir / "kubelet_internal_checkpoint") << "{}";

  KubeletSim& sim = StartSim();
  EXPECT_FALSE(fs::exists(dir / "stale.sock"));
  EXPECT_FALSE(fs::exists(dir / "junk"));
  EXPECT_TRUE(fs::exists(dir / "kubelet_internal_checkpoint"));
  EXPECT_TRUE(fs::is_directory(dir / "subdir"));
  EXPECT_TRUE(fs::is_socket(sim.KubeletSocket()));
  EXPECT_EQ(sim.KubeletSocket(), dir / "kubelet.sock");
  EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms(0750));
  EXPECT_TRUE(fs::is_directory(sim.PluginsRegistryDir()));
  EXPECT_TRUE(fs::exists(dir / "DEPRECATION"));
}

TEST_F(KubeletSimTest, RegistrationAndListAndWatchUpdatesArrive) {
  KubeletSim& sim = StartSim();
  FakeDevicePlugin::Config config;
  config.options.get_preferred_allocation_available = true;
  FakeDevicePlugin& plugin = AddDevicePlugin(config);
  plugin.Serve();
  const SteadyTime before = std::chrono::steady_clock::now();
  ASSERT_TRUE(plugin.Register(sim.KubeletSocket()).ok());

  // Register returns after the dial and GetDevicePluginOptions, as the kubelet's does.
  EXPECT_EQ(sim.Registrations(kGpu), 1);
  EXPECT_TRUE(sim.Connected(kGpu));
  EXPECT_EQ(sim.LastOptions(kGpu), (DevicePluginOptions{false, true}));
  ASSERT_TRUE(sim.WaitForDevices(kGpu, [](const auto& devices) { return devices.size() == 2; }, kWait));
  EXPECT_EQ(sim.Devices(kGpu)[1], (DeviceInfo{"GPU-1", "Healthy", {1}}));

  plugin.SetDevices({{"GPU-0", "Healthy", {0}}, {"GPU-1", "Unhealthy", {1}}});
  ASSERT_TRUE(sim.WaitForDeviceHealth(kGpu, "GPU-1", "Unhealthy", kWait));
  EXPECT_EQ(sim.ListAndWatchMessages(kGpu), 2u);

  const std::optional<ResourceState> resource = sim.Resource(kGpu);
  ASSERT_TRUE(resource);
  EXPECT_EQ(resource->endpoint, plugin.SocketPath().string());
  EXPECT_EQ(resource->CountHealth("Healthy"), 1u);
  EXPECT_EQ(resource->CountHealth("Unhealthy"), 1u);
  ASSERT_EQ(resource->updates.size(), 2u);
  EXPECT_GE(resource->updates[0].received, before);
  EXPECT_LE(resource->updates[0].received, resource->updates[1].received);
  EXPECT_EQ(resource->updates[1].connection, resource->connection);
  EXPECT_THAT(Log(), ::testing::Contains(std::string("nvidia.com/gpu: 2 devices, 1 Healthy, 1 Unhealthy (GPU-1)")));
}

TEST_F(KubeletSimTest, InvalidRegistrationsAreRejectedWithAGrpcError) {
  options_.dial_timeout = 300ms;
  KubeletSim& sim = StartSim();
  FakeDevicePlugin& plugin = AddDevicePlugin();
  plugin.Serve();

  grpc::Status status = plugin.Register(sim.KubeletSocket(), "v1");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(status.error_message(),
            "requested API version \"v1\" is not supported by kubelet. Supported version is [\"v1beta1\"]");

  status = plugin.Register(sim.KubeletSocket(), "v1beta1", "gpu");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_EQ(status.error_message(), "the ResourceName \"gpu\" is invalid");
  EXPECT_FALSE(plugin.Register(sim.KubeletSocket(), "v1beta1", "kubernetes.io/gpu").ok());

  // A plugin that registers before serving its socket cannot be dialled.
  FakeDevicePlugin::Config silent_config;
  silent_config.resource = "example.com/silent";
  silent_config.endpoint = "silent.sock";
  FakeDevicePlugin& silent = AddDevicePlugin(silent_config);
  status = silent.Register(sim.KubeletSocket());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNKNOWN);
  EXPECT_THAT(status.error_message(), HasSubstr("failed to dial device plugin"));

  const KubeletState state = sim.State();
  ASSERT_EQ(state.rejected.size(), 4u);
  EXPECT_EQ(state.rejected[0].version, "v1");
  EXPECT_EQ(state.rejected[1].resource, "gpu");
  EXPECT_EQ(state.rejected[3].resource, "example.com/silent");
  EXPECT_EQ(state.FindResource("example.com/silent"), nullptr);
  EXPECT_EQ(sim.Registrations(kGpu), 0);
}

TEST_F(KubeletSimTest, AllocatePreferredAllocationAndPreStartRoundTrip) {
  KubeletSim& sim = StartSim();
  FakeDevicePlugin::Config config;
  config.options = {.pre_start_required = true, .get_preferred_allocation_available = true};
  config.devices = {{"GPU-0", "Healthy", {}}, {"GPU-1", "Healthy", {}}, {"GPU-2", "Healthy", {}}};
  FakeDevicePlugin& plugin = AddDevicePlugin(config);
  plugin.Serve();
  ASSERT_TRUE(plugin.Register(sim.KubeletSocket()).ok());

  const auto allocated = sim.Allocate(kGpu, {{"GPU-0"}, {"GPU-1", "GPU-2"}});
  ASSERT_TRUE(allocated.ok()) << allocated.status.ToString();
  ASSERT_EQ(allocated.response.container_responses_size(), 2);
  EXPECT_EQ(allocated.response.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-0");
  EXPECT_EQ(allocated.response.container_responses(1).envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-1,GPU-2");
  EXPECT_EQ(allocated.response.container_responses(1).cdi_devices(1).name(), "nvidia.com/gpu=GPU-2");

  const auto refused = sim.Allocate(kGpu, {{"GPU-9"}});
  EXPECT_EQ(refused.status.code, grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(refused.status.message, "unknown device GPU-9");

  const auto preferred = sim.GetPreferredAllocation(kGpu, {"GPU-0", "GPU-1", "GPU-2"}, {"GPU-2"}, 2);
  ASSERT_TRUE(preferred.ok()) << preferred.status.ToString();
  ASSERT_EQ(preferred.response.container_responses_size(), 1);
  EXPECT_THAT(preferred.response.container_responses(0).deviceids(), ElementsAre("GPU-2", "GPU-0"));

  EXPECT_TRUE(sim.PreStartContainer(kGpu, {"GPU-1"}).ok());
  EXPECT_THAT(plugin.PreStartCalls(), ElementsAre(ElementsAre("GPU-1")));

  const auto unregistered = sim.Allocate("example.com/none", {{"x"}});
  EXPECT_EQ(unregistered.status.code, grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(KubeletSimTest, CallsThePluginDidNotAdvertiseAreRefused) {
  KubeletSim& sim = StartSim();
  FakeDevicePlugin& plugin = AddDevicePlugin();  // no options set
  plugin.Serve();
  ASSERT_TRUE(plugin.Register(sim.KubeletSocket()).ok());
  EXPECT_EQ(sim.GetPreferredAllocation(kGpu, {"GPU-0"}, {}, 1).status.code, grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(sim.PreStartContainer(kGpu, {"GPU-0"}).status.code, grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(plugin.PreferredCalls(), 0);
  EXPECT_TRUE(plugin.PreStartCalls().empty());
}

TEST_F(KubeletSimTest, RestartRemovesPluginSocketsAndThePluginReRegisters) {
  KubeletSim& sim = StartSim();
  FakeDevicePlugin& plugin = AddDevicePlugin();
  plugin.Serve();
  ASSERT_TRUE(plugin.Register(sim.KubeletSocket()).ok());
  ASSERT_TRUE(sim.WaitForDevices(kGpu, [](const auto& devices) { return devices.size() == 2; }, kWait));
  ASSERT_TRUE(plugin.WaitForOpenStreams(1));
  const fs::path checkpoint = sim.DevicePluginDir() / "kubelet_internal_checkpoint";
  std::ofstream(checkpoint) << "{}";

  sim.Restart();
  EXPECT_FALSE(fs::exists(plugin.SocketPath()));
  EXPECT_TRUE(fs::exists(checkpoint));
  EXPECT_TRUE(fs::is_socket(sim.KubeletSocket()));
  EXPECT_FALSE(sim.Connected(kGpu));
  EXPECT_EQ(sim.State().restarts, 1);
  // The kubelet side closed the ListAndWatch stream.
  EXPECT_TRUE(plugin.WaitForOpenStreams(0));
  // Not counted as the plugin going away.
  EXPECT_EQ(sim.Resource(kGpu)->disconnects, 0);

  // What a plugin does when it sees its socket gone: serve again, register again.
  plugin.Stop();
  plugin.Serve();
  ASSERT_TRUE(plugin.Register(sim.KubeletSocket()).ok());
  EXPECT_EQ(sim.Registrations(kGpu), 2);
  EXPECT_TRUE(sim.Connected(kGpu));
  ASSERT_TRUE(sim.WaitFor(
      [](const KubeletState& state) {
        const ResourceState* rs = state.FindResource(kGpu);
        return rs != nullptr && !rs->updates.empty() && rs->updates.back().connection == rs->connection;
      },
      kWait));
  EXPECT_TRUE(plugin.WaitForOpenStreams(1));
}

TEST_F(KubeletSimTest, ANewRegistrationReplacesTheOldConnection) {
  KubeletSim& sim = StartSim();
  FakeDevicePlugin& plugin = AddDevicePlugin();
  plugin.Serve();
  ASSERT_TRUE(plugin.Register(sim.KubeletSocket()).ok());
  ASSERT_TRUE(plugin.WaitForOpenStreams(1));
  ASSERT_TRUE(plugin.Register(sim.KubeletSocket()).ok());
  EXPECT_EQ(sim.Registrations(kGpu), 2);
  EXPECT_TRUE(plugin.WaitForOpenStreams(1));  // the first stream was closed by the kubelet
  EXPECT_TRUE(sim.Connected(kGpu));
  EXPECT_EQ(sim.Resource(kGpu)->disconnects, 0);
}

TEST_F(KubeletSimTest, APluginThatGoesAwayIsDetected) {
  KubeletSim& sim = StartSim();
  FakeDevicePlugin& plugin = AddDevicePlugin();
  plugin.Serve();
  ASSERT_TRUE(plugin.Register(sim.KubeletSocket()).ok());
  ASSERT_TRUE(sim.WaitForDevices(kGpu, [](const auto& devices) { return devices.size() == 2; }, kWait));

  plugin.Stop();
  ASSERT_TRUE(sim.WaitFor(
      [](const KubeletState& state) {
        const ResourceState* rs = state.FindResource(kGpu);
        return rs != nullptr && !rs->connected;
      },
      kWait));
  const ResourceState resource = *sim.Resource(kGpu);
  EXPECT_EQ(resource.disconnects, 1);
  EXPECT_THAT(resource.disconnect_reason, HasSubstr("ListAndWatch ended"));
  EXPECT_EQ(resource.devices.size(), 2u);  // the last list is kept
}

// ---- plugin watcher / DRA side ----------------------------------------------------------------

TEST_F(KubeletSimTest, DraPluginRegistersWithV1AndPrepareUnprepareRoundTrip) {
  KubeletSim& sim = StartSim();
  FakeDraPlugin& plugin = AddDraPlugin();
  plugin.Serve();

  ASSERT_TRUE(sim.WaitForDraDriver(kDriver, kWait));
  const auto notifications = plugin.WaitForNotifications(1);
  ASSERT_EQ(notifications.size(), 1u);
  EXPECT_TRUE(notifications[0].plugin_registered());
  EXPECT_EQ(notifications[0].error(), "");
  const DraDriverState driver = *sim.DraDriver(kDriver);
  ASSERT_EQ(driver.endpoints.size(), 1u);
  EXPECT_EQ(driver.Latest()->service, "v1.DRAPlugin");
  EXPECT_EQ(driver.Latest()->endpoint, plugin.DraSocket().string());
  EXPECT_EQ(driver.Latest()->registration_socket, plugin.RegistrationSocket().string());

  const std::vector<DraClaim> claims{{"default", "uid-1", "claim-1"}, {"default", "uid-2", "bad"}};
  const DraPrepareResult prepared = sim.NodePrepareResources(kDriver, claims);
  ASSERT_TRUE(prepared.ok()) << prepared.status.ToString();
  EXPECT_EQ(prepared.service, "v1.DRAPlugin");
  ASSERT_EQ(prepared.claims.size(), 2u);
  ASSERT_EQ(prepared.claims.at("uid-1").devices.size(), 1u);
  const DraPreparedDevice& device = prepared.claims.at("uid-1").devices[0];
  EXPECT_EQ(device.pool_name, "node-0");
  EXPECT_EQ(device.device_name, "gpu-0");
  EXPECT_THAT(device.request_names, ElementsAre("gpu"));
  EXPECT_THAT(device.cdi_device_ids, ElementsAre("k8s.gpu.example.com/claim=uid-1"));
  EXPECT_EQ(prepared.claims.at("uid-2").error, "cannot prepare default/bad");
  EXPECT_TRUE(prepared.missing_claims.empty());

  const DraUnprepareResult unprepared = sim.NodeUnprepareResources(kDriver, claims);
  ASSERT_TRUE(unprepared.ok());
  EXPECT_EQ(unprepared.claims.at("uid-1"), "");
  EXPECT_EQ(unprepared.claims.at("uid-2"), "cannot unprepare");
  EXPECT_EQ(plugin.Calls("prepare-v1"), 1);
  EXPECT_EQ(plugin.Calls("unprepare-v1"), 1);
  EXPECT_EQ(plugin.Calls("prepare-v1beta1"), 0);

  // Forcing the older service reaches the plugin's v1beta1 server.
  const DraPrepareResult forced = sim.NodePrepareResources(kDriver, {{"default", "uid-3", "skip"}}, DraVersion::kV1beta1);
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(forced.service, "v1beta1.DRAPlugin");
  EXPECT_THAT(forced.missing_claims, ElementsAre("uid-3"));
  EXPECT_EQ(plugin.Calls("prepare-v1beta1"), 1);
}

// ---- PodResourcesLister ------------------------------------------------------------------------

// A plain synchronous client, as dcgm-exporter or NVSentinel's metadata-collector would dial it.
std::unique_ptr<::v1::PodResourcesLister::Stub> PodResourcesClient(const KubeletSim& sim) {
  return ::v1::PodResourcesLister::NewStub(
      grpc::CreateChannel("unix:" + sim.PodResourcesSocket().string(), grpc::InsecureChannelCredentials()));
}

TEST_F(KubeletSimTest, PodResourcesListsWhatWasAllocatedAndPreparedForPods) {
  KubeletSim& sim = StartSim();
  EXPECT_EQ(sim.PodResourcesSocket(), options_.kubelet_dir / "pod-resources/kubelet.sock");
  FakeDevicePlugin::Config config;
  config.devices = {{"GPU-0", "Healthy", {0}}, {"GPU-1", "Healthy", {1}}, {"GPU-2", "Unhealthy", {1}}};
  FakeDevicePlugin& plugin = AddDevicePlugin(config);
  plugin.Serve();
  ASSERT_TRUE(plugin.Register(sim.KubeletSocket()).ok());
  ASSERT_TRUE(sim.WaitForDevices(kGpu, [](const auto& d) { return d.size() == 3; }, kWait));
  FakeDraPlugin& dra = AddDraPlugin();
  dra.Serve();
  ASSERT_TRUE(sim.WaitForDraDriver(kDriver, kWait));

  // A refused Allocate records nothing; a pod needs one container name per request.
  EXPECT_FALSE(sim.Allocate(kGpu, {{"GPU-9"}}, PodBinding{"ml", "bad", {"main"}}).ok());
  EXPECT_EQ(sim.Allocate(kGpu, {{"GPU-0"}}, PodBinding{"ml", "bad", {}}).status.code,
            grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(sim.Allocate(kGpu, {{"GPU-0"}, {"GPU-1"}}, PodBinding{"ml", "trainer", {"main", "side"}}).ok());
  ASSERT_TRUE(sim.NodePrepareResources(kDriver, {{"ml", "uid-1", "claim-1"}}, PodBinding{"ml", "trainer", {"main"}}).ok());

  auto client = PodResourcesClient(sim);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kWait);
  ::v1::ListPodResourcesResponse list;
  ASSERT_TRUE(client->List(&context, ::v1::ListPodResourcesRequest(), &list).ok());
  ASSERT_EQ(list.pod_resources_size(), 1);
  const auto& pod = list.pod_resources(0);
  EXPECT_EQ(pod.namespace_(), "ml");
  EXPECT_EQ(pod.name(), "trainer");
  ASSERT_EQ(pod.containers_size(), 2);
  EXPECT_EQ(pod.containers(0).name(), "main");
  ASSERT_EQ(pod.containers(0).devices_size(), 1);
  EXPECT_EQ(pod.containers(0).devices(0).resource_name(), kGpu);
  EXPECT_THAT(pod.containers(0).devices(0).device_ids(), ElementsAre("GPU-0"));
  ASSERT_EQ(pod.containers(0).dynamic_resources_size(), 1);
  const auto& dynamic = pod.containers(0).dynamic_resources(0);
  EXPECT_EQ(dynamic.claim_name(), "claim-1");
  EXPECT_EQ(dynamic.claim_namespace(), "ml");
  ASSERT_EQ(dynamic.claim_resources_size(), 1);
  EXPECT_EQ(dynamic.claim_resources(0).driver_name(), kDriver);
  EXPECT_EQ(dynamic.claim_resources(0).device_name(), "gpu-0");
  EXPECT_THAT(pod.containers(1).devices(0).device_ids(), ElementsAre("GPU-1"));

  grpc::ClientContext allocatable_context;
  ::v1::AllocatableResourcesResponse allocatable;
  ASSERT_TRUE(client->GetAllocatableResources(&allocatable_context, {}, &allocatable).ok());
  ASSERT_EQ(allocatable.devices_size(), 2);  // the Unhealthy one is not allocatable
  EXPECT_THAT(allocatable.devices(1).device_ids(), ElementsAre("GPU-1"));
  EXPECT_EQ(allocatable.devices(1).topology().nodes(0).id(), 1);

  // Unprepare drops the claim; a forgotten pod leaves the list; a restart keeps what is recorded.
  ASSERT_TRUE(sim.NodeUnprepareResources(kDriver, {{"ml", "uid-1", "claim-1"}}).ok());
  EXPECT_TRUE(sim.Pods().at("ml/trainer").containers.at("main").dynamic_resources.empty());
  sim.InjectPodDevices("ml", "other", "main", kGpu, {"GPU-unknown"});
  EXPECT_TRUE(sim.ForgetPod("ml", "trainer"));
  EXPECT_FALSE(sim.ForgetPod("ml", "trainer"));
  sim.Restart();
  grpc::ClientContext after_context;
  after_context.set_deadline(std::chrono::system_clock::now() + kWait);
  after_context.set_wait_for_ready(true);
  ::v1::ListPodResourcesResponse after;
  ASSERT_TRUE(PodResourcesClient(sim)->List(&after_context, {}, &after).ok());
  ASSERT_EQ(after.pod_resources_size(), 1);
  EXPECT_EQ(after.pod_resources(0).name(), "other");
  EXPECT_EQ(sim.State().pod_resources_lists, 2u);
}

TEST_F(KubeletSimTest, PodResourcesSocketCanBeAbsentThenServed) {
  using nlohmann::json;
  options_.serve_pod_resources = false;
  KubeletSim& sim = StartSim();
  EXPECT_FALSE(fs::exists(sim.PodResourcesSocket()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 2s);
  ::v1::ListPodResourcesResponse list;
  EXPECT_EQ(PodResourcesClient(sim)->List(&context, {}, &list).error_code(), grpc::StatusCode::UNAVAILABLE);
  sim.StartPodResources();
  EXPECT_TRUE(fs::is_socket(sim.PodResourcesSocket()));
  EXPECT_EQ(fs::status(sim.PodResourcesSocket().parent_path()).permissions() & fs::perms::all, fs::perms(0750));
  const json reply = json::parse(HandleKubeletCommand(sim, "pod-resources-socket off"));
  EXPECT_TRUE(reply["ok"].get<bool>());
  EXPECT_FALSE(fs::exists(sim.PodResourcesSocket()));
  const json listed = json::parse(HandleKubeletCommand(sim, "pod-resources"));
  EXPECT_FALSE(listed["serving"].get<bool>());
  EXPECT_FALSE(json::parse(HandleKubeletCommand(sim, "allocate --containers=a nvidia.com/gpu GPU-0"))["ok"].get<bool>());
  EXPECT_FALSE(json::parse(HandleKubeletCommand(sim, "forget-pod nope"))["ok"].get<bool>());
}

TEST_F(KubeletSimTest, AV1beta1OnlyPluginIsServedThroughV1beta1) {
  KubeletSim& sim = StartSim();
  FakeDraPlugin& plugin = AddDraPlugin(DraConfig(kDriver, {"v1beta1.DRAPlugin"}, "DRAPlugin", /*serve_v1=*/false));
  plugin.Serve();
  ASSERT_TRUE(sim.WaitForDraDriver(kDriver, kWait));
  EXPECT_EQ(sim.DraDriver(kDriver)->Latest()->service, "v1beta1.DRAPlugin");

  const DraPrepareResult prepared = sim.NodePrepareResources(kDriver, {{"default", "uid-1", "claim-1"}});
  ASSERT_TRUE(prepared.ok()) << prepared.status.ToString();
  EXPECT_EQ(prepared.service, "v1beta1.DRAPlugin");
  EXPECT_EQ(plugin.Calls("prepare-v1beta1"), 1);
  EXPECT_TRUE(sim.NodeUnprepareResources(kDriver, {{"default", "uid-1", "claim-1"}}).ok());
  EXPECT_EQ(plugin.Calls("unprepare-v1beta1"), 1);

  // The plugin does not serve v1: forcing it gets the gRPC error back.
  EXPECT_EQ(sim.NodePrepareResources(kDriver, {{"default", "uid-1", "claim-1"}}, DraVersion::kV1).status.code,
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(KubeletSimTest, AnOlderKubeletPicksV1beta1) {
  options_.dra_services = {"v1beta1.DRAPlugin"};  // a 1.32 / 1.33 kubelet
  KubeletSim& sim = StartSim();
  AddDraPlugin().Serve();
  ASSERT_TRUE(sim.WaitForDraDriver(kDriver, kWait));
  EXPECT_EQ(sim.DraDriver(kDriver)->Latest()->service, "v1beta1.DRAPlugin");
}

TEST_F(KubeletSimTest, TheFirstServiceThePluginListsThatTheKubeletSpeaksWins) {
  // DRAPluginManager.validateSupportedServices walks the plugin's list, not the kubelet's.
  KubeletSim& sim = StartSim();
  AddDraPlugin(DraConfig(kDriver, {"v1alpha4.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAPlugin"})).Serve();
  ASSERT_TRUE(sim.WaitForDraDriver(kDriver, kWait));
  EXPECT_EQ(sim.DraDriver(kDriver)->Latest()->service, "v1beta1.DRAPlugin");
}

TEST_F(KubeletSimTest, InvalidPluginsAreToldWhy) {
  options_.registration_retry_initial = 0ms;  // one attempt each
  KubeletSim& sim = StartSim();
  struct Case {
    FakeDraPlugin::Config config;
    bool serve_dra;
    std::string error;
  };
  const std::vector<Case> cases{
      {DraConfig("empty.example.com", {}), true,
       "empty list of supported gRPC services (aka supported versions)"},
      {DraConfig("old.example.com", {"v1alpha4.DRAPlugin"}), true,
       "none of services supported by the plugin ([\"v1alpha4.DRAPlugin\"]) are supported by the kubelet "
       "([\"v1.DRAPlugin\" \"v1beta1.DRAPlugin\"])"},
      // The kubelet's CSI handler (the simulator has one since gkm-csi registers through it)
      // takes only versions of the form v1.x.
      {DraConfig("csi.example.com", {"v1.DRAPlugin"}, "CSIPlugin"), true,
       "None of the versions specified [\"v1.DRAPlugin\"] are supported"},
      {DraConfig("other.example.com", {"v1.DRAPlugin"}, "FooPlugin"), true,
       "no handler registered for plugin type: FooPlugin"},
      {DraConfig("late.example.com"), false, "is not a socket"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.config.driver);
    FakeDraPlugin& plugin = AddDraPlugin(c.config);
    if (c.serve_dra) plugin.ServeDra();
    plugin.ServeRegistration();
    const auto notifications = plugin.WaitForNotifications(1);
    ASSERT_EQ(notifications.size(), 1u);
    EXPECT_FALSE(notifications[0].plugin_registered());
    EXPECT_THAT(notifications[0].error(), HasSubstr(c.error));
    EXPECT_THAT(notifications[0].error(), HasSubstr("RegisterPlugin error -- "));
    EXPECT_FALSE(sim.WaitForDraDriver(c.config.driver, 0ms));
  }
  // The simulator records an attempt once the plugin has answered NotifyRegistrationStatus.
  ASSERT_TRUE(sim.WaitFor(
      [](const KubeletState& state) {
        return std::count_if(state.watcher_events.begin(), state.watcher_events.end(), [](const PluginWatcherEvent& e) {
                 return e.kind == PluginWatcherEvent::Kind::kRejected;
               }) == 5;
      },
      kWait));
  const KubeletState state = sim.State();
  for (const auto& [socket, ps] : state.plugin_sockets) {
    EXPECT_FALSE(ps.registered) << socket;
    EXPECT_EQ(ps.last_notify.code, grpc::StatusCode::UNKNOWN) << socket;  // the helper's answer to "false"
  }
}

TEST_F(KubeletSimTest, AFailedRegistrationIsRetriedFromGetInfo) {
  options_.registration_retry_initial = 20ms;
  KubeletSim& sim = StartSim();
  FakeDraPlugin& plugin = AddDraPlugin();
  plugin.ServeRegistration();  // DRA socket not served yet: refused
  ASSERT_FALSE(plugin.WaitForNotifications(1).at(0).plugin_registered());
  plugin.ServeDra();
  ASSERT_TRUE(sim.WaitForDraDriver(kDriver, kWait));
  EXPECT_TRUE(plugin.WaitForNotifications(2).back().plugin_registered());
}

TEST_F(KubeletSimTest, RemovingTheRegistrationSocketDeregisters) {
  KubeletSim& sim = StartSim();
  FakeDraPlugin& plugin = AddDraPlugin();
  plugin.Serve();
  ASSERT_TRUE(sim.WaitForDraDriver(kDriver, kWait));

  plugin.StopRegistration();
  ASSERT_TRUE(sim.WaitFor(
      [](const KubeletState& state) {
        const DraDriverState* driver = state.FindDraDriver(kDriver);
        return driver != nullptr && !driver->registered();
      },
      kWait));
  const DraPrepareResult prepared = sim.NodePrepareResources(kDriver, {{"default", "uid-1", "claim-1"}});
  EXPECT_EQ(prepared.status.code, grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(prepared.status.message, "DRA driver gpu.example.com is not registered");
  const KubeletState state = sim.State();
  EXPECT_EQ(state.watcher_events.back().kind, PluginWatcherEvent::Kind::kDeregistered);
}

TEST_F(KubeletSimTest, GetInfoProbeDeregistersAfterTwoFailures) {
  KubeletSim& sim = StartSim();
  FakeDraPlugin& plugin = AddDraPlugin();
  plugin.Serve();
  ASSERT_TRUE(sim.WaitForDraDriver(kDriver, kWait));
  const std::string socket = plugin.RegistrationSocket().string();

  EXPECT_TRUE(sim.ProbePluginSockets().at(socket).ok());
  plugin.AnswerGetInfo(false);
  EXPECT_EQ(sim.ProbePluginSockets().at(socket).code, grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(sim.DraDriver(kDriver)->registered());  // one failure is tolerated
  EXPECT_FALSE(sim.ProbePluginSockets().at(socket).ok());
  EXPECT_FALSE(sim.DraDriver(kDriver)->registered());

  const PluginSocketState ps = sim.State().plugin_sockets.at(socket);
  EXPECT_EQ(ps.getinfo_ok, 2);  // registration + first probe
  EXPECT_EQ(ps.getinfo_failures, 2);
  EXPECT_FALSE(ps.registered);
}

TEST_F(KubeletSimTest, ThePeriodicProbeDeregistersAPluginThatStopsAnswering) {
  options_.probe_interval = 20ms;
  KubeletSim& sim = StartSim();
  FakeDraPlugin& plugin = AddDraPlugin();
  plugin.Serve();
  ASSERT_TRUE(sim.WaitForDraDriver(kDriver, kWait));
  plugin.AnswerGetInfo(false);
  ASSERT_TRUE(sim.WaitFor(
      [](const KubeletState& state) {
        const DraDriverState* driver = state.FindDraDriver(kDriver);
        return driver != nullptr && !driver->registered();
      },
      kWait));
  EXPECT_GE(plugin.Calls("GetInfo"), 3);
}

TEST_F(KubeletSimTest, SocketsAlreadyThereAreRegisteredAtStartAndAgainAfterRestart) {
  FakeDraPlugin& plugin = AddDraPlugin();
  plugin.Serve();  // before the kubelet starts
  KubeletSim& sim = StartSim();
  ASSERT_TRUE(sim.WaitForDraDriver(kDriver, kWait));
  EXPECT_TRUE(plugin.WaitForNotifications(1).at(0).plugin_registered());

  sim.Restart();
  ASSERT_TRUE(sim.WaitFor(
      [](const KubeletState& state) {
        const DraDriverState* driver = state.FindDraDriver(kDriver);
        return driver != nullptr && driver->registrations == 2 && driver->registered();
      },
      kWait));
  EXPECT_TRUE(plugin.WaitForNotifications(2).at(1).plugin_registered());
  EXPECT_EQ(sim.DraDriver(kDriver)->endpoints.size(), 1u);
  EXPECT_TRUE(sim.NodePrepareResources(kDriver, {{"default", "uid-1", "claim-1"}}).ok());
}

TEST_F(KubeletSimTest, ADevicePluginCanRegisterThroughPluginsRegistry) {
  KubeletSim& sim = StartSim();
  FakeDevicePlugin& device_plugin = AddDevicePlugin();
  device_plugin.Serve();
  FakeDraPlugin::Config config = DraConfig(kGpu, {"v1beta1"}, "DevicePlugin");
  config.endpoint = device_plugin.SocketPath();
  config.socket_name = "gpu-dp-reg.sock";
  FakeDraPlugin& registration = AddDraPlugin(config);
  registration.ServeRegistration();
  EXPECT_TRUE(registration.WaitForNotifications(1).at(0).plugin_registered());
  ASSERT_TRUE(sim.WaitForDevices(kGpu, [](const auto& devices) { return devices.size() == 2; }, kWait));
  EXPECT_EQ(sim.Resource(kGpu)->registration_socket, registration.RegistrationSocket().string());
  EXPECT_EQ(sim.Resource(kGpu)->endpoint, device_plugin.SocketPath().string());

  registration.StopRegistration();
  ASSERT_TRUE(sim.WaitFor(
      [](const KubeletState& state) {
        const ResourceState* rs = state.FindResource(kGpu);
        return rs != nullptr && !rs->connected;
      },
      kWait));
  EXPECT_THAT(sim.Resource(kGpu)->disconnect_reason, HasSubstr("deregistered"));
  EXPECT_TRUE(device_plugin.WaitForOpenStreams(0));

  // The name must be an extended resource name here too.
  config.driver = "gpu";
  config.socket_name = "bad-dp-reg.sock";
  FakeDraPlugin& invalid = AddDraPlugin(config);
  invalid.ServeRegistration();
  EXPECT_THAT(invalid.WaitForNotifications(1).at(0).error(),
              HasSubstr("invalid name of device plugin socket: the ResourceName \"gpu\" is invalid"));
}

TEST_F(KubeletSimTest, ControlCommandsAnswerInJson) {
  KubeletSim& sim = StartSim();
  FakeDevicePlugin& plugin = AddDevicePlugin();
  plugin.Serve();
  ASSERT_TRUE(plugin.Register(sim.KubeletSocket()).ok());
  ASSERT_TRUE(sim.WaitForDevices(kGpu, [](const auto& devices) { return devices.size() == 2; }, kWait));
  FakeDraPlugin& dra = AddDraPlugin();
  dra.Serve();
  ASSERT_TRUE(sim.WaitForDraDriver(kDriver, kWait));

  using nlohmann::json;
  json state = json::parse(HandleKubeletCommand(sim, "state"));
  EXPECT_TRUE(state["ok"].get<bool>());
  EXPECT_EQ(state["resources"][kGpu]["healthy"], 2);
  EXPECT_EQ(state["dra_drivers"][kDriver]["endpoints"][0]["service"], "v1.DRAPlugin");

  json allocate = json::parse(HandleKubeletCommand(sim, "allocate nvidia.com/gpu GPU-0 GPU-1"));
  ASSERT_TRUE(allocate["ok"].get<bool>()) << allocate.dump();
  EXPECT_EQ(allocate["response"]["container_responses"][1]["envs"]["NVIDIA_VISIBLE_DEVICES"], "GPU-1");
  json refused = json::parse(HandleKubeletCommand(sim, "allocate nvidia.com/gpu GPU-7"));
  EXPECT_FALSE(refused["ok"].get<bool>());
  EXPECT_EQ(refused["code"], "INVALID_ARGUMENT");

  json prepare = json::parse(HandleKubeletCommand(
      sim, "prepare gpu.example.com {\"namespace\": \"default\", \"uid\": \"u1\", \"name\": \"c1\"}"));
  ASSERT_TRUE(prepare["ok"].get<bool>()) << prepare.dump();
  EXPECT_EQ(prepare["claims"]["u1"]["devices"][0]["device_name"], "gpu-0");
  json forced = json::parse(HandleKubeletCommand(
      sim, "unprepare --version=v1beta1 gpu.example.com [{\"namespace\":\"default\",\"uid\":\"u1\",\"name\":\"c1\"}]"));
  ASSERT_TRUE(forced["ok"].get<bool>()) << forced.dump();
  EXPECT_EQ(forced["service"], "v1beta1.DRAPlugin");
  EXPECT_EQ(dra.Calls("unprepare-v1beta1"), 1);

  EXPECT_FALSE(json::parse(HandleKubeletCommand(sim, "prepare gpu.example.com {not json"))["ok"].get<bool>());
  EXPECT_FALSE(json::parse(HandleKubeletCommand(sim, "frobnicate"))["ok"].get<bool>());
  EXPECT_TRUE(json::parse(HandleKubeletCommand(sim, "restart"))["ok"].get<bool>());
  EXPECT_FALSE(fs::exists(plugin.SocketPath()));
}

}  // namespace
}  // namespace gns::sim
