// Tests of the simulated kube-apiserver (tools/sim/apiserver) through a small Beast HTTPS
// client that verifies the simulator's CA, as the daemon's real client will.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <utility>  // before Asio: awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "apiserver.h"
#include "support/temp_dir.hpp"

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Json = nlohmann::json;
using gns::sim::ApiServer;
using gns::sim::ApiServerOptions;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Runs `ioc` until done() or the timeout; the pending operation is left alone on timeout.
bool RunUntil(asio::io_context& ioc, const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (!done()) {
    auto now = Clock::now();
    if (now >= deadline) return false;
    if (ioc.stopped()) ioc.restart();
    ioc.run_one_for(deadline - now);
  }
  return true;
}

struct Response {
  int status = 0;
  std::string body;
  std::string content_type;
  std::string retry_after;
  bool close = false;
  beast::error_code error;
  Json json() const { return Json::parse(body, nullptr, false); }
};

struct TlsOptions {
  std::string ca_pem;
  std::string verify_host = "127.0.0.1";
  std::string client_cert_pem;
  std::string client_key_pem;
};

// One TLS connection with blocking-looking calls (each runs the private io_context).
class Connection {
 public:
  Connection(std::uint16_t port, const TlsOptions& tls) : port_(port) {
    ctx_.add_certificate_authority(asio::buffer(tls.ca_pem));
    ctx_.set_verify_mode(ssl::verify_peer);
    if (!tls.client_cert_pem.empty()) {
      ctx_.use_certificate_chain(asio::buffer(tls.client_cert_pem));
      ctx_.use_private_key(asio::buffer(tls.client_key_pem), ssl::context::pem);
    }
    stream_.emplace(ioc_, ctx_);
    stream_->set_verify_callback(ssl::host_name_verification(tls.verify_host));
  }

  beast::error_code Connect() {
    auto ec = Run([&](auto handler) {
      beast::get_lowest_layer(*stream_).async_connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_),
                                                     std::move(handler));
    });
    if (ec) return ec;
    return Run([&](auto handler) { stream_->async_handshake(ssl::stream_base::client, std::move(handler)); });
  }

  beast::error_code WriteRaw(const std::string& bytes) {
    return Run([&](auto handler) { asio::async_write(*stream_, asio::buffer(bytes), std::move(handler)); });
  }

  beast::error_code Send(http::request<http::string_body>& request) {
    return Run([&](auto handler) { http::async_write(*stream_, request, std::move(handler)); });
  }

  Response Read(std::chrono::milliseconds timeout = 10s) {
    Response response;
    http::response_parser<http::string_body> parser;
    parser.body_limit(256 * 1024 * 1024);
    response.error =
        Run([&](auto handler) { http::async_read(*stream_, buffer_, parser, std::move(handler)); }, timeout);
    if (response.error) return response;
    const auto& message = parser.get();
    response.status = message.result_int();
    response.body = message.body();
    response.content_type = std::string(message[http::field::content_type]);
    response.retry_after = std::string(message[http::field::retry_after]);
    response.close = !message.keep_alive();
    return response;
  }

  Response Request(const std::string& method, const std::string& target, const std::string& body,
                   const std::string& content_type, const std::optional<std::string>& token) {
    http::request<http::string_body> request{http::string_to_verb(method), target, 11};
    request.set(http::field::host, "127.0.0.1");
    if (token) request.set(http::field::authorization, "Bearer " + *token);
    if (!body.empty() || method == "POST" || method == "PUT" || method == "PATCH") {
      request.set(http::field::content_type, content_type);
      request.body() = body;
    }
    request.prepare_payload();
    Response response;
    response.error = Send(request);
    if (response.error) return response;
    return Read();
  }

  // Waits for the server to close the connection; true when it did within the timeout.
  bool WaitClosed(std::chrono::milliseconds timeout) {
    char byte = 0;
    auto ec = Run([&](auto handler) { stream_->async_read_some(asio::buffer(&byte, 1), std::move(handler)); }, timeout);
    return ec && ec != asio::error::timed_out;
  }

  void Close() { beast::get_lowest_layer(*stream_).close(); }
  asio::io_context& ioc() { return ioc_; }
  beast::ssl_stream<beast::tcp_stream>& stream() { return *stream_; }
  beast::flat_buffer& buffer() { return buffer_; }

  template <class Start>
  beast::error_code Run(Start&& start, std::chrono::milliseconds timeout = 10s) {
    std::optional<beast::error_code> result;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    if (!RunUntil(ioc_, [&] { return result.has_value(); }, timeout)) {
      beast::get_lowest_layer(*stream_).close();  // aborts the operation
      RunUntil(ioc_, [&] { return result.has_value(); }, 5s);
      return asio::error::timed_out;
    }
    return *result;
  }

 private:
  std::uint16_t port_;
  asio::io_context ioc_;
  ssl::context ctx_{ssl::context::tls_client};
  std::optional<beast::ssl_stream<beast::tcp_stream>> stream_;
  beast::flat_buffer buffer_;
};

// A keep-alive client that reconnects when the server closed the previous connection.
class Client {
 public:
  Client(std::uint16_t port, TlsOptions tls) : port_(port), tls_(std::move(tls)) {}
  Response Do(const std::string& method, const std::string& target, const std::string& body = {},
              const std::string& content_type = "application/json",
              const std::optional<std::string>& token = std::nullopt) {
    if (!conn_) {
      conn_ = std::make_unique<Connection>(port_, tls_);
      if (auto ec = conn_->Connect()) {
        conn_.reset();
        Response failed;
        failed.error = ec;
        return failed;
      }
    }
    Response response = conn_->Request(method, target, body, content_type, token ? token : token_);
    if (response.error || response.close) conn_.reset();
    return response;
  }
  void set_token(std::optional<std::string> token) { token_ = std::move(token); }

 private:
  std::uint16_t port_;
  TlsOptions tls_;
  std::optional<std::string> token_;
  std::unique_ptr<Connection> conn_;
};

// A watch stream: lines are collected from the chunked body as they arrive, with the
// number of chunks each line spanned.
class WatchStream {
 public:
  WatchStream(std::uint16_t port, const TlsOptions& tls, const std::string& target, const std::string& token)
      : conn_(port, tls) {
    on_header_ = [this](std::uint64_t, beast::string_view, beast::error_code&) { ++chunks_; };
    on_body_ = [this](std::uint64_t, beast::string_view data, beast::error_code&) {
      if (partial_.empty()) first_chunk_ = chunks_;
      partial_.append(data.data(), data.size());
      std::size_t newline;
      while ((newline = partial_.find('\n')) != std::string::npos) {
        lines_.push_back({partial_.substr(0, newline), chunks_ - first_chunk_ + 1});
        partial_.erase(0, newline + 1);
        first_chunk_ = chunks_;
      }
      return data.size();
    };
    // Not boost::none: Boost 1.74 compares a Content-Length against an empty optional as
    // "too large" (basic_parser.ipp), so an error body would fail.
    parser_.body_limit(std::uint64_t{1} << 40);
    parser_.on_chunk_header(on_header_);
    parser_.on_chunk_body(on_body_);
    if ((error_ = conn_.Connect())) return;
    http::request<http::string_body> request{http::verb::get, target, 11};
    request.set(http::field::host, "127.0.0.1");
    request.set(http::field::authorization, "Bearer " + token);
    if ((error_ = conn_.Send(request))) return;
    error_ = conn_.Run([&](auto handler) {
      http::async_read_header(conn_.stream(), conn_.buffer(), parser_, std::move(handler));
    });
    if (error_) return;
    status_ = parser_.get().result_int();
    if (!parser_.chunked()) {
      error_ = conn_.Run([&](auto handler) {
        http::async_read(conn_.stream(), conn_.buffer(), parser_, std::move(handler));
      });
      body_ = parser_.get().body();
      done_ = true;
    }
  }

  int status() const { return status_; }
  const std::string& body() const { return body_; }
  beast::error_code error() const { return error_; }
  bool ended_cleanly() const { return done_ && !error_; }
  bool broken() const { return static_cast<bool>(error_); }

  struct Line {
    std::string text;
    int chunks;
  };

  std::optional<Line> NextLine(std::chrono::milliseconds timeout = 5s) {
    auto have = [&] { return !lines_.empty() || done_ || (error_ && !read_pending_); };
    auto deadline = Clock::now() + timeout;
    while (!have()) {
      if (!read_pending_) {
        read_pending_ = true;
        http::async_read_some(conn_.stream(), conn_.buffer(), parser_, [this](beast::error_code ec, std::size_t) {
          read_pending_ = false;
          if (ec) {
            error_ = ec;
          } else if (parser_.is_done()) {
            done_ = true;
          }
        });
      }
      auto now = Clock::now();
      if (now >= deadline) return std::nullopt;
      if (!RunUntil(conn_.ioc(), [&] { return !read_pending_; }, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now))) {
        if (lines_.empty()) return std::nullopt;
      }
    }
    if (lines_.empty()) return std::nullopt;
    Line line = std::move(lines_.front());
    lines_.erase(lines_.begin());
    return line;
  }

  // The next event as JSON; a malformed line comes back as {"malformed": "<text>"}.
  std::optional<Json> Next(std::chrono::milliseconds timeout = 5s) {
    auto line = NextLine(timeout);
    if (!line) return std::nullopt;
    Json event = Json::parse(line->text, nullptr, false);
    if (event.is_discarded()) return Json{{"malformed", line->text}};
    return event;
  }

  // Skips BOOKMARK events.
  std::optional<Json> NextChange(std::chrono::milliseconds timeout = 5s) {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      auto event = Next(left);
      if (!event || event->value("type", "") != "BOOKMARK") return event;
    }
  }

  void Close() { conn_.Close(); }

 private:
  Connection conn_;
  std::function<void(std::uint64_t, beast::string_view, beast::error_code&)> on_header_;
  std::function<std::size_t(std::uint64_t, beast::string_view, beast::error_code&)> on_body_;
  http::response_parser<http::string_body> parser_;
  int chunks_ = 0;
  int first_chunk_ = 0;
  std::string partial_;
  std::vector<Line> lines_;
  bool read_pending_ = false;
  bool done_ = false;
  int status_ = 0;
  std::string body_;
  beast::error_code error_;
};

Json Object(const std::string& api_version, const std::string& kind, const std::string& name,
            Json labels = Json::object()) {
  Json obj = {{"apiVersion", api_version}, {"kind", kind}, {"metadata", {{"name", name}}}};
  if (!labels.empty()) obj["metadata"]["labels"] = std::move(labels);
  return obj;
}

Json ConfigMap(const std::string& name, Json data = Json::object(), Json labels = Json::object()) {
  Json cm = Object("v1", "ConfigMap", name, std::move(labels));
  cm["data"] = std::move(data);
  return cm;
}

Json Pod(const std::string& name, Json labels = Json::object(), const std::string& node = "") {
  Json pod = Object("v1", "Pod", name, std::move(labels));
  pod["spec"] = {{"containers", Json::array({Json{{"name", "c"}, {"image", "busybox"}}})}};
  if (!node.empty()) pod["spec"]["nodeName"] = node;
  return pod;
}

Json Slice(const std::string& name, const std::string& node, const std::string& driver) {
  Json slice = Object("resource.k8s.io/v1", "ResourceSlice", name);
  slice["spec"] = {{"driver", driver}, {"nodeName", node}, {"pool", {{"name", node}, {"generation", 1}, {"resourceSliceCount", 1}}}};
  return slice;
}

std::uint64_t Rv(const Json& obj) { return std::stoull(obj["metadata"]["resourceVersion"].get<std::string>()); }

std::set<std::string> Names(const Json& list) {
  std::set<std::string> names;
  for (const auto& item : list["items"]) names.insert(item["metadata"]["name"].get<std::string>());
  return names;
}

std::string Escape(std::string text) {
  std::string out;
  for (char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", static_cast<unsigned char>(c));
      out += buf;
    }
  }
  return out;
}

constexpr const char* kPods = "/api/v1/namespaces/default/pods";
constexpr const char* kConfigMaps = "/api/v1/namespaces/default/configmaps";
constexpr const char* kSlices = "/apis/resource.k8s.io/v1/resourceslices";
constexpr const char* kClaims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims";
constexpr const char* kWidgets = "/apis/example.com/v1/namespaces/default/widgets";

class ApiServerSimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.bookmark_interval = 100ms;
    options_.resources_without_status = {"gadgets.example.com"};
    server_ = std::make_unique<ApiServer>(options_);
    server_->Start();
    client_ = std::make_unique<Client>(server_->Port(), Tls());
    client_->set_token(server_->Token());
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  TlsOptions Tls() const { return TlsOptions{server_->CaPem(), "127.0.0.1", {}, {}}; }

  Response Do(const std::string& method, const std::string& target, const std::string& body = {},
              const std::string& content_type = "application/json") {
    return client_->Do(method, target, body, content_type);
  }
  Json Ok(const std::string& method, const std::string& target, const Json& body = nullptr,
          int expected = 200, const std::string& content_type = "application/json") {
    Response r = Do(method, target, body.is_null() ? std::string() : body.dump(), content_type);
    EXPECT_EQ(r.status, expected) << method << " " << target << ": " << r.body << " " << r.error.message();
    return r.json();
  }
  std::unique_ptr<WatchStream> Watch(const std::string& target) {
    auto watch = std::make_unique<WatchStream>(server_->Port(), Tls(), target, server_->Token());
    EXPECT_FALSE(watch->broken()) << watch->error().message();
    return watch;
  }

  ApiServerOptions options_;
  std::unique_ptr<ApiServer> server_;
  std::unique_ptr<Client> client_;
};

// ---- TLS and auth

TEST_F(ApiServerSimTest, TlsVerifiesAgainstSimulatorCaOnly) {
  Connection good(server_->Port(), Tls());
  EXPECT_FALSE(good.Connect());
  Connection by_name(server_->Port(), TlsOptions{server_->CaPem(), "localhost", {}, {}});
  EXPECT_FALSE(by_name.Connect()) << "the server certificate carries DNS:localhost";

  ApiServer other;  // another simulator: another CA
  Connection wrong_ca(server_->Port(), TlsOptions{other.CaPem(), "127.0.0.1", {}, {}});
  auto ec = wrong_ca.Connect();
  ASSERT_TRUE(ec);
  EXPECT_NE(ec.message().find("certificate verify failed"), std::string::npos) << ec.message();
  Connection wrong_name(server_->Port(), TlsOptions{server_->CaPem(), "example.com", {}, {}});
  EXPECT_TRUE(wrong_name.Connect());
}

TEST_F(ApiServerSimTest, RequestsWithoutTheTokenGet401Status) {
  Client anonymous(server_->Port(), Tls());
  Response r = anonymous.Do("GET", kPods);
  EXPECT_EQ(r.status, 401);
  Json status = r.json();
  EXPECT_EQ(status["kind"], "Status");
  EXPECT_EQ(status["apiVersion"], "v1");
  EXPECT_EQ(status["status"], "Failure");
  EXPECT_EQ(status["reason"], "Unauthorized");
  EXPECT_EQ(status["code"], 401);
  EXPECT_EQ(anonymous.Do("GET", kPods, {}, "application/json", std::string("wrong")).status, 401);
  EXPECT_EQ(anonymous.Do("GET", "/healthz").status, 200) << "health is public";
  EXPECT_EQ(anonymous.Do("GET", "/healthz", {}, "", std::string("wrong")).status, 401)
      << "a bad token fails authentication even where anonymous would pass";
}

TEST_F(ApiServerSimTest, RejectTokenUntilRotatedThenNewTokenWorks) {
  const std::string old_token = server_->Token();
  EXPECT_EQ(Do("GET", kPods).status, 200);
  server_->RejectTokenUntilRotated();
  EXPECT_EQ(Do("GET", kPods).status, 401);
  EXPECT_EQ(Do("GET", kPods).status, 401);
  const std::string new_token = server_->RotateToken();
  EXPECT_NE(new_token, old_token);
  EXPECT_EQ(Do("GET", kPods).status, 401) << "the old token stops working at rotation";
  client_->set_token(new_token);
  EXPECT_EQ(Do("GET", kPods).status, 200);
}

TEST_F(ApiServerSimTest, ClientCertificateAuthenticates) {
  Connection conn(server_->Port(), TlsOptions{server_->CaPem(), "127.0.0.1", server_->ClientCertPem(),
                                              server_->ClientKeyPem()});
  ASSERT_FALSE(conn.Connect());
  Response r = conn.Request("GET", "/api/v1/nodes", "", "", std::nullopt);
  EXPECT_EQ(r.status, 200) << r.body;
}

// ---- CRUD and metadata

TEST_F(ApiServerSimTest, CrudSetsServerMetadata) {
  Json pod = Pod("web-1", {{"app", "web"}});
  pod["status"] = {{"phase", "Running"}};
  Json created = Ok("POST", kPods, pod, 201);
  const Json& meta = created["metadata"];
  EXPECT_TRUE(std::regex_match(meta["uid"].get<std::string>(),
                               std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")));
  EXPECT_EQ(meta["namespace"], "default");
  EXPECT_EQ(meta["generation"], 1);
  EXPECT_TRUE(std::regex_match(meta["creationTimestamp"].get<std::string>(),
                               std::regex("\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\dZ")));
  EXPECT_FALSE(created.contains("status")) << "create drops .status where a status subresource exists";
  EXPECT_EQ(created["kind"], "Pod");

  Json got = Ok("GET", std::string(kPods) + "/web-1");
  EXPECT_EQ(got, created);

  Json update = got;
  update["spec"]["nodeName"] = "node-a";
  Json updated = Ok("PUT", std::string(kPods) + "/web-1", update);
  EXPECT_EQ(updated["metadata"]["generation"], 2);
  EXPECT_GT(Rv(updated), Rv(created));
  EXPECT_EQ(updated["metadata"]["uid"], meta["uid"]);

  Json same = Ok("PUT", std::string(kPods) + "/web-1", updated);
  EXPECT_EQ(Rv(same), Rv(updated)) << "an update that changes nothing is a no-op";

  Response again = Do("POST", kPods, pod.dump());
  EXPECT_EQ(again.status, 409);
  EXPECT_EQ(again.json()["reason"], "AlreadyExists");

  Json generated = Pod("");
  generated["metadata"] = {{"generateName", "gen-"}};
  Json g = Ok("POST", kPods, generated, 201);
  EXPECT_TRUE(std::regex_match(g["metadata"]["name"].get<std::string>(), std::regex("gen-[a-z0-9]{5}")));

  Json deleted = Ok("DELETE", std::string(kPods) + "/web-1");
  EXPECT_EQ(deleted["status"], "Success");
  Response missing = Do("GET", std::string(kPods) + "/web-1");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.json()["reason"], "NotFound");
  EXPECT_EQ(missing.json()["message"], "pods \"web-1\" not found");
  EXPECT_EQ(Do("DELETE", std::string(kPods) + "/web-1").status, 404);
}

TEST_F(ApiServerSimTest, ErrorsUseStatusObjectsAndCodes) {
  auto reason = [](const Response& r) { return r.json().value("reason", std::string()); };
  Response r = Do("POST", kPods, Pod("Bad_Name").dump());
  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(reason(r), "Invalid");
  r = Do("POST", kPods, Object("v1", "Pod", "").dump());
  EXPECT_EQ(r.status, 422) << "no name and no generateName";
  r = Do("POST", kPods, "{not json");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(reason(r), "BadRequest");
  r = Do("POST", kPods, "[1,2]");
  EXPECT_EQ(r.status, 400);
  r = Do("POST", kPods, Object("apps/v1", "Pod", "x").dump());
  EXPECT_EQ(r.status, 400) << "apiVersion must match the URL";
  r = Do("POST", kPods, R"({"metadata":{"name":"x","labels":{"a":1}}})");
  EXPECT_EQ(r.status, 400) << "label values are strings";
  r = Do("POST", kPods, Pod("x").dump(), "application/vnd.kubernetes.protobuf");
  EXPECT_EQ(r.status, 415);
  r = Do("PUT", kPods, Pod("x").dump());
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(reason(r), "MethodNotAllowed");
  r = Do("POST", std::string(kPods) + "/x", Pod("x").dump());
  EXPECT_EQ(r.status, 405);
  r = Do("GET", "/no/such/path");
  EXPECT_EQ(r.status, 404);
  r = Do("GET", std::string(kPods) + "/x/exec");
  EXPECT_EQ(r.status, 404);
  r = Do("GET", "/api/v1/namespaces/default/nodes");
  EXPECT_EQ(r.status, 404) << "nodes are cluster-scoped";
  Ok("POST", kPods, Pod("x"), 201);
  Json renamed = Pod("y");
  r = Do("PUT", std::string(kPods) + "/x", renamed.dump());
  EXPECT_EQ(r.status, 400) << "name in the body must match the URL";
  r = Do("GET", std::string(kPods) + "?watch=maybe");
  EXPECT_EQ(r.status, 400);
  r = Do("GET", std::string(kPods) + "?labelSelector=" + Escape("a in b"));
  EXPECT_EQ(r.status, 400);
  r = Do("PATCH", std::string(kPods) + "/x", "{}", "text/plain");
  EXPECT_EQ(r.status, 415);
  EXPECT_EQ(reason(r), "UnsupportedMediaType");
  r = Do("GET", std::string(kPods) + "?dryRun=All");
  EXPECT_EQ(r.status, 400);
}

TEST_F(ApiServerSimTest, ResourceVersionIsOneGlobalIncreasingCounter) {
  std::vector<std::uint64_t> rvs;
  for (int i = 0; i < 5; ++i) {
    rvs.push_back(Rv(Ok("POST", kConfigMaps, ConfigMap("cm-" + std::to_string(i)), 201)));
    rvs.push_back(Rv(Ok("POST", kSlices, Slice("s-" + std::to_string(i), "n1", "gpu.nvidia.com"), 201)));
  }
  rvs.push_back(Rv(Ok("PATCH", std::string(kConfigMaps) + "/cm-0", Json{{"data", {{"a", "b"}}}}, 200,
                      "application/merge-patch+json")));
  for (std::size_t i = 1; i < rvs.size(); ++i) EXPECT_GT(rvs[i], rvs[i - 1]);
  Json list = Ok("GET", kConfigMaps);
  EXPECT_EQ(std::stoull(list["metadata"]["resourceVersion"].get<std::string>()), rvs.back());
  EXPECT_EQ(server_->ResourceVersion(), std::to_string(rvs.back()));
  EXPECT_EQ(list["kind"], "ConfigMapList");
  EXPECT_FALSE(list["items"][0].contains("kind")) << "built-in list items carry no kind";
}

TEST_F(ApiServerSimTest, StaleUpdateGets409Conflict) {
  Json created = Ok("POST", kConfigMaps, ConfigMap("c", {{"k", "1"}}), 201);
  Json first = created;
  first["data"]["k"] = "2";
  Ok("PUT", std::string(kConfigMaps) + "/c", first);
  Json stale = created;
  stale["data"]["k"] = "3";
  Response r = Do("PUT", std::string(kConfigMaps) + "/c", stale.dump());
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(r.json()["reason"], "Conflict");
  EXPECT_NE(r.json()["message"].get<std::string>().find("the object has been modified"), std::string::npos);
  Json unconditional = stale;
  unconditional["metadata"].erase("resourceVersion");
  EXPECT_EQ(Ok("PUT", std::string(kConfigMaps) + "/c", unconditional)["data"]["k"], "3");
}

TEST_F(ApiServerSimTest, PagingIsConsistentAcrossPages) {
  for (int i = 0; i < 7; ++i) Ok("POST", kConfigMaps, ConfigMap("cm-" + std::to_string(i), {{"v", "old"}}), 201);
  Json page1 = Ok("GET", std::string(kConfigMaps) + "?limit=3");
  ASSERT_EQ(page1["items"].size(), 3u);
  const std::string rv = page1["metadata"]["resourceVersion"];
  const std::string token = page1["metadata"]["continue"];
  EXPECT_EQ(page1["metadata"]["remainingItemCount"], 4);

  // Changes after the first page must not show up in later pages.
  Ok("POST", kConfigMaps, ConfigMap("cm-7"), 201);
  Ok("PATCH", std::string(kConfigMaps) + "/cm-4", Json{{"data", {{"v", "new"}}}}, 200, "application/merge-patch+json");
  Ok("DELETE", std::string(kConfigMaps) + "/cm-5");

  Json page2 = Ok("GET", std::string(kConfigMaps) + "?limit=3&continue=" + Escape(token));
  EXPECT_EQ(page2["metadata"]["resourceVersion"], rv);
  EXPECT_EQ(Names(page2), (std::set<std::string>{"cm-3", "cm-4", "cm-5"}));
  for (const auto& item : page2["items"]) EXPECT_EQ(item["data"]["v"], "old");
  Json page3 = Ok("GET", std::string(kConfigMaps) + "?limit=3&continue=" +
                             Escape(page2["metadata"]["continue"].get<std::string>()));
  EXPECT_EQ(Names(page3), (std::set<std::string>{"cm-6"}));
  EXPECT_FALSE(page3["metadata"].contains("continue"));

  EXPECT_EQ(Do("GET", std::string(kConfigMaps) + "?continue=garbage").status, 400);
  server_->Compact();
  Response expired = Do("GET", std::string(kConfigMaps) + "?limit=3&continue=" + Escape(token));
  EXPECT_EQ(expired.status, 410);
  EXPECT_EQ(expired.json()["reason"], "Expired");
}

TEST_F(ApiServerSimTest, ListResourceVersionSemantics) {
  Json a = Ok("POST", kConfigMaps, ConfigMap("a"), 201);
  Ok("POST", kConfigMaps, ConfigMap("b"), 201);
  Json exact = Ok("GET", std::string(kConfigMaps) + "?resourceVersion=" + std::to_string(Rv(a)) +
                             "&resourceVersionMatch=Exact");
  EXPECT_EQ(Names(exact), (std::set<std::string>{"a"}));
  EXPECT_EQ(exact["metadata"]["resourceVersion"], std::to_string(Rv(a)));
  Json any = Ok("GET", std::string(kConfigMaps) + "?resourceVersion=0");
  EXPECT_EQ(Names(any).size(), 2u);
  Json newer = Ok("GET", std::string(kConfigMaps) + "?resourceVersion=" + std::to_string(Rv(a)) +
                             "&resourceVersionMatch=NotOlderThan");
  EXPECT_EQ(Names(newer).size(), 2u);
  EXPECT_EQ(Do("GET", std::string(kConfigMaps) + "?resourceVersion=999999999").status, 504);
  EXPECT_EQ(Do("GET", std::string(kConfigMaps) + "?resourceVersionMatch=Exact").status, 400);
}

// ---- watch

TEST_F(ApiServerSimTest, WatchDeliversEventsBookmarksAndEndsAtTimeout) {
  Json list = Ok("GET", kPods);
  const std::string rv = list["metadata"]["resourceVersion"];
  auto watch = Watch(std::string(kPods) + "?watch=1&resourceVersion=" + rv +
                     "&allowWatchBookmarks=true&timeoutSeconds=2");
  ASSERT_EQ(watch->status(), 200);

  Json created = Ok("POST", kPods, Pod("w", {{"app", "a"}}), 201);
  auto added = watch->NextChange();
  ASSERT_TRUE(added);
  EXPECT_EQ((*added)["type"], "ADDED");
  EXPECT_EQ((*added)["object"]["kind"], "Pod");
  EXPECT_EQ((*added)["object"]["metadata"]["name"], "w");
  EXPECT_EQ((*added)["object"]["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"]);

  Ok("PATCH", std::string(kPods) + "/w", Json{{"metadata", {{"labels", {{"app", "b"}}}}}}, 200,
     "application/merge-patch+json");
  auto modified = watch->NextChange();
  ASSERT_TRUE(modified);
  EXPECT_EQ((*modified)["type"], "MODIFIED");
  EXPECT_EQ((*modified)["object"]["metadata"]["labels"]["app"], "b");

  Ok("DELETE", std::string(kPods) + "/w");
  auto deleted = watch->NextChange();
  ASSERT_TRUE(deleted);
  EXPECT_EQ((*deleted)["type"], "DELETED");
  const std::uint64_t delete_rv = Rv((*deleted)["object"]);
  EXPECT_GT(delete_rv, Rv((*modified)["object"]));

  std::optional<Json> bookmark;
  for (int i = 0; i < 50 && !bookmark; ++i) {
    auto event = watch->Next(1s);
    ASSERT_TRUE(event);
    if ((*event)["type"] == "BOOKMARK") bookmark = event;
  }
  ASSERT_TRUE(bookmark);
  const Json& object = (*bookmark)["object"];
  EXPECT_EQ(object["kind"], "Pod");
  EXPECT_EQ(object["apiVersion"], "v1");
  EXPECT_EQ(object["metadata"].size(), 1u) << object.dump();
  EXPECT_GE(Rv(object), delete_rv);

  // timeoutSeconds=2: the stream ends with the last chunk.
  auto deadline = Clock::now() + 5s;
  while (!watch->ended_cleanly() && !watch->broken() && Clock::now() < deadline) watch->Next(500ms);
  EXPECT_TRUE(watch->ended_cleanly()) << watch->error().message();
}

TEST_F(ApiServerSimTest, WatchWithoutResourceVersionStartsWithState) {
  Ok("POST", kConfigMaps, ConfigMap("one"), 201);
  Json two = Ok("POST", kConfigMaps, ConfigMap("two"), 201);
  auto watch = Watch(std::string(kConfigMaps) + "?watch=true");
  std::set<std::string> names;
  for (int i = 0; i < 2; ++i) {
    auto event = watch->Next();
    ASSERT_TRUE(event);
    EXPECT_EQ((*event)["type"], "ADDED");
    names.insert((*event)["object"]["metadata"]["name"].get<std::string>());
  }
  EXPECT_EQ(names, (std::set<std::string>{"one", "two"}));

  // From a resourceVersion: only what came after it.
  Json three = Ok("POST", kConfigMaps, ConfigMap("three"), 201);
  auto from_rv = Watch(std::string(kConfigMaps) + "?watch=1&resourceVersion=" + std::to_string(Rv(two)));
  auto event = from_rv->Next();
  ASSERT_TRUE(event);
  EXPECT_EQ((*event)["object"]["metadata"]["name"], "three");
  EXPECT_FALSE(from_rv->Next(300ms));
}

TEST_F(ApiServerSimTest, SendInitialEventsEndsWithAnnotatedBookmark) {
  Ok("POST", kConfigMaps, ConfigMap("one"), 201);
  auto watch = Watch(std::string(kConfigMaps) +
                     "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=&allowWatchBookmarks=true");
  auto added = watch->Next();
  ASSERT_TRUE(added);
  EXPECT_EQ((*added)["type"], "ADDED");
  auto bookmark = watch->Next();
  ASSERT_TRUE(bookmark);
  EXPECT_EQ((*bookmark)["type"], "BOOKMARK");
  EXPECT_EQ((*bookmark)["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
}

// ---- selectors

TEST_F(ApiServerSimTest, LabelSelectorsOnList) {
  Ok("POST", kPods, Pod("p1", {{"app", "web"}, {"tier", "fe"}, {"gen", "3"}}), 201);
  Ok("POST", kPods, Pod("p2", {{"app", "web"}, {"tier", "be"}}), 201);
  Ok("POST", kPods, Pod("p3", {{"app", "db"}}), 201);
  Ok("POST", kPods, Pod("p4"), 201);
  auto select = [&](const std::string& selector) {
    return Names(Ok("GET", std::string(kPods) + "?labelSelector=" + Escape(selector)));
  };
  using Set = std::set<std::string>;
  EXPECT_EQ(select("app=web"), (Set{"p1", "p2"}));
  EXPECT_EQ(select("app==web"), (Set{"p1", "p2"}));
  EXPECT_EQ(select("app!=web"), (Set{"p3", "p4"}));
  EXPECT_EQ(select("app in (web, db)"), (Set{"p1", "p2", "p3"}));
  EXPECT_EQ(select("app notin (web)"), (Set{"p3", "p4"}));
  EXPECT_EQ(select("tier"), (Set{"p1", "p2"}));
  EXPECT_EQ(select("!tier"), (Set{"p3", "p4"}));
  EXPECT_EQ(select("app=web,tier=fe"), (Set{"p1"}));
  EXPECT_EQ(select(""), (Set{"p1", "p2", "p3", "p4"}));
  EXPECT_EQ(select("gen>2"), (Set{"p1"}));
  EXPECT_EQ(select("gen<3"), (Set{}));
  EXPECT_EQ(Do("GET", std::string(kPods) + "?labelSelector=" + Escape("app=(")).status, 400);
}

TEST_F(ApiServerSimTest, FieldSelectorsOnList) {
  Ok("POST", kSlices, Slice("rs1", "n1", "gpu.nvidia.com"), 201);
  Ok("POST", kSlices, Slice("rs2", "n2", "gpu.nvidia.com"), 201);
  Ok("POST", kSlices, Slice("rs3", "n1", "other.example.com"), 201);
  auto select = [&](const std::string& selector) {
    return Names(Ok("GET", std::string(kSlices) + "?fieldSelector=" + Escape(selector)));
  };
  using Set = std::set<std::string>;
  EXPECT_EQ(select("spec.nodeName=n1"), (Set{"rs1", "rs3"}));
  EXPECT_EQ(select("spec.driver==gpu.nvidia.com,spec.nodeName=n1"), (Set{"rs1"}));
  EXPECT_EQ(select("spec.nodeName!=n1"), (Set{"rs2"}));
  EXPECT_EQ(select("metadata.name=rs2"), (Set{"rs2"}));
  Response r = Do("GET", std::string(kSlices) + "?fieldSelector=" + Escape("spec.foo=bar"));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("field label not supported: spec.foo"), std::string::npos);

  Ok("POST", kPods, Pod("on-a", {}, "node-a"), 201);
  Ok("POST", kPods, Pod("on-b", {}, "node-b"), 201);
  Ok("POST", "/api/v1/namespaces/other/pods", Pod("elsewhere", {}, "node-a"), 201);
  EXPECT_EQ(Names(Ok("GET", "/api/v1/pods?fieldSelector=" + Escape("spec.nodeName=node-a"))),
            (Set{"on-a", "elsewhere"}));
  EXPECT_EQ(Names(Ok("GET", "/api/v1/pods?fieldSelector=" + Escape("metadata.namespace=other"))),
            (Set{"elsewhere"}));
  EXPECT_EQ(Names(Ok("GET", std::string(kPods) + "?fieldSelector=" + Escape("spec.nodeName=node-a"))),
            (Set{"on-a"}));
}

TEST_F(ApiServerSimTest, WatchSelectorTransitionsAreAddedAndDeleted) {
  auto watch = Watch(std::string(kPods) + "?watch=1&labelSelector=" + Escape("app=web"));
  Ok("POST", kPods, Pod("p", {{"app", "web"}}), 201);
  auto added = watch->Next();
  ASSERT_TRUE(added);
  EXPECT_EQ((*added)["type"], "ADDED");

  Json moved = Ok("PATCH", std::string(kPods) + "/p", Json{{"metadata", {{"labels", {{"app", "db"}}}}}}, 200,
                  "application/merge-patch+json");
  auto gone = watch->Next();
  ASSERT_TRUE(gone);
  EXPECT_EQ((*gone)["type"], "DELETED");
  EXPECT_EQ((*gone)["object"]["metadata"]["labels"]["app"], "web") << "the last matching state";
  EXPECT_EQ((*gone)["object"]["metadata"]["resourceVersion"], moved["metadata"]["resourceVersion"]);

  Ok("POST", kPods, Pod("q", {{"app", "db"}}), 201);
  EXPECT_FALSE(watch->Next(300ms)) << "non-matching objects are not sent";
  Ok("PATCH", std::string(kPods) + "/p", Json{{"metadata", {{"labels", {{"app", "web"}}}}}}, 200,
     "application/merge-patch+json");
  auto back = watch->Next();
  ASSERT_TRUE(back);
  EXPECT_EQ((*back)["type"], "ADDED");
  EXPECT_EQ((*back)["object"]["metadata"]["name"], "p");

  auto slices = Watch(std::string(kSlices) + "?watch=1&fieldSelector=" + Escape("spec.nodeName=n1"));
  Ok("POST", kSlices, Slice("elsewhere", "n2", "gpu.nvidia.com"), 201);
  Ok("POST", kSlices, Slice("mine", "n1", "gpu.nvidia.com"), 201);
  auto mine = slices->Next();
  ASSERT_TRUE(mine);
  EXPECT_EQ((*mine)["object"]["metadata"]["name"], "mine");
}

// ---- finalizers, status, patches

TEST_F(ApiServerSimTest, FinalizersKeepTheObjectUntilEmptied) {
  Json cm = ConfigMap("held");
  cm["metadata"]["finalizers"] = {"example.com/keep"};
  Json created = Ok("POST", kConfigMaps, cm, 201);
  auto watch = Watch(std::string(kConfigMaps) + "?watch=1&resourceVersion=" + std::to_string(Rv(created)));

  Json deleting = Ok("DELETE", std::string(kConfigMaps) + "/held");
  EXPECT_TRUE(deleting["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(deleting["metadata"]["generation"], 2);
  Json still = Ok("GET", std::string(kConfigMaps) + "/held");
  EXPECT_TRUE(still["metadata"].contains("deletionTimestamp"));
  auto modified = watch->Next();
  ASSERT_TRUE(modified);
  EXPECT_EQ((*modified)["type"], "MODIFIED");

  Json more = still;
  more["metadata"]["finalizers"].push_back("example.com/another");
  EXPECT_EQ(Do("PUT", std::string(kConfigMaps) + "/held", more.dump()).status, 422);

  Ok("PATCH", std::string(kConfigMaps) + "/held", Json{{"metadata", {{"finalizers", nullptr}}}}, 200,
     "application/merge-patch+json");
  EXPECT_EQ(Do("GET", std::string(kConfigMaps) + "/held").status, 404);
  auto deleted = watch->Next();
  ASSERT_TRUE(deleted);
  EXPECT_EQ((*deleted)["type"], "DELETED");
}

TEST_F(ApiServerSimTest, DeletePreconditions) {
  Json created = Ok("POST", kConfigMaps, ConfigMap("c"), 201);
  Json wrong_uid = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}, {"preconditions", {{"uid", "nope"}}}};
  Response r = Do("DELETE", std::string(kConfigMaps) + "/c", wrong_uid.dump());
  EXPECT_EQ(r.status, 409);
  EXPECT_NE(r.body.find("Precondition failed: UID in precondition"), std::string::npos);
  Json wrong_rv = {{"preconditions", {{"resourceVersion", "1"}}}};
  EXPECT_EQ(Do("DELETE", std::string(kConfigMaps) + "/c", wrong_rv.dump()).status, 409);
  Json right = {{"preconditions", {{"uid", created["metadata"]["uid"]}, {"resourceVersion", created["metadata"]["resourceVersion"]}}}};
  EXPECT_EQ(Do("DELETE", std::string(kConfigMaps) + "/c", right.dump()).status, 200);
}

TEST_F(ApiServerSimTest, StatusSubresourceSeparatesSpecAndStatus) {
  Json claim = Object("resource.k8s.io/v1", "ResourceClaim", "claim");
  claim["spec"] = {{"devices", {{"requests", Json::array({Json{{"name", "gpu"}}})}}}};
  claim["status"] = {{"ignored", true}};
  Json created = Ok("POST", kClaims, claim, 201);
  EXPECT_FALSE(created.contains("status"));

  Json status_write = created;
  status_write["status"] = {{"allocation", {{"devices", {{"results", Json::array()}}}}}};
  status_write["spec"]["devices"]["requests"][0]["name"] = "changed";
  Json after_status = Ok("PUT", std::string(kClaims) + "/claim/status", status_write);
  EXPECT_TRUE(after_status["status"].contains("allocation"));
  EXPECT_EQ(after_status["spec"]["devices"]["requests"][0]["name"], "gpu") << "/status ignores spec";
  EXPECT_EQ(after_status["metadata"]["generation"], 1);

  Json main_write = after_status;
  main_write["spec"]["devices"]["requests"][0]["name"] = "gpu2";
  main_write["status"] = Json::object();
  Json after_main = Ok("PUT", std::string(kClaims) + "/claim", main_write);
  EXPECT_EQ(after_main["spec"]["devices"]["requests"][0]["name"], "gpu2");
  EXPECT_TRUE(after_main["status"].contains("allocation")) << "the main resource keeps .status";
  EXPECT_EQ(after_main["metadata"]["generation"], 2);

  Json patched = Ok("PATCH", std::string(kClaims) + "/claim/status", Json{{"status", {{"reservedFor", Json::array()}}}},
                    200, "application/merge-patch+json");
  EXPECT_TRUE(patched["status"].contains("reservedFor"));
  EXPECT_EQ(patched["metadata"]["generation"], 2);

  // A resource configured without a status subresource takes .status on the main resource.
  Json gadget = Object("example.com/v1", "Gadget", "g");
  gadget["status"] = {{"ready", true}};
  EXPECT_EQ(Ok("POST", "/apis/example.com/v1/gadgets", gadget, 201)["status"]["ready"], true);
}

TEST_F(ApiServerSimTest, MergeAndJsonPatch) {
  Ok("POST", kConfigMaps, ConfigMap("p", {{"a", "1"}, {"b", "2"}}), 201);
  Json merged = Ok("PATCH", std::string(kConfigMaps) + "/p", Json{{"data", {{"a", nullptr}, {"c", "3"}}}}, 200,
                   "application/merge-patch+json");
  EXPECT_EQ(merged["data"], (Json{{"b", "2"}, {"c", "3"}}));

  Json ops = Json::array({Json{{"op", "test"}, {"path", "/data/b"}, {"value", "2"}},
                          Json{{"op", "replace"}, {"path", "/data/b"}, {"value", "22"}},
                          Json{{"op", "add"}, {"path", "/data/d"}, {"value", "4"}},
                          Json{{"op", "remove"}, {"path", "/data/c"}}});
  Json patched = Ok("PATCH", std::string(kConfigMaps) + "/p", ops, 200, "application/json-patch+json");
  EXPECT_EQ(patched["data"], (Json{{"b", "22"}, {"d", "4"}}));

  Json failing = Json::array({Json{{"op", "test"}, {"path", "/data/b"}, {"value", "nope"}}});
  EXPECT_EQ(Do("PATCH", std::string(kConfigMaps) + "/p", failing.dump(), "application/json-patch+json").status, 422);
  Json bad_op = Json::array({Json{{"op", "frobnicate"}, {"path", "/data/b"}}});
  EXPECT_EQ(Do("PATCH", std::string(kConfigMaps) + "/p", bad_op.dump(), "application/json-patch+json").status, 400);
  Json stale = {{"metadata", {{"resourceVersion", "1"}}}, {"data", {{"x", "y"}}}};
  EXPECT_EQ(Do("PATCH", std::string(kConfigMaps) + "/p", stale.dump(), "application/merge-patch+json").status, 409);
  EXPECT_EQ(Do("PATCH", std::string(kConfigMaps) + "/p", Json{{"data", {{"s", "1"}}}}.dump(),
               "application/strategic-merge-patch+json").status, 200)
      << "strategic merge is accepted for built-ins";
  EXPECT_EQ(Do("PATCH", std::string(kConfigMaps) + "/missing", "{}", "application/merge-patch+json").status, 404);
}

TEST_F(ApiServerSimTest, ServerSideApply) {
  const std::string url = std::string(kWidgets) + "/w";
  const std::string alpha = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  size: 3\n  color: red\n";
  EXPECT_EQ(Do("PATCH", url, alpha, "application/apply-patch+yaml").status, 422) << "fieldManager is required";
  Response created = Do("PATCH", url + "?fieldManager=alpha", alpha, "application/apply-patch+yaml");
  ASSERT_EQ(created.status, 201) << created.body;
  Json obj = created.json();
  EXPECT_EQ(obj["spec"]["size"], 3) << "plain YAML scalars are typed";
  ASSERT_EQ(obj["metadata"]["managedFields"].size(), 1u);
  EXPECT_EQ(obj["metadata"]["managedFields"][0]["manager"], "alpha");
  EXPECT_EQ(obj["metadata"]["managedFields"][0]["operation"], "Apply");
  EXPECT_TRUE(obj["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"].contains("f:size"));

  const std::string beta = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  size: 5\n";
  Response conflict = Do("PATCH", url + "?fieldManager=beta", beta, "application/apply-patch+yaml");
  EXPECT_EQ(conflict.status, 409);
  EXPECT_NE(conflict.body.find("conflict with \\\"alpha\\\""), std::string::npos) << conflict.body;
  const std::string beta_same = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  size: 3\n";
  EXPECT_EQ(Do("PATCH", url + "?fieldManager=beta", beta_same, "application/apply-patch+yaml").status, 200)
      << "applying the same value is shared ownership, not a conflict";
  Response forced = Do("PATCH", url + "?fieldManager=beta&force=true", beta, "application/apply-patch+yaml");
  ASSERT_EQ(forced.status, 200) << forced.body;
  EXPECT_EQ(forced.json()["spec"]["size"], 5);

  // alpha drops color from its configuration: the field goes away.
  const std::string alpha2 = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  size: 5\n";
  Response reapplied = Do("PATCH", url + "?fieldManager=alpha", alpha2, "application/apply-patch+yaml");
  ASSERT_EQ(reapplied.status, 200) << reapplied.body;
  EXPECT_FALSE(reapplied.json()["spec"].contains("color")) << reapplied.body;
  EXPECT_EQ(Do("PATCH", url + "?fieldManager=alpha", "a: [", "application/apply-patch+yaml").status, 400);
  Response json_apply = Do("PATCH", std::string(kWidgets) + "/j?fieldManager=alpha",
                           R"({"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"j"}})",
                           "application/apply-patch+yaml");
  EXPECT_EQ(json_apply.status, 201) << "JSON is valid YAML";
  EXPECT_EQ(Do("PATCH", url, "{}", "application/strategic-merge-patch+json").status, 415)
      << "no strategic merge for custom resources";
}

// A CRD that declares status.nodes a list-map keyed by name (as upstream's ComputeDomain):
// each manager owns its own items; others' items stay; an item a manager stops applying goes
// when nobody else owns anything in it. Without the declaration the list is atomic.
TEST_F(ApiServerSimTest, ServerSideApplyOwnsListMapItemsByKey) {
  Json crd = {{"apiVersion", "apiextensions.k8s.io/v1"},
              {"kind", "CustomResourceDefinition"},
              {"metadata", {{"name", "widgets.example.com"}}},
              {"spec",
               {{"group", "example.com"},
                {"names", {{"plural", "widgets"}, {"kind", "Widget"}}},
                {"scope", "Namespaced"},
                {"versions",
                 Json::array({{{"name", "v1"},
                               {"served", true},
                               {"storage", true},
                               {"schema",
                                {{"openAPIV3Schema",
                                  {{"type", "object"},
                                   {"properties",
                                    {{"status",
                                      {{"type", "object"},
                                       {"properties",
                                        {{"nodes",
                                          {{"type", "array"},
                                           {"x-kubernetes-list-type", "map"},
                                           {"x-kubernetes-list-map-keys", Json::array({"name"})},
                                           {"items", {{"type", "object"}}}}}}}}}}}}}}}}})}}}};
  Ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd, 201);
  Ok("POST", kWidgets, Json{{"apiVersion", "example.com/v1"}, {"kind", "Widget"}, {"metadata", {{"name", "w"}}}}, 201);
  const std::string status = std::string(kWidgets) + "/w/status";
  const auto apply = [&](const std::string& manager, const Json& nodes) {
    Json body = {{"apiVersion", "example.com/v1"}, {"kind", "Widget"}, {"metadata", {{"name", "w"}}}};
    if (!nodes.is_null()) body["status"]["nodes"] = nodes;
    return Do("PATCH", status + "?fieldManager=" + manager, body.dump(), "application/apply-patch+yaml");
  };
  const auto names = [](const Json& obj) {
    std::vector<std::string> out;
    for (const auto& n : obj["status"]["nodes"]) out.push_back(n["name"]);
    return out;
  };
  server_->ResetRequestCounts();

  Response a = apply("node-a", Json::array({{{"name", "a"}, {"ip", "10.0.0.1"}}}));
  ASSERT_EQ(a.status, 200) << a.body;
  Response b = apply("node-b", Json::array({{{"name", "b"}, {"ip", "10.0.0.2"}}}));
  ASSERT_EQ(b.status, 200) << b.body << " (another manager's item is no conflict)";
  EXPECT_EQ(names(b.json()), (std::vector<std::string>{"a", "b"})) << "new items are appended";
  bool found = false;
  const Json b_obj = b.json();
  for (const auto& entry : b_obj["metadata"]["managedFields"]) {
    if (entry["manager"] != "node-b") continue;
    found = true;
    EXPECT_EQ(entry["subresource"], "status");
    const Json& item = entry["fieldsV1"]["f:status"]["f:nodes"][R"(k:{"name":"b"})"];
    EXPECT_TRUE(item.contains(".") && item.contains("f:ip") && item.contains("f:name")) << entry.dump();
  }
  EXPECT_TRUE(found);

  // node-a changes its item: node-b's stays as it was, the order too.
  Response a2 = apply("node-a", Json::array({{{"name", "a"}, {"ip", "10.0.0.9"}, {"ready", true}}}));
  ASSERT_EQ(a2.status, 200) << a2.body;
  EXPECT_EQ(names(a2.json()), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(a2.json()["status"]["nodes"][0], (Json{{"name", "a"}, {"ip", "10.0.0.9"}, {"ready", true}}));
  EXPECT_EQ(a2.json()["status"]["nodes"][1], (Json{{"name", "b"}, {"ip", "10.0.0.2"}}));
  // Dropping a field of its own item removes just that field.
  Response a3 = apply("node-a", Json::array({{{"name", "a"}, {"ip", "10.0.0.9"}}}));
  ASSERT_EQ(a3.status, 200) << a3.body;
  EXPECT_EQ(a3.json()["status"]["nodes"][0], (Json{{"name", "a"}, {"ip", "10.0.0.9"}}));

  // Another manager writing a field of node-a's item to another value: a conflict.
  Response steal = apply("node-b", Json::array({{{"name", "b"}, {"ip", "10.0.0.2"}}, {{"name", "a"}, {"ip", "1.1.1.1"}}}));
  EXPECT_EQ(steal.status, 409) << steal.body;
  EXPECT_NE(steal.body.find(R"(.status.nodes[name=\"a\"].ip)"), std::string::npos) << steal.body;

  // node-a applies with its item absent (no status at all): the item goes, node-b's stays.
  Response gone = apply("node-a", nullptr);
  ASSERT_EQ(gone.status, 200) << gone.body;
  EXPECT_EQ(names(gone.json()), (std::vector<std::string>{"b"}));
  const Json gone_obj = gone.json();
  for (const auto& entry : gone_obj["metadata"]["managedFields"]) EXPECT_NE(entry["manager"], "node-a");
  // node-b's last item goes: an empty list stays.
  Response empty = apply("node-b", Json::array());
  ASSERT_EQ(empty.status, 200) << empty.body;
  EXPECT_EQ(empty.json()["status"]["nodes"], Json::array());

  // An item both managers applied stays until the last of them drops it.
  ASSERT_EQ(apply("node-a", Json::array({{{"name", "s"}, {"ip", "1"}}})).status, 200);
  ASSERT_EQ(apply("node-b", Json::array({{{"name", "s"}, {"ip", "1"}}})).status, 200);
  EXPECT_EQ(names(apply("node-a", nullptr).json()), (std::vector<std::string>{"s"}));
  EXPECT_EQ(apply("node-b", nullptr).json()["status"]["nodes"], Json::array());

  // Items without their key, or twice: 422, nothing written.
  Response keyless = apply("node-c", Json::array({{{"ip", "3"}}}));
  EXPECT_EQ(keyless.status, 422) << keyless.body;
  EXPECT_NE(keyless.body.find(".status.nodes[0].name"), std::string::npos) << keyless.body;
  EXPECT_EQ(apply("node-c", Json::array({{{"name", "c"}}, {{"name", "c"}}})).status, 422);
  const auto codes = server_->ResponseCounts();
  EXPECT_EQ(codes.at(409), 1u);
  EXPECT_EQ(codes.at(422), 2u);

  // A kind without the declaration: the list is one atomic field, so a second writer conflicts.
  const std::string gadgets = "/apis/example.com/v1/namespaces/default/gadgets";
  Ok("POST", gadgets, Json{{"apiVersion", "example.com/v1"}, {"kind", "Gadget"}, {"metadata", {{"name", "g"}}}}, 201);
  const auto apply_gadget = [&](const std::string& manager, const std::string& name) {
    Json body = {{"apiVersion", "example.com/v1"},
                 {"kind", "Gadget"},
                 {"metadata", {{"name", "g"}}},
                 {"status", {{"nodes", Json::array({{{"name", name}}})}}}};
    return Do("PATCH", gadgets + "/g/status?fieldManager=" + manager, body.dump(), "application/apply-patch+yaml");
  };
  EXPECT_EQ(apply_gadget("node-a", "a").status, 200);
  EXPECT_EQ(apply_gadget("node-b", "b").status, 409);
}

// ---- 410

TEST_F(ApiServerSimTest, CompactExpiresResourceVersionsBothWays) {
  Json first = Ok("POST", kConfigMaps, ConfigMap("a"), 201);
  const std::string old_rv = std::to_string(Rv(first));
  Ok("POST", kConfigMaps, ConfigMap("b"), 201);
  server_->Compact();

  auto watch = Watch(std::string(kConfigMaps) + "?watch=1&resourceVersion=" + old_rv);
  ASSERT_EQ(watch->status(), 200);
  auto error = watch->Next();
  ASSERT_TRUE(error);
  EXPECT_EQ((*error)["type"], "ERROR");
  EXPECT_EQ((*error)["object"]["kind"], "Status");
  EXPECT_EQ((*error)["object"]["code"], 410);
  EXPECT_EQ((*error)["object"]["reason"], "Expired");
  EXPECT_NE((*error)["object"]["message"].get<std::string>().find("too old resource version"), std::string::npos);
  EXPECT_FALSE(watch->Next(2s));
  EXPECT_TRUE(watch->ended_cleanly());

  Response list = Do("GET", std::string(kConfigMaps) + "?resourceVersion=" + old_rv + "&resourceVersionMatch=Exact");
  EXPECT_EQ(list.status, 410);
  EXPECT_EQ(list.json()["reason"], "Expired");
  EXPECT_EQ(Do("GET", std::string(kConfigMaps) + "?resourceVersion=" + server_->ResourceVersion() +
                "&resourceVersionMatch=Exact").status, 200);

  server_->SetExpiredWatchMode(gns::sim::ExpiredWatchMode::kHttpStatus);
  auto http_410 = Watch(std::string(kConfigMaps) + "?watch=1&resourceVersion=" + old_rv);
  EXPECT_EQ(http_410->status(), 410);
  EXPECT_EQ(Json::parse(http_410->body())["reason"], "Expired");
}

// ---- faults

TEST_F(ApiServerSimTest, ExpireWatchesSendsInStream410) {
  auto watch = Watch(std::string(kConfigMaps) + "?watch=1&resourceVersion=" + server_->ResourceVersion());
  EXPECT_FALSE(watch->Next(200ms));
  server_->ExpireWatches();
  auto error = watch->Next();
  ASSERT_TRUE(error);
  EXPECT_EQ((*error)["type"], "ERROR");
  EXPECT_EQ((*error)["object"]["code"], 410);
}

TEST_F(ApiServerSimTest, CutWatchesClosesStreamsAbruptly) {
  auto watch = Watch(std::string(kConfigMaps) + "?watch=1");
  EXPECT_FALSE(watch->Next(200ms));
  EXPECT_EQ(server_->OpenWatches().size(), 1u);
  server_->CutWatches();
  EXPECT_FALSE(watch->Next(3s));
  EXPECT_TRUE(watch->broken()) << "no last chunk: the body is truncated";
  EXPECT_FALSE(watch->ended_cleanly());
  auto deadline = Clock::now() + 3s;
  while (!server_->OpenWatches().empty() && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(server_->OpenWatches().empty());
}

TEST_F(ApiServerSimTest, SplitNextWatchEventSpansTwoChunks) {
  auto watch = Watch(std::string(kConfigMaps) + "?watch=1");
  server_->SplitNextWatchEvent();
  Ok("POST", kConfigMaps, ConfigMap("split"), 201);
  auto line = watch->NextLine();
  ASSERT_TRUE(line);
  EXPECT_GE(line->chunks, 2);
  Json event = Json::parse(line->text, nullptr, false);
  ASSERT_FALSE(event.is_discarded()) << line->text;
  EXPECT_EQ(event["object"]["metadata"]["name"], "split");
  Ok("POST", kConfigMaps, ConfigMap("whole"), 201);
  auto next = watch->NextLine();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->chunks, 1) << "the fault is one-shot";
}

TEST_F(ApiServerSimTest, MalformedNextWatchLine) {
  auto watch = Watch(std::string(kConfigMaps) + "?watch=1");
  server_->MalformedNextWatchLine();
  Ok("POST", kConfigMaps, ConfigMap("after"), 201);
  auto bad = watch->Next();
  ASSERT_TRUE(bad);
  EXPECT_TRUE(bad->contains("malformed")) << bad->dump();
  auto good = watch->Next();
  ASSERT_TRUE(good);
  EXPECT_EQ((*good)["object"]["metadata"]["name"], "after");
}

TEST_F(ApiServerSimTest, ResponseDelay) {
  server_->SetResponseDelay(300ms);
  auto start = Clock::now();
  EXPECT_EQ(Do("GET", kPods).status, 200);
  EXPECT_GE(Clock::now() - start, 300ms);
  server_->SetResponseDelay(0ms);
  start = Clock::now();
  EXPECT_EQ(Do("GET", kPods).status, 200);
  EXPECT_LT(Clock::now() - start, 300ms);
}

TEST_F(ApiServerSimTest, FailNextRequests) {
  server_->FailNextRequests(503);
  Response unavailable = Do("GET", kPods);
  EXPECT_EQ(unavailable.status, 503);
  EXPECT_EQ(unavailable.retry_after, "1");
  EXPECT_EQ(unavailable.json()["reason"], "ServiceUnavailable");
  EXPECT_EQ(Do("GET", kPods).status, 200);

  server_->FailNextRequests(500, 2, "/configmaps");
  EXPECT_EQ(Do("GET", kPods).status, 200);
  EXPECT_EQ(Do("GET", kConfigMaps).status, 500);
  EXPECT_EQ(Do("GET", kConfigMaps).status, 500);
  EXPECT_EQ(Do("GET", kConfigMaps).status, 200);

  server_->FailNextRequests(429, 1, "", 7);
  Response throttled = Do("GET", kPods);
  EXPECT_EQ(throttled.status, 429);
  EXPECT_EQ(throttled.retry_after, "7");
  EXPECT_EQ(throttled.json()["details"]["retryAfterSeconds"], 7);
  server_->FailNextRequests(500, 1, "", 0);
  EXPECT_EQ(Do("GET", kPods).retry_after, "");
  server_->FailNextRequests(503, 1, "", 0);
  EXPECT_EQ(Do("GET", kPods).retry_after, "");
  EXPECT_THROW(server_->FailNextRequests(503, 1, "", -2), std::invalid_argument);
}

TEST_F(ApiServerSimTest, RestartListenerRefusesThenAcceptsOnTheSamePort) {
  EXPECT_EQ(Do("GET", kPods).status, 200);
  const auto port = server_->Port();
  server_->RestartListener(std::chrono::seconds(30));
  // The kept-alive connection is cut and new connects are refused while it is down.
  bool refused = false;
  for (int i = 0; i < 200 && !refused; ++i) {
    Connection probe(port, Tls());
    refused = static_cast<bool>(probe.Connect());
    if (!refused) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the restart is posted
  }
  EXPECT_TRUE(refused);
  server_->RestartListener(std::chrono::milliseconds(0));  // back at once
  Response back;
  for (int i = 0; i < 200; ++i) {
    back = Do("GET", kPods);
    if (!back.error) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(back.status, 200) << back.error.message();
  EXPECT_EQ(server_->Port(), port);
}

TEST_F(ApiServerSimTest, AdminEndpoint) {
  Client anonymous(server_->Port(), Tls());
  EXPECT_EQ(anonymous.Do("POST", "/_sim/faults", R"({"cutWatches":true})").status, 401);

  Response armed = Do("POST", "/_sim/faults", R"({"failNext":{"code":500,"count":1}})");
  ASSERT_EQ(armed.status, 200) << armed.body;
  EXPECT_EQ(armed.json()["token"], server_->Token());
  EXPECT_EQ(Do("GET", kPods).status, 500);
  EXPECT_EQ(Do("GET", kPods).status, 200);
  EXPECT_EQ(Do("POST", "/_sim/faults", R"({"cutWatchez":true})").status, 400);

  server_->RejectTokenUntilRotated();
  EXPECT_EQ(Do("GET", kPods).status, 401);
  Response rotated = Do("POST", "/_sim/faults", R"({"rotateToken":true})");
  ASSERT_EQ(rotated.status, 200) << "admin requests still accept the current token";
  client_->set_token(rotated.json()["token"].get<std::string>());
  EXPECT_EQ(Do("GET", kPods).status, 200);

  auto watch = Watch(std::string(kConfigMaps) + "?watch=1&labelSelector=a%3Db");
  EXPECT_FALSE(watch->Next(100ms));
  Json stats = Ok("GET", "/_sim/stats");
  ASSERT_EQ(stats["openWatches"].size(), 1u);
  EXPECT_EQ(stats["openWatches"][0]["path"], kConfigMaps);
  EXPECT_EQ(stats["openWatches"][0]["labelSelector"], "a=b");
  EXPECT_GE(stats["requests"]["list"].get<int>(), 1);

  Response seeded = Do("POST", "/_sim/seed", "apiVersion: v1\nkind: Node\nmetadata:\n  name: seeded\n", "application/yaml");
  EXPECT_EQ(seeded.status, 200) << seeded.body;
  EXPECT_EQ(Do("GET", "/api/v1/nodes/seeded").status, 200);
}

// ---- observability

TEST_F(ApiServerSimTest, RequestCountersAndOpenWatches) {
  Ok("GET", kPods);
  Ok("POST", kPods, Pod("x"), 201);
  server_->ResetRequestCounts();
  auto watch = Watch(std::string(kPods) + "?watch=1&allowWatchBookmarks=true");
  ASSERT_TRUE(watch->Next());  // ADDED x
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(watch->Next());  // bookmarks only
  EXPECT_EQ(server_->RequestCounts(), (std::map<std::string, std::uint64_t>{{"watch", 1}}))
      << "nothing beyond the open watch";
  EXPECT_EQ(server_->TotalRequests(), 1u);
  auto watches = server_->OpenWatches();
  ASSERT_EQ(watches.size(), 1u);
  EXPECT_EQ(watches[0].path, kPods);
  EXPECT_TRUE(watches[0].bookmarks);
  EXPECT_GE(watches[0].lines_sent, 4u);

  Ok("GET", kPods);
  Ok("DELETE", std::string(kPods) + "/x");
  EXPECT_EQ(server_->RequestCount("list"), 1u);
  EXPECT_EQ(server_->RequestCount("delete"), 1u);

  // A client that goes away is noticed even while the watch is idle.
  auto idle = Watch(std::string(kConfigMaps) + "?watch=1");
  EXPECT_FALSE(idle->Next(100ms));
  EXPECT_EQ(server_->OpenWatches().size(), 2u);
  idle->Close();
  watch->Close();
  auto deadline = Clock::now() + 3s;
  while (!server_->OpenWatches().empty() && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(server_->OpenWatches().empty());
}

// ---- robustness

TEST_F(ApiServerSimTest, MalformedRequestGets400AndClose) {
  Connection conn(server_->Port(), Tls());
  ASSERT_FALSE(conn.Connect());
  ASSERT_FALSE(conn.WriteRaw("GARBAGE / NOT-HTTP\r\n\r\n"));
  Response r = conn.Read();
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(r.close);
  EXPECT_TRUE(conn.WaitClosed(3s));

  Connection deep(server_->Port(), Tls());
  ASSERT_FALSE(deep.Connect());
  Response nested = deep.Request("POST", kConfigMaps, std::string(5000, '[') + std::string(5000, ']'),
                                 "application/json", server_->Token());
  EXPECT_EQ(nested.status, 400);
  EXPECT_EQ(Do("GET", kPods).status, 200) << "the server is still fine";
}

TEST(ApiServerSimLimits, BodyLimitAndReadTimeout) {
  ApiServerOptions options;
  options.body_limit = 1024;
  options.idle_timeout = 300ms;
  ApiServer server(options);
  server.Start();
  TlsOptions tls{server.CaPem(), "127.0.0.1", {}, {}};

  Connection big(server.Port(), tls);
  ASSERT_FALSE(big.Connect());
  Response r = big.Request("POST", kConfigMaps, ConfigMap("big", {{"x", std::string(4096, 'x')}}).dump(),
                           "application/json", server.Token());
  EXPECT_EQ(r.status, 413) << r.error.message();

  Connection idle(server.Port(), tls);
  ASSERT_FALSE(idle.Connect());
  auto start = Clock::now();
  EXPECT_TRUE(idle.WaitClosed(5s));
  EXPECT_LT(Clock::now() - start, 3s);

  Connection partial(server.Port(), tls);
  ASSERT_FALSE(partial.Connect());
  ASSERT_FALSE(partial.WriteRaw("GET /api/v1/pods HTTP/1.1\r\nHost: x\r\n"));
  EXPECT_TRUE(partial.WaitClosed(5s));
}

// Random and mutated requests through the shared router: a 500 means a handler threw,
// which is a bug (client mistakes are 4xx).
TEST(ApiServerSimFuzz, RandomRequestsNeverFailInternally) {
  ApiServer server;
  // GNS_FUZZ_SEED / GNS_FUZZ_ITERATIONS widen a local run; the defaults keep ctest fast.
  const char* seed_env = std::getenv("GNS_FUZZ_SEED");
  const char* iterations_env = std::getenv("GNS_FUZZ_ITERATIONS");
  std::mt19937 rng(seed_env ? static_cast<unsigned>(std::stoul(seed_env)) : 20251121u);
  const int iterations = iterations_env ? std::stoi(iterations_env) : 4000;
  const std::string pods = kPods;
  const std::string cms = kConfigMaps;
  const std::string widgets = kWidgets;
  const std::vector<std::string> methods = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"};
  const std::vector<std::string> targets = {
      pods, pods + "/a", pods + "/a/status", pods + "/a/exec", "/api/v1/nodes/a", "/api/v1/nodes",
      widgets + "/w?fieldManager=m", widgets + "/w?fieldManager=n&force=true", widgets + "/w/status?fieldManager=m",
      widgets, cms + "?limit=1", cms + "?limit=-3", cms + "?limit=x", cms + "?labelSelector=a%3Db",
      cms + "?labelSelector=a%20in%20(", cms + "?fieldSelector=metadata.name%3Da", cms + "?continue=eyJ9",
      cms + "?continue=%00", cms + "?resourceVersion=1&resourceVersionMatch=Exact", cms + "?resourceVersion=abc",
      cms + "/a", "/apis", "/api", "/api/v1", "/apis/example.com/v1", "/apis/x", "/%zz", "/", "/version",
      "/api/v1/namespaces", "/api/v1/namespaces/default", "/api/v1/namespaces/default/status",
      "/_sim/faults", "/_sim/stats", "/_sim/seed", pods + "?watch=0", pods + "?dryRun=All"};
  const std::vector<std::string> types = {"application/json", "application/merge-patch+json",
                                          "application/json-patch+json", "application/apply-patch+yaml",
                                          "application/strategic-merge-patch+json", "application/yaml", "",
                                          "text/plain", "application/json; charset=utf-8"};
  Json pod = Pod("a", {{"app", "x"}});
  pod["metadata"]["finalizers"] = {"f/a"};
  std::vector<std::string> bodies = {
      pod.dump(), ConfigMap("a", {{"k", "v"}}).dump(), Object("v1", "Node", "a").dump(),
      "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\nspec: {a: {b: [1, 2]}, c: x}\n",
      "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\nstatus: {ok: true}\n",
      R"([{"op":"add","path":"/metadata/labels/b","value":"c"}])", R"([{"op":"remove","path":"/spec"}])",
      R"([{"op":"move","from":"/metadata","path":"/x"}])", R"([{"op":"copy","from":"/x","path":"/y"}])",
      R"([{"op":"test","path":"/metadata/name","value":"a"}])", R"({"metadata":{"finalizers":null}})",
      R"({"metadata":null})", R"({"apiVersion":null,"kind":5})", R"({"metadata":{"labels":{"a":null}}})",
      R"({"metadata":{"managedFields":[{"operation":5,"manager":{}},{"operation":"Apply","manager":"m","fieldsV1":7}]}})",
      R"({"metadata":{"managedFields":"x"}})", R"({"metadata":{"finalizers":[1]}})",
      R"({"preconditions":{"uid":5,"resourceVersion":[]}})", R"({"kind":"List","items":[1,{"kind":3}]})",
      R"({"failNext":{"code":"x"}})", R"({"delayMs":"slow"})", R"({"expiredWatchMode":3})",
      "null", "[]", "{}", "\"text\"", "42", "", "- a\n- b: [\n", "a: &x [*x]\n", "{\"a\":\"\xff\xfe\"}",
      "key: \"\\xff\"\n",
      // Inputs that make yaml-cpp's own LoadAll() loop forever.
      " ,", "- a\n,", "!a ,", "\"a\" ,"};
  auto mutate = [&](std::string text) {
    if (text.empty()) return text;
    switch (rng() % 4) {
      case 0: text.resize(rng() % text.size()); break;
      case 1: text[rng() % text.size()] = static_cast<char>(rng() % 256); break;
      case 2: text.insert(rng() % text.size(), std::string(1, "{}[]\":,-\n"[rng() % 9])); break;
      default: break;
    }
    return text;
  };
  for (int i = 0; i < iterations; ++i) {
    const std::string& method = methods[rng() % methods.size()];
    const std::string& target = targets[rng() % targets.size()];
    const std::string& type = types[rng() % types.size()];
    std::string body = mutate(bodies[rng() % bodies.size()]);
    if (target.starts_with("/_sim/faults") && body.find("rejectTokenUntilRotated") != std::string::npos) continue;
    auto response = server.Call(method, target, body, type);
    ASSERT_GE(response.status, 200);
    ASSERT_NE(response.status, 500) << method << " " << target << " [" << type << "] " << body << "\n-> "
                                    << response.body;
  }
  // An alias bomb ("billion laughs") is refused, not expanded.
  std::string bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n";
  for (char level = 'b'; level <= 'j'; ++level) {
    std::string previous(1, static_cast<char>(level - 1));
    bomb += std::string(1, level) + ": &" + level + " [";
    for (int i = 0; i < 9; ++i) bomb += (i ? ",*" : "*") + previous;
    bomb += "]\n";
  }
  auto start = Clock::now();
  EXPECT_EQ(server.Call("PATCH", widgets + "/bomb?fieldManager=m", bomb, "application/apply-patch+yaml").status, 400);
  EXPECT_LT(Clock::now() - start, 30s);
  // Still consistent afterwards: a list of every resource touched parses.
  EXPECT_EQ(server.Call("GET", kConfigMaps).status, 200);
  EXPECT_EQ(server.Call("GET", kPods).status, 200);
}

// ---- seeds, state dir, in-process use, the binary

using gns::test::TempDir;

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(ApiServerSimSeed, SeedFileYamlAndJson) {
  TempDir dir;
  std::ofstream(dir.Path() / "seed.yaml") << R"(apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {gpu: "true"}
status:
  capacity: {cpu: "8"}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: node-a, namespace: kube-node-lease}
spec: {holderIdentity: node-a, leaseDurationSeconds: 40}
---
- apiVersion: example.com/v1
  kind: Widget
  _resource: /apis/example.com/v1/namespaces/ns1/widgets
  metadata: {name: w}
- apiVersion: example.com/v1
  kind: Gizmo
  _resource: gizmoz
  metadata: {name: g}
)";
  std::ofstream(dir.Path() / "seed.json")
      << R"({"kind":"List","items":[{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"s"},"spec":{"driver":"gpu.nvidia.com","nodeName":"node-a"}}]})";
  ApiServer server;
  server.SeedFile(dir.Path() / "seed.yaml");
  server.SeedFile(dir.Path() / "seed.json");
  EXPECT_THROW(server.SeedFile(dir.Path() / "missing.yaml"), std::runtime_error);
  EXPECT_THROW(server.Seed(Json{{"kind", "Node"}}), std::runtime_error);

  auto node = server.Call("GET", "/api/v1/nodes/node-a");
  EXPECT_EQ(node.status, 200);
  EXPECT_EQ(node.Json()["status"]["capacity"]["cpu"], "8") << "seeds keep .status";
  EXPECT_EQ(node.Json()["metadata"]["labels"]["gpu"], "true");
  EXPECT_EQ(server.Call("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-a").status, 200);
  EXPECT_EQ(server.Call("GET", "/apis/example.com/v1/namespaces/ns1/widgets/w").status, 200);
  EXPECT_EQ(server.Call("GET", "/apis/example.com/v1/gizmoz/g").status, 200);
  EXPECT_EQ(server.Call("GET", "/apis/resource.k8s.io/v1/resourceslices/s").status, 200);
  auto discovery = server.Call("GET", "/apis/example.com/v1").Json();
  EXPECT_EQ(discovery["kind"], "APIResourceList");
}

TEST(ApiServerSimStateDir, WritesCaTokenKubeconfigAndRotates) {
  TempDir dir;
  ApiServerOptions options;
  options.state_dir = dir.Path() / "state";
  ApiServer server(options);
  server.Start();
  EXPECT_EQ(ReadFile(options.state_dir / "ca.crt"), server.CaPem());
  EXPECT_EQ(ReadFile(options.state_dir / "token"), server.Token());
  EXPECT_EQ(ReadFile(options.state_dir / "namespace"), "default");
  std::string kubeconfig = ReadFile(options.state_dir / "kubeconfig");
  EXPECT_NE(kubeconfig.find("server: \"https://127.0.0.1:" + std::to_string(server.Port()) + "\""), std::string::npos)
      << kubeconfig;
  EXPECT_NE(kubeconfig.find("tokenFile:"), std::string::npos);
  std::string rotated = server.RotateToken();
  EXPECT_EQ(ReadFile(options.state_dir / "token"), rotated);
}

TEST(ApiServerSimExternalLoop, RunsOnAGivenIoContext) {
  asio::io_context ioc;
  auto server = std::make_unique<ApiServer>(ioc);
  server->Start();
  std::thread loop([&] { ioc.run(); });
  Client client(server->Port(), TlsOptions{server->CaPem(), "127.0.0.1", {}, {}});
  client.set_token(server->Token());
  EXPECT_EQ(client.Do("GET", "/api/v1/nodes").status, 200);
  server->Stop();
  server.reset();
  loop.join();  // run() returns once every connection has ended
}

TEST(ApiServerSimBinary, StartsWritesStateAndStopsOnSigterm) {
  TempDir dir;
  std::ofstream(dir.Path() / "seed.yaml") << "apiVersion: v1\nkind: Node\nmetadata:\n  name: n\n";
  std::string out = (dir.Path() / "out.txt").string();
  std::string state = (dir.Path() / "state").string();
  std::string seed = (dir.Path() / "seed.yaml").string();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<std::string> args = {GNS_SIM_APISERVER_BIN, "--state-dir", state, "--seed", seed};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  auto deadline = Clock::now() + 20s;
  while (!std::filesystem::exists(std::filesystem::path(state) / "kubeconfig") && Clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  std::this_thread::sleep_for(100ms);
  std::string text = ReadFile(out);
  std::smatch match;
  ASSERT_TRUE(std::regex_search(text, match, std::regex("https://127\\.0\\.0\\.1:(\\d+)"))) << text;
  auto port = static_cast<std::uint16_t>(std::stoi(match[1]));
  Client client(port, TlsOptions{ReadFile(std::filesystem::path(state) / "ca.crt"), "127.0.0.1", {}, {}});
  client.set_token(ReadFile(std::filesystem::path(state) / "token"));
  EXPECT_EQ(client.Do("GET", "/api/v1/nodes/n").status, 200);
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
