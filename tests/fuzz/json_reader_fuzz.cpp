// libFuzzer target for the kube module's JSON decoding (simdjson, then an nlohmann tree): on
// every byte string it must agree with nlohmann::json::parse, the reference, on whether the
// text is JSON and, if so, on every value and number type. Built by run-fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "modules/kube/api/json_reader.hpp"

namespace {

using nlohmann::json;

bool SameNumber(const json& got, const json& want) {
  if (want.is_number_float()) {
    if (!got.is_number_float()) return false;
    const double a = got.get<double>(), b = want.get<double>();
    return std::memcmp(&a, &b, sizeof a) == 0;
  }
  // The documented difference: "-0" is signed 0 for nlohmann, unsigned 0 here.
  if (want.is_number_integer() && !want.is_number_unsigned() && want.get<int64_t>() == 0) {
    return got.is_number_integer() && got.get<int64_t>() == 0;
  }
  return got.type() == want.type() && got == want;
}

bool SameTree(const json& got, const json& want) {
  if (want.is_number()) return SameNumber(got, want);
  if (got.type() != want.type() || got.size() != want.size()) return false;
  if (want.is_object()) {
    for (auto it = want.begin(); it != want.end(); ++it) {
      const auto other = got.find(it.key());
      if (other == got.end() || !SameTree(*other, it.value())) return false;
    }
    return true;
  }
  if (want.is_array()) {
    for (std::size_t i = 0; i < want.size(); ++i)
      if (!SameTree(got[i], want[i])) return false;
    return true;
  }
  return got == want;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const json want = json::parse(text, nullptr, false);
  std::string error;
  const json got = gns::kube::ParseJson(text, &error);
  if (got.is_discarded() != want.is_discarded()) std::abort();
  if (want.is_discarded()) {
    if (error.find("[json.exception.") == std::string::npos) std::abort();  // it says why
  } else if (!error.empty() || !SameTree(got, want)) {
    std::abort();
  }
  return 0;
}
