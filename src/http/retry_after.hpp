// Reading a server's wait: Retry-After (RFC 9110 §10.2.3) and OpenAI's
// retry-after-ms. One rule for every reader: an upstream's answer
// (routing/attempts.hpp: asked_delay) and the trace exporter's collector
// (http/probe.hpp: PostAnswer::retry_after).
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

namespace weir::http {

// A Retry-After value (RFC 9110 §10.2.3) as the delay it asks for: its
// delay-seconds (more than 9 digits: 10^9 s, past any cap), or the time
// from `now` (wall clock) to its HTTP-date (0 for a date passed); nullopt
// for anything unparsable (the backoff is used then).
std::optional<std::chrono::milliseconds> parse_retry_after(std::string_view v,
                                                           std::chrono::system_clock::time_point now);

// A `retry-after-ms` value (OpenAI's field, read before Retry-After by its
// SDKs): a non-negative decimal number of milliseconds, a fraction rounded
// up ("1.5" is 2 ms); nullopt for anything else (Retry-After is read then).
std::optional<std::chrono::milliseconds> parse_retry_after_ms(std::string_view v);

}  // namespace weir::http
