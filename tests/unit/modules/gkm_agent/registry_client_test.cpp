// The OCI registry client against a real registry (Debian's docker-registry over TLS on
// loopback), with tools/sim/registry_proxy.py in front where the test needs bearer auth, 5xx
// answers, a hang or a transfer cut in the middle.
#include "modules/gkm_agent/registry_client.hpp"
#include "modules/gkm_agent/extract.hpp"
#include "registry_fixture.hpp"
#include "support/loop_harness.hpp"

#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <map>
#include <thread>

namespace gns::gkm {
namespace {

using test::TestProxy;
using test::TestRegistry;

std::shared_ptr<spdlog::logger> Logger() {
  static auto logger = std::make_shared<spdlog::logger>("gkm-test", std::make_shared<spdlog::sinks::null_sink_mt>());
  return logger;
}

class RegistryClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(gns::test::MakeTempDir("gkm-registry"));
    registry_ = new TestRegistry(*dir_);
  }
  static void TearDownTestSuite() {
    delete registry_;
    std::error_code ec;
    std::filesystem::remove_all(*dir_, ec);
    delete dir_;
  }

  void SetUp() override {
    work_ = gns::test::MakeTempDir("gkm-pull");
    options_.ca_pem = registry_->CaPem();
    options_.system_roots = false;
    options_.retry_delay = std::chrono::milliseconds(10);
    options_.request_timeout = std::chrono::milliseconds(5000);
  }
  void TearDown() override {
    h_.Drain();
    std::error_code ec;
    std::filesystem::remove_all(work_, ec);
  }

  PullResult Pull(const std::string& image, const std::string& digest = {},
                  std::optional<Credentials> credentials = std::nullopt) {
    RegistryClient client(h_.loop, h_.pool, Logger(), options_);
    std::optional<PullResult> result;
    client.Pull(PullRequest{ImageRef::Parse(image), digest, std::move(credentials), work_.string(), {}, 0},
                [&](PullResult r) { result = std::move(r); });
    EXPECT_TRUE(h_.RunUntil([&] { return result.has_value(); }, std::chrono::seconds(60)));
    return result.value_or(PullResult{"NoAnswer", "no answer", {}, {}, {}, {}, 0, {}});
  }

  // A pull that extracts the layers into work_/tree while they stream.
  PullResult PullExtracting(const std::string& image, uint64_t max_bytes = 1ull << 30) {
    RegistryClient client(h_.loop, h_.pool, Logger(), options_);
    std::optional<PullResult> result;
    client.Pull(PullRequest{ImageRef::Parse(image), {}, std::nullopt, work_.string(), Tree().string(), max_bytes},
                [&](PullResult r) { result = std::move(r); });
    EXPECT_TRUE(h_.RunUntil([&] { return result.has_value(); }, std::chrono::seconds(60)));
    return result.value_or(PullResult{"NoAnswer", "no answer", {}, {}, {}, {}, 0, {}});
  }
  std::filesystem::path Tree() const { return work_ / "tree"; }

  // Every file, directory and link under `root`: relative path -> content (or link target).
  static std::map<std::string, std::string> Listing(const std::filesystem::path& root) {
    std::map<std::string, std::string> out;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
      const std::string rel = std::filesystem::relative(e.path(), root).string();
      if (e.is_symlink()) {
        out[rel] = "-> " + std::filesystem::read_symlink(e.path()).string();
      } else if (e.is_regular_file()) {
        out[rel] = test::ReadText(e.path());
      } else {
        out[rel] = "<dir>";
      }
    }
    return out;
  }

  static std::string FileDigest(const std::string& path) { return Sha256Digest(test::ReadText(path)); }

  static std::filesystem::path* dir_;
  static TestRegistry* registry_;
  gns::test::LoopHarness h_;
  std::filesystem::path work_;
  RegistryOptions options_;
};

std::filesystem::path* RegistryClientTest::dir_ = nullptr;
TestRegistry* RegistryClientTest::registry_ = nullptr;

TEST_F(RegistryClientTest, ResolvesATagAndVerifiesEveryByte) {
  const auto pushed = registry_->Push("caches/tagged", "v1", {"--triton", "80,90"});
  const auto r = Pull(registry_->Host() + "/caches/tagged:v1");
  ASSERT_TRUE(r.Ok()) << r.reason << ": " << r.error;
  EXPECT_EQ(r.digest, pushed["manifest"]);
  ASSERT_EQ(r.layer_files.size(), 1u);
  EXPECT_EQ(FileDigest(r.layer_files[0]), pushed["layer"]);
  EXPECT_EQ(r.config["os"], "linux");
  EXPECT_GE(r.bytes_pulled, pushed["layerSize"].get<uint64_t>());
}

TEST_F(RegistryClientTest, PullsAResolvedDigestThroughAnImageIndex) {
  const auto pushed = registry_->Push("caches/indexed", "v1", {"--triton", "90", "--index", "--gzip"});
  // Pinned by the operator's resolvedDigest: the index, from which this node's platform
  // (linux/amd64, listed second) is chosen.
  const auto r = Pull(registry_->Host() + "/caches/indexed:v1", pushed["index"]);
  ASSERT_TRUE(r.Ok()) << r.reason << ": " << r.error;
  EXPECT_EQ(r.digest, pushed["index"]);
  ASSERT_EQ(r.layer_files.size(), 1u);
  EXPECT_EQ(FileDigest(r.layer_files[0]), pushed["layer"]);
  EXPECT_EQ(r.layer_media_types[0], "application/vnd.oci.image.layer.v1.tar+gzip");
}

TEST_F(RegistryClientTest, ATamperedBlobIsADigestMismatch) {
  const auto pushed = registry_->Push("caches/tampered", "v1", {"--triton", "90"});
  const auto blob = registry_->BlobData(pushed["layer"]);
  std::string bytes = test::ReadText(blob);
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() / 2] ^= 0x5a;  // same size, other content
  std::ofstream(blob, std::ios::binary | std::ios::trunc) << bytes;
  const auto r = Pull(registry_->Host() + "/caches/tampered:v1");
  EXPECT_EQ(r.reason, "DigestMismatch") << r.error;
  EXPECT_NE(r.error.find(pushed["layer"].get<std::string>()), std::string::npos) << r.error;
}

TEST_F(RegistryClientTest, AManifestLyingAboutALayerSizeIsASizeMismatch) {
  registry_->Push("caches/liar", "v1", {"--triton", "90", "--lie-size", "100"});
  const auto r = Pull(registry_->Host() + "/caches/liar:v1");
  EXPECT_EQ(r.reason, "SizeMismatch") << r.error;
  EXPECT_NE(r.error.find("the manifest says 100"), std::string::npos) << r.error;
}

TEST_F(RegistryClientTest, AWrongResolvedDigestIsRefused) {
  registry_->Push("caches/pinned", "v1", {"--triton", "90"});
  const std::string other = Sha256Digest("not this manifest");
  const auto r = Pull(registry_->Host() + "/caches/pinned:v1", other);
  EXPECT_EQ(r.reason, "NotFound") << r.error;
}

TEST_F(RegistryClientTest, AnImageOverTheSizeLimitIsRefusedBeforeItsLayersAreFetched) {
  const auto pushed = registry_->Push("caches/big", "v1", {"--triton", "90", "--random-bytes", "300000"});
  options_.max_image_bytes = 100000;
  const auto r = Pull(registry_->Host() + "/caches/big:v1");
  EXPECT_EQ(r.reason, "TooLarge") << r.error;
  EXPECT_LT(r.bytes_pulled, 100000u);
}

TEST_F(RegistryClientTest, FiveHundredsAreRetriedThenReported) {
  const auto pushed = registry_->Push("caches/flaky", "v1", {"--triton", "90"});
  {
    TestProxy proxy(*registry_, {"--fail-first", "2"});
    const auto r = Pull(proxy.Host() + "/caches/flaky:v1");
    ASSERT_TRUE(r.Ok()) << r.reason << ": " << r.error;
    EXPECT_EQ(r.digest, pushed["manifest"]);
  }
  TestProxy proxy(*registry_, {"--fail-first", "1000"});
  const auto r = Pull(proxy.Host() + "/caches/flaky:v1");
  EXPECT_EQ(r.reason, "RegistryUnavailable") << r.error;
  EXPECT_NE(r.error.find("HTTP 503"), std::string::npos) << r.error;
}

TEST_F(RegistryClientTest, ARegistryThatHangsTimesOut) {
  registry_->Push("caches/hang", "v1", {"--triton", "90"});
  TestProxy proxy(*registry_, {"--hang"});
  options_.request_timeout = std::chrono::milliseconds(300);
  options_.max_attempts = 2;
  const auto r = Pull(proxy.Host() + "/caches/hang:v1");
  EXPECT_EQ(r.reason, "RegistryUnavailable") << r.error;
  EXPECT_NE(r.error.find("deadline exceeded"), std::string::npos) << r.error;
}

TEST_F(RegistryClientTest, ABrokenTransferResumesWhereItStopped) {
  const auto pushed = registry_->Push("caches/cut", "v1", {"--triton", "90", "--random-bytes", "400000"});
  TestProxy proxy(*registry_, {"--cut-blob-after", "150000"});
  options_.chunk_bytes = 64 * 1024;
  const auto r = Pull(proxy.Host() + "/caches/cut:v1");
  ASSERT_TRUE(r.Ok()) << r.reason << ": " << r.error;
  EXPECT_EQ(FileDigest(r.layer_files[0]), pushed["layer"]);
  // Resumed, not restarted: the cut part was not fetched twice.
  const uint64_t layer = pushed["layerSize"];
  EXPECT_LT(r.bytes_pulled, layer + 100000) << "bytes pulled " << r.bytes_pulled << " for a layer of " << layer;
}

TEST_F(RegistryClientTest, BearerTokensComeFromTheChallengedRealmWithThePullSecret) {
  const auto pushed = registry_->Push("caches/private", "v1", {"--triton", "90"});
  TestProxy proxy(*registry_, {"--token", "puller:s3cret"});
  const auto denied = Pull(proxy.Host() + "/caches/private:v1");
  EXPECT_EQ(denied.reason, "Unauthorized") << denied.error;
  const auto wrong = Pull(proxy.Host() + "/caches/private:v1", {}, Credentials{"puller", "wrong", {}});
  EXPECT_EQ(wrong.reason, "Unauthorized") << wrong.error;
  const auto r = Pull(proxy.Host() + "/caches/private:v1", {}, Credentials{"puller", "s3cret", {}});
  ASSERT_TRUE(r.Ok()) << r.reason << ": " << r.error;
  EXPECT_EQ(r.digest, pushed["manifest"]);
}

TEST_F(RegistryClientTest, AnUntrustedCertificateIsRefused) {
  registry_->Push("caches/untrusted", "v1", {"--triton", "90"});
  options_.ca_pem.clear();
  options_.system_roots = true;
  options_.max_attempts = 1;
  const auto r = Pull(registry_->Host() + "/caches/untrusted:v1");
  EXPECT_EQ(r.reason, "RegistryUnavailable") << r.error;
  EXPECT_NE(r.error.find("TLS"), std::string::npos) << r.error;
}

// The TLS context lives only while the client holds a connection (see Context()): a second pull
// by the same client, after the first has ended and closed its connections, makes a new one.
TEST_F(RegistryClientTest, ASecondPullAfterTheFirstEndedConnectsAgain) {
  registry_->Push("caches/twice", "v1", {"--triton", "90"});
  RegistryClient client(h_.loop, h_.pool, Logger(), options_);
  for (int round = 0; round < 2; ++round) {
    std::filesystem::create_directories(work_ / std::to_string(round));
    std::optional<PullResult> result;
    client.Pull(PullRequest{ImageRef::Parse(registry_->Host() + "/caches/twice:v1"), {}, std::nullopt,
                            (work_ / std::to_string(round)).string(), {}, 0},
                [&](PullResult r) { result = std::move(r); });
    ASSERT_TRUE(h_.RunUntil([&] { return result.has_value(); }, std::chrono::seconds(60))) << "round " << round;
    EXPECT_TRUE(result->Ok()) << "round " << round << ": " << result->reason << ": " << result->error;
  }
}

// The context is made lazily, but a registry CA that does not parse is still refused at once.
TEST_F(RegistryClientTest, ARegistryCaThatDoesNotParseIsRefusedWhenTheClientIsMade) {
  options_.ca_pem = "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n";
  EXPECT_THROW(RegistryClient(h_.loop, h_.pool, Logger(), options_), std::exception);
}

// --- extraction while the layers stream

TEST_F(RegistryClientTest, LayersExtractedWhileTheyStreamMatchTheLayerFiles) {
  registry_->Push("caches/streamed", "v1", {"--triton", "80,90", "--gzip", "--random-bytes", "300000"});
  const auto image = registry_->Host() + "/caches/streamed:v1";
  const auto files = Pull(image);
  ASSERT_TRUE(files.Ok()) << files.reason << ": " << files.error;
  const auto reference = work_ / "reference";
  const auto stats = ExtractLayers(files.layer_files, reference.string(), 1ull << 30);
  for (const auto& f : files.layer_files) std::filesystem::remove(f);

  options_.chunk_bytes = 16 * 1024;  // many chunks, each one handed to the extraction
  const auto r = PullExtracting(image);
  ASSERT_TRUE(r.Ok()) << r.reason << ": " << r.error;
  EXPECT_EQ(r.digest, files.digest);
  EXPECT_TRUE(r.layer_files.empty());
  for (const auto& e : std::filesystem::directory_iterator(work_)) {
    EXPECT_FALSE(e.path().filename().string().rfind("layer-", 0) == 0) << "a layer file was written: " << e.path();
  }
  EXPECT_EQ(r.extracted.bytes, stats.bytes);
  EXPECT_EQ(r.extracted.entries, stats.entries);
  const auto listing = Listing(Tree());
  EXPECT_EQ(listing, Listing(reference));
  EXPECT_EQ(listing.at("blob/random.bin").size(), 300000u);
}

TEST_F(RegistryClientTest, ATamperedLayerIsADigestMismatchWhileExtractingToo) {
  // gzip: the flipped byte also breaks the archive; the digest is what the reason names.
  const auto pushed = registry_->Push("caches/tampered-gz", "v1", {"--triton", "90", "--gzip"});
  const auto blob = registry_->BlobData(pushed["layer"]);
  std::string bytes = test::ReadText(blob);
  bytes[bytes.size() / 2] ^= 0x5a;
  std::ofstream(blob, std::ios::binary | std::ios::trunc) << bytes;
  const auto r = PullExtracting(registry_->Host() + "/caches/tampered-gz:v1");
  EXPECT_EQ(r.reason, "DigestMismatch") << r.error;
  EXPECT_NE(r.error.find(pushed["layer"].get<std::string>()), std::string::npos) << r.error;
}

TEST_F(RegistryClientTest, UnsafeOrOversizedLayersAreRefusedWhileStreaming) {
  registry_->Push("caches/evil-stream", "v1", {"--triton", "90", "--evil", "dotdot"});
  const auto evil = PullExtracting(registry_->Host() + "/caches/evil-stream:v1");
  EXPECT_EQ(evil.reason, "UnsafeArchive") << evil.error;
  EXPECT_NE(evil.error.find("layer 0 entry"), std::string::npos) << evil.error;
  // Nothing landed beside the tree (the entry climbs out by one level).
  for (const auto& e : std::filesystem::directory_iterator(work_)) {
    EXPECT_EQ(e.path().filename(), "tree") << "written outside the tree: " << e.path();
  }
  std::filesystem::remove_all(Tree());

  registry_->Push("caches/big-stream", "v1", {"--triton", "90", "--random-bytes", "300000"});
  const auto big = PullExtracting(registry_->Host() + "/caches/big-stream:v1", 100000);
  EXPECT_EQ(big.reason, "TooLarge") << big.error;
  EXPECT_NE(big.error.find("100000 bytes"), std::string::npos) << big.error;
}

TEST_F(RegistryClientTest, ABrokenTransferResumesIntoTheExtractionOrStartsOverWhereRangeIsIgnored) {
  const auto pushed = registry_->Push("caches/cut-stream", "v1", {"--triton", "90", "--random-bytes", "400000"});
  const uint64_t layer = pushed["layerSize"];
  options_.chunk_bytes = 64 * 1024;
  {
    TestProxy proxy(*registry_, {"--cut-blob-after", "150000"});
    const auto r = PullExtracting(proxy.Host() + "/caches/cut-stream:v1");
    ASSERT_TRUE(r.Ok()) << r.reason << ": " << r.error;
    EXPECT_LT(r.bytes_pulled, layer + 100000) << "resumed, not restarted";
    EXPECT_EQ(std::filesystem::file_size(Tree() / "blob/random.bin"), 400000u);
  }
  std::filesystem::remove_all(Tree());
  TestProxy proxy(*registry_, {"--cut-blob-after", "150000", "--ignore-range"});
  const auto r = PullExtracting(proxy.Host() + "/caches/cut-stream:v1");
  ASSERT_TRUE(r.Ok()) << r.reason << ": " << r.error;
  // The whole blob came again; the first 150000 bytes of it were skipped, not extracted twice.
  EXPECT_GE(r.bytes_pulled, layer + 150000);
  EXPECT_EQ(std::filesystem::file_size(Tree() / "blob/random.bin"), 400000u);
}

TEST_F(RegistryClientTest, APullPastItsDeadlineIsHaltedAloneMidLayer) {
  registry_->Push("caches/slow", "v1", {"--triton", "90", "--random-bytes", "400000"});
  const auto good = registry_->Push("caches/beside", "v1", {"--triton", "90"});
  TestProxy proxy(*registry_, {"--stall-blob-after", "150000"});
  options_.chunk_bytes = 16 * 1024;
  options_.request_timeout = std::chrono::milliseconds(120000);  // a stalled read alone would wait this long
  RegistryClient client(h_.loop, h_.pool, Logger(), options_);
  std::optional<PullResult> stalled, beside;
  PullRequest slow{ImageRef::Parse(proxy.Host() + "/caches/slow:v1"), {}, std::nullopt, work_.string(),
                   Tree().string(), 1ull << 30};
  slow.deadline = std::chrono::milliseconds(3000);
  const auto started = std::chrono::steady_clock::now();
  client.Pull(std::move(slow), [&](PullResult r) { stalled = std::move(r); });
  // Another pull on the same client, beside it, is not touched by its halt.
  client.Pull(PullRequest{ImageRef::Parse(registry_->Host() + "/caches/beside:v1"), {}, std::nullopt, work_.string(),
                          (work_ / "beside").string(), 1ull << 30, std::chrono::milliseconds(60000)},
              [&](PullResult r) { beside = std::move(r); });
  ASSERT_TRUE(h_.RunUntil([&] { return stalled.has_value() && beside.has_value(); }, std::chrono::seconds(60)));
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(stalled->reason, "DeadlineExceeded") << stalled->error;
  EXPECT_NE(stalled->error.find("from registry " + proxy.Host()), std::string::npos) << stalled->error;
  EXPECT_NE(stalled->error.find("deadline of 3 s"), std::string::npos) << stalled->error;
  EXPECT_GE(took, std::chrono::milliseconds(3000));
  EXPECT_LT(took, std::chrono::seconds(30));
  ASSERT_TRUE(beside->Ok()) << beside->reason << ": " << beside->error;
  EXPECT_EQ(beside->digest, good["manifest"]);
  // The halted extraction writes no more: what it left can be removed for good.
  std::filesystem::remove_all(Tree());
  EXPECT_FALSE(h_.RunUntil([&] { return std::filesystem::exists(Tree()); }, std::chrono::milliseconds(500)));
}

TEST_F(RegistryClientTest, StoppingTheClientInTheMiddleOfALayerEndsTheExtraction) {
  registry_->Push("caches/stalled", "v1", {"--triton", "90", "--random-bytes", "400000"});
  TestProxy proxy(*registry_, {"--stall-blob-after", "150000"});
  options_.chunk_bytes = 16 * 1024;
  auto client = std::make_unique<RegistryClient>(h_.loop, h_.pool, Logger(), options_);
  std::optional<PullResult> result;
  client->Pull(PullRequest{ImageRef::Parse(proxy.Host() + "/caches/stalled:v1"), {}, std::nullopt, work_.string(),
                           Tree().string(), 1ull << 30},
               [&](PullResult r) { result = std::move(r); });
  // The extraction has started writing the layer's big file when the transfer stalls.
  ASSERT_TRUE(h_.RunUntil([&] { return std::filesystem::exists(Tree() / "blob/random.bin"); },
                          std::chrono::seconds(30)));
  client->Shutdown();
  ASSERT_TRUE(h_.RunUntil([&] { return result.has_value(); }, std::chrono::seconds(30)));
  EXPECT_EQ(result->reason, "Stopped") << result->error;
  // The extraction gave its pool thread back: both of the pool's threads run at once again
  // (each job waits, up to 10 s, until the other has started).
  std::atomic<int> running{0};
  int met = 0;
  for (int i = 0; i < 2; ++i) {
    h_.pool.Run(
        [&running] {
          ++running;
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (running.load() < 2 && std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a rendezvous, not a sync on time
          }
          return running.load() >= 2;
        },
        [&met](bool both, std::exception_ptr) { met += both ? 1 : 0; });
  }
  ASSERT_TRUE(h_.RunUntil([&] { return running.load() == 2 && met == 2; }, std::chrono::seconds(20)));
  client.reset();
}

}  // namespace
}  // namespace gns::gkm
