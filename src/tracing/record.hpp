// One request's spans as a worker hands them to the trace exporter: a
// plain record filled in place in a queue slot (core::SpscRing), whose
// strings keep their capacity across requests, so recording a sampled
// request allocates nothing once the slots have grown. The exporter's
// thread turns records into OTLP spans (tracing/otlp_json.hpp).
//
// Span names and attributes follow OpenTelemetry's semantic conventions:
// HTTP server and client spans (semconv 1.26+: http.request.method,
// http.route, url.path, http.response.status_code, error.type,
// server.address, server.port, url.full, http.request.resend_count) and
// GenAI (gen_ai.operation.name, gen_ai.provider.name, gen_ai.request.model,
// gen_ai.usage.input_tokens, gen_ai.usage.output_tokens,
// gen_ai.usage.cache_read.input_tokens,
// gen_ai.response.time_to_first_chunk); Weir's own under weir.*. A
// micro-batch member's upstream span links to the span context its batch
// sent when that was another member's.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/spsc_ring.hpp"
#include "tracing/context.hpp"

namespace weir::tracing {

// What a child span of the request span stands for.
enum class Step : std::uint8_t {
  authenticate,  // "authenticate": credentials → principal
  admit,         // "admit": allow-list, rate limits, stream caps, budgets
  batch_wait,    // "batch wait": a micro-batch member from joining to its batch being sent
  upstream,      // "POST" (HTTP client span): one upstream attempt, connect to response end
  response,      // "stream" (SSE) or "response": the upstream's answer relayed to the client
};

struct ChildSpan {
  SpanId id;
  Step step = Step::authenticate;
  std::int64_t start_ns = 0;  // since the request span's start
  std::int64_t end_ns = 0;
  bool error = false;  // the step refused or failed (span status ERROR)
  // Step::upstream
  int status = 0;            // upstream response status; 0 = none arrived
  std::string_view failure;  // error.type of a failed exchange (static text: "connect_refused"); empty = none
  std::uint8_t resend = 0;   // attempts of the request before this one (http.request.resend_count)
  std::string pool;          // the pool's name (weir.pool)
  // The request's URL as sent: the endpoint's scheme and authority, its base
  // path mapped onto the request's path, and its query (url.full; its
  // secrets are redacted when exported, on the exporter's thread).
  std::string url;
  std::string_view provider;  // gen_ai.provider.name (static): "openai", "anthropic"; empty = none
  std::string host;           // server.address
  std::uint16_t port = 0;     // server.port
  // A micro-batch's attempt: 1 when this request was the batch's lead (its
  // traceparent went upstream), 0 when another member's did (weir.batch.lead);
  // -1 not a batch's. The span context sent, when it is not this span's: a
  // span link (the upstream's spans are that context's children, not this one's).
  std::int8_t batch_lead = -1;
  TraceId link_trace;
  SpanId link_span;  // invalid = no link
};

struct TraceRecord {
  static constexpr std::size_t kMaxChildren = 12;  // authenticate, admit, batch wait, 8 attempts, response

  TraceId trace_id;
  SpanId span_id;    // the request's (server) span
  SpanId parent_id;  // the caller's span from traceparent; invalid = the request span is a root
  std::string tracestate;
  std::int64_t start_unix_ns = 0;  // the request's head complete, Unix ns
  std::int64_t duration_ns = 0;    // to the end of the response

  // The request span's attributes.
  std::string method;          // http.request.method
  std::string path;            // url.path (without the query)
  std::string_view route;      // http.route (a static label); empty = no route matched
  std::string_view operation;  // gen_ai.operation.name (static); empty = not a GenAI route
  std::string_view provider;   // gen_ai.provider.name (static) of the pool of the last attempt; empty = none
  std::string request_id;      // weir.request_id (x-request-id)
  std::string model;           // gen_ai.request.model, as the client sent it; empty = none
  std::string tenant, key_id;  // weir.tenant, weir.key_id; empty = none
  std::string user_agent;      // user_agent.original; empty = none
  int status = 0;              // http.response.status_code (499: the client left)
  bool stream = false;         // weir.stream
  bool has_error = false;
  std::string_view error_source;  // "client", "upstream", "internal" (static)
  std::string error_code;         // weir.error.code; error.type when the span is ERROR (otlp_json.cpp)
  bool has_usage = false;
  std::uint64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  std::int64_t ttft_ns = -1;  // arrival → first SSE data event to the client; -1 = none
  bool has_spend = false;
  std::int64_t spend_nano_usd = 0;
  std::uint32_t events = 0;   // SSE data events relayed
  std::uint32_t retries = 0;  // attempts repeated
  std::uint64_t bytes_in = 0, bytes_out = 0;
  std::string batch_id;  // weir.batch.id for a micro-batch member

  std::array<ChildSpan, kMaxChildren> children;
  std::uint8_t child_count = 0;

  std::size_t span_count() const noexcept { return 1u + child_count; }
  ChildSpan* add_child() { return child_count < kMaxChildren ? &children[child_count++] : nullptr; }
};

// Frees each string of `r` whose capacity is past 256 bytes (a client's long path, user agent or
// tracestate), once it was exported: a queue slot keeps a usual record's text, not the largest one's
// (core::SpscRing).
inline void release_long_strings(TraceRecord& r) {
  constexpr std::size_t kKeep = 256;
  for (std::string* s : {&r.tracestate, &r.method, &r.path, &r.request_id, &r.model, &r.tenant, &r.key_id,
                         &r.user_agent, &r.error_code, &r.batch_id})
    core::release_above(*s, kKeep);
  for (ChildSpan& c : r.children)  // (all of them: a slot past child_count kept an older record's)
    for (std::string* s : {&c.pool, &c.url, &c.host}) core::release_above(*s, kKeep);
}

using TraceQueue = core::SpscRing<TraceRecord>;

}  // namespace weir::tracing
