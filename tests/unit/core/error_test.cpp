#include "core/error.hpp"

#include <gtest/gtest.h>
#include <boost/json.hpp>

namespace json = boost::json;
using namespace weir::core;

namespace {
json::object body_of(const Error& e) { return json::parse(error_json(e)).as_object(); }
}  // namespace

TEST(Error, OpenAIShapeWithNulls) {
  auto b = body_of(bad_request("bad \"thing\"\n"));
  ASSERT_TRUE(b.contains("error"));
  const auto& e = b["error"].as_object();
  EXPECT_EQ(e.size(), 4u);
  EXPECT_EQ(e.at("message").as_string(), "bad \"thing\"\n");
  EXPECT_EQ(e.at("type").as_string(), "invalid_request_error");
  EXPECT_TRUE(e.at("param").is_null());
  EXPECT_TRUE(e.at("code").is_null());
}

TEST(Error, StatusTypeAndCodeForEachKind) {
  struct Case {
    Error e;
    int status;
    const char* type;
    const char* code;
    ErrorSource source;
  };
  const Case cases[] = {
      {model_not_found("gpt-x"), 404, "invalid_request_error", "model_not_found", ErrorSource::client},
      {method_not_allowed("GET", "/v1/chat/completions"), 405, "invalid_request_error", "method_not_allowed",
       ErrorSource::client},
      {payload_too_large(4096), 413, "invalid_request_error", "request_too_large", ErrorSource::client},
      {unauthorized("no key"), 401, "invalid_request_error", "invalid_api_key", ErrorSource::client},
      {forbidden("not yours"), 403, "permission_error", "model_not_allowed", ErrorSource::client},
      {rate_limited("slow down", 7), 429, "requests", "rate_limit_exceeded", ErrorSource::client},
      {insufficient_quota("broke"), 429, "insufficient_quota", "insufficient_quota", ErrorSource::client},
      {upstream_unavailable("refused"), 502, "upstream_error", "upstream_unavailable", ErrorSource::upstream},
      {upstream_timeout("slow"), 504, "timeout", "upstream_timeout", ErrorSource::upstream},
      {unavailable("draining"), 503, "server_error", "service_unavailable", ErrorSource::internal},
      {internal_error("bug"), 500, "server_error", "internal_error", ErrorSource::internal},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.code);
    EXPECT_EQ(c.e.status, c.status);
    EXPECT_EQ(c.e.source, c.source);
    auto b = body_of(c.e);
    EXPECT_EQ(b["error"].at("type").as_string(), c.type);
    EXPECT_EQ(b["error"].at("code").as_string(), c.code);
  }
  EXPECT_EQ(rate_limited("x", 7).retry_after_s, 7u);
  EXPECT_EQ(body_of(model_not_found("m"))["error"].at("param").as_string(), "model");
  EXPECT_EQ(body_of(model_not_found("m"))["error"].at("message").as_string(),
            "The model `m` does not exist or you do not have access to it.");
}

TEST(Error, ReasonPhrases) {
  EXPECT_EQ(reason_phrase(200), "OK");
  EXPECT_EQ(reason_phrase(413), "Content Too Large");
  EXPECT_EQ(reason_phrase(504), "Gateway Timeout");
  // Passed-through statuses keep their registered phrase; an unregistered one gets none (RFC 9112 §4).
  EXPECT_EQ(reason_phrase(206), "Partial Content");
  EXPECT_EQ(reason_phrase(307), "Temporary Redirect");
  EXPECT_EQ(reason_phrase(308), "Permanent Redirect");
  EXPECT_EQ(reason_phrase(410), "Gone");
  EXPECT_EQ(reason_phrase(451), "Unavailable For Legal Reasons");
  EXPECT_EQ(reason_phrase(529), "Overloaded");
  EXPECT_EQ(reason_phrase(598), "");
}
