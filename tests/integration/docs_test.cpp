// The operator's view of the modules cannot drift from the code: every module of the manifest
// (src/modules/manifest.cpp) has a row in the README's module table, a section in
// config/example.yaml (where each key is documented) and in config/local.yaml (what `make run`
// runs), and a README of its own; and neither config names a module the binary does not have.
#include "modules/manifest.hpp"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace gns {
namespace {

namespace fs = std::filesystem;

fs::path Source(const std::string& rel) { return fs::path(std::getenv("GNS_SOURCE_DIR")) / rel; }

std::string Read(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::set<std::string> ManifestNames() {
  std::set<std::string> names;
  for (const auto& module : ModuleManifest()) names.emplace(module.name);
  return names;
}

TEST(DocsTest, EveryModuleHasARowInTheReadmesModuleTable) {
  const std::string readme = Read(Source("README.md"));
  ASSERT_FALSE(readme.empty());
  for (const auto& name : ManifestNames()) {
    EXPECT_NE(readme.find("| `" + name + "` |"), std::string::npos) << name << " has no row in README.md's module table";
  }
}

TEST(DocsTest, EveryModuleHasASectionInBothConfigsAndNoConfigNamesAnUnknownModule) {
  const auto names = ManifestNames();
  for (const char* file : {"config/example.yaml", "config/local.yaml"}) {
    const YAML::Node config = YAML::LoadFile(Source(file).string());
    ASSERT_TRUE(config["modules"].IsMap()) << file;
    std::set<std::string> listed;
    for (const auto& entry : config["modules"]) listed.insert(entry.first.as<std::string>());
    for (const auto& name : names) EXPECT_EQ(listed.count(name), 1u) << name << " has no section in " << file;
    for (const auto& name : listed) EXPECT_EQ(names.count(name), 1u) << file << " names " << name << ", no module of the binary";
  }
}

TEST(DocsTest, EveryModuleFolderHasAReadme) {
  for (const auto& name : ManifestNames()) {
    std::string folder = name;
    for (char& c : folder) c = c == '-' ? '_' : c;
    const fs::path readme = Source("src/modules/" + folder + "/README.md");
    EXPECT_TRUE(fs::exists(readme)) << name << ": no " << readme;
  }
}

}  // namespace
}  // namespace gns
