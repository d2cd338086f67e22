// OpenAI chat-completions request → Anthropic Messages request (type:
// anthropic pools): every mapped field, turns merged to alternate, the 400s
// for what Anthropic cannot express, and the light read of an Anthropic
// request that goes through as it came.
#include "api/anthropic/upstream_request.hpp"
#include "api/tool_ids.hpp"

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

namespace weir::api::anthropic {
namespace {

namespace json = boost::json;

constexpr UpstreamRequestOptions kOpts{.model = "claude-up", .default_max_tokens = 4096};

json::value anthropic(std::string_view chat, UpstreamRequestOptions o = kOpts) {
  std::string out;
  auto r = chat_to_messages(chat, o, out);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  if (!r) return nullptr;
  return json::parse(out);
}

core::Error failure(std::string_view chat) {
  std::string out;
  auto r = chat_to_messages(chat, kOpts, out);
  EXPECT_FALSE(r.has_value()) << out;
  return r ? core::Error{} : r.error();
}

TEST(AnthropicUpstreamRequest, MinimalChatGetsTheModelAndTheDefaultMaxTokens) {
  const auto a = anthropic(R"({"model":"gpt-x","messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(a, json::parse(R"({"model":"claude-up","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],
                               "max_tokens":4096})"));
}

TEST(AnthropicUpstreamRequest, SamplingFieldsStopAndUser) {
  const auto a = anthropic(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":7,
    "max_tokens":99,"temperature":0.5,"top_p":0.9,"top_k":40,"stop":"END","stream":true,"user":"u-1",
    "stream_options":{"include_usage":true},"frequency_penalty":1,"seed":3})");
  EXPECT_EQ(a.at("max_tokens"), 7);  // max_completion_tokens wins, as in OpenAI's API
  EXPECT_EQ(a.at("temperature"), 0.5);
  EXPECT_EQ(a.at("top_p"), 0.9);
  EXPECT_EQ(a.at("top_k"), 40);
  EXPECT_EQ(a.at("stop_sequences"), json::parse(R"(["END"])"));
  EXPECT_EQ(a.at("stream"), true);
  EXPECT_EQ(a.at("metadata"), json::parse(R"({"user_id":"u-1"})"));
  EXPECT_FALSE(a.as_object().contains("stream_options"));
  EXPECT_FALSE(a.as_object().contains("frequency_penalty"));
  EXPECT_FALSE(a.as_object().contains("seed"));
  const auto b =
      anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":["a","b"],"max_tokens":3})");
  EXPECT_EQ(b.at("stop_sequences"), json::parse(R"(["a","b"])"));
  EXPECT_EQ(b.at("max_tokens"), 3);
}

TEST(AnthropicUpstreamRequest, SystemAndDeveloperMessagesBecomeSystemBlocksInOrder) {
  const auto a = anthropic(R"({"model":"m","messages":[{"role":"system","content":"Be brief."},
    {"role":"user","content":"hi"},{"role":"developer","content":[{"type":"text","text":"No emoji."}]}]})");
  EXPECT_EQ(a.at("system"), json::parse(R"([{"type":"text","text":"Be brief."},{"type":"text","text":"No emoji."}])"));
  EXPECT_EQ(a.at("messages").as_array().size(), 1u);
}

TEST(AnthropicUpstreamRequest, ImagesAsBase64AndUrlSources) {
  const auto a = anthropic(R"({"model":"m","messages":[{"role":"user","content":[
    {"type":"text","text":"what is it?"},
    {"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"high"}},
    {"type":"image_url","image_url":{"url":"https://example.com/cat.jpg"}}]}]})");
  EXPECT_EQ(a.at("messages").at(0).at("content"), json::parse(R"([
    {"type":"text","text":"what is it?"},
    {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},
    {"type":"image","source":{"type":"url","url":"https://example.com/cat.jpg"}}])"));
  EXPECT_EQ(
      failure(
          R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png,abc"}}]}]})")
          .status,
      400);
  EXPECT_EQ(
      failure(
          R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"ftp://x"}}]}]})")
          .param,
      "messages");
}

TEST(AnthropicUpstreamRequest, ToolCallsResultsAndTurnsThatAlternate) {
  const auto a = anthropic(R"({"model":"m","messages":[
    {"role":"user","content":"weather in Paris and Rome?"},
    {"role":"assistant","content":"Checking.","tool_calls":[
      {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
      {"id":"call_2","type":"function","function":{"name":"get_weather","arguments":""}}]},
    {"role":"tool","tool_call_id":"call_1","content":"sunny"},
    {"role":"tool","tool_call_id":"call_2","content":[{"type":"text","text":"rain"},{"type":"text","text":"cold"}]},
    {"role":"user","content":"thanks"}]})");
  EXPECT_EQ(a.at("messages"), json::parse(R"([
    {"role":"user","content":[{"type":"text","text":"weather in Paris and Rome?"}]},
    {"role":"assistant","content":[{"type":"text","text":"Checking."},
      {"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}},
      {"type":"tool_use","id":"call_2","name":"get_weather","input":{}}]},
    {"role":"user","content":[{"type":"tool_result","tool_use_id":"call_1","content":"sunny"},
      {"type":"tool_result","tool_use_id":"call_2","content":"rain\ncold"},
      {"type":"text","text":"thanks"}]}])"));
}

TEST(AnthropicUpstreamRequest, ACacheBreakpointOnAToolMessageGoesOnItsToolResult) {
  // Agent loops mark their last tool result: the marker on its parts was dropped with the parts.
  const auto a = anthropic(R"({"model":"m","messages":[
    {"role":"user","content":"go"},
    {"role":"assistant","tool_calls":[{"id":"t1","type":"function","function":{"name":"f","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"t1","content":[{"type":"text","text":"big","cache_control":{"type":"ephemeral"}}]}]})");
  const auto& last = a.at("messages").as_array().back().at("content").as_array().back();
  EXPECT_EQ(
      last,
      json::parse(R"({"type":"tool_result","tool_use_id":"t1","content":"big","cache_control":{"type":"ephemeral"}})"));
}

TEST(AnthropicUpstreamRequest, ToolsAndToolChoice) {
  const auto a = anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],
    "tools":[{"type":"function","function":{"name":"f","description":"does f","parameters":{"type":"object","properties":{"a":{"type":"integer"}}},"strict":true}},
             {"type":"function","function":{"name":"g"}}],
    "tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false})");
  EXPECT_EQ(a.at("tools"), json::parse(R"([
    {"name":"f","description":"does f","input_schema":{"type":"object","properties":{"a":{"type":"integer"}}}},
    {"name":"g","input_schema":{"type":"object","properties":{}}}])"));
  EXPECT_EQ(a.at("tool_choice"), json::parse(R"({"type":"tool","name":"f","disable_parallel_tool_use":true})"));
  auto choice = [](std::string_view c) {
    return anthropic(fmt::format(R"({{"model":"m","messages":[{{"role":"user","content":"x"}}],
      "tools":[{{"type":"function","function":{{"name":"f"}}}}],"tool_choice":{}}})",
                                 c))
        .at("tool_choice");
  };
  EXPECT_EQ(choice(R"("auto")"), json::parse(R"({"type":"auto"})"));
  EXPECT_EQ(choice(R"("required")"), json::parse(R"({"type":"any"})"));
  EXPECT_EQ(choice(R"("none")"), json::parse(R"({"type":"none"})"));
  // parallel_tool_calls: false without a tool_choice: auto, one call at a time.
  const auto b = anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],
    "tools":[{"type":"function","function":{"name":"f"}}],"parallel_tool_calls":false})");
  EXPECT_EQ(b.at("tool_choice"), json::parse(R"({"type":"auto","disable_parallel_tool_use":true})"));
}

TEST(AnthropicUpstreamRequest, ReasoningEffortBecomesAThinkingBudget) {
  const auto a = anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"medium"})");
  EXPECT_EQ(a.at("thinking"), json::parse(R"({"type":"enabled","budget_tokens":4096})"));
  EXPECT_EQ(a.at("max_tokens"), 4096 + 4096);  // the default answer's room on top of the budget
  const auto b = anthropic(
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"high","max_tokens":2000})");
  EXPECT_EQ(b.at("thinking").at("budget_tokens"), 1999);  // below max_tokens, as Anthropic requires
  EXPECT_EQ(
      failure(R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"low","max_tokens":500})")
          .param,
      "max_tokens");
  const auto c = anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"minimal"})");
  EXPECT_FALSE(c.as_object().contains("thinking"));
  // Anthropic's own thinking object (extra_body) goes as it is.
  const auto d = anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"low",
    "thinking":{"type":"enabled","budget_tokens":2048}})");
  EXPECT_EQ(d.at("thinking"), json::parse(R"({"type":"enabled","budget_tokens":2048})"));
  // A tool loop's next turn: the assistant's tool call comes back with no (signed) thinking block, which
  // Anthropic refuses while thinking is on: that turn goes without thinking.
  const auto e = anthropic(R"({"model":"m","reasoning_effort":"medium","messages":[
    {"role":"user","content":"time?"},
    {"role":"assistant","content":null,"reasoning_content":"hm","tool_calls":[{"id":"c1","type":"function",
      "function":{"name":"now","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"c1","content":"12:00"}],"tools":[{"type":"function","function":{"name":"now"}}]})");
  EXPECT_FALSE(e.as_object().contains("thinking")) << e;
  EXPECT_EQ(e.at("max_tokens"), 4096);
}

TEST(AnthropicUpstreamRequest, ToolIdsAnthropicRefusesAreMappedTheSameWayInCallAndResult) {
  // Kimi-K2 on vLLM names its calls functions.NAME:INDEX; a Responses client may send any call_id. Anthropic
  // takes ^[a-zA-Z0-9_-]+$ only: the call's id and its result's id are mapped alike, so they still pair.
  const auto a = anthropic(R"({"model":"m","messages":[
    {"role":"user","content":"q"},
    {"role":"assistant","tool_calls":[
      {"id":"functions.f:0","type":"function","function":{"name":"f","arguments":"{}"}},
      {"id":"functions.f:1","type":"function","function":{"name":"f","arguments":"{}"}},
      {"id":"toolu_ok-1","type":"function","function":{"name":"f","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"functions.f:0","content":"r0"},
    {"role":"tool","tool_call_id":"functions.f:1","content":"r1"},
    {"role":"tool","tool_call_id":"toolu_ok-1","content":"r2"}]})");
  const auto& calls = a.at("messages").as_array()[1].at("content").as_array();
  const auto& results = a.at("messages").as_array()[2].at("content").as_array();
  ASSERT_EQ(calls.size(), 3u);
  ASSERT_EQ(results.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    const std::string_view id(calls[i].at("id").as_string());
    EXPECT_EQ(id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"),
              std::string_view::npos)
        << id;
    EXPECT_EQ(results[i].at("tool_use_id"), calls[i].at("id"));
  }
  EXPECT_NE(calls[0].at("id"), calls[1].at("id"));
  EXPECT_EQ(calls[2].at("id"), "toolu_ok-1");  // a valid id goes as it is
  EXPECT_TRUE(std::string_view(calls[0].at("id").as_string()).starts_with("functions_f_0-"));
}

TEST(AnthropicUpstreamRequest, WhitespaceOnlyStopStringsAreLeftOut) {
  // Anthropic: "each stop sequence must contain non-whitespace".
  const auto a = anthropic(
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":["\n","END"," \t","","\u3000\u00a0"]})");
  EXPECT_EQ(a.at("stop_sequences"), json::parse(R"(["END"])"));
  const auto b = anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":"\n\n"})");
  EXPECT_FALSE(b.as_object().contains("stop_sequences")) << b;
  const auto c = anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":["\n"]})");
  EXPECT_FALSE(c.as_object().contains("stop_sequences")) << c;
  const auto d = anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":[" a\n","\u00e9"]})");
  EXPECT_EQ(d.at("stop_sequences"), json::parse(R"([" a\n","\u00e9"])"));
  EXPECT_EQ(failure(R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":["\n",1]})").param, "stop");
}

TEST(AnthropicUpstreamRequest, ThinkingFromReasoningEffortLeavesOutWhatAnthropicRefusesWithIt) {
  // Sampling: thinking runs at temperature 1, top_p at least 0.95, no top_k.
  const auto a = anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"low",
    "temperature":0.2,"top_k":5,"top_p":0.5})");
  EXPECT_TRUE(a.as_object().contains("thinking")) << a;
  EXPECT_FALSE(a.as_object().contains("temperature")) << a;
  EXPECT_FALSE(a.as_object().contains("top_k")) << a;
  EXPECT_FALSE(a.as_object().contains("top_p")) << a;
  const auto b = anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"low",
    "temperature":1,"top_p":0.97})");
  EXPECT_EQ(b.at("temperature"), 1);
  EXPECT_EQ(b.at("top_p"), 0.97);
  // Without thinking they go as they came.
  const auto c = anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"none",
    "temperature":0.2,"top_k":5})");
  EXPECT_EQ(c.at("temperature"), 0.2);
  EXPECT_EQ(c.at("top_k"), 5);
  // The client's own thinking object is Anthropic's request as written: its sampling fields too.
  const auto d = anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],
    "thinking":{"type":"enabled","budget_tokens":2048},"temperature":0.2})");
  EXPECT_EQ(d.at("temperature"), 0.2);
  // Still a number or a 400, thinking or not.
  EXPECT_EQ(failure(R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"low",
    "temperature":"hot"})")
                .param,
            "temperature");
  // A forced tool call (required, or a named function): no thinking, as Anthropic refuses both together.
  for (const char* choice : {R"("required")", R"({"type":"function","function":{"name":"f"}})"}) {
    const auto e = anthropic(fmt::format(R"({{"model":"m","messages":[{{"role":"user","content":"x"}}],
      "reasoning_effort":"high","temperature":0.3,"tools":[{{"type":"function","function":{{"name":"f"}}}}],
      "tool_choice":{}}})",
                                         choice));
    EXPECT_FALSE(e.as_object().contains("thinking")) << e;
    EXPECT_EQ(e.at("max_tokens"), 4096) << e;  // no budget added
    EXPECT_EQ(e.at("temperature"), 0.3) << e;  // and the sampling fields stay
  }
  const auto f = anthropic(R"({"model":"m","messages":[{"role":"user","content":"x"}],"reasoning_effort":"high",
    "tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto"})");
  EXPECT_TRUE(f.as_object().contains("thinking")) << f;
}

TEST(AnthropicUpstreamRequest, CacheControlOnPartsAndToolsIsKept) {
  const auto a = anthropic(R"({"model":"m","messages":[{"role":"user","content":[
    {"type":"text","text":"long doc","cache_control":{"type":"ephemeral"}}]}],
    "tools":[{"type":"function","function":{"name":"f"},"cache_control":{"type":"ephemeral"}}]})");
  EXPECT_EQ(a.at("messages").at(0).at("content").at(0).at("cache_control"), json::parse(R"({"type":"ephemeral"})"));
  EXPECT_EQ(a.at("tools").at(0).at("cache_control"), json::parse(R"({"type":"ephemeral"})"));
}

TEST(AnthropicUpstreamRequest, WhatAnthropicCannotExpressIsA400NamingTheField) {
  const auto hi = R"("messages":[{"role":"user","content":"x"}])";
  EXPECT_EQ(failure(fmt::format(R"({{"model":"m",{},"n":2}})", hi)).param, "n");
  EXPECT_EQ(failure(fmt::format(R"({{"model":"m",{},"logprobs":true}})", hi)).param, "logprobs");
  EXPECT_EQ(failure(fmt::format(R"({{"model":"m",{},"response_format":{{"type":"json_object"}}}})", hi)).param,
            "response_format");
  EXPECT_EQ(failure(fmt::format(R"({{"model":"m",{},"modalities":["text","audio"]}})", hi)).param, "modalities");
  EXPECT_EQ(failure(fmt::format(R"({{"model":"m",{},"tools":[{{"type":"web_search"}}]}})", hi)).param, "tools");
  EXPECT_EQ(failure(fmt::format(R"({{"model":"m",{},"tool_choice":{{"type":"allowed_tools"}}}})", hi)).param,
            "tool_choice");
  const auto e =
      failure(R"({"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]})");
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("messages[0].content[0].type"), std::string::npos) << e.message;
  EXPECT_EQ(failure(R"({"model":"m","messages":[{"role":"assistant","tool_calls":[
    {"id":"c","type":"function","function":{"name":"f","arguments":"[1,2]"}}]}]})")
                .param,
            "messages");
  EXPECT_EQ(failure(R"({"model":"m","messages":[{"role":"function","name":"f","content":"x"}]})").param, "messages");
  EXPECT_EQ(failure(R"({"model":"m","messages":[{"role":"tool","content":"x"}]})").param, "messages");
  // n: 1, logprobs: false and a text response_format are what Anthropic does anyway.
  anthropic(fmt::format(R"({{"model":"m",{},"n":1,"logprobs":false,"response_format":{{"type":"text"}}}})", hi));
}

// OpenAI's structured outputs (a json_schema response_format: the SDKs' parse()) are Anthropic's
// output_config.format; a json_schema without an object schema is a 400.
TEST(AnthropicUpstreamRequest, AJsonSchemaResponseFormatIsOutputConfigFormat) {
  const auto a = anthropic(R"({"model":"m","messages":[{"role":"user","content":"John is 42"}],
    "response_format":{"type":"json_schema","json_schema":{"name":"Person","strict":true,"schema":{"type":"object",
    "properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"],
    "additionalProperties":false}}}})");
  EXPECT_EQ(a.at("output_config"), json::parse(R"({"format":{"type":"json_schema","schema":{"type":"object",
    "properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"],
    "additionalProperties":false}}})"));
  EXPECT_FALSE(a.as_object().contains("response_format"));
  EXPECT_EQ(failure(R"({"model":"m","messages":[{"role":"user","content":"x"}],
    "response_format":{"type":"json_schema","json_schema":{"name":"P"}}})")
                .param,
            "response_format");
}

TEST(AnthropicUpstreamRequest, IntegersBeyond64BitsSurviveInSchemasAndArguments) {
  std::string out;
  ASSERT_TRUE(chat_to_messages(R"({"model":"m","messages":[{"role":"user","content":"x"}],
    "tools":[{"type":"function","function":{"name":"f","parameters":{"maximum":18446744073709551616,"minimum":-99999999999999999999,"x":1.5}}}]})",
                               kOpts, out));
  EXPECT_NE(out.find(R"("maximum":18446744073709551616)"), std::string::npos) << out;
  EXPECT_NE(out.find(R"("minimum":-99999999999999999999)"), std::string::npos) << out;
  ASSERT_TRUE(chat_to_messages(R"({"model":"m","messages":[{"role":"user","content":"x"},
    {"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"n\": 123456789012345678901234567890}"}}]}]})",
                               kOpts, out));
  EXPECT_NE(out.find(R"("input":{"n":123456789012345678901234567890})"), std::string::npos) << out;
}

TEST(AnthropicUpstreamRequest, ReadsAnAnthropicRequestForTheGatewayOnly) {
  auto f = read_messages_request(R"({"model":"claude","max_tokens":9,"stream":true,"system":"sys",
    "messages":[{"role":"user","content":[{"type":"text","text":"hello"},
      {"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAAAAAAAAAAAAAAAAAA"}},
      {"type":"document","source":{"type":"text","media_type":"text/plain","data":"doc"}},
      {"type":"document","source":{"type":"content","content":[{"type":"text","text":"four"}]}},
      {"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0xLjQK"}}]}],
    "tools":[{"type":"web_search_20250305","name":"web_search"}]})",
                                 false);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->model, "claude");
  EXPECT_EQ(f->max_tokens, 9u);
  EXPECT_TRUE(f->stream);
  // sys, hello, a text document's data and a content document's text (a way past limits and budgets when
  // left out), web_search; no image's or PDF's base64.
  EXPECT_EQ(f->prompt_bytes, 3u + 5u + 3u + 4u + 10u);
  EXPECT_FALSE(read_messages_request(R"({"model":"c","messages":[]})", false));  // max_tokens required
  EXPECT_TRUE(read_messages_request(R"({"model":"c","messages":[]})", true));    // not for a count
  EXPECT_FALSE(read_messages_request(R"({"max_tokens":1,"messages":[]})", false));
  EXPECT_FALSE(read_messages_request(R"({"model":"c","max_tokens":1,"messages":[],"stream":"yes"})", false));
  EXPECT_FALSE(read_messages_request("not json", false));
}

// What admission reserves for a request without max_tokens: the max_tokens the translation sends.
TEST(AnthropicUpstreamRequest, SaysTheMaxTokensItSentAndItsBound) {
  std::uint64_t sent = 0;
  UpstreamRequestOptions o = kOpts;
  o.max_tokens_sent = &sent;
  anthropic(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})", o);
  EXPECT_EQ(sent, 4096u);
  anthropic(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":77})", o);
  EXPECT_EQ(sent, 77u);
  anthropic(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"reasoning_effort":"high"})", o);
  EXPECT_EQ(sent, 4096u + 16384u);
  EXPECT_EQ(default_answer_cap(R"({"messages":[],"reasoning_effort":"high"})", 4096), 4096u + 16384u);
  EXPECT_EQ(default_answer_cap(R"({"messages":[],"reasoning_effort":"low"})", 100), 100u + 1024u);
  EXPECT_EQ(default_answer_cap(R"({"messages":[]})", 4096), 4096u);
  // The client's own thinking: its budget is within max_tokens.
  EXPECT_EQ(
      default_answer_cap(R"({"thinking":{"type":"enabled","budget_tokens":2000},"reasoning_effort":"high"})", 4096),
      4096u);
}

// An Anthropic request to an Anthropic pool: its image and document sources are media parts.
TEST(AnthropicUpstreamRequest, MessagesRequestCountsMediaSources) {
  const auto f = read_messages_request(R"({"model":"c","max_tokens":5,"messages":[{"role":"user","content":[
    {"type":"text","text":"describe"},
    {"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},
    {"type":"document","source":{"type":"url","url":"https://e.com/a.pdf"}},
    {"type":"document","source":{"type":"text","media_type":"text/plain","data":"plain"}}]}]})",
                                       false);
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->media_parts, 2u);
  EXPECT_EQ(f->prompt_bytes, 8u + 5u);  // the text source is text
}

}  // namespace
}  // namespace weir::api::anthropic

namespace weir::api::anthropic {
namespace {

// A conversation begun on an OpenAI-compatible model (Kimi-K2 on vLLM names its calls `functions.NAME:INDEX`)
// goes on at an Anthropic pool: the content blocks' `id` and `tool_use_id` that Anthropic refuses are made ids it
// takes (paired as before); every other byte stays as the client sent it.
TEST(AnthropicMapToolIds, IdsAnthropicRefusesAreMappedAndNothingElseChanges) {
  const std::string body =
      R"({"model":"c","max_tokens":5,"temperature":1.0, "messages":[{"role":"user","content":"weather?"},)"
      R"({"role":"assistant","content":[{"type":"text","text":"{\"id\":\"functions.x:0\"}"},)"
      R"({"type":"tool_use","id":"functions.get_weather:0","name":"get_weather","input":{"id":"functions.get_weather:0"}},)"
      R"({"type":"tool_use","id":"toolu_ok-1","name":"f","input":{}}]},)"
      R"({"role":"user","content":[{"tool_use_id":"functions.get_weather:0","type":"tool_result","content":"sunny"},)"
      R"({"type":"tool_result","tool_use_id":"call\u002e1","content":[{"type":"text","text":"x","id":"a.b"}]},)"
      R"({"type":"tool_result","tool_use_id":"toolu_ok-1","content":"ok"}]}],"id":"top.level"})";
  std::string out;
  ASSERT_TRUE(map_tool_ids(body, out));
  std::string kimi = "functions.get_weather:0";
  to_anthropic_tool_id(kimi);
  std::string dotted = "call.1";
  to_anthropic_tool_id(dotted);
  std::string want = body;
  const auto replace = [&](std::string_view from, std::string_view to, std::size_t nth) {
    std::size_t at = 0;
    for (std::size_t i = 0; i <= nth; ++i) at = want.find(from, i == 0 ? 0 : at + 1);
    ASSERT_NE(at, std::string::npos) << from;
    want.replace(at, from.size(), to);
  };
  // (the tool_use's id, not its input's member of that name; the tool_result's tool_use_id)
  replace(R"("id":"functions.get_weather:0")", fmt::format(R"("id":"{}")", kimi), 0);
  replace(R"("tool_use_id":"functions.get_weather:0")", fmt::format(R"("tool_use_id":"{}")", kimi), 0);
  replace(R"("tool_use_id":"call\u002e1")", fmt::format(R"("tool_use_id":"{}")", dotted), 0);
  EXPECT_EQ(out, want);
  EXPECT_TRUE(is_anthropic_tool_id(kimi));
  // Nothing to map (or no tool block at all): false, `out` untouched.
  out = "untouched";
  EXPECT_FALSE(
      map_tool_ids(R"({"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1"}]}]})", out));
  EXPECT_FALSE(map_tool_ids(R"({"messages":[{"role":"user","content":"a.b"}],"id":"x.y"})", out));
  EXPECT_EQ(out, "untouched");
}

}  // namespace
}  // namespace weir::api::anthropic
