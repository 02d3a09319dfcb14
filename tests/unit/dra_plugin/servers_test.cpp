// The registration and DRA servers with real gRPC clients (the generated stubs) on unix sockets:
// GetInfo, NotifyRegistrationStatus, and NodePrepareResources / NodeUnprepareResources through
// both v1 and v1beta1 into one fake handler, answered now or later; socket and directory modes;
// shutdown failing calls the handler never answered. The loop is driven by LoopHarness; clients
// block on other threads (OffLoop). No sleeps.
#include "dra_plugin/dra_server.hpp"
#include "dra_plugin/plugin_paths.hpp"
#include "dra_plugin/registration_server.hpp"
#include "support/loop_harness.hpp"
#include "support/temp_dir.hpp"

#include "dra/v1/api.grpc.pb.h"
#include "dra/v1beta1/api.grpc.pb.h"
#include "dra_health/v1/api.grpc.pb.h"
#include "dra_health/v1alpha1/api.grpc.pb.h"
#include "dra_health/v1beta1/api.grpc.pb.h"
#include "pluginregistration/v1/api.grpc.pb.h"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include <future>
#include <mutex>

namespace gns::dra {
namespace {

namespace v1 = k8s::io::kubelet::pkg::apis::dra::v1;
namespace v1beta1 = k8s::io::kubelet::pkg::apis::dra::v1beta1;

// The servers under test, named for the compute-domain driver as before the core was shared.
constexpr std::string_view kDriverName = "compute-domain.nvidia.com";

// Answers at once unless `hold` is set; records what it was asked, on the loop.
class FakeHandler : public DraHandler {
 public:
  explicit FakeHandler(Loop& loop) : loop_(loop) {}

  void Prepare(std::vector<ClaimRef> claims, std::function<void(PrepareResults)> done) override {
    EXPECT_TRUE(loop_.OnLoopThread());
    prepared.push_back(claims);
    if (hold) {
      held_prepare = std::move(done);
      return;
    }
    PrepareResults results;
    for (const auto& claim : claims) {
      if (claim.name == "broken") {
        results[claim.uid].error = "ResourceClaim " + claim.namespace_name + "/broken: allocationMode \"All\" rejected";
      } else if (claim.name != "forgotten") {
        results[claim.uid].devices.push_back(PreparedDevice{
            {"channel"}, "node-a", "channel-0", {"k8s.compute-domain.nvidia.com/claim=" + claim.uid + "-channel-0"}});
      }
    }
    done(std::move(results));
  }

  void Unprepare(std::vector<ClaimRef> claims, std::function<void(UnprepareResults)> done) override {
    EXPECT_TRUE(loop_.OnLoopThread());
    unprepared.push_back(claims);
    UnprepareResults results;
    for (const auto& claim : claims) {
      if (claim.name == "stuck") results[claim.uid].error = "unlink failed";
      else if (claim.name != "forgotten") results[claim.uid];
    }
    done(std::move(results));
  }

  Loop& loop_;
  bool hold = false;
  std::function<void(PrepareResults)> held_prepare;
  std::vector<std::vector<ClaimRef>> prepared;
  std::vector<std::vector<ClaimRef>> unprepared;
};

// Binds a unix socket at `path` and closes it without unlinking, as a crashed process would.
void LeaveStaleSocket(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof(address.sun_path));
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  EXPECT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  ::close(fd);
}

mode_t SocketModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

template <typename Request>
Request PrepareRequest() {
  Request request;
  auto* a = request.add_claims();
  a->set_namespace_("team-a");
  a->set_uid("uid-a");
  a->set_name("train-a");
  auto* b = request.add_claims();
  b->set_namespace_("team-a");
  b->set_uid("uid-b");
  b->set_name("broken");
  auto* c = request.add_claims();
  c->set_namespace_("team-a");
  c->set_uid("uid-c");
  c->set_name("forgotten");
  return request;
}

std::unique_ptr<grpc::ClientContext> Deadline() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  return context;
}

class DraServersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_.site.paths.kubelet_dir = dir_ / "kubelet";
    paths_ = MakePluginPaths(h_.site.paths, kDriverName, "dra-compute-domain");
    registration_ = std::make_unique<RegistrationServer>(
        h_.loop, RegistrationServer::Info{std::string(kDriverName), paths_.dra_socket},
        [this](bool registered, const std::string& error) { statuses_.emplace_back(registered, error); });
    dra_ = std::make_unique<DraServer>(h_.loop, handler_);
    dra_->Start(paths_.dra_socket);  // before registering: the kubelet dials it right away
    registration_->Start(paths_.registration_socket);
  }

  void TearDown() override { Stop(); }

  void Stop() {
    if (!dra_) return;
    bool dra_done = false;
    bool registration_done = false;
    registration_->Shutdown(h_.pool, [&] { registration_done = true; });
    dra_->Shutdown(h_.pool, [&] { dra_done = true; });
    ASSERT_TRUE(h_.RunUntil([&] { return dra_done && registration_done; }));
    dra_.reset();
    registration_.reset();
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& socket) {
    return grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials());
  }

  template <typename Stub, typename Request, typename Response>
  std::pair<grpc::Status, Response> CallPrepare(const Request& request) {
    auto stub = Stub::NewStub(Channel(paths_.dra_socket));
    return h_.OffLoop([&] {
      Response response;
      auto context = Deadline();
      const grpc::Status status = stub->NodePrepareResources(context.get(), request, &response);
      return std::make_pair(status, response);
    });
  }

  gns::test::TempDir dir_;
  gns::test::LoopHarness h_;
  PluginPaths paths_;
  FakeHandler handler_{h_.loop};
  std::vector<std::pair<bool, std::string>> statuses_;
  std::unique_ptr<RegistrationServer> registration_;
  std::unique_ptr<DraServer> dra_;
};

TEST_F(DraServersTest, SocketsAndDirectoriesHaveTheirModes) {
  EXPECT_EQ(paths_.registration_socket, dir_ / "kubelet/plugins_registry/compute-domain.nvidia.com-reg.sock");
  EXPECT_EQ(paths_.dra_socket, dir_ / "kubelet/plugins/compute-domain.nvidia.com/dra.sock");
  EXPECT_LT(paths_.registration_socket.size(), 108u);
  EXPECT_EQ(SocketModeOf(paths_.registration_socket), 0600u);
  EXPECT_EQ(SocketModeOf(paths_.dra_socket), 0600u);
  EXPECT_EQ(SocketModeOf(paths_.plugin_dir), 0750u);
  EXPECT_EQ(SocketModeOf(paths_.plugins_registry_dir), 0750u);
  Stop();
  // The plugin watcher deregisters us when the socket goes.
  EXPECT_FALSE(std::filesystem::exists(paths_.registration_socket));
  EXPECT_FALSE(std::filesystem::exists(paths_.dra_socket));
}

TEST_F(DraServersTest, GetInfoAndRegistrationStatus) {
  auto stub = pluginregistration::Registration::NewStub(Channel(paths_.registration_socket));
  const auto [info_status, info] = h_.OffLoop([&] {
    pluginregistration::PluginInfo response;
    auto context = Deadline();
    const grpc::Status status = stub->GetInfo(context.get(), pluginregistration::InfoRequest{}, &response);
    return std::make_pair(status, response);
  });
  ASSERT_TRUE(info_status.ok()) << info_status.error_message();
  EXPECT_EQ(info.type(), "DRAPlugin");
  EXPECT_EQ(info.name(), "compute-domain.nvidia.com");
  EXPECT_EQ(info.endpoint(), paths_.dra_socket);
  ASSERT_EQ(info.supported_versions_size(), 2);
  EXPECT_EQ(info.supported_versions(0), "v1.DRAPlugin");
  EXPECT_EQ(info.supported_versions(1), "v1beta1.DRAPlugin");

  const grpc::Status ok = h_.OffLoop([&] {
    pluginregistration::RegistrationStatus request;
    request.set_plugin_registered(true);
    pluginregistration::RegistrationStatusResponse response;
    auto context = Deadline();
    return stub->NotifyRegistrationStatus(context.get(), request, &response);
  });
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  const grpc::Status failed = h_.OffLoop([&] {
    pluginregistration::RegistrationStatus request;
    request.set_plugin_registered(false);
    request.set_error("plugin name already registered");
    pluginregistration::RegistrationStatusResponse response;
    auto context = Deadline();
    return stub->NotifyRegistrationStatus(context.get(), request, &response);
  });
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.error_message().find("plugin name already registered"), std::string::npos);
  ASSERT_EQ(statuses_.size(), 2u);
  EXPECT_EQ(statuses_[0], std::make_pair(true, std::string()));
  EXPECT_EQ(statuses_[1], std::make_pair(false, std::string("plugin name already registered")));
}

template <typename Response>
void ExpectPrepareResponse(const Response& response) {
  ASSERT_EQ(response.claims_size(), 3);
  const auto& a = response.claims().at("uid-a");
  EXPECT_EQ(a.error(), "");
  ASSERT_EQ(a.devices_size(), 1);
  EXPECT_EQ(a.devices(0).pool_name(), "node-a");
  EXPECT_EQ(a.devices(0).device_name(), "channel-0");
  ASSERT_EQ(a.devices(0).request_names_size(), 1);
  EXPECT_EQ(a.devices(0).request_names(0), "channel");
  ASSERT_EQ(a.devices(0).cdi_device_ids_size(), 1);
  EXPECT_EQ(a.devices(0).cdi_device_ids(0), "k8s.compute-domain.nvidia.com/claim=uid-a-channel-0");
  EXPECT_NE(response.claims().at("uid-b").error().find("allocationMode \"All\" rejected"), std::string::npos);
  EXPECT_EQ(response.claims().at("uid-b").devices_size(), 0);
  // A claim the handler left out still gets an entry: the kubelet needs every one.
  EXPECT_NE(response.claims().at("uid-c").error().find("no result for claim team-a/forgotten"), std::string::npos);
}

TEST_F(DraServersTest, PrepareThroughV1AndV1beta1ReachesOneHandler) {
  const auto [s1, r1] = CallPrepare<v1::DRAPlugin, v1::NodePrepareResourcesRequest, v1::NodePrepareResourcesResponse>(
      PrepareRequest<v1::NodePrepareResourcesRequest>());
  ASSERT_TRUE(s1.ok()) << s1.error_message();
  ExpectPrepareResponse(r1);
  const auto [s2, r2] =
      CallPrepare<v1beta1::DRAPlugin, v1beta1::NodePrepareResourcesRequest, v1beta1::NodePrepareResourcesResponse>(
          PrepareRequest<v1beta1::NodePrepareResourcesRequest>());
  ASSERT_TRUE(s2.ok()) << s2.error_message();
  ExpectPrepareResponse(r2);
  ASSERT_EQ(handler_.prepared.size(), 2u);
  const std::vector<ClaimRef> expected{{"team-a", "uid-a", "train-a"}, {"team-a", "uid-b", "broken"},
                                       {"team-a", "uid-c", "forgotten"}};
  EXPECT_EQ(handler_.prepared[0], expected);
  EXPECT_EQ(handler_.prepared[1], expected);
  EXPECT_EQ(dra_->PendingCalls(), 0u);
}

template <typename Stub, typename Request, typename Response>
void UnprepareThrough(gns::test::LoopHarness& h, const std::string& socket) {
  auto stub = Stub::NewStub(grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials()));
  Request request;
  for (const char* name : {"done-a", "stuck", "forgotten"}) {
    auto* claim = request.add_claims();
    claim->set_namespace_("team-a");
    claim->set_uid(std::string("uid-") + name);
    claim->set_name(name);
  }
  const auto [status, response] = h.OffLoop([&] {
    Response out;
    auto context = Deadline();
    const grpc::Status s = stub->NodeUnprepareResources(context.get(), request, &out);
    return std::make_pair(s, out);
  });
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.claims_size(), 3);
  EXPECT_EQ(response.claims().at("uid-done-a").error(), "");
  EXPECT_EQ(response.claims().at("uid-stuck").error(), "unlink failed");
  EXPECT_NE(response.claims().at("uid-forgotten").error().find("no result"), std::string::npos);
}

TEST_F(DraServersTest, UnprepareThroughV1AndV1beta1) {
  UnprepareThrough<v1::DRAPlugin, v1::NodeUnprepareResourcesRequest, v1::NodeUnprepareResourcesResponse>(
      h_, paths_.dra_socket);
  UnprepareThrough<v1beta1::DRAPlugin, v1beta1::NodeUnprepareResourcesRequest, v1beta1::NodeUnprepareResourcesResponse>(
      h_, paths_.dra_socket);
  ASSERT_EQ(handler_.unprepared.size(), 2u);
  EXPECT_EQ(handler_.unprepared[1][1], (ClaimRef{"team-a", "uid-stuck", "stuck"}));
}

TEST_F(DraServersTest, AnswerMayComeLaterFromTheLoop) {
  handler_.hold = true;
  auto stub = v1::DRAPlugin::NewStub(Channel(paths_.dra_socket));
  const auto request = PrepareRequest<v1::NodePrepareResourcesRequest>();
  v1::NodePrepareResourcesResponse response;
  auto context = Deadline();
  auto call = std::async(std::launch::async, [&] { return stub->NodePrepareResources(context.get(), request, &response); });
  ASSERT_TRUE(h_.RunUntil([&] { return static_cast<bool>(handler_.held_prepare); }));
  EXPECT_EQ(dra_->PendingCalls(), 1u);
  // The module fetched what it needed; now it answers, on the loop.
  h_.loop.Post([this] {
    PrepareResults results;
    results["uid-a"].devices.push_back(PreparedDevice{{}, "node-a", "channel-0", {"x=y"}});
    results["uid-b"].error = "later";
    results["uid-c"].error = "later";
    handler_.held_prepare(std::move(results));
  });
  ASSERT_TRUE(h_.RunUntil([&] { return call.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }));
  const grpc::Status status = call.get();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.claims().at("uid-a").devices(0).cdi_device_ids(0), "x=y");
  EXPECT_EQ(response.claims().at("uid-b").error(), "later");
  EXPECT_EQ(dra_->PendingCalls(), 0u);
}

TEST_F(DraServersTest, ShutdownFailsCallsTheHandlerNeverAnswered) {
  handler_.hold = true;
  auto stub = v1beta1::DRAPlugin::NewStub(Channel(paths_.dra_socket));
  const auto request = PrepareRequest<v1beta1::NodePrepareResourcesRequest>();
  v1beta1::NodePrepareResourcesResponse response;
  auto context = Deadline();
  auto call = std::async(std::launch::async, [&] { return stub->NodePrepareResources(context.get(), request, &response); });
  ASSERT_TRUE(h_.RunUntil([&] { return static_cast<bool>(handler_.held_prepare); }));

  bool dra_done = false;
  dra_->Shutdown(h_.pool, [&] { dra_done = true; });
  ASSERT_TRUE(h_.RunUntil([&] {
    return dra_done && call.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }));
  const grpc::Status status = call.get();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(status.error_message().find("stopping"), std::string::npos);
  // A late answer after shutdown is dropped, not a use of a finished call.
  handler_.held_prepare(PrepareResults{});
  EXPECT_EQ(dra_->PendingCalls(), 0u);
  dra_.reset();
  bool registration_done = false;
  registration_->Shutdown(h_.pool, [&] { registration_done = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return registration_done; }));
  registration_.reset();
}

TEST_F(DraServersTest, AStaleSocketIsReplacedButNotAnotherFile) {
  Stop();
  // A previous instance died and left its socket file behind: a new server takes its place.
  LeaveStaleSocket(paths_.dra_socket);
  ASSERT_TRUE(std::filesystem::is_socket(paths_.dra_socket));
  FakeHandler handler(h_.loop);
  DraServer again(h_.loop, handler);
  again.Start(paths_.dra_socket);
  bool done = false;
  again.Shutdown(h_.pool, [&] { done = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return done; }));

  std::filesystem::create_directories(dir_ / "x");
  std::ofstream(dir_ / "x/dra.sock") << "not a socket";
  DraServer refused(h_.loop, handler);
  EXPECT_THROW(refused.Start(dir_ / "x/dra.sock"), std::runtime_error);
}

// ------------------------------------------------------------------------------ device health

// A NodeWatchResources stream of one version read on its own thread, as the kubelet reads it.
template <typename Service, typename Request, typename Response>
class HealthWatchOf {
 public:
  explicit HealthWatchOf(const std::string& socket)
      : stub_(Service::NewStub(grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials()))) {
    reader_ = std::async(std::launch::async, [this] {
      auto stream = stub_->NodeWatchResources(&context_, Request{});
      Response response;
      while (stream->Read(&response)) {
        std::lock_guard lock(mutex_);
        messages_.push_back(response);
      }
      return stream->Finish();
    });
  }
  ~HealthWatchOf() {
    context_.TryCancel();
    if (reader_.valid()) reader_.wait();
  }
  std::vector<Response> Messages() {
    std::lock_guard lock(mutex_);
    return messages_;
  }
  bool Ended() { return reader_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
  grpc::Status End() { return reader_.get(); }

 private:
  std::unique_ptr<typename Service::Stub> stub_;
  grpc::ClientContext context_;
  std::mutex mutex_;
  std::vector<Response> messages_;
  std::future<grpc::Status> reader_;
};
using HealthWatch = HealthWatchOf<::v1alpha1::DRAResourceHealth, ::v1alpha1::NodeWatchResourcesRequest,
                                  ::v1alpha1::NodeWatchResourcesResponse>;
using HealthWatchV1beta1 = HealthWatchOf<::v1beta1::DRAResourceHealth, ::v1beta1::NodeWatchResourcesRequest,
                                         ::v1beta1::NodeWatchResourcesResponse>;
using HealthWatchV1 =
    HealthWatchOf<::v1::DRAResourceHealth, ::v1::NodeWatchResourcesRequest, ::v1::NodeWatchResourcesResponse>;

TEST_F(DraServersTest, ADriverWithoutDeviceHealthDoesNotServeTheHealthService) {
  HealthWatch watch(paths_.dra_socket);
  ASSERT_TRUE(h_.RunUntil([&] { return watch.Ended(); }));
  EXPECT_EQ(watch.End().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(dra_->Health(), nullptr);
}

TEST_F(DraServersTest, TheHealthStreamSendsTheWholeListAtStartAndAtEachChangeAndEndsAtShutdown) {
  DeviceHealthList list{{"node-a", "gpu-0", DeviceHealthStatus::kHealthy, 100, ""},
                        {"node-a", "gpu-1", DeviceHealthStatus::kUnknown, 0, ""}};
  // A resend far beyond the test: every message below comes from a change.
  auto health = std::make_shared<HealthService>(h_.loop, [&list] { return list; }, std::chrono::hours(1));
  FakeHandler handler(h_.loop);
  const std::string socket = (dir_ / "health" / "dra.sock").string();
  DraServer server(h_.loop, handler, health);
  server.Start(socket);

  HealthWatch watch(socket);
  ASSERT_TRUE(h_.RunUntil([&] { return watch.Messages().size() == 1; }));
  const auto first = watch.Messages()[0];
  ASSERT_EQ(first.devices_size(), 2);
  EXPECT_EQ(first.devices(0).device().pool_name(), "node-a");
  EXPECT_EQ(first.devices(0).device().device_name(), "gpu-0");
  EXPECT_EQ(first.devices(0).health(), ::v1alpha1::HEALTHY);
  EXPECT_EQ(first.devices(0).last_updated_time(), 100);
  EXPECT_EQ(first.devices(1).health(), ::v1alpha1::UNKNOWN);
  EXPECT_EQ(health->OpenStreams(), 1u);

  health->Update();  // nothing changed: nothing sent
  list[1] = {"node-a", "gpu-1", DeviceHealthStatus::kUnhealthy, 200, ""};
  health->Update();
  ASSERT_TRUE(h_.RunUntil([&] { return watch.Messages().size() == 2; }));
  const auto second = watch.Messages()[1];
  ASSERT_EQ(second.devices_size(), 2) << "every message holds the complete list";
  EXPECT_EQ(second.devices(0).health(), ::v1alpha1::HEALTHY);
  EXPECT_EQ(second.devices(1).health(), ::v1alpha1::UNHEALTHY);
  EXPECT_EQ(second.devices(1).last_updated_time(), 200);
  h_.Drain();
  EXPECT_EQ(watch.Messages().size(), 2u);
  EXPECT_EQ(health->MessagesSent(), 2u);

  bool done = false;
  server.Shutdown(h_.pool, [&] { done = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return done && watch.Ended(); }));
  EXPECT_TRUE(watch.End().ok()) << "a clean end at Stop";
}

TEST_F(DraServersTest, EveryHealthVersionIsServedAndTheNewerOnesSayWhyAndForHowLong) {
  DeviceHealthList list{{"node-a", "gpu-0", DeviceHealthStatus::kUnhealthy, 100, "XID 79: GPU has fallen off the bus"},
                        {"node-a", "gpu-1", DeviceHealthStatus::kHealthy, 50, ""}};
  const auto resend = std::chrono::seconds(10);
  auto health = std::make_shared<HealthService>(h_.loop, [&list] { return list; }, resend);
  FakeHandler handler(h_.loop);
  const std::string socket = (dir_ / "versions" / "dra.sock").string();
  DraServer server(h_.loop, handler, health);
  server.Start(socket);

  HealthWatchV1 v1(socket);
  HealthWatchV1beta1 v1beta1(socket);
  HealthWatch v1alpha1(socket);
  ASSERT_TRUE(h_.RunUntil([&] {
    return !v1.Messages().empty() && !v1beta1.Messages().empty() && !v1alpha1.Messages().empty();
  }));
  EXPECT_EQ(health->OpenStreams(), 3u);
  const auto a = v1.Messages()[0];
  ASSERT_EQ(a.devices_size(), 2);
  EXPECT_EQ(a.devices(0).health(), ::v1::UNHEALTHY);
  EXPECT_EQ(a.devices(0).message(), "XID 79: GPU has fallen off the bus");
  EXPECT_EQ(a.devices(0).health_check_timeout_seconds(), 30) << "three resends of 10 s";
  EXPECT_EQ(a.devices(1).health(), ::v1::HEALTHY);
  EXPECT_EQ(a.devices(1).message(), "");
  const auto b = v1beta1.Messages()[0];
  ASSERT_EQ(b.devices_size(), 2);
  EXPECT_EQ(b.devices(0).health(), ::v1beta1::UNHEALTHY);
  EXPECT_EQ(b.devices(0).message(), "XID 79: GPU has fallen off the bus");
  EXPECT_EQ(b.devices(0).health_check_timeout_seconds(), 30);
  const auto c = v1alpha1.Messages()[0];
  ASSERT_EQ(c.devices_size(), 2);
  EXPECT_EQ(c.devices(0).health(), ::v1alpha1::UNHEALTHY);
  EXPECT_EQ(c.devices(0).last_updated_time(), 100);

  list[0] = {"node-a", "gpu-0", DeviceHealthStatus::kHealthy, 300, ""};
  health->Update();
  ASSERT_TRUE(h_.RunUntil([&] {
    return v1.Messages().size() == 2 && v1beta1.Messages().size() == 2 && v1alpha1.Messages().size() == 2;
  })) << "a change reaches every stream, whatever its version";
  EXPECT_EQ(v1.Messages()[1].devices(0).health(), ::v1::HEALTHY);
  EXPECT_EQ(v1.Messages()[1].devices(0).message(), "");

  bool done = false;
  server.Shutdown(h_.pool, [&] { done = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return done && v1.Ended() && v1beta1.Ended() && v1alpha1.Ended(); }));
}

TEST_F(DraServersTest, EveryOpenStreamGetsTheWholeListAgainBeforeTheKubeletForgetsIt) {
  DeviceHealthList list{{"node-a", "gpu-0", DeviceHealthStatus::kHealthy, 100, ""},
                        {"node-a", "gpu-1", DeviceHealthStatus::kHealthy, 100, ""}};
  auto health = std::make_shared<HealthService>(h_.loop, [&list] { return list; }, std::chrono::milliseconds(200));
  FakeHandler handler(h_.loop);
  const std::string socket = (dir_ / "resend" / "dra.sock").string();
  DraServer server(h_.loop, handler, health);
  server.Start(socket);

  HealthWatchV1 watch(socket);
  ASSERT_TRUE(h_.RunUntil([&] { return watch.Messages().size() >= 3; }))
      << "nothing changed, yet the list goes out again every resend";
  for (const auto& message : watch.Messages()) {
    ASSERT_EQ(message.devices_size(), 2) << "each resend is the complete list";
    EXPECT_EQ(message.devices(0).health(), ::v1::HEALTHY);
    EXPECT_EQ(message.devices(0).last_updated_time(), 100) << "a resend is no new verdict";
    EXPECT_EQ(message.devices(0).health_check_timeout_seconds(), 1);
  }
  EXPECT_GE(health->Resends(), 2u);

  bool done = false;
  server.Shutdown(h_.pool, [&] { done = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return done && watch.Ended(); }));
  const auto resends = health->Resends();
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(500));  // turn the loop past two resends
  EXPECT_EQ(health->Resends(), resends) << "no resend once the server is down";
}

TEST(DraHealthMessage, TheKubeletsLimitsAreKept) {
  EXPECT_EQ(HealthCheckTimeoutSeconds(kDefaultHealthResend), 60);
  EXPECT_EQ(HealthCheckTimeoutSeconds(std::chrono::milliseconds(200)), 1);
  EXPECT_EQ(HealthCheckTimeoutSeconds(std::chrono::milliseconds(0)), 1);

  const std::string exact(1024, 'x');
  EXPECT_EQ(KubeletHealthMessage(exact), exact);
  // 1020 ASCII bytes, then two-byte characters: byte 1021 is the second byte of one, so the cut
  // backs off to byte 1020 rather than split it.
  std::string text(1020, 'a');
  for (int i = 0; i < 10; ++i) text += "\xC3\xA9";
  const std::string cut = KubeletHealthMessage(text);
  EXPECT_EQ(cut, std::string(1020, 'a') + "...");
  EXPECT_LE(cut.size(), 1024u);
}

}  // namespace
}  // namespace gns::dra
