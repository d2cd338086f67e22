// OTLP/HTTP's JSON encoding of traces (OpenTelemetry Protocol 1.x, "OTLP/HTTP
// JSON": the protobuf ExportTraceServiceRequest in proto3 JSON mapping, with
// trace and span ids as hex strings and 64-bit integers as decimal strings,
// https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tracing/record.hpp"

namespace weir::tracing {

// The resource every span of this process belongs to, rendered once.
struct Resource {
  std::string service_name;
  std::string service_version;
  std::string instance_id;                                 // service.instance.id
  std::string host_name;                                   // host.name; empty = left out
  std::vector<std::pair<std::string, std::string>> extra;  // tracing.resource
};

// The `"resource":{...}` member's value for `r` (a JSON object).
std::string resource_json(const Resource& r);

// Appends one ExportTraceServiceRequest holding every span of `records`
// under `resource_json` (resource_json()'s text) and the instrumentation
// scope "weir" at `scope_version`. Span per record: the request's (kind
// SERVER, "{method} {route}"), then each child (INTERNAL, or CLIENT for
// upstream attempts). Strings are escaped and made valid UTF-8.
void append_export_request(std::string& out, std::string_view resource_json, std::string_view scope_version,
                           std::span<const TraceRecord* const> records);

// The same in steps, for an exporter that encodes each record as it takes
// it from its queue: begin, then append_spans for each record (`first` for
// the first), then end.
void begin_export_request(std::string& out, std::string_view resource_json, std::string_view scope_version);
void append_spans(std::string& out, const TraceRecord& r, bool first);
void end_export_request(std::string& out);

}  // namespace weir::tracing
