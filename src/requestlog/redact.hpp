// Secrets out of captured bodies (request_log.capture_bodies). Headers are
// never captured, so Authorization and x-api-key never reach the store;
// these functions take out what a body itself may carry.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace weir::requestlog {

// The text that replaces a secret.
inline constexpr std::string_view kRedacted = "[REDACTED]";

// Replaces every occurrence of `secret` (the credential the request was
// made with: the bearer token or x-api-key value, at least 8 bytes) in
// `text` with kRedacted, spelled as it is or with JSON string escapes
// (RFC 8259 §7: \u0073k-..., \/, \"; a body is JSON text); when `text` was
// truncated (`truncated`) and ends with a prefix of `secret` of 4 bytes or
// more, that tail goes too. Exact and certain: the request's own key or
// token is never stored, even when a client pastes it into a prompt or the
// model repeats it. Runs on the worker, only for requests whose tenant
// opted in to capture.
void redact_exact(std::string& text, std::string_view secret, bool truncated);

// Best-effort patterns, run by the store's writer thread before a body is
// stored: API-key shapes (`sk-`, `sk-ant-`, `sk-weir-`, `rk-`, `pk-`
// followed by 16+ characters of [A-Za-z0-9_-], and `AKIA` + 16 upper-case
// letters or digits), JWTs (`eyJ…` `.` `…` `.` `…`), `Bearer <token>`, and
// the string value of a JSON member whose name is credential-like
// (core::is_secret_param's list: "api_key", "password", "secret",
// "access_token", …) are replaced by kRedacted. A secret cut by the cap at
// the end of a truncated body (`truncated`) is caught by its prefix
// (`sk-`…, `eyJ`…) as well. What does not look like a credential (a
// password typed as prose) is not found.
// Cost: O(text.size()) whatever the text (quotes, escapes, unclosed
// strings, long names, whitespace): each string is scanned once, not once
// per quote in it.
void redact_patterns(std::string& text, bool truncated);

// Bytes redact_patterns has read on this thread while scanning strings and
// the whitespace after them, since the thread started: its tests' measure
// of linear cost (a count, not a clock).
std::uint64_t redact_patterns_scanned();

}  // namespace weir::requestlog
