// Bad input from the API server, from a tiny scripted HTTPS server inside the test (the
// simulator cannot produce these): redirects, HTML where JSON belongs, bodies and watch lines
// over the caps, objects missing fields or with fields of the wrong type, truncated bodies.
// Each must end as a counted error and a retry or relist — never a crash, never a hang, never
// a cache that differs from what the server said.
#include "kube_test_util.hpp"
#include "modules/kube/api/informer.hpp"
#include "tls.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <atomic>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

namespace gns::kube {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// --- wire text -------------------------------------------------------------------------------

std::string Response(int status, const std::string& reason, const std::vector<std::pair<std::string, std::string>>& headers,
                     const std::string& body, std::optional<std::size_t> content_length = std::nullopt) {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\n";
  for (const auto& [name, value] : headers) out += name + ": " + value + "\r\n";
  out += "Content-Length: " + std::to_string(content_length.value_or(body.size())) + "\r\n\r\n";
  return out + body;
}

std::string JsonResponse(int status, const json& body) {
  return Response(status, status == 200 ? "OK" : "Status", {{"Content-Type", "application/json"}}, body.dump());
}

std::string Html() {
  return Response(200, "OK", {{"Content-Type", "text/html; charset=utf-8"}},
                  "<html><head><title>Sign in</title></head><body>corporate proxy login</body></html>");
}

std::string Chunk(const std::string& data) {
  std::ostringstream size;
  size << std::hex << data.size();
  return size.str() + "\r\n" + data + "\r\n";
}

// A watch response: headers, one chunk per line; `end` adds the last chunk.
std::string WatchStream(const std::vector<std::string>& lines, bool end = false) {
  std::string out = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (const auto& line : lines) out += Chunk(line + "\n");
  if (end) out += "0\r\n\r\n";
  return out;
}

json Obj(const std::string& name, const std::string& rv) {
  return {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", name}, {"resourceVersion", rv}}}};
}

json ListBody(const std::string& rv, json items, const std::string& cont = {}) {
  json meta = {{"resourceVersion", rv}};
  if (!cont.empty()) meta["continue"] = cont;
  return {{"kind", "NodeList"}, {"apiVersion", "v1"}, {"metadata", meta}, {"items", std::move(items)}};
}

std::string Event(const std::string& type, const json& object) { return json{{"type", type}, {"object", object}}.dump(); }

// --- the scripted server ---------------------------------------------------------------------

struct Step {
  std::string raw;     // written after the request was read
  bool close = false;  // close after writing (otherwise keep-alive: read the next request)
  bool hold = false;   // after writing, keep the connection open until the peer closes it (a watch)
  bool gated = false;  // answer only after Release()
};

struct Seen {
  std::string method;
  std::string target;
  int conn = 0;
  Clock::time_point at;
};

class ScriptedServer {
 public:
  explicit ScriptedServer(const sim::api::TlsMaterial& tls) {
    ctx_.use_certificate_chain(asio::buffer(tls.server_cert_pem));
    ctx_.use_private_key(asio::buffer(tls.server_key_pem), ssl::context::pem);
    const tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(endpoint.protocol());
    acceptor_.bind(endpoint);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    asio::co_spawn(io_, Accept(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
  }
  ~ScriptedServer() { Stop(); }

  void Stop() {
    if (!thread_.joinable()) return;
    asio::post(io_, [this] {
      stopping_ = true;
      beast::error_code ec;
      acceptor_.close(ec);
      gate_.cancel();
      for (auto* socket : sockets_) socket->close(ec);
    });
    thread_.join();
  }

  std::string Url() const { return "https://127.0.0.1:" + std::to_string(port_); }
  void Push(Step step) {
    std::lock_guard lock(mu_);
    script_.push_back(std::move(step));
  }
  void Push(std::string raw) { Push(Step{std::move(raw)}); }
  // Lets one gated answer go.
  void Release() {
    asio::post(io_, [this] {
      ++releases_;
      gate_.cancel();
    });
  }
  std::vector<Seen> Requests() const {
    std::lock_guard lock(mu_);
    return seen_;
  }
  std::size_t RequestCount() const { return Requests().size(); }
  int Accepted() const { return accepted_.load(); }
  std::size_t Unscripted() const {
    std::lock_guard lock(mu_);
    return unscripted_;
  }

 private:
  static constexpr auto kAwait = asio::use_awaitable;

  asio::awaitable<void> Accept() {
    for (;;) {
      beast::error_code ec;
      tcp::socket socket(io_);
      co_await acceptor_.async_accept(socket, asio::redirect_error(kAwait, ec));
      if (ec || stopping_) co_return;
      const int id = ++accepted_;
      asio::co_spawn(io_, Serve(std::move(socket), id), asio::detached);
    }
  }

  asio::awaitable<void> Serve(tcp::socket socket, int id) {
    beast::ssl_stream<beast::tcp_stream> stream(std::move(socket), ctx_);
    auto* raw = &beast::get_lowest_layer(stream).socket();
    sockets_.insert(raw);
    struct Untrack {
      std::set<tcp::socket*>& set;
      tcp::socket* socket;
      ~Untrack() { set.erase(socket); }
    } untrack{sockets_, raw};
    beast::error_code ec;
    co_await stream.async_handshake(ssl::stream_base::server, asio::redirect_error(kAwait, ec));
    beast::flat_buffer buffer;
    while (!ec && !stopping_) {
      http::request<http::string_body> req;
      co_await http::async_read(stream, buffer, req, asio::redirect_error(kAwait, ec));
      if (ec) break;
      Step step;
      {
        std::lock_guard lock(mu_);
        seen_.push_back(Seen{std::string(req.method_string()), std::string(req.target()), id, Clock::now()});
        if (script_.empty()) {
          ++unscripted_;
          step = Step{JsonResponse(500, json{{"kind", "Status"}, {"code", 500}, {"message", "script exhausted"}}), true};
        } else {
          step = std::move(script_.front());
          script_.pop_front();
        }
      }
      if (step.gated) {
        while (releases_ == 0 && !stopping_) {
          gate_.expires_at(asio::steady_timer::time_point::max());
          co_await gate_.async_wait(asio::redirect_error(kAwait, ec));
        }
        ec = {};
        if (stopping_) break;
        --releases_;
      }
      co_await asio::async_write(stream, asio::buffer(step.raw), asio::redirect_error(kAwait, ec));
      if (ec) break;
      if (step.hold) {
        char c;
        co_await stream.async_read_some(asio::buffer(&c, 1), asio::redirect_error(kAwait, ec));
        break;
      }
      if (step.close) break;
    }
    raw->close(ec);
  }

  asio::io_context io_;
  ssl::context ctx_{ssl::context::tls_server};
  tcp::acceptor acceptor_{io_};
  asio::steady_timer gate_{io_};
  unsigned short port_ = 0;
  std::thread thread_;
  // Loop-thread (server io) only.
  bool stopping_ = false;
  int releases_ = 0;
  std::set<tcp::socket*> sockets_;
  // Shared with the test thread.
  mutable std::mutex mu_;
  std::deque<Step> script_;
  std::vector<Seen> seen_;
  std::size_t unscripted_ = 0;
  std::atomic<int> accepted_{0};
};

// --- fixture ---------------------------------------------------------------------------------

const sim::api::TlsMaterial& Tls() {
  static const auto tls = sim::api::GenerateTlsMaterial();
  return tls;
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override { server_ = std::make_unique<ScriptedServer>(Tls()); }

  void TearDown() override {
    informer_.reset();
    events_sub_.Reset();
    for (auto& c : clients_) c->Shutdown();
    h_.Drain();
    clients_.clear();
    server_->Stop();
  }

  ClientConfig Config() {
    ClientConfig config;
    config.server = server_->Url();
    config.ca_pem = Tls().ca_cert_pem;
    config.token = "test-token";
    config.qps = 1000;
    config.burst = 1000;
    config.request_timeout = std::chrono::milliseconds(5000);
    // Each scripted answer is seen by the code under test as it is (the client's own retries
    // are tried against the simulator in client_test).
    config.retry.max_attempts = 1;
    return config;
  }

  std::shared_ptr<KubeClient> MakeClient(ClientConfig config) {
    auto client = std::make_shared<KubeClient>(
        KubeClient::Deps{h_.loop, h_.clock, h_.metrics, gns::test::QuietLogger("kube-test")}, std::move(config));
    clients_.push_back(client);
    return client;
  }

  template <typename Start>
  Result Wait(Start start) {
    std::optional<Result> out;
    start([&out](Result r) { out = std::move(r); });
    EXPECT_TRUE(h_.RunUntil([&] { return out.has_value(); }, std::chrono::seconds(10))) << "no answer";
    return out.value_or(Result{-1, nullptr, "no answer"});
  }

  InformerOptions Options(std::chrono::milliseconds backoff = std::chrono::milliseconds(20)) {
    InformerOptions options;
    options.backoff = BackoffPolicy{backoff, backoff * 4, 2.0, 0.0};
    options.idle_timeout = std::chrono::milliseconds(20000);
    options.min_watch_timeout = std::chrono::seconds(0);
    return options;
  }

  std::shared_ptr<Informer> StartInformer(std::shared_ptr<KubeClient> client, InformerOptions options) {
    events_sub_ = h_.bus.Subscribe<ResourceEvent>([this](const ResourceEvent& e) { events_.push_back(e); });
    informer_ = std::make_shared<Informer>(InformerSpec{nodes_, "", ""}, std::move(client), h_.bus, h_.loop.Io(),
                                           h_.metrics, gns::test::QuietLogger("kube-test"), std::move(options));
    informer_->Start();
    return informer_;
  }

  std::map<std::string, std::string> Cache() const {
    std::map<std::string, std::string> out;
    for (const auto& [key, object] : informer_->Items()) out[key] = ObjectMeta::From(*object)->resource_version;
    return out;
  }

  int Count(ResourceEvent::Type type, const std::string& name = {}) const {
    int n = 0;
    for (const auto& e : events_) n += e.type == type && (name.empty() || (*e.object)["metadata"]["name"] == name);
    return n;
  }

  double Metric(const char* name, MetricLabels labels) { return h_.metrics.Counter(name, "", std::move(labels)).Value(); }
  double DecodeErrors(const std::string& what) {
    return Metric("gpu_node_supervisor_kube_decode_errors_total", {{"what", what}});
  }
  double Requests(const std::string& verb, int code) {
    return Metric("gpu_node_supervisor_kube_requests_total", {{"verb", verb}, {"code", std::to_string(code)}});
  }
  double InformerMetric(const char* name) { return Metric(name, {{"informer", informer_->Key()}}); }

  bool WaitRequests(std::size_t n) {
    return h_.RunUntil([&] { return server_->RequestCount() >= n; }, std::chrono::seconds(10));
  }

  const std::string nodes_ = ResourcePath::Core("nodes").Collection();
  gns::test::LoopHarness h_;
  std::unique_ptr<ScriptedServer> server_;
  std::vector<std::shared_ptr<KubeClient>> clients_;
  std::shared_ptr<Informer> informer_;
  std::vector<ResourceEvent> events_;
  Subscription events_sub_;
};

using Type = ResourceEvent::Type;
using Map = std::map<std::string, std::string>;

// --- (1) redirects ---------------------------------------------------------------------------

TEST_F(BadInputTest, RedirectIsAnErrorAndIsNotFollowed) {
  ScriptedServer elsewhere(Tls());
  const std::string location = elsewhere.Url() + "/api/v1/nodes/n1";
  auto client = MakeClient(Config());

  server_->Push(Response(302, "Found", {{"Location", location}}, ""));
  auto got = Wait([&](auto cb) { client->Get(ResourcePath::Core("nodes").Object("n1"), cb); });
  EXPECT_FALSE(got.Ok());
  EXPECT_EQ(got.http_status, 302);
  EXPECT_NE(got.error.find("redirect"), std::string::npos) << got.error;
  EXPECT_NE(got.error.find(location), std::string::npos) << got.error;
  EXPECT_TRUE(got.object.is_null());
  EXPECT_EQ(Requests("get", 302), 1);

  server_->Push(Response(307, "Temporary Redirect", {{"Location", elsewhere.Url() + nodes_}}, ""));
  auto created = Wait([&](auto cb) { client->Create(nodes_, Obj("n2", ""), cb); });
  EXPECT_FALSE(created.Ok());
  EXPECT_EQ(created.http_status, 307);
  EXPECT_NE(created.error.find("redirect (HTTP 307)"), std::string::npos) << created.error;
  EXPECT_EQ(Requests("create", 307), 1);

  server_->Push(Step{Response(307, "Temporary Redirect", {{"Location", elsewhere.Url() + nodes_ + "?watch=1"}}, ""),
                     true});
  std::optional<WatchEnd> end;
  auto watch = client->Watch(nodes_, WatchOptions{}, WatchCallbacks{[](std::string_view) {}, [&](const WatchEnd& e) {
                                                                      end = e;
                                                                    }});
  ASSERT_TRUE(h_.RunUntil([&] { return end.has_value(); }, std::chrono::seconds(10)));
  EXPECT_EQ(end->http_status, 307);
  EXPECT_FALSE(end->clean);
  EXPECT_NE(end->error.find("redirect"), std::string::npos) << end->error;
  EXPECT_EQ(Requests("watch", 307), 1);

  // Nothing went to the Location, and nothing was retried here either.
  EXPECT_EQ(elsewhere.Accepted(), 0);
  EXPECT_TRUE(elsewhere.Requests().empty());
  EXPECT_EQ(server_->RequestCount(), 3u);
  EXPECT_EQ(client->GetStats().requests, 3u);
}

TEST_F(BadInputTest, InformerDoesNotFollowARedirectedListAndRetries) {
  ScriptedServer elsewhere(Tls());
  auto client = MakeClient(Config());
  server_->Push(Response(302, "Found", {{"Location", elsewhere.Url() + nodes_}}, ""));
  server_->Push(JsonResponse(200, ListBody("5", json::array({Obj("a", "5")}))));
  server_->Push(Step{WatchStream({}), false, true});
  auto informer = StartInformer(client, Options());
  ASSERT_TRUE(h_.RunUntil([&] { return informer->Synced() && server_->RequestCount() == 3; }));
  EXPECT_EQ(Cache(), (Map{{"a", "5"}}));
  EXPECT_EQ(informer->GetStats().errors, 1u);
  EXPECT_EQ(InformerMetric("gpu_node_supervisor_kube_informer_errors_total"), 1);
  EXPECT_EQ(Requests("list", 302), 1);
  EXPECT_EQ(elsewhere.Accepted(), 0);
}

// --- (2) an unexpected content type ----------------------------------------------------------

TEST_F(BadInputTest, HtmlOnGetAndListIsAnErrorNotAnEmptyList) {
  auto client = MakeClient(Config());
  server_->Push(Html());
  auto got = Wait([&](auto cb) { client->Get(ResourcePath::Core("nodes").Object("n1"), cb); });
  EXPECT_FALSE(got.Ok());
  EXPECT_EQ(got.http_status, 200);
  EXPECT_NE(got.error.find("unexpected content type \"text/html"), std::string::npos) << got.error;
  EXPECT_TRUE(got.object.is_null());
  EXPECT_EQ(DecodeErrors("content-type"), 1);

  server_->Push(Html());
  auto listed = Wait([&](auto cb) { client->List(nodes_, ListOptions{}, cb); });
  EXPECT_FALSE(listed.Ok());
  EXPECT_NE(listed.error.find("content type"), std::string::npos) << listed.error;
  EXPECT_FALSE(listed.object.contains("items")) << listed.object.dump();
  EXPECT_EQ(DecodeErrors("content-type"), 2);

  // HTML on the second page: no partial list either.
  server_->Push(JsonResponse(200, ListBody("9", json::array({Obj("a", "1")}), "page-2")));
  server_->Push(Html());
  auto paged = Wait([&](auto cb) { client->List(nodes_, ListOptions{"", "", 1}, cb); });
  EXPECT_FALSE(paged.Ok());
  EXPECT_NE(paged.error.find("content type"), std::string::npos) << paged.error;
  EXPECT_FALSE(paged.object.contains("items")) << paged.object.dump();
  EXPECT_EQ(DecodeErrors("content-type"), 3);
  EXPECT_EQ(Requests("get", 200), 1);
  EXPECT_EQ(Requests("list", 200), 3);
  EXPECT_EQ(server_->Unscripted(), 0u);
}

TEST_F(BadInputTest, InformerRetriesAnHtmlRelistWithBackoffAndDeletesNothing) {
  const auto backoff = std::chrono::milliseconds(150);
  auto client = MakeClient(Config());
  const json items = json::array({Obj("a", "1"), Obj("b", "2")});
  server_->Push(JsonResponse(200, ListBody("2", items)));                                      // 1 list
  server_->Push(JsonResponse(410, json{{"kind", "Status"}, {"code", 410}, {"message", "too old"}}));  // 2 watch
  server_->Push(Html());                                                                       // 3 relist: HTML
  server_->Push(Step{JsonResponse(200, ListBody("3", items)), false, false, true});             // 4 relist (gated)
  server_->Push(Step{Response(200, "OK", {{"Content-Type", "text/html"}}, "<html>watch</html>"), true});  // 5 watch
  server_->Push(JsonResponse(200, ListBody("4", items)));                                      // 6 relist
  server_->Push(Step{WatchStream({}), false, true});                                          // 7 watch, open
  auto informer = StartInformer(client, Options(backoff));

  ASSERT_TRUE(WaitRequests(4));
  h_.Drain();
  // The HTML "list" was not taken as an empty list: nothing deleted, the cache as it was.
  EXPECT_EQ(Cache(), (Map{{"a", "1"}, {"b", "2"}}));
  EXPECT_TRUE(informer->Synced());
  EXPECT_EQ(Count(Type::kDeleted), 0);
  EXPECT_EQ(informer->GetStats().errors, 1u);
  EXPECT_EQ(InformerMetric("gpu_node_supervisor_kube_informer_errors_total"), 1);
  EXPECT_EQ(DecodeErrors("content-type"), 1);
  const auto seen = server_->Requests();
  EXPECT_EQ(seen[2].target.find(nodes_ + "?limit="), 0u) << seen[2].target;
  EXPECT_EQ(seen[3].target.find(nodes_ + "?limit="), 0u) << seen[3].target;
  EXPECT_GE(seen[3].at - seen[2].at, backoff);  // retried after the backoff, not at once

  server_->Release();
  ASSERT_TRUE(h_.RunUntil([&] { return server_->RequestCount() == 7 && informer->GetStats().lists == 3; }));
  h_.Drain();
  // The HTML watch was a decode error and a relist; still nothing deleted or re-published.
  EXPECT_EQ(Cache(), (Map{{"a", "1"}, {"b", "2"}}));
  EXPECT_EQ(informer->ResourceVersion(), "4");
  EXPECT_EQ(Count(Type::kDeleted), 0);
  EXPECT_EQ(Count(Type::kAdded), 2);
  EXPECT_EQ(Count(Type::kModified), 0);
  EXPECT_EQ(informer->GetStats().decode_errors, 1u);
  EXPECT_EQ(InformerMetric("gpu_node_supervisor_kube_informer_decode_errors_total"), 1);
  EXPECT_EQ(DecodeErrors("content-type"), 2);
  EXPECT_EQ(InformerMetric("gpu_node_supervisor_kube_relists_total"), 2);
  EXPECT_EQ(server_->Unscripted(), 0u);
}

// --- (3) huge objects ------------------------------------------------------------------------

TEST_F(BadInputTest, BodyOverTheCapIsAnErrorAndTheConnectionIsNotReused) {
  auto config = Config();
  config.max_response_bytes = 1024;
  auto client = MakeClient(config);
  const std::string path = ResourcePath::Core("nodes").Object("a");
  json big = Obj("a", "1");
  big["metadata"]["annotations"]["pad"] = std::string(4096, 'x');

  server_->Push(JsonResponse(200, Obj("a", "1")));
  server_->Push(JsonResponse(200, big));  // Content-Length over the cap, kept alive by the server
  server_->Push(JsonResponse(200, Obj("a", "1")));
  // Chunked, no length up front: the cap trips while reading.
  std::string chunked = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string text = big.dump();
  for (std::size_t i = 0; i < text.size(); i += 512) chunked += Chunk(text.substr(i, 512));
  chunked += "0\r\n\r\n";
  server_->Push(chunked);
  server_->Push(JsonResponse(200, Obj("a", "1")));

  EXPECT_TRUE(Wait([&](auto cb) { client->Get(path, cb); }).Ok());
  auto huge = Wait([&](auto cb) { client->Get(path, cb); });
  EXPECT_FALSE(huge.Ok());
  EXPECT_EQ(huge.http_status, 0);
  EXPECT_NE(huge.error.find("larger than 1024 bytes"), std::string::npos) << huge.error;
  EXPECT_EQ(DecodeErrors("too-large"), 1);
  EXPECT_TRUE(Wait([&](auto cb) { client->Get(path, cb); }).Ok());
  auto huge_chunked = Wait([&](auto cb) { client->Get(path, cb); });
  EXPECT_FALSE(huge_chunked.Ok());
  EXPECT_NE(huge_chunked.error.find("larger than 1024 bytes"), std::string::npos) << huge_chunked.error;
  EXPECT_EQ(DecodeErrors("too-large"), 2);
  auto after = Wait([&](auto cb) { client->Get(path, cb); });
  EXPECT_TRUE(after.Ok()) << after.error;
  EXPECT_EQ(after.object, Obj("a", "1"));

  // Each oversized answer took its connection with it; the next request opened a new one.
  const auto seen = server_->Requests();
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen[0].conn, seen[1].conn);
  EXPECT_NE(seen[2].conn, seen[1].conn);
  EXPECT_EQ(seen[3].conn, seen[2].conn);
  EXPECT_NE(seen[4].conn, seen[3].conn);
  EXPECT_EQ(server_->Accepted(), 3);
  EXPECT_EQ(client->GetStats().connections_opened, 3u);
  EXPECT_EQ(Requests("get", 0), 2);
  EXPECT_EQ(Requests("get", 200), 3);
}

// A watch line over the cap: counted, the watch dropped, the cache untouched until a relist.
class BadInputLineTest : public BadInputTest, public ::testing::WithParamInterface<std::size_t> {};

TEST_P(BadInputLineTest, WatchLineOverTheCapRelistsAndLeavesTheCacheAlone) {
  auto config = Config();
  config.max_watch_line_bytes = 2048;
  auto client = MakeClient(config);
  json huge_a = Obj("a", "4");
  huge_a["metadata"]["annotations"]["pad"] = std::string(GetParam(), 'x');
  server_->Push(JsonResponse(200, ListBody("2", json::array({Obj("a", "1"), Obj("b", "2")}))));
  server_->Push(Step{WatchStream({Event("ADDED", Obj("c", "3")), Event("MODIFIED", huge_a),
                                  Event("MODIFIED", Obj("b", "5"))}),
                     false, true});
  server_->Push(Step{JsonResponse(200, ListBody("5", json::array({huge_a, Obj("b", "5"), Obj("c", "3")}))), false,
                     false, true});
  server_->Push(Step{WatchStream({}), false, true});
  auto informer = StartInformer(client, Options());

  ASSERT_TRUE(WaitRequests(3));
  h_.Drain();
  // Before the relist: the good event before the long line applied, nothing from or after it.
  EXPECT_EQ(Cache(), (Map{{"a", "1"}, {"b", "2"}, {"c", "3"}}));
  EXPECT_EQ(Count(Type::kAdded, "c"), 1);
  EXPECT_EQ(Count(Type::kModified), 0);
  EXPECT_EQ(informer->GetStats().decode_errors, 1u);
  EXPECT_EQ(InformerMetric("gpu_node_supervisor_kube_informer_decode_errors_total"), 1);
  EXPECT_EQ(DecodeErrors("too-large"), 1);

  server_->Release();
  ASSERT_TRUE(h_.RunUntil([&] { return informer->GetStats().lists == 2 && server_->RequestCount() == 4; }));
  h_.Drain();
  EXPECT_EQ(Cache(), (Map{{"a", "4"}, {"b", "5"}, {"c", "3"}}));
  EXPECT_EQ(Count(Type::kModified, "a"), 1);
  EXPECT_EQ(Count(Type::kModified, "b"), 1);
  EXPECT_EQ(Count(Type::kDeleted), 0);
  EXPECT_EQ(InformerMetric("gpu_node_supervisor_kube_relists_total"), 1);
  EXPECT_EQ(server_->Unscripted(), 0u);
}

// 3 KB fits one TLS record (the whole line arrives in one read); 300 KiB spans many reads.
INSTANTIATE_TEST_SUITE_P(Sizes, BadInputLineTest,
                         ::testing::Values(std::size_t{3000}, std::size_t{8 * 1024}, std::size_t{300 * 1024}));

// --- (4) objects missing fields --------------------------------------------------------------

TEST_F(BadInputTest, ObjectsMissingFieldsAreCountedAndSkipped) {
  auto client = MakeClient(Config());
  json list_items = json::array({Obj("a", "1"),
                                 json{{"metadata", {{"resourceVersion", "7"}}}},  // no name
                                 json{{"metadata", {{"name", "norv"}}}},           // no resourceVersion
                                 json{{"metadata", "not a map"}},
                                 42,
                                 Obj("b", "2")});
  const json good = json::array({Obj("a", "1"), Obj("b", "2"), Obj("c", "9")});
  server_->Push(JsonResponse(200, ListBody("8", list_items)));
  server_->Push(Step{WatchStream({R"({"type":"ADDED"})"}), false, true});
  server_->Push(JsonResponse(200, ListBody("9", good)));
  server_->Push(Step{WatchStream({R"({"type":"ADDED","object":"not a map"})"}), false, true});
  server_->Push(JsonResponse(200, ListBody("9", good)));
  server_->Push(Step{WatchStream({Event("ADDED", json{{"metadata", {{"name", "d"}}}})}), false, true});
  server_->Push(JsonResponse(200, ListBody("9", good)));
  server_->Push(Step{WatchStream({Event("MODIFIED", Obj("a", "10"))}), false, true});
  auto informer = StartInformer(client, Options());

  ASSERT_TRUE(h_.RunUntil([&] { return server_->RequestCount() == 8 && Cache()["a"] == "10"; }));
  h_.Drain();
  EXPECT_EQ(Cache(), (Map{{"a", "10"}, {"b", "2"}, {"c", "9"}}));
  EXPECT_EQ(informer->ResourceVersion(), "10");
  // 4 bad list items, 3 bad watch events.
  EXPECT_EQ(informer->GetStats().decode_errors, 7u);
  EXPECT_EQ(InformerMetric("gpu_node_supervisor_kube_informer_decode_errors_total"), 7);
  EXPECT_EQ(informer->GetStats().lists, 4u);
  EXPECT_EQ(InformerMetric("gpu_node_supervisor_kube_relists_total"), 3);
  EXPECT_EQ(Count(Type::kDeleted), 0);
  EXPECT_EQ(Count(Type::kAdded, "d"), 0);
  EXPECT_EQ(Count(Type::kAdded, "norv"), 0);
  EXPECT_TRUE(informer->Synced());
  EXPECT_EQ(server_->Unscripted(), 0u);
}

// Fields of the wrong type must not throw out of a callback (an exception there would end the
// request or watch coroutine silently: no callback, an informer that never recovers).
TEST_F(BadInputTest, ListMetadataOfTheWrongTypeIsAnError) {
  auto client = MakeClient(Config());
  json numeric_rv = ListBody("1", json::array({Obj("a", "1")}));
  numeric_rv["metadata"]["resourceVersion"] = 12;
  server_->Push(JsonResponse(200, numeric_rv));
  auto r1 = Wait([&](auto cb) { client->List(nodes_, ListOptions{}, cb); });
  EXPECT_FALSE(r1.Ok());
  EXPECT_NE(r1.http_status, -1) << "no callback";

  json numeric_continue = ListBody("1", json::array({Obj("a", "1")}));
  numeric_continue["metadata"]["continue"] = 5;
  server_->Push(JsonResponse(200, numeric_continue));
  auto r2 = Wait([&](auto cb) { client->List(nodes_, ListOptions{}, cb); });
  EXPECT_FALSE(r2.Ok());
  EXPECT_NE(r2.http_status, -1) << "no callback";

  // A 200 JSON answer that is not a list at all.
  server_->Push(JsonResponse(200, json{{"kind", "Status"}, {"items", "nope"}}));
  auto r3 = Wait([&](auto cb) { client->List(nodes_, ListOptions{}, cb); });
  EXPECT_FALSE(r3.Ok());
  EXPECT_NE(r3.error.find("without items or metadata"), std::string::npos) << r3.error;
  EXPECT_EQ(DecodeErrors("list"), 3);
  EXPECT_EQ(server_->RequestCount(), 3u);
}

TEST_F(BadInputTest, WatchErrorEventWithFieldsOfTheWrongTypeIsCountedAndRecovered) {
  auto client = MakeClient(Config());
  server_->Push(JsonResponse(200, ListBody("1", json::array({Obj("a", "1")}))));
  server_->Push(Step{WatchStream({R"({"type":"ERROR","object":{"code":"boom","message":7}})"}), false, true});
  server_->Push(Step{WatchStream({Event("ADDED", Obj("b", "2"))}), false, true});
  auto informer = StartInformer(client, Options());
  ASSERT_TRUE(h_.RunUntil([&] { return Cache() == Map{{"a", "1"}, {"b", "2"}}; }, std::chrono::seconds(10)))
      << "the informer stopped after the ERROR event";
  EXPECT_GE(informer->GetStats().errors, 1u);
  EXPECT_GE(InformerMetric("gpu_node_supervisor_kube_informer_errors_total"), 1);
  EXPECT_EQ(server_->RequestCount(), 3u);
}

// --- (5) truncated bodies --------------------------------------------------------------------

TEST_F(BadInputTest, TruncatedBodyIsAnErrorAndIsNotResent) {
  auto client = MakeClient(Config());
  const std::string path = ResourcePath::Core("nodes").Object("a");
  const std::string partial =
      Response(200, "OK", {{"Content-Type", "application/json"}}, R"({"metadata":{"name":"a")", 1000);
  server_->Push(Step{partial, true});
  auto got = Wait([&](auto cb) { client->Get(path, cb); });
  EXPECT_FALSE(got.Ok());
  EXPECT_EQ(got.http_status, 0);
  EXPECT_FALSE(got.error.empty());
  EXPECT_TRUE(got.object.is_null());
  EXPECT_EQ(Requests("get", 0), 1);

  // On a kept-alive connection: an answer had begun, so a POST is not sent a second time.
  server_->Push(JsonResponse(200, Obj("a", "1")));
  server_->Push(Step{partial, true});
  EXPECT_TRUE(Wait([&](auto cb) { client->Get(path, cb); }).Ok());
  auto created = Wait([&](auto cb) { client->Create(nodes_, Obj("z", ""), cb); });
  EXPECT_FALSE(created.Ok());
  EXPECT_EQ(created.http_status, 0);
  EXPECT_EQ(Requests("create", 0), 1);
  EXPECT_EQ(server_->RequestCount(), 3u);

  // A truncated list: an error for the informer, which retries and then sees the truth.
  server_->Push(Step{Response(200, "OK", {{"Content-Type", "application/json"}}, R"({"items":[)", 5000), true});
  server_->Push(JsonResponse(200, ListBody("3", json::array({Obj("a", "3")}))));
  server_->Push(Step{WatchStream({}), false, true});
  auto informer = StartInformer(client, Options());
  ASSERT_TRUE(h_.RunUntil([&] { return informer->Synced() && server_->RequestCount() == 6; }));
  h_.Drain();
  EXPECT_EQ(Cache(), (Map{{"a", "3"}}));
  EXPECT_EQ(informer->GetStats().errors, 1u);
  EXPECT_EQ(Requests("list", 0), 1);
  EXPECT_EQ(server_->Unscripted(), 0u);
}

}  // namespace
}  // namespace gns::kube
