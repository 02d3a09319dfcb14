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
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace gns::kube {

inline constexpr std::size_t kRetainedJsonBytes = 64 * 1024;
inline constexpr std::size_t kSimdjsonMaxBytes = 1024 * 1024;

// The value, or a discarded value (is_discarded()) with `*error` (when given) set to where and
// why the text is not JSON, in nlohmann's words ("parse error at line 1, column 7: ...").
nlohmann::json ParseJson(std::string_view text, std::string* error = nullptr);

// Which parts of an object a cache keeps (client-go's transform functions, declared): dotted
// paths of object fields, each kept whole ("metadata.labels", "status.addresses", "spec").
// A path names object members only; an array on the way is kept whole or not at all.
// The identity a cache needs is always kept: metadata name, namespace, uid, resourceVersion,
// generation, deletionTimestamp, finalizers. No paths: everything but metadata.managedFields.
class Projection {
 public:
  struct Node {
    std::map<std::string, Node, std::less<>> children;
    bool keep_rest = false;  // members not in `children` are kept whole
  };

  explicit Projection(const std::vector<std::string>& fields = {});
  // Prunes an object already decoded (list items).
  void Apply(nlohmann::json& object) const;
  const Node& Root() const { return root_; }
  // The projection of a watch event: "type" and the rest kept, "object" projected.
  const Node& Event() const { return event_; }

 private:
  void Add(std::string_view path);
  Node root_;
  Node event_;
};

// As ParseJson, building only what `projection` keeps (simdjson's index is walked once; what
// is left out is never allocated).
nlohmann::json ParseJson(std::string_view text, const Projection::Node& projection, std::string* error = nullptr);

// True when a cache already holds the object `key` ("namespace/name" or "name") at
// `resource_version`.
using CachedFn = std::function<bool(std::string_view key, std::string_view resource_version)>;

// One page of a LIST response, decoded for a cache (a relist): as ParseJson, but each item is
// built through `item_projection`, and an item `cached` says the cache holds as it is comes
// back as its identity alone ({"metadata":{"name","namespace","resourceVersion"}}), so a relist
// builds and frees only what changed. Pages of any size go through simdjson (a parser of their
// own, freed at once: the pages are what the client let through, and the result is small).
nlohmann::json ParseListPage(std::string_view text, const Projection::Node& item_projection, const CachedFn& cached,
                             std::string* error = nullptr);

}  // namespace gns::kube
