// The one failure mapping: every way a request can fail becomes, here and
// nowhere else, a status, an OpenAI-shaped error (core::Error) and the
// access log's `error` field; and how it reaches the client depends only on
// whether the response was committed (gateway/phases: fail()).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/config.hpp"
#include "core/error.hpp"
#include "http/downstream.hpp"
#include "http/upstream.hpp"
#include "routing/queue.hpp"

namespace weir::gateway {

// A request whose head or body could not be read: 400 (malformed; framing
// RFC 9112 refuses: Transfer-Encoding with Content-Length or not ending in
// chunked, no or several Host, a target neither a path nor an http(s) URI, a
// chunk line or extensions over server.max_header), 408 (head or body too
// slow), 413 (body over server.max_body), 431 (head over server.max_header),
// 501 (a transfer coding other than chunked), or 499 client_closed_request
// (the client left mid-body). `detail`: the parser's message for a malformed request.
core::Error read_error(http::ReadFailure f, const core::ServerConfig& sc, std::string_view detail);

// Who failed, as a client may be told: the pool, the model asked for (empty:
// none, quick mode's GET /v1/models) and the request id. Never the
// endpoint's address: that goes to the access log and metrics only, so a
// client does not learn the topology behind the gateway.
struct UpstreamSubject {
  std::string_view pool;
  std::string_view model;
  std::string_view request_id;
};

// An upstream failure as the client sees it: 502 upstream_unavailable
// (refused, reset, garbage) or 504 upstream_timeout (connect, first byte,
// idle): "Upstream pool `P` (model `M`) refused the connection (request R)."
core::Error upstream_error(http::UpstreamFailure f, const UpstreamSubject& who, bool mid_stream);
// An answer whose head was over http::kMaxResponseHead: 502
// upstream_unavailable, "Upstream pool `P` (model `M`) sent a response head
// larger than 65536 bytes (request R)." Its failure kind is
// http::UpstreamFailure::protocol.
core::Error upstream_head_too_large(const UpstreamSubject& who);
// An OpenAI stream whose body ended (cleanly, or by the upstream's close)
// without its `data: [DONE]`: 502 upstream_unavailable, "Upstream pool `P`
// (model `M`) ended the stream before it was complete (request R)." Its
// failure kind is http::UpstreamFailure::protocol.
core::Error upstream_stream_incomplete(const UpstreamSubject& who);
// A stream that carried the upstream's in-band error event (vLLM's
// `data: {"error": …}`, or a chunk that was no JSON object): 502
// upstream_unavailable, "Upstream pool `P` (model `M`) sent an error event in
// its stream (request R)." Its failure kind is http::UpstreamFailure::protocol.
core::Error upstream_error_event(const UpstreamSubject& who);
// A generation the upstream ended without finishing it: its choice's
// finish_reason a failed one (api::Finish::failed: vLLM's "abort", "error",
// "repetition", a value no mapping knows; `finish_reason` its text, cut to 64
// bytes). 502 upstream_unfinished, "Upstream pool `P` (model `M`) ended the
// generation before it was complete (finish_reason "abort") (request R)." Its
// failure kind is http::UpstreamFailure::protocol: held against the endpoint.
core::Error upstream_unfinished(const UpstreamSubject& who, std::string_view finish_reason);
// A stream with an event larger than server.max_event (`limit_bytes`): 502
// upstream_unavailable, "… sent a stream event over N bytes (server.max_event)".
core::Error upstream_event_too_large(const UpstreamSubject& who, std::uint64_t limit_bytes);
// The last upstream of a pool answered `status` (408/429/502/503/504/529) and
// the request went on to a fallback that could not be reached either (502).
core::Error upstream_status_error(int status, const UpstreamSubject& who);
// The upstream answered `status` (4xx or 5xx; 400/413/422 are split before)
// to a micro-batch of several prompts: the member's error keeps the status
// (any other: 502) with Weir's message, not the body, which was written for
// the whole prompt list and may quote another member's prompt. A 429, 503 or
// 529 carries `retry_after_s` (the upstream's Retry-After, at least 1 s).
core::Error batch_status_error(int status, const UpstreamSubject& who, std::uint32_t retry_after_s);
// Whole seconds for a Retry-After (RFC 9110 §10.2.3): `d` rounded up, at
// least 1, at most a day.
inline std::uint32_t retry_after_seconds(std::chrono::steady_clock::duration d) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>((ms + 999) / 1000, 1, 86'400));
}
// The same wait exact for `retry-after-ms` (which the openai and anthropic SDKs read before Retry-After):
// `d` in milliseconds rounded up, at least 1, at most a day (retry_after_seconds' clamp).
inline std::uint32_t retry_after_millis(std::chrono::steady_clock::duration d) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(d).count();
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>(ms, 1, 86'400'000));
}

// Every endpoint of the pool is open (routing/health.hpp: its circuit
// breaker) and no fallback is left: 503 upstream_unavailable. `wait` is how long until the first breaker
// turns half-open (WorkerPool::unavailable_for), sent exact in retry-after-ms and rounded up to whole seconds
// (at least 1) in Retry-After; 0 (half-open with its trials in flight: when one ends is not known) sends 1 s.
core::Error pool_unavailable(const UpstreamSubject& who, std::chrono::steady_clock::duration wait);
using routing::ShedReason;
// A request shed by the pool's admission queue (pools.X.queue): `status`
// 503 or 429 (queue.shed_status), type server_error, code `overloaded`, with
// `retry_after` (queue.retry_after, ms resolution) exact in retry-after-ms and rounded up in Retry-After.
core::Error overloaded(const UpstreamSubject& who, ShedReason why, int status,
                       std::chrono::steady_clock::duration retry_after);
// The request's own deadline (x-weir-timeout-ms: `budget_ms`) passed before
// its response was committed (504, type timeout, code deadline_exceeded), or
// during a stream (in-band, the same error; `mid_stream` words it so).
// Sent with `x-should-retry: false` (no_retry): the client's own bound is spent, and an SDK's retry would
// start the generation again for a caller that set the bound.
core::Error deadline_exceeded(const UpstreamSubject& who, std::uint32_t budget_ms, bool mid_stream = false);
// A buffered upstream body over server.max_response (502).
core::Error upstream_too_large(const UpstreamSubject& who, std::uint64_t limit_bytes);
// A compressed body that inflates past `ratio`:1 (a decompression bomb): 502, code upstream_invalid_response.
core::Error upstream_inflates_too_much(const UpstreamSubject& who, std::uint64_t ratio);
// A body in a Content-Encoding Weir cannot decode (it decodes gzip and deflate), for a client
// that does not accept it or an answer whose usage Weir must read (502, code
// upstream_invalid_response).
core::Error upstream_undecodable(const UpstreamSubject& who, std::string_view encoding);
// A 2xx body a translated route cannot read as `expected` ("a chat completion",
// "an Anthropic message"): 502 upstream_invalid_response.
core::Error upstream_untranslatable(const UpstreamSubject& who, std::string_view expected);
// A 2xx chat completion whose function call `call` ("function call <id> (<name>)")
// has arguments that are no JSON text, for a Responses client, which must not
// run it (as a stream fails then): 502 upstream_invalid_response.
core::Error upstream_invalid_arguments(const UpstreamSubject& who, std::string_view call);

// Why a client is gone: it closed or reset (client_closed_request), it
// stopped reading and passed server.max_stream_buffer (slow_client), or one
// write took longer than server.write_timeout (client_write_timeout).
enum class ClientGone : std::uint8_t { closed, slow, write_timeout };
// 499 (nginx's "client closed request"), source client: nothing is sent.
core::Error client_gone(ClientGone why);
// A request still in flight when server.drain_timeout passed: Weir cut it
// (503 drain_timeout, source internal), not the client.
core::Error drain_cut();
// 503 gateway_overloaded (Retry-After: 1, source internal): the request's body
// (`who` null) or its upstream's whole answer would take the bytes Weir holds
// in buffers over server.max_buffered (core/buffer_budget.hpp). `limit_bytes`:
// that setting.
core::Error buffers_full(const UpstreamSubject* who, std::uint64_t limit_bytes);

// The error body's shape: OpenAI's {"error":{message,type,param,code}}
// (core/error.hpp), or Anthropic's {"type":"error","error":{type,message}}
// for requests on the Anthropic routes (api/anthropic/response.hpp); the
// status is Weir's either way.
enum class ErrorDialect : std::uint8_t { openai, anthropic };
// Appends the body of `e` in `d` to `out`.
void append_error_body(std::string& out, const core::Error& e, ErrorDialect d);

// The longest Retry-After (s) the SDKs that call a route of dialect `d` wait out before their automatic retry
// (a longer one is replaced by their own backoff of under 10 s): the anthropic Python SDK's 60 s on Anthropic's
// routes, the openai SDKs' 120 s (MAX_RETRY_AFTER_DELAY) on the others. An answer asking a longer wait carries
// `x-should-retry: false` (docs/reliability.md, "Retries by the client's SDK").
constexpr std::uint32_t sdk_retry_after_max_s(ErrorDialect d) { return d == ErrorDialect::anthropic ? 60 : 120; }

// How a failure reaches the client.
enum class Delivery : std::uint8_t {
  response,  // before the commit point: a whole error response (status, OpenAI error body)
  in_band,   // a stream already committed: `data: {"error": ...}` then `data: [DONE]`, as vLLM does
             // (Anthropic: one `event: error`)
  none,      // the client is gone (499), or a non-stream response was committed: nothing more is sent
};
Delivery delivery_of(const core::Error& e, bool committed, bool streaming);

}  // namespace weir::gateway
