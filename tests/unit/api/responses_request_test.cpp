// OpenAI Responses request → chat-completions body: every mapped field, the
// input items, the echo of the request's members, and the 400s for bad input.
#include "api/responses/request.hpp"

#include <gtest/gtest.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

namespace weir::api::responses {
namespace {

namespace json = boost::json;

struct TranslatedRequest {
  json::value body;
  json::value echo;  // the echo members, wrapped in braces
  RequestFields fields;
};

TranslatedRequest translate(std::string_view body) {
  std::string out;
  std::string echo;
  auto f = translate_request(body, out, echo);
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  if (!f) return {};
  return {json::parse(out), json::parse("{" + echo + "}"), *f};
}

json::value upstream(std::string_view body) { return translate(body).body; }

core::Error failure(std::string_view body) {
  std::string out;
  std::string echo;
  auto f = translate_request(body, out, echo);
  EXPECT_FALSE(f.has_value()) << out;
  return f ? core::Error{} : f.error();
}

TEST(ResponsesRequest, StringInput) {
  const auto t = translate(R"({"model":"m","input":"Hi there"})");
  EXPECT_EQ(t.body, json::parse(R"({"model":"m","messages":[{"role":"user","content":"Hi there"}]})"));
  EXPECT_EQ(t.fields.model, "m");
  EXPECT_EQ(t.fields.max_tokens, 0u);
  EXPECT_FALSE(t.fields.stream);
  EXPECT_EQ(t.fields.prompt_bytes, 8u);
  EXPECT_EQ(t.fields.prompt_overhead_tokens, RequestFields::kChatTokensPerMessage);
  // The defaults the answer repeats; store is always false: nothing is kept.
  EXPECT_EQ(t.echo, json::parse(R"({"instructions":null,"max_output_tokens":null,"metadata":{},
    "parallel_tool_calls":true,"previous_response_id":null,"reasoning":null,"store":false,"temperature":null,
    "top_p":null,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"truncation":"disabled",
    "top_logprobs":null,"user":null,"background":false})"));
}

TranslatedRequest translate_for(std::string_view body, bool vllm) {
  std::string out;
  std::string echo;
  auto f = translate_request(body, out, echo, vllm);
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  if (!f) return {};
  return {json::parse(out), json::parse("{" + echo + "}"), *f};
}

// A hosted API (the pool's continuous_usage off: an https:// endpoint) gets max_completion_tokens, which
// OpenAI's reasoning models require, and any reasoning effort; vLLM keeps max_tokens and its three efforts.
TEST(ResponsesRequest, HostedPoolsGetMaxCompletionTokensAndAnyEffort) {
  const std::string_view body = R"({"model":"m","input":"x","max_output_tokens":64,"reasoning":{"effort":"minimal"}})";
  const auto hosted = translate_for(body, false);
  EXPECT_EQ(hosted.body, json::parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],
    "max_completion_tokens":64,"reasoning_effort":"minimal"})"));
  EXPECT_EQ(hosted.fields.max_tokens, 64u);
  EXPECT_EQ(hosted.echo.at("max_output_tokens"), 64);
  std::string out, echo;
  auto f = translate_request(body, out, echo, true);
  ASSERT_FALSE(f.has_value());
  EXPECT_EQ(f.error().param, "reasoning");
  const auto vllm =
      translate_for(R"({"model":"m","input":"x","max_output_tokens":64,"reasoning":{"effort":"low"}})", true);
  EXPECT_EQ(vllm.body.at("max_tokens"), 64);
  EXPECT_FALSE(vllm.body.as_object().contains("max_completion_tokens"));
  EXPECT_EQ(vllm.body.at("reasoning_effort"), "low");
  f = translate_request(R"({"model":"m","input":"x","reasoning":{"effort":5}})", out, echo, false);
  ASSERT_FALSE(f.has_value());
  EXPECT_EQ(f.error().param, "reasoning");
}

// Members chat completions takes with the same meaning go as they came: vLLM's own to vLLM only, OpenAI's
// service members to a hosted API only, the standard sampling ones to either; logprobs from include.
TEST(ResponsesRequest, ChatMembersAreCarriedPerPool) {
  const std::string_view body = R"({"model":"m","input":"x","top_k":20,"logit_bias":{"50256":-100},
    "cache_salt":"salt","priority":5,"skip_special_tokens":false,"min_p":0.05,"repetition_penalty":1.1,"seed":7,
    "stop":["\n\n"],"chat_template_kwargs":{"enable_thinking":false},"frequency_penalty":0.5,"presence_penalty":null,
    "service_tier":"flex","safety_identifier":"s","prompt_cache_key":"p","top_logprobs":3,
    "include":["message.output_text.logprobs"]})";
  const auto vllm = translate_for(body, true);
  EXPECT_EQ(vllm.body, json::parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":3,
    "logprobs":true,"seed":7,"stop":["\n\n"],"logit_bias":{"50256":-100},"frequency_penalty":0.5,"top_k":20,
    "min_p":0.05,"repetition_penalty":1.1,"skip_special_tokens":false,"cache_salt":"salt","priority":5,
    "chat_template_kwargs":{"enable_thinking":false}})"));
  EXPECT_EQ(vllm.echo.at("top_logprobs"), 3);
  const auto hosted = translate_for(body, false);
  EXPECT_EQ(hosted.body, json::parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":3,
    "logprobs":true,"seed":7,"stop":["\n\n"],"logit_bias":{"50256":-100},"frequency_penalty":0.5,
    "service_tier":"flex","safety_identifier":"s","prompt_cache_key":"p"})"));
  // top_logprobs without the include asks for nothing; include alone asks for the chosen tokens'.
  EXPECT_FALSE(upstream(R"({"model":"m","input":"x","top_logprobs":3})").as_object().contains("logprobs"));
  const auto alone = upstream(R"({"model":"m","input":"x","include":["message.output_text.logprobs"]})");
  EXPECT_EQ(alone.at("logprobs"), true);
  EXPECT_FALSE(alone.as_object().contains("top_logprobs"));
  for (std::string_view bad :
       {R"({"model":"m","input":"x","top_logprobs":21})", R"({"model":"m","input":"x","top_logprobs":-1})",
        R"({"model":"m","input":"x","top_logprobs":"3"})"})
    EXPECT_EQ(failure(bad).param, "top_logprobs") << bad;
  EXPECT_EQ(failure(R"({"model":"m","input":"x","include":"message.output_text.logprobs"})").param, "include");
}

TEST(ResponsesRequest, EveryScalarField) {
  const auto t = translate(R"({"model":"m","input":"x","instructions":"Be brief.","max_output_tokens":7,
    "temperature":0.5,"top_p":0.9,"user":"u-1","metadata":{"k":"v"},"parallel_tool_calls":false,"stream":true,
    "store":true,"reasoning":{"effort":"high","summary":"auto"},"truncation":"disabled","service_tier":"auto",
    "include":["reasoning.encrypted_content"],"top_logprobs":2,"max_tool_calls":3,"safety_identifier":"s",
    "prompt_cache_key":"p","stream_options":{"include_obfuscation":false}})");
  EXPECT_EQ(t.body, json::parse(R"({"model":"m","messages":[{"role":"system","content":"Be brief."},
    {"role":"user","content":"x"}],"max_tokens":7,"parallel_tool_calls":false,"reasoning_effort":"high",
    "stream":true,"stream_options":{"include_usage":true},"temperature":0.5,"top_p":0.9,"user":"u-1"})"));
  EXPECT_TRUE(t.fields.stream);
  EXPECT_TRUE(t.fields.include_usage);
  EXPECT_EQ(t.fields.max_tokens, 7u);
  EXPECT_EQ(t.fields.prompt_bytes, 10u);
  EXPECT_EQ(t.fields.prompt_overhead_tokens, 2 * RequestFields::kChatTokensPerMessage);
  const auto& e = t.echo.as_object();
  EXPECT_EQ(e.at("instructions"), "Be brief.");
  EXPECT_EQ(e.at("max_output_tokens"), 7);
  EXPECT_EQ(e.at("metadata"), json::parse(R"({"k":"v"})"));
  EXPECT_EQ(e.at("parallel_tool_calls"), false);
  EXPECT_EQ(e.at("reasoning"), json::parse(R"({"effort":"high","summary":"auto"})"));
  EXPECT_EQ(e.at("store"), false);
  EXPECT_EQ(e.at("temperature"), 0.5);
  EXPECT_EQ(e.at("user"), "u-1");
}

TEST(ResponsesRequest, MessageItemsAndParts) {
  const auto v = upstream(R"({"model":"m","input":[
    {"role":"developer","content":"Rules."},
    {"type":"message","role":"system","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
    {"role":"user","content":[{"type":"input_text","text":"Look:"},
      {"type":"input_image","image_url":"https://x/cat.png","detail":"low"},
      {"type":"input_image","image_url":"data:image/png;base64,AAAA"}]},
    {"type":"message","role":"assistant","id":"msg_1","status":"completed",
      "content":[{"type":"output_text","text":"A ","annotations":[]},{"type":"output_text","text":"cat."}]},
    {"type":"reasoning","id":"rs_1","summary":[]},
    {"role":"user","content":"Thanks"}]})");
  EXPECT_EQ(v.at("messages"), json::parse(R"([
    {"role":"system","content":"Rules."},
    {"role":"system","content":"a\nb"},
    {"role":"user","content":[{"type":"text","text":"Look:"},
      {"type":"image_url","image_url":{"url":"https://x/cat.png","detail":"low"}},
      {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]},
    {"role":"assistant","content":"A cat."},
    {"role":"user","content":"Thanks"}])"));
}

TEST(ResponsesRequest, FunctionCallRoundTrip) {
  const auto t = translate(R"({"model":"m","input":[
    {"role":"user","content":"Weather and time in Paris?"},
    {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking."}]},
    {"type":"function_call","id":"fc_1","call_id":"call_a","name":"get_weather","arguments":"{\"q\":\"Paris\"}"},
    {"type":"function_call","call_id":"call_b","name":"get_time","arguments":"{}"},
    {"type":"function_call_output","call_id":"call_a","output":"18C"},
    {"type":"function_call_output","call_id":"call_b","output":[{"type":"input_text","text":"12:00"},
      {"type":"input_text","text":"CET"}]},
    {"type":"function_call","call_id":"call_c","name":"get_time","arguments":"{}"}]})");
  EXPECT_EQ(t.body.at("messages"), json::parse(R"([
    {"role":"user","content":"Weather and time in Paris?"},
    {"role":"assistant","content":"Checking.","tool_calls":[
      {"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"q\":\"Paris\"}"}},
      {"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{}"}}]},
    {"role":"tool","tool_call_id":"call_a","content":"18C"},
    {"role":"tool","tool_call_id":"call_b","content":"12:00\nCET"},
    {"role":"assistant","tool_calls":[{"id":"call_c","type":"function","function":{"name":"get_time","arguments":"{}"}}]}])"));
  EXPECT_EQ(t.fields.prompt_overhead_tokens, 5 * RequestFields::kChatTokensPerMessage);
}

TEST(ResponsesRequest, ToolsToolChoiceAndFormats) {
  const auto t = translate(R"({"model":"m","input":"x","tool_choice":{"type":"function","name":"get_weather"},
    "tools":[{"type":"function","name":"get_weather","description":"Weather now.","strict":true,
      "parameters":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}},
      {"type":"function","name":"ping"}],
    "text":{"format":{"type":"json_schema","name":"w","description":"d","strict":true,
      "schema":{"type":"object","properties":{"t":{"type":"number"}}}},"verbosity":"low"}})");
  EXPECT_EQ(t.body.at("tools"), json::parse(R"([
    {"type":"function","function":{"name":"get_weather","description":"Weather now.",
      "parameters":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]},"strict":true}},
    {"type":"function","function":{"name":"ping"}}])"));
  EXPECT_EQ(t.body.at("tool_choice"), json::parse(R"({"type":"function","function":{"name":"get_weather"}})"));
  EXPECT_EQ(t.body.at("response_format"), json::parse(R"({"type":"json_schema","json_schema":{"name":"w",
    "schema":{"type":"object","properties":{"t":{"type":"number"}}},"description":"d","strict":true}})"));
  // The echo keeps the client's own shapes.
  EXPECT_EQ(t.echo.at("tools").as_array().size(), 2u);
  EXPECT_EQ(t.echo.at("tools").at(0).at("name"), "get_weather");
  EXPECT_EQ(t.echo.at("tool_choice"), json::parse(R"({"type":"function","name":"get_weather"})"));
  EXPECT_EQ(t.echo.at("text").at("format").at("type"), "json_schema");

  for (const char* c : {"auto", "none", "required"}) {
    const auto v = upstream(std::string(R"({"model":"m","input":"x","tool_choice":")") + c + "\"}");
    EXPECT_EQ(v.at("tool_choice"), c);
  }
  auto v = upstream(R"({"model":"m","input":"x","text":{"format":{"type":"json_object"}}})");
  EXPECT_EQ(v.at("response_format"), json::parse(R"({"type":"json_object"})"));
  v = upstream(R"({"model":"m","input":"x","text":{"format":{"type":"text"}},"tools":[]})");
  EXPECT_FALSE(v.as_object().contains("response_format"));
  EXPECT_FALSE(v.as_object().contains("tools"));
}

TEST(ResponsesRequest, BadInputIsA400NamingTheField) {
  struct Case {
    const char* body;
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {"", "", "empty"},
      {"[1]", "", "JSON object"},
      {R"({"input":"x"})", "model", "model"},
      {R"({"model":"m"})", "input", "input: Field required"},
      {R"({"model":"m","input":[]})", "input", "empty"},
      {R"({"model":"m","input":5})", "input", "string or a list"},
      {R"({"model":"m","input":[{"role":"tool","content":"x"}]})", "input", "input[0].role"},
      {R"({"model":"m","input":[{"role":"user"}]})", "input", "input[0].content"},
      {R"({"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]})", "input",
       "input[0].content[0].type"},
      {R"({"model":"m","input":[{"role":"user","content":[{"type":"input_image","file_id":"f"}]}]})", "input",
       "input[0].content[0].file_id"},
      {R"({"model":"m","input":[{"role":"assistant","content":[{"type":"input_image","image_url":"u"}]}]})", "input",
       "assistant"},
      {R"({"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}]})", "input", "input[0].call_id"},
      {R"({"model":"m","input":[{"type":"function_call_output","call_id":"c"}]})", "input", "input[0].output"},
      {R"({"model":"m","input":[{"type":"item_reference","id":"msg_1"}]})", "input", "store"},
      {R"({"model":"m","input":[{"type":"web_search_call"}]})", "input", "web_search_call"},
      {R"({"model":"m","input":[{"content":"x"}]})", "input", "input[0].type"},
      {R"({"model":"m","input":"x","previous_response_id":"resp_1"})", "previous_response_id", "store"},
      {R"({"model":"m","input":"x","conversation":"conv_1"})", "conversation", "store"},
      {R"({"model":"m","input":"x","background":true})", "background", "store"},
      {R"({"model":"m","input":"x","prompt":{"id":"p"}})", "prompt", "prompt"},
      {R"({"model":"m","input":"x","instructions":5})", "instructions", "string"},
      {R"({"model":"m","input":"x","max_output_tokens":0})", "max_output_tokens", "positive"},
      {R"({"model":"m","input":"x","max_output_tokens":"5"})", "max_output_tokens", "positive"},
      {R"({"model":"m","input":"x","max_output_tokens":4294967296})", "max_output_tokens",
       "less than or equal to 4294967295"},
      {R"({"model":"m","input":"x","max_output_tokens":99999999999999999999})", "max_output_tokens",
       "less than or equal to 4294967295"},
      {R"({"model":"m","input":"x","temperature":"hot"})", "temperature", "number"},
      {R"({"model":"m","input":"x","stream":"yes"})", "stream", "boolean"},
      {R"({"model":"m","input":"x","store":"no"})", "store", "boolean"},
      {R"({"model":"m","input":"x","parallel_tool_calls":1})", "parallel_tool_calls", "boolean"},
      {R"({"model":"m","input":"x","metadata":[]})", "metadata", "object"},
      {R"({"model":"m","input":"x","user":1})", "user", "string"},
      {R"({"model":"m","input":"x","reasoning":{"effort":"minimal"}})", "reasoning", "reasoning.effort"},
      {R"({"model":"m","input":"x","truncation":"auto"})", "truncation", "auto"},
      {R"({"model":"m","input":"x","tools":{}})", "tools", "list"},
      {R"({"model":"m","input":"x","tools":[{"type":"web_search"}]})", "tools", "tools[0].type"},
      {R"({"model":"m","input":"x","tools":[{"type":"function"}]})", "tools", "tools[0].name"},
      {R"({"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":[]}]})", "tools",
       "tools[0].parameters"},
      {R"({"model":"m","input":"x","tool_choice":"any"})", "tool_choice", "tool_choice"},
      {R"({"model":"m","input":"x","tool_choice":{"type":"file_search"}})", "tool_choice", "file_search"},
      {R"({"model":"m","input":"x","tool_choice":{"type":"function"}})", "tool_choice", "tool_choice.name"},
      {R"({"model":"m","input":"x","text":{"format":{"type":"xml"}}})", "text", "text.format.type"},
      {R"({"model":"m","input":"x","text":{"format":{"type":"json_schema","schema":{}}}})", "text", "text.format.name"},
      {R"({"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"n"}}})", "text",
       "text.format.schema"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    const auto e = failure(c.body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.param, c.param);
    EXPECT_NE(e.message.find(c.says), std::string::npos) << e.message;
  }
}

TEST(ResponsesRequest, StoreAndNullsAreAccepted) {
  auto t = translate(R"({"model":"m","input":"x","store":false,"previous_response_id":null,"background":false,
    "reasoning":{"effort":null},"text":null,"tools":null,"tool_choice":null,"instructions":null,"truncation":null})");
  EXPECT_EQ(t.body, json::parse(R"({"model":"m","messages":[{"role":"user","content":"x"}]})"));
  EXPECT_EQ(t.echo.at("store"), false);
}

// input_image parts are media parts (admission counts models.X.media_tokens each), not text.
TEST(ResponsesRequest, InputImagesAreMediaParts) {
  const auto t = translate(R"({"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"describe"},
    {"type":"input_image","image_url":"https://e.com/a.png"},{"type":"input_image","image_url":"data:image/png;base64,AA"}]}]})");
  EXPECT_EQ(t.fields.media_parts, 2u);
  EXPECT_EQ(t.fields.prompt_bytes, 8u);
}

// Every member of a Responses request is read (translated): one given twice is refused, naming it, as
// parsers differ on which copy counts.
TEST(ResponsesRequest, ARepeatedMemberIsRefused) {
  EXPECT_EQ(failure(R"({"model":"secret","input":"hi","model":"plain"})").param, "model");
  EXPECT_EQ(failure(R"({"model":"m","input":"hi","max_output_tokens":100000,"max_output_tokens":16})").param,
            "max_output_tokens");
  EXPECT_EQ(failure(R"({"model":"m","input":"hi","instructions":"a","instructions":"b"})").param, "instructions");
  const auto e = failure(R"({"model":"m","input":"a","input":"b"})");
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(e.message.find("'input' appears more than once"), std::string::npos) << e.message;
}

}  // namespace
}  // namespace weir::api::responses
