#include "tracing/otlp_json.hpp"

#include <iterator>

#include <fmt/format.h>

#include "core/json_text.hpp"
#include "core/url.hpp"

namespace weir::tracing {

namespace {

// OTLP's Span.SpanKind and Status.StatusCode (opentelemetry/proto/trace/v1/trace.proto).
constexpr int kInternal = 1, kServer = 2, kClient = 3;
constexpr int kStatusUnset = 0, kStatusError = 2;

// The attribute list being written: {"key":..,"value":{..}} entries, comma-separated.
class Attrs {
 public:
  explicit Attrs(std::string& out) : out_(out) { out_ += R"("attributes":[)"; }
  ~Attrs() { out_ += ']'; }
  void str(std::string_view key, std::string_view v) {
    begin(key);
    out_ += R"({"stringValue":)";
    core::append_json_string(out_, v);
    out_ += "}}";
  }
  void str_if(std::string_view key, std::string_view v) {
    if (!v.empty()) str(key, v);
  }
  void i64(std::string_view key, std::int64_t v) {
    begin(key);
    fmt::format_to(std::back_inserter(out_), R"({{"intValue":"{}"}}}})", v);
  }
  void f64(std::string_view key, double v) {
    begin(key);
    fmt::format_to(std::back_inserter(out_), R"({{"doubleValue":{}}}}})", v);
  }
  void boolean(std::string_view key, bool v) {
    begin(key);
    out_ += v ? R"({"boolValue":true}})" : R"({"boolValue":false}})";
  }

 private:
  void begin(std::string_view key) {
    if (n_++) out_ += ',';
    out_ += R"({"key":")";
    out_ += key;  // Weir's own literals: plain ASCII, nothing to escape
    out_ += R"(","value":)";
  }
  std::string& out_;
  int n_ = 0;
};

void append_ids(std::string& out, const TraceRecord& r, const SpanId& id, const SpanId* parent) {
  out += R"({"traceId":")";
  append_hex(out, r.trace_id);
  out += R"(","spanId":")";
  append_hex(out, id);
  out += '"';
  if (parent && parent->valid()) {
    out += R"(,"parentSpanId":")";
    append_hex(out, *parent);
    out += '"';
  }
  if (!r.tracestate.empty()) {
    out += R"(,"traceState":)";
    core::append_json_string(out, r.tracestate);
  }
}

void append_times(std::string& out, const TraceRecord& r, std::int64_t start_ns, std::int64_t end_ns) {
  if (end_ns < start_ns) end_ns = start_ns;
  fmt::format_to(std::back_inserter(out), R"(,"startTimeUnixNano":"{}","endTimeUnixNano":"{}")",
                 r.start_unix_ns + start_ns, r.start_unix_ns + end_ns);
}

void append_status(std::string& out, bool error, std::string_view message = {}) {
  if (!error) {
    fmt::format_to(std::back_inserter(out), R"(,"status":{{"code":{}}})", kStatusUnset);
    return;
  }
  fmt::format_to(std::back_inserter(out), R"(,"status":{{"code":{})", kStatusError);
  if (!message.empty()) {
    out += R"(,"message":)";
    core::append_json_string(out, message);
  }
  out += '}';
}

// The GenAI attributes of the request (on its span and on its response span).
void genai_attrs(Attrs& a, const TraceRecord& r) {
  a.str_if("gen_ai.operation.name", r.operation);
  a.str_if("gen_ai.provider.name", r.provider);
  a.str_if("gen_ai.request.model", r.model);
  if (r.has_usage) {
    a.i64("gen_ai.usage.input_tokens", static_cast<std::int64_t>(r.prompt_tokens));
    a.i64("gen_ai.usage.output_tokens", static_cast<std::int64_t>(r.completion_tokens));
    // Only a count the upstream gave (Weir reads an absent one as 0, which no cache says).
    if (r.cached_tokens > 0) a.i64("gen_ai.usage.cache_read.input_tokens", static_cast<std::int64_t>(r.cached_tokens));
  }
  if (r.ttft_ns >= 0) a.f64("gen_ai.response.time_to_first_chunk", static_cast<double>(r.ttft_ns) / 1e9);
}

// Whether the request span's status is ERROR (HTTP server semconv): a 5xx;
// or a 1xx-3xx answer that then ended in an error of the upstream's or of
// Weir's (a stream that broke after its 200 head: its in-band error). A 4xx
// is the client's fault, not the span's, and 499 (the client left) neither.
bool request_failed(const TraceRecord& r) {
  if (r.status == 499) return false;
  if (r.status >= 500) return true;
  return r.status < 400 && r.has_error && r.error_source != "client";
}

// Whether `m` is a method the HTTP semantic conventions know (semconv
// http.request.method: RFC 9110 §9's eight and RFC 5789's PATCH), compared
// as written: `get` is not GET. Any other token a client sends (methods are
// unbounded, and a request needs no credentials to be traced) is recorded
// as `_OTHER`, its span named with `HTTP` in the method's place, so clients
// cannot mint span names or method values at will.
bool known_method(std::string_view m) {
  static constexpr std::string_view kKnown[] = {"GET",     "POST",  "PUT",   "DELETE", "HEAD",
                                                "OPTIONS", "PATCH", "TRACE", "CONNECT"};
  for (std::string_view k : kKnown)
    if (m == k) return true;
  return false;
}

// http.request.method's value, and the method part of an HTTP span's name.
std::string_view method_attr(std::string_view m) { return known_method(m) ? m : "_OTHER"; }
std::string_view method_name(std::string_view m) { return known_method(m) ? m : "HTTP"; }

// http.request.method and, for a method the conventions do not know,
// http.request.method_original: the token as sent (at most kMaxEchoBytes).
void method_attrs(Attrs& a, std::string_view m) {
  a.str("http.request.method", method_attr(m));
  if (!known_method(m)) a.str("http.request.method_original", core::utf8_prefix(m, core::kMaxEchoBytes));
}

void append_request_span(std::string& out, const TraceRecord& r) {
  const bool failed = request_failed(r);
  append_ids(out, r, r.span_id, &r.parent_id);
  out += R"(,"name":)";
  // HTTP server semconv: "{method} {http.route}", or "{method}" without a route; r.route is one of Weir's
  // route labels (empty for any other path), never the client's path: a bounded set of names.
  thread_local std::string name;  // the exporter's thread: reused, no allocation per span
  name.assign(method_name(r.method));
  if (!r.route.empty()) {
    name += ' ';
    name += r.route;
  }
  core::append_json_string(out, name);
  fmt::format_to(std::back_inserter(out), R"(,"kind":{})", kServer);
  append_times(out, r, 0, r.duration_ns);
  out += ',';
  {
    Attrs a(out);
    method_attrs(a, r.method);
    a.str_if("http.route", r.route);
    a.str("url.path", r.path);
    a.str("url.scheme", "http");
    a.str("network.protocol.version", "1.1");
    a.i64("http.response.status_code", r.status);
    a.str_if("user_agent.original", r.user_agent);
    if (failed) a.str("error.type", r.error_code.empty() ? fmt::format("{}", r.status) : r.error_code);
    genai_attrs(a, r);
    a.str("weir.request_id", r.request_id);
    a.str_if("weir.tenant", r.tenant);
    a.str_if("weir.key_id", r.key_id);
    a.boolean("weir.stream", r.stream);
    if (r.has_spend) a.f64("weir.spend_usd", static_cast<double>(r.spend_nano_usd) / 1e9);
    a.i64("weir.retries", r.retries);
    a.i64("weir.sse_events", r.events);
    a.i64("weir.request.body.size", static_cast<std::int64_t>(r.bytes_in));
    a.i64("weir.response.size", static_cast<std::int64_t>(r.bytes_out));
    a.str_if("weir.batch.id", r.batch_id);
    if (r.has_error) {
      a.str("weir.error.source", r.error_source);
      a.str("weir.error.code", r.error_code);
    }
  }
  append_status(out, failed, failed ? std::string_view(r.error_code) : std::string_view{});
  out += '}';
}

void append_child(std::string& out, const TraceRecord& r, const ChildSpan& c) {
  append_ids(out, r, c.id, &r.span_id);
  int kind = kInternal;
  std::string_view name;
  switch (c.step) {
    case Step::authenticate:
      name = "authenticate";
      break;
    case Step::admit:
      name = "admit";
      break;
    case Step::batch_wait:
      name = "batch wait";
      break;
    case Step::upstream:
      name = method_name(r.method);  // HTTP client semconv: "{method}"
      kind = kClient;
      break;
    case Step::response:
      name = r.stream ? "stream" : "response";
      break;
  }
  out += R"(,"name":)";
  core::append_json_string(out, name);
  fmt::format_to(std::back_inserter(out), R"(,"kind":{})", kind);
  append_times(out, r, c.start_ns, c.end_ns);
  out += ',';
  std::string error_type;
  {
    Attrs a(out);
    switch (c.step) {
      case Step::authenticate:
      case Step::admit:
        if (c.error) {
          a.str("weir.error.code", r.error_code);
          error_type = r.error_code;
        }
        break;
      case Step::batch_wait:
        a.str_if("weir.batch.id", r.batch_id);
        break;
      case Step::upstream:
        method_attrs(a, r.method);
        a.str_if("server.address", c.host);
        if (c.port) a.i64("server.port", c.port);
        if (!c.url.empty()) a.str("url.full", core::redact_url(c.url));
        a.str_if("gen_ai.provider.name", c.provider);
        a.str_if("weir.pool", c.pool);
        if (c.status) a.i64("http.response.status_code", c.status);
        if (c.resend) a.i64("http.request.resend_count", c.resend);
        if (c.batch_lead >= 0) a.boolean("weir.batch.lead", c.batch_lead == 1);
        if (!c.failure.empty())
          error_type = std::string(c.failure);
        else if (c.status >= 400)
          error_type = fmt::format("{}", c.status);
        a.str_if("error.type", error_type);
        break;
      case Step::response:
        genai_attrs(a, r);
        a.i64("weir.sse_events", r.events);
        if (c.error) a.str("error.type", r.error_code);
        if (c.error) error_type = r.error_code;
        break;
    }
  }
  if (c.link_span.valid()) {
    // A micro-batch member's attempt: the span context its batch sent upstream (another member's span).
    out += R"(,"links":[{"traceId":")";
    append_hex(out, c.link_trace);
    out += R"(","spanId":")";
    append_hex(out, c.link_span);
    out += R"("}])";
  }
  append_status(out, c.error || (c.step == Step::upstream && !error_type.empty()), error_type);
  out += '}';
}

}  // namespace

std::string resource_json(const Resource& r) {
  std::string out = "{";
  {
    Attrs a(out);
    // OTLP (common.proto, KeyValue): keys are unique. An attribute Weir sets that tracing.resource names too
    // (host.name as the node's name, service.version as the deployment's) is the configured value: the
    // operator's override, written once, where the configured ones are.
    auto builtin = [&](std::string_view key, std::string_view v) {
      for (const auto& kv : r.extra)
        if (kv.first == key) return;
      a.str_if(key, v);
    };
    a.str("service.name", r.service_name);  // (tracing.resource may not name it: tracing.service_name does)
    builtin("service.version", r.service_version);
    builtin("service.instance.id", r.instance_id);
    builtin("host.name", r.host_name);
    builtin("telemetry.sdk.name", "weir");
    builtin("telemetry.sdk.language", "cpp");
    builtin("telemetry.sdk.version", r.service_version);
    for (const auto& [k, v] : r.extra) {
      // Configured names: escaped like any string (Attrs writes keys raw).
      std::string key;
      core::append_json_string(key, k);
      a.str(std::string_view(key).substr(1, key.size() - 2), v);
    }
  }
  out += '}';
  return out;
}

void begin_export_request(std::string& out, std::string_view resource_json, std::string_view scope_version) {
  out += R"({"resourceSpans":[{"resource":)";
  out += resource_json;
  out += R"(,"scopeSpans":[{"scope":{"name":"weir","version":)";
  core::append_json_string(out, scope_version);
  out += R"(},"spans":[)";
}

void append_spans(std::string& out, const TraceRecord& r, bool first) {
  if (!first) out += ',';
  append_request_span(out, r);
  for (std::size_t i = 0; i < r.child_count; ++i) {
    out += ',';
    append_child(out, r, r.children[i]);
  }
}

void end_export_request(std::string& out) { out += "]}]}]}"; }

void append_export_request(std::string& out, std::string_view resource_json, std::string_view scope_version,
                           std::span<const TraceRecord* const> records) {
  begin_export_request(out, resource_json, scope_version);
  bool first = true;
  for (const TraceRecord* r : records) {
    append_spans(out, *r, first);
    first = false;
  }
  end_export_request(out);
}

}  // namespace weir::tracing
