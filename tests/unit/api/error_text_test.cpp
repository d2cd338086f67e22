// An upstream's error answer in OpenAI's shape (api/error_text.hpp): which bodies already are one, and what
// the others become (vLLM's older flat object, its integer code, a proxy's HTML page, an error event's data).
#include "api/error_text.hpp"

#include <cstdint>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "core/json_text.hpp"

namespace weir::api {
namespace {

namespace json = boost::json;

json::value reshaped(int status, std::string_view body) {
  std::string out;
  append_openai_error_for(out, status, body);
  return json::parse(out);
}

TEST(OpenAiUpstreamError, OpenAiShapeIsTold) {
  EXPECT_TRUE(is_openai_error(R"({"error":{"message":"m","type":"invalid_request_error","param":null,"code":null}})"));
  EXPECT_TRUE(is_openai_error(R"({"error":{"message":"m","type":"t","param":"p","code":"context_length_exceeded"}})"));
  EXPECT_TRUE(is_openai_error(R"({"error":{"message":"m"}})"));  // (absent members: the SDKs read them as null)
  // vLLM >= 0.10.1: the shape, with its status as an integer code.
  EXPECT_FALSE(is_openai_error(R"({"error":{"message":"m","type":"BadRequestError","param":null,"code":400}})"));
  // vLLM < 0.10.1: flat.
  EXPECT_FALSE(is_openai_error(R"({"object":"error","message":"m","type":"BadRequestError","param":null,"code":400})"));
  EXPECT_FALSE(is_openai_error(R"({"error":"model not found"})"));
  EXPECT_FALSE(is_openai_error(R"({"error":{"message":3}})"));
  EXPECT_FALSE(is_openai_error(R"({"error":{"code":"x"}})"));
  EXPECT_FALSE(is_openai_error(R"({"error":{"message":"m","param":["a"]}})"));
  EXPECT_FALSE(is_openai_error(R"({"detail":"Not Found"})"));
  EXPECT_FALSE(is_openai_error("<html>Bad Gateway</html>"));
  EXPECT_FALSE(is_openai_error(""));
  EXPECT_FALSE(is_openai_error(R"({"error":{"message":"m"})"));  // cut short
  // Deeper than Boost.JSON's default 32 levels (details echoing a deep request): still told, its words kept.
  const std::string deep = R"({"error":{"message":"schema too deep","type":"t","param":null,"code":"bad_schema",)"
                           R"("details":)" +
                           std::string(100, '[') + std::string(100, ']') + "}}";
  EXPECT_TRUE(is_openai_error(deep));
  EXPECT_EQ(upstream_error_message(R"({"detail":[{"msg":"bad","input":)" + std::string(100, '[') +
                                   std::string(100, ']') + "}]}"),
            upstream_error_message(R"({"detail":[{"msg":"bad","input":[]}]})"));
}

TEST(OpenAiUpstreamError, VllmShapesKeepTheirWordsAndLoseTheIntegerCode) {
  EXPECT_EQ(reshaped(400, R"({"object":"error","message":"too long","type":"BadRequestError","param":"max_tokens",
                             "code":400})"),
            json::parse(R"({"error":{"message":"too long","type":"BadRequestError","param":"max_tokens",
                                     "code":null}})"));
  EXPECT_EQ(reshaped(400, R"({"error":{"message":"too long","type":"BadRequestError","param":null,"code":400}})"),
            json::parse(R"({"error":{"message":"too long","type":"BadRequestError","param":null,"code":null}})"));
  // A string code stays; no type: by the status.
  EXPECT_EQ(reshaped(503, R"({"message":"busy","code":"overloaded"})"),
            json::parse(R"({"error":{"message":"busy","type":"server_error","param":null,"code":"overloaded"}})"));
  EXPECT_EQ(reshaped(404, R"({"error":"model 'x' not found"})"),
            json::parse(R"({"error":{"message":"model 'x' not found","type":"invalid_request_error","param":null,
                                     "code":null}})"));
  EXPECT_EQ(
      reshaped(422, R"({"detail":[{"loc":["body","max_tokens"],"msg":"must be positive"}]})").at("error").at("message"),
      "max_tokens: must be positive");
}

TEST(OpenAiUpstreamError, TextBodiesAreTheMessageCut) {
  EXPECT_EQ(
      reshaped(502, "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n\t<body>nginx</body>\n</html>\n")
          .at("error"),
      json::parse(
          R"({"message":"Upstream answered 502: <html> <head><title>502 Bad Gateway</title></head> <body>nginx</body> </html>",
                            "type":"server_error","param":null,"code":null})"));
  EXPECT_EQ(reshaped(500, "Internal Server Error").at("error").at("message"),
            "Upstream answered 500: Internal Server Error");
  // Nothing to say: the status.
  EXPECT_EQ(reshaped(500, "").at("error").at("message"), "Upstream answered 500.");
  EXPECT_EQ(reshaped(500, " \r\n ").at("error").at("message"), "Upstream answered 500.");
  EXPECT_EQ(reshaped(400, R"({"what":1})").at("error").at("message"), "Upstream answered 400.");
  // A long page: kMaxUpstreamTextBytes of it, cut on a character, then "..."; ill-formed UTF-8 as U+FFFD.
  const std::string page = "\xff" + std::string(kMaxUpstreamTextBytes, 'a') + "\xc3\xa9";
  const std::string m(reshaped(503, page).at("error").at("message").as_string());
  EXPECT_EQ(m, "Upstream answered 503: \xef\xbf\xbd" + std::string(kMaxUpstreamTextBytes - 3, 'a') + "...");
  const std::string u(
      reshaped(503, std::string(kMaxUpstreamTextBytes - 1, 'a') + "\xc3\xa9").at("error").at("message").as_string());
  EXPECT_EQ(u, "Upstream answered 503: " + std::string(kMaxUpstreamTextBytes - 1, 'a') + "...");
}

TEST(OpenAiUpstreamError, StreamErrorEventsTakeTheirTypeFromTheIntegerCode) {
  // vLLM's in-band error: no HTTP status to go by (the stream's was 200).
  EXPECT_EQ(reshaped(0, R"({"error":{"message":"boom","code":400}})"),
            json::parse(R"({"error":{"message":"boom","type":"invalid_request_error","param":null,"code":null}})"));
  EXPECT_EQ(reshaped(0, R"({"object":"error","message":"engine dead","code":500})").at("error").at("type"),
            "server_error");
  EXPECT_EQ(reshaped(0, R"({"error":{"code":500}})").at("error").at("message"), "The upstream's stream failed.");
  EXPECT_EQ(reshaped(0, R"({"error": cut)").at("error").at("message"),
            R"(The upstream's stream failed: {"error": cut)");
}

// vLLM's context-length refusals, every wording (old serving_engine.py, its later one, the newest, the
// renderer's, max_tokens's, the engine's), OpenAI's own and Anthropic's: told, with the counts they give.
struct Wording {
  const char* message;
  std::int64_t limit, input, output;
  const char* anthropic;  // "" when the counts show neither of Anthropic's cases
};
const Wording kWordings[] = {
    {"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4900 in the "
     "messages, 100 in the completion). Please reduce the length of the messages or completion.",
     4096, 4900, 100, "prompt is too long: 4900 tokens > 4096 maximum"},
    {"This model's maximum context length is 4096 tokens. However, you requested 4100 tokens (4000 in the "
     "messages, 100 in the completion). Please reduce the length of the messages or completion.",
     4096, 4000, 100,
     "input length and `max_tokens` exceed context limit: 4000 + 100 > 4096, decrease input length or "
     "`max_tokens` and try again"},
    {"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens in the messages, "
     "Please reduce the length of the messages.",
     4096, 5000, -1, "prompt is too long: 5000 tokens > 4096 maximum"},
    {"This model's maximum context length is 4096 tokens. However, you requested 100 output tokens and your "
     "prompt contains 4900 input tokens, for a total of 5000 tokens. Please reduce the length of the input prompt "
     "or the number of requested output tokens.",
     4096, 4900, 100, "prompt is too long: 4900 tokens > 4096 maximum"},
    {"This model's maximum context length is 4096 tokens. However, you requested 1000 output tokens and your "
     "prompt contains at least 3097 input tokens, for a total of at least 4097 tokens. Please reduce the length "
     "of the input prompt or the number of requested output tokens.",
     4096, 3097, 1000,
     "input length and `max_tokens` exceed context limit: 3097 + 1000 > 4096, decrease input length or "
     "`max_tokens` and try again"},
    {"Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total of "
     "5000 tokens: 4900 tokens from the input messages and 100 tokens for the completion. Please reduce the number "
     "of tokens in the input messages or the completion to fit within the limit.",
     4096, 4900, 100, "prompt is too long: 4900 tokens > 4096 maximum"},
    {"Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total of "
     "4196 tokens: 3000 tokens from the input prompt and 1196 tokens for the completion. Please reduce the number "
     "of tokens in the input prompt or the completion to fit within the limit.",
     4096, 3000, 1196,
     "input length and `max_tokens` exceed context limit: 3000 + 1196 > 4096, decrease input length or "
     "`max_tokens` and try again"},
    {"You passed 3997 input tokens and requested 100 output tokens. However, the model's context length is only "
     "4096 tokens, resulting in a maximum input length of 3996 tokens. Please reduce the length of the input "
     "prompt.",
     4096, 3997, 100,
     "input length and `max_tokens` exceed context limit: 3997 + 100 > 4096, decrease input length or "
     "`max_tokens` and try again"},
    {"You passed 4097 input tokens and requested 0 output tokens. However, the model's context length is only "
     "4096 tokens, resulting in a maximum input length of 4096 tokens. Please reduce the length of the input "
     "prompt.",
     4096, 4097, 0, "prompt is too long: 4097 tokens > 4096 maximum"},
    {"You passed 90000 input characters and requested 100 output tokens. However, the model's context length is "
     "only 4096 tokens, resulting in a maximum input length of 3996 tokens (at most 15984 characters). Please "
     "reduce the length of the input prompt.",
     4096, -1, 100, ""},
    {"'max_tokens' or 'max_completion_tokens' is too large: 2000. This model's maximum context length is 4096 "
     "tokens and your request has 2104 input tokens (2000 > 4096 - 2104).",
     4096, 2104, 2000,
     "input length and `max_tokens` exceed context limit: 2104 + 2000 > 4096, decrease input length or "
     "`max_tokens` and try again"},
    {"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens in the input for "
     "embedding generation. Please reduce the length of the input.",
     4096, 5000, -1, "prompt is too long: 5000 tokens > 4096 maximum"},
    {"The decoder prompt (length 5000) is longer than the maximum model length of 4096. Make sure that "
     "`max_model_len` is no smaller than the number of text tokens.",
     4096, 5000, -1, "prompt is too long: 5000 tokens > 4096 maximum"},
    {"This model's maximum context length is 8192 tokens. However, your messages resulted in 8765 tokens. Please "
     "reduce the length of the messages.",
     8192, 8765, -1, "prompt is too long: 8765 tokens > 8192 maximum"},
    {"prompt is too long: 210000 tokens > 200000 maximum", 200000, 210000, -1,
     "prompt is too long: 210000 tokens > 200000 maximum"},
    {"input length and `max_tokens` exceed context limit: 190000 + 32000 > 200000, decrease input length or "
     "`max_tokens` and try again",
     200000, 190000, 32000,
     "input length and `max_tokens` exceed context limit: 190000 + 32000 > 200000, decrease input length or "
     "`max_tokens` and try again"},
    // A count that says no context is exceeded: told, but not rewritten.
    {"This model's maximum context length is 4096 tokens. However, your request has 4096 input tokens. Please "
     "reduce the length of the input messages.",
     4096, 4096, -1, ""},
};

TEST(ContextLengthError, EveryWordingIsToldWithItsCounts) {
  for (const auto& w : kWordings) {
    SCOPED_TRACE(w.message);
    const auto e = context_length_error(w.message);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->limit, w.limit);
    EXPECT_EQ(e->input, w.input);
    EXPECT_EQ(e->output, w.output);
    EXPECT_EQ(anthropic_context_length_message(*e), w.anthropic);
  }
  for (const std::string_view other :
       {"max_tokens is too large", "maximum context", "prompt is too long", "", "The context length is 4096 tokens.",
        "max_tokens=9223372036854775807 cannot be greater than max_model_len=64. Please request fewer output tokens."})
    EXPECT_FALSE(context_length_error(other).has_value()) << other;
  // Counts past int64 are not counts.
  const auto huge = context_length_error("prompt is too long: 99999999999999999999 tokens > 4096 maximum");
  ASSERT_TRUE(huge.has_value());
  EXPECT_EQ(huge->input, -1);
  EXPECT_EQ(anthropic_context_length_message(*huge), "");
}

TEST(ContextLengthError, OpenAiClientsGetTheCodeInBothVllmShapes) {
  for (const auto& w : kWordings) {
    SCOPED_TRACE(w.message);
    std::string message;
    core::append_json_string(message, w.message);
    for (const std::string& body :
         {R"({"object":"error","message":)" + message + R"(,"type":"BadRequestError","param":null,"code":400})",
          R"({"error":{"message":)" + message + R"(,"type":"BadRequestError","param":null,"code":400}})",
          R"({"error":{"message":)" + message + R"(,"type":"invalid_request_error"}})"}) {
      EXPECT_FALSE(is_openai_error(body));
      const json::value want = {{"error",
                                 {{"message", w.message},
                                  {"type", "invalid_request_error"},
                                  {"param", "messages"},
                                  {"code", "context_length_exceeded"}}}};
      EXPECT_EQ(reshaped(400, body), want);
      EXPECT_EQ(reshaped(0, R"({"error":{"message":)" + message + R"(,"code":400}})"), want);  // in-band
      std::string out;
      append_openai_error_for(out, 400, body, nullptr, "prompt");
      EXPECT_EQ(json::parse(out).at("error").at("param"), "prompt");
      out.clear();
      append_openai_error_for(out, 400, body, nullptr, "");
      EXPECT_TRUE(json::parse(out).at("error").at("param").is_null());
    }
  }
  // The upstream's own param and string code stay; a 5xx is no refusal of the request.
  const std::string v =
      R"({"error":{"message":"This model's maximum context length is 10 tokens.","param":"max_tokens",)"
      R"("code":400}})";
  EXPECT_EQ(reshaped(400, v).at("error").at("param"), "max_tokens");
  const std::string coded = R"({"error":{"message":"This model's maximum context length is 10 tokens.","code":"x"}})";
  EXPECT_TRUE(is_openai_error(coded));
  EXPECT_EQ(reshaped(400, coded).at("error").at("code"), "x");
  EXPECT_TRUE(reshaped(500, v).at("error").at("code").is_null());
  EXPECT_TRUE(reshaped(0, R"({"error":{"message":"maximum context length is 10","code":500}})")
                  .at("error")
                  .at("code")
                  .is_null());
}

}  // namespace
}  // namespace weir::api
