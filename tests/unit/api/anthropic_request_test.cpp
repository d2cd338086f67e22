// Anthropic Messages request → OpenAI chat-completions body: every mapped
// field, the content blocks, and the 400s for bad input.
#include "api/anthropic/request.hpp"
#include "api/anthropic/upstream_request.hpp"

#include <gtest/gtest.h>

#include <utility>

#include <fmt/format.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

namespace weir::api::anthropic {
namespace {

namespace json = boost::json;

// (`vllm`: the upstream takes vLLM's extensions, as a self-hosted pool's continuous_usage says.)
json::value upstream(std::string_view body, Target t = Target::messages, RequestFields* fields = nullptr,
                     bool vllm = true) {
  std::string out;
  auto f = translate_request(t, body, out, vllm);
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  if (!f) return nullptr;
  if (fields) *fields = *f;
  return json::parse(out);
}

core::Error failure(std::string_view body, Target t = Target::messages) {
  std::string out;
  auto f = translate_request(t, body, out);
  EXPECT_FALSE(f.has_value());
  return f ? core::Error{} : f.error();
}

TEST(AnthropicRequest, MinimalRequest) {
  RequestFields f;
  const auto v = upstream(R"({"model":"m","max_tokens":16,"messages":[{"role":"user","content":"Hi there"}]})",
                          Target::messages, &f);
  EXPECT_EQ(v, json::parse(R"({"model":"m","messages":[{"role":"user","content":"Hi there"}],"max_tokens":16})"));
  EXPECT_EQ(f.model, "m");
  EXPECT_EQ(f.max_tokens, 16u);
  EXPECT_FALSE(f.stream);
  EXPECT_EQ(f.prompt_bytes, 8u);
  EXPECT_EQ(f.prompt_overhead_tokens, RequestFields::kChatTokensPerMessage);
}

TEST(AnthropicRequest, MaxTokensBeyond32BitsSaysItsBound) {
  // A positive number past 2^32 - 1 was refused as "not a positive integer".
  for (std::string_view mt : {"4294967296", "18446744073709551615", "99999999999999999999"}) {
    const auto e = failure(std::string(R"({"model":"m","max_tokens":)") + std::string(mt) +
                           R"(,"messages":[{"role":"user","content":"x"}]})");
    EXPECT_EQ(e.param, "max_tokens");
    EXPECT_EQ(e.message, "max_tokens: Input should be less than or equal to 4294967295") << mt;
  }
  EXPECT_EQ(failure(R"({"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]})").message,
            "max_tokens: Input should be a positive integer");
  RequestFields f;
  upstream(R"({"model":"m","max_tokens":4294967295,"messages":[{"role":"user","content":"x"}]})", Target::messages, &f);
  EXPECT_EQ(f.max_tokens, 4294967295u);
}

TEST(AnthropicRequest, AnEmptyConversationIsRefusedAndAnEmptySystemIsNone) {
  // Anthropic's API refuses both with a 400; translated, they would generate from an empty prompt.
  EXPECT_EQ(failure(R"({"model":"m","max_tokens":4,"messages":[]})").param, "messages");
  EXPECT_EQ(failure(R"({"model":"m","max_tokens":4,"messages":[{"role":"user","content":[]}]})").param, "messages");
  // An empty system prompt sends no system message (a chat template keeps its default one).
  for (std::string_view sys : {R"("")", "[]"}) {
    SCOPED_TRACE(sys);
    const auto v = upstream(std::string(R"({"model":"m","max_tokens":4,"system":)") + std::string(sys) +
                            R"(,"messages":[{"role":"user","content":"Hi"}]})");
    EXPECT_EQ(v.at("messages"), json::parse(R"([{"role":"user","content":"Hi"}])"));
  }
}

TEST(AnthropicRequest, SamplingStopUserStreamAndThinking) {
  RequestFields f;
  const auto v = upstream(R"({"model":"m","max_tokens":5,"stream":true,"temperature":0.5,"top_p":0.9,"top_k":40,
    "stop_sequences":["END","##"],"metadata":{"user_id":"u-1"},"thinking":{"type":"enabled","budget_tokens":1024},
    "service_tier":"auto","messages":[{"role":"user","content":"x"}]})",
                          Target::messages, &f);
  const auto& o = v.as_object();
  EXPECT_EQ(o.at("stream"), true);
  EXPECT_EQ(o.at("stream_options"), json::parse(R"({"include_usage":true,"continuous_usage_stats":true})"));
  EXPECT_EQ(o.at("temperature"), 0.5);
  EXPECT_EQ(o.at("top_p"), 0.9);
  EXPECT_EQ(o.at("top_k"), 40);
  EXPECT_EQ(o.at("stop"), json::parse(R"(["END","##"])"));
  EXPECT_EQ(o.at("user"), "u-1");
  EXPECT_EQ(o.at("chat_template_kwargs"), json::parse(R"({"enable_thinking":true})"));
  EXPECT_FALSE(o.contains("service_tier"));
  EXPECT_FALSE(o.contains("metadata"));
  EXPECT_TRUE(f.stream);
  EXPECT_TRUE(f.include_usage);
}

// A hosted API (the pool's continuous_usage off: an https:// endpoint, or said so) refuses members it does not
// know (OpenAI: 400 "Unrecognized request argument supplied"): vLLM's are left out, checked all the same.
TEST(AnthropicRequest, AHostedUpstreamGetsNoVllmMembers) {
  RequestFields f;
  constexpr std::string_view kBody = R"({"model":"m","max_tokens":5,"stream":true,"temperature":0.5,"top_k":40,
    "thinking":{"type":"enabled","budget_tokens":1024},
    "messages":[{"role":"user","content":"JSON please"},{"role":"assistant","content":"{"}]})";
  const auto hosted = upstream(kBody, Target::messages, &f, false);
  const auto& o = hosted.as_object();
  for (const char* k : {"top_k", "chat_template_kwargs", "continue_final_message", "add_generation_prompt"})
    EXPECT_FALSE(o.contains(k)) << k;
  EXPECT_EQ(o.at("stream_options"), json::parse(R"({"include_usage":true})"));
  EXPECT_EQ(o.at("temperature"), 0.5);
  // The prefill stays the conversation's last message; the thinking asked for is still the answer's.
  EXPECT_EQ(o.at("messages").as_array().back(), json::parse(R"({"role":"assistant","content":"{"})"));
  EXPECT_TRUE(f.thinking);
  // Self-hosted (vLLM): all of them.
  const auto self = upstream(kBody, Target::messages, nullptr, true);
  for (const char* k : {"top_k", "chat_template_kwargs", "continue_final_message", "add_generation_prompt"})
    EXPECT_TRUE(self.as_object().contains(k)) << k;
  EXPECT_EQ(self.at("stream_options"), json::parse(R"({"include_usage":true,"continuous_usage_stats":true})"));
  // A top_k that is no integer is refused either way; a count (vLLM's /tokenize) keeps the template switches.
  std::string out;
  EXPECT_FALSE(translate_request(
      Target::messages, R"({"model":"m","max_tokens":5,"top_k":"x","messages":[{"role":"user","content":"x"}]})", out,
      false));
  const auto count = upstream(kBody, Target::count_tokens, nullptr, false);
  EXPECT_EQ(count.at("chat_template_kwargs"), json::parse(R"({"enable_thinking":true})"));
  EXPECT_EQ(count.at("continue_final_message"), true);
}

TEST(AnthropicRequest, ThinkingAskedForIsEnabledAdaptiveOrBetweenTools) {
  // (thinking blocks wanted in the answer; the template's switch: between_tools is thinking off, with what the
  // model writes between tool calls given back as thinking blocks)
  for (const auto& [type, blocks, on] : {std::tuple{"enabled", true, true},
                                         {"adaptive", true, true},
                                         {"between_tools", true, false},
                                         {"disabled", false, false}}) {
    RequestFields f;
    const auto v = upstream(fmt::format(R"({{"model":"m","max_tokens":5,"thinking":{{"type":"{}"}},
      "messages":[{{"role":"user","content":"x"}}]}})",
                                        type),
                            Target::messages, &f, true);
    EXPECT_EQ(f.thinking, blocks) << type;
    EXPECT_EQ(v.at("chat_template_kwargs").at("enable_thinking"), on) << type;
  }
  std::string out;
  const auto bad = translate_request(
      Target::messages,
      R"({"model":"m","max_tokens":5,"thinking":{"type":"sometimes"},"messages":[{"role":"user","content":"x"}]})", out,
      true);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().status, 400);
  EXPECT_NE(bad.error().message.find("'between_tools'"), std::string::npos) << bad.error().message;
  RequestFields f;
  upstream(R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}]})", Target::messages, &f);
  EXPECT_FALSE(f.thinking);
}

TEST(AnthropicRequest, SystemBlocksAndCacheControlIgnored) {
  const auto v = upstream(R"({"model":"m","max_tokens":1,
    "system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}},{"type":"text","text":"Be kind."}],
    "messages":[{"role":"user","content":[{"type":"text","text":"Q","cache_control":{"type":"ephemeral"}}]}]})");
  EXPECT_EQ(v.at("messages"), json::parse(R"([{"role":"system","content":"Be brief.\nBe kind."},
    {"role":"user","content":[{"type":"text","text":"Q"}]}])"));
}

TEST(AnthropicRequest, Images) {
  const auto v = upstream(R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":[
    {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBOR"}},
    {"type":"image","source":{"type":"url","url":"https://x/y.jpg"}},
    {"type":"text","text":"What?"}]}]})");
  EXPECT_EQ(v.at("messages"), json::parse(R"([{"role":"user","content":[
    {"type":"image_url","image_url":{"url":"data:image/png;base64,iVBOR"}},
    {"type":"image_url","image_url":{"url":"https://x/y.jpg"}},
    {"type":"text","text":"What?"}]}])"));
}

TEST(AnthropicRequest, ToolsToolChoiceAndRoundTrip) {
  const auto v = upstream(R"({"model":"m","max_tokens":64,
    "tools":[{"name":"get_weather","description":"Weather now","input_schema":{"type":"object","properties":{"city":{"type":"string"}}},
              "cache_control":{"type":"ephemeral"}}],
    "tool_choice":{"type":"tool","name":"get_weather","disable_parallel_tool_use":true},
    "messages":[
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"Checking."},
        {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"18C"},{"type":"text","text":"sunny"}]},
        {"type":"tool_result","tool_use_id":"toolu_2","content":"boom","is_error":true},
        {"type":"text","text":"Thanks"}]}]})");
  EXPECT_EQ(v.at("tools"),
            json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"Weather now",
    "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])"));
  EXPECT_EQ(v.at("tool_choice"), json::parse(R"({"type":"function","function":{"name":"get_weather"}})"));
  EXPECT_EQ(v.at("parallel_tool_calls"), false);
  EXPECT_EQ(v.at("messages"), json::parse(R"([
    {"role":"user","content":"Weather in Paris?"},
    {"role":"assistant","content":"Checking.","tool_calls":[{"id":"toolu_1","type":"function",
      "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
    {"role":"tool","tool_call_id":"toolu_1","content":"18C\nsunny"},
    {"role":"tool","tool_call_id":"toolu_2","content":"Error: boom"},
    {"role":"user","content":[{"type":"text","text":"Thanks"}]}])"));
}

TEST(AnthropicRequest, ToolChoiceKinds) {
  for (auto [in, want] : {std::pair{R"({"type":"auto"})", R"("auto")"}, std::pair{R"({"type":"any"})", R"("required")"},
                          std::pair{R"({"type":"none"})", R"("none")"}}) {
    const std::string body =
        std::string(R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"Hi"}],"tool_choice":)") + in +
        "}";
    EXPECT_EQ(upstream(body).at("tool_choice"), json::parse(want)) << in;
  }
}

TEST(AnthropicRequest, AssistantToolUseOnlyHasNoContent) {
  const auto v = upstream(R"({"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[
    {"type":"tool_use","id":"t","name":"f","input":{}}]}]})");
  EXPECT_FALSE(v.at("messages").at(0).as_object().contains("content"));
}

TEST(AnthropicRequest, LastAssistantTurnIsContinued) {
  auto v = upstream(R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"Hi"},
    {"role":"assistant","content":"The answer is"}]})");
  EXPECT_EQ(v.at("continue_final_message"), true);
  EXPECT_EQ(v.at("add_generation_prompt"), false);
  v = upstream(R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"Hi"}]})");
  EXPECT_FALSE(v.as_object().contains("continue_final_message"));
  v = upstream(R"({"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[
    {"type":"tool_use","id":"t","name":"f","input":{}}]}]})");
  EXPECT_FALSE(v.as_object().contains("continue_final_message"));
}

TEST(AnthropicRequest, AnEmptyLastAssistantTurnIsNoPrefill) {
  // Anthropic allows the final assistant message to be empty: the model answers the user turn.
  for (const char* last :
       {R"("")", "[]", R"([{"type":"text","text":""}])", R"([{"type":"thinking","thinking":"t","signature":"s"}])"}) {
    const auto v = upstream(std::string(R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"Hi"},)") +
                            R"({"role":"assistant","content":)" + last + "}]}");
    EXPECT_FALSE(v.as_object().contains("continue_final_message")) << last;
    EXPECT_EQ(v.at("messages").as_array().size(), 1u) << last;
  }
  // Not before the last turn.
  std::string out;
  EXPECT_FALSE(translate_request(Target::messages, R"({"model":"m","max_tokens":1,"messages":[
    {"role":"user","content":"Hi"},{"role":"assistant","content":[]},{"role":"user","content":"Hi"}]})",
                                 out));
}

TEST(AnthropicRequest, CountTokensTakesModelMessagesTools) {
  const auto v = upstream(R"({"model":"m","system":"S","messages":[{"role":"user","content":"a b"}],
    "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"auto"}})",
                          Target::count_tokens);
  EXPECT_EQ(v, json::parse(R"({"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"a b"}],
    "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]})"));
  EXPECT_EQ(upstream_path(Target::count_tokens), "/tokenize");
  EXPECT_EQ(upstream_path(Target::messages), "/v1/chat/completions");
  // The thinking switch changes the prompt the template renders: the count carries it, as the generation does.
  const auto t = upstream(R"({"model":"m","messages":[{"role":"user","content":"a"}],"thinking":{"type":"disabled"}})",
                          Target::count_tokens);
  EXPECT_EQ(t.at("chat_template_kwargs"), json::parse(R"({"enable_thinking":false})"));
}

TEST(AnthropicRequest, StructuredOutputsBecomeAJsonSchemaResponseFormat) {
  // What the anthropic SDK's messages.parse(output_format=Model) sends, and the beta's top-level output_format:
  // vLLM's guided decoding keeps the answer to the schema, as Anthropic does.
  const std::string schema = R"({"type":"object","properties":{"name":{"type":"string"}},"required":["name"]})";
  const auto expected =
      json::parse(R"({"type":"json_schema","json_schema":{"name":"output","schema":)" + schema + R"(,"strict":true}})");
  const auto a = upstream(R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":"x"}],
    "output_config":{"format":{"type":"json_schema","schema":)" +
                          schema + "}}}");
  EXPECT_EQ(a.at("response_format"), expected);
  const auto b = upstream(R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":"x"}],
    "output_format":{"type":"json_schema","schema":)" +
                          schema + "}}");
  EXPECT_EQ(b.at("response_format"), expected);
  // Nothing asked (no format, null, an output_config with only effort): no response_format.
  for (const char* extra : {"", R"(,"output_format":null)", R"(,"output_config":{"format":null})",
                            R"(,"output_config":{"effort":"low"})", R"(,"output_config":null)"}) {
    const auto c = upstream(std::string(R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":"x"}])") +
                            extra + "}");
    EXPECT_FALSE(c.as_object().contains("response_format")) << extra;
  }
  // A token count is of the prompt: no response_format there (the format is checked the same way).
  const auto d = upstream(R"({"model":"m","messages":[{"role":"user","content":"x"}],
    "output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}}})",
                          Target::count_tokens);
  EXPECT_FALSE(d.as_object().contains("response_format"));
  // A strict tool (structured outputs' tool use): chat's function.strict.
  const auto e = upstream(R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":"x"}],
    "tools":[{"name":"f","strict":true,"input_schema":{"type":"object"}}]})");
  EXPECT_EQ(e.at("tools").at(0).at("function").at("strict"), true);
}

TEST(AnthropicRequest, StructuredOutputsThatCannotBeMappedAre400) {
  const std::string head = R"({"model":"m","max_tokens":8,"messages":[{"role":"user","content":"x"}],)";
  const struct {
    const char* extra;
    const char* param;
    const char* message;
  } cases[] = {
      {R"("output_config":{"format":{"type":"json_object"}})", "output_config",
       "output_config.format.type: Input should be 'json_schema'"},
      {R"("output_config":{"format":{"type":"json_schema"}})", "output_config",
       "output_config.format.schema: Field required (an object)"},
      {R"("output_config":{"format":"json"})", "output_config", "output_config.format: Input should be an object"},
      {R"("output_config":[1])", "output_config", "output_config: Input should be an object"},
      {R"("output_format":{"type":"text"})", "output_format", "output_format.type: Input should be 'json_schema'"},
      {R"("output_format":{"type":"json_schema","schema":[]})", "output_format",
       "output_format.schema: Field required (an object)"},
      {R"("output_format":{"type":"json_schema","schema":{}},"output_config":{"format":{"type":"json_schema","schema":{}}})",
       "output_format", "output_format: give output_config.format or output_format (deprecated), not both"},
  };
  for (const auto& c : cases) {
    const auto e = failure(head + c.extra + "}");
    EXPECT_EQ(e.param, c.param) << c.extra;
    EXPECT_EQ(e.message, c.message) << c.extra;
    EXPECT_EQ(failure(head + c.extra + "}", Target::count_tokens).message, c.message) << c.extra;
  }
}

TEST(AnthropicRequest, BadInputIs400) {
  struct Case {
    std::string_view body;
    std::string_view message_has;
  };
  for (
      const Case& c : {
          Case{R"({"model":"m","messages":[]})", "max_tokens: Field required"},
          Case{R"({"model":"m","max_tokens":0,"messages":[]})", "max_tokens"},
          Case{R"({"model":"m","max_tokens":"5","messages":[]})", "max_tokens"},
          Case{R"({"max_tokens":5,"messages":[]})", "model"},
          Case{R"({"model":"m","max_tokens":5})", "messages: Field required"},
          Case{R"({"model":"m","max_tokens":5,"messages":[{"role":"system","content":"x"}]})", "messages.0.role"},
          Case{R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document"}]}]})",
               "document"},
          Case{
              R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file"}}]}]})",
              "source.type"},
          Case{R"({"model":"m","max_tokens":5,"messages":[],"tools":[{"type":"web_search_20250305","name":"w"}]})",
               "server tool"},
          Case{R"({"model":"m","max_tokens":5,"messages":[],"tool_choice":{"type":"maybe"}})", "tool_choice"},
          Case{R"({"model":"m","max_tokens":5,"messages":[],"stream":"yes"})", "stream"},
          Case{R"({"model":"m","max_tokens":5,"messages":[],"thinking":{"type":"sometimes"}})", "thinking"},
          Case{R"([1])", "JSON object"},
          Case{R"({"model":)", "not valid JSON"},
      }) {
    const auto e = failure(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_NE(e.message.find(c.message_has), std::string::npos) << c.body << " -> " << e.message;
  }
  // count_tokens needs no max_tokens; it refuses an empty messages list as /v1/messages does (Anthropic's API).
  std::string out;
  EXPECT_TRUE(
      translate_request(Target::count_tokens, R"({"model":"m","messages":[{"role":"user","content":"x"}]})", out)
          .has_value());
  const auto empty = translate_request(Target::count_tokens, R"({"model":"m","messages":[]})", out);
  ASSERT_FALSE(empty.has_value());
  EXPECT_EQ(empty.error().status, 400);
  EXPECT_EQ(empty.error().param, "messages");
}

// Image blocks are media parts (admission counts models.X.media_tokens each), not text.
TEST(AnthropicRequest, ImageBlocksAreMediaParts) {
  RequestFields f;
  upstream(R"({"model":"m","max_tokens":16,"messages":[{"role":"user","content":[{"type":"text","text":"describe"},
    {"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},
    {"type":"image","source":{"type":"url","url":"https://e.com/a.png"}}]}]})",
           Target::messages, &f);
  EXPECT_EQ(f.media_parts, 2u);
  EXPECT_EQ(f.prompt_bytes, 8u);
}

// Every member of an Anthropic request is read (translated, or read and passed on to an Anthropic pool and
// translated for a fallback): one given twice is refused, naming it, as parsers differ on which copy counts.
TEST(AnthropicRequest, ARepeatedMemberIsRefused) {
  for (const Target t : {Target::messages, Target::count_tokens}) {
    for (
        const char* body :
        {R"({"model":"secret","model":"plain","max_tokens":1,"messages":[{"role":"user","content":"hi"}]})",
         R"({"model":"m","max_tokens":100000,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]})",
         R"({"model":"m","max_tokens":1,"messages":[],"temperature":0,"messages":[{"role":"user","content":"hi"}]})",
         R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"m\u0065tadata":{},"metadata":{}})"}) {
      const auto e = failure(body, t);
      EXPECT_EQ(e.status, 400) << body;
      EXPECT_NE(e.message.find("appears more than once"), std::string::npos) << e.message;
    }
    EXPECT_EQ(
        failure(R"({"model":"a","model":"b","max_tokens":1,"messages":[{"role":"user","content":"x"}]})", t).param,
        "model");
    // Read (to an Anthropic pool) as translated: the same refusal.
    const auto r = read_messages_request(
        R"({"model":"a","max_tokens":1,"max_tokens":9,"messages":[{"role":"user","content":"x"}]})",
        t == Target::count_tokens);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().param, "max_tokens");
    // A repeated key inside a member is the client's to mean (the DOM keeps the last, as the translation sends).
    EXPECT_TRUE(read_messages_request(
        R"({"model":"a","max_tokens":1,"messages":[{"role":"user","content":"x","content":"y"}]})",
        t == Target::count_tokens));
  }
}

}  // namespace
}  // namespace weir::api::anthropic
