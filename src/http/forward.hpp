// The header filters of a forwarding proxy (RFC 9110 §7.6.1): what of the
// client's request head goes upstream, and what of the upstream's response
// head goes back to the client. Everything else on the way is the caller's.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <boost/beast/http/message.hpp>

#include "http/flat_fields.hpp"

namespace weir::http {

// Heads as Weir's parsers fill them (http/flat_parser.hpp): Beast's header
// types over a flat field store (http/flat_fields.hpp).
using RequestHead = boost::beast::http::request_header<FlatFields>;
using ResponseHead = boost::beast::http::response_header<FlatFields>;

// What the upstream request head carries besides the client's end-to-end fields.
struct UpstreamHeadOptions {
  std::string_view method;          // the method sent upstream; empty = the client's
  std::string_view target;          // request target sent upstream (origin-form, e.g. "/v1/chat/completions")
  std::string_view base_path;       // the endpoint URL's path ("" = server root): append_upstream_target
  std::string_view base_query;      // the endpoint URL's query without '?' ("" = none)
  std::string_view host_header;     // "host:port" of the endpoint
  std::size_t body_bytes = 0;       // Content-Length of the body Weir sends (always sent for a POST)
  std::string_view request_id;      // sent as x-request-id (the client's own is replaced)
  std::string_view upstream_lines;  // whole header lines (CRLF each) the pool adds: its credential, anthropic-version
  bool identity = false;  // ask for an uncompressed body (streams are parsed event by event); else the client's
                          // Accept-Encoding goes up cut to the codings Weir decodes (gzip, deflate, identity)
  bool strip_credentials = false;  // drop the client's Authorization and x-api-key (they were for Weir)
  bool anthropic = false;          // an Anthropic upstream: the client's anthropic-version is replaced (upstream_lines)
  bool body_decoded = false;       // Weir decoded the client's Content-Encoding: the header does not go upstream
  // The request carries several tenants' requests (a micro-batch) and `req` is one of them: of its fields
  // only Content-Type and Accept go upstream (an allow-list: every other field may describe that one client:
  // trace context of any vendor, baggage, addresses, proxies, user agent, SDK fields). What Weir writes
  // itself still goes: Host, Content-Length, x-request-id, upstream_lines (the pool's credentials),
  // Accept-Encoding and the options' traceparent and tracestate (Weir's own span). client_address must be
  // empty: no X-Forwarded-For is sent.
  bool shared = false;
  // W3C Trace Context (tracing:): non-empty, sent in place of the client's
  // traceparent and tracestate (tracestate only when non-empty); empty =
  // the client's pass through as they came.
  std::string_view traceparent;
  std::string_view tracestate;
  // The downstream client's address (Downstream::peer_address): non-empty,
  // X-Forwarded-For goes up as the client's own (its lines joined with
  // ", ", in order) followed by this, or as this alone when the client sent
  // none: nginx's $proxy_add_x_forwarded_for, Envoy's append. A client's
  // Forwarded (RFC 7239) goes up the same way, its lines joined and this
  // appended as a `for=` element (§4; an IPv6 address quoted and in
  // brackets, §6); none sent (no line, or only empty ones or ones named in
  // Connection): none added. The client's Forwarded elements go before
  // Weir's only from a trusted_peer, and only when every line is
  // well-formed (forwarded_well_formed); else Weir's element goes alone.
  // Empty: the client's X-Forwarded-For passes through as it came, its
  // Forwarded only from a trusted_peer and well-formed.
  std::string_view client_address;
  // The request's client as Weir resolved it (Downstream::client_address: the peer, or from a front proxy
  // of server.trusted_proxies the client its X-Forwarded-For names; the access log's `client`): non-empty,
  // sent as X-Real-IP, as nginx's `proxy_set_header X-Real-IP $remote_addr` (with its realip module) does.
  // The client's own X-Real-IP never goes up, from any peer: it is one address with no list to append to,
  // and a proxy that neither sets nor strips it (Caddy, HAProxy's `option forwardfor`) would pass a value
  // any client can write. Empty (a micro-batch of several tenants): none is sent.
  std::string_view real_ip;
  // The peer is a front proxy of server.trusted_proxies (Downstream::peer_trusted): the client's other
  // fields that describe the front's view of the request (is_front_view_field: X-Forwarded-Proto, -Host,
  // -Port, -Prefix, True-Client-IP, CF-Connecting-IP, ...) go up as that proxy sent them; from any other
  // peer they are dropped (Weir cannot tell the upstream what they would say, and a client's claim would
  // reach it as Weir's word).
  bool trusted_peer = false;
};

// True for a request field that states what a front proxy saw (name compared case-insensitively): an
// X-Forwarded-* field other than X-Forwarded-For (which Weir appends to) and X-Forwarded-Authorization
// (a credential: forwarded_upstream's rule), and the one-address client fields CDNs set (X-Client-IP,
// True-Client-IP, CF-Connecting-IP, Fastly-Client-IP). X-Real-IP is not one: Weir writes its own.
bool is_front_view_field(std::string_view name);

// True when `value` (one Forwarded field line's value) parses as RFC 7239 §4 has it: a list of elements, each
// `;`-separated `token=value` pairs (a value a token or a closed quoted-string, RFC 9110 §5.6.4), empty list
// elements and pairs allowed; OWS around "," and ";" only. False for anything else (an unclosed quote, a
// bare token, a space in a token, a control character).
bool forwarded_well_formed(std::string_view value);

// Appends the request target sent to an endpoint whose URL has a path
// `base` (no trailing '/') and a query `query`: OpenAI-style base URLs, as
// an SDK's base_url, where the request's "/v1" is the base. A target under
// /v1 ("/v1" then '/', '?' or its end) has that "/v1" replaced by `base`;
// another target (vLLM's /tokenize, /health) goes under `base` less a final
// "/v1" segment. Then `query` joins the target's own query, after the
// client's parameters it does not name (a client parameter of a name the
// endpoint's query sets is dropped: the operator's value is the one sent;
// names compared as query_names does, and a client parameter with a
// ';'-separated piece that names one is dropped whole; empty ones go too).
// With base and query empty the target is appended unchanged.
// Examples: base "/v1": "/v1/chat/completions" -> "/v1/chat/completions",
// "/tokenize" -> "/tokenize"; base "/openai/deployments/gpt4o", query
// "api-version=2024-10-21": "/v1/chat/completions" ->
// "/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21";
// base "/proxy/vllm/v1": "/metrics" -> "/proxy/vllm/metrics".
void append_upstream_target(std::string& out, std::string_view target, std::string_view base, std::string_view query);
// Whether query string `query` ("a=1&b=2", ';' a separator too) has a
// parameter named `name`, both compared percent-decoded, '+' a space, ASCII
// letters in any case (as some server reads them).
bool query_names(std::string_view query, std::string_view name);

// Appends the HTTP/1.1 request head for the upstream: request line, Host,
// Content-Length (every body sent upstream has its length: bytes without one
// would be read as the next request on a pooled connection), x-request-id,
// the pool's Authorization, then the client's fields minus hop-by-hop ones
// (RFC 9110 §7.6.1), Host, Content-Length, Expect, x-request-id and, as the
// options say, Accept-Encoding (identity, or the client's cut to the codings
// Weir decodes), Content-Encoding, anthropic-version and the
// client's credentials (and, with a traceparent in the options, the client's
// traceparent and tracestate, replaced by the options'), X-Forwarded-For
// and Forwarded with the options' client address last, the client's
// X-Real-IP (the options' real_ip is sent instead) and, unless the peer is
// trusted, its is_front_view_field fields; then the blank line.
void append_upstream_request_head(std::string& out, const RequestHead& req, const UpstreamHeadOptions& o);

// Appends, for deciding which requests may share one upstream request
// (batching/), the client's fields append_upstream_request_head forwards
// (with `identity`, and `strip_credentials` as for the head): names
// lowercased, sorted by name (one name's lines in their order), one
// "name: value\n" each; except fields that describe the client rather than
// the request (traceparent, tracestate, baggage, user-agent, accept,
// x-forwarded-for, forwarded, x-stainless-*), of which the upstream gets the
// first member's. Requests
// whose keys differ would send the upstream different fields (a credential,
// a header the model server acts on), so they are never merged.
void append_forwarded_fields_key(std::string& out, const RequestHead& req, bool strip_credentials);

// Appends the upstream response's end-to-end fields for the client: all but
// hop-by-hop ones, Content-Length (the caller frames the body), x-request-id
// and Anthropic's request-id (the caller sends the request's own id), and
// Content-Encoding when `drop_encoding` (the caller decoded the body). No
// status line, no blank line.
// A Location or Content-Location that points at the upstream itself
// (`http(s)://<upstream_host>`, the Host Weir sent: what a server that builds
// absolute redirects from Host writes, e.g. a trailing-slash redirect) is
// made relative (RFC 9110 §10.2.2 allows it), so the client is sent to the
// same path through the gateway and never learns the endpoint's address;
// nginx's `proxy_redirect default` does the same. A scheme-relative
// `//<upstream_host>/...` too, and each such target of a Link field; an
// Alt-Svc (the upstream's alternative ports) is dropped.
// `tenants`: the answer goes to a tenant (tenants are configured; the caller
// sends the tenant's x-ratelimit-* lines, if it has limits), so the fields of
// the provider account Weir calls with are dropped (is_provider_account_field):
// its limits and its organization are no tenant's business, and a client sees
// each x-ratelimit-* name once, with the value that governs it.
// `content_type`: when not empty, written in place of the upstream's
// Content-Type (a body Weir made of another media type).
// `own_cors`: the caller answers CORS itself (server.cors on, gateway/cors.hpp),
// so the upstream's Access-Control-* fields (vLLM's CORSMiddleware answers
// every origin by default) are dropped: a browser refuses an answer with two
// Access-Control-Allow-Origin values.
// An upstream head without Date gets Weir's (RFC 9110 §6.6.1).
void append_response_fields(std::string& out, const ResponseHead& res, bool drop_encoding,
                            std::string_view upstream_host = {}, bool tenants = false,
                            std::string_view content_type = {}, bool own_cors = false);

// True for a response field that describes the provider account the upstream
// was called with (name compared case-insensitively): its rate limits
// (OpenAI's x-ratelimit-*, Anthropic's anthropic-ratelimit-* and
// anthropic-priority-*, as their API references list them) and its identity
// (anthropic-organization-id, openai-organization, openai-project).
bool is_provider_account_field(std::string_view name);

// `uri` without a leading "http://<host>", "https://<host>" or "//<host>" (host compared case-insensitively)
// when it has that prefix followed by '/', '?', '#' or nothing ("/" then);
// otherwise `uri` unchanged.
std::string_view strip_upstream_origin(std::string_view uri, std::string_view host);

}  // namespace weir::http
