#pragma once
// Fast JSON decoding for what the API server sends: simdjson validates and indexes the text,
// then one pass builds the nlohmann value the rest of the code reads. About 3x faster than
// nlohmann's own parser on watch lines (bench/micro/kube), with nlohmann's results:
// - a document simdjson refuses (numbers beyond 64 bits, nesting deeper than 1024, ...) is
//   handed to nlohmann, so what parses and what does not is exactly nlohmann's choice;
// - duplicate keys: the last one wins; non-negative integers are number_unsigned, negative ones
//   number_integer. One known difference: "-0" becomes unsigned 0 (nlohmann: signed 0); the
//   two compare equal.
// simdjson's buffers grow with the largest document parsed, so only documents up to
// kRetainedJsonBytes reuse the loop thread's parser; larger ones (LIST pages) get a parser of
// their own, freed at once, and past kSimdjsonMaxBytes nlohmann parses them (its peak memory
// is the result alone, simdjson adds ~3x the text on top).
#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace gns::kube {

inline constexpr std::size_t kRetainedJsonBytes = 64 * 1024;
inline constexpr std::size_t kSimdjsonMaxBytes = 1024 * 1024;

// The value, or a discarded value (is_discarded()) with `*error` (when given) set to where and
// why the text is not JSON, in nlohmann's words ("parse error at line 1, column 7: ...").
nlohmann::json ParseJson(std::string_view text, std::string* error = nullptr);

}  // namespace gns::kube
