// The device plugin's gRPC server on the completion-queue path (loop/grpc_queue.hpp), with real
// generated clients on a unix socket: unary calls answered on the loop and on the queue thread,
// a ListAndWatch stream that gets every broadcast, one the kubelet cancels, one whose kubelet
// goes away, Shutdown with a stream open and with a Register call in flight, and no thread of
// gRPC's callback API in the process. The loop is driven by LoopHarness; clients block on other
// threads. No sleeps.
#include "loop/grpc_queue.hpp"
#include "modules/device_plugin/plugin_server.hpp"
#include "support/loop_harness.hpp"

#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <string>
#include <thread>

namespace gns::device_plugin {
namespace {

v1beta1::ListAndWatchResponse ListOf(int devices) {
  v1beta1::ListAndWatchResponse list;
  for (int i = 0; i < devices; ++i) {
    auto* device = list.add_devices();
    device->set_id("GPU-" + std::to_string(i));
    device->set_health("Healthy");
  }
  return list;
}

// This process's queue threads ("grpc-cq"), as /proc/self/task/<tid> paths.
std::set<std::string> QueueThreads() {
  std::set<std::string> tasks;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name == "grpc-cq") tasks.insert(entry.path().string());
  }
  return tasks;
}

// How often a thread has blocked and been woken again.
long VoluntarySwitches(const std::string& task) {
  std::ifstream status(task + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0) return std::stol(line.substr(line.find(':') + 1));
  }
  return -1;
}

// Names of this process's threads.
std::vector<std::string> ThreadNames() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    std::getline(comm, name);
    names.push_back(name);
  }
  return names;
}

class PluginServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/gdp-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    socket_ = dir_ + "/plugin.sock";
    PluginServer::Handlers handlers;
    handlers.options.set_get_preferred_allocation_available(true);
    handlers.current_list = [this] {
      EXPECT_TRUE(h_.loop.OnLoopThread());
      return ListOf(devices_);
    };
    handlers.allocate = [this](const v1beta1::AllocateRequest& request, v1beta1::AllocateResponse* response) {
      EXPECT_TRUE(h_.loop.OnLoopThread());
      ++allocations_;
      if (request.container_requests_size() == 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty");
      auto* container = response->add_container_responses();
      (*container->mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = request.container_requests(0).devices_ids(0);
      return grpc::Status::OK;
    };
    handlers.preferred = [](const v1beta1::PreferredAllocationRequest&,
                            v1beta1::PreferredAllocationResponse*) -> grpc::Status {
      throw std::runtime_error("no policy");
    };
    server_ = std::make_unique<PluginServer>(h_.loop, std::move(handlers));
    server_->Start(socket_);
  }

  void TearDown() override {
    Stop();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  void Stop() {
    if (!server_) return;
    bool done = false;
    server_->Shutdown(h_.pool, [&] { done = true; });
    ASSERT_TRUE(h_.RunUntil([&] { return done; }));
    server_.reset();
  }

  std::unique_ptr<v1beta1::DevicePlugin::Stub> Stub() {
    return v1beta1::DevicePlugin::NewStub(
        grpc::CreateChannel("unix://" + socket_, grpc::InsecureChannelCredentials()));
  }

  static std::unique_ptr<grpc::ClientContext> Deadline() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return context;
  }

  // A kubelet's ListAndWatch on its own thread: every list it reads is counted; it ends when the
  // stream does, with the status.
  struct Watcher {
    std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
    grpc::ClientContext context;
    std::atomic<int> lists{0};
    std::atomic<int> last_size{-1};
    std::promise<grpc::Status> ended;
    std::thread thread;

    explicit Watcher(std::unique_ptr<v1beta1::DevicePlugin::Stub> s) : stub(std::move(s)) {
      thread = std::thread([this] {
        auto reader = stub->ListAndWatch(&context, v1beta1::Empty());
        v1beta1::ListAndWatchResponse list;
        while (reader->Read(&list)) {
          last_size = list.devices_size();
          ++lists;
        }
        ended.set_value(reader->Finish());
      });
    }
    ~Watcher() {
      if (thread.joinable()) thread.join();
    }
  };

  std::string dir_;
  std::string socket_;
  int devices_ = 2;
  int allocations_ = 0;
  gns::test::LoopHarness h_;
  std::unique_ptr<PluginServer> server_;
};

TEST_F(PluginServerTest, UnaryCallsAnswerOnTheLoopAndFromFixedData) {
  auto stub = Stub();
  const auto options = h_.OffLoop([&] {
    v1beta1::DevicePluginOptions response;
    auto context = Deadline();
    EXPECT_TRUE(stub->GetDevicePluginOptions(context.get(), v1beta1::Empty(), &response).ok());
    return response;
  });
  EXPECT_TRUE(options.get_preferred_allocation_available());

  const auto allocated = h_.OffLoop([&] {
    v1beta1::AllocateRequest request;
    request.add_container_requests()->add_devices_ids("GPU-1");
    v1beta1::AllocateResponse response;
    auto context = Deadline();
    const grpc::Status status = stub->Allocate(context.get(), request, &response);
    return std::make_pair(status, response);
  });
  ASSERT_TRUE(allocated.first.ok()) << allocated.first.error_message();
  ASSERT_EQ(allocated.second.container_responses_size(), 1);
  EXPECT_EQ(allocated.second.container_responses(0).envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU-1");

  // A handler's error status, and a handler that throws, reach the kubelet as such.
  const auto refused = h_.OffLoop([&] {
    v1beta1::AllocateResponse response;
    auto context = Deadline();
    return stub->Allocate(context.get(), v1beta1::AllocateRequest(), &response);
  });
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const auto thrown = h_.OffLoop([&] {
    v1beta1::PreferredAllocationResponse response;
    auto context = Deadline();
    return stub->GetPreferredAllocation(context.get(), v1beta1::PreferredAllocationRequest(), &response);
  });
  EXPECT_EQ(thrown.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(thrown.error_message().find("no policy"), std::string::npos);

  const auto pre_start = h_.OffLoop([&] {
    v1beta1::PreStartContainerResponse response;
    auto context = Deadline();
    return stub->PreStartContainer(context.get(), v1beta1::PreStartContainerRequest(), &response);
  });
  EXPECT_TRUE(pre_start.ok());
  EXPECT_EQ(allocations_, 2);
}

// Nothing of gRPC's callback API runs: its "nexting" threads wake about once a second each, at
// rest (issue #23 item 8).
TEST_F(PluginServerTest, NoCallbackApiThreads) {
  auto stub = Stub();
  Watcher watcher(Stub());
  ASSERT_TRUE(h_.RunUntil([&] { return watcher.lists >= 1; }));
  const auto status = h_.OffLoop([&] {
    v1beta1::AllocateRequest request;
    request.add_container_requests()->add_devices_ids("GPU-0");
    v1beta1::AllocateResponse response;
    auto context = Deadline();
    return stub->Allocate(context.get(), request, &response);
  });
  EXPECT_TRUE(status.ok());
  for (const auto& name : ThreadNames()) EXPECT_NE(name, "nexting_thread");
  watcher.context.TryCancel();
}

// Calls to one server leave another server's queue thread asleep: gRPC's poll engine, chosen by
// loop/grpc_queue.cpp, polls each queue's own sockets (epoll1, gRPC's default, hands one shared
// epoll set from thread to thread and woke every queue thread for each connection: issue #23
// item 8).
TEST_F(PluginServerTest, CallsToOneServerLeaveAnotherServersQueueThreadAsleep) {
  ASSERT_TRUE(GrpcPollStrategyChosen());
  const std::set<std::string> before = QueueThreads();
  PluginServer::Handlers handlers;
  handlers.current_list = [] { return ListOf(1); };
  PluginServer other(h_.loop, std::move(handlers));
  other.Start(dir_ + "/other.sock");
  std::set<std::string> added;
  for (const auto& task : QueueThreads()) {
    if (!before.contains(task)) added.insert(task);
  }
  ASSERT_EQ(added.size(), 1u) << "the second server's queue thread";
  const std::string other_thread = *added.begin();
  // Settle: the second server's start has run its queue thread.
  auto stub = Stub();
  h_.OffLoop([&] {
    v1beta1::DevicePluginOptions response;
    auto context = Deadline();
    return stub->GetDevicePluginOptions(context.get(), v1beta1::Empty(), &response).ok();
  });
  const long asleep_from = VoluntarySwitches(other_thread);
  for (int i = 0; i < 20; ++i) {
    // A fresh channel each time, as the kubelet's probe dials anew: a connection and a call.
    auto fresh = Stub();
    const bool ok = h_.OffLoop([&] {
      v1beta1::DevicePluginOptions response;
      auto context = Deadline();
      return fresh->GetDevicePluginOptions(context.get(), v1beta1::Empty(), &response).ok();
    });
    ASSERT_TRUE(ok);
  }
  EXPECT_LE(VoluntarySwitches(other_thread) - asleep_from, 2) << "20 connections to the first server";
  EXPECT_STREQ(std::getenv("GRPC_POLL_STRATEGY"), "poll");
  bool stopped = false;
  other.Shutdown(h_.pool, [&] { stopped = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return stopped; }));
}

TEST_F(PluginServerTest, StreamGetsEveryBroadcastAndEndsWhenTheKubeletCancels) {
  Watcher watcher(Stub());
  ASSERT_TRUE(h_.RunUntil([&] { return watcher.lists >= 1 && server_->OpenStreams() == 1; }));
  EXPECT_EQ(watcher.last_size, 2);
  server_->Broadcast(ListOf(3));
  ASSERT_TRUE(h_.RunUntil([&] { return watcher.last_size == 3; }));

  watcher.context.TryCancel();
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenStreams() == 0; }));
  auto ended = watcher.ended.get_future();
  ASSERT_TRUE(h_.RunUntil([&] { return ended.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }));
  EXPECT_EQ(ended.get().error_code(), grpc::StatusCode::CANCELLED);
  server_->Broadcast(ListOf(1));  // reaches nobody, harms nothing

  // The next kubelet is served as the first was: a new call is requested as each one arrives.
  Watcher again(Stub());
  ASSERT_TRUE(h_.RunUntil([&] { return again.lists >= 1 && server_->OpenStreams() == 1; }));
  EXPECT_EQ(again.last_size, 2);
  again.context.TryCancel();
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenStreams() == 0; }));
}

TEST_F(PluginServerTest, ShutdownEndsAnOpenStreamAndCompletes) {
  Watcher watcher(Stub());
  ASSERT_TRUE(h_.RunUntil([&] { return watcher.lists >= 1 && server_->OpenStreams() == 1; }));
  // A broadcast still in flight when the server stops: the stream ends after it.
  server_->Broadcast(ListOf(4));
  Stop();
  EXPECT_FALSE(std::filesystem::exists(socket_));
  auto ended = watcher.ended.get_future();
  ASSERT_TRUE(h_.RunUntil([&] { return ended.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }));
  const grpc::Status status = ended.get();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(PluginServerTest, ShutdownAfterTheKubeletWentAway) {
  {
    auto watcher = std::make_unique<Watcher>(Stub());
    ASSERT_TRUE(h_.RunUntil([&] { return watcher->lists >= 1 && server_->OpenStreams() == 1; }));
    // The kubelet dies: its stream is cancelled and its channel (the connection) goes.
    watcher->context.TryCancel();
    auto ended = watcher->ended.get_future();
    ASSERT_TRUE(h_.RunUntil([&] { return ended.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }));
  }
  server_->Broadcast(ListOf(5));  // may race the server's view of the cancellation: harmless
  Stop();
}

TEST_F(PluginServerTest, ShutdownCancelsARegistrationInFlight) {
  // A kubelet.sock where nothing listens: with wait_for_ready the call would wait out its deadline
  // (a minute); Shutdown must not.
  const std::string kubelet = dir_ + "/kubelet.sock";
  v1beta1::RegisterRequest request;
  request.set_version("v1beta1");
  request.set_endpoint("plugin.sock");
  request.set_resource_name("nvidia.com/gpu");
  bool answered = false;
  grpc::Status outcome;
  server_->Register(kubelet, request, std::chrono::minutes(1), [&](const grpc::Status& status) {
    EXPECT_TRUE(h_.loop.OnLoopThread());
    answered = true;
    outcome = status;
  });
  bool done = false;
  server_->Shutdown(h_.pool, [&] { done = true; });
  ASSERT_TRUE(h_.RunUntil([&] { return done; }, std::chrono::seconds(15)));
  EXPECT_TRUE(answered);
  EXPECT_EQ(outcome.error_code(), grpc::StatusCode::CANCELLED) << outcome.error_message();
  server_.reset();
}

}  // namespace
}  // namespace gns::device_plugin
