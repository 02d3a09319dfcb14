// The site config's YAML reader against the YAML test suite's own cases (tests/data/
// yaml-test-suite, from github.com/yaml/yaml-test-suite): every input the suite marks as not
// YAML is refused with file:line:column; every valid one loads, or is refused cleanly for a
// reason the config reader has on purpose (listed below, case by case).
#include "loop/config_checks.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace gns {
namespace {

namespace fs = std::filesystem;

fs::path CasesDir() {
  const char* root = std::getenv("GNS_SOURCE_DIR");
  EXPECT_NE(root, nullptr) << "GNS_SOURCE_DIR is not set: run through ctest";
  return fs::path(root != nullptr ? root : ".") / "tests/data/yaml-test-suite/cases";
}

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Valid YAML the config reader refuses, and why: a config file is one document of maps, lists
// and scalars, so keys that are maps or lists and second documents are errors by design.
const std::map<std::string, std::string>& RefusedValidCases() {
  static const std::map<std::string, std::string> cases = {
      // Two empty keys in one map: equal keys, refused as a duplicate.
      {"2JQS", "duplicate key"},
      // A map or a list as a key (`? [a, b]`, `[a]: b`): config keys are strings.
      {"4FJ6", "map keys must be plain strings"},
      {"6BFJ", "map keys must be plain strings"},
      {"6PBE", "map keys must be plain strings"},
      {"9MMW", "map keys must be plain strings"},
      {"KK5P", "map keys must be plain strings"},
      {"LX3P", "map keys must be plain strings"},
      {"M2N8-00", "map keys must be plain strings"},
      {"M2N8-01", "map keys must be plain strings"},
      {"M5DY", "map keys must be plain strings"},
      {"Q9WF", "map keys must be plain strings"},
      {"RZP5", "map keys must be plain strings"},
      {"SBG9", "map keys must be plain strings"},
      {"V9D5", "map keys must be plain strings"},
      {"X38W", "map keys must be plain strings"},
      {"XW4D", "map keys must be plain strings"},
      // More than one document in the stream: a config file is one.
      {"35KP", "a second YAML document"},
      {"5TYM", "a second YAML document"},
      {"6WLZ", "a second YAML document"},
      {"6XDY", "a second YAML document"},
      {"6ZKB", "a second YAML document"},
      {"7Z25", "a second YAML document"},
      {"9DXL", "a second YAML document"},
      {"9KAX", "a second YAML document"},
      {"9WXW", "a second YAML document"},
      {"JHB9", "a second YAML document"},
      {"KSS4", "a second YAML document"},
      {"L383", "a second YAML document"},
      {"M7A3", "a second YAML document"},
      {"NKF9", "a second YAML document"},
      {"PUW8", "a second YAML document"},
      {"RZT7", "a second YAML document"},
      {"U9NS", "a second YAML document"},
      {"UT92", "a second YAML document"},
      {"W4TN", "a second YAML document"},
  };
  return cases;
}

struct Outcome {
  bool refused = false;
  std::string message;
  SourceLocation where;
};

Outcome Load(const fs::path& file) {
  Outcome out;
  try {
    (void)ParseYaml(Read(file), file.string());
  } catch (const YamlError& e) {
    out.refused = true;
    out.message = e.what();
    out.where = e.Where();
  }
  return out;
}

TEST(YamlTestSuite, HasTheCases) {
  std::size_t cases = 0;
  std::size_t errors = 0;
  for (const auto& entry : fs::directory_iterator(CasesDir())) {
    ++cases;
    errors += fs::exists(entry.path() / "error") ? 1 : 0;
  }
  EXPECT_EQ(cases, 402u);
  EXPECT_EQ(errors, 94u);
}

TEST(YamlTestSuite, EveryErrorCaseIsRefusedWithItsPosition) {
  for (const auto& entry : fs::directory_iterator(CasesDir())) {
    if (!fs::exists(entry.path() / "error")) continue;
    const auto file = entry.path() / "in.yaml";
    const Outcome outcome = Load(file);
    const std::string id = entry.path().filename().string();
    ASSERT_TRUE(outcome.refused) << id << " is not YAML but loaded";
    EXPECT_GT(outcome.where.line, 0) << id << ": " << outcome.message;
    EXPECT_GT(outcome.where.column, 0) << id << ": " << outcome.message;
    const std::string prefix = file.string() + ":" + std::to_string(outcome.where.line) + ":" +
                               std::to_string(outcome.where.column) + ": ";
    EXPECT_EQ(outcome.message.rfind(prefix, 0), 0u) << id << ": " << outcome.message;
  }
}

TEST(YamlTestSuite, EveryValidCaseLoadsOrIsRefusedOnPurpose) {
  std::map<std::string, std::string> refused;
  for (const auto& entry : fs::directory_iterator(CasesDir())) {
    if (fs::exists(entry.path() / "error")) continue;
    const Outcome outcome = Load(entry.path() / "in.yaml");
    if (!outcome.refused) continue;
    const std::string id = entry.path().filename().string();
    refused[id] = outcome.message;
    EXPECT_GT(outcome.where.line, 0) << id << ": " << outcome.message;
    const auto expected = RefusedValidCases().find(id);
    if (expected == RefusedValidCases().end()) {
      ADD_FAILURE() << id << " is valid YAML but was refused: " << outcome.message;
      continue;
    }
    EXPECT_NE(outcome.message.find(expected->second), std::string::npos)
        << id << ": expected \"" << expected->second << "\", got: " << outcome.message;
  }
  for (const auto& [id, reason] : RefusedValidCases()) {
    EXPECT_EQ(refused.count(id), 1u) << id << " is listed as refused (" << reason << ") but loads";
  }
}

}  // namespace
}  // namespace gns
