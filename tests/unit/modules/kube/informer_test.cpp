// Shared informers against the simulated API server: list, watch, bookmarks, and every fault
// an API server does to a long watch; after each, the cache must equal the server's state.
#include "kube_test_util.hpp"
#include "modules/kube/api/informer.hpp"

namespace gns::kube {
namespace {

using nlohmann::json;

class InformerTest : public test::KubeTestBase {
 protected:
  void SetUp() override {
    KubeTestBase::SetUp();
    client_ = MakeClient(BaseConfig());
    InformerOptions options;
    options.backoff = BackoffPolicy{std::chrono::milliseconds(20), std::chrono::milliseconds(200), 2.0, 0.5};
    options.idle_timeout = std::chrono::milliseconds(3000);
    options.page_size = 7;
    registry_ = std::make_unique<InformerRegistry>(client_, h_.bus, h_.loop.Io(), h_.metrics,
                                                   gns::test::QuietLogger("kube-test"), options);
    events_sub_ = h_.bus.Subscribe<ResourceEvent>([this](const ResourceEvent& e) { events_.push_back(e); });
    json seed = json::array();
    for (int i = 0; i < 10; ++i) seed.push_back(Node("node-" + std::to_string(i), {{"pool", i < 5 ? "a" : "b"}}));
    server_->Seed(seed);
  }

  void TearDown() override {
    informer_.reset();
    registry_.reset();
    events_sub_.Reset();
    KubeTestBase::TearDown();
  }

  std::shared_ptr<Informer> AcquireNodes(std::string label_selector = {}) {
    informer_ = registry_->Acquire(InformerSpec{nodes_.Collection(), std::move(label_selector), ""});
    EXPECT_TRUE(h_.RunUntil([&] { return informer_->Synced(); }));
    return informer_;
  }

  std::map<std::string, std::string> CacheState(const Informer& informer) {
    std::map<std::string, std::string> out;
    for (const auto& [key, object] : informer.Items()) out[key] = ObjectMeta::From(*object)->resource_version;
    return out;
  }

  // Waits until the cache equals the server (and one watch is open again).
  void ExpectConverged(const std::string& server_path = "/api/v1/nodes") {
    const bool converged = h_.RunUntil([&] {
      return CacheState(*informer_) == ServerState(server_path) && server_->OpenWatches().size() == 1;
    });
    h_.Drain();  // bus deliveries of the changes that got us here
    EXPECT_TRUE(converged) << "cache " << json(CacheState(*informer_)).dump() << "\nserver "
                           << json(ServerState(server_path)).dump();
  }

  int Count(ResourceEvent::Type type, const std::string& name) {
    int n = 0;
    for (const auto& e : events_) n += e.type == type && (*e.object)["metadata"]["name"] == name;
    return n;
  }

  void Modify(const std::string& name, const std::string& value) {
    const auto r = server_->Call("PATCH", nodes_.Object(name), json{{"metadata", {{"labels", {{"x", value}}}}}}.dump(),
                                 "application/merge-patch+json");
    ASSERT_EQ(r.status, 200) << r.body;
  }

  void Remove(const std::string& name) { ASSERT_EQ(server_->Call("DELETE", nodes_.Object(name)).status, 200); }

  void Add(const std::string& name) {
    ASSERT_EQ(server_->Call("POST", nodes_.Collection(), Node(name).dump()).status, 201);
  }

  const ResourcePath nodes_ = ResourcePath::Core("nodes");
  std::shared_ptr<KubeClient> client_;
  std::unique_ptr<InformerRegistry> registry_;
  std::shared_ptr<Informer> informer_;
  std::vector<ResourceEvent> events_;
  Subscription events_sub_;
};

TEST_F(InformerTest, ListsThenWatchesAndPublishesChanges) {
  auto informer = AcquireNodes();
  EXPECT_EQ(informer->Size(), 10u);
  EXPECT_EQ(server_->RequestCount("list"), 2u);  // 10 items in pages of 7
  EXPECT_EQ(CacheState(*informer), ServerState("/api/v1/nodes"));
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenWatches().size() == 1; }));
  const auto watch = server_->OpenWatches()[0];
  EXPECT_TRUE(watch.bookmarks);
  EXPECT_FALSE(watch.resource_version.empty());
  const auto& synced = h_.bus.LatestByKey<InformerSynced>().at(informer->Key());
  EXPECT_TRUE(synced.synced);

  h_.Drain();
  EXPECT_EQ(Count(ResourceEvent::Type::kAdded, "node-3"), 1);
  Add("new-node");
  Modify("node-1", "m");
  Remove("node-2");
  ASSERT_TRUE(h_.RunUntil([&] { return Count(ResourceEvent::Type::kDeleted, "node-2") == 1; }));
  EXPECT_EQ(Count(ResourceEvent::Type::kAdded, "new-node"), 1);
  EXPECT_EQ(Count(ResourceEvent::Type::kModified, "node-1"), 1);
  EXPECT_EQ((*informer->Get("node-1"))["metadata"]["labels"]["x"], "m");
  EXPECT_EQ(informer->Get("node-2"), nullptr);
  ExpectConverged();
  EXPECT_EQ(h_.metrics.Gauge("gpu_node_supervisor_kube_informer_objects", "", {{"informer", informer->Key()}}).Value(),
            10);
}

TEST_F(InformerTest, BookmarksAdvanceTheResumeVersion) {
  auto informer = AcquireNodes("pool=a");
  EXPECT_EQ(informer->Size(), 5u);
  // A change the selector filters out moves the server's version; a bookmark carries it.
  Modify("node-7", "z");
  const auto target = server_->ResourceVersion();
  ASSERT_TRUE(h_.RunUntil([&] { return informer->ResourceVersion() == target; }));
  EXPECT_EQ(informer->Size(), 5u);
  EXPECT_EQ(server_->OpenWatches().at(0).label_selector, "pool=a");
}

TEST_F(InformerTest, CutWatchResumesFromLastVersionWithoutRelist) {
  auto informer = AcquireNodes();
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenWatches().size() == 1; }));
  server_->ResetRequestCounts();
  server_->CutWatches();
  Modify("node-4", "while-cut");
  Add("added-while-cut");
  ExpectConverged();
  EXPECT_EQ(server_->RequestCount("list"), 0u);
  EXPECT_GE(server_->RequestCount("watch"), 1u);
  EXPECT_EQ(informer->GetStats().relists, 0u);
  EXPECT_GE(informer->GetStats().watch_restarts, 1u);
  EXPECT_EQ(Count(ResourceEvent::Type::kAdded, "added-while-cut"), 1);
}

TEST_F(InformerTest, ExpiredResumeInStreamRelistsAndPublishesMissedDeletions) {
  auto informer = AcquireNodes();
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenWatches().size() == 1; }));
  const auto unchanged_before = informer->Get("node-3");
  ASSERT_NE(unchanged_before, nullptr);
  server_->CutWatches();
  Remove("node-0");
  Remove("node-9");
  Modify("node-5", "missed");
  Add("added-while-away");
  server_->Compact();  // the resume version is gone: the server answers 410 in the stream
  ExpectConverged();
  EXPECT_EQ(informer->GetStats().relists, 1u);
  EXPECT_EQ(Count(ResourceEvent::Type::kDeleted, "node-0"), 1);
  EXPECT_EQ(Count(ResourceEvent::Type::kDeleted, "node-9"), 1);
  EXPECT_EQ(Count(ResourceEvent::Type::kModified, "node-5"), 1);
  EXPECT_EQ(Count(ResourceEvent::Type::kAdded, "added-while-away"), 1);
  EXPECT_EQ(Count(ResourceEvent::Type::kModified, "node-3"), 0);  // unchanged objects stay quiet
  // ...and are not decoded again: the cache keeps the very object it had.
  EXPECT_EQ(informer->Get("node-3").get(), unchanged_before.get());
}

TEST_F(InformerTest, ExpireWatchesOnAnOpenWatchRelists) {
  auto informer = AcquireNodes();
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenWatches().size() == 1; }));
  server_->ExpireWatches();
  ASSERT_TRUE(h_.RunUntil([&] { return informer->GetStats().relists == 1; }));
  Modify("node-1", "after");
  ExpectConverged();
}

TEST_F(InformerTest, HttpGoneOnResumeRelists) {
  auto informer = AcquireNodes();
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenWatches().size() == 1; }));
  server_->SetExpiredWatchMode(sim::ExpiredWatchMode::kHttpStatus);
  server_->CutWatches();
  Remove("node-1");
  server_->Compact();
  ExpectConverged();
  EXPECT_EQ(informer->GetStats().relists, 1u);
  EXPECT_EQ(Count(ResourceEvent::Type::kDeleted, "node-1"), 1);

  // An injected 410 on the next watch request, too.
  server_->CutWatches();
  Remove("node-2");
  server_->FailNextRequests(410, 1, "/api/v1/nodes");
  ExpectConverged();
  EXPECT_EQ(informer->GetStats().relists, 2u);
  EXPECT_EQ(Count(ResourceEvent::Type::kDeleted, "node-2"), 1);
}

TEST_F(InformerTest, SplitEventsAcrossChunksAreJoined) {
  auto informer = AcquireNodes();
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenWatches().size() == 1; }));
  server_->SplitNextWatchEvent();
  Modify("node-6", "split");
  ASSERT_TRUE(h_.RunUntil([&] { return Count(ResourceEvent::Type::kModified, "node-6") == 1; }));
  ExpectConverged();
  EXPECT_EQ(informer->GetStats().decode_errors, 0u);
  EXPECT_EQ(informer->GetStats().relists, 0u);
}

TEST_F(InformerTest, MalformedLineIsCountedAndRecoveredByRelist) {
  auto informer = AcquireNodes();
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenWatches().size() == 1; }));
  server_->MalformedNextWatchLine();
  Modify("node-8", "after-garbage");
  Remove("node-3");
  ExpectConverged();
  EXPECT_GE(informer->GetStats().decode_errors, 1u);
  EXPECT_GE(informer->GetStats().relists, 1u);
  EXPECT_EQ(informer->Get("node-3"), nullptr);
  EXPECT_GE(h_.metrics.Counter("gpu_node_supervisor_kube_informer_decode_errors_total", "",
                               {{"informer", informer->Key()}}).Value(), 1);
}

TEST_F(InformerTest, ServerErrorsAreRetriedWithBackoff) {
  server_->FailNextRequests(500, 2, "/api/v1/nodes");
  auto informer = AcquireNodes();  // the first list fails twice: the client's own retries absorb it
  EXPECT_EQ(client_->GetStats().retries, 2u);
  EXPECT_EQ(informer->GetStats().errors, 0u);
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenWatches().size() == 1; }));

  server_->ResetRequestCounts();
  server_->CutWatches();
  server_->FailNextRequests(503, 3, "/api/v1/nodes");
  Modify("node-2", "after-503");
  ExpectConverged();
  EXPECT_EQ(server_->RequestCount("list"), 0u);  // resumed, not relisted
  EXPECT_GE(server_->RequestCount("watch"), 4u);
  EXPECT_EQ(informer->GetStats().relists, 0u);
}

// A registry whose backoff would outlast RunUntil's limit: whatever converges below did so
// without backing off (or by waiting only what the server asked).
std::unique_ptr<InformerRegistry> SlowBackoffRegistry(std::shared_ptr<KubeClient> client, gns::test::LoopHarness& h) {
  InformerOptions options;
  options.backoff = BackoffPolicy{std::chrono::seconds(60), std::chrono::seconds(120), 2.0, 0.0};
  options.idle_timeout = std::chrono::milliseconds(3000);
  return std::make_unique<InformerRegistry>(std::move(client), h.bus, h.loop.Io(), h.metrics,
                                            gns::test::QuietLogger("kube-test"), options);
}

TEST_F(InformerTest, AHealthyWatchThatIsCutReopensAtOnceEveryTime) {
  auto registry = SlowBackoffRegistry(client_, h_);
  informer_ = registry->Acquire(InformerSpec{nodes_.Collection(), "", ""});
  ASSERT_TRUE(h_.RunUntil([&] { return informer_->Synced() && server_->OpenWatches().size() == 1; }));
  for (int i = 0; i < 3; ++i) {
    Modify("node-1", "v" + std::to_string(i));  // the watch delivers something: it is healthy
    ASSERT_TRUE(h_.RunUntil([&] { return Count(ResourceEvent::Type::kModified, "node-1") == i + 1; }));
    server_->CutWatches();
    Modify("node-2", "v" + std::to_string(i));  // while no watch is open
    ExpectConverged();
  }
  EXPECT_EQ(informer_->GetStats().immediate_rewatches, 3u);
  EXPECT_EQ(informer_->GetStats().relists, 0u);
  informer_.reset();
}

TEST_F(InformerTest, RetryAfterIsHonouredForWatches) {
  auto registry = SlowBackoffRegistry(client_, h_);
  informer_ = registry->Acquire(InformerSpec{nodes_.Collection(), "", ""});
  ASSERT_TRUE(h_.RunUntil([&] { return informer_->Synced() && server_->OpenWatches().size() == 1; }));
  Modify("node-1", "seen");
  ASSERT_TRUE(h_.RunUntil([&] { return Count(ResourceEvent::Type::kModified, "node-1") == 1; }));
  // The immediate re-watch is refused with 429 Retry-After 1: one second, not the 60 s backoff.
  server_->FailNextRequests(429, 1, "/api/v1/nodes", 1);
  server_->CutWatches();
  Modify("node-3", "after-429");
  ExpectConverged();
  EXPECT_EQ(informer_->GetStats().last_delay, std::chrono::milliseconds(1000));
  EXPECT_EQ(informer_->GetStats().relists, 0u);
  informer_.reset();
}

TEST_F(InformerTest, ListenerRestartAndTokenRotationResumeWithoutRelist) {
  auto informer = AcquireNodes();
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenWatches().size() == 1; }));
  server_->RestartListener(std::chrono::milliseconds(300));
  Modify("node-4", "during-restart");
  ExpectConverged();

  // The server stops taking the token until it rotates (the file gets the new one): the
  // watch's 401 makes the client re-read the file.
  server_->RejectTokenUntilRotated();
  server_->CutWatches();
  Modify("node-5", "during-rejection");
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(100));
  server_->RotateToken();
  ExpectConverged();
  EXPECT_EQ(informer->GetStats().relists, 0u);
}

TEST_F(InformerTest, ErrorsDoNotRepublishSynced) {
  int synced_messages = 0;
  auto sub = h_.bus.Subscribe<InformerSynced>([&](const InformerSynced& s) { synced_messages += s.synced; });
  auto informer = AcquireNodes();
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenWatches().size() == 1 && synced_messages == 1; }));
  server_->FailNextRequests(500, 2, "/api/v1/nodes");
  server_->CutWatches();
  Modify("node-6", "after-errors");
  ExpectConverged();
  server_->MalformedNextWatchLine();  // an undecodable line: relist (a list: synced again)
  Modify("node-7", "after-malformed");
  ExpectConverged();
  EXPECT_GE(informer->GetStats().errors, 3u);
  EXPECT_EQ(informer->GetStats().relists, 1u);
  EXPECT_EQ(synced_messages, 2);  // the first list and the relist, none for the errors
}

TEST_F(InformerTest, ReadIdleTimeoutReconnects) {
  // A watch that hears nothing (no events, bookmarks rarer than the idle limit) reconnects.
  InformerOptions options;
  options.backoff = BackoffPolicy{std::chrono::milliseconds(20), std::chrono::milliseconds(200), 2.0, 0.5};
  options.idle_timeout = std::chrono::milliseconds(100);  // bookmarks come every 200 ms
  InformerRegistry registry(client_, h_.bus, h_.loop.Io(), h_.metrics, gns::test::QuietLogger("kube-test"), options);
  auto informer = registry.Acquire(InformerSpec{nodes_.Collection(), "", ""});
  ASSERT_TRUE(h_.RunUntil([&] { return informer->GetStats().watch_restarts >= 2; }));
  EXPECT_EQ(informer->GetStats().relists, 0u);
  informer_ = informer;
  ExpectConverged();
}

TEST_F(InformerTest, OneInformerPerSpecAndNoRequestsInSteadyState) {
  auto first = AcquireNodes();
  auto second = registry_->Acquire(InformerSpec{nodes_.Collection(), "", ""});
  EXPECT_EQ(first.get(), second.get());
  auto other = registry_->Acquire(InformerSpec{nodes_.Collection(), "pool=b", ""});
  EXPECT_NE(other.get(), first.get());
  ASSERT_TRUE(h_.RunUntil([&] { return other->Synced() && server_->OpenWatches().size() == 2; }));
  EXPECT_EQ(registry_->Active(), 2u);

  server_->ResetRequestCounts();
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(1500));  // several bookmark intervals
  EXPECT_EQ(server_->TotalRequests(), 0u) << json(server_->RequestCounts()).dump();
  EXPECT_EQ(server_->OpenWatches().size(), 2u);

  other.reset();  // the last handle gone: the informer stops its watch
  ASSERT_TRUE(h_.RunUntil([&] { return server_->OpenWatches().size() == 1; }));
  EXPECT_EQ(registry_->Active(), 1u);
}

TEST_F(InformerTest, RequestsNameTheModulesThatMakeThem) {
  // Each module's view of the registry acquires in its name: one informer for both, whose list
  // and watch say "gpu-node-supervisor/dra-gpu+pod-resources" (name order), which the simulator
  // counts for each module. A module's view of the client names that module; the client itself
  // the process. What deploy/'s RBAC is checked against rests on this (module_calls.hpp).
  auto root = std::make_shared<InformerRegistry>(client_, h_.bus, h_.loop.Io(), h_.metrics,
                                                 gns::test::QuietLogger("kube-test"));
  const InformerSpec spec{nodes_.Collection(), "pool=a", ""};
  auto from_pods = InformerRegistry::View(root, "pod-resources")->Acquire(spec);
  auto from_gpu = InformerRegistry::View(root, "dra-gpu")->Acquire(spec);
  EXPECT_EQ(from_pods.get(), from_gpu.get());
  EXPECT_EQ(from_gpu->Holders(), "dra-gpu+pod-resources");
  ASSERT_TRUE(h_.RunUntil([&] { return from_gpu->Synced() && server_->OpenWatches().size() == 1; }));

  int answered = 0;
  client_->ForModule("gkm-agent")->Get(nodes_.Object("node-0"), [&](Result) { ++answered; });
  client_->Create(nodes_.Collection(), Node("made-by-the-process", {}), [&](Result) { ++answered; });
  ASSERT_TRUE(h_.RunUntil([&] { return answered == 2; }));
  EXPECT_EQ(client_->ForModule("gkm-agent")->Agent(), "gpu-node-supervisor/gkm-agent");
  EXPECT_EQ(client_->Agent(), "gpu-node-supervisor");

  const json by_agent = server_->Call("GET", "/_sim/stats").Json().at("callsByAgent");
  auto call = [](const char* verb) {
    return json{{"verb", verb}, {"group", ""}, {"resource", "nodes"}, {"subresource", ""}};
  };
  auto has = [&](const std::string& agent, const char* verb) {
    const auto list = by_agent.value(agent, json::array());
    return std::find(list.begin(), list.end(), call(verb)) != list.end();
  };
  for (const char* module : {"gpu-node-supervisor/dra-gpu", "gpu-node-supervisor/pod-resources"}) {
    EXPECT_TRUE(has(module, "list")) << module << ": " << by_agent.dump();
    EXPECT_TRUE(has(module, "watch")) << module << ": " << by_agent.dump();
    EXPECT_FALSE(has(module, "get")) << module;
  }
  EXPECT_FALSE(by_agent.contains("gpu-node-supervisor/dra-gpu+pod-resources")) << "split into its modules";
  EXPECT_TRUE(has("gpu-node-supervisor/gkm-agent", "get")) << by_agent.dump();
  EXPECT_FALSE(has("gpu-node-supervisor/gkm-agent", "list"));
  EXPECT_TRUE(has("gpu-node-supervisor", "create")) << by_agent.dump();

  // A module that joins once the informer has listed makes it list (and watch) again, in every
  // holder's name: what a module is recorded calling does not depend on when it joined.
  const auto lists = from_gpu->GetStats().lists;
  auto late = InformerRegistry::View(root, "gkm-controller")->Acquire(spec);
  EXPECT_EQ(late.get(), from_gpu.get());
  auto late_calls = [&](const char* verb) {
    const auto list = server_->Call("GET", "/_sim/stats").Json().at("callsByAgent").value(
        "gpu-node-supervisor/gkm-controller", json::array());
    return std::find(list.begin(), list.end(), call(verb)) != list.end();
  };
  ASSERT_TRUE(h_.RunUntil([&] { return late_calls("list") && late_calls("watch") && from_gpu->Synced(); }));
  EXPECT_EQ(from_gpu->GetStats().lists, lists + 1);
  late.reset();

  // A holder that lets go is no longer named; the informer lives while another holds it.
  from_pods.reset();
  EXPECT_EQ(from_gpu->Holders(), "dra-gpu");
  EXPECT_EQ(root->Active(), 1u);
  from_gpu.reset();
  EXPECT_EQ(root->Active(), 0u);
}

TEST_F(InformerTest, AListPastItsDeadlineFailsAndIsRetried) {
  // The server holds every answer 800 ms; a list may take 300: each attempt fails (counted, no
  // cache, not synced) until the server answers in time again.
  InformerOptions options;
  options.backoff = BackoffPolicy{std::chrono::milliseconds(20), std::chrono::milliseconds(200), 2.0, 0.5};
  options.list_deadline = std::chrono::milliseconds(300);
  InformerRegistry registry(client_, h_.bus, h_.loop.Io(), h_.metrics, gns::test::QuietLogger("kube-test"), options);
  server_->SetResponseDelay(std::chrono::milliseconds(800));
  const auto start = std::chrono::steady_clock::now();
  informer_ = registry.Acquire(InformerSpec{nodes_.Collection(), "", ""});
  ASSERT_TRUE(h_.RunUntil([&] { return informer_->GetStats().errors >= 1; }, std::chrono::seconds(5)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(800));
  EXPECT_FALSE(informer_->Synced());
  EXPECT_EQ(informer_->Size(), 0u);
  server_->SetResponseDelay(std::chrono::milliseconds(0));
  ASSERT_TRUE(h_.RunUntil([&] { return informer_->Synced(); }));
  EXPECT_EQ(informer_->GetStats().lists, 1u);
  ExpectConverged();
  informer_.reset();
}

TEST_F(InformerTest, AnInformerDroppedWhileItsListIsInFlightIsNeverResumed) {
  // Its list answers after the informer is gone: the answer must reach nothing of it (ASan
  // reports a use after free otherwise), and nothing is published for it.
  server_->SetResponseDelay(std::chrono::milliseconds(400));
  auto informer = registry_->Acquire(InformerSpec{nodes_.Collection(), "", ""});
  const std::string key = informer->Key();
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(100));
  ASSERT_EQ(client_->GetStats().requests, 0u);  // the list is still in flight
  informer.reset();
  const auto answered = [&] {
    return h_.metrics.Counter("gpu_node_supervisor_kube_requests_total", "", {{"verb", "list"}, {"code", "200"}})
               .Value() >= 2;  // 10 nodes in pages of 7
  };
  ASSERT_TRUE(h_.RunUntil(answered, std::chrono::seconds(5)));
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(200));
  EXPECT_TRUE(events_.empty());
  EXPECT_EQ(h_.bus.LatestByKey<InformerSynced>().count(key), 0u);
  EXPECT_TRUE(server_->OpenWatches().empty());
  server_->SetResponseDelay(std::chrono::milliseconds(0));
}

TEST_F(InformerTest, AnInformerDroppedBeforeItsRunStartedNeverRuns) {
  // Acquire starts the run, which co_spawn begins one loop turn later; dropped before that turn,
  // the run must not begin at all (it would read the freed informer: ASan reports a use after
  // free), and no list is sent.
  auto informer = registry_->Acquire(InformerSpec{nodes_.Collection(), "", ""});
  const std::string key = informer->Key();
  informer.reset();
  h_.RunUntil([] { return false; }, std::chrono::milliseconds(300));
  EXPECT_EQ(client_->GetStats().requests, 0u);
  EXPECT_TRUE(events_.empty());
  EXPECT_EQ(h_.bus.LatestByKey<InformerSynced>().count(key), 0u);
}

}  // namespace
}  // namespace gns::kube
