// OpenAI chat.completion (vLLM v0.10.1 bodies) → Responses' Response
// object: items in order, ids, status, usage, and the echo.
#include "api/responses/response.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

namespace weir::api::responses {
namespace {

namespace json = boost::json;

constexpr std::string_view kEcho = R"("tools":[],"store":false)";

json::value response(std::string_view body) {
  std::string out;
  EXPECT_EQ(translate_response(body, kEcho, "req-1", out), Translated::ok) << out;
  return json::parse(out);
}

TEST(ResponsesResponse, NoUpstreamIdOrCreatedTakesTheRequestIdAndNow) {
  // An OpenAI-compatible server without id or created: every Response was resp_ at 1970.
  const auto v = response(R"({"object":"chat.completion","model":"m","choices":[{"index":0,
      "message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]})");
  EXPECT_EQ(v.at("id"), "resp_req-1");
  EXPECT_EQ(v.at("output").at(0).at("id"), "msg_req-1");
  EXPECT_GT(v.at("created_at").as_int64(), 1'700'000'000);
  const auto w = response(R"({"id":"","created":0,"object":"chat.completion","model":"m","choices":[{"index":0,
      "message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]})");
  EXPECT_EQ(w.at("id"), "resp_req-1");
  EXPECT_GT(w.at("created_at").as_int64(), 1'700'000'000);
  // Just "chatcmpl-": no id either (it gave "resp_").
  const auto x = response(R"({"id":"chatcmpl-","object":"chat.completion","model":"m","choices":[{"index":0,
      "message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]})");
  EXPECT_EQ(x.at("id"), "resp_req-1");
}

TEST(ResponsesResponse, CacheWriteTokensAreTheUpstreams) {
  // A type: anthropic pool's cache_creation_input_tokens reach the chat usage as cache_write_tokens.
  const auto v = response(R"({"id":"chatcmpl-c","object":"chat.completion","model":"m","choices":[{"index":0,
      "message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":30,
      "completion_tokens":2,"total_tokens":32,"prompt_tokens_details":{"cached_tokens":5,"cache_write_tokens":20}}})");
  EXPECT_EQ(v.at("usage").at("input_tokens_details"), json::parse(R"({"cached_tokens":5,"cache_write_tokens":20})"));
}

TEST(ResponsesResponse, TextMessage) {
  const auto v = response(
      R"({"id":"chatcmpl-abc","object":"chat.completion","created":1700000000,"model":"mock-model","choices":[{"index":0,
      "message":{"role":"assistant","content":" river stone","refusal":null,"annotations":null,"audio":null,
      "function_call":null,"tool_calls":[],"reasoning_content":null},"logprobs":null,"finish_reason":"stop","stop_reason":null}],
      "service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2,
      "prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null})");
  // completed_at: Weir's clock as the response completed (the SDK's Response has it), never before created_at.
  auto w = v;
  EXPECT_GT(w.at("completed_at").as_int64(), 1'700'000'000);
  w.as_object().erase("completed_at");
  EXPECT_EQ(w, json::parse(R"({"id":"resp_abc","object":"response","created_at":1700000000,"status":"completed",
    "error":null,"incomplete_details":null,"model":"mock-model",
    "output":[{"id":"msg_abc","type":"message","role":"assistant","status":"completed",
      "content":[{"type":"output_text","text":" river stone","annotations":[],"logprobs":[]}]}],
    "usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":0,"cache_write_tokens":0},"output_tokens":2,
      "output_tokens_details":{"reasoning_tokens":0},"total_tokens":11},
    "tools":[],"store":false})"));
}

TEST(ResponsesResponse, ReasoningThenTextThenToolCallsWithCachedTokens) {
  const auto v =
      response(R"({"id":"chatcmpl-x","created":5,"model":"m","choices":[{"index":0,"message":{"role":"assistant",
    "content":"Let me check.","reasoning_content":"The user wants weather.","tool_calls":[
      {"id":"chatcmpl-tool-1","type":"function","function":{"name":"get_weather","arguments":"{\"q\": \"Paris\"}"}},
      {"type":"function","function":{"name":"get_time","arguments":"{}"}}]},
    "finish_reason":"tool_calls","stop_reason":null}],
    "usage":{"prompt_tokens":100,"completion_tokens":7,"total_tokens":107,"prompt_tokens_details":{"cached_tokens":64},
      "completion_tokens_details":{"reasoning_tokens":4}}})");
  EXPECT_EQ(v.at("status"), "completed");
  EXPECT_EQ(v.at("output"), json::parse(R"([
    {"id":"rs_x","type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"The user wants weather."}],
      "status":"completed"},
    {"id":"msg_x","type":"message","role":"assistant","status":"completed",
      "content":[{"type":"output_text","text":"Let me check.","annotations":[],"logprobs":[]}]},
    {"id":"fc_x_0","type":"function_call","call_id":"chatcmpl-tool-1","name":"get_weather",
      "arguments":"{\"q\": \"Paris\"}","status":"completed"},
    {"id":"fc_x_1","type":"function_call","call_id":"call_x_1","name":"get_time","arguments":"{}","status":"completed"}])"));
  EXPECT_EQ(v.at("usage"), json::parse(R"({"input_tokens":100,"input_tokens_details":{"cached_tokens":64,
    "cache_write_tokens":0},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":4},"total_tokens":107})"));
}

// Mistral's API gives message.content as a list of parts: the text parts joined are the message (output_text),
// the thinking parts the reasoning; other parts skipped.
TEST(ResponsesResponse, ContentPartsAreTheMessageAndTheReasoning) {
  const auto v = response(R"({"id":"chatcmpl-p","model":"m","choices":[{"index":0,"message":{"role":"assistant",
    "content":[{"type":"thinking","thinking":[{"type":"text","text":"reasoning"}]},{"type":"text","text":"The answer"},
    {"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":" is 42."}]},"finish_reason":"stop"}]})");
  const auto& out = v.at("output").as_array();
  ASSERT_EQ(out.size(), 2u) << json::serialize(v);
  EXPECT_EQ(out[0].at("type"), "reasoning");
  EXPECT_EQ(out[0].at("content").at(0).at("text"), "reasoning");
  EXPECT_EQ(out[1].at("type"), "message");
  EXPECT_EQ(out[1].at("content").at(0).at("text"), "The answer is 42.");
}

TEST(ResponsesResponse, LengthIsIncomplete) {
  auto v = response(R"({"id":"chatcmpl-l","model":"m","choices":[{"index":0,"message":{"role":"assistant",
    "content":"cut"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}})");
  EXPECT_EQ(v.at("status"), "incomplete");
  EXPECT_EQ(v.at("incomplete_details"), json::parse(R"({"reason":"max_output_tokens"})"));
  EXPECT_TRUE(v.at("completed_at").is_null());  // (only a completed response has one)
  EXPECT_EQ(v.at("output").at(0).at("status"), "incomplete");
  v = response(R"({"id":"chatcmpl-f","model":"m","choices":[{"index":0,"message":{"role":"assistant",
    "content":"x"},"finish_reason":"content_filter"}]})");
  EXPECT_EQ(v.at("incomplete_details").at("reason"), "content_filter");
  EXPECT_TRUE(v.at("usage").is_null());  // no usage upstream: none invented (the stream says null too)
  // `reasoning` (newer vLLM) is read as reasoning_content; an empty message gives no message item.
  v = response(R"({"id":"chatcmpl-r","model":"m","choices":[{"index":0,"message":{"role":"assistant",
    "content":"","reasoning":"hm"},"finish_reason":"stop"}]})");
  ASSERT_EQ(v.at("output").as_array().size(), 1u);
  EXPECT_EQ(v.at("output").at(0).at("type"), "reasoning");
}

TEST(ResponsesResponse, NotACompletionIsRefused) {
  for (std::string_view body : {R"({"id":"x","choices":[]})", "not json", R"({"object":"list"})"}) {
    std::string out;
    EXPECT_EQ(translate_response(body, kEcho, "req-1", out), Translated::not_a_completion) << body;
  }
}

TEST(ResponsesResponse, UnencodedArgumentsAreTheirJsonText) {
  // Arguments sent as a JSON value, not a string: its text, read as that text would be (they were "{}").
  const auto call = [](std::string_view args) {
    return response(fmt::format(R"({{"id":"chatcmpl-a","model":"m","choices":[{{"index":0,"message":{{
      "role":"assistant","tool_calls":[{{"id":"c","type":"function","function":{{"name":"f","arguments":{}}}}}]}},
      "finish_reason":"tool_calls"}}]}})",
                                args))
        .at("output")
        .at(0)
        .at("arguments");
  };
  EXPECT_EQ(json::parse(call(R"({"city": "Paris", "n": [1, 2]})").as_string()),
            json::parse(R"({"city":"Paris","n":[1,2]})"));
  EXPECT_EQ(call("5"), "5");  // (as the string "5" is given)
  EXPECT_EQ(call("[1]"), "[1]");
  EXPECT_EQ(call("true"), "true");
  EXPECT_EQ(call("null"), "{}");
}

TEST(ResponsesResponse, InvalidArgumentsAreRefusedUnlessCutByLength) {
  const auto body = [](std::string_view finish) {
    return fmt::format(R"({{"id":"chatcmpl-a","model":"m","choices":[{{"index":0,"message":{{"role":"assistant",
      "tool_calls":[{{"id":"c1","type":"function","function":{{"name":"f","arguments":"{{\"city\":"}}}}]}},
      "finish_reason":"{}"}}]}})",
                       finish);
  };
  std::string out;
  EXPECT_EQ(translate_response(body("tool_calls"), kEcho, "req-1", out), Translated::invalid_arguments);
  EXPECT_EQ(out, "function call c1 (f)");
  const auto v = response(body("length"));
  EXPECT_EQ(v.at("status"), "incomplete");
  EXPECT_EQ(v.at("output").at(0).at("arguments"), R"({"city":)");
}

// Only the call the limit cut (the last item) is exempt under "length": an earlier call with garbled arguments
// is refused as without the limit, and the cut call's item is the incomplete one.
TEST(ResponsesResponse, AnEarlierCallWithGarbledArgumentsIsRefusedUnderLengthToo) {
  const auto body = [](std::string_view first, std::string_view finish) {
    return fmt::format(R"({{"id":"chatcmpl-a","model":"m","choices":[{{"index":0,"message":{{"role":"assistant",
      "tool_calls":[{{"id":"c0","type":"function","function":{{"name":"f","arguments":"{}"}}}},
                    {{"id":"c1","type":"function","function":{{"name":"g","arguments":"{{\"tz\": \"U"}}}}]}},
      "finish_reason":"{}"}}]}})",
                       first, finish);
  };
  std::string out;
  for (const std::string_view finish : {"length", "tool_calls", "stop"}) {
    EXPECT_EQ(translate_response(body(R"({\"r\": tru)", finish), kEcho, "req-1", out), Translated::invalid_arguments)
        << finish;
    EXPECT_EQ(out, "function call c0 (f)");
  }
  const auto v = response(body(R"({\"r\": true})", "length"));
  EXPECT_EQ(v.at("status"), "incomplete");
  EXPECT_EQ(v.at("output").at(0).at("status"), "completed");
  EXPECT_EQ(v.at("output").at(1).at("status"), "incomplete");
  EXPECT_EQ(v.at("output").at(1).at("arguments"), R"({"tz": "U)");
}

// The choice's logprobs (asked for with include message.output_text.logprobs) are the output_text's.
TEST(ResponsesResponse, LogprobsAreTheOutputTexts) {
  const auto v = response(R"({"id":"chatcmpl-l","model":"m","choices":[{"index":0,"message":{"role":"assistant",
      "content":"ok"},"finish_reason":"stop","logprobs":{"content":[{"token":"o","logprob":-0.5,"bytes":[111],
      "top_logprobs":[{"token":"o","logprob":-0.5,"bytes":[111]},{"token":"a","logprob":-1.5,"bytes":[97]}]},
      {"token":"k","logprob":-0.01,"bytes":[107],"top_logprobs":[]}]}}]})");
  EXPECT_EQ(v.at("output").at(0).at("content").at(0).at("logprobs"),
            json::parse(R"([{"token":"o","logprob":-0.5,"bytes":[111],"top_logprobs":[{"token":"o","logprob":-0.5,
      "bytes":[111]},{"token":"a","logprob":-1.5,"bytes":[97]}]},{"token":"k","logprob":-0.01,"bytes":[107],
      "top_logprobs":[]}])"));
}

TEST(ResponsesResponse, UpstreamErrorParamNamesTheResponsesField) {
  const auto param = [](std::string_view p) {
    std::string out;
    append_upstream_error(out, 400,
                          fmt::format(R"({{"object":"error","message":"m","type":"BadRequestError",
      "param":"{}","code":400}})",
                                      p));
    return json::parse(out).at("error").at("param");
  };
  EXPECT_EQ(param("max_tokens"), "max_output_tokens");
  EXPECT_EQ(param("max_completion_tokens"), "max_output_tokens");
  EXPECT_EQ(param("messages"), "input");
  EXPECT_EQ(param("messages[2].content"), "input");
  EXPECT_EQ(param("response_format"), "text");
  EXPECT_EQ(param("temperature"), "temperature");
  EXPECT_EQ(param("messagesx"), "messagesx");
}

TEST(ResponsesResponse, StatusOf) {
  std::string_view reason;
  EXPECT_EQ(status_of("stop", reason), "completed");
  EXPECT_TRUE(reason.empty());
  EXPECT_EQ(status_of("tool_calls", reason), "completed");
  EXPECT_EQ(status_of("length", reason), "incomplete");
  EXPECT_EQ(reason, "max_output_tokens");
  EXPECT_EQ(status_of("", reason), "completed");
}

TEST(ResponsesResponse, CallIdsWeirMakesAreIdsEveryApiTakes) {
  // call_<x-request-id sent upstream>_<n>: the client's id as it came; replayed to an Anthropic model it must
  // match ^[a-zA-Z0-9_-]+$.
  const auto v = response(R"({"id":"chatcmpl-trace.42:7-ab","created":5,"model":"m","choices":[{"index":0,
    "message":{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]},
    "finish_reason":"tool_calls"}]})");
  const std::string call_id(v.at("output").at(0).at("call_id").as_string());
  EXPECT_TRUE(call_id.starts_with("call_trace_42_7-ab_0-")) << call_id;
  EXPECT_EQ(call_id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"),
            std::string::npos)
      << call_id;
}

}  // namespace
}  // namespace weir::api::responses
