#pragma once
// Shared set-up of the kube tests: an in-process simulated API server with a state dir (CA,
// token file, kubeconfig), the loop harness, and a helper that waits for one async call.

#include "modules/kube/api/client.hpp"
#include "support/api_sim.hpp"
#include "support/loop_harness.hpp"
#include "support/temp_dir.hpp"
#include "support/quiet_logger.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>
#include <optional>

namespace gns::kube::test {

class KubeTestBase : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = gns::test::MakeTempDir("gns-kube");
    sim::ApiServerOptions options;
    options.bookmark_interval = std::chrono::milliseconds(200);
    server_ = std::make_unique<gns::test::ApiSim>(dir_ / "state", options);
  }

  void TearDown() override {
    for (auto& c : clients_) c->Shutdown();
    h_.Drain();
    clients_.clear();
    server_->Stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  ClientConfig BaseConfig() {
    ClientConfig config = server_->ClientConfig();
    config.request_timeout = std::chrono::milliseconds(5000);
    return config;
  }

  std::shared_ptr<KubeClient> MakeClient(ClientConfig config) {
    auto client = std::make_shared<KubeClient>(
        KubeClient::Deps{h_.loop, h_.clock, h_.metrics, gns::test::QuietLogger("kube-test")}, std::move(config));
    clients_.push_back(client);
    return client;
  }

  // Starts one async call and turns the loop until its callback ran.
  template <typename Start>
  Result Wait(Start start) {
    std::optional<Result> out;
    start([&out](Result r) { out = std::move(r); });
    EXPECT_TRUE(h_.RunUntil([&] { return out.has_value(); })) << "no answer";
    return out.value_or(Result{0, nullptr, "no answer"});
  }

  // name-or-ns/name -> resourceVersion of every object the server holds in a collection.
  std::map<std::string, std::string> ServerState(const std::string& path) {
    const auto response = server_->Call("GET", path);
    EXPECT_EQ(response.status, 200) << response.body;
    std::map<std::string, std::string> out;
    const auto body = response.Json();
    for (const auto& item : body.at("items")) {
      const auto meta = ObjectMeta::From(item);
      if (meta) out[meta->Key()] = meta->resource_version;
    }
    return out;
  }

  static nlohmann::json Node(const std::string& name, std::map<std::string, std::string> labels = {}) {
    nlohmann::json node = {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", name}}}};
    if (!labels.empty()) node["metadata"]["labels"] = labels;
    return node;
  }

  gns::test::LoopHarness h_;
  std::filesystem::path dir_;
  std::unique_ptr<gns::test::ApiSim> server_;
  std::vector<std::shared_ptr<KubeClient>> clients_;
};

}  // namespace gns::kube::test
