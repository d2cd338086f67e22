// Anthropic message / error / usage → OpenAI chat completion / error / usage
// (type: anthropic pools), from the examples in Anthropic's API reference.
#include "api/anthropic/upstream_response.hpp"

#include <gtest/gtest.h>

#include <boost/json/parse.hpp>

namespace weir::api::anthropic {
namespace {

namespace json = boost::json;

json::value chat_of(std::string_view message) {
  std::string out;
  EXPECT_TRUE(message_to_chat(message, 1700000000, out)) << out;
  return json::parse(out);
}

TEST(AnthropicUpstreamResponse, TextMessage) {
  const auto c = chat_of(R"({"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant",
    "model":"claude-sonnet-4-20250514","content":[{"type":"text","text":"Hi! My name is Claude."}],
    "stop_reason":"end_turn","stop_sequence":null,
    "usage":{"input_tokens":2095,"output_tokens":503,"cache_creation_input_tokens":10,"cache_read_input_tokens":1000}})");
  EXPECT_EQ(c, json::parse(R"({"id":"chatcmpl-msg_013Zva2CMHLNnXjNJJKqJ2EF","object":"chat.completion",
    "created":1700000000,"model":"claude-sonnet-4-20250514","choices":[{"index":0,
    "message":{"role":"assistant","content":"Hi! My name is Claude.","refusal":null},"logprobs":null,
    "finish_reason":"stop"}],"usage":{"prompt_tokens":3105,"completion_tokens":503,"total_tokens":3608,
    "prompt_tokens_details":{"cached_tokens":1000,"cache_write_tokens":10}}})"));
}

TEST(AnthropicUpstreamResponse, ThinkingTextAndToolUse) {
  const auto c = chat_of(R"({"id":"msg_1","type":"message","role":"assistant","model":"claude",
    "content":[{"type":"thinking","thinking":"Let me look.","signature":"EqQB"},
               {"type":"redacted_thinking","data":"xyz"},
               {"type":"text","text":"I'll check."},
               {"type":"tool_use","id":"toolu_01A","name":"get_weather","input":{"location":"San Francisco, CA","n":1}},
               {"type":"tool_use","id":"toolu_01B","name":"get_time","input":{}}],
    "stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":20}})");
  const auto& m = c.at("choices").at(0).at("message");
  EXPECT_EQ(m.at("content"), "I'll check.");
  EXPECT_EQ(m.at("reasoning_content"), "Let me look.");
  EXPECT_EQ(m.at("tool_calls"), json::parse(R"([
    {"id":"toolu_01A","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"San Francisco, CA\",\"n\":1}"}},
    {"id":"toolu_01B","type":"function","function":{"name":"get_time","arguments":"{}"}}])"));
  EXPECT_EQ(c.at("choices").at(0).at("finish_reason"), "tool_calls");
  EXPECT_EQ(c.at("usage").at("prompt_tokens_details").at("cached_tokens"), 0);
}

TEST(AnthropicUpstreamResponse, ToolOnlyAnswerHasNullContent) {
  const auto c = chat_of(R"({"id":"msg_1","type":"message","role":"assistant","model":"claude",
    "content":[{"type":"tool_use","id":"t","name":"f","input":{"big":123456789012345678901234567890}}],
    "stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":2}})");
  EXPECT_TRUE(c.at("choices").at(0).at("message").at("content").is_null());
  // An integer beyond 64 bits in the input reaches the arguments exactly.
  EXPECT_EQ(c.at("choices").at(0).at("message").at("tool_calls").at(0).at("function").at("arguments"),
            R"({"big":123456789012345678901234567890})");
}

TEST(AnthropicUpstreamResponse, StopReasons) {
  EXPECT_EQ(finish_reason("end_turn"), "stop");
  EXPECT_EQ(finish_reason("stop_sequence"), "stop");
  EXPECT_EQ(finish_reason("pause_turn"), "stop");
  EXPECT_EQ(finish_reason("max_tokens"), "length");
  EXPECT_EQ(finish_reason("model_context_window_exceeded"), "length");
  EXPECT_EQ(finish_reason("tool_use"), "tool_calls");
  EXPECT_EQ(finish_reason("refusal"), "content_filter");
  EXPECT_EQ(finish_reason(""), "stop");
}

TEST(AnthropicUpstreamResponse, NotAMessageIsAServerError) {
  std::string out;
  EXPECT_FALSE(message_to_chat(R"({"type":"error","error":{"type":"api_error","message":"x"}})", 0, out));
  EXPECT_EQ(json::parse(out).at("error").at("type"), "upstream_error");
  EXPECT_FALSE(message_to_chat("not json", 0, out));
}

TEST(AnthropicUpstreamResponse, ErrorsKeepAnthropicsTypeInOpenAIsShape) {
  std::string out;
  append_openai_error(
      out, 529, R"({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"})");
  EXPECT_EQ(json::parse(out),
            json::parse(R"({"error":{"message":"Overloaded","type":"overloaded_error","param":null,"code":null}})"));
  out.clear();
  append_openai_error(out, 401, "<html>nope</html>");
  EXPECT_EQ(json::parse(out).at("error").at("type"), "authentication_error");
  EXPECT_EQ(json::parse(out).at("error").at("message"), "Upstream answered 401: <html>nope</html>");
}

// Anthropic's context-length refusals reach OpenAI clients with OpenAI's code for them (clients compare it).
TEST(AnthropicUpstreamResponse, ContextLengthRefusalsTakeOpenAIsCode) {
  for (std::string_view m : {"prompt is too long: 210000 tokens > 200000 maximum",
                             "input length and `max_tokens` exceed context limit: 190000 + 32000 > 200000, decrease "
                             "input length or `max_tokens` and try again"}) {
    std::string out;
    append_openai_error(
        out, 400, R"({"type":"error","error":{"type":"invalid_request_error","message":")" + std::string(m) + R"("}})");
    const auto v = json::parse(out);
    EXPECT_EQ(v.at("error").at("message").as_string(), m);
    EXPECT_EQ(v.at("error").at("type"), "invalid_request_error");
    EXPECT_EQ(v.at("error").at("param"), "messages");
    EXPECT_EQ(v.at("error").at("code"), "context_length_exceeded");
  }
}

TEST(AnthropicUpstreamResponse, UsageOfAMessage) {
  const auto u = extract_message_usage(R"({"id":"m","usage":{"input_tokens":5,"cache_creation_input_tokens":2,
    "cache_read_input_tokens":3,"output_tokens":7,"service_tier":"standard"},"content":[]})");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->prompt_tokens, 10u);
  EXPECT_EQ(u->cached_tokens, 3u);
  EXPECT_EQ(u->completion_tokens, 7u);
  EXPECT_EQ(u->total_tokens, 17u);
  EXPECT_FALSE(extract_message_usage(R"({"input_tokens":5})"));  // a count_tokens answer has no usage
  EXPECT_FALSE(extract_message_usage(R"({"usage":{"input_tokens":-1}})"));
}

TEST(AnthropicUpstreamResponse, UsageOutOfRangeIsInvalidNotBilledAsSent) {
  // Counts over kMaxUsageTokens (2^24), negative or fractional: no usage, and said to be invalid.
  for (const std::string_view body :
       {R"({"usage":{"input_tokens":2147483648,"output_tokens":1}})",
        R"({"usage":{"input_tokens":1,"output_tokens":16777217}})", R"({"usage":{"input_tokens":-5}})",
        R"({"usage":{"input_tokens":3.7}})", R"({"usage":{"cache_read_input_tokens":1e300}})", R"({"usage":"many"})"}) {
    bool invalid = false;
    EXPECT_FALSE(extract_message_usage(body, &invalid)) << body;
    EXPECT_TRUE(invalid) << body;
  }
  // None sent is not invalid; the bound itself reads.
  bool invalid = false;
  EXPECT_FALSE(extract_message_usage(R"({"usage":null})", &invalid));
  EXPECT_FALSE(extract_message_usage(R"({"id":"m"})", &invalid));
  const auto u = extract_message_usage(R"({"usage":{"input_tokens":16777216,"output_tokens":16777216}})", &invalid);
  ASSERT_TRUE(u);
  EXPECT_EQ(u->prompt_tokens, 16777216u);
  EXPECT_FALSE(invalid);
}

TEST(AnthropicUpstreamResponse, ACountLeftOutIsNotACountOf0) {
  // input_tokens or output_tokens absent or null: invalid usage (not billed as 0), the part said kept.
  bool invalid = false;
  PartialUsage said;
  EXPECT_FALSE(extract_message_usage(
      R"({"usage":{"input_tokens":8,"cache_read_input_tokens":3,"cache_creation_input_tokens":4,"cache_creation":{"ephemeral_1h_input_tokens":1},"output_tokens":null}})",
      &invalid, &said));
  EXPECT_TRUE(invalid);
  EXPECT_TRUE(said.prompt);
  EXPECT_FALSE(said.completion);
  EXPECT_EQ(said.counts.prompt_tokens, 15u);
  EXPECT_EQ(said.counts.cached_tokens, 3u);
  EXPECT_EQ(said.counts.cache_write_tokens, 4u);
  EXPECT_EQ(said.counts.cache_write_1h_tokens, 1u);
  EXPECT_EQ(said.counts.completion_tokens, 0u);
  invalid = false;
  said = {};
  EXPECT_FALSE(extract_message_usage(R"({"usage":{"output_tokens":9}})", &invalid, &said));
  EXPECT_TRUE(invalid);
  EXPECT_FALSE(said.prompt);
  EXPECT_TRUE(said.completion);
  EXPECT_EQ(said.counts.completion_tokens, 9u);
  EXPECT_EQ(said.counts.prompt_tokens, 0u);
  // No count at all: no usage reported, not invalid.
  invalid = false;
  said = {};
  EXPECT_FALSE(extract_message_usage(R"({"usage":{}})", &invalid, &said));
  EXPECT_FALSE(extract_message_usage(R"({"usage":{"input_tokens":null,"output_tokens":null}})", &invalid, &said));
  EXPECT_FALSE(invalid);
  EXPECT_FALSE(said.prompt || said.completion);
  // Null cache counts are none: the usage reads.
  const auto u = extract_message_usage(
      R"({"usage":{"input_tokens":8,"cache_read_input_tokens":null,"cache_creation_input_tokens":null,"output_tokens":2}})",
      &invalid);
  ASSERT_TRUE(u);
  EXPECT_EQ(u->prompt_tokens, 8u);
  EXPECT_FALSE(invalid);
  // A whole message's translation shows no counts for it: null, not zeros.
  std::string out;
  ASSERT_TRUE(message_to_chat(
      R"({"id":"m","type":"message","role":"assistant","model":"c","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":8,"output_tokens":null}})",
      1, out));
  EXPECT_TRUE(json::parse(out).at("usage").is_null()) << out;
}

TEST(AnthropicUpstreamResponse, AWholeMessageAsTheEventsAnthropicSendsForIt) {
  // A stream made from a whole message loses nothing: the id, signatures, redacted thinking, stop_sequence,
  // the cache counts, a tool's input (with an integer beyond 64 bits kept exactly).
  const std::string_view msg = R"({"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[
    {"type":"thinking","thinking":"hmm","signature":"sig=="},{"type":"redacted_thinking","data":"EmwK"},
    {"type":"text","text":"Hi END"},{"type":"tool_use","id":"tu_1","name":"f","input":{"n":123456789012345678901234}}],
    "stop_reason":"stop_sequence","stop_sequence":"END",
    "usage":{"input_tokens":10,"output_tokens":3,"cache_creation_input_tokens":7,"cache_read_input_tokens":4}})";
  std::string out;
  std::uint32_t deltas = 0;
  ASSERT_TRUE(message_as_events(msg, out, deltas));
  std::vector<std::string> types;
  std::vector<json::value> data;
  for (std::size_t at = 0; (at = out.find("data: ", at)) != std::string::npos;) {
    const auto end = out.find("\n\n", at);
    data.push_back(json::parse(out.substr(at + 6, end - at - 6)));
    types.emplace_back(data.back().at("type").as_string());
    at = end;
  }
  EXPECT_EQ(types, (std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                             "content_block_delta", "content_block_stop", "content_block_start",
                                             "content_block_stop", "content_block_start", "content_block_delta",
                                             "content_block_stop", "content_block_start", "content_block_delta",
                                             "content_block_stop", "message_delta", "message_stop"}));
  EXPECT_EQ(deltas, 4u);
  EXPECT_EQ(data[0].at("message").at("id"), "msg_1");
  EXPECT_EQ(data[0].at("message").at("content"), json::array());
  EXPECT_EQ(data[3].at("delta"), json::parse(R"({"type":"signature_delta","signature":"sig=="})"));
  EXPECT_EQ(data[5].at("content_block"), json::parse(R"({"type":"redacted_thinking","data":"EmwK"})"));
  EXPECT_EQ(data[8].at("delta"), json::parse(R"({"type":"text_delta","text":"Hi END"})"));
  EXPECT_EQ(data[10].at("content_block"), json::parse(R"({"type":"tool_use","id":"tu_1","name":"f","input":{}})"));
  EXPECT_NE(out.find(R"(123456789012345678901234)"), std::string::npos) << out;
  EXPECT_EQ(data[13].at("delta"), json::parse(R"({"stop_reason":"stop_sequence","stop_sequence":"END"})"));
  EXPECT_EQ(data[13].at("usage").at("cache_creation_input_tokens"), 7);
  EXPECT_FALSE(message_as_events(R"({"type":"error"})", out, deltas));
}

// The 1-hour part of the cache writes (priced apart: pricing.X.cache_write_1h).
TEST(AnthropicUpstreamResponse, UsageSaysTheOneHourCacheWrites) {
  const auto u = extract_message_usage(R"({"usage":{"input_tokens":5,"cache_creation_input_tokens":10,
    "cache_read_input_tokens":0,"output_tokens":7,
    "cache_creation":{"ephemeral_5m_input_tokens":4,"ephemeral_1h_input_tokens":6}}})");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->cache_write_tokens, 10u);
  EXPECT_EQ(u->cache_write_1h_tokens, 6u);
  const auto none = extract_message_usage(R"({"usage":{"input_tokens":5,"cache_creation":null,"output_tokens":1}})");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->cache_write_1h_tokens, 0u);
  bool invalid = false;
  EXPECT_FALSE(extract_message_usage(
      R"({"usage":{"input_tokens":5,"output_tokens":1,"cache_creation":{"ephemeral_1h_input_tokens":-6}}})", &invalid));
  EXPECT_TRUE(invalid);
  // More 1-hour writes than writes: at most the writes.
  EXPECT_EQ(extract_message_usage(R"({"usage":{"input_tokens":5,"cache_creation_input_tokens":2,"output_tokens":1,
                                      "cache_creation":{"ephemeral_1h_input_tokens":6}}})")
                ->cache_write_1h_tokens,
            2u);
}

}  // namespace
}  // namespace weir::api::anthropic
