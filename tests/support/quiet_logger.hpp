#pragma once
// The logger a test hands the code under test: silent, so a passing run prints only gtest's
// lines; with GNS_TEST_LOG set, every line at debug level, to explain a failing test.

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace gns::test {

// One logger per name, made at its first use and shared after.
std::shared_ptr<spdlog::logger> QuietLogger(const std::string& name);

}  // namespace gns::test
