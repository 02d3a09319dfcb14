// ParseJson against nlohmann::json::parse, the reference: same acceptance, same values, same
// number types, same winner among duplicate keys, and an error that says where.
#include "modules/kube/api/json_reader.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gns::kube {
namespace {

using nlohmann::json;

// Equal values are not enough: 5u == 5 in nlohmann, and code branches on is_number_unsigned().
void ExpectSameTree(const json& got, const json& want, const std::string& where) {
  ASSERT_EQ(got.type(), want.type()) << "at " << where;
  if (want.is_object()) {
    ASSERT_EQ(got.size(), want.size()) << "at " << where;
    for (auto it = want.begin(); it != want.end(); ++it) {
      ASSERT_TRUE(got.contains(it.key())) << "missing " << where << "/" << it.key();
      ExpectSameTree(got.at(it.key()), it.value(), where + "/" + it.key());
    }
  } else if (want.is_array()) {
    ASSERT_EQ(got.size(), want.size()) << "at " << where;
    for (std::size_t i = 0; i < want.size(); ++i) ExpectSameTree(got[i], want[i], where + "/" + std::to_string(i));
  } else if (want.is_number_float()) {
    // Bitwise: both must round the decimal text to the same double.
    EXPECT_EQ(got.get<double>(), want.get<double>()) << "at " << where;
  } else {
    EXPECT_EQ(got, want) << "at " << where;
  }
}

void ExpectLikeNlohmann(const std::string& text) {
  SCOPED_TRACE("input: " + text.substr(0, 200));
  const json want = json::parse(text, nullptr, false);
  std::string error;
  const json got = ParseJson(text, &error);
  ASSERT_EQ(got.is_discarded(), want.is_discarded());
  if (want.is_discarded()) {
    EXPECT_NE(error.find("[json.exception."), std::string::npos) << error;
    return;
  }
  EXPECT_TRUE(error.empty()) << error;
  ExpectSameTree(got, want, "");
  EXPECT_EQ(got.dump(), want.dump());
}

TEST(JsonReader, AcceptsWhatNlohmannAcceptsWithTheSameTypes) {
  const std::vector<std::string> inputs = {
      R"({"type":"MODIFIED","object":{"kind":"Node","metadata":{"name":"n1","resourceVersion":"12","labels":{"a":"b"}},"status":{"capacity":{"nvidia.com/gpu":"8"},"conditions":[{"type":"Ready","status":"True"}]}}})",
      R"({"small":5,"negative":-5,"zero":0,"big":18446744073709551615,"min":-9223372036854775808})",
      R"({"float":1.5,"exp":1e2,"negexp":-2.5E-3,"one":1.0,"tiny":5e-324,"long":0.1000000000000000055511151231257827})",
      R"({"beyond64":18446744073709551616,"verynegative":-9223372036854775809)",
      R"({"dup":1,"dup":"second","nested":{"x":[1],"x":[2,3]}})",
      R"({"esc":"\"\\\/\b\f\n\r\t","u":"\u00e9\u4e2d\ud83d\ude00","nul":"a\u0000b","raw":"é中😀"})",
      R"([true,false,null,[],{},"",[[[]]],{"":{"":""}}])",
      "  \n\t{\"padded\" : [ 1 , 2 ] }\r\n ",
      "42", "\"just a string\"", "null", "-1", "3.25",
  };
  for (const auto& input : inputs) ExpectLikeNlohmann(input);
}

TEST(JsonReader, RefusesWhatNlohmannRefusesAndSaysWhere) {
  const std::vector<std::string> inputs = {
      "", " ", "{", "{\"a\":}", "{\"a\":1,}", "[1,]", "{\"a\":1}x", "{\"a\":1}{}", "tru", "nul", "01",
      "1.", ".5", "+1", "{'a':1}", "{\"a\" 1}", "\"unterminated", "\"bad escape \\q\"", "\"\\ud800\"",
      std::string("\"\xff\xfe\""), std::string("\"\xc3\""), std::string("{\"a\":\"\x01\"}"), "NaN", "Infinity", "[1e400]",
  };
  for (const auto& input : inputs) ExpectLikeNlohmann(input);
  std::string error;
  EXPECT_TRUE(ParseJson("{\"type\":\"ADDED\",\"object\":{\"a\":tru}}", &error).is_discarded());
  EXPECT_NE(error.find("column 34"), std::string::npos) << error;
}

TEST(JsonReader, DeepNestingBeyondSimdjsonsLimitFallsBackToNlohmann) {
  const std::string deep = std::string(3000, '[') + std::string(3000, ']');
  ExpectLikeNlohmann(deep);
  ExpectLikeNlohmann(std::string(3000, '[') + std::string(2999, ']'));
}

TEST(JsonReader, LargeDocumentsTakeTheOtherPathsWithTheSameResult) {
  // Past the retained parser's size (its own parser) and past simdjson's cap (nlohmann).
  for (const std::size_t target : {kRetainedJsonBytes + 100, kSimdjsonMaxBytes + 100}) {
    json items = json::array();
    std::size_t size = 2;
    for (int i = 0; size < target; ++i) {
      json item = {{"metadata", {{"name", "node-" + std::to_string(i)}, {"resourceVersion", std::to_string(i)}}},
                   {"n", i}, {"f", i * 0.25}, {"neg", -i}};
      size += item.dump().size() + 1;
      items.push_back(std::move(item));
    }
    const std::string text = json{{"kind", "NodeList"}, {"items", items}}.dump();
    ASSERT_GT(text.size(), target);
    ExpectLikeNlohmann(text);
    // And a small document afterwards still goes through the loop thread's parser.
    ExpectLikeNlohmann(R"({"after":[1,-2,3.5]})");
  }
}

TEST(JsonReader, ErrorIsOptional) {
  EXPECT_TRUE(ParseJson("{").is_discarded());
  EXPECT_EQ(ParseJson(R"({"a":1})").at("a"), 1);
}

TEST(ListPageTest, ProjectsItemsAndLeavesCachedOnesAsTheirIdentity) {
  const Projection projection({"metadata.labels"});
  const json page = json::parse(R"({"kind":"NodeList","apiVersion":"v1",
    "metadata":{"resourceVersion":"90","continue":"next"},
    "items":[
      {"metadata":{"name":"n1","resourceVersion":"7","labels":{"a":"1"},"annotations":{"x":"y"}},"status":{"big":1}},
      {"metadata":{"name":"n2","resourceVersion":"8","labels":{"b":"2"}},"status":{"big":2}},
      {"metadata":{"name":"p1","namespace":"ns","resourceVersion":"9"},"spec":{}},
      {"metadata":{"resourceVersion":"10"}},
      "not an object"]})");
  std::vector<std::string> asked;
  const CachedFn cached = [&](std::string_view key, std::string_view rv) {
    asked.push_back(std::string(key) + "@" + std::string(rv));
    return key == "n2" || key == "ns/p1";
  };
  // Small pages use the loop's parser, large ones a parser of their own: same result.
  for (const std::size_t padding : {std::size_t{0}, kRetainedJsonBytes, kSimdjsonMaxBytes}) {
    SCOPED_TRACE(padding);
    json padded = page;
    padded["padding"] = std::string(padding, 'x');
    asked.clear();
    const json got = ParseListPage(padded.dump(), projection.Root(), cached);
    EXPECT_EQ(got.at("metadata"), page.at("metadata"));
    EXPECT_EQ(got.at("padding").get_ref<const std::string&>().size(), padding);
    ASSERT_EQ(got.at("items").size(), 5u);
    EXPECT_EQ(got["items"][0], json::parse(R"({"metadata":{"name":"n1","resourceVersion":"7","labels":{"a":"1"}}})"));
    EXPECT_EQ(got["items"][1], json::parse(R"({"metadata":{"name":"n2","resourceVersion":"8"}})"));
    EXPECT_EQ(got["items"][2], json::parse(R"({"metadata":{"name":"p1","namespace":"ns","resourceVersion":"9"}})"));
    EXPECT_EQ(got["items"][3], json::parse(R"({"metadata":{"resourceVersion":"10"}})"));  // the cache reports it
    EXPECT_EQ(got["items"][4], "not an object");
    EXPECT_EQ(asked, (std::vector<std::string>{"n1@7", "n2@8", "ns/p1@9"}));
  }
  // Text simdjson refuses (nested too deep) goes to nlohmann: projected, nothing left out.
  const std::string deep = R"({"metadata":{},"items":[{"metadata":{"name":"d","resourceVersion":"1","labels":{}},"x":)" +
                           std::string(1100, '[') + std::string(1100, ']') + "}]}";
  const json fallback = ParseListPage(deep, projection.Root(), cached);
  EXPECT_EQ(fallback["items"][0], json::parse(R"({"metadata":{"name":"d","resourceVersion":"1","labels":{}}})"));
  std::string why;
  EXPECT_TRUE(ParseListPage("{", projection.Root(), cached, &why).is_discarded());
  EXPECT_NE(why.find("parse error"), std::string::npos) << why;
}

TEST(ProjectionTest, KeepsOnlyTheNamedFieldsAndTheIdentity) {
  const json node = json::parse(R"({"apiVersion":"v1","kind":"Node",
    "metadata":{"name":"n1","uid":"u1","resourceVersion":"7","generation":2,"labels":{"a":"1","b":"2"},
                "annotations":{"big":"xxxxxxxx"},"managedFields":[{"manager":"kubelet"}],"finalizers":["f"]},
    "spec":{"providerID":"p"},
    "status":{"addresses":[{"type":"InternalIP","address":"10.0.0.1"}],"images":[{"names":["i"]}],
              "nodeInfo":{"kubeletVersion":"v1"}}})");
  const json want = json::parse(R"({
    "metadata":{"name":"n1","uid":"u1","resourceVersion":"7","generation":2,"labels":{"a":"1","b":"2"},
                "finalizers":["f"]},
    "spec":{},
    "status":{"addresses":[{"type":"InternalIP","address":"10.0.0.1"}],"nodeInfo":{"kubeletVersion":"v1"}}})");
  const Projection projection({"metadata.labels", "status.addresses", "status.nodeInfo.kubeletVersion",
                               "spec.providerID.notAnObject"});
  // Decoding with the projection, as a watch event and as a bare object...
  const std::string event = json{{"type", "MODIFIED"}, {"object", node}}.dump();
  const json decoded = ParseJson(event, projection.Event());
  EXPECT_EQ(decoded, (json{{"type", "MODIFIED"}, {"object", want}})) << decoded.dump();
  EXPECT_EQ(ParseJson(node.dump(), projection.Root()), want);
  // ...and pruning an object already decoded (list items) give the same.
  json pruned = node;
  projection.Apply(pruned);
  EXPECT_EQ(pruned, want) << pruned.dump();

  // No fields: everything but managedFields.
  json all = node;
  Projection().Apply(all);
  json expected = node;
  expected["metadata"].erase("managedFields");
  EXPECT_EQ(all, expected);
  EXPECT_EQ(ParseJson(node.dump(), Projection().Root()), expected);

  // Malformed text stays an error, with nlohmann's words.
  std::string why;
  EXPECT_TRUE(ParseJson(R"({"type":"ADDED","object":{)", projection.Event(), &why).is_discarded());
  EXPECT_NE(why.find("parse error"), std::string::npos) << why;
}

}  // namespace
}  // namespace gns::kube
