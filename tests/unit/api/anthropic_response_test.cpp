// OpenAI chat.completion (vLLM v0.10.1 bodies) → Anthropic message, the
// /tokenize count, and the error shapes.
#include "api/anthropic/response.hpp"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <boost/json/parse.hpp>

namespace weir::api::anthropic {
namespace {

namespace json = boost::json;

json::value message(std::string_view body) {
  std::string out;
  EXPECT_TRUE(translate_message(body, out)) << out;
  return json::parse(out);
}

TEST(AnthropicResponse, TextMessage) {
  const auto v = message(
      R"({"id":"chatcmpl-abc","object":"chat.completion","created":1,"model":"mock-model","choices":[{"index":0,
      "message":{"role":"assistant","content":" river stone","refusal":null,"annotations":null,"audio":null,
      "function_call":null,"tool_calls":[],"reasoning_content":null},"logprobs":null,"finish_reason":"stop","stop_reason":null}],
      "service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2,
      "prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null})");
  EXPECT_EQ(v, json::parse(R"({"id":"msg_abc","type":"message","role":"assistant","model":"mock-model",
    "content":[{"type":"text","text":" river stone"}],"stop_reason":"end_turn","stop_sequence":null,
    "usage":{"input_tokens":9,"output_tokens":2,"cache_read_input_tokens":0}})"));
}

// Mistral's API gives message.content as a list of parts (text; magistral's thinking first): the text parts
// joined are the text, the thinking parts the thinking (after reasoning_content); other parts skipped. Thinking
// blocks only when the request asked for thinking (Anthropic gives none otherwise).
TEST(AnthropicResponse, ContentPartsAndThinkingOnlyWhenAsked) {
  constexpr std::string_view kParts = R"({"id":"chatcmpl-p","model":"m","choices":[{"index":0,"message":{
    "role":"assistant","content":[{"type":"thinking","thinking":[{"type":"text","text":"reason"},{"type":"text","text":"ing"}]},
    {"type":"text","text":"The answer"},{"type":"reference","reference_ids":[1]},{"type":"text","text":" is 42."}]},
    "finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}})";
  std::string out;
  ASSERT_TRUE(translate_message(kParts, out, {}, true));
  EXPECT_EQ(json::parse(out).at("content"), json::parse(R"([{"type":"thinking","thinking":"reasoning","signature":""},
    {"type":"text","text":"The answer is 42."}])"));
  ASSERT_TRUE(translate_message(kParts, out, {}, false));
  EXPECT_EQ(json::parse(out).at("content"), json::parse(R"([{"type":"text","text":"The answer is 42."}])"));
  EXPECT_EQ(json::parse(out).at("usage").at("output_tokens"), 4);  // (generated: charged all the same)
  constexpr std::string_view kReasoning = R"({"id":"chatcmpl-r","model":"m","choices":[{"index":0,"message":{
    "role":"assistant","content":"Answer","reasoning_content":"Let me think"},"finish_reason":"stop"}]})";
  ASSERT_TRUE(translate_message(kReasoning, out, {}, false));
  EXPECT_EQ(json::parse(out).at("content"), json::parse(R"([{"type":"text","text":"Answer"}])"));
  ASSERT_TRUE(translate_message(kReasoning, out, {}, true));
  EXPECT_EQ(json::parse(out).at("content").at(0).at("thinking"), "Let me think");
}

TEST(AnthropicResponse, ThinkingToolCallsAndCachedTokens) {
  const auto v = message(R"({"id":"chatcmpl-x","model":"m","choices":[{"index":0,"message":{"role":"assistant",
    "content":null,"reasoning_content":"Let me think.","tool_calls":[
      {"id":"chatcmpl-tool-1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
      {"type":"function","function":{"name":"broken","arguments":"not json"}}]},
    "finish_reason":"tool_calls","stop_reason":null}],
    "usage":{"prompt_tokens":100,"completion_tokens":7,"total_tokens":107,"prompt_tokens_details":{"cached_tokens":64}}})");
  EXPECT_EQ(v.at("content"), json::parse(R"([
    {"type":"thinking","thinking":"Let me think.","signature":""},
    {"type":"tool_use","id":"chatcmpl-tool-1","name":"get_weather","input":{"city":"Paris"}},
    {"type":"tool_use","id":"toolu_x_1","name":"broken","input":{"_raw":"not json"}}])"));
  EXPECT_EQ(v.at("stop_reason"), "tool_use");
  EXPECT_EQ(v.at("usage"), json::parse(R"({"input_tokens":36,"output_tokens":7,"cache_read_input_tokens":64})"));
}

TEST(AnthropicResponse, ToolInputNumbersBeyondADoublesRangeStayAsWritten) {
  // 1e400 in a tool call's arguments became Infinity: no JSON (JavaScript's JSON.parse refused the message).
  std::string out;
  ASSERT_TRUE(translate_message(R"({"id":"chatcmpl-x","model":"m","choices":[{"index":0,"message":{"role":"assistant",
    "content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f",
    "arguments":"{\"a\": 1e400, \"b\": 1, \"c\": 18446744073709551616}"}}]},"finish_reason":"tool_calls"}],
    "usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}})",
                                out));
  EXPECT_EQ(out.find("Infinity"), std::string::npos) << out;
  EXPECT_NE(out.find(R"("input":{"a":1e400,"b":1,"c":18446744073709551616})"), std::string::npos) << out;
}

TEST(AnthropicResponse, ToolInputNestedBeyond32LevelsStaysAnObject) {
  std::string args;
  for (int i = 0; i < 40; ++i) args += R"({\"a\":)";
  args += "1";
  for (int i = 0; i < 40; ++i) args += "}";
  std::string out;
  ASSERT_TRUE(translate_message(R"({"id":"chatcmpl-x","model":"m","choices":[{"index":0,"message":{"role":"assistant",
    "content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":")" +
                                    args + R"("}}]},"finish_reason":"tool_calls"}]})",
                                out));
  EXPECT_EQ(out.find("_raw"), std::string::npos) << out;
}

TEST(AnthropicResponse, StopReasons) {
  auto with = [](std::string_view finish, std::string_view stop) {
    return message(
        std::string(R"({"id":"chatcmpl-1","model":"m","choices":[{"message":{"content":"a"},"finish_reason":)") +
        std::string(finish) + R"(,"stop_reason":)" + std::string(stop) + "}]}");
  };
  EXPECT_EQ(with(R"("length")", "null").at("stop_reason"), "max_tokens");
  EXPECT_EQ(with(R"("stop")", "128001").at("stop_reason"), "end_turn");  // a stop token id
  const auto s = with(R"("stop")", R"("END")");
  EXPECT_EQ(s.at("stop_reason"), "stop_sequence");
  EXPECT_EQ(s.at("stop_sequence"), "END");
  EXPECT_EQ(with("null", "null").at("stop_reason"), "end_turn");
  // A tool call cut off by max_tokens: its input is incomplete, so max_tokens, not tool_use (Anthropic's reference).
  const auto cut = message(R"({"id":"chatcmpl-1","model":"m","choices":[{"message":{"content":null,"tool_calls":[
      {"id":"t1","type":"function","function":{"name":"f","arguments":"{\"city\": \"Par"}}]},
      "finish_reason":"length","stop_reason":null}]})");
  EXPECT_EQ(cut.at("stop_reason"), "max_tokens");
  // No usage: zeros rather than a missing member.
  EXPECT_EQ(s.at("usage").at("input_tokens"), 0);
}

TEST(AnthropicResponse, NotACompletion) {
  std::string out;
  EXPECT_FALSE(translate_message(R"({"choices":[]})", out));
  EXPECT_EQ(json::parse(out).at("error").at("type"), "api_error");
  EXPECT_FALSE(translate_message("garbage", out));
}

TEST(AnthropicResponse, Count) {
  std::string out;
  ASSERT_TRUE(translate_count(R"({"count":12,"max_model_len":32768,"tokens":[1,2,3],"token_strs":null})", out));
  EXPECT_EQ(out, R"({"input_tokens":12})");
  EXPECT_FALSE(translate_count(R"({"tokens":[]})", out));
}

TEST(AnthropicResponse, Errors) {
  EXPECT_EQ(error_type(400), "invalid_request_error");
  EXPECT_EQ(error_type(401), "authentication_error");
  EXPECT_EQ(error_type(403), "permission_error");
  EXPECT_EQ(error_type(404), "not_found_error");
  EXPECT_EQ(error_type(405), "invalid_request_error");
  EXPECT_EQ(error_type(413), "request_too_large");
  EXPECT_EQ(error_type(429), "rate_limit_error");
  EXPECT_EQ(error_type(500), "api_error");
  EXPECT_EQ(error_type(502), "api_error");
  EXPECT_EQ(error_type(503), "overloaded_error");
  EXPECT_EQ(error_type(504), "timeout_error");  // Anthropic: timeout_error (the SDK's GatewayTimeoutError)
  EXPECT_EQ(error_type(402), "billing_error");
  EXPECT_EQ(error_type(529), "overloaded_error");
  std::string out;
  append_error_json(out, 401, "Incorrect \"key\".");
  EXPECT_EQ(out, R"({"type":"error","error":{"type":"authentication_error","message":"Incorrect \"key\"."}})");
  out.clear();
  append_upstream_error(
      out, 400, R"({"error":{"message":"max_tokens is too large","type":"BadRequestError","param":null,"code":400}})");
  EXPECT_EQ(out, R"({"type":"error","error":{"type":"invalid_request_error","message":"max_tokens is too large"}})");
  out.clear();
  append_upstream_error(out, 404, R"({"detail":"Not Found"})");
  EXPECT_EQ(json::parse(out).at("error").at("message"), "Not Found");
  out.clear();
  append_upstream_error(out, 500, "<html>");
  EXPECT_EQ(json::parse(out).at("error").at("message"), "Upstream answered 500: <html>");
  out.clear();
  append_upstream_error(out, 500, "");
  EXPECT_EQ(json::parse(out).at("error").at("message"), "Upstream answered 500.");
  // FastAPI's validation answer (vLLM's 422): `detail` a list of {loc, msg}.
  out.clear();
  append_upstream_error(
      out, 422,
      R"({"detail":[{"type":"less_than_equal","loc":["body","max_tokens"],"msg":"Input should be less than or equal to 8192","input":9000},
      {"type":"missing","loc":["body","messages",0,"content"],"msg":"Field required"}]})");
  EXPECT_EQ(json::parse(out), json::parse(R"({"type":"error","error":{"type":"invalid_request_error","message":
      "max_tokens: Input should be less than or equal to 8192; messages.0.content: Field required"}})"));
  out.clear();
  append_upstream_error(out, 422, R"({"detail":[{"loc":[]}]})");
  EXPECT_EQ(json::parse(out).at("error").at("message"), "Upstream answered 422.");
}

// vLLM's context-length 400 in Anthropic's words when its counts show which case it is (Claude Code compacts
// on "prompt is too long", lowers max_tokens on "input length and `max_tokens` exceed context limit"); both
// vLLM shapes; without counts, vLLM's words.
TEST(AnthropicResponse, ContextLengthRefusalsInAnthropicsWords) {
  const auto message_of = [](int status, std::string_view body) {
    std::string out;
    append_upstream_error(out, status, body);
    const auto v = json::parse(out);
    EXPECT_EQ(v.at("error").at("type"), status == 400 ? "invalid_request_error" : "api_error");
    return std::string(v.at("error").at("message").as_string());
  };
  for (const char* shape :
       {R"({{"error":{{"message":"{}","type":"BadRequestError","param":null,"code":400}}}})",
        R"({{"object":"error","message":"{}","type":"BadRequestError","param":null,"code":400}})"}) {
    const auto body = [&](std::string_view m) { return fmt::format(fmt::runtime(shape), m); };
    EXPECT_EQ(message_of(400, body("This model's maximum context length is 4096 tokens. However, you requested 5000 "
                                   "tokens (4900 in the messages, 100 in the completion). Please reduce the length "
                                   "of the messages or completion.")),
              "prompt is too long: 4900 tokens > 4096 maximum");
    EXPECT_EQ(message_of(400, body("This model's maximum context length is 4096 tokens. However, you requested 1000 "
                                   "output tokens and your prompt contains 3500 input tokens, for a total of 4500 "
                                   "tokens. Please reduce the length of the input prompt or the number of requested "
                                   "output tokens.")),
              "input length and `max_tokens` exceed context limit: 3500 + 1000 > 4096, decrease input length or "
              "`max_tokens` and try again");
    EXPECT_EQ(message_of(400, body("Requested token count exceeds the model's maximum context length of 4096 tokens. "
                                   "You requested a total of 5000 tokens: 4900 tokens from the input messages and "
                                   "100 tokens for the completion. Please reduce the number of tokens in the input "
                                   "messages or the completion to fit within the limit.")),
              "prompt is too long: 4900 tokens > 4096 maximum");
    const std::string chars =
        "You passed 90000 input characters and requested 100 output tokens. However, the model's context length is "
        "only 4096 tokens, resulting in a maximum input length of 3996 tokens (at most 15984 characters). Please "
        "reduce the length of the input prompt.";
    EXPECT_EQ(message_of(400, body(chars)), chars);
  }
  // A server's failure is not the request's length, whatever it says.
  const std::string m =
      "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
      "(4900 in the messages, 100 in the completion).";
  EXPECT_EQ(message_of(500, R"({"error":{"message":")" + m + R"(","code":500}})"), m);
}

TEST(AnthropicResponse, NoUpstreamIdTakesTheRequestId) {
  for (std::string_view id : {R"("id":"",)", R"("id":"chatcmpl-",)", ""}) {
    std::string out;
    ASSERT_TRUE(translate_message(
        fmt::format(R"({{{}"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":null,
        "tool_calls":[{{"type":"function","function":{{"name":"f","arguments":"{{}}"}}}}]}},"finish_reason":"tool_calls"}}]}})",
                    id),
        out, "req-7"));
    const auto v = json::parse(out);
    EXPECT_EQ(v.at("id"), "msg_req-7") << id;
    EXPECT_EQ(v.at("content").at(0).at("id"), "toolu_req-7_0") << id;
  }
}

TEST(AnthropicResponse, ToolIdsWeirMakesAreIdsAnthropicTakes) {
  // The message id holds the x-request-id sent upstream (the client's, as it came: any visible ASCII);
  // a tool_use id Weir makes of it must still match ^[a-zA-Z0-9_-]+$ when the conversation reaches Anthropic.
  for (std::string_view id : {R"("id":"chatcmpl-trace.42:7-ab",)", ""}) {
    std::string out;
    ASSERT_TRUE(translate_message(
        fmt::format(R"({{{}"model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":null,
        "tool_calls":[{{"type":"function","function":{{"name":"f","arguments":"{{}}"}}}},
                      {{"type":"function","function":{{"name":"g","arguments":"{{}}"}}}}]}},"finish_reason":"tool_calls"}}]}})",
                    id),
        out, "trace.42:7-ab"));
    const auto v = json::parse(out);
    EXPECT_EQ(v.at("id"), "msg_trace.42:7-ab") << id;  // (a message id is never sent back: as it was)
    const std::string_view t0(v.at("content").at(0).at("id").as_string());
    const std::string_view t1(v.at("content").at(1).at("id").as_string());
    EXPECT_TRUE(t0.starts_with("toolu_trace_42_7-ab_0-")) << t0;
    EXPECT_EQ(t0.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"),
              std::string_view::npos)
        << t0;
    EXPECT_NE(t0, t1);
  }
}

}  // namespace
}  // namespace weir::api::anthropic
