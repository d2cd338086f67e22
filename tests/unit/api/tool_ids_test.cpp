// Tool ids as Anthropic takes them (^[a-zA-Z0-9_-]+$): valid ones unchanged,
// others mapped deterministically, distinct ids kept distinct.
#include "api/tool_ids.hpp"

#include <regex>
#include <set>

#include <gtest/gtest.h>

namespace weir::api {
namespace {

std::string mapped(std::string id) {
  to_anthropic_tool_id(id);
  return id;
}

TEST(ToolIds, ValidIdsAreUnchanged) {
  for (const char* id : {"toolu_01A09q90qw90lq917835lq9", "call_abc-123", "chatcmpl-tool-9f8e", "x", "_-_"}) {
    EXPECT_TRUE(is_anthropic_tool_id(id)) << id;
    EXPECT_EQ(mapped(id), id);
  }
  EXPECT_FALSE(is_anthropic_tool_id(""));
  EXPECT_FALSE(is_anthropic_tool_id("functions.f:0"));
}

TEST(ToolIds, OtherIdsMatchThePatternAndMapTheSameWayEveryTime) {
  const std::regex pattern("^[a-zA-Z0-9_-]+$");
  for (const char* id : {"functions.get_weather:0", "call:1.x", "trace.42:7-41613afa_0", "id with spaces", "é", "a\nb",
                         "\"quoted\"", "", "a/b"}) {
    const std::string m = mapped(id);
    EXPECT_TRUE(std::regex_match(m, pattern)) << id << " -> " << m;
    EXPECT_TRUE(is_anthropic_tool_id(m)) << m;
    EXPECT_EQ(mapped(id), m);      // deterministic: a call and its result still pair
    EXPECT_EQ(mapped(m), m) << m;  // and a mapped id stays as it is
  }
  // Readable: the valid bytes kept, the others `_`, then the hash.
  EXPECT_TRUE(mapped("functions.f:0").starts_with("functions_f_0-")) << mapped("functions.f:0");
  EXPECT_EQ(mapped("functions.f:0").size(), std::string("functions_f_0-").size() + 16);
}

TEST(ToolIds, DistinctIdsStayDistinct) {
  // Ids that differ only in the bytes replaced, and a valid id that looks like one's mapped text.
  std::set<std::string> seen;
  for (const char* id : {"a.b", "a:b", "a b", "a_b", "a/b", "a.b.", "a..b", "functions.f:0", "functions.f:1"})
    EXPECT_TRUE(seen.insert(mapped(id)).second) << id;
}

}  // namespace
}  // namespace weir::api
