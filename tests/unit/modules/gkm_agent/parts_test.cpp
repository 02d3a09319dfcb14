// The gkm-agent's parts alone: image references, pull-secret credentials, manifests, auth
// challenges, extraction of real tar layers (hostile ones included) and the per-GPU verdict
// from Triton cache metadata; the on-disk layout, its migration (interrupted too) and the status
// object names.
#include "modules/gkm_agent/compat.hpp"
#include "modules/gkm_agent/extract.hpp"
#include "modules/gkm_agent/image.hpp"
#include "modules/gkm_agent/layout.hpp"
#include "modules/gkm_agent/registry_client.hpp"
#include "registry_fixture.hpp"

#include <sys/stat.h>

#include <fstream>

namespace gns::gkm {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kDigest = "sha256:" + std::string(64, 'a');

TEST(ImageRefTest, ParsesTheForms) {
  auto r = ImageRef::Parse("quay.io/example/cache-vllm-llama2:latest");
  EXPECT_EQ(r.registry, "quay.io");
  EXPECT_EQ(r.repository, "example/cache-vllm-llama2");
  EXPECT_EQ(r.tag, "latest");
  r = ImageRef::Parse("127.0.0.1:5000/caches/demo@" + kDigest);
  EXPECT_EQ(r.registry, "127.0.0.1:5000");
  EXPECT_EQ(r.Reference(), kDigest);
  EXPECT_TRUE(r.tag.empty());
  r = ImageRef::Parse("ubuntu");
  EXPECT_EQ(r.Host(), "registry-1.docker.io");
  EXPECT_EQ(r.repository, "library/ubuntu");
  EXPECT_EQ(r.tag, "latest");
  r = ImageRef::Parse("localhost/a/b:v1.2@" + kDigest);
  EXPECT_EQ(r.registry, "localhost");
  EXPECT_EQ(r.tag, "v1.2");
  EXPECT_EQ(r.digest, kDigest);
}

TEST(ImageRefTest, RefusesBadReferences) {
  for (const std::string& bad : std::vector<std::string>{"", "quay.io/UPPER/x", "quay.io/a//b", "x@sha256:abc", "x@md5:" + std::string(32, 'a'),
                                "quay.io/a:", "quay.io/a:-x"}) {
    EXPECT_THROW(ImageRef::Parse(bad), std::invalid_argument) << bad;
  }
}

TEST(CredentialsTest, ReadsDockerConfigJson) {
  const json config = {{"auths",
                        {{"https://index.docker.io/v1/", {{"auth", "dXNlcjpwYXNz"}}},  // user:pass
                         {"127.0.0.1:5000", {{"username", "u"}, {"password", "p:w"}}}}}};
  auto c = CredentialsFor(config, "docker.io");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->username, "user");
  EXPECT_EQ(c->password, "pass");
  c = CredentialsFor(config, "127.0.0.1:5000");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->password, "p:w");
  EXPECT_FALSE(CredentialsFor(config, "quay.io"));
  EXPECT_THROW(CredentialsFor(json{{"auths", {{"quay.io", {{"auth", "bm9jb2xvbg=="}}}}}}, "quay.io"),
               std::invalid_argument);  // "nocolon"
  EXPECT_THROW(CredentialsFor(json{{"auths", {{"quay.io", 5}}}}, "quay.io"), std::invalid_argument);
  EXPECT_THROW(CredentialsFor(json::array(), "quay.io"), std::invalid_argument);
}

TEST(ManifestTest, ParsesManifestsAndIndexes) {
  const json manifest = {{"schemaVersion", 2},
                         {"mediaType", kOciManifest},
                         {"config", {{"mediaType", "x"}, {"digest", kDigest}, {"size", 10}}},
                         {"layers", {{{"mediaType", "y"}, {"digest", kDigest}, {"size", 20}}}}};
  const auto m = ParseManifest(manifest.dump(), "application/vnd.oci.image.manifest.v1+json");
  EXPECT_FALSE(m.is_index);
  ASSERT_EQ(m.layers.size(), 1u);
  EXPECT_EQ(m.layers[0].size, 20u);
  const json index = {{"schemaVersion", 2},
                      {"manifests",
                       {{{"digest", kDigest}, {"size", 5}, {"platform", {{"os", "linux"}, {"architecture", "arm64"}}}},
                        {{"digest", "sha256:" + std::string(64, 'b')},
                         {"size", 6},
                         {"platform", {{"os", "linux"}, {"architecture", "amd64"}}}}}}};
  const auto i = ParseManifest(index.dump(), std::string(kDockerList));
  ASSERT_TRUE(i.is_index);
  EXPECT_EQ(PickManifest(i, "linux", "amd64")->size, 6u);
  EXPECT_EQ(PickManifest(i, "linux", "s390x")->size, 5u);  // none for us: the first
}

TEST(ManifestTest, RefusesMalformedOnes) {
  auto bad = [](const std::string& body, const std::string& type = "") {
    try {
      ParseManifest(body, type);
    } catch (const PullError& e) {
      EXPECT_EQ(e.reason, "BadManifest");
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted " << body;
    return std::string();
  };
  EXPECT_NE(bad("not json").find("not a JSON object"), std::string::npos);
  EXPECT_NE(bad(R"({"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"digest":"sha256:1","size":1},"layers":[]})")
                .find("config: digest"),
            std::string::npos);
  EXPECT_NE(bad(json{{"config", {{"digest", kDigest}, {"size", -1}}}, {"layers", json::array()}}.dump()).find("size"),
            std::string::npos);
  EXPECT_NE(bad(json{{"mediaType", kOciIndex}}.dump(), std::string(kOciManifest)).find("disagrees"), std::string::npos);
  EXPECT_NE(bad(json{{"mediaType", "application/vnd.docker.distribution.manifest.v1+json"}}.dump()).find("unsupported"),
            std::string::npos);
}

TEST(ChallengeTest, ParsesBearerAndBasic) {
  auto c = ParseChallenge(R"(Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull")");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->scheme, "bearer");
  EXPECT_EQ(c->Param("realm"), "https://auth.example/token");
  EXPECT_EQ(c->Param("scope"), "repository:a/b:pull");
  c = ParseChallenge(R"(Basic realm="Registry Realm")");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->scheme, "basic");
  EXPECT_EQ(c->Param("realm"), "Registry Realm");
  EXPECT_FALSE(ParseChallenge(R"(Bearer realm="unterminated)"));
  EXPECT_FALSE(ParseChallenge(""));
}

TEST(SafePathTest, NormalisesAndRefusesEscapes) {
  EXPECT_EQ(SafeRelativePath("./a/b/../c"), "a/c");
  EXPECT_EQ(SafeRelativePath("a//b/"), "a/b");
  EXPECT_EQ(SafeRelativePath("."), "");
  EXPECT_EQ(SafeRelativePath("../a"), "");
  EXPECT_EQ(SafeRelativePath("a/../../b"), "");
  EXPECT_EQ(SafeRelativePath("/etc/passwd"), "");
}

// Real tar layers made by Python's tarfile, hostile entries included.
class ExtractTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = gns::test::MakeTempDir("gkm-extract"); }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // `script` adds entries to the TarFile `t`; helper f(name, data) adds a file.
  std::string Tar(const std::string& name, const std::string& script, bool gzip = false) {
    const std::string path = (dir_ / name).string();
    const std::string program =
        "import tarfile,io,sys\n"
        "t=tarfile.open(sys.argv[1],'w:gz' if sys.argv[2]=='1' else 'w')\n"
        "def f(n,d=b'x'):\n"
        "  i=tarfile.TarInfo(n);i.size=len(d);t.addfile(i,io.BytesIO(d))\n"
        "def l(n,target,kind=tarfile.SYMTYPE):\n"
        "  i=tarfile.TarInfo(n);i.type=kind;i.linkname=target;t.addfile(i)\n"
        "def d(n):\n"
        "  i=tarfile.TarInfo(n);i.type=tarfile.DIRTYPE;i.mode=0o777;t.addfile(i)\n" +
        script + "\nt.close()\n";
    const auto [rc, out] = gns::test::RunToCompletion({"/usr/bin/python3", "-c", program, path, gzip ? "1" : "0"});
    EXPECT_EQ(rc, 0) << out;
    return path;
  }

  std::string Refused(const std::vector<std::string>& layers, const std::string& reason = "UnsafeArchive") {
    const std::string dest = (dir_ / "out").string();
    fs::remove_all(dest);
    try {
      ExtractLayers(layers, dest, 1 << 20);
    } catch (const PullError& e) {
      EXPECT_EQ(e.reason, reason) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "extracted";
    return {};
  }

  fs::path dir_;
};

TEST_F(ExtractTest, ExtractsLayersInOrderWithWhiteouts) {
  const auto one = Tar("one.tar", "d('cache')\nf('cache/a.json',b'{}')\nf('cache/gone',b'1')\nl('cache/link','a.json')\n"
                                  "l('cache/hard','cache/a.json',tarfile.LNKTYPE)\nf('./cache/sub/x.bin',b'12345')",
                       /*gzip=*/true);
  const auto two = Tar("two.tar", "f('cache/.wh.gone',b'')\nf('cache/b.json',b'[]')");
  const std::string dest = (dir_ / "out").string();
  const auto stats = ExtractLayers({one, two}, dest, 1 << 20);
  EXPECT_EQ(test::ReadText(dest + "/cache/a.json"), "{}");
  EXPECT_EQ(test::ReadText(dest + "/cache/sub/x.bin"), "12345");
  EXPECT_EQ(test::ReadText(dest + "/cache/b.json"), "[]");
  EXPECT_FALSE(fs::exists(dest + "/cache/gone"));
  EXPECT_EQ(fs::read_symlink(dest + "/cache/link"), "a.json");
  EXPECT_EQ(test::ReadText(dest + "/cache/hard"), "{}");
  struct stat st {};
  ASSERT_EQ(::stat((dest + "/cache").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);  // the archive's 0777 is not kept
  EXPECT_GE(stats.bytes, 9u);
}

TEST_F(ExtractTest, RefusesPathsThatClimbOut) {
  EXPECT_NE(Refused({Tar("dotdot.tar", "f('cache/../../evil.txt')")}).find("\"..\" component refused"), std::string::npos);
  EXPECT_NE(Refused({Tar("abs.tar", "f('/tmp/evil.txt')")}).find("absolute path refused"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_.parent_path() / "evil.txt"));
}

TEST_F(ExtractTest, RefusesLinksOutOfTheRoot) {
  EXPECT_NE(Refused({Tar("sym.tar", "l('cache/escape','../../etc')")}).find("points outside the cache root"),
            std::string::npos);
  EXPECT_NE(Refused({Tar("symabs.tar", "l('cache/escape','/etc/passwd')")}).find("points outside"), std::string::npos);
  EXPECT_NE(Refused({Tar("hard.tar", "l('cache/hard','../outside',tarfile.LNKTYPE)")}).find("hard link"),
            std::string::npos);
  // A link that is fine by itself, then a file written through it: with SECURE_SYMLINKS and
  // UNLINK, libarchive replaces the link by a real directory instead of following it.
  const std::string dest = (dir_ / "through").string();
  ExtractLayers({Tar("through.tar", "d('cache')\nl('cache/dir','..')\nf('cache/dir/x',b'in')")}, dest, 1 << 20);
  EXPECT_TRUE(fs::is_directory(fs::symlink_status(dest + "/cache/dir")));
  EXPECT_EQ(test::ReadText(dest + "/cache/dir/x"), "in");
  EXPECT_FALSE(fs::exists(dest + "/x"));
}

TEST_F(ExtractTest, RefusesDevicesAndOversizedCaches) {
  Refused({Tar("fifo.tar", "i=tarfile.TarInfo('cache/fifo');i.type=tarfile.FIFOTYPE;t.addfile(i)")});
  const auto big = Tar("big.tar", "f('cache/big', b'x'*(2<<20))");
  EXPECT_NE(Refused({big}, "TooLarge").find("would exceed"), std::string::npos);
  std::ofstream(dir_ / "garbage.tar") << "this is not a tar archive at all, not even close";
  Refused({(dir_ / "garbage.tar").string()}, "BadArchive");
}

TEST_F(ExtractTest, InstallReplacesAtomically) {
  const std::string final_dir = (dir_ / "caches/ns/name").string();
  const auto one = Tar("a.tar", "f('v',b'1')");
  const auto two = Tar("b.tar", "f('v',b'2')");
  ExtractLayers({one}, (dir_ / "stage1").string(), 1 << 20);
  InstallDirectory((dir_ / "stage1").string(), final_dir);
  EXPECT_EQ(test::ReadText(final_dir + "/v"), "1");
  ExtractLayers({two}, (dir_ / "stage2").string(), 1 << 20);
  InstallDirectory((dir_ / "stage2").string(), final_dir);
  EXPECT_EQ(test::ReadText(final_dir + "/v"), "2");
  EXPECT_FALSE(fs::exists(dir_ / "stage2"));
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_ / "caches/ns")) ++entries;
  EXPECT_EQ(entries, 1u);  // nothing left aside
}

// --- compatibility

void WriteKernel(const fs::path& root, const std::string& arch, int ptx, const std::string& backend = "cuda") {
  const fs::path d = root / ("k" + arch + backend);
  fs::create_directories(d);
  std::ofstream(d / "add_kernel.json") << json{{"hash", "abc" + arch},
                                               {"target", {{"backend", backend}, {"arch", std::stoi(arch)}, {"warp_size", 32}}},
                                               {"ptx_version", ptx},
                                               {"num_warps", 4},
                                               {"name", "add_kernel"}}
                                              .dump();
  std::ofstream(d / "__grp__add_kernel.json") << R"({"child_paths":{}})";
  std::ofstream(d / "add_kernel.cubin") << "\x7f" "ELF";
}

TEST(CompatTest, ScansTritonMetadata) {
  const auto root = gns::test::MakeTempDir("gkm-compat");
  WriteKernel(root, "80", 80);
  WriteKernel(root, "90", 84);
  std::ofstream(root / "broken.json") << "{ not json";
  const auto kernels = ScanTritonCache(root.string());
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(kernels[0].arch, "80");
  EXPECT_EQ(kernels[1].ptx_version, 84);
  const auto empty = gns::test::MakeTempDir("gkm-compat-empty");
  try {
    ScanTritonCache(empty.string());
    ADD_FAILURE();
  } catch (const PullError& e) {
    EXPECT_EQ(e.reason, "NoCacheMetadata");
  }
  fs::remove_all(root);
  fs::remove_all(empty);
}

TEST(CompatTest, JudgesEachGpu) {
  const std::vector<TritonKernel> kernels = {{"a.json", "cuda", "80", 32, 80}, {"b.json", "cuda", "90", 32, 84}};
  const std::vector<GpuFacts> gpus = {{0, "NVIDIA H200", 9, 0}, {1, "NVIDIA A100", 8, 0}, {2, "NVIDIA L40S", 8, 9},
                                      {3, "mystery", 0, 0}};
  auto v = CheckCompatibility(kernels, gpus, 12040);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_TRUE(v[0].compatible);
  EXPECT_TRUE(v[1].compatible);
  EXPECT_FALSE(v[2].compatible);
  EXPECT_EQ(v[2].reason, "ArchitectureMismatch");
  EXPECT_EQ(v[2].message, "kernels built for sm_80, sm_90, GPU 2 (NVIDIA L40S) is sm_89 (compute capability 8.9)");
  EXPECT_EQ(v[3].reason, "UnknownGpu");
  // A driver that only knows CUDA 12.2 cannot load PTX 8.4 (sm_90) but can load PTX 8.0.
  v = CheckCompatibility(kernels, gpus, 12020);
  EXPECT_EQ(v[0].reason, "DriverTooOld");
  EXPECT_EQ(v[0].message, "kernels for sm_90 need CUDA 12.4, the driver supports CUDA 12.2");
  EXPECT_TRUE(v[1].compatible);
  v = CheckCompatibility({{"h.json", "hip", "942", 64, std::nullopt}}, gpus, 12040);
  EXPECT_EQ(v[0].reason, "BackendMismatch");
}

TEST(CompatTest, ACacheLevelReasonIsTheReasonOfMostGpus) {
  std::vector<GpuVerdict> v{{0, false, "DriverTooOld", "kernels for sm_90 need CUDA 12.5"},
                            {1, false, "ArchitectureMismatch", "GPU 1 is sm_89"},
                            {2, false, "ArchitectureMismatch", "GPU 2 is sm_89"},
                            {3, true, "", ""}};
  auto why = IncompatibleReason(v);
  EXPECT_EQ(why.reason, "ArchitectureMismatch");
  EXPECT_NE(why.message.find("need CUDA 12.5"), std::string::npos) << why.message;
  EXPECT_NE(why.message.find("GPU 2 is sm_89"), std::string::npos) << why.message;
  // A tie goes to the first by name, whatever the GPUs' order.
  v.pop_back();
  v.pop_back();
  EXPECT_EQ(IncompatibleReason(v).reason, "ArchitectureMismatch");
  std::swap(v[0], v[1]);
  EXPECT_EQ(IncompatibleReason(v).reason, "ArchitectureMismatch");
  EXPECT_EQ(IncompatibleReason({}).reason, "NoGpus");
}

TEST(CompatTest, MapsPtxToCuda) {
  EXPECT_EQ(CudaVersionForPtx(84), 12040);
  EXPECT_EQ(CudaVersionForPtx(78), 11080);
  EXPECT_EQ(CudaVersionForPtx(87), 12080);
  EXPECT_EQ(CudaVersionForPtx(42), 0);
  EXPECT_EQ(CudaVersionText(12040), "12.4");
}

// Two (cache, node) pairs never give one status object name, whatever dots and dashes.
TEST(LayoutTest, StatusObjectNamesAreUniquePerPair) {
  EXPECT_EQ(StatusObjectName("llama", "node-a"), "5.llama.node-a");
  EXPECT_NE(StatusObjectName("llama-gpu", "node1"), StatusObjectName("llama", "gpu-node1"));
  EXPECT_NE(StatusObjectName("a.b", "c"), StatusObjectName("a", "b.c"));
  EXPECT_NE(StatusObjectName("1.a", "b"), StatusObjectName("a", "1.a.b"));
  EXPECT_EQ(StatusObjectName(std::string(200, 'c'), std::string(60, 'n')), "");  // over 253
  EXPECT_EQ(CacheRelPath(true, "", "x"), "cluster/x");
  EXPECT_EQ(CacheRelPath(false, "cluster", "x"), "namespaced/cluster/x");
}

class LayoutMigrationTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = gns::test::MakeTempDir("gkm-layout"); }
  void TearDown() override { fs::remove_all(root_); }
  void Make(const std::string& dir) {
    fs::create_directories(root_ / dir);
    std::ofstream(root_ / dir / "file") << dir;
  }
  std::string Content(const std::string& dir) { return test::ReadText(root_ / dir / "file"); }
  fs::path root_;
};

// Killed while setting the old layout aside: the next start finishes, nothing is lost.
TEST_F(LayoutMigrationTest, AMigrationKilledWhileSettingAsideFinishes) {
  Make(".migrate.tmp/ml/a");  // moved before the kill
  Make("ml2/b");              // not yet
  Make(".pull-9/x");
  WantedCaches wanted;
  wanted.namespaced = {"ml/a", "ml2/b"};
  const auto report = MigrateLayout(root_.string(), wanted);
  EXPECT_EQ(report.moved.size(), 2u);
  EXPECT_EQ(Content("namespaced/ml/a"), ".migrate.tmp/ml/a");
  EXPECT_EQ(Content("namespaced/ml2/b"), "ml2/b");
  EXPECT_TRUE(fs::exists(root_ / ".layout"));
  EXPECT_FALSE(fs::exists(root_ / ".migrate.tmp"));
  EXPECT_FALSE(fs::exists(root_ / ".migrate"));
  EXPECT_FALSE(fs::exists(root_ / "ml2"));
  EXPECT_TRUE(fs::exists(root_ / ".pull-9"));  // the sweep's, not the migration's
  EXPECT_EQ(SweepLayout(root_.string(), wanted), std::vector<std::string>{".pull-9"});
}

// Killed while moving caches to their new places: the next start moves the rest; the new
// layout's directories (whose names are also namespace names) are not taken for old ones.
TEST_F(LayoutMigrationTest, AMigrationKilledWhileMovingFinishesAndLeavesTheNewLayoutAlone) {
  std::ofstream(root_ / ".layout") << "2\n";
  Make("cluster/done");  // moved before the kill
  Make(".migrate/cluster-scoped/rest");
  Make(".migrate/cluster-scoped/shared");  // claimed by both scopes: nobody's for sure
  Make(".migrate/cluster/ns-cache");       // the old layout's namespace "cluster"
  WantedCaches wanted;
  wanted.cluster = {"done", "rest", "shared"};
  wanted.namespaced = {"cluster-scoped/shared", "cluster/ns-cache"};
  const auto report = MigrateLayout(root_.string(), wanted);
  EXPECT_EQ(Content("cluster/done"), "cluster/done");
  EXPECT_EQ(Content("cluster/rest"), ".migrate/cluster-scoped/rest");
  EXPECT_EQ(Content("namespaced/cluster/ns-cache"), ".migrate/cluster/ns-cache");
  EXPECT_FALSE(fs::exists(root_ / "cluster/shared"));
  EXPECT_FALSE(fs::exists(root_ / "namespaced/cluster-scoped/shared"));
  EXPECT_FALSE(fs::exists(root_ / ".migrate"));
  ASSERT_EQ(report.removed.size(), 1u);
  EXPECT_NE(report.removed[0].find("claimed by both"), std::string::npos) << report.removed[0];
  // Run again (the next start): nothing to do.
  const auto again = MigrateLayout(root_.string(), wanted);
  EXPECT_TRUE(again.moved.empty() && again.removed.empty());
  EXPECT_EQ(Content("cluster/rest"), ".migrate/cluster-scoped/rest");
}

}  // namespace
}  // namespace gns::gkm
