// Anthropic stream events → OpenAI chat.completion.chunk stream (type:
// anthropic pools), from the streams in Anthropic's "Streaming Messages"
// reference: the role chunk first, text, thinking, tool calls with
// index/id/name, the finish and usage chunks, [DONE], in-stream errors, a
// cut-short stream, and the passthrough observer's usage.
#include "api/anthropic/upstream_stream.hpp"

#include <gtest/gtest.h>

#include <vector>

#include <boost/json/parse.hpp>

#include "http/sse.hpp"

namespace weir::api::anthropic {
namespace {

namespace json = boost::json;

// Anthropic's documented text stream (ping included).
constexpr std::string_view kText =
    "event: message_start\n"
    "data: {\"type\": \"message_start\", \"message\": {\"id\": \"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY\", \"type\": "
    "\"message\", \"role\": \"assistant\", \"content\": [], \"model\": \"claude-opus-4-1-20250805\", \"stop_reason\": "
    "null, \"stop_sequence\": null, \"usage\": {\"input_tokens\": 25, \"cache_read_input_tokens\": 5, "
    "\"output_tokens\": 1}}}\n\n"
    "event: content_block_start\n"
    "data: {\"type\": \"content_block_start\", \"index\": 0, \"content_block\": {\"type\": \"text\", \"text\": "
    "\"\"}}\n\n"
    "event: ping\n"
    "data: {\"type\": \"ping\"}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": "
    "\"Hello\"}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"! "
    "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}}\n\n"
    "event: content_block_stop\n"
    "data: {\"type\": \"content_block_stop\", \"index\": 0}\n\n"
    "event: message_delta\n"
    "data: {\"type\": \"message_delta\", \"delta\": {\"stop_reason\": \"end_turn\", \"stop_sequence\":null}, "
    "\"usage\": {\"output_tokens\": 15}}\n\n"
    "event: message_stop\n"
    "data: {\"type\": \"message_stop\"}\n\n";

// Thinking, then text, then two tool calls (Anthropic's tool-use stream shape).
constexpr std::string_view kTools =
    "event: message_start\n"
    "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_014p7gG3wDgGV9EUtLvnow3U\",\"type\":\"message\","
    "\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"stop_sequence\":null,\"usage\":{\"input_tokens\":472,"
    "\"output_tokens\":2},\"content\":[],\"stop_reason\":null}}\n\n"
    "event: content_block_start\n"
    "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\","
    "\"signature\":\"\"}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"The "
    "user wants weather.\"}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":"
    "\"EqQBCgIYAhIM\"}}\n\n"
    "event: content_block_stop\n"
    "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
    "event: content_block_start\n"
    "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Okay, "
    "checking.\"}}\n\n"
    "event: content_block_stop\n"
    "data: {\"type\":\"content_block_stop\",\"index\":1}\n\n"
    "event: content_block_start\n"
    "data: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":"
    "\"toolu_01T1x1fJ34qAmk2tNTrN7Up6\",\"name\":\"get_weather\",\"input\":{}}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":"
    "\"\"}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":"
    "\"{\\\"location\\\": \\\"San Fra\"}}\n\n"
    "event: content_block_delta\n"
    "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":"
    "\"ncisco, CA\\\"}\"}}\n\n"
    "event: content_block_stop\n"
    "data: {\"type\":\"content_block_stop\",\"index\":2}\n\n"
    "event: content_block_start\n"
    "data: {\"type\":\"content_block_start\",\"index\":3,\"content_block\":{\"type\":\"tool_use\",\"id\":"
    "\"toolu_02\",\"name\":\"get_time\",\"input\":{}}}\n\n"
    "event: content_block_stop\n"
    "data: {\"type\":\"content_block_stop\",\"index\":3}\n\n"
    "event: message_delta\n"
    "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":"
    "{\"output_tokens\":89}}\n\n"
    "event: message_stop\n"
    "data: {\"type\":\"message_stop\"}\n\n";

struct Collect final : ChunkSink {
  void chunk(std::string_view data) override { chunks.emplace_back(data); }
  std::vector<std::string> chunks;
};

// Runs `stream` through the SSE reader in pieces of `piece` bytes (0: whole).
std::vector<std::string> translate(std::string_view stream, bool include_usage, std::size_t piece = 0,
                                   bool finish = true, UpstreamStreamTranslator* keep = nullptr) {
  UpstreamStreamTranslator local;
  UpstreamStreamTranslator& t = keep ? *keep : local;
  t.reset(include_usage, 1700000000);
  http::SseReader reader;
  Collect c;
  for (std::size_t i = 0; i < stream.size();) {
    const std::size_t n = piece ? std::min(piece, stream.size() - i) : stream.size();
    reader.push(stream.substr(i, n));
    while (auto ev = reader.next())
      if (ev->has_data) t.on_data(ev->data, c);
    i += n;
  }
  if (finish) t.finish(c);
  return c.chunks;
}

json::value delta_of(const std::string& chunk) { return json::parse(chunk).at("choices").at(0).at("delta"); }

TEST(AnthropicUpstreamStream, TextStreamBecomesChunksThenDone) {
  const auto c = translate(kText, false);
  ASSERT_EQ(c.size(), 5u);
  const auto first = json::parse(c[0]);
  EXPECT_EQ(first.at("id"), "chatcmpl-msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY");
  EXPECT_EQ(first.at("object"), "chat.completion.chunk");
  EXPECT_EQ(first.at("created"), 1700000000);
  EXPECT_EQ(first.at("model"), "claude-opus-4-1-20250805");
  EXPECT_EQ(delta_of(c[0]), json::parse(R"({"role":"assistant","content":""})"));
  EXPECT_EQ(delta_of(c[1]).at("content"), "Hello");
  EXPECT_EQ(delta_of(c[2]).at("content"), "! \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
  EXPECT_EQ(json::parse(c[3]).at("choices").at(0).at("finish_reason"), "stop");
  EXPECT_EQ(c[4], "[DONE]");
}

TEST(AnthropicUpstreamStream, UsageChunkWhenAskedWithCachedTokens) {
  UpstreamStreamTranslator t;
  const auto c = translate(kText, true, 0, true, &t);
  ASSERT_EQ(c.size(), 6u);
  const auto u = json::parse(c[4]);
  EXPECT_EQ(u.at("choices"), json::array());
  EXPECT_EQ(u.at("usage"), json::parse(R"({"prompt_tokens":30,"completion_tokens":15,"total_tokens":45,
                                           "prompt_tokens_details":{"cached_tokens":5}})"));
  EXPECT_EQ(c[5], "[DONE]");
  EXPECT_TRUE(t.ended());
  ASSERT_TRUE(t.has_usage());
  EXPECT_EQ(t.usage().prompt_tokens, 30u);
  EXPECT_EQ(t.usage().completion_tokens, 15u);
}

TEST(AnthropicUpstreamStream, ThinkingTextAndToolCallsWithIndexIdAndName) {
  const auto c = translate(kTools, false);
  std::vector<json::value> d;
  for (std::size_t i = 0; i + 1 < c.size(); ++i) d.push_back(json::parse(c[i]).at("choices").at(0));
  ASSERT_EQ(d.size(), 9u);
  EXPECT_EQ(d[1].at("delta"), json::parse(R"({"reasoning_content":"The user wants weather."})"));
  EXPECT_EQ(d[2].at("delta"), json::parse(R"({"content":"Okay, checking."})"));
  EXPECT_EQ(d[3].at("delta"), json::parse(R"({"tool_calls":[{"index":0,"id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6",
    "type":"function","function":{"name":"get_weather","arguments":""}}]})"));
  EXPECT_EQ(d[4].at("delta"),
            json::parse(R"({"tool_calls":[{"index":0,"function":{"arguments":"{\"location\": \"San Fra"}}]})"));
  EXPECT_EQ(d[5].at("delta"), json::parse(R"({"tool_calls":[{"index":0,"function":{"arguments":"ncisco, CA\"}"}}]})"));
  EXPECT_EQ(d[6].at("delta"), json::parse(R"({"tool_calls":[{"index":1,"id":"toolu_02","type":"function",
    "function":{"name":"get_time","arguments":""}}]})"));
  EXPECT_EQ(d[7].at("delta"), json::parse(R"({"tool_calls":[{"index":1,"function":{"arguments":"{}"}}]})"));
  EXPECT_EQ(json::parse(c[8]).at("choices").at(0).at("finish_reason"), "tool_calls");
  EXPECT_EQ(c.back(), "[DONE]");
}

TEST(AnthropicUpstreamStream, AToolsWholeInputInItsStartIsItsArguments) {
  // An Anthropic-compatible server that gives the input in content_block_start and sends no
  // input_json_delta: the arguments are that input, not "{}".
  std::string s(kTools);
  const std::string from = R"("name":"get_time","input":{})";
  const auto at = s.find(from);
  ASSERT_NE(at, std::string::npos);
  s.replace(at, from.size(), R"("name":"get_time","input":{"tz":"UTC"})");
  const auto c = translate(s, false);
  EXPECT_EQ(json::parse(c[7]).at("choices").at(0).at("delta"),
            json::parse(R"({"tool_calls":[{"index":1,"function":{"arguments":"{\"tz\":\"UTC\"}"}}]})"));
}

TEST(AnthropicUpstreamStream, AWholeInputKeepsIntegersBeyond64BitsExactly) {
  // Boost.JSON holds 18446744073709551617 as a double: serialized again it was 1.8446744073709552E19.
  std::string s(kTools);
  const std::string from = R"("name":"get_time","input":{})";
  const auto at = s.find(from);
  ASSERT_NE(at, std::string::npos);
  s.replace(at, from.size(),
            R"("name":"get_time","input":{"n":18446744073709551617,"m":[-123456789012345678901234567890,1.5]})");
  const auto c = translate(s, false);
  EXPECT_EQ(json::parse(c[7]).at("choices").at(0).at("delta").at("tool_calls").at(0).at("function").at("arguments"),
            R"({"n":18446744073709551617,"m":[-123456789012345678901234567890,1.5]})");
}

TEST(AnthropicUpstreamStream, EverySplitGivesTheSameChunks) {
  for (auto stream : {kText, kTools}) {
    const auto whole = translate(stream, true);
    for (std::size_t piece : {1u, 2u, 3u, 7u, 64u}) EXPECT_EQ(translate(stream, true, piece), whole) << piece;
  }
}

TEST(AnthropicUpstreamStream, ErrorEventMidStreamIsAnInBandOpenAIErrorThenDone) {
  const std::string s = std::string(kText.substr(0, kText.find("event: content_block_stop"))) +
                        "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", "
                        "\"message\": \"Overloaded\"}}\n\n" +
                        "event: message_stop\ndata: {\"type\": \"message_stop\"}\n\n";
  const auto c = translate(s, true);
  ASSERT_GE(c.size(), 2u);
  EXPECT_EQ(json::parse(c[c.size() - 2]),
            json::parse(R"({"error":{"message":"Overloaded","type":"overloaded_error","param":null,"code":null}})"));
  EXPECT_EQ(c.back(), "[DONE]");  // and nothing after it: the message_stop is swallowed
}

TEST(AnthropicUpstreamStream, CutShortStreamEndsWithAnError) {
  const auto c = translate(kText.substr(0, kText.find("event: message_delta")), false);
  EXPECT_EQ(json::parse(c[c.size() - 2]).at("error").at("type"), "api_error");
  EXPECT_EQ(c.back(), "[DONE]");
  // After message_delta the answer is whole: only message_stop is missing.
  const auto d = translate(kText.substr(0, kText.find("event: message_stop")), true);
  EXPECT_EQ(json::parse(d[d.size() - 3]).at("choices").at(0).at("finish_reason"), "stop");
  EXPECT_EQ(json::parse(d[d.size() - 2]).at("usage").at("completion_tokens"), 15);
  EXPECT_EQ(d.back(), "[DONE]");
}

TEST(AnthropicUpstreamStream, NotJsonOrNoMessageStartIsAnError) {
  EXPECT_EQ(json::parse(translate("data: nope\n\n", false)[0]).at("error").at("type"), "api_error");
  EXPECT_EQ(
      json::parse(translate(kText.substr(kText.find("event: content_block_start")), false)[0]).at("error").at("type"),
      "api_error");
}

TEST(AnthropicUpstreamStream, PassthroughObserverReadsUsageAndTheEnd) {
  PassthroughObserver o;
  http::SseReader reader;
  reader.push(kText);
  std::size_t n = 0;
  while (auto ev = reader.next()) {
    EXPECT_FALSE(o.ended());
    o.on_data(ev->data);
    ++n;
  }
  EXPECT_EQ(n, 8u);
  EXPECT_TRUE(o.ended());
  ASSERT_TRUE(o.has_usage());
  EXPECT_EQ(o.usage().prompt_tokens, 30u);
  EXPECT_EQ(o.usage().cached_tokens, 5u);
  EXPECT_EQ(o.usage().completion_tokens, 15u);
}

TEST(AnthropicUpstreamStream, UsageOutOfRangeIsNoUsage) {
  // A message_delta whose output count is over kMaxUsageTokens (2^24): the stream has no usage to bill, and
  // says its usage was invalid (the request is charged its estimate).
  PassthroughObserver o;
  o.on_data(R"({"type":"message_start","message":{"id":"m","usage":{"input_tokens":3,"output_tokens":1}}})");
  EXPECT_FALSE(o.usage_invalid());
  o.on_data(R"({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2147483648}})");
  o.on_data(R"({"type":"message_stop"})");
  EXPECT_TRUE(o.ended());
  EXPECT_TRUE(o.usage_invalid());
  EXPECT_FALSE(o.has_usage());
}

TEST(AnthropicUpstreamStream, AnOutputLeftOutIsNoUsage) {
  constexpr std::string_view kStart =
      R"({"type":"message_start","message":{"id":"m","usage":{"input_tokens":8,"cache_read_input_tokens":3,"cache_creation_input_tokens":4,"cache_creation":{"ephemeral_1h_input_tokens":1},"output_tokens":1}}})";
  // message_delta's output_tokens null: message_start's placeholder (1) is no output count. Invalid, the
  // prompt (its cache reads and writes) said.
  for (const std::string_view delta :
       {R"({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":null}})",
        R"({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":8}})"}) {
    PassthroughObserver o;
    o.on_data(kStart);
    o.on_data(delta);
    o.on_data(R"({"type":"message_stop"})");
    EXPECT_FALSE(o.has_usage()) << delta;
    EXPECT_TRUE(o.usage_invalid()) << delta;
    const PartialUsage said = o.said_usage();
    EXPECT_TRUE(said.prompt);
    EXPECT_FALSE(said.completion);
    EXPECT_EQ(said.counts.prompt_tokens, 15u);
    EXPECT_EQ(said.counts.cached_tokens, 3u);
    EXPECT_EQ(said.counts.cache_write_tokens, 4u);
    EXPECT_EQ(said.counts.cache_write_1h_tokens, 1u);
  }
  // No usage on message_delta at all, then message_stop: no output reported (not invalid).
  PassthroughObserver o;
  o.on_data(kStart);
  o.on_data(R"({"type":"message_delta","delta":{"stop_reason":"end_turn"}})");
  o.on_data(R"({"type":"message_stop"})");
  EXPECT_FALSE(o.has_usage());
  EXPECT_FALSE(o.usage_invalid());
  EXPECT_TRUE(o.said_usage().prompt);
  // The translator alike; a chat client's usage chunk says null, not the placeholder.
  UpstreamStreamTranslator t;
  t.reset(true, 1);
  Collect sink;
  t.on_data(kStart, sink);
  t.on_data(R"({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":null}})", sink);
  t.on_data(R"({"type":"message_stop"})", sink);
  EXPECT_FALSE(t.has_usage());
  EXPECT_TRUE(t.usage_invalid());
  EXPECT_TRUE(t.said_usage().prompt);
  EXPECT_EQ(t.said_usage().counts.cache_write_tokens, 4u);
  ASSERT_GE(sink.chunks.size(), 2u);
  EXPECT_TRUE(json::parse(sink.chunks[sink.chunks.size() - 2]).at("usage").is_null()) << sink.chunks.back();
}

TEST(AnthropicUpstreamStream, ClassifyForHeldHeads) {
  using openai::ChunkKind;
  EXPECT_EQ(classify_event(R"({"type":"message_start","message":{}})"), ChunkKind::empty);
  EXPECT_EQ(classify_event(R"({"type":"ping"})"), ChunkKind::empty);
  EXPECT_EQ(classify_event(R"({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}})"),
            ChunkKind::empty);
  EXPECT_EQ(classify_event(R"({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}})"),
            ChunkKind::content);
  EXPECT_EQ(classify_event(R"({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})"),
            ChunkKind::error);
}

}  // namespace
}  // namespace weir::api::anthropic
