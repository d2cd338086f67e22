// api::parse_request: the OpenAI request fields the gateway acts on, their
// validation (400s), and the prompt size estimate inputs (prompt_bytes,
// prompt_count, prompt_overhead_tokens) for chat, completions and embeddings.
#include "api/request.hpp"

#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "api/member_names.hpp"

namespace weir::api {
namespace {

RequestFields ok(ApiKind kind, std::string_view body) {
  auto r = parse_request(kind, body);
  EXPECT_TRUE(r) << body << " -> " << (r ? "" : r.error().message);
  return r ? *r : RequestFields{};
}

// The error for a body that must be refused: always a client 400.
core::Error refused(ApiKind kind, std::string_view body) {
  auto r = parse_request(kind, body);
  EXPECT_FALSE(r) << body << " was accepted";
  if (r) return {};
  EXPECT_EQ(r.error().status, 400) << body;
  EXPECT_EQ(r.error().source, core::ErrorSource::client) << body;
  EXPECT_EQ(r.error().type, "invalid_request_error") << body;
  return r.error();
}

constexpr auto kChat = ApiKind::chat_completions;
constexpr auto kCompletions = ApiKind::completions;
constexpr auto kEmbeddings = ApiKind::embeddings;

TEST(ApiParseRequest, MinimalChatRequest) {
  const auto f = ok(kChat, R"({"model":"llama","messages":[{"role":"user","content":"hello"}]})");
  EXPECT_EQ(f.model, "llama");
  EXPECT_FALSE(f.stream);
  EXPECT_FALSE(f.has_stream_options);
  EXPECT_FALSE(f.include_usage);
  EXPECT_EQ(f.max_tokens, 0u);
  EXPECT_EQ(f.n, 1u);
  EXPECT_EQ(f.prompt_bytes, 5u);
  EXPECT_EQ(f.prompt_count, 1u);
  EXPECT_EQ(f.prompt_overhead_tokens, RequestFields::kChatTokensPerMessage);
}

TEST(ApiParseRequest, ModelIsANonEmptyStringOrAbsent) {
  // Absent (or null, as vLLM's Optional[str] reads it): the empty model, which the route phase sends to the
  // default pool (the upstream's served model) or refuses without one.
  for (auto kind : {kChat, kCompletions, kEmbeddings, ApiKind::vllm_extra}) {
    EXPECT_EQ(ok(kind, R"({"messages":[],"prompt":"a","input":"a"})").model, "");
    EXPECT_EQ(ok(kind, R"({"model":null,"prompt":"a","input":"a"})").model, "");
    EXPECT_EQ(ok(kind, R"({"model":"","prompt":"a","input":"a"})").model, "");  // vLLM: its served model too
  }
  EXPECT_EQ(refused(kChat, R"({"model":7})").param, "model");
  EXPECT_EQ(refused(kChat, R"({"model":["a"]})").param, "model");
  EXPECT_EQ(refused(kChat, R"({"model":{"name":"a"}})").param, "model");
  EXPECT_EQ(refused(kChat, R"({"model":true})").param, "model");
  EXPECT_EQ(ok(kChat, R"({"model":"org/Model-7B \u00e9"})").model, "org/Model-7B \xc3\xa9");  // JSON-decoded
}

TEST(ApiParseRequest, StreamMustBeABoolean) {
  EXPECT_TRUE(ok(kChat, R"({"model":"m","stream":true})").stream);
  EXPECT_FALSE(ok(kChat, R"({"model":"m","stream":false})").stream);
  EXPECT_FALSE(ok(kChat, R"({"model":"m","stream":null})").stream);  // null = not given
  EXPECT_EQ(refused(kChat, R"({"model":"m","stream":"true"})").param, "stream");
  EXPECT_EQ(refused(kChat, R"({"model":"m","stream":1})").param, "stream");
  EXPECT_EQ(refused(kChat, R"({"model":"m","stream":{}})").param, "stream");
}

// A member name Weir does not read but a server matching names in any case (Go's encoding/json: Ollama,
// LocalAI) would read as one: refused, else Weir routes, allows and charges one request and the upstream
// runs another ({"model":"good","Model":"bad"}).
TEST(ApiParseRequest, NamesThatFoldToAReadNameAreRefused) {
  for (const std::string_view body : {
           R"({"model":"good","Model":"bad"})",
           R"({"MODEL":"bad"})",
           R"({"model":"m","max_tokens":5,"MAX_TOKENS":900})",
           R"({"model":"m","Max_Completion_Tokens":900})",
           R"({"model":"m","\u017ftream":true})",  // U+017F long s folds to s
           R"({"model":"m","stream":true,"Stream_Options":{}})",
           R"({"model":"m","max_to\u212Aens":900})",  // U+212A Kelvin sign folds to k
           R"({"model":"m","stream":true,"stream_options":{"Include_Usage":false}})",
           R"({"model":"m","N":3})",
           R"({"model":"m","Messages":[]})",
           // Every member Weir reads (a repeat of which is refused: read_member_index), not only routing's:
           // the reservation's min_tokens, the coalescing key's temperature and seed, resume's checks.
           R"({"model":"m","MIN_TOKENS":900})",
           R"({"model":"m","Temperature":1})",
           R"({"model":"m","SEED":1})",
           R"({"model":"m","Response_Format":{"type":"json_object"}})",
           R"({"model":"m","Continue_Final_Message":true})",
           R"({"model":"m","Guided_Json":{}})",
       }) {
    const auto e = refused(kChat, body);
    EXPECT_NE(e.message.find("case-sensitive"), std::string::npos) << body << ": " << e.message;
  }
  EXPECT_EQ(refused(kChat, R"({"model":"good","Model":"bad"})").param, "Model");
  // The error's param is its own copy of the client's name (once a view of the parser's, freed on return: a
  // name past the short-string buffer was a heap use after free under ASan).
  EXPECT_EQ(refused(kChat, R"({"model":"m","MAX_COMPLETION_TOKENS":900})").param, "MAX_COMPLETION_TOKENS");
  EXPECT_NE(refused(kChat, R"({"model":"good","Model":"bad"})").message.find("'model'"), std::string::npos);
  // Names read exactly, names of no field, and the same letters deeper in the body are the client's.
  ok(kChat, R"({"model":"m","user":"u","echo":false,"Top_P":1,"models":"x","model_":"y"})");
  ok(kChat, R"({"model":"m","messages":[{"role":"user","content":"hi","Model":"x"}],"metadata":{"MODEL":1}})");
  ok(kCompletions, R"({"model":"m","prompt":"p","echo":true,"logprobs":1})");
  ok(kChat, R"({"\u006dodel":"m"})");  // an escaped exact name is that name (and given twice, a repeat of it)
  EXPECT_EQ(refused(kChat, R"({"model":"m","\u006dodel":"m"})").param, "model");
  ok(kChat, R"({"model":"m","mod\u00e9l":"x","\u017f":1})");
}

TEST(ApiParseRequest, NumbersBeyondADoubleAreRefused) {
  // Python's json reads 1e400 as inf and other parsers refuse it: the translated routes already refuse it.
  refused(kChat, R"({"model":"m","temperature":1e400})");
  refused(kCompletions, R"({"model":"m","prompt":"p","top_p":-1e999})");
  ok(kChat, R"({"model":"m","temperature":1e308})");
}

TEST(ApiParseRequest, StreamOptionsMustBeAnObject) {
  auto f = ok(kChat, R"({"model":"m","stream":true,"stream_options":{"include_usage":true}})");
  EXPECT_TRUE(f.has_stream_options);
  EXPECT_TRUE(f.include_usage);

  f = ok(kChat, R"({"model":"m","stream":true,"stream_options":{"include_usage":false}})");
  EXPECT_TRUE(f.has_stream_options);
  EXPECT_FALSE(f.include_usage);

  f = ok(kChat, R"({"model":"m","stream":true,"stream_options":{}})");
  EXPECT_TRUE(f.has_stream_options);
  EXPECT_FALSE(f.include_usage);

  f = ok(kChat, R"({"model":"m","stream":true,"stream_options":{"include_usage":null}})");
  EXPECT_TRUE(f.has_stream_options);
  EXPECT_FALSE(f.include_usage);

  // vLLM's pydantic reads these as false (no usage chunk, so no real usage to charge), or as true: a boolean only.
  for (std::string_view v : {R"("yes")", R"("false")", "0", "1", R"("off")", "[]", "{}"})
    EXPECT_EQ(refused(kChat, fmt::format(R"({{"model":"m","stream":true,"stream_options":{{"include_usage":{}}}}})", v))
                  .param,
              "stream_options.include_usage")
        << v;

  f = ok(kChat, R"({"model":"m","stream_options":null})");
  EXPECT_FALSE(f.has_stream_options);

  EXPECT_EQ(refused(kChat, R"({"model":"m","stream_options":true})").param, "stream_options");
  EXPECT_EQ(refused(kChat, R"({"model":"m","stream_options":[]})").param, "stream_options");
  EXPECT_EQ(refused(kChat, R"({"model":"m","stream_options":"x"})").param, "stream_options");
}

TEST(ApiParseRequest, MaxCompletionTokensTakesPrecedenceOverMaxTokens) {
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_tokens":100})").max_tokens, 100u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_completion_tokens":50})").max_tokens, 50u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_tokens":100,"max_completion_tokens":50})").max_tokens, 50u);
  EXPECT_EQ(ok(kChat, R"({"max_completion_tokens":50,"model":"m","max_tokens":100})").max_tokens, 50u);  // order-free
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_tokens":100,"max_completion_tokens":null})").max_tokens, 100u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_tokens":null})").max_tokens, 0u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_tokens":4294967295})").max_tokens, 4294967295u);
  // vLLM's pydantic models take a number without a fraction, and any size (vLLM then names the context length):
  // Weir's estimate takes it up to 2^32 - 1.
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_tokens":2.0})").max_tokens, 2u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_completion_tokens":1e3})").max_tokens, 1000u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_tokens":4294967296})").max_tokens, 4294967295u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_tokens":99999999999})").max_tokens, 4294967295u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_tokens":18446744073709551616})").max_tokens, 4294967295u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_tokens":1e300})").max_tokens, 4294967295u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","n":3.0})").n, 3u);
}

TEST(ApiParseRequest, BestOfIsTheSequencesGenerated) {
  // vLLM (chat and completions) and OpenAI's legacy completions generate best_of sequences and return the n
  // best: the estimate is of what is generated.
  EXPECT_EQ(ok(kCompletions, R"({"model":"m","prompt":"a","best_of":6})").sequences(), 6u);
  EXPECT_EQ(ok(kCompletions, R"({"model":"m","prompt":"a","best_of":6})").n, 1u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","n":2,"best_of":3.0})").sequences(), 3u);
  EXPECT_EQ(ok(kCompletions, R"({"model":"m","prompt":"a","n":4,"best_of":2})").sequences(), 4u);
  EXPECT_EQ(ok(kCompletions, R"({"model":"m","prompt":"a","best_of":null})").sequences(), 1u);
  EXPECT_EQ(ok(kCompletions, R"({"model":"m","prompt":"a"})").best_of, 0u);
  // Not a vLLM field elsewhere: not read.
  EXPECT_EQ(ok(ApiKind::embeddings, R"({"model":"m","input":"a","best_of":9})").sequences(), 1u);
  for (const char* bad : {"0", "-1", "1.5", "\"3.5\"", "\"0\"", "true"})
    EXPECT_EQ(refused(kCompletions, fmt::format(R"({{"model":"m","prompt":"a","best_of":{}}})", bad)).param, "best_of");
}

TEST(ApiParseRequest, CompletionsEchoWithNoTokensScoresThePrompt) {
  // OpenAI's legacy completions and vLLM serve echo with max_tokens 0: the prompt's logprobs, nothing generated.
  const auto f = ok(kCompletions, R"({"model":"m","prompt":"hi","echo":true,"max_tokens":0,"logprobs":1})");
  EXPECT_TRUE(f.echo_only);
  EXPECT_EQ(f.max_tokens, 0u);
  // As vLLM's pydantic reads them in lax mode.
  EXPECT_TRUE(ok(kCompletions, R"({"model":"m","prompt":"hi","echo":"true","max_tokens":0})").echo_only);
  EXPECT_TRUE(ok(kCompletions, R"({"model":"m","prompt":"hi","echo":1,"max_tokens":0.0})").echo_only);
  EXPECT_EQ(refused(kCompletions, R"({"model":"m","prompt":"hi","echo":"no","max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(refused(kCompletions, R"({"model":"m","prompt":"hi","echo":false,"max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(refused(kCompletions, R"({"model":"m","prompt":"hi","max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(refused(kChat, R"({"model":"m","echo":true,"max_tokens":0})").param, "max_tokens");
  // A count's string too: "0" is 0 to pydantic.
  EXPECT_TRUE(ok(kCompletions, R"({"model":"m","prompt":"hi","echo":true,"max_tokens":"0"})").echo_only);
  EXPECT_TRUE(ok(kCompletions, R"({"model":"m","prompt":"hi","echo":true,"max_tokens":" -0.00 "})").echo_only);
  EXPECT_EQ(refused(kCompletions, R"({"model":"m","prompt":"hi","echo":true,"max_tokens":"zero"})").param,
            "max_tokens");
}

TEST(ApiParseRequest, CountsGivenAsStringsAreReadAsPydanticReadsThem) {
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_tokens":"3"})").max_tokens, 3u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_completion_tokens":" 1_000 "})").max_tokens, 1000u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","n":"2","best_of":"4.0"})").sequences(), 4u);
  EXPECT_EQ(ok(kCompletions, R"({"model":"m","prompt":"a","n":"+3"})").n, 3u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_tokens":"99999999999"})").max_tokens, 4294967295u);
  // Escaped; repeated: refused (ApiParseRequest.RepeatedMembersWeirReadsAreRefused).
  EXPECT_EQ(ok(kChat, R"({"model":"m","max_tokens":"\u0035"})").max_tokens, 5u);
  EXPECT_EQ(refused(kChat, R"({"model":"m","max_tokens":"7","max_tokens":8})").param, "max_tokens");
  // A long string, in pieces to the parser: read whole.
  const std::string spaced =
      std::string(R"({"model":"m","n":")") + std::string(5000, ' ') + "6" + std::string(5000, ' ') + R"("})";
  EXPECT_EQ(ok(kChat, spaced).n, 6u);
  EXPECT_EQ(refused(kChat, R"({"model":"m","max_tokens":"3.5"})").param, "max_tokens");
}

// vLLM's request_id, kept for the gateway (which takes it on chat and completions:
// GatewayPhases::take_body_request_id).
TEST(ApiParseRequest, RequestIdIsTheTopLevelString) {
  EXPECT_EQ(ok(kChat, R"({"model":"m","request_id":"my-trace-42"})").request_id, "my-trace-42");
  EXPECT_EQ(ok(kCompletions, R"({"request_id":"a\u002db","prompt":"p"})").request_id, "a-b");
  EXPECT_EQ(ok(kChat, R"({"model":"m"})").request_id, "");
  // Not a string: none (forwarded as it came, the upstream's to refuse); repeated: refused.
  for (const char* v : {"7", "null", "true", "[\"x\"]", "{\"a\":\"b\"}"})
    EXPECT_EQ(ok(kChat, fmt::format(R"({{"model":"m","request_id":{}}})", v)).request_id, "") << v;
  EXPECT_EQ(refused(kChat, R"({"request_id":"a","model":"m","request_id":7})").param, "request_id");
  // Only the body's own member, not one nested.
  EXPECT_EQ(ok(kChat, R"({"model":"m","metadata":{"request_id":"x"}})").request_id, "");
  // A long one: its first kRequestIdKept bytes, too many for an id (valid_request_id refuses it).
  const auto long_id = ok(kChat, std::string(R"({"request_id":")") + std::string(100'000, 'r') + R"("})").request_id;
  EXPECT_EQ(long_id, std::string(RequestFields::kRequestIdKept, 'r'));
}

TEST(ApiParseRequest, MaxTokensMustBeAPositiveInteger) {
  for (std::string_view v : {"0", "-1", "1.5", "\"0\"", "\"-3\"", "\"3.5\"", "\"3e0\"", "\"\"", "true", "[]", "-0.0",
                             "0.5", "-1e300", "2.000001"}) {
    SCOPED_TRACE(v);
    EXPECT_EQ(refused(kChat, std::string(R"({"model":"m","max_tokens":)") + std::string(v) + "}").param, "max_tokens");
    EXPECT_EQ(refused(kChat, std::string(R"({"model":"m","max_completion_tokens":)") + std::string(v) + "}").param,
              "max_completion_tokens");
  }
}

TEST(ApiParseRequest, N) {
  EXPECT_EQ(ok(kChat, R"({"model":"m"})").n, 1u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","n":4})").n, 4u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","n":null})").n, 1u);
  EXPECT_EQ(refused(kChat, R"({"model":"m","n":0})").param, "n");
  EXPECT_EQ(refused(kChat, R"({"model":"m","n":-2})").param, "n");
  EXPECT_EQ(refused(kChat, R"({"model":"m","n":"two"})").param, "n");
  EXPECT_EQ(ok(kCompletions, R"({"model":"m","prompt":"p","n":3})").n, 3u);
  EXPECT_EQ(ok(kEmbeddings, R"({"model":"m","input":"p","n":3})").n, 1u);  // one vector per input
}

TEST(ApiParseRequest, ChatPromptBytesCountContentStringsAndTextParts) {
  // "héllo" is 6 UTF-8 bytes; a system message and an assistant turn count too.
  auto f = ok(kChat, R"({"model":"m","messages":[
      {"role":"system","content":"be brief"},
      {"role":"user","content":"h\u00e9llo"},
      {"role":"assistant","content":null},
      {"role":"user","content":[{"type":"text","text":"abc"},{"type":"image_url","image_url":{"url":"data:x"}},
                                {"type":"text","text":"de"}]}]})");
  EXPECT_EQ(f.prompt_bytes, 8u + 6u + 0u + 5u);
  EXPECT_EQ(f.prompt_overhead_tokens, 4 * RequestFields::kChatTokensPerMessage);
  EXPECT_EQ(f.prompt_count, 1u);

  // Escapes count as the decoded bytes.
  EXPECT_EQ(ok(kChat, R"({"model":"m","messages":[{"role":"user","content":"a\nb\"c"}]})").prompt_bytes, 5u);
  // A part that is a bare string is text to vLLM's chat_utils, as a text part is (it counted nothing:
  // a way past token limits and budgets).
  EXPECT_EQ(ok(kChat, R"({"model":"m","messages":[{"role":"user","content":["abcd",{"type":"text","text":"ef"}]}]})")
                .prompt_bytes,
            6u);
  // A request's own chat template and its kwargs may be printed whole: counted as their JSON text.
  EXPECT_EQ(ok(kChat, R"({"model":"m","messages":[],"chat_template":"0123456789"})").prompt_bytes, 12u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","messages":[],"chat_template_kwargs":{"x":"abc"}})").prompt_bytes, 11u);
  // Odd shapes count nothing but still count as messages.
  f = ok(kChat, R"({"model":"m","messages":[7,{"role":"user"},{"content":[1,{"text":5}]}]})");
  EXPECT_EQ(f.prompt_bytes, 0u);
  EXPECT_EQ(f.prompt_overhead_tokens, 3 * RequestFields::kChatTokensPerMessage);
  // No messages, or not an array: no overhead.
  EXPECT_EQ(ok(kChat, R"({"model":"m"})").prompt_overhead_tokens, 0u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","messages":"hi"})").prompt_overhead_tokens, 0u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","messages":[]})").prompt_overhead_tokens, 0u);
}

TEST(ApiParseRequest, ChatPromptBytesCountWhatTheTemplateRenders) {
  // Tool definitions are printed into the prompt as JSON (tojson): they count
  // as their JSON text, numbers and punctuation too; a 40 KB description is
  // 10k tokens whether it sits in content or in a tool.
  const std::string big(40000, 'x');
  const std::string tools = R"([{"type":"function","function":{"name":"f","description":")" + big +
                            R"(","parameters":{"type":"object","enum":[1,2,3]}}}])";
  auto f = ok(kChat, R"({"model":"m","messages":[{"role":"user","content":"hi"}],"tools":)" + tools + "}");
  EXPECT_EQ(f.prompt_bytes, 2u + tools.size());
  // Numbers count: 100k of them are no free prompt.
  std::string nums = "[";
  for (int i = 0; i < 100000; ++i) nums += i ? ",7" : "7";
  nums += "]";
  f = ok(kChat,
         R"({"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"enum":)" + nums + "}}}]}");
  EXPECT_GT(f.prompt_bytes, 200000u);

  f = ok(kChat, R"({"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1",)"
                R"("type":"function","function":{"name":"get","arguments":"{\"q\":1}"}}]},)"
                R"({"role":"tool","tool_call_id":"c1","name":"get","content":"42"}]})");
  // c1 + function + get + {"q":1} ; c1 + get + 42 (role values are in the per-message overhead)
  EXPECT_EQ(f.prompt_bytes, (2u + 8 + 3 + 7) + (2 + 3 + 2));

  // Legacy functions and vLLM's documents too.
  EXPECT_EQ(ok(kChat, R"({"model":"m","functions":[{"name":"ab"}],"documents":[{"t":"xyz"}]})").prompt_bytes,
            std::string_view(R"([{"name":"ab"}])").size() + std::string_view(R"([{"t":"xyz"}])").size());
  EXPECT_EQ(refused(kChat, R"({"model":"m","tools":[1,2,3,4,5],"tools":[1]})").param, "tools");
  // Refusal and thinking parts are prompt text (vLLM's chat_utils), as text parts are.
  EXPECT_EQ(ok(kChat, R"({"model":"m","messages":[{"role":"assistant","content":[{"type":"refusal","refusal":"no"},)"
                      R"({"type":"thinking","thinking":"hmm"}]}]})")
                .prompt_bytes,
            5u);
  // Media never (a data: URL is not text).
  f = ok(kChat, R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url",)"
                R"("image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"input_audio",)"
                R"("input_audio":{"data":"AAAA","format":"wav"}}],"images":[{"url":"u"}]}]})");
  EXPECT_EQ(f.prompt_bytes, 0u);
  // A repeated messages array: refused.
  EXPECT_EQ(refused(kChat, R"({"model":"m","messages":[{"role":"user","name":"abcdef"}],)"
                           R"("messages":[{"role":"user","name":"ab"}]})")
                .param,
            "messages");
}

TEST(ApiParseRequest, CompletionsPromptStringListAndTokenIds) {
  auto f = ok(kCompletions, R"({"model":"m","prompt":"once upon"})");
  EXPECT_EQ(f.prompt_bytes, 9u);
  EXPECT_EQ(f.prompt_count, 1u);
  EXPECT_EQ(f.prompt_overhead_tokens, 1u);

  f = ok(kCompletions, R"({"model":"m","prompt":["ab","cde","f"]})");  // a batch of three prompts
  EXPECT_EQ(f.prompt_bytes, 6u);
  EXPECT_EQ(f.prompt_count, 3u);
  EXPECT_EQ(f.prompt_overhead_tokens, 3u);

  f = ok(kCompletions, R"({"model":"m","prompt":[101,2023,2003]})");  // one prompt of token ids: 4 bytes each
  EXPECT_EQ(f.prompt_bytes, 12u);
  EXPECT_EQ(f.prompt_count, 1u);
  EXPECT_EQ(f.prompt_overhead_tokens, 1u);

  f = ok(kCompletions, R"({"model":"m","prompt":[[1,2],[3],[4,5,6]]})");  // a batch of token-id prompts
  EXPECT_EQ(f.prompt_bytes, 24u);
  EXPECT_EQ(f.prompt_count, 3u);
  EXPECT_EQ(f.prompt_overhead_tokens, 3u);

  f = ok(kCompletions, R"({"model":"m","prompt":[]})");
  EXPECT_EQ(f.prompt_bytes, 0u);
  EXPECT_EQ(f.prompt_count, 1u);

  // `messages` means nothing to completions, `prompt` nothing to chat.
  EXPECT_EQ(ok(kCompletions, R"({"model":"m","messages":[{"content":"abc"}]})").prompt_bytes, 0u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","prompt":"abc"})").prompt_bytes, 0u);
}

TEST(ApiParseRequest, EmbeddingsInput) {
  auto f = ok(kEmbeddings, R"({"model":"e","input":"embed me"})");
  EXPECT_EQ(f.prompt_bytes, 8u);
  EXPECT_EQ(f.prompt_count, 1u);
  EXPECT_EQ(f.prompt_overhead_tokens, 1u);

  f = ok(kEmbeddings, R"({"model":"e","input":["a","bb","ccc","dddd"]})");
  EXPECT_EQ(f.prompt_bytes, 10u);
  EXPECT_EQ(f.prompt_count, 4u);
  EXPECT_EQ(f.prompt_overhead_tokens, 4u);

  f = ok(kEmbeddings, R"({"model":"e","input":[[1,2,3],[4]]})");
  EXPECT_EQ(f.prompt_bytes, 16u);
  EXPECT_EQ(f.prompt_count, 2u);

  // `prompt` is not the embeddings field.
  EXPECT_EQ(ok(kEmbeddings, R"({"model":"e","prompt":"abc"})").prompt_bytes, 0u);
}

TEST(ApiParseRequest, InvalidJsonAndNonObjectsAreRefused) {
  for (std::string_view body : {"", "{", "{\"model\":\"m\"", "{\"model\":\"m\",}", "not json", "{'model':'m'}",
                                "{\"model\":\"m\"} trailing", "\xff\xfe"}) {
    SCOPED_TRACE(body);
    const auto e = refused(kChat, body);
    EXPECT_FALSE(e.message.empty());
  }
  for (std::string_view body : {"[]", "[{\"model\":\"m\"}]", "\"model\"", "42", "null", "true"}) {
    SCOPED_TRACE(body);
    EXPECT_EQ(refused(kChat, body).message, "The request body must be a JSON object.");
  }
  EXPECT_EQ(refused(kChat, "").message, "The request body is empty; expected a JSON object.");
}

// Boost.JSON calls ill-formed UTF-8 a syntax error, and a lone surrogate escape a syntax error or an illegal
// leading or trailing surrogate (by where the buffer ends): the message says which of the two it is, alike.
TEST(ApiParseRequest, InvalidUtf8AndLoneSurrogatesAreNamed) {
  constexpr std::string_view kLone = "The request body is not valid JSON: lone surrogate escape in a string";
  for (std::string_view body :
       {R"({"model":"m","x":"\ud800"})", R"({"model":"m","x":"\udc00"})", R"({"model":"m","x":"a\uDBFFb"})",
        R"({"model":"m","x":"\ud800\u0041"})", R"({"model":"m","x":"\ud83d\ude00","y":"\udfff"})"}) {
    SCOPED_TRACE(body);
    EXPECT_TRUE(refused(kChat, body).message.starts_with(kLone)) << refused(kChat, body).message;
  }
  EXPECT_EQ(refused(kChat,
                    "{\"model\":\"m\",\"x\":\"a\xff"
                    "b\"}")
                .message,
            "The request body is not valid JSON: invalid UTF-8 (byte 0xFF at offset 19).");
  EXPECT_EQ(refused(kChat, "{\"model\":\"m\xed\xa0\x80\"}").message,  // (an encoded surrogate)
            "The request body is not valid JSON: invalid UTF-8 (byte 0xED at offset 11).");
  // An escaped backslash before "ud800" is text, and a pair is a character: the syntax error is the comma.
  EXPECT_EQ(refused(kChat, R"({"model":"m","x":"\\ud800 \ud83d\ude00",})").message,
            "The request body is not valid JSON: syntax error.");
  ok(kChat, R"({"model":"m","x":"\\ud800","y":"\ud83d\ude00"})");
}

std::string nested(int depth) {
  // The body object is level 1; `x` holds depth - 1 more levels of arrays.
  return R"({"model":"m","x":)" + std::string(static_cast<std::size_t>(depth - 1), '[') +
         std::string(static_cast<std::size_t>(depth - 1), ']') + "}";
}

TEST(ApiParseRequest, NestingOver64LevelsIsRefused) {
  ok(kChat, nested(10));
  ok(kChat, nested(64));
  refused(kChat, nested(65));
  refused(kChat, nested(10'000));  // no stack overflow, just a 400
  const std::string objects = R"({"model":"m","x":)" + [] {
    std::string s;
    for (int i = 0; i < 200; ++i) s += R"({"a":)";
    s += "1";
    for (int i = 0; i < 200; ++i) s += "}";
    return s;
  }() + "}";
  refused(kChat, objects);
}

TEST(ApiParseRequest, LargeBodiesParse) {
  // Larger than the parser's per-thread arena: still parsed (it allocates past it).
  std::string content(200'000, 'a');
  std::string body = R"({"model":"m","messages":[)";
  for (int i = 0; i < 50; ++i) body += std::string(i ? "," : "") + R"({"role":"user","content":")" + content + "\"}";
  body += "]}";
  const auto f = ok(kChat, body);
  EXPECT_EQ(f.prompt_bytes, 50u * content.size());
  EXPECT_EQ(f.prompt_overhead_tokens, 50 * RequestFields::kChatTokensPerMessage);
}

TEST(ApiParseRequest, UnknownFieldsAreIgnored) {
  const auto f = ok(kChat, R"({"model":"m","temperature":0.2,"tools":[{"type":"function"}],"user":"u","seed":1})");
  EXPECT_EQ(f.model, "m");
}

TEST(ApiParseRequest, VllmExtraRoutesMayOmitTheModelAndCountTheirTexts) {
  const auto f = ok(ApiKind::vllm_extra, R"({"query":"ab","documents":["cde","f"]})");
  EXPECT_EQ(f.model, "");
  EXPECT_EQ(f.prompt_bytes, 6u);
  EXPECT_EQ(f.n, 1u);
  EXPECT_EQ(ok(ApiKind::vllm_extra, R"({"model":"m","text_1":"ab","text_2":["c"]})").prompt_bytes, 3u);
  EXPECT_EQ(ok(ApiKind::vllm_extra, R"({"model":"m","input":[[1,2,3]]})").prompt_bytes, 12u);  // token ids
  EXPECT_EQ(ok(ApiKind::vllm_extra, R"({"model":"m","tokens":[1,2]})").prompt_bytes, 0u);      // detokenize
  // A chat-form tokenize or pooling request: what its template prints (the request's own template, its
  // kwargs, tools) counts, as on chat (it counted nothing: a way past the limits).
  EXPECT_EQ(ok(ApiKind::vllm_extra, R"({"model":"m","messages":[],"chat_template":"0123456789"})").prompt_bytes, 10u);
  EXPECT_EQ(ok(ApiKind::vllm_extra, R"({"model":"m","messages":[],"tools":[{"d":"abcd"}]})").prompt_bytes, 4u);
  EXPECT_EQ(ok(ApiKind::embeddings, R"({"model":"m","messages":[{"content":"ab"}],"chat_template_kwargs":{"s":"xyz"}})")
                .prompt_bytes,
            5u);
  EXPECT_FALSE(ok(ApiKind::vllm_extra, R"({"model":"m","input":"x","stream":true})").stream);
  EXPECT_FALSE(parse_request(ApiKind::vllm_extra, R"({"model":3})"));
  EXPECT_FALSE(parse_request(ApiKind::vllm_extra, R"([1])"));
  // (The OpenAI routes too, as vLLM's: ModelIsANonEmptyStringOrAbsent.)
  EXPECT_EQ(ok(ApiKind::embeddings, R"({"input":"x"})").model, "");
}

// Media parts count at the model's media_tokens (admission), not as their bytes or as nothing: parse_request
// counts them, one per part whatever its size.
TEST(ApiParseRequest, MediaPartsAreCountedOneEach) {
  const auto f = ok(kChat, R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"describe"},
    {"type":"image_url","image_url":{"url":"https://e.com/a.png"}},
    {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},
    {"type":"input_audio","input_audio":{"data":"UklGRg","format":"wav"}},
    {"type":"video_url","video_url":{"url":"https://e.com/v.mp4"}},
    {"type":"file","file":{"file_data":"JVBERi0"}}]},
    {"role":"assistant","content":"ok"},
    {"role":"user","content":[{"image_url":{"url":"https://e.com/b.png"}}]}]})");
  EXPECT_EQ(f.media_parts, 6u);
  EXPECT_EQ(f.prompt_bytes, 8u + 2u);  // "describe", "ok": the media's bytes are not text
  EXPECT_EQ(ok(kChat, R"({"model":"m","messages":[{"role":"user","content":"hi"}]})").media_parts, 0u);
  // vLLM's embeddings of a conversation count theirs too.
  EXPECT_EQ(ok(kEmbeddings, R"({"model":"m","messages":[{"role":"user","content":[
                                {"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"x"}]}]})")
                .media_parts,
            1u);
}

// vLLM's min_tokens holds the end back: without max_tokens the answer is at least that long.
TEST(ApiParseRequest, MinTokensIsRead) {
  EXPECT_EQ(ok(kChat, R"({"model":"m","messages":[],"min_tokens":20000})").min_tokens, 20000u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","messages":[],"min_tokens":"300"})").min_tokens, 300u);
  EXPECT_EQ(ok(kCompletions, R"({"model":"m","prompt":"x","min_tokens":7.0})").min_tokens, 7u);
  // Not a count vLLM takes (its 400 to give): not read.
  EXPECT_EQ(ok(kChat, R"({"model":"m","messages":[],"min_tokens":-1})").min_tokens, 0u);
  EXPECT_EQ(ok(kChat, R"({"model":"m","messages":[],"min_tokens":"many"})").min_tokens, 0u);
  EXPECT_EQ(ok(kEmbeddings, R"({"model":"m","input":"x","min_tokens":9})").min_tokens, 0u);
}

}  // namespace
}  // namespace weir::api

namespace weir::api {
namespace {

// A member Weir reads, given twice: JSON parsers differ on which copy counts (Python's json the last, gjson and
// simdjson the first, serde refuses), and the body goes upstream as it came: refused, naming it.
TEST(ApiParseRequest, ReadMemberNames) {
  for (int i = 0; i < kReadMemberCount; ++i) EXPECT_EQ(read_member_index(read_member_name(i)), i) << i;
  for (const char* other : {"", "Model", "models", "mode", "metadata", "x", "stream_option", "guided_jsonx"})
    EXPECT_EQ(read_member_index(other), -1) << other;
  EXPECT_EQ(read_stream_option_index("include_usage"), 0);
  EXPECT_EQ(read_stream_option_index("continuous_usage_stats"), 1);
  EXPECT_EQ(read_stream_option_index("x"), -1);
}

TEST(ApiParseRequest, RepeatedMembersWeirReadsAreRefused) {
  for (const ApiKind kind :
       {ApiKind::chat_completions, ApiKind::completions, ApiKind::embeddings, ApiKind::vllm_extra}) {
    SCOPED_TRACE(static_cast<int>(kind));
    for (const char* name : {"model",
                             "stream",
                             "stream_options",
                             "max_tokens",
                             "max_completion_tokens",
                             "n",
                             "best_of",
                             "min_tokens",
                             "request_id",
                             "messages",
                             "prompt",
                             "input",
                             "tools",
                             "functions",
                             "documents",
                             "chat_template",
                             "chat_template_kwargs",
                             "text",
                             "query",
                             "text_1",
                             "text_2",
                             "echo",
                             "logprobs",
                             "top_logprobs",
                             "prompt_logprobs",
                             "suffix",
                             "user",
                             "temperature",
                             "seed",
                             "response_format",
                             "guided_json",
                             "guided_regex",
                             "guided_choice",
                             "guided_grammar",
                             "guided_whitespace_pattern",
                             "structured_outputs",
                             "structural_tag",
                             "continue_final_message",
                             "add_generation_prompt"}) {
      SCOPED_TRACE(name);
      const auto e = refused(kind, fmt::format(R"({{"{0}":null,"x":1,"{0}":null}})", name));
      EXPECT_EQ(e.param, name);
      EXPECT_NE(e.message.find(fmt::format("'{}' appears more than once", name)), std::string::npos) << e.message;
      EXPECT_EQ(e.status, 400);
    }
    // The attack's bodies: a second model, a second max_tokens; an escaped spelling is the same name.
    EXPECT_EQ(refused(kind, R"({"model":"secret","model":"plain"})").param, "model");
    EXPECT_EQ(refused(kind, R"({"max_tokens":100000,"model":"s","max_tokens":1})").param, "max_tokens");
    EXPECT_EQ(refused(kind, R"({"model":"a","m\u006fdel":"b"})").param, "model");
    // The first repeated one is named.
    EXPECT_EQ(refused(kind, R"({"n":1,"model":"a","model":"b","n":2})").param, "model");
    // stream_options' own members Weir reads or rewrites.
    EXPECT_EQ(refused(kind, R"({"stream_options":{"include_usage":false,"include_usage":true}})").param,
              "stream_options.include_usage");
    EXPECT_EQ(refused(kind, R"({"stream_options":{"continuous_usage_stats":1,"continuous_usage_stats":2}})").param,
              "stream_options.continuous_usage_stats");
    // Members Weir does not read may repeat (passed on as they came), at the top level or nested, and a read
    // name repeated inside another member is no repeat of the top-level one.
    EXPECT_TRUE(parse_request(kind, R"({"model":"m","metadata":1,"metadata":2,"x":{"model":1,"model":2}})"));
    EXPECT_TRUE(parse_request(kind, R"({"model":"m","stream_options":{"x":1,"x":2},"y":{"include_usage":1,)"
                                    R"("include_usage":2}})"));
    EXPECT_TRUE(parse_request(kind, R"({"model":"m","messages":[{"content":"a","content":"b"}]})"));
    // A syntax error anywhere comes first, as from a DOM parse.
    EXPECT_EQ(refused(kind, R"({"model":"a","model":"b",})").param, "");
  }
}

}  // namespace
}  // namespace weir::api
