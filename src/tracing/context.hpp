// W3C Trace Context (https://www.w3.org/TR/trace-context/, Level 1, with
// Level 2's rules for future versions): trace and span ids, the
// `traceparent` and `tracestate` request headers read from a client and
// written upstream, and the ids Weir makes for its own spans.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace weir::tracing {

// A 16-byte trace id; all zeros is invalid (§3.2.2.3).
struct TraceId {
  std::array<std::uint8_t, 16> b{};
  bool valid() const noexcept;
  bool operator==(const TraceId&) const = default;
};
// An 8-byte span (parent) id; all zeros is invalid (§3.2.2.4).
struct SpanId {
  std::array<std::uint8_t, 8> b{};
  bool valid() const noexcept;
  bool operator==(const SpanId&) const = default;
};

// Appends `n` bytes as lowercase hex (2n characters).
void append_hex(std::string& out, const std::uint8_t* p, std::size_t n);
inline void append_hex(std::string& out, const TraceId& t) { append_hex(out, t.b.data(), t.b.size()); }
inline void append_hex(std::string& out, const SpanId& s) { append_hex(out, s.b.data(), s.b.size()); }

// What a valid `traceparent` carries.
struct ParentContext {
  TraceId trace_id;
  SpanId span_id;  // the caller's span: the parent of Weir's request span
  std::uint8_t flags = 0;
  bool sampled() const noexcept { return flags & 0x01; }
};

// Parses one `traceparent` field value (§3.2): "00-<32 hex>-<16 hex>-<2 hex>",
// lowercase hex only, ids not all zeros, version "ff" invalid; a version
// above 00 is read by its first 55 characters when the next one (if any)
// is '-' (§4.3). Surrounding spaces and tabs are ignored. nullopt when
// invalid: the request then starts a new trace (never an error).
std::optional<ParentContext> parse_traceparent(std::string_view value);

// The `traceparent` Weir sends: "00-<trace>-<span>-<flags>", 55 characters.
using TraceparentText = std::array<char, 55>;
void format_traceparent(TraceparentText& out, const TraceId& t, const SpanId& s, bool sampled);

// Checks and normalizes a `tracestate` value (§3.3; the fields of several
// lines joined with ','): list members "key=value" (simple or multi-tenant
// "tenant@system" keys, values of printable ASCII without ',' or '=', not
// ending in a space), at most 32, no key twice; empty members and
// whitespace around them are dropped. A list longer than `max_bytes` loses
// members longer than 128 characters first, then members from its end
// (§3.3.1.5). Writes the normalized list into `out` (empty when there is
// none) and returns false when the value is invalid (then `out` is empty:
// the whole header is discarded, §3.3.1.1).
bool normalize_tracestate(std::string_view value, std::string& out, std::size_t max_bytes = 512);

// Random ids for one thread (xoshiro256**, seeded from std::random_device):
// a worker's own, no lock. Never returns an invalid (all-zero) id.
class IdGenerator {
 public:
  IdGenerator();
  explicit IdGenerator(std::uint64_t seed);
  TraceId trace_id();
  SpanId span_id();
  std::uint64_t next();

 private:
  std::uint64_t s_[4];
};

// The sampling decision for a request (OpenTelemetry's ParentBased sampler
// over TraceIdRatioBased): with a valid parent, the parent's sampled flag;
// without one, true for a fraction `ratio` (0..1) of trace ids, decided by
// the id's last 8 bytes, so every replica decides alike for one trace.
class Sampler {
 public:
  explicit Sampler(double ratio);
  bool root_sampled(const TraceId& t) const noexcept;
  double ratio() const noexcept { return ratio_; }

 private:
  double ratio_;
  std::uint64_t threshold_;  // sampled when the id's low 64 bits are below it (ratio 1: always)
  bool all_;
};

}  // namespace weir::tracing
