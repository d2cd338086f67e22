// core/text.hpp: find_substring against string_view::find on every offset and length.
#include "core/text.hpp"

#include <random>
#include <string>

#include <gtest/gtest.h>

namespace weir::core {
namespace {

TEST(FindSubstring, AgreesWithStringViewFindEverywhere) {
  std::mt19937 rng(7);
  // A small alphabet makes near-misses (first and last byte matching, middle not) common.
  auto text = [&](std::size_t n) {
    std::string s(n, 'a');
    for (auto& c : s) c = "ab\"u"[rng() % 4];
    return s;
  };
  for (int round = 0; round < 3000; ++round) {
    const std::string hay = text(rng() % 70);
    const std::string needle = rng() % 4 == 0 ? text(rng() % 6) : hay.substr(rng() % (hay.size() + 1), rng() % 8);
    ASSERT_EQ(find_substring(hay, needle), std::string_view(hay).find(needle)) << '[' << hay << "] [" << needle << ']';
  }
}

TEST(FindSubstring, UsageKeyInAChunk) {
  const std::string_view chunk =
      R"({"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"use usage"}}],)"
      R"("usage":{"prompt_tokens":3}})";
  EXPECT_EQ(find_substring(chunk, "\"usage\""), chunk.find("\"usage\""));
  EXPECT_EQ(find_substring(chunk.substr(0, 100), "\"usage\""), std::string_view::npos);
  EXPECT_EQ(find_substring("", "x"), std::string_view::npos);
  EXPECT_EQ(find_substring("abc", ""), 0u);
  // The needle at the very end: the last SIMD step must not read past `hay`.
  const std::string tail = std::string(31, 'x') + "\"usage\"";
  EXPECT_EQ(find_substring(tail, "\"usage\""), 31u);
}

TEST(SseDone, TheSentinelWithTrailingBlanksOnly) {
  static_assert(is_sse_done("[DONE]"));
  EXPECT_TRUE(is_sse_done("[DONE]  \t"));
  EXPECT_FALSE(is_sse_done(" [DONE]"));
  EXPECT_FALSE(is_sse_done("[DONE]x"));
  EXPECT_FALSE(is_sse_done("[DONE] x"));
  EXPECT_FALSE(is_sse_done("[DONE"));
  EXPECT_FALSE(is_sse_done(""));
  EXPECT_FALSE(is_sse_done("[done]"));
}

}  // namespace
TEST(BracedAsObject, FirstAndLastBytesOutsideWhitespaceAndABom) {
  EXPECT_TRUE(braced_as_object("{}"));
  EXPECT_TRUE(braced_as_object(" \r\n{\"a\":1}\n"));
  EXPECT_TRUE(braced_as_object("\xEF\xBB\xBF{\"a\":1}"));
  EXPECT_FALSE(braced_as_object(""));
  EXPECT_FALSE(braced_as_object("  \n"));
  EXPECT_FALSE(braced_as_object("<html></html>"));
  EXPECT_FALSE(braced_as_object("[{}]"));
  EXPECT_FALSE(braced_as_object("{\"a\":1,"));         // cut short
  EXPECT_FALSE(braced_as_object("{\"a\":1}garbage"));  // bytes after it
  EXPECT_FALSE(braced_as_object("data: {}\n\n"));
}

}  // namespace weir::core
