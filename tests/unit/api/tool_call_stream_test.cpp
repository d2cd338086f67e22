// ToolCallStream: which call an entry of a chat chunk's delta.tool_calls
// belongs to (an index, an id, neither), the held bytes' cap; is_json_text.
#include "api/tool_call_stream.hpp"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <boost/json/parse.hpp>

namespace weir::api {
namespace {

namespace json = boost::json;

ToolCallStream::Route route(ToolCallStream& s, std::string_view entry, bool continuing = true) {
  const json::value v = json::parse(entry);
  return s.route(v.get_object(), continuing);
}

TEST(ToolCallStream, AnIndexNamesACallAndANewIdOnItBeginsAnother) {
  ToolCallStream s;
  s.reset(100);
  auto r = route(s, R"({"index":0,"id":"a","function":{"name":"f"}})");
  EXPECT_EQ(r.call, 0u);
  EXPECT_TRUE(r.began);
  r = route(s, R"({"index":1,"id":"b"})");
  EXPECT_EQ(r.call, 1u);
  EXPECT_TRUE(r.began);
  r = route(s, R"({"index":0,"function":{"arguments":"{}"}})");  // interleaved: back to call 0
  EXPECT_EQ(r.call, 0u);
  EXPECT_FALSE(r.began);
  r = route(s, R"({"index":0,"id":"a"})");  // the same id again: the same call
  EXPECT_EQ(r.call, 0u);
  EXPECT_FALSE(r.began);
  r = route(s, R"({"index":0,"id":"c"})");  // Ollama: another id on index 0 is another call
  EXPECT_EQ(r.call, 2u);
  EXPECT_TRUE(r.began);
  r = route(s, R"({"index":0,"function":{"arguments":"x"}})");  // and index 0 is now that call
  EXPECT_EQ(r.call, 2u);
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s[2].upstream_id, "c");
}

TEST(ToolCallStream, WithoutAnIndexTheIdTellsCallsApart) {
  ToolCallStream s;
  s.reset(100);
  EXPECT_TRUE(route(s, R"({"id":"a"})").began);
  EXPECT_FALSE(route(s, R"({"function":{"arguments":"{"}})").began);
  EXPECT_FALSE(route(s, R"({"id":"a","function":{"arguments":"}"}})").began);
  const auto r = route(s, R"({"id":"b"})");
  EXPECT_TRUE(r.began);
  EXPECT_EQ(r.call, 1u);
  // Not continuing (text came between): a new call.
  EXPECT_TRUE(route(s, R"({"function":{"arguments":"{}"}})", false).began);
}

TEST(ToolCallStream, HeldBytesAreCapped) {
  ToolCallStream s;
  s.reset(10);
  route(s, R"({"index":0})");
  s.set_state(0, ToolCallStream::State::held);
  EXPECT_TRUE(s.hold(0, "name", "{}"));
  EXPECT_EQ(s.first_held(), 0u);
  EXPECT_FALSE(s.hold(0, "", "{\"a\":12}"));  // 6 + 8 > 10
  EXPECT_EQ(s[0].arguments, "{}");
  EXPECT_EQ(s.release(0), "{}");
  EXPECT_TRUE(s.hold(0, "", "{\"a\":1}"));  // the released bytes count no more
}

TEST(ToolCallStream, ThousandsOfIndexesRouteToTheirCallsInAnyOrder) {
  // 20,000 calls (an index each, the odd ones with a sparse, large index), then a delta of each in reverse
  // order, then a new id on every even index (Ollama's reuse of an index): each lookup finds the latest call
  // of its index (route() keeps a map: a linear scan per entry made this quadratic, 5.7 s per stream at
  // 64,000 indexes on /v1/messages).
  constexpr std::int64_t kCalls = 20000;
  const auto index_of = [](std::int64_t i) { return i % 2 ? (std::int64_t{1} << 40) + i : i; };
  ToolCallStream s;
  s.reset(100);
  for (std::int64_t i = 0; i < kCalls; ++i) {
    const auto r = route(s, fmt::format(R"({{"index":{},"id":"c{}"}})", index_of(i), i));
    ASSERT_TRUE(r.began);
    ASSERT_EQ(r.call, static_cast<std::size_t>(i));
  }
  for (std::int64_t i = kCalls; i-- > 0;) {
    const auto r = route(s, fmt::format(R"({{"index":{},"function":{{"arguments":"x"}}}})", index_of(i)));
    ASSERT_FALSE(r.began);
    ASSERT_EQ(r.call, static_cast<std::size_t>(i));
  }
  for (std::int64_t i = 0; i < kCalls; i += 2) {
    const auto r = route(s, fmt::format(R"({{"index":{},"id":"d{}"}})", i, i));
    ASSERT_TRUE(r.began);
    ASSERT_EQ(s[r.call].upstream_id, fmt::format("d{}", i));
    ASSERT_EQ(route(s, fmt::format(R"({{"index":{}}})", i)).call, r.call);  // the index is the new call's now
  }
  EXPECT_EQ(s.size(), static_cast<std::size_t>(kCalls + kCalls / 2));
}

TEST(ToolCallStream, FirstHeldFollowsTheStatesSet) {
  ToolCallStream s;
  s.reset(100);
  for (int i = 0; i < 4; ++i) route(s, fmt::format(R"({{"index":{}}})", i));
  EXPECT_FALSE(s.any_held());  // (calls begin done: the cursor passes them)
  EXPECT_EQ(s.first_held(), 4u);
  s.set_state(2, ToolCallStream::State::held);  // held after the cursor passed it: found again
  s.set_state(3, ToolCallStream::State::held);
  EXPECT_EQ(s.first_held(), 2u);
  s.set_state(2, ToolCallStream::State::streaming);
  EXPECT_EQ(s.first_held(), 3u);
  s.set_state(1, ToolCallStream::State::held);
  EXPECT_EQ(s.first_held(), 1u);
  s.set_state(1, ToolCallStream::State::done);
  s.set_state(3, ToolCallStream::State::done);
  EXPECT_EQ(s.first_held(), 4u);
  route(s, R"({"index":9})");
  s.set_state(4, ToolCallStream::State::held);
  EXPECT_EQ(s.first_held(), 4u);
  s.reset(100);
  EXPECT_EQ(s.first_held(), 0u);
  EXPECT_FALSE(s.any_held());
}

TEST(ToolCallStream, IsJsonText) {
  EXPECT_TRUE(is_json_text(R"({"a": true})"));
  EXPECT_TRUE(is_json_text(" [1, 2] "));
  EXPECT_TRUE(is_json_text(R"({"s": "\ud83d"})"));  // a lone surrogate, as upstream chunks are read
  EXPECT_TRUE(is_json_text(std::string(100, '[') + std::string(100, ']')));
  EXPECT_FALSE(is_json_text(R"({"a": )"));
  EXPECT_FALSE(is_json_text(R"({"a": tru)"));
  EXPECT_FALSE(is_json_text("tru"));
  EXPECT_FALSE(is_json_text("{}{}"));
  EXPECT_FALSE(is_json_text(""));
}

TEST(ToolCallStream, ClassifyArguments) {
  for (std::string_view none : {"", " ", "\n\t ", "null", " null "})
    EXPECT_EQ(classify_arguments(none), ToolArguments::none) << none;
  EXPECT_EQ(classify_arguments(R"( {"a": 1} )"), ToolArguments::object);
  for (std::string_view other : {"[]", "1", R"("x")", "true", " [1, 2] "})
    EXPECT_EQ(classify_arguments(other), ToolArguments::other) << other;
  for (std::string_view invalid : {R"({"a": )", "tru", "{}{}", "abc", "nul"})
    EXPECT_EQ(classify_arguments(invalid), ToolArguments::invalid) << invalid;
}

TEST(ToolCallStream, ANameRepeatedWholeAddsNothingAndPiecesAddUp) {
  EXPECT_FALSE(is_name_piece("f", "f"));
  EXPECT_FALSE(is_name_piece("f", ""));
  EXPECT_TRUE(is_name_piece("", "f"));
  EXPECT_TRUE(is_name_piece("get_", "weather"));
  ToolCallStream s;
  s.reset(100);
  route(s, R"({"index":0})");
  s.set_state(0, ToolCallStream::State::streaming);
  EXPECT_TRUE(s.hold(0, "f", "{\"a\":"));
  EXPECT_TRUE(s.hold(0, "f", "1}"));  // (a repeat)
  EXPECT_EQ(s[0].name, "f");
  EXPECT_TRUE(s.hold(0, "g", ""));
  EXPECT_EQ(s[0].name, "fg");
}

TEST(ToolCallStream, AStartIsReadyOnceADeltaBringsNoNamePieceAfterNameAndArguments) {
  ToolCallStream s;
  s.reset(100);
  route(s, R"({"index":0})");
  s.set_state(0, ToolCallStream::State::streaming);
  EXPECT_FALSE(s.start_ready(0, false));  // no name yet
  s.hold(0, "get_", " ");
  EXPECT_FALSE(s.start_ready(0, true));   // the delta brought a piece: more may come
  EXPECT_FALSE(s.start_ready(0, false));  // no arguments yet (whitespace only)
  s.hold(0, "weather", "{");
  EXPECT_FALSE(s.start_ready(0, true));
  EXPECT_TRUE(s.start_ready(0, false));  // then a delta without a name piece
  EXPECT_EQ(s.release(0), " {");
  EXPECT_EQ(s[0].name, "get_weather");  // (the name stays)
}

}  // namespace
}  // namespace weir::api
