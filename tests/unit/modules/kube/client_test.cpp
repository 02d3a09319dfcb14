// KubeClient against the simulated API server: verbs, paging, patches, apply, preconditions,
// the status subresource, tokens (401 → re-read), kubeconfig and in-cluster auth, TLS
// verification, deadlines, connection reuse and the rate limit; the same verbs awaited from
// coroutines.
#include "kube_test_util.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include <cstdlib>
#include <fstream>

namespace gns::kube {
namespace {

using test::KubeTestBase;
using nlohmann::json;

class KubeClientTest : public KubeTestBase {};

// Issue #24 §8: every segment from outside is escaped; names are checked against Kubernetes' rule.
TEST(ResourcePathTest, SegmentsFromOutsideAreEscapedAndNamesValidated) {
  EXPECT_EQ(ResourcePath::Core("nodes").Object("n1", "status"), "/api/v1/nodes/n1/status");
  EXPECT_EQ(ResourcePath::Grouped("resource.k8s.io", "v1", "resourceclaimtemplates", "team").Object("../../x"),
            "/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates/..%2F..%2Fx");
  EXPECT_EQ(ResourcePath::Core("pods", "a/b").Object("p?q#r%"), "/api/v1/namespaces/a%2Fb/pods/p%3Fq%23r%25");
  EXPECT_EQ(ResourcePath::Core("nodes").Object(".."), "/api/v1/nodes/%2E%2E");
  EXPECT_EQ(PathEscape("."), "%2E");
  for (const char* good : {"a", "n1", "gpu-node-1.example.com", "0"}) EXPECT_TRUE(IsValidObjectName(good)) << good;
  for (const char* bad : {"", "..", "../x", "a?b", "A", "-a", "a-", "a_b", "a b", "a/b", "a.", ".a"}) {
    EXPECT_FALSE(IsValidObjectName(bad)) << bad;
  }
  EXPECT_FALSE(IsValidObjectName(std::string(254, 'a')));
  EXPECT_TRUE(IsValidObjectName(std::string(253, 'a')));
}

TEST_F(KubeClientTest, CreateGetUpdateAndConflicts) {
  auto client = MakeClient(BaseConfig());
  const auto nodes = ResourcePath::Core("nodes");
  auto created = Wait([&](auto cb) { client->Create(nodes.Collection(), Node("n1", {{"a", "1"}}), cb); });
  ASSERT_TRUE(created.Ok()) << created.error;
  EXPECT_EQ(created.http_status, 201);
  const auto rv = created.object["metadata"]["resourceVersion"].get<std::string>();

  auto got = Wait([&](auto cb) { client->Get(nodes.Object("n1"), cb); });
  ASSERT_TRUE(got.Ok()) << got.error;
  EXPECT_EQ(got.object["metadata"]["labels"]["a"], "1");

  json updated = got.object;
  updated["metadata"]["labels"]["a"] = "2";
  auto put = Wait([&](auto cb) { client->Update(nodes.Object("n1"), updated, cb); });
  ASSERT_TRUE(put.Ok()) << put.error;
  EXPECT_NE(put.object["metadata"]["resourceVersion"].get<std::string>(), rv);

  // The same stale resourceVersion again: optimistic concurrency says no.
  auto stale = Wait([&](auto cb) { client->Update(nodes.Object("n1"), updated, cb); });
  EXPECT_EQ(stale.http_status, 409);
  EXPECT_FALSE(stale.error.empty());

  auto missing = Wait([&](auto cb) { client->Get(nodes.Object("nope"), cb); });
  EXPECT_EQ(missing.http_status, 404);
  EXPECT_NE(missing.error.find("not found"), std::string::npos) << missing.error;

  auto duplicate = Wait([&](auto cb) { client->Create(nodes.Collection(), Node("n1"), cb); });
  EXPECT_EQ(duplicate.http_status, 409);
}

TEST_F(KubeClientTest, ListFollowsContinueTokensWithSelectors) {
  auto client = MakeClient(BaseConfig());
  json seed = json::array();
  for (int i = 0; i < 25; ++i) {
    seed.push_back(Node("node-" + std::to_string(i), {{"gpu", i % 5 == 0 ? "yes" : "no"}}));
  }
  server_->Seed(seed);
  server_->ResetRequestCounts();
  const auto path = ResourcePath::Core("nodes").Collection();
  auto all = Wait([&](auto cb) { client->List(path, ListOptions{"", "", 10}, cb); });
  ASSERT_TRUE(all.Ok()) << all.error;
  EXPECT_EQ(all.object["items"].size(), 25u);
  EXPECT_FALSE(all.object["metadata"]["resourceVersion"].get<std::string>().empty());
  EXPECT_EQ(server_->RequestCount("list"), 3u);

  auto selected = Wait([&](auto cb) { client->List(path, ListOptions{"gpu=yes", "", 2}, cb); });
  ASSERT_TRUE(selected.Ok()) << selected.error;
  EXPECT_EQ(selected.object["items"].size(), 5u);

  auto by_field = Wait([&](auto cb) { client->List(path, ListOptions{"", "metadata.name=node-7", 0}, cb); });
  ASSERT_TRUE(by_field.Ok()) << by_field.error;
  ASSERT_EQ(by_field.object["items"].size(), 1u);
  EXPECT_EQ(by_field.object["items"][0]["metadata"]["name"], "node-7");
}

TEST_F(KubeClientTest, MergeJsonPatchAndServerSideApply) {
  auto client = MakeClient(BaseConfig());
  const auto cms = ResourcePath::Core("configmaps", "default");
  json cm = {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", "c"}}}, {"data", {{"a", "1"}}}};
  ASSERT_TRUE(Wait([&](auto cb) { client->Create(cms.Collection(), cm, cb); }).Ok());

  auto merged = Wait([&](auto cb) {
    client->Patch(cms.Object("c"), PatchType::kMerge, json{{"data", {{"b", "2"}}}}, "", cb);
  });
  ASSERT_TRUE(merged.Ok()) << merged.error;
  EXPECT_EQ(merged.object["data"], (json{{"a", "1"}, {"b", "2"}}));

  auto patched = Wait([&](auto cb) {
    client->Patch(cms.Object("c"), PatchType::kJson, json::array({{{"op", "remove"}, {"path", "/data/a"}}}), "", cb);
  });
  ASSERT_TRUE(patched.Ok()) << patched.error;
  EXPECT_EQ(patched.object["data"], (json{{"b", "2"}}));

  const json applied = {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", "c"}}}, {"data", {{"x", "y"}}}};
  auto apply = Wait([&](auto cb) { client->Patch(cms.Object("c"), PatchType::kApply, applied, "kube-test", cb); });
  ASSERT_TRUE(apply.Ok()) << apply.error;
  EXPECT_EQ(apply.object["data"]["x"], "y");
  bool managed = false;
  for (const auto& entry : apply.object["metadata"]["managedFields"]) {
    managed |= entry.value("manager", "") == "kube-test" && entry.value("operation", "") == "Apply";
  }
  EXPECT_TRUE(managed) << apply.object.dump();

  // Another manager setting the same field conflicts unless it forces.
  const json other = {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", "c"}}}, {"data", {{"x", "z"}}}};
  auto conflict = Wait([&](auto cb) { client->Patch(cms.Object("c"), PatchType::kApply, other, "other", cb); });
  EXPECT_EQ(conflict.http_status, 409);
  auto forced = Wait([&](auto cb) { client->Patch(cms.Object("c"), PatchType::kApply, other, "other", cb, true); });
  ASSERT_TRUE(forced.Ok()) << forced.error;
  EXPECT_EQ(forced.object["data"]["x"], "z");

  auto no_manager = Wait([&](auto cb) { client->Patch(cms.Object("c"), PatchType::kApply, other, "", cb); });
  EXPECT_FALSE(no_manager.Ok());
}

TEST_F(KubeClientTest, DeleteHonoursPreconditions) {
  auto client = MakeClient(BaseConfig());
  const auto nodes = ResourcePath::Core("nodes");
  auto created = Wait([&](auto cb) { client->Create(nodes.Collection(), Node("d1"), cb); });
  ASSERT_TRUE(created.Ok());
  const auto meta = *ObjectMeta::From(created.object);

  auto wrong_uid = Wait([&](auto cb) { client->Delete(nodes.Object("d1"), Preconditions{"not-the-uid", ""}, cb); });
  EXPECT_EQ(wrong_uid.http_status, 409) << wrong_uid.error;
  auto wrong_rv = Wait([&](auto cb) { client->Delete(nodes.Object("d1"), Preconditions{"", "1"}, cb); });
  EXPECT_EQ(wrong_rv.http_status, 409) << wrong_rv.error;
  auto ok = Wait([&](auto cb) {
    client->Delete(nodes.Object("d1"), Preconditions{meta.uid, meta.resource_version}, cb);
  });
  EXPECT_TRUE(ok.Ok()) << ok.error;
  EXPECT_EQ(server_->Call("GET", nodes.Object("d1")).status, 404);
  auto again = Wait([&](auto cb) { client->Delete(nodes.Object("d1"), Preconditions{}, cb); });
  EXPECT_EQ(again.http_status, 404);
}

TEST_F(KubeClientTest, StatusSubresource) {
  auto client = MakeClient(BaseConfig());
  const auto nodes = ResourcePath::Core("nodes");
  ASSERT_TRUE(Wait([&](auto cb) { client->Create(nodes.Collection(), Node("s1"), cb); }).Ok());

  // Status written through the main resource is ignored; through /status it sticks.
  auto got = Wait([&](auto cb) { client->Get(nodes.Object("s1"), cb); });
  json with_status = got.object;
  with_status["status"] = {{"phase", "Running"}};
  auto main_put = Wait([&](auto cb) { client->Update(nodes.Object("s1"), with_status, cb); });
  ASSERT_TRUE(main_put.Ok()) << main_put.error;
  EXPECT_FALSE(main_put.object.contains("status") && main_put.object["status"].contains("phase"));

  with_status["metadata"]["resourceVersion"] = main_put.object["metadata"]["resourceVersion"];
  auto status_put = Wait([&](auto cb) { client->UpdateStatus(nodes.Object("s1"), with_status, cb); });
  ASSERT_TRUE(status_put.Ok()) << status_put.error;
  EXPECT_EQ(status_put.object["status"]["phase"], "Running");

  auto status_patch = Wait([&](auto cb) {
    client->PatchStatus(nodes.Object("s1"), PatchType::kMerge, json{{"status", {{"capacity", {{"cpu", "4"}}}}}},
                        "kube-test", cb);
  });
  ASSERT_TRUE(status_patch.Ok()) << status_patch.error;
  const auto stored = server_->Call("GET", nodes.Object("s1")).Json();
  EXPECT_EQ(stored["status"]["capacity"]["cpu"], "4");
  EXPECT_EQ(stored["status"]["phase"], "Running");
}

TEST_F(KubeClientTest, RotatedTokenIsReReadAfterA401) {
  auto client = MakeClient(BaseConfig());
  const auto path = ResourcePath::Core("nodes").Collection();
  ASSERT_TRUE(Wait([&](auto cb) { client->List(path, {}, cb); }).Ok());
  const auto reloads = client->GetStats().token_reloads;

  // The server rotates: the file has the new token, the client still holds the old one.
  server_->RotateToken();
  auto after = Wait([&](auto cb) { client->List(path, {}, cb); });
  EXPECT_TRUE(after.Ok()) << after.error;
  EXPECT_GT(client->GetStats().token_reloads, reloads);
  EXPECT_EQ(server_->RequestCounts()["list"], 3u);  // ok, 401, retried ok

  // A token the server rejects until rotation: 401 (after one retry), then fine once rotated.
  server_->RejectTokenUntilRotated();
  auto rejected = Wait([&](auto cb) { client->Get(ResourcePath::Core("nodes").Object("x"), cb); });
  EXPECT_EQ(rejected.http_status, 401);
  server_->RotateToken();
  auto recovered = Wait([&](auto cb) { client->List(path, {}, cb); });
  EXPECT_TRUE(recovered.Ok()) << recovered.error;
}

TEST_F(KubeClientTest, KubeconfigWithTokenFileAndWithClientCertificate) {
  const auto kubeconfig = (dir_ / "state" / "kubeconfig").string();
  auto token_config = LoadKubeconfig(kubeconfig);
  EXPECT_EQ(token_config.server, server_->BaseUrl());
  EXPECT_FALSE(token_config.token_file.empty());
  auto client = MakeClient(token_config);
  auto listed = Wait([&](auto cb) { client->List("/api/v1/nodes", {}, cb); });
  EXPECT_TRUE(listed.Ok()) << listed.error;

  auto cert_config = LoadKubeconfig(kubeconfig, "gns-sim-cert");
  EXPECT_TRUE(cert_config.token.empty());
  EXPECT_TRUE(cert_config.token_file.empty());
  EXPECT_FALSE(cert_config.client_cert_pem.empty());
  auto cert_client = MakeClient(cert_config);
  auto cert_listed = Wait([&](auto cb) { cert_client->List("/api/v1/nodes", {}, cb); });
  EXPECT_TRUE(cert_listed.Ok()) << cert_listed.error;

  // Without any credential the server says 401.
  ClientConfig anonymous = cert_config;
  anonymous.client_cert_pem.clear();
  anonymous.client_key_pem.clear();
  auto anon_client = MakeClient(anonymous);
  EXPECT_EQ(Wait([&](auto cb) { anon_client->List("/api/v1/nodes", {}, cb); }).http_status, 401);

  // Inline data variants and a static token.
  const auto inline_path = (dir_ / "inline.kubeconfig").string();
  auto b64 = [](const std::string& in) {
    static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    int val = 0, bits = -6;
    for (unsigned char c : in) {
      val = (val << 8) + c;
      bits += 8;
      while (bits >= 0) {
        out.push_back(t[(val >> bits) & 0x3F]);
        bits -= 6;
      }
    }
    if (bits > -6) out.push_back(t[((val << 8) >> (bits + 8)) & 0x3F]);
    while (out.size() % 4) out.push_back('=');
    return out;
  };
  std::ofstream(inline_path) << "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                             << "clusters:\n- name: k\n  cluster:\n    server: " << server_->BaseUrl()
                             << "\n    certificate-authority-data: " << b64(server_->CaPem()) << "\n"
                             << "users:\n- name: u\n  user:\n    token: " << server_->Token() << "\n"
                             << "contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n";
  auto inline_client = MakeClient(LoadKubeconfig(inline_path));
  EXPECT_TRUE(Wait([&](auto cb) { inline_client->List("/api/v1/nodes", {}, cb); }).Ok());

  EXPECT_THROW(LoadKubeconfig((dir_ / "missing").string()), std::runtime_error);
  EXPECT_THROW(LoadKubeconfig(kubeconfig, "no-such-context"), std::runtime_error);
}

TEST_F(KubeClientTest, InClusterConfigFromEnvironmentAndServiceAccountFiles) {
  const auto state = dir_ / "state";
  ::setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1", 1);
  ::setenv("KUBERNETES_SERVICE_PORT", std::to_string(server_->Port()).c_str(), 1);
  InClusterPaths paths{(state / "token").string(), (state / "ca.crt").string(), (state / "namespace").string()};
  auto config = InClusterConfig(paths);
  EXPECT_EQ(config.server, server_->BaseUrl());
  auto client = MakeClient(config);
  EXPECT_TRUE(Wait([&](auto cb) { client->List("/api/v1/nodes", {}, cb); }).Ok());

  ::unsetenv("KUBERNETES_SERVICE_PORT");
  EXPECT_THROW(InClusterConfig(paths), std::runtime_error);
  ::unsetenv("KUBERNETES_SERVICE_HOST");
}

TEST_F(KubeClientTest, WrongCaFailsVerification) {
  sim::ApiServer other;
  other.Start();
  auto config = BaseConfig();
  config.ca_pem = other.CaPem();
  auto client = MakeClient(config);
  auto result = Wait([&](auto cb) { client->Get("/api/v1/nodes", cb); });
  EXPECT_EQ(result.http_status, 0);
  EXPECT_NE(result.error.find("certificate verify failed"), std::string::npos) << result.error;
  other.Stop();

  config.ca_pem = "not a certificate";
  EXPECT_THROW(MakeClient(config), std::runtime_error);
  config.ca_pem.clear();
  EXPECT_THROW(MakeClient(config), std::runtime_error);
}

TEST_F(KubeClientTest, DeadlineServerErrorsAndConnectionReuse) {
  auto config = BaseConfig();
  config.request_timeout = std::chrono::milliseconds(300);
  config.retry.max_attempts = 1;  // the answers as they come (retries: the tests below)
  auto client = MakeClient(config);
  const auto path = ResourcePath::Core("nodes").Collection();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Wait([&](auto cb) { client->List(path, {}, cb); }).Ok());
  EXPECT_EQ(client->GetStats().connections_opened, 1u);

  server_->FailNextRequests(503, 1);
  auto unavailable = Wait([&](auto cb) { client->List(path, {}, cb); });
  EXPECT_EQ(unavailable.http_status, 503);
  EXPECT_FALSE(unavailable.error.empty());

  server_->SetResponseDelay(std::chrono::milliseconds(1500));
  auto slow = Wait([&](auto cb) { client->List(path, {}, cb); });
  EXPECT_EQ(slow.http_status, 0);
  EXPECT_EQ(slow.error, "deadline exceeded");
  server_->SetResponseDelay(std::chrono::milliseconds(0));
  EXPECT_TRUE(Wait([&](auto cb) { client->List(path, {}, cb); }).Ok());
  EXPECT_GE(h_.metrics.Counter("gpu_node_supervisor_kube_requests_total", "", {{"verb", "list"}, {"code", "200"}})
                .Value(),
            6);
}

TEST_F(KubeClientTest, RetriesWhatTheServerDidNotActOnAndHonoursRetryAfter) {
  auto config = BaseConfig();
  config.retry.backoff = BackoffPolicy{std::chrono::milliseconds(10), std::chrono::milliseconds(40), 2.0, 0.5};
  config.retry.max_retry_after = std::chrono::milliseconds(1500);
  config.retry.max_attempts = 3;
  auto client = MakeClient(config);
  const auto nodes = ResourcePath::Core("nodes");

  // 429 with Retry-After on a write: not acted on, so retried after exactly what it asked.
  server_->FailNextRequests(429, 1, "/api/v1/nodes", 1);
  auto created = Wait([&](auto cb) { client->Create(nodes.Collection(), Node("n-429"), cb); });
  EXPECT_TRUE(created.Ok()) << created.error;
  EXPECT_EQ(client->GetStats().retries, 1u);
  EXPECT_EQ(client->GetStats().last_retry_delay, std::chrono::milliseconds(1000));
  EXPECT_EQ(server_->RequestCount("create"), 2u);

  // A Retry-After beyond the policy's maximum waits only the maximum.
  server_->FailNextRequests(503, 1, "/api/v1/nodes/n-429", 3600);
  auto got = Wait([&](auto cb) { client->Get(nodes.Object("n-429"), cb); });
  EXPECT_TRUE(got.Ok()) << got.error;
  EXPECT_EQ(client->GetStats().retries, 2u);
  EXPECT_EQ(client->GetStats().last_retry_delay, std::chrono::milliseconds(1500));

  // A 500 without Retry-After on a write may have been applied: back to the caller at once.
  server_->ResetRequestCounts();
  server_->FailNextRequests(500, 1, "/api/v1/nodes");
  auto failed = Wait([&](auto cb) { client->Create(nodes.Collection(), Node("n-500"), cb); });
  EXPECT_EQ(failed.http_status, 500);
  EXPECT_TRUE(IsTransient(failed));
  EXPECT_EQ(failed.retry_after, std::chrono::milliseconds(0));
  EXPECT_EQ(server_->RequestCount("create"), 1u);
  EXPECT_EQ(client->GetStats().retries, 2u);

  // A read is retried on any transient answer, up to max_attempts; then the last answer.
  server_->FailNextRequests(500, 3, "/api/v1/nodes/n-429");
  auto exhausted = Wait([&](auto cb) { client->Get(nodes.Object("n-429"), cb); });
  EXPECT_EQ(exhausted.http_status, 500);
  EXPECT_EQ(server_->RequestCount("get"), 3u);
  EXPECT_EQ(client->GetStats().retries, 4u);

  // Not transient: never retried.
  auto missing = Wait([&](auto cb) { client->Get(nodes.Object("absent"), cb); });
  EXPECT_EQ(missing.http_status, 404);
  EXPECT_FALSE(IsTransient(missing));
  EXPECT_EQ(client->GetStats().retries, 4u);
}

TEST_F(KubeClientTest, ARestartingListenerIsRetriedForAnyVerb) {
  auto config = BaseConfig();
  config.retry.backoff = BackoffPolicy{std::chrono::milliseconds(100), std::chrono::milliseconds(400), 2.0, 0.5};
  config.retry.max_attempts = 10;
  auto client = MakeClient(config);
  const auto nodes = ResourcePath::Core("nodes");
  ASSERT_TRUE(Wait([&](auto cb) { client->List(nodes.Collection(), {}, cb); }).Ok());
  // The kept-alive connection is cut and connects are refused for a while: the create never
  // reached the server, so it is safe to send again, and it lands exactly once.
  server_->RestartListener(std::chrono::milliseconds(500));
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(50));
  server_->ResetRequestCounts();
  auto created = Wait([&](auto cb) { client->Create(nodes.Collection(), Node("after-restart"), cb); });
  EXPECT_TRUE(created.Ok()) << created.error;
  EXPECT_GE(client->GetStats().retries, 1u);
  EXPECT_EQ(server_->RequestCount("create"), 1u);
}

TEST(RetryTest, RetryAfterParsingAndDelays) {
  EXPECT_EQ(ParseRetryAfter("3"), std::chrono::milliseconds(3000));
  EXPECT_EQ(ParseRetryAfter(" 12 "), std::chrono::milliseconds(12000));
  EXPECT_EQ(ParseRetryAfter("Wed, 21 Oct 2015 07:28:00 GMT"), std::chrono::milliseconds(0));
  EXPECT_EQ(ParseRetryAfter("-1"), std::chrono::milliseconds(0));
  EXPECT_EQ(ParseRetryAfter(""), std::chrono::milliseconds(0));
  EXPECT_EQ(ParseRetryAfter("99999999999999999999"), std::chrono::milliseconds(0));
  Backoff backoff(BackoffPolicy{std::chrono::milliseconds(100), std::chrono::milliseconds(800), 2.0, 0.0});
  EXPECT_EQ(RetryDelay(std::chrono::milliseconds(0), backoff, std::chrono::seconds(30)), std::chrono::milliseconds(100));
  EXPECT_EQ(RetryDelay(std::chrono::seconds(2), backoff, std::chrono::seconds(30)), std::chrono::milliseconds(2000));
  EXPECT_EQ(RetryDelay(std::chrono::seconds(60), backoff, std::chrono::seconds(30)), std::chrono::milliseconds(30000));
  // The backoff kept growing underneath (consecutive failures).
  EXPECT_EQ(RetryDelay(std::chrono::milliseconds(0), backoff, std::chrono::seconds(30)), std::chrono::milliseconds(800));
  for (int code : {0, 429, 500, 502, 503, 504}) EXPECT_TRUE(IsTransient(code)) << code;
  for (int code : {200, 400, 401, 403, 404, 409, 410, 422, 501}) EXPECT_FALSE(IsTransient(code)) << code;
}

TEST_F(KubeClientTest, RateLimitSpacesRequests) {
  auto config = BaseConfig();
  config.qps = 20;
  config.burst = 2;
  auto client = MakeClient(config);
  int done = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 6; ++i) client->Get("/api/v1/nodes", [&](Result) { ++done; });
  ASSERT_TRUE(h_.RunUntil([&] { return done == 6; }));
  // Two at once, then one every 50 ms.
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(180));
}

TEST_F(KubeClientTest, ShutdownCompletesPendingRequestsWithAnError) {
  auto client = MakeClient(BaseConfig());
  server_->SetResponseDelay(std::chrono::milliseconds(2000));
  std::optional<Result> result;
  client->Get("/api/v1/nodes", [&](Result r) { result = std::move(r); });
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(100));
  client->Shutdown();
  ASSERT_TRUE(h_.RunUntil([&] { return result.has_value(); }));
  EXPECT_EQ(result->error, "client stopped");
  std::optional<Result> later;
  client->Get("/api/v1/nodes", [&](Result r) { later = std::move(r); });
  ASSERT_TRUE(h_.RunUntil([&] { return later.has_value(); }));
  EXPECT_FALSE(later->Ok());
  server_->SetResponseDelay(std::chrono::milliseconds(0));
}

// ---------------------------------------------------------------- the verbs, awaited

namespace asio = boost::asio;
using Answers = std::map<std::string, Result>;

// Every verb once or twice, from one coroutine, answers kept by name. Arguments are named
// locals (the g++ 12 pitfall, loop/awaitables.hpp).
asio::awaitable<void> EveryVerbAwaited(std::shared_ptr<KubeClient> client, std::shared_ptr<Answers> out) {
  Answers& a = *out;
  const auto nodes = ResourcePath::Core("nodes");
  const std::string collection = nodes.Collection();
  const std::string n1 = nodes.Object("aw-1");
  const std::string missing = nodes.Object("aw-absent");
  const json node = {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "aw-1"}, {"labels", {{"a", "1"}}}}}};
  a["create"] = co_await client->Create(collection, node);
  a["create-again"] = co_await client->Create(collection, node);
  a["get"] = co_await client->Get(n1);
  a["get-missing"] = co_await client->Get(missing);

  json updated = a["get"].object;
  updated["metadata"]["labels"]["a"] = "2";
  a["update"] = co_await client->Update(n1, updated);
  a["update-stale"] = co_await client->Update(n1, updated);

  const std::string manager = "kube-test";
  const std::string no_manager;
  const json merge = {{"metadata", {{"labels", {{"b", "3"}}}}}};
  a["merge"] = co_await client->Patch(n1, PatchType::kMerge, merge, manager);
  const json applied = {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "aw-1"}, {"labels", {{"c", "4"}}}}}};
  a["apply-without-manager"] = co_await client->Patch(n1, PatchType::kApply, applied, no_manager);
  const Deadline none;
  const Gate::Ticket any;
  a["apply-forced"] = co_await client->Patch(n1, PatchType::kApply, applied, manager, none, any, /*force=*/true);

  const json status_patch = {{"status", {{"capacity", {{"cpu", "4"}}}}}};
  a["patch-status"] = co_await client->PatchStatus(n1, PatchType::kMerge, status_patch, manager);
  json with_status = a["patch-status"].object;
  with_status["status"]["phase"] = "Running";
  a["update-status"] = co_await client->UpdateStatus(n1, with_status);

  const ListOptions selected{"b=3", "", 1};
  a["list"] = co_await client->List(collection, selected);
  const std::vector<std::string> fields = {"metadata.labels"};
  const Projection projection(fields);
  CachedFn nothing_cached = [](std::string_view, std::string_view) { return false; };
  const ListOptions all{};
  a["list-projected"] = co_await client->List(collection, all, projection.Root(), std::move(nothing_cached));
  const std::string verb = "get";
  const std::string method = "GET";
  std::string target = n1;
  std::string body;
  std::string content_type;
  a["request"] = co_await client->Request(verb, method, std::move(target), std::move(body), std::move(content_type));

  const Preconditions wrong{"not-the-uid", ""};
  a["delete-wrong-uid"] = co_await client->Delete(n1, wrong);
  const auto meta = ObjectMeta::From(a["update-status"].object);
  const Preconditions right{meta ? meta->uid : "", ""};
  a["delete"] = co_await client->Delete(n1, right);
  a["delete-again"] = co_await client->Delete(n1, right);
}

// Runs `coroutine` on the harness's loop until it ended; false when it did not, or threw.
bool RunCoroutine(gns::test::LoopHarness& h, asio::awaitable<void> coroutine) {
  auto ended = std::make_shared<std::optional<std::exception_ptr>>();
  asio::co_spawn(h.loop.Io(), std::move(coroutine), [ended](std::exception_ptr e) { *ended = e; });
  if (!h.RunUntil([&] { return ended->has_value(); })) return false;
  return !**ended;
}

TEST_F(KubeClientTest, EveryVerbAwaitedAnswersAsItsCallback) {
  auto client = MakeClient(BaseConfig());
  auto answers = std::make_shared<Answers>();
  ASSERT_TRUE(RunCoroutine(h_, EveryVerbAwaited(client, answers)));
  auto& a = *answers;
  auto status = [&](const char* name) { return a.at(name).http_status; };
  EXPECT_EQ(status("create"), 201) << a["create"].error;
  EXPECT_EQ(status("create-again"), 409);
  EXPECT_FALSE(a["create-again"].error.empty());
  EXPECT_EQ(status("get"), 200);
  EXPECT_EQ(a["get"].object["metadata"]["labels"]["a"], "1");
  EXPECT_EQ(status("get-missing"), 404);
  EXPECT_NE(a["get-missing"].error.find("not found"), std::string::npos) << a["get-missing"].error;
  EXPECT_EQ(status("update"), 200) << a["update"].error;
  EXPECT_EQ(status("update-stale"), 409);
  EXPECT_EQ(status("merge"), 200) << a["merge"].error;
  EXPECT_EQ(a["merge"].object["metadata"]["labels"]["b"], "3");
  EXPECT_FALSE(a["apply-without-manager"].Ok());
  EXPECT_EQ(a["apply-without-manager"].error, "server-side apply needs a field manager");
  EXPECT_EQ(status("apply-forced"), 200) << a["apply-forced"].error;
  EXPECT_EQ(a["apply-forced"].object["metadata"]["labels"]["c"], "4");
  EXPECT_EQ(status("patch-status"), 200) << a["patch-status"].error;
  EXPECT_EQ(status("update-status"), 200) << a["update-status"].error;
  EXPECT_EQ(a["update-status"].object["status"]["phase"], "Running");
  EXPECT_EQ(a["update-status"].object["status"]["capacity"]["cpu"], "4");
  ASSERT_TRUE(a["list"].Ok()) << a["list"].error;
  ASSERT_EQ(a["list"].object["items"].size(), 1u);
  EXPECT_EQ(a["list"].object["items"][0]["metadata"]["name"], "aw-1");
  ASSERT_TRUE(a["list-projected"].Ok()) << a["list-projected"].error;
  ASSERT_EQ(a["list-projected"].object["items"].size(), 1u);
  EXPECT_FALSE(a["list-projected"].object["items"][0].contains("status"));  // projected away
  EXPECT_EQ(a["list-projected"].object["items"][0]["metadata"]["labels"]["b"], "3");
  EXPECT_EQ(status("request"), 200) << a["request"].error;
  EXPECT_EQ(status("delete-wrong-uid"), 409);
  EXPECT_EQ(status("delete"), 200) << a["delete"].error;
  EXPECT_EQ(status("delete-again"), 404);
  EXPECT_EQ(server_->Call("GET", ResourcePath::Core("nodes").Object("aw-1")).status, 404);
}

// Awaits `path` with `within`, the time taken and the resumptions counted.
asio::awaitable<void> GetWithin(std::shared_ptr<KubeClient> client, std::string path, Deadline within,
                                std::shared_ptr<std::vector<Result>> out) {
  Result r = co_await client->Get(path, within);
  out->push_back(std::move(r));
}

TEST_F(KubeClientTest, AwaitedCallPastItsDeadlineResumesOnceWithAnError) {
  auto config = BaseConfig();
  config.request_timeout = std::chrono::milliseconds(5000);
  auto client = MakeClient(config);
  const std::string path = ResourcePath::Core("nodes").Collection();

  // Answered within the deadline: the answer, and the deadline's timer does not resume it again.
  auto fast = std::make_shared<std::vector<Result>>();
  ASSERT_TRUE(RunCoroutine(h_, GetWithin(client, path, std::chrono::milliseconds(300), fast)));
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(400));
  ASSERT_EQ(fast->size(), 1u);
  EXPECT_TRUE((*fast)[0].Ok()) << (*fast)[0].error;

  // The server holds its answer for 1.5 s: the deadline of 200 ms resumes the coroutine first.
  server_->SetResponseDelay(std::chrono::milliseconds(1500));
  server_->ResetRequestCounts();
  auto slow = std::make_shared<std::vector<Result>>();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(RunCoroutine(h_, GetWithin(client, path, std::chrono::milliseconds(200), slow)));
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(slow->size(), 1u);
  EXPECT_EQ((*slow)[0].http_status, 0);
  EXPECT_EQ((*slow)[0].error.rfind(kDeadlineExceeded, 0), 0u) << (*slow)[0].error;
  EXPECT_TRUE(IsTransient((*slow)[0]));
  EXPECT_GE(took, std::chrono::milliseconds(200));
  // The request itself went on; its late answer is dropped, not delivered a second time.
  const auto answered = [&] {
    return h_.metrics.Counter("gpu_node_supervisor_kube_requests_total", "", {{"verb", "get"}, {"code", "200"}})
               .Value() >= 2;
  };
  // The deadline resumed the coroutine before the server's answer came (it is held 1.5 s).
  EXPECT_FALSE(answered());
  ASSERT_TRUE(h_.RunUntil(answered, std::chrono::seconds(5)));
  h_.Drain();
  EXPECT_EQ(slow->size(), 1u);
  EXPECT_EQ(server_->RequestCount("list") + server_->RequestCount("get"), 1u);
  server_->SetResponseDelay(std::chrono::milliseconds(0));
}

// Awaits `path` under `ticket`'s gate, with `within`.
asio::awaitable<void> GetGated(std::shared_ptr<KubeClient> client, std::string path, Deadline within,
                               Gate::Ticket ticket, std::shared_ptr<std::vector<Result>> out) {
  Result r = co_await client->Get(path, within, std::move(ticket));
  out->push_back(std::move(r));
}

TEST_F(KubeClientTest, AwaitedCallsEndWithTheClientAndNotAfterTheirGateCloses) {
  auto client = MakeClient(BaseConfig());
  const std::string path = ResourcePath::Core("nodes").Collection();
  server_->SetResponseDelay(std::chrono::milliseconds(1000));

  // Two calls (no deadline; a deadline) whose gate closes while they wait: never resumed, and
  // their frames are freed once the answers came.
  auto gated = std::make_shared<std::vector<Result>>();
  {
    Gate gate;
    asio::co_spawn(h_.loop.Io(), GetGated(client, path, Deadline{}, gate.Watch(), gated), asio::detached);
    asio::co_spawn(h_.loop.Io(), GetGated(client, path, std::chrono::milliseconds(3000), gate.Watch(), gated),
                   asio::detached);
    h_.RunUntil([] { return false; }, std::chrono::milliseconds(100));
  }  // closed
  ASSERT_TRUE(h_.RunUntil([&] { return gated.use_count() == 1; }, std::chrono::seconds(5)))
      << "a gated coroutine still holds its frame";
  EXPECT_TRUE(gated->empty());
  EXPECT_GE(h_.metrics.Counter("gpu_node_supervisor_kube_requests_total", "", {{"verb", "get"}, {"code", "200"}})
                .Value(),
            2);

  // Shutdown completes an awaited call with an error, as it does a callback.
  auto stopped = std::make_shared<std::vector<Result>>();
  auto ended = std::make_shared<bool>(false);
  asio::co_spawn(h_.loop.Io(), GetWithin(client, path, Deadline{}, stopped),
                 [ended](std::exception_ptr) { *ended = true; });
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(100));
  client->Shutdown();
  ASSERT_TRUE(h_.RunUntil([&] { return *ended; }));
  ASSERT_EQ(stopped->size(), 1u);
  EXPECT_EQ((*stopped)[0].error, "client stopped");
  server_->SetResponseDelay(std::chrono::milliseconds(0));
}

TEST(ResourcePathTest, BuildsCoreGroupedNamespacedAndClusterPaths) {
  EXPECT_EQ(ResourcePath::Core("nodes").Object("n1", "status"), "/api/v1/nodes/n1/status");
  EXPECT_EQ(ResourcePath::Core("pods", "default").Collection(), "/api/v1/namespaces/default/pods");
  EXPECT_EQ(ResourcePath::Grouped("coordination.k8s.io", "v1", "leases", "kube-system").Object("x"),
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x");
  EXPECT_EQ(ResourcePath::Grouped("resource.k8s.io", "v1", "resourceslices").Collection(),
            "/apis/resource.k8s.io/v1/resourceslices");
  EXPECT_EQ(QueryEscape("spec.nodeName=a b"), "spec.nodeName%3Da%20b");
  EXPECT_FALSE(ObjectMeta::From(json{{"metadata", {{"namespace", "x"}}}}));
  EXPECT_EQ(ObjectMeta::From(json{{"metadata", {{"name", "a"}, {"namespace", "b"}}}})->Key(), "b/a");
}

}  // namespace
}  // namespace gns::kube
