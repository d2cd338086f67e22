// The one failure mapping as a table: every way a request fails → status,
// OpenAI error code, access-log source, and how it reaches the client.
#include "gateway/failure.hpp"

#include <gtest/gtest.h>

#include "gateway/endpoints.hpp"

namespace weir::gateway {
namespace {

struct Row {
  const char* what;
  core::Error e;
  int status;
  std::string_view code;  // error.code; "" = null
  core::ErrorSource source;
};

TEST(Failure, EveryKindMapsToOneStatusCodeAndSource) {
  core::ServerConfig sc;
  const UpstreamSubject who{"llama", "llama-3", "req-1"};
  using http::ReadFailure;
  using http::UpstreamFailure;
  const Row rows[] = {
      {"malformed head", read_error(ReadFailure::malformed, sc, "bad method"), 400, "", core::ErrorSource::client},
      {"head too slow", read_error(ReadFailure::head_timeout, sc, ""), 408, "request_timeout",
       core::ErrorSource::client},
      {"body too slow", read_error(ReadFailure::body_timeout, sc, ""), 408, "request_timeout",
       core::ErrorSource::client},
      {"line too long", read_error(ReadFailure::line_too_long, sc, ""), 414, "uri_too_long", core::ErrorSource::client},
      {"head too large", read_error(ReadFailure::head_too_large, sc, ""), 431, "request_header_too_large",
       core::ErrorSource::client},
      {"body too large", read_error(ReadFailure::body_too_large, sc, ""), 413, "request_too_large",
       core::ErrorSource::client},
      {"left mid-body", read_error(ReadFailure::client_closed, sc, ""), 499, "client_closed_request",
       core::ErrorSource::client},
      {"body over max_buffered", read_error(ReadFailure::over_budget, sc, ""), 503, "gateway_overloaded",
       core::ErrorSource::internal},
      {"answer over max_buffered", buffers_full(&who, 1024), 503, "gateway_overloaded", core::ErrorSource::internal},
      {"refused", upstream_error(UpstreamFailure::connect_refused, who, false), 502, "upstream_unavailable",
       core::ErrorSource::upstream},
      {"connect timeout", upstream_error(UpstreamFailure::connect_timeout, who, false), 504, "upstream_timeout",
       core::ErrorSource::upstream},
      {"first byte timeout", upstream_error(UpstreamFailure::timeout, who, false), 504, "upstream_timeout",
       core::ErrorSource::upstream},
      {"reset", upstream_error(UpstreamFailure::reset, who, false), 502, "upstream_unavailable",
       core::ErrorSource::upstream},
      {"garbage", upstream_error(UpstreamFailure::protocol, who, true), 502, "upstream_unavailable",
       core::ErrorSource::upstream},
      {"stream without [DONE]", upstream_stream_incomplete(who), 502, "upstream_unavailable",
       core::ErrorSource::upstream},
      {"too large", upstream_too_large(who, 1024), 502, "upstream_unavailable", core::ErrorSource::upstream},
      {"undecodable", upstream_undecodable(who, "br"), 502, "upstream_invalid_response", core::ErrorSource::upstream},
      {"client closed", client_gone(ClientGone::closed), 499, "client_closed_request", core::ErrorSource::client},
      {"slow client", client_gone(ClientGone::slow), 499, "slow_client", core::ErrorSource::client},
      {"write timeout", client_gone(ClientGone::write_timeout), 499, "client_write_timeout", core::ErrorSource::client},
  };
  for (const auto& r : rows) {
    EXPECT_EQ(r.e.status, r.status) << r.what;
    EXPECT_EQ(r.e.code, r.code) << r.what;
    EXPECT_EQ(r.e.source, r.source) << r.what;
    EXPECT_FALSE(r.e.message.empty()) << r.what;
  }
}

TEST(Failure, UpstreamMessagesNamePoolModelAndRequestNeverAnAddress) {
  const UpstreamSubject who{"llama", "llama-3", "0123abcd"};
  for (auto f : {http::UpstreamFailure::connect_refused, http::UpstreamFailure::connect_timeout,
                 http::UpstreamFailure::timeout, http::UpstreamFailure::reset, http::UpstreamFailure::protocol}) {
    const auto e = upstream_error(f, who, false);
    EXPECT_NE(e.message.find("pool `llama`"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("model `llama-3`"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find("0123abcd"), std::string::npos) << e.message;
    EXPECT_EQ(e.message.find("http://"), std::string::npos) << e.message;
  }
  EXPECT_NE(upstream_error(http::UpstreamFailure::reset, who, true).message.find("while streaming"), std::string::npos);
  EXPECT_EQ(upstream_stream_incomplete(who).message,
            "Upstream pool `llama` (model `llama-3`) ended the stream before it was complete (request 0123abcd).");
}

TEST(Failure, DeliveryDependsOnlyOnTheCommitPoint) {
  const auto upstream = upstream_error(http::UpstreamFailure::reset, {"p", "", "r"}, false);
  const auto gone = client_gone(ClientGone::closed);
  EXPECT_EQ(delivery_of(upstream, false, false), Delivery::response);
  EXPECT_EQ(delivery_of(upstream, false, true), Delivery::response) << "a stream that failed before its head";
  EXPECT_EQ(delivery_of(upstream, true, true), Delivery::in_band);
  EXPECT_EQ(delivery_of(upstream, true, false), Delivery::none);
  for (bool committed : {false, true})
    for (bool streaming : {false, true}) EXPECT_EQ(delivery_of(gone, committed, streaming), Delivery::none);
}

TEST(Failure, ErrorDialects) {
  const auto e = core::unauthorized("Incorrect API key provided.");
  std::string openai;
  append_error_body(openai, e, ErrorDialect::openai);
  EXPECT_EQ(openai, core::error_json(e));
  std::string anthropic;
  append_error_body(anthropic, e, ErrorDialect::anthropic);
  EXPECT_EQ(anthropic,
            R"({"type":"error","error":{"type":"authentication_error","message":"Incorrect API key provided."}})");
  EXPECT_TRUE(is_anthropic(RouteKind::messages));
  EXPECT_TRUE(is_anthropic(RouteKind::messages_count_tokens));
  EXPECT_FALSE(is_anthropic(RouteKind::chat_completions));
  EXPECT_EQ(classify_path("/v1/messages"), RouteKind::messages);
  EXPECT_EQ(classify_path("/v1/messages/count_tokens"), RouteKind::messages_count_tokens);
  EXPECT_EQ(classify_path("/v1/messages/other"), RouteKind::other);
  EXPECT_EQ(api_of(RouteKind::messages), api::ApiKind::chat_completions);
  EXPECT_EQ(allowed_methods(RouteKind::messages_count_tokens), "POST");
}

TEST(Endpoints, AModelPathThatANormalizingServerWouldReadAsAnotherRouteIsNone) {
  EXPECT_EQ(classify_path("/v1/models/meta-llama/Llama-3-8B"), RouteKind::models);  // ids hold '/'
  EXPECT_EQ(classify_path("/v1/models/m.v2..x"), RouteKind::models);                // dots inside a segment
  EXPECT_EQ(classify_path("/v1/models/%41"), RouteKind::models);
  EXPECT_EQ(classify_path("/v1/models/meta-llama%2FLlama-3"), RouteKind::models);  // the openai SDK's encoding
  EXPECT_EQ(classify_path("/v1/models/..."), RouteKind::models);
  for (const char* p : {"/v1/models/../../metrics", "/v1/models/..", "/v1/models/./m", "/v1/models/a/../b",
                        "/v1/models/%2e%2e%2f%2e%2e%2fis_sleeping", "/v1/models/%2E%2E", "/v1/models/a%2F..%2Fmetrics",
                        "/v1/models/.%2e/x", "/v1/models/a%5cb", "/v1/models/a\\..\\b"})
    EXPECT_EQ(classify_path(p), RouteKind::other) << p;
}

// A trailing slash is another path (vLLM's routes): a 404 for the path, never a lookup of model "m/".
TEST(Endpoints, AModelPathWithATrailingSlashIsNone) {
  for (const char* p : {"/v1/models/", "/v1/models/m/", "/v1/models/org/m/", "/v1/models//"})
    EXPECT_EQ(classify_path(p), RouteKind::other) << p;
  EXPECT_EQ(classify_path("/v1/models/m%2F"), RouteKind::models);  // an id that ends in '/', encoded
}

TEST(Endpoints, ResponsesRoute) {
  EXPECT_EQ(classify_path("/v1/responses"), RouteKind::responses);
  EXPECT_EQ(classify_path("/v1/responses/resp_1"), RouteKind::other);  // no store: no GET/DELETE by id
  EXPECT_EQ(route_label(RouteKind::responses), "/v1/responses");
  EXPECT_EQ(api_of(RouteKind::responses), api::ApiKind::chat_completions);
  EXPECT_EQ(allowed_methods(RouteKind::responses), "POST");
  EXPECT_TRUE(is_responses(RouteKind::responses));
  EXPECT_TRUE(is_translated(RouteKind::responses));
  EXPECT_TRUE(is_translated(RouteKind::messages));
  EXPECT_FALSE(is_anthropic(RouteKind::responses));
  EXPECT_FALSE(is_translated(RouteKind::chat_completions));
  EXPECT_FALSE(is_responses(RouteKind::chat_completions));
}

TEST(Endpoints, VllmRoutes) {
  for (const char* p : {"/tokenize", "/detokenize", "/rerank", "/v1/rerank", "/v2/rerank", "/score", "/v1/score",
                        "/pooling", "/classify"}) {
    SCOPED_TRACE(p);
    const auto r = classify_path(p);
    EXPECT_TRUE(is_vllm_extra(r));
    EXPECT_EQ(api_of(r), api::ApiKind::vllm_extra);
    EXPECT_EQ(allowed_methods(r), "POST");
    EXPECT_FALSE(is_anthropic(r));
  }
  EXPECT_EQ(classify_path("/version"), RouteKind::version);
  EXPECT_FALSE(api_of(RouteKind::version));
  EXPECT_EQ(allowed_methods(RouteKind::version), "GET, HEAD");
  EXPECT_EQ(classify_path("/v3/rerank"), RouteKind::other);
  EXPECT_EQ(classify_path("/tokenize/x"), RouteKind::other);
  EXPECT_FALSE(is_vllm_extra(RouteKind::embeddings));
  EXPECT_FALSE(is_vllm_extra(RouteKind::version));
  EXPECT_EQ(route_label(classify_path("/rerank")), "/v1/rerank");  // one label per route, not per alias
}

}  // namespace
}  // namespace weir::gateway
