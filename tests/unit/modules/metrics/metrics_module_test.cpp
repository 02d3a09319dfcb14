// The metrics module over real HTTP: endpoints, formats, readiness, and bad requests.
#include "modules/metrics/messages.hpp"
#include "modules/metrics/metrics_module.hpp"
#include "loop/supervisor_messages.hpp"
#include "support/http_client.hpp"
#include "support/loop_harness.hpp"
#include "support/prometheus.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>


namespace gns::metrics {
namespace {

class MetricsModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    context_ = std::make_unique<ModuleContext>(h_.Parts(), "metrics", [](std::string) {},
                                               [](ModuleHealth, std::string) {});
    MetricsModule::Config config;
    config.listen = *ParseListenAddress("127.0.0.1:0");
    config.read_timeout = std::chrono::milliseconds(2000);
    Configure(config);
    module_ = std::make_unique<MetricsModule>(*context_, config);
    module_->Start();
    h_.Drain();
    const auto* endpoint = h_.bus.Latest<MetricsEndpoint>();
    ASSERT_NE(endpoint, nullptr);
    port_ = static_cast<unsigned short>(std::stoi(endpoint->address.substr(endpoint->address.rfind(':') + 1)));
  }

  virtual void Configure(MetricsModule::Config&) {}

  void TearDown() override {
    for (const int fd : idle_) ::close(fd);
    bool stopped = false;
    module_->Stop([&] { stopped = true; });
    EXPECT_TRUE(h_.RunUntil([&] { return stopped; }));
    module_.reset();
  }

  template <typename Fn>
  auto OffLoop(Fn fn) {
    return h_.OffLoop(std::move(fn));
  }

  test::HttpResult Get(const std::string& target, const std::string& method = "GET") {
    return OffLoop([=, this] { return test::HttpRequest("127.0.0.1", port_, method, target); });
  }

  // A client that connects and then says nothing, or only part of a request (slowloris).
  void ConnectIdle(unsigned short port, const std::string& partial = {}) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    if (!partial.empty()) {
      ASSERT_EQ(::send(fd, partial.data(), partial.size(), MSG_NOSIGNAL), static_cast<ssize_t>(partial.size()));
    }
    idle_.push_back(fd);
  }

  std::vector<int> idle_;
  test::LoopHarness h_;
  std::unique_ptr<ModuleContext> context_;
  std::unique_ptr<MetricsModule> module_;
  unsigned short port_ = 0;
};

TEST_F(MetricsModuleTest, MetricsIsParseableAndCarriesProcessBusAndModuleSeries) {
  h_.metrics.Gauge("gpu_node_supervisor_module_up", "up", {{"module", "metrics"}}).Set(1);
  h_.metrics.Counter("gpu_node_supervisor_bus_published_total", "published", {{"topic", "x"}}).Inc(5);
  const auto res = Get("/metrics");
  ASSERT_EQ(res.status, 200) << res.error;
  EXPECT_EQ(res.headers.at("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  const auto scrape = test::ParsePrometheus(res.body);
  EXPECT_GT(scrape.Value("gpu_node_supervisor_process_resident_memory_bytes"), 1e6);
  EXPECT_GT(scrape.Value("gpu_node_supervisor_process_anon_memory_bytes"), 0);
  EXPECT_GE(scrape.Value("gpu_node_supervisor_process_open_fds"), 3);
  EXPECT_GE(scrape.Value("gpu_node_supervisor_process_threads"), 1);
  EXPECT_EQ(scrape.Value("gpu_node_supervisor_module_up{module=\"metrics\"}"), 1);
  EXPECT_EQ(scrape.Value("gpu_node_supervisor_bus_published_total{topic=\"x\"}"), 5);
  EXPECT_EQ(scrape.types.at("gpu_node_supervisor_process_cpu_seconds_total"), "counter");
}

TEST_F(MetricsModuleTest, ReadyzFollowsModuleStates) {
  EXPECT_EQ(Get("/readyz").status, 503);  // nothing known yet
  ModuleStates states;
  states.modules.push_back({"metrics", ModuleState::kRunning, ModuleHealth::kOk, "", 0});
  states.modules.push_back({"device-plugin", ModuleState::kBackoff, ModuleHealth::kOk, "kubelet.sock missing", 3});
  h_.bus.Publish(states);
  auto res = Get("/readyz");
  EXPECT_EQ(res.status, 503);
  EXPECT_EQ(res.body, "not ready:\n  device-plugin: backoff, ok (kubelet.sock missing)\n");
  states.modules[1].state = ModuleState::kRunning;
  states.modules[1].detail.clear();
  h_.bus.Publish(states);
  res = Get("/readyz");
  EXPECT_EQ(res.status, 200);
  EXPECT_EQ(res.body, "ok\n");
}

TEST_F(MetricsModuleTest, HealthzAndDebugState) {
  EXPECT_EQ(Get("/healthz").status, 200);
  const auto res = Get("/debug/state");
  ASSERT_EQ(res.status, 200);
  const auto state = nlohmann::json::parse(res.body);
  EXPECT_EQ(state.at("metrics.endpoint").at("address"), "127.0.0.1:" + std::to_string(port_));
}

TEST_F(MetricsModuleTest, BadRequestsGetClearStatusesAndTheServerKeepsServing) {
  EXPECT_EQ(Get("/nope").status, 404);
  const auto post = Get("/metrics", "POST");
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.headers.at("Allow"), "GET, HEAD");
  const auto head = Get("/healthz", "HEAD");
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.body.empty());

  const auto garbage = OffLoop([this] { return test::RawExchange("127.0.0.1", port_, "NOT HTTP AT ALL\r\n\r\n"); });
  EXPECT_EQ(garbage.rfind("HTTP/1.1 400", 0), 0u) << garbage;

  const std::string huge = "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n" + std::string(20000, 'x');
  const auto too_big = OffLoop([&] { return test::RawExchange("127.0.0.1", port_, huge); });
  EXPECT_EQ(too_big.rfind("HTTP/1.1 413", 0), 0u) << too_big.substr(0, 80);

  const std::string long_header = "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n";
  const auto big_header = OffLoop([&] { return test::RawExchange("127.0.0.1", port_, long_header); });
  EXPECT_EQ(big_header.rfind("HTTP/1.1 431", 0), 0u) << big_header.substr(0, 80);

  EXPECT_EQ(Get("/metrics").status, 200);
}

// Issue #24 §4: a crowd of idle and dribbling clients at the connection cap cannot keep the
// kubelet's probe out; each new client takes the place of the one that waited longest.
class MetricsCrowdTest : public MetricsModuleTest {
 protected:
  void Configure(MetricsModule::Config& config) override {
    config.max_connections = 4;
    config.read_timeout = std::chrono::milliseconds(60000);  // the crowd outlasts the test
  }
};

TEST_F(MetricsCrowdTest, ProbesAreAnsweredWhileIdleAndSlowClientsHoldEveryConnection) {
  for (int i = 0; i < 6; ++i) ConnectIdle(port_);
  for (int i = 0; i < 4; ++i) ConnectIdle(port_, "GET /metrics HTTP/1.1\r\nX-Slow: ");
  h_.Drain();  // every one accepted
  for (int probe = 0; probe < 3; ++probe) {
    const auto healthz = Get("/healthz");
    EXPECT_EQ(healthz.status, 200) << healthz.error;
    EXPECT_EQ(Get("/readyz").status, 503) << "answered (nothing is ready in this test)";
  }
  const auto scrape = test::ParsePrometheus(Get("/metrics").body);
  // At least the first probe took the place of an idle client (the crowd itself, accepted
  // faster than each connection starts reading, may have seen refusals too).
  EXPECT_GE(scrape.Value("gpu_node_supervisor_http_connections_evicted_total"), 1);
}

// /debug/state (GPU UUIDs, claims, pods) is not for the node's network: with a listener on every
// address it is served on loopback only.
class MetricsPublicListenTest : public MetricsModuleTest {
 protected:
  void Configure(MetricsModule::Config& config) override {
    config.listen = *ParseListenAddress("0.0.0.0:0");
    config.debug_listen = *ParseListenAddress("127.0.0.1:0");
  }
};

TEST_F(MetricsPublicListenTest, DebugStateIsServedOnLoopbackOnlyAndProbesOnTheMainPort) {
  EXPECT_EQ(Get("/healthz").status, 200);
  EXPECT_EQ(Get("/metrics").status, 200);
  const auto on_main = Get("/debug/state");
  EXPECT_EQ(on_main.status, 404);
  const auto* endpoint = h_.bus.Latest<MetricsEndpoint>();
  ASSERT_NE(endpoint, nullptr);
  ASSERT_EQ(endpoint->debug_address.rfind("127.0.0.1:", 0), 0u) << endpoint->debug_address;
  EXPECT_NE(on_main.body.find(endpoint->debug_address), std::string::npos) << on_main.body;
  const auto debug_port = static_cast<unsigned short>(std::stoi(endpoint->debug_address.substr(10)));
  const auto state = OffLoop([&] { return test::HttpRequest("127.0.0.1", debug_port, "GET", "/debug/state"); });
  ASSERT_EQ(state.status, 200) << state.error;
  EXPECT_TRUE(nlohmann::json::parse(state.body).contains("metrics.endpoint"));
  EXPECT_EQ(OffLoop([&] { return test::HttpRequest("127.0.0.1", debug_port, "GET", "/metrics"); }).status, 404);
}

TEST(ListenAddress, ParsesV4V6AndRejectsGarbage) {
  EXPECT_EQ(ParseListenAddress("0.0.0.0:9464")->port(), 9464);
  EXPECT_TRUE(ParseListenAddress("[::1]:80")->address().is_v6());
  EXPECT_FALSE(ParseListenAddress("9464"));
  EXPECT_FALSE(ParseListenAddress("localhost:9464"));
  EXPECT_FALSE(ParseListenAddress("1.2.3.4:70000"));
  EXPECT_FALSE(ParseListenAddress("1.2.3.4:"));
}

}  // namespace
}  // namespace gns::metrics
