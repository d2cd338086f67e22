// The forwarding proxy's header filters (RFC 9110 §7.6.1): what of the
// client's request head goes upstream (append_upstream_request_head) and
// what of the upstream's response head goes back (append_response_fields).
#include "http/forward.hpp"
#include "http/flat_parser.hpp"
#include "http/headers.hpp"

#include <cctype>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>

namespace weir::http {
namespace {

namespace bh = boost::beast::http;

// Parses a request or response head the way the gateway receives one.
RequestHead request(std::string_view text) {
  FlatParser<true, bh::empty_body> p;
  p.eager(false);
  boost::system::error_code ec;
  p.put(boost::asio::buffer(text.data(), text.size()), ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_TRUE(p.is_header_done());
  return p.get().base();
}
ResponseHead response(std::string_view text) {
  FlatParser<false, bh::empty_body> p;
  p.eager(false);
  boost::system::error_code ec;
  p.put(boost::asio::buffer(text.data(), text.size()), ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_TRUE(p.is_header_done());
  return p.get().base();
}

// The head's field lines after the request/status line, without the blank line.
std::vector<std::string> lines(std::string_view head) {
  std::vector<std::string> out;
  while (!head.empty()) {
    const auto eol = head.find("\r\n");
    if (eol == std::string_view::npos) {
      out.emplace_back(head);
      break;
    }
    out.emplace_back(head.substr(0, eol));
    head.remove_prefix(eol + 2);
  }
  return out;
}

// Values of field `name` (case-insensitive) in `head`'s field lines.
std::vector<std::string> values(std::string_view head, std::string_view name) {
  std::vector<std::string> out;
  for (const auto& l : lines(head)) {
    const auto colon = l.find(':');
    if (colon == std::string::npos || colon != name.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < name.size(); ++i)
      same =
          same && std::tolower(static_cast<unsigned char>(l[i])) == std::tolower(static_cast<unsigned char>(name[i]));
    if (same) out.push_back(l.substr(colon + 2));
  }
  return out;
}

using Values = std::vector<std::string>;

UpstreamHeadOptions options() {
  return UpstreamHeadOptions{.target = "/v1/chat/completions",
                             .host_header = "10.0.0.7:8000",
                             .body_bytes = 42,
                             .request_id = "req-weir",
                             .upstream_lines = {},
                             .identity = false,
                             .strip_credentials = false};
}

constexpr std::string_view kClientHead =
    "POST /v1/chat/completions?x=1 HTTP/1.1\r\n"
    "Host: gateway.example\r\n"
    "Content-Type: application/json\r\n"
    "Content-Length: 999\r\n"
    "Connection: keep-alive, X-Hop-Listed\r\n"
    "Keep-Alive: timeout=5\r\n"
    "Proxy-Connection: keep-alive\r\n"
    "TE: trailers\r\n"
    "Trailer: X-Checksum\r\n"
    "Upgrade: h2c\r\n"
    "Proxy-Authorization: Basic Zm9vOmJhcg==\r\n"
    "X-Hop-Listed: secret\r\n"
    "Expect: 100-continue\r\n"
    "X-Request-Id: client-chosen\r\n"
    "Authorization: Bearer client-key\r\n"
    "X-Api-Key: client-key-2\r\n"
    "Accept-Encoding: gzip, br\r\n"
    "User-Agent: openai-python/1.50\r\n"
    "OpenAI-Organization: org-1\r\n"
    "\r\n";

TEST(HttpForward, RequestLineHostLengthAndRequestIdComeFirst) {
  std::string out;
  append_upstream_request_head(out, request(kClientHead), options());
  const auto l = lines(out);
  ASSERT_GE(l.size(), 4u);
  EXPECT_EQ(l[0], "POST /v1/chat/completions HTTP/1.1");  // the target Weir sends, not the client's
  EXPECT_EQ(l[1], "Host: 10.0.0.7:8000");
  EXPECT_EQ(l[2], "Content-Length: 42");
  EXPECT_EQ(l[3], "x-request-id: req-weir");
  EXPECT_TRUE(out.ends_with("\r\n\r\n"));
  EXPECT_EQ(out.find("\r\n\r\n"), out.size() - 4);  // one blank line, at the end
}

TEST(HttpForward, HopByHopAndConnectionListedFieldsAreRemoved) {
  std::string out;
  append_upstream_request_head(out, request(kClientHead), options());
  for (std::string_view f : {"Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Upgrade",
                             "Proxy-Authorization", "X-Hop-Listed", "Transfer-Encoding", "Expect"})
    EXPECT_EQ(values(out, f), Values{}) << f;
  // End-to-end fields pass, as the client wrote them.
  EXPECT_EQ(values(out, "Content-Type"), Values{"application/json"});
  EXPECT_EQ(values(out, "User-Agent"), Values{"openai-python/1.50"});
  EXPECT_EQ(values(out, "OpenAI-Organization"), Values{"org-1"});
}

TEST(HttpForward, FixedHopByHopFieldsGoInAnyCaseWithoutAConnectionLine) {
  // No Connection line: only the fixed list decides, by Beast's field code,
  // so the name's case does not matter (http::is_fixed_hop_by_hop, the one list).
  constexpr std::string_view head =
      "POST /v1/chat/completions HTTP/1.1\r\n"
      "Host: gateway.example\r\n"
      "kEEp-aLIVE: timeout=5\r\n"
      "PROXY-CONNECTION: keep-alive\r\n"
      "te: trailers\r\n"
      "tRAILER: X-Checksum\r\n"
      "UPGRADE: h2c\r\n"
      "proxy-authorization: Basic Zm9vOmJhcg==\r\n"
      "Proxy-Authenticate: Basic\r\n"
      "X-Keep-Alive-Ish: kept\r\n"
      "Content-Length: 0\r\n"
      "\r\n";
  std::string out;
  append_upstream_request_head(out, request(head), options());
  for (std::string_view f :
       {"Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Upgrade", "Proxy-Authorization", "Proxy-Authenticate"}) {
    EXPECT_EQ(values(out, f), Values{}) << f;
    EXPECT_TRUE(is_hop_by_hop(f, "")) << f;
  }
  EXPECT_EQ(values(out, "X-Keep-Alive-Ish"), Values{"kept"});
}

TEST(HttpForward, HostContentLengthAndRequestIdAreReplacedNotDuplicated) {
  std::string out;
  append_upstream_request_head(out, request(kClientHead), options());
  EXPECT_EQ(values(out, "Host"), Values{"10.0.0.7:8000"});
  EXPECT_EQ(values(out, "Content-Length"), Values{"42"});
  EXPECT_EQ(values(out, "x-request-id"), Values{"req-weir"});
}

TEST(HttpForward, TraceContextIsTheClientsUnlessWeirSendsItsOwn) {
  constexpr std::string_view head =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n"
      "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n"
      "TraceState: congo=1\r\ntracestate: rojo=2\r\nbaggage: k=v\r\n\r\n";
  std::string out;
  append_upstream_request_head(out, request(head), options());  // tracing off: passed through
  EXPECT_EQ(values(out, "traceparent"), Values{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"});
  EXPECT_EQ(values(out, "tracestate"), (Values{"congo=1", "rojo=2"}));
  auto o = options();
  o.traceparent = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";
  o.tracestate = "congo=1,rojo=2";
  out.clear();
  append_upstream_request_head(out, request(head), o);  // tracing on: Weir's, once
  EXPECT_EQ(values(out, "traceparent"), Values{"00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"});
  EXPECT_EQ(values(out, "tracestate"), Values{"congo=1,rojo=2"});
  EXPECT_EQ(values(out, "baggage"), Values{"k=v"});  // not Weir's to change
  o.tracestate = {};
  out.clear();
  append_upstream_request_head(out, request(head), o);
  EXPECT_EQ(values(out, "tracestate"), Values{});
}

// nginx's $proxy_add_x_forwarded_for and Envoy's append: the client's list
// (its lines joined in order) and then the address Weir saw, or that alone.
TEST(HttpForward, XForwardedForEndsWithTheClientAddress) {
  auto o = options();
  o.client_address = "127.0.0.1";
  std::string out;
  append_upstream_request_head(out, request("POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n\r\n"), o);
  EXPECT_EQ(values(out, "x-forwarded-for"), Values{"127.0.0.1"});
  out.clear();
  append_upstream_request_head(
      out,
      request("POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nX-Forwarded-For: 6.6.6.6\r\nAccept: */*\r\n"
              "x-forwarded-for: 10.1.1.1, 10.2.2.2\r\nX-Forwarded-For:\r\n\r\n"),
      o);
  EXPECT_EQ(values(out, "x-forwarded-for"), Values{"6.6.6.6, 10.1.1.1, 10.2.2.2, 127.0.0.1"});
  EXPECT_EQ(values(out, "accept"), Values{"*/*"});
  o.client_address = "2001:db8::1";
  out.clear();
  append_upstream_request_head(
      out, request("POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n"), o);
  EXPECT_EQ(values(out, "x-forwarded-for"), Values{"6.6.6.6, 2001:db8::1"});
  // No address (none could be read): the client's lines pass as they came.
  o.client_address = {};
  out.clear();
  append_upstream_request_head(
      out, request("POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n"), o);
  EXPECT_EQ(values(out, "x-forwarded-for"), Values{"6.6.6.6"});
}

// RFC 7239 §4: a front proxy's Forwarded goes up with Weir's own element appended (the peer it saw); a
// client's (any peer not in server.trusted_proxies) is dropped, Weir's element alone. X-Real-IP has no list
// to append to: the client's never goes up, from any peer; Weir sends the client it resolved (real_ip), as
// nginx's `proxy_set_header X-Real-IP $remote_addr` with realip does.
TEST(HttpForward, ForwardedGetsWeirsElementAndXRealIpIsWeirsOwn) {
  auto o = options();
  o.client_address = "127.0.0.1";
  o.real_ip = "127.0.0.1";
  std::string out;
  constexpr std::string_view forged =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nForwarded: for=6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\n"
      "forwarded: for=7.7.7.7;proto=https\r\nAccept: */*\r\nx-real-ip: 8.8.8.8\r\n\r\n";
  append_upstream_request_head(out, request(forged), o);
  EXPECT_EQ(values(out, "forwarded"), Values{"for=127.0.0.1"});
  EXPECT_EQ(values(out, "x-real-ip"), Values{"127.0.0.1"});
  EXPECT_EQ(values(out, "accept"), Values{"*/*"});
  o.trusted_peer = true;
  out.clear();
  append_upstream_request_head(out, request(forged), o);
  EXPECT_EQ(values(out, "forwarded"), Values{"for=6.6.6.6, for=7.7.7.7;proto=https, for=127.0.0.1"});
  // An IPv6 node is quoted and bracketed (§6).
  o.client_address = "2001:db8::1";
  out.clear();
  append_upstream_request_head(out, request(forged), o);
  EXPECT_EQ(values(out, "forwarded"), Values{"for=6.6.6.6, for=7.7.7.7;proto=https, for=\"[2001:db8::1]\""});
  o.trusted_peer = false;
  // From a trusted proxy (server.trusted_proxies) that neither set nor stripped it (Caddy): still Weir's
  // own, the client the proxy's X-Forwarded-For named.
  o.trusted_peer = true;
  o.real_ip = "203.0.113.7";
  out.clear();
  append_upstream_request_head(out, request(forged), o);
  EXPECT_EQ(values(out, "x-real-ip"), Values{"203.0.113.7"});
  // No real_ip (a micro-batch of several tenants): none at all.
  o.real_ip = {};
  out.clear();
  append_upstream_request_head(out, request(forged), o);
  EXPECT_EQ(values(out, "x-real-ip"), Values{});
  // No Forwarded from the client: none is added (X-Forwarded-For carries the address).
  out.clear();
  append_upstream_request_head(out, request("POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n\r\n"), o);
  EXPECT_EQ(values(out, "forwarded"), Values{});
  EXPECT_EQ(values(out, "x-forwarded-for"), Values{"2001:db8::1"});
}

// A client's Forwarded (host=, proto=, by=: what a front proxy saw, as X-Forwarded-Host and -Proto say) goes
// up only from a trusted peer, and only when every line parses as RFC 7239 §4 has it: else Weir's element
// goes alone, a separate well-formed element that no unclosed quote of the client's can swallow. A line
// named in Connection (or empty) is no Forwarded sent: none added.
TEST(HttpForward, ForwardedNeedsATrustedPeerAndAWellFormedValue) {
  auto o = options();
  o.client_address = "10.9.9.9";
  const auto forwarded = [&](std::string_view lines, bool trusted) {
    o.trusted_peer = trusted;
    std::string out;
    append_upstream_request_head(
        out, request("POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\n" + std::string(lines) + "\r\n"), o);
    return values(out, "forwarded");
  };
  const std::string host = "Forwarded: host=evil.example;proto=https;by=10.0.0.1\r\n";
  EXPECT_EQ(forwarded(host, false), Values{"for=10.9.9.9"});
  EXPECT_EQ(forwarded(host, true), Values{"host=evil.example;proto=https;by=10.0.0.1, for=10.9.9.9"});
  for (const bool trusted : {false, true}) {
    SCOPED_TRACE(trusted);
    for (const char* bad : {"for=\"6.6.6.6", "for=6.6.6.6;host=\"x", "for=6.6.6.6;x=\"\\", "for", "for=a b",
                            "for=6.6.6.6 x", "for=\"a\"b", "=x", "for=", ",", "for=a,,\"b"})
      EXPECT_EQ(forwarded(std::string("Forwarded: ") + bad + "\r\n", trusted), Values{"for=10.9.9.9"}) << bad;
    // One bad line of two: only the good one goes (each line judged on its own: a client's malformed line
    // before a front proxy's own does not take the front's away), and only from a trusted peer.
    EXPECT_EQ(forwarded("Forwarded: for=6.6.6.6\r\nForwarded: for=\"7.7.7.7\r\n", trusted),
              trusted ? Values{"for=6.6.6.6, for=10.9.9.9"} : Values{"for=10.9.9.9"});
    EXPECT_EQ(forwarded("Forwarded: for=\"7.7.7.7\r\nForwarded: for=6.6.6.6;proto=https\r\n", trusted),
              trusted ? Values{"for=6.6.6.6;proto=https, for=10.9.9.9"} : Values{"for=10.9.9.9"});
    // Named in Connection, or empty: no Forwarded sent, none added (README).
    EXPECT_EQ(forwarded("Connection: forwarded\r\nForwarded: for=6.6.6.6\r\n", trusted), Values{});
    EXPECT_EQ(forwarded("Forwarded: \r\n", trusted), Values{});
  }
  // Well-formed (§4, RFC 9110 §5.6): empty list elements and pairs, quoted strings with escapes, OWS
  // around ',' and ';'.
  for (const char* good : {"for=192.0.2.43, for=198.51.100.17;by=203.0.113.60;proto=http;host=example.com",
                           "for=\"[2001:db8:cafe::17]:4711\"", "for=a,", ";", "for=a; proto=https",
                           "for=\"_hidden\", for=\"a\\\"b\"", "for=unknown;;by=x"}) {
    EXPECT_TRUE(forwarded_well_formed(good)) << good;
    EXPECT_EQ(forwarded(std::string("Forwarded: ") + good + "\r\n", true), Values{std::string(good) + ", for=10.9.9.9"})
        << good;
  }
  EXPECT_FALSE(forwarded_well_formed(""));
  EXPECT_FALSE(forwarded_well_formed("for=\"x\x7f\""));
  EXPECT_FALSE(forwarded_well_formed("for=\"\x01\""));
}

// What a front proxy saw (X-Forwarded-Proto/Host/Port/Prefix, a CDN's client field) goes up only from a
// peer in server.trusted_proxies: from anyone else it is the client's claim, dropped. X-Forwarded-For
// (appended) and X-Forwarded-Authorization (a credential) keep their own rules.
TEST(HttpForward, FrontViewFieldsNeedATrustedPeer) {
  constexpr std::string_view head =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nX-Forwarded-Proto: https\r\n"
      "X-Forwarded-Host: evil.example\r\nx-forwarded-port: 443\r\nX-Forwarded-Prefix: /admin\r\n"
      "True-Client-IP: 6.6.6.6\r\nCF-Connecting-IP: 6.6.6.6\r\nX-Client-IP: 6.6.6.6\r\n"
      "Fastly-Client-IP: 6.6.6.6\r\nX-Forwarded-Authorization: Bearer x\r\nX-Forwarded-Fortune: 1\r\n"
      "Accept: */*\r\n\r\n";
  constexpr std::string_view fields[] = {"x-forwarded-proto",  "x-forwarded-host", "x-forwarded-port",
                                         "x-forwarded-prefix", "true-client-ip",   "cf-connecting-ip",
                                         "x-client-ip",        "fastly-client-ip", "x-forwarded-fortune"};
  auto o = options();
  o.client_address = "127.0.0.1";
  std::string out;
  append_upstream_request_head(out, request(head), o);
  for (std::string_view f : fields) EXPECT_EQ(values(out, f).size(), 0u) << f;
  EXPECT_EQ(values(out, "x-forwarded-authorization"), Values{"Bearer x"});  // (not stripped: no credential set)
  EXPECT_EQ(values(out, "accept"), Values{"*/*"});
  o.trusted_peer = true;
  out.clear();
  append_upstream_request_head(out, request(head), o);
  for (std::string_view f : fields) EXPECT_EQ(values(out, f).size(), 1u) << f;
  EXPECT_EQ(values(out, "x-forwarded-proto"), Values{"https"});
  EXPECT_TRUE(is_front_view_field("X-FORWARDED-PROTO"));
  EXPECT_FALSE(is_front_view_field("X-Forwarded-For"));
  EXPECT_FALSE(is_front_view_field("x-forwarded-"));
  EXPECT_FALSE(is_front_view_field("X-Real-IP"));
}

// The batching key holds what goes upstream as the client sent it: a client's X-Real-IP never does (Weir
// sends its own), so it keeps no two requests apart.
TEST(HttpForward, FieldsKeyLeavesOutTheClientsXRealIp) {
  std::string with;
  std::string without;
  append_forwarded_fields_key(
      with, request("POST /v1/completions HTTP/1.1\r\nHost: g\r\nX-Real-IP: 6.6.6.6\r\nx-model-flag: 1\r\n\r\n"),
      false);
  append_forwarded_fields_key(without, request("POST /v1/completions HTTP/1.1\r\nHost: g\r\nx-model-flag: 1\r\n\r\n"),
                              false);
  EXPECT_EQ(with, without);
  EXPECT_EQ(with, "x-model-flag: 1\n");
}

// A micro-batch of several tenants' prompts (shared): no member's trace context, baggage or address goes
// up with the others' prompts; Weir's own traceparent still does, and the request's other fields.
TEST(HttpForward, ASharedHeadCarriesNoClientsContext) {
  constexpr std::string_view head =
      "POST /v1/completions HTTP/1.1\r\nHost: g\r\n"
      "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n"
      "tracestate: congo=1\r\nBaggage: user.email=alice@acme.example\r\nX-Forwarded-For: 6.6.6.6\r\n"
      "b3: 80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1\r\nX-B3-TraceId: 80f198ee56343ba8\r\n"
      "sentry-trace: 771a43a4192642f0b136d5159a501700-b7ad6b7169203331\r\nForwarded: for=10.1.1.1\r\n"
      "X-Real-IP: 10.1.1.1\r\nVia: 1.1 acme-proxy\r\nUser-Agent: AliceApp/1.0\r\nx-user-email: a@acme\r\n"
      "x-stainless-os: Linux\r\nX-Datadog-Trace-Id: 123\r\nContent-Type: application/json\r\n"
      "Accept: */*\r\n\r\n";
  auto o = options();
  o.shared = true;
  std::string out;
  append_upstream_request_head(out, request(head), o);
  for (std::string_view f :
       {"traceparent", "tracestate", "baggage", "x-forwarded-for", "b3", "x-b3-traceid", "sentry-trace", "forwarded",
        "x-real-ip", "via", "user-agent", "x-user-email", "x-stainless-os", "x-datadog-trace-id"})
    EXPECT_EQ(values(out, f), Values{}) << f;
  EXPECT_EQ(values(out, "accept"), Values{"*/*"});
  EXPECT_EQ(values(out, "content-type"), Values{"application/json"});
  EXPECT_EQ(values(out, "x-request-id").size(), 1u);  // Weir's own fields still go
  EXPECT_EQ(values(out, "host").size(), 1u);
  o.traceparent = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";
  out.clear();
  append_upstream_request_head(out, request(head), o);
  EXPECT_EQ(values(out, "traceparent"), Values{"00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"});
  EXPECT_EQ(values(out, "tracestate"), Values{});
  EXPECT_EQ(values(out, "baggage"), Values{});
}

TEST(HttpForward, ChunkedClientBodyGoesUpstreamWithALength) {
  std::string out;
  append_upstream_request_head(
      out, request("POST /v1/completions HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\n"), options());
  EXPECT_EQ(values(out, "Transfer-Encoding"), Values{});
  EXPECT_EQ(values(out, "Content-Length"), Values{"42"});
}

TEST(HttpForward, PostAlwaysHasAContentLengthGetOnlyWithABody) {
  auto o = options();
  o.body_bytes = 0;
  std::string out;
  append_upstream_request_head(out, request("POST /v1/embeddings HTTP/1.1\r\nHost: g\r\n\r\n"), o);
  EXPECT_EQ(values(out, "Content-Length"), Values{"0"});  // else the pooled connection would misframe

  out.clear();
  append_upstream_request_head(out, request("GET /v1/models HTTP/1.1\r\nHost: g\r\n\r\n"), o);
  EXPECT_EQ(values(out, "Content-Length"), Values{});
  EXPECT_TRUE(out.starts_with("GET /v1/chat/completions HTTP/1.1\r\n"));

  out.clear();
  append_upstream_request_head(out, request("HEAD /health HTTP/1.1\r\nHost: g\r\n\r\n"), o);
  EXPECT_EQ(values(out, "Content-Length"), Values{});

  out.clear();
  o.body_bytes = 7;
  append_upstream_request_head(out, request("GET /v1/models HTTP/1.1\r\nHost: g\r\n\r\n"), o);
  EXPECT_EQ(values(out, "Content-Length"), Values{"7"});
}

TEST(HttpForward, Http10ClientGoesUpstreamAsHttp11) {
  std::string out;
  append_upstream_request_head(out, request("POST /v1/completions HTTP/1.0\r\nContent-Length: 3\r\n\r\n"), options());
  EXPECT_TRUE(out.starts_with("POST /v1/chat/completions HTTP/1.1\r\nHost: 10.0.0.7:8000\r\n"));
}

TEST(HttpForward, ClientCredentialsPassUnlessStripped) {
  std::string out;
  append_upstream_request_head(out, request(kClientHead), options());
  EXPECT_EQ(values(out, "Authorization"), Values{"Bearer client-key"});
  EXPECT_EQ(values(out, "X-Api-Key"), Values{"client-key-2"});

  auto o = options();
  o.strip_credentials = true;
  out.clear();
  append_upstream_request_head(out, request(kClientHead), o);
  EXPECT_EQ(values(out, "Authorization"), Values{});
  EXPECT_EQ(values(out, "X-Api-Key"), Values{});
  EXPECT_EQ(values(out, "User-Agent"), Values{"openai-python/1.50"});  // only the credentials go
}

TEST(HttpForward, PoolKeyReplacesTheClientCredential) {
  auto o = options();
  o.upstream_lines = "Authorization: Bearer pool-secret\r\n";
  o.strip_credentials = true;  // as the proxy phase sets it whenever a pool has a key
  std::string out;
  append_upstream_request_head(out, request(kClientHead), o);
  EXPECT_EQ(values(out, "Authorization"), Values{"Bearer pool-secret"});
  EXPECT_EQ(values(out, "X-Api-Key"), Values{});
}

TEST(HttpForward, AnthropicPoolSendsItsKeyAndVersionInsteadOfTheClients) {
  auto o = options();
  o.upstream_lines = "x-api-key: sk-ant-pool\r\nanthropic-version: 2023-06-01\r\n";
  o.strip_credentials = true;
  o.anthropic = true;
  std::string out;
  append_upstream_request_head(out,
                               request("POST /v1/messages HTTP/1.1\r\nHost: weir\r\nx-api-key: client-key\r\n"
                                       "Authorization: Bearer client\r\nAnthropic-Version: 2023-01-01\r\n"
                                       "anthropic-beta: tools-2024\r\nContent-Length: 2\r\n\r\n"),
                               o);
  EXPECT_EQ(values(out, "x-api-key"), Values{"sk-ant-pool"});
  EXPECT_EQ(values(out, "Authorization"), Values{});
  EXPECT_EQ(values(out, "anthropic-version"), Values{"2023-06-01"});
  EXPECT_EQ(values(out, "anthropic-beta"), Values{"tools-2024"});  // the client's features pass
}

TEST(HttpForward, DecodedBodyLosesItsContentEncoding) {
  auto o = options();
  o.body_decoded = true;
  std::string out;
  append_upstream_request_head(
      out, request("POST /v1/chat/completions HTTP/1.1\r\nHost: weir\r\nContent-Encoding: gzip\r\n\r\n"), o);
  EXPECT_EQ(values(out, "Content-Encoding"), Values{});
  o.body_decoded = false;
  out.clear();
  append_upstream_request_head(
      out, request("POST /v1/chat/completions HTTP/1.1\r\nHost: weir\r\nContent-Encoding: gzip\r\n\r\n"), o);
  EXPECT_EQ(values(out, "Content-Encoding"), Values{"gzip"});
}

TEST(HttpForward, StripCredentialsMatchesFieldNamesCaseInsensitively) {
  auto o = options();
  o.strip_credentials = true;
  std::string out;
  append_upstream_request_head(
      out, request("POST / HTTP/1.1\r\nauthorization: Bearer a\r\nx-API-key: b\r\nX-Api-Keys: kept\r\n\r\n"), o);
  EXPECT_EQ(values(out, "Authorization"), Values{});
  EXPECT_EQ(values(out, "X-Api-Key"), Values{});
  EXPECT_EQ(values(out, "X-Api-Keys"), Values{"kept"});
}

// Every provider's key header is a credential: Azure OpenAI reads api-key, Gemini x-goog-api-key.
TEST(HttpForward, StripCredentialsRemovesEveryProvidersKeyHeader) {
  auto o = options();
  o.strip_credentials = true;
  std::string out;
  append_upstream_request_head(out,
                               request("POST / HTTP/1.1\r\nApi-Key: a\r\nx-goog-api-key: b\r\n"
                                       "X-Forwarded-Authorization: Bearer c\r\nX-Trace: kept\r\n\r\n"),
                               o);
  EXPECT_EQ(values(out, "api-key"), Values{});
  EXPECT_EQ(values(out, "x-goog-api-key"), Values{});
  EXPECT_EQ(values(out, "x-forwarded-authorization"), Values{});
  EXPECT_EQ(values(out, "X-Trace"), Values{"kept"});
  o.strip_credentials = false;  // no auth and no pool key: a private server checks them itself
  out.clear();
  append_upstream_request_head(out, request("POST / HTTP/1.1\r\nApi-Key: a\r\n\r\n"), o);
  EXPECT_EQ(values(out, "api-key"), Values{"a"});
}

TEST(HttpForward, IdentityDropsAcceptEncodingAndAsksForIdentity) {
  std::string out;
  append_upstream_request_head(out, request(kClientHead), options());
  EXPECT_EQ(values(out, "Accept-Encoding"), Values{"gzip"});  // cut to the codings Weir decodes

  auto o = options();
  o.identity = true;
  out.clear();
  append_upstream_request_head(out, request(kClientHead), o);
  EXPECT_EQ(values(out, "Accept-Encoding"), Values{"identity"});

  out.clear();
  append_upstream_request_head(out, request("POST / HTTP/1.1\r\nHost: g\r\n\r\n"), o);
  EXPECT_EQ(values(out, "Accept-Encoding"), Values{"identity"});  // asked even when the client said nothing
}

TEST(HttpForward, RepeatedEndToEndFieldsAllPass) {
  std::string out;
  append_upstream_request_head(out, request("POST / HTTP/1.1\r\nX-Tag: a\r\nX-Tag: b\r\n\r\n"), options());
  EXPECT_EQ(values(out, "X-Tag"), (Values{"a", "b"}));
}

// RFC 9110 §5.3: field lines with the same name make one comma-separated
// list, so a client may spread Connection over several lines, and every
// field any of them names is hop-by-hop. (Regression: only the first
// Connection line was read, so a field named on a later one went upstream.)
TEST(HttpForward, FieldsNamedInAnyConnectionLineAreRemoved) {
  std::string out;
  append_upstream_request_head(
      out, request("POST / HTTP/1.1\r\nConnection: keep-alive\r\nConnection: X-Secret\r\nX-Secret: s\r\n\r\n"),
      options());
  EXPECT_EQ(values(out, "X-Secret"), Values{});
  EXPECT_EQ(values(out, "Connection"), Values{});
}

TEST(HttpForward, ManyConnectionListedNamesAndFieldsAreReadOnce) {
  // 40 names over three Connection lines, in mixed case, among 500 fields: each listed field goes, every
  // other one passes (the sorted lookup past 8 names; a scan of every Connection line per field was O(n²)).
  std::string head = "POST / HTTP/1.1\r\nHost: g\r\nConnection: keep-alive";
  for (int i = 0; i < 40; ++i) head += (i % 15 == 14 ? "\r\nConnection: " : ", ") + fmt::format("X-Hop-{}", i);
  head += "\r\n";
  for (int i = 0; i < 500; ++i) head += fmt::format("{}-{}: v\r\n", i % 2 ? "x-hop" : "X-End", i / 2 % 50);
  head += "\r\n";
  std::string out;
  append_upstream_request_head(out, request(head), options());
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(values(out, fmt::format("X-Hop-{}", i)).size(), i < 40 ? 0u : 5u) << i;
    EXPECT_EQ(values(out, fmt::format("X-End-{}", i)).size(), 5u) << i;
  }
  std::string res = "HTTP/1.1 200 OK\r\nConnection: X-B, x-a\r\nX-A: 1\r\nX-B: 2\r\nX-C: 3\r\n\r\n";
  out.clear();
  append_response_fields(out, response(res), false);
  EXPECT_EQ(values(out, "X-A"), Values{});
  EXPECT_EQ(values(out, "X-B"), Values{});
  EXPECT_EQ(values(out, "X-C"), Values{"3"});
}

// --- response fields ---

constexpr std::string_view kUpstreamHead =
    "HTTP/1.1 200 OK\r\n"
    "Content-Type: text/event-stream\r\n"
    "Content-Length: 120\r\n"
    "Content-Encoding: gzip\r\n"
    "Connection: keep-alive, X-Upstream-Hop\r\n"
    "Keep-Alive: timeout=5\r\n"
    "X-Upstream-Hop: 1\r\n"
    "x-request-id: upstream-id\r\n"
    "Upgrade: h2c\r\n"
    "Proxy-Authenticate: Basic\r\n"
    "Trailer: X-Sum\r\n"
    "Server: uvicorn\r\n"
    "Date: Tue, 01 Oct 2024 00:00:00 GMT\r\n"
    "\r\n";

TEST(HttpForward, ResponseFieldsDropTheUpstreamsCorsFieldsWhenWeirAnswersCors) {
  const std::string head =
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\naccess-control-allow-origin: *\r\n"
      "Access-Control-Allow-Credentials: true\r\nAccess-Control-Expose-Headers: x-a\r\n"
      "Access-Control-Allow-Methods: *\r\nAccess-Control-Allow-Headers: *\r\nAccess-Control-Max-Age: 600\r\n"
      "Vary: Origin\r\n\r\n";
  std::string out;
  append_response_fields(out, response(head), false);
  EXPECT_EQ(values(out, "Access-Control-Allow-Origin"), Values{"*"});  // server.cors off: passed as sent
  out.clear();
  append_response_fields(out, response(head), false, {}, false, {}, /*own_cors=*/true);
  for (std::string_view f :
       {"Access-Control-Allow-Origin", "Access-Control-Allow-Credentials", "Access-Control-Expose-Headers",
        "Access-Control-Allow-Methods", "Access-Control-Allow-Headers", "Access-Control-Max-Age"})
    EXPECT_EQ(values(out, f), Values{}) << f;
  EXPECT_EQ(values(out, "Content-Type"), Values{"application/json"});
  EXPECT_EQ(values(out, "Vary"), Values{"Origin"});  // (a list: Weir's own Vary adds to it)
}

TEST(HttpForward, ResponseFieldsDropFramingRequestIdAndHopByHop) {
  std::string out;
  append_response_fields(out, response(kUpstreamHead), /*drop_encoding=*/false);
  for (std::string_view f : {"Content-Length", "x-request-id", "Connection", "Keep-Alive", "X-Upstream-Hop", "Upgrade",
                             "Proxy-Authenticate", "Trailer", "Transfer-Encoding"})
    EXPECT_EQ(values(out, f), Values{}) << f;
  EXPECT_EQ(values(out, "Content-Type"), Values{"text/event-stream"});
  EXPECT_EQ(values(out, "Content-Encoding"), Values{"gzip"});  // kept: the body is relayed encoded
  EXPECT_EQ(values(out, "Server"), Values{"uvicorn"});
  EXPECT_EQ(values(out, "Date"), Values{"Tue, 01 Oct 2024 00:00:00 GMT"});
  // Whole lines, no status line, no blank line.
  EXPECT_FALSE(out.starts_with("HTTP/"));
  EXPECT_TRUE(out.ends_with("\r\n"));
  EXPECT_EQ(out.find("\r\n\r\n"), std::string::npos);
}

TEST(HttpForward, AProvidersAccountFieldsNeverReachATenantAndItsRequestIdNeverGoes) {
  // An Anthropic pool's head (Anthropic API reference, "Rate limits": response headers), a hosted OpenAI's.
  const std::string head =
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nrequest-id: req_provider\r\n"
      "anthropic-organization-id: org-1\r\nanthropic-ratelimit-requests-limit: 50\r\n"
      "Anthropic-RateLimit-Tokens-Remaining: 12345\r\nanthropic-ratelimit-input-tokens-reset: 2026-01-01T00:00:00Z\r\n"
      "anthropic-priority-input-tokens-limit: 9\r\nx-ratelimit-remaining-requests: 77\r\n"
      "openai-organization: org-x\r\nopenai-project: proj_1\r\nopenai-processing-ms: 12\r\n"
      "retry-after: 3\r\nx-anthropic-other: kept\r\n\r\n";
  const std::vector<std::string_view> account = {"anthropic-organization-id",
                                                 "anthropic-ratelimit-requests-limit",
                                                 "anthropic-ratelimit-tokens-remaining",
                                                 "anthropic-ratelimit-input-tokens-reset",
                                                 "anthropic-priority-input-tokens-limit",
                                                 "x-ratelimit-remaining-requests",
                                                 "openai-organization",
                                                 "openai-project"};
  std::string out;
  append_response_fields(out, response(head), false, {}, /*tenants=*/true);
  for (std::string_view f : account) EXPECT_EQ(values(out, f), Values{}) << f;
  EXPECT_EQ(values(out, "request-id"), Values{});      // the caller sends Weir's
  EXPECT_EQ(values(out, "retry-after"), Values{"3"});  // what the client must act on stays
  EXPECT_EQ(values(out, "openai-processing-ms"), Values{"12"});
  EXPECT_EQ(values(out, "x-anthropic-other"), Values{"kept"});
  EXPECT_EQ(values(out, "Content-Type"), Values{"application/json"});
  // Without tenants (one account's gateway) the provider's limits go as they came; its request id does not.
  out.clear();
  append_response_fields(out, response(head), false, {}, /*tenants=*/false);
  for (std::string_view f : account) EXPECT_EQ(values(out, f).size(), 1u) << f;
  EXPECT_EQ(values(out, "request-id"), Values{});
  EXPECT_TRUE(is_provider_account_field("X-RateLimit-Limit-Tokens"));
  EXPECT_FALSE(is_provider_account_field("x-ratelimit-"));
  EXPECT_FALSE(is_provider_account_field("anthropic-version"));
}

TEST(HttpForward, ResponseContentEncodingIsDroppedOnlyWhenAsked) {
  std::string out;
  append_response_fields(out, response(kUpstreamHead), /*drop_encoding=*/true);
  EXPECT_EQ(values(out, "Content-Encoding"), Values{});
  EXPECT_EQ(values(out, "Content-Type"), Values{"text/event-stream"});
}

TEST(HttpForward, ChunkedResponseFramingIsNotForwarded) {
  std::string out;
  append_response_fields(out,
                         response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n"
                                  "Date: Sun, 06 Dec 2026 01:00:00 GMT\r\n\r\n"),
                         false);
  EXPECT_EQ(out, "Content-Type: application/json\r\nDate: Sun, 06 Dec 2026 01:00:00 GMT\r\n");
}

TEST(HttpForward, AResponseWithoutDateGetsWeirsAndNothingElse) {
  // RFC 9110 §6.6.1: a recipient with a clock forwarding a response without Date adds one.
  std::string out = "keep";
  append_response_fields(out, response("HTTP/1.1 204 No Content\r\n\r\n"), false);
  ASSERT_TRUE(out.starts_with("keepDate: ")) << out;  // appends only
  EXPECT_TRUE(out.ends_with(" GMT\r\n")) << out;
  EXPECT_EQ(values(out.substr(4), "Date").size(), 1u);
  // One the upstream sent is kept, and not doubled; one the upstream named hop-by-hop is replaced.
  out.clear();
  append_response_fields(out, response("HTTP/1.1 200 OK\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\n\r\n"), false);
  EXPECT_EQ(out, "date: Thu, 01 Jan 2026 00:00:00 GMT\r\n");
  out.clear();
  append_response_fields(
      out, response("HTTP/1.1 200 OK\r\nConnection: date\r\nDate: Thu, 01 Jan 2026 00:00:00 GMT\r\n\r\n"), false);
  EXPECT_TRUE(out.starts_with("Date: ") && out.find("2026 00:00:00") == std::string::npos) << out;
}

TEST(HttpForward, LocationsPointingAtTheUpstreamBecomeRelative) {
  // A server that builds absolute redirects from the Host Weir sent (uvicorn's
  // trailing-slash redirect) would tell the client the endpoint's address.
  std::string out;
  append_response_fields(out,
                         response("HTTP/1.1 307 Temporary Redirect\r\n"
                                  "Location: http://10.0.0.7:8000/v1/models?x=1\r\n"
                                  "Content-Location: HTTP://10.0.0.7:8000\r\n"
                                  "Content-Type: text/plain\r\n\r\n"),
                         false, "10.0.0.7:8000");
  EXPECT_EQ(values(out, "Location"), Values{"/v1/models?x=1"});
  EXPECT_EQ(values(out, "Content-Location"), Values{"/"});
  EXPECT_EQ(values(out, "Content-Type"), Values{"text/plain"});
  EXPECT_EQ(out.find("10.0.0.7"), std::string::npos) << out;
}

TEST(HttpForward, OtherLocationsPassUnchanged) {
  std::string out;
  append_response_fields(out,
                         response("HTTP/1.1 302 Found\r\nLocation: https://login.example/x\r\n"
                                  "Content-Location: /relative\r\n\r\n"),
                         false, "10.0.0.7:8000");
  EXPECT_EQ(values(out, "Location"), Values{"https://login.example/x"});
  EXPECT_EQ(values(out, "Content-Location"), Values{"/relative"});
  // Without an upstream host (nothing to hide), nothing is rewritten.
  out.clear();
  append_response_fields(out, response("HTTP/1.1 307 X\r\nLocation: http://10.0.0.7:8000/a\r\n\r\n"), false);
  EXPECT_EQ(values(out, "Location"), Values{"http://10.0.0.7:8000/a"});
}

TEST(HttpForward, StripUpstreamOriginMatchesTheWholeHost) {
  EXPECT_EQ(strip_upstream_origin("http://h:80/p", "h:80"), "/p");
  EXPECT_EQ(strip_upstream_origin("http://H:80#f", "h:80"), "#f");
  EXPECT_EQ(strip_upstream_origin("http://h:8000/p", "h:80"), "http://h:8000/p");  // another port
  EXPECT_EQ(strip_upstream_origin("http://h.evil/p", "h"), "http://h.evil/p");
  EXPECT_EQ(strip_upstream_origin("http://h:8000/p", "h"), "http://h:8000/p");
  EXPECT_EQ(strip_upstream_origin("/p", "h"), "/p");
  EXPECT_EQ(strip_upstream_origin("http://h/p", ""), "http://h/p");
  EXPECT_EQ(strip_upstream_origin("https://api.example.com/v1/x", "api.example.com"), "/v1/x");
  EXPECT_EQ(strip_upstream_origin("HTTPS://API.example.com", "api.example.com"), "/");
  // A network-path reference ("//host/...", RFC 3986 §4.2) names the upstream as well.
  EXPECT_EQ(strip_upstream_origin("//h:80/v1/x", "h:80"), "/v1/x");
  EXPECT_EQ(strip_upstream_origin("//h:8000/v1/x", "h:80"), "//h:8000/v1/x");
  EXPECT_EQ(strip_upstream_origin("/v1//h:80", "h:80"), "/v1//h:80");
}

TEST(HttpForward, LinkTargetsAtTheUpstreamAreMadeRelativeAndAltSvcDropped) {
  std::string out;
  append_response_fields(out,
                         response("HTTP/1.1 200 OK\r\nLink: <http://10.0.0.7:8000/v1/x?p=2>; rel=next, "
                                  "<https://docs.example/y>; rel=help, <//10.0.0.7:8000/z>; rel=prev\r\n"
                                  "Alt-Svc: h2=\":8001\"\r\nLink: </already>; rel=self\r\n\r\n"),
                         false, "10.0.0.7:8000");
  EXPECT_EQ(values(out, "Link"), (Values{"</v1/x?p=2>; rel=next, <https://docs.example/y>; rel=help, </z>; rel=prev",
                                         "</already>; rel=self"}));
  EXPECT_EQ(values(out, "Alt-Svc"), Values{});
  EXPECT_EQ(out.find("10.0.0.7"), std::string::npos);
  // Spaces inside the brackets, an anchor parameter, a userinfo, a Refresh redirect.
  out.clear();
  append_response_fields(out,
                         response("HTTP/1.1 200 OK\r\nLink: < http://10.0.0.7:8000/a >; rel=x; "
                                  "anchor=\"http://10.0.0.7:8000/z\"\r\nLocation: http://u:p@10.0.0.7:8000/x\r\n"
                                  "Refresh: 0; url=http://10.0.0.7:8000/r\r\n\r\n"),
                         false, "10.0.0.7:8000");
  EXPECT_EQ(values(out, "Link"), Values{"< /a >; rel=x; anchor=\"/z\""});
  EXPECT_EQ(values(out, "Location"), Values{"/x"});
  EXPECT_EQ(values(out, "Refresh"), Values{"0; url=/r"});
  EXPECT_EQ(out.find("10.0.0.7"), std::string::npos);
  // A path that begins "//" stays a path on this host: never a redirect to another one.
  out.clear();
  append_response_fields(out, response("HTTP/1.1 302 Found\r\nLocation: http://10.0.0.7:8000//evil.example/x\r\n\r\n"),
                         false, "10.0.0.7:8000");
  EXPECT_EQ(values(out, "Location"), Values{"/.//evil.example/x"});
}

// The endpoint URL's path as an OpenAI-style base (https://api.openai.com/v1, Azure deployment bases).
std::string target(std::string_view t, std::string_view base, std::string_view query = {}) {
  std::string out = "x";
  append_upstream_target(out, t, base, query);
  return out.substr(1);
}

TEST(HttpForward, UpstreamTargetOnABasePath) {
  // No base: unchanged.
  EXPECT_EQ(target("/v1/chat/completions", ""), "/v1/chat/completions");
  EXPECT_EQ(target("/tokenize", ""), "/tokenize");
  // An OpenAI-style base: its /v1 is the request's /v1.
  EXPECT_EQ(target("/v1/chat/completions", "/v1"), "/v1/chat/completions");
  EXPECT_EQ(target("/v1/models", "/v1"), "/v1/models");
  EXPECT_EQ(target("/tokenize", "/v1"), "/tokenize");
  EXPECT_EQ(target("/v1", "/v1"), "/v1");
  EXPECT_EQ(target("/v1x/y", "/v1"), "/v1x/y");  // "/v1x" is not the /v1 segment
  // A proxied vLLM: everything under the base's root.
  EXPECT_EQ(target("/v1/completions", "/proxy/vllm/v1"), "/proxy/vllm/v1/completions");
  EXPECT_EQ(target("/tokenize", "/proxy/vllm/v1"), "/proxy/vllm/tokenize");
  // Azure: a deployment base without /v1, and api-version as the endpoint's query.
  EXPECT_EQ(target("/v1/chat/completions", "/openai/deployments/gpt-4o", "api-version=2024-10-21"),
            "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21");
  EXPECT_EQ(target("/v1/models?limit=2", "/openai/deployments/d", "api-version=1"),
            "/openai/deployments/d/models?limit=2&api-version=1");
  // A query alone, on the server root.
  EXPECT_EQ(target("/v1/embeddings", "", "tenant=a"), "/v1/embeddings?tenant=a");
  // The endpoint's parameters are the operator's: a client's of the same name (however encoded) is dropped,
  // not sent before it (servers that take the first value would read the client's); empty ones go too.
  EXPECT_EQ(target("/v1/chat/completions?api-version=evil&x=1", "/openai/deployments/d", "api-version=2024-10-21"),
            "/openai/deployments/d/chat/completions?x=1&api-version=2024-10-21");
  EXPECT_EQ(target("/v1/chat/completions?%61pi-version=evil", "/d", "api-version=1"),
            "/d/chat/completions?api-version=1");
  EXPECT_EQ(target("/v1/chat/completions?", "/d", "api-version=1"), "/d/chat/completions?api-version=1");
  // Names in any case (ASP.NET reads them so), and ';' a separator too (some servers split there): a client
  // parameter any reading of which sets the endpoint's is dropped whole.
  EXPECT_EQ(target("/v1/chat/completions?API-VERSION=evil&x=1", "/d", "api-version=1"),
            "/d/chat/completions?x=1&api-version=1");
  EXPECT_EQ(target("/v1/chat/completions?Api-Version=evil", "/d", "api-version=1"),
            "/d/chat/completions?api-version=1");
  EXPECT_EQ(target("/v1/chat/completions?x=1;api-version=evil&y=2", "/d", "api-version=1"),
            "/d/chat/completions?y=2&api-version=1");
  EXPECT_EQ(target("/v1/chat/completions?x=1;API%2Dversion=evil", "/d", "api-version=1"),
            "/d/chat/completions?api-version=1");
  EXPECT_EQ(target("/v1/chat/completions?x=1;y=2", "/d", "api-version=1"), "/d/chat/completions?x=1;y=2&api-version=1");
  EXPECT_TRUE(query_names("a=1;api-version=2", "API-Version"));
  EXPECT_FALSE(query_names("a=1;api-versions=2", "api-version"));
  EXPECT_EQ(target("/v1/chat/completions?&&y", "/d", "api-version=1"), "/d/chat/completions?y&api-version=1");
}

TEST(HttpForward, RequestHeadUsesTheBasePath) {
  std::string out;
  auto o = options();
  o.base_path = "/openai/deployments/d";
  o.base_query = "api-version=2024-10-21";
  append_upstream_request_head(out, request(kClientHead), o);
  EXPECT_EQ(lines(out)[0], "POST /openai/deployments/d/chat/completions?api-version=2024-10-21 HTTP/1.1");
}

}  // namespace

TEST(HttpForward, AcceptEncodingGoesUpCutToTheCodingsWeirDecodes) {
  const auto up = [](std::string_view lines) {
    std::string out;
    append_upstream_request_head(out, request("POST / HTTP/1.1\r\n" + std::string(lines) + "\r\n"), options());
    return values(out, "Accept-Encoding");
  };
  EXPECT_EQ(up("Accept-Encoding: gzip, deflate, br\r\n"), Values{"gzip, deflate"});
  EXPECT_EQ(up("Accept-Encoding: br;q=1.0, GZIP ;q=0.5, zstd\r\n"), Values{"GZIP ;q=0.5"});
  EXPECT_EQ(up("Accept-Encoding: br\r\n"), Values{"identity"});
  EXPECT_EQ(up("Accept-Encoding: *\r\n"), Values{"identity"});
  EXPECT_EQ(up("Accept-Encoding: br\r\nAccept-Encoding: x-gzip, identity;q=0\r\n"),
            Values{"x-gzip, identity;q=0"});  // several lines are one list (RFC 9110 §5.3)
  EXPECT_EQ(up("Accept-Encoding:\r\n"), Values{"identity"});
  EXPECT_EQ(up(""), Values{});  // none sent: none added
}

}  // namespace weir::http
