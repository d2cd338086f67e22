// An upstream's error answer in OpenAI's shape (api/error_text.hpp): which bodies already are one, and what
// the others become (vLLM's older flat object, its integer code, a proxy's HTML page, an error event's data).
#include "api/error_text.hpp"

#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

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

}  // namespace
}  // namespace weir::api
