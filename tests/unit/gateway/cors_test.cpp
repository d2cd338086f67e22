// gateway/cors.hpp: the server's side of the Fetch standard's CORS protocol
// (server.cors): a preflight's answer fields, and the fields every answer to
// a cross-origin request carries.
#include "gateway/cors.hpp"

#include <string>

#include <gtest/gtest.h>

#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>

#include "http/flat_parser.hpp"

namespace weir::gateway {
namespace {

namespace bh = boost::beast::http;

http::RequestHead request(std::string_view text) {
  http::FlatParser<true, bh::empty_body> p;
  p.eager(false);
  boost::system::error_code ec;
  p.put(boost::asio::buffer(text.data(), text.size()), ec);
  EXPECT_FALSE(ec) << ec.message();
  return p.get().base();
}

core::CorsConfig listed() {
  core::CorsConfig c;
  c.enabled = true;
  c.origins = {"https://app.example.com", "http://localhost:3000"};
  c.headers = {"authorization", "content-type", "x-stainless-*"};
  c.expose_headers = "x-request-id, retry-after";
  return c;
}

TEST(GatewayCors, PreflightIsOptionsWithOriginAndRequestMethod) {
  EXPECT_TRUE(
      is_preflight(request("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: h\r\nOrigin: https://a\r\n"
                           "Access-Control-Request-Method: POST\r\n\r\n")));
  EXPECT_FALSE(is_preflight(request("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: h\r\nOrigin: https://a\r\n\r\n")));
  EXPECT_FALSE(is_preflight(
      request("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: h\r\nAccess-Control-Request-Method: POST\r\n\r\n")));
  EXPECT_FALSE(
      is_preflight(request("POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nOrigin: https://a\r\n"
                           "Access-Control-Request-Method: POST\r\nContent-Length: 0\r\n\r\n")));
}

TEST(GatewayCors, AnAllowedOriginIsEchoedWithVaryAndExposedFields) {
  std::string out;
  EXPECT_TRUE(append_cors_fields(out, listed(),
                                 request("POST / HTTP/1.1\r\nHost: h\r\nOrigin: http://localhost:3000\r\n"
                                         "Content-Length: 0\r\n\r\n")));
  EXPECT_EQ(out,
            "Vary: Origin\r\nAccess-Control-Allow-Origin: http://localhost:3000\r\n"
            "Access-Control-Expose-Headers: x-request-id, retry-after\r\n");
  auto creds = listed();
  creds.allow_credentials = true;
  out.clear();
  EXPECT_TRUE(
      append_cors_fields(out, creds, request("GET / HTTP/1.1\r\nHost: h\r\nOrigin: https://app.example.com\r\n\r\n")));
  EXPECT_NE(out.find("Access-Control-Allow-Credentials: true\r\n"), std::string::npos) << out;
}

TEST(GatewayCors, AnotherOriginOrNoneGetsOnlyVary) {
  for (std::string_view head :
       {"GET / HTTP/1.1\r\nHost: h\r\nOrigin: https://evil.example\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\nOrigin: https://app.example.com.evil.example\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: h\r\nOrigin: null\r\n\r\n", "GET / HTTP/1.1\r\nHost: h\r\n\r\n",
        // Two Origin lines: no browser sends them; neither is taken.
        "GET / HTTP/1.1\r\nHost: h\r\nOrigin: https://app.example.com\r\n"
        "Origin: https://app.example.com\r\n\r\n"}) {
    std::string out;
    EXPECT_FALSE(append_cors_fields(out, listed(), request(head))) << head;
    EXPECT_EQ(out, "Vary: Origin\r\n") << head;
  }
}

TEST(GatewayCors, AnyOriginIsAStarWithoutVary) {
  core::CorsConfig c;
  c.enabled = c.any_origin = true;
  std::string out;
  EXPECT_TRUE(append_cors_fields(out, c, request("GET / HTTP/1.1\r\nHost: h\r\nOrigin: https://x.example\r\n\r\n")));
  EXPECT_EQ(out, "Access-Control-Allow-Origin: *\r\n");
  out.clear();
  EXPECT_FALSE(append_cors_fields(out, c, request("GET / HTTP/1.1\r\nHost: h\r\n\r\n")));  // not cross-origin
  EXPECT_EQ(out, "");
}

TEST(GatewayCors, PreflightGrantsTheRequestedHeadersTheListAllows) {
  std::string out;
  append_preflight_fields(
      out, listed(),
      request("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: h\r\nOrigin: https://app.example.com\r\n"
              "Access-Control-Request-Method: POST\r\n"
              "Access-Control-Request-Headers: Authorization,content-type, x-stainless-os,"
              "x-secret, x-stainless-, authorization\r\n"
              "Access-Control-Request-Headers: X-Stainless-Arch\r\n\r\n"),
      "POST");
  EXPECT_EQ(out,
            "Access-Control-Allow-Origin: https://app.example.com\r\n"
            "Access-Control-Allow-Methods: POST\r\n"
            "Access-Control-Allow-Headers: authorization, content-type, x-stainless-os, x-stainless-arch\r\n"
            "Access-Control-Max-Age: 600\r\n"
            "Vary: Origin, Access-Control-Request-Headers\r\n");
  // "*" grants every requested name (the wildcard field value would not cover Authorization: Fetch §3.2.3).
  auto any = listed();
  any.any_header = true;
  any.any_origin = true;
  any.max_age_s = 0;
  out.clear();
  append_preflight_fields(
      out, any,
      request("OPTIONS /v1/models HTTP/1.1\r\nHost: h\r\nOrigin: https://b.example\r\n"
              "Access-Control-Request-Method: GET\r\nAccess-Control-Request-Headers: x-secret\r\n\r\n"),
      "GET, HEAD");
  EXPECT_EQ(out,
            "Access-Control-Allow-Origin: *\r\nAccess-Control-Allow-Methods: GET, HEAD\r\n"
            "Access-Control-Allow-Headers: x-secret\r\nAccess-Control-Max-Age: 0\r\n"
            "Vary: Access-Control-Request-Headers\r\n");
}

}  // namespace
}  // namespace weir::gateway
