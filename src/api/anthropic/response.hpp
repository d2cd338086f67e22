// Anthropic Messages API responses built from an OpenAI/vLLM upstream's
// answers (Anthropic API reference: "Messages" response, "Errors", "Count
// Message tokens"; vLLM's OpenAI-compatible server, v0.10.1 wire format).
// Mappings: docs/protocols.md ("Anthropic Messages").
#pragma once

#include <string>
#include <string_view>

#include "api/usage.hpp"

namespace weir::api::anthropic {

// Anthropic's error.type for an HTTP status: 400 (and other 4xx)
// invalid_request_error, 401 authentication_error, 403 permission_error,
// 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 503 and
// 529 overloaded_error, other 5xx api_error.
std::string_view error_type(int status);

// Appends {"type":"error","error":{"type":error_type(status),"message":...}}.
void append_error_json(std::string& out, int status, std::string_view message);

// Appends the Anthropic error for an upstream's error answer: `status` and
// its body (vLLM's {"error":{"message"}}, the older {"message"}, FastAPI's
// {"detail": "<text>"}, or FastAPI's validation answer {"detail": [{"loc",
// "msg"}, ...]} as "loc.path: msg; ..." without the leading "body"); a body
// that is no JSON object gives "Upstream answered <status>: <its text, cut>",
// one without a message "Upstream answered <status>." (upstream_error_text).
void append_upstream_error(std::string& out, int status, std::string_view body);

// The Anthropic message id for an upstream completion id: "msg_" + the id
// without vLLM's "chatcmpl-" prefix (appended to `out`).
void append_message_id(std::string& out, std::string_view upstream_id);

// Anthropic's stop_reason for an OpenAI finish_reason: length → max_tokens
// (a tool call cut off there is incomplete); else, when the message has a
// tool call (`tool_calls`), tool_use, whatever the finish said; stop →
// end_turn (or stop_sequence when `matched_stop` is non-empty: vLLM's
// `stop_reason` string), content_filter → refusal; none (null) and
// tool_calls or function_call with no call (Anthropic says tool_use only
// with tool_use blocks, which a client's tool loop runs) → end_turn. A
// failed finish (api::Finish::failed: vLLM's abort, error, repetition, an
// unknown value) has no stop_reason: the callers answer it as an error
// before asking (translate_message, StreamTranslator); here it is end_turn.
std::string_view stop_reason(std::string_view finish_reason, std::string_view matched_stop, bool tool_calls);

// Appends Anthropic's usage members (without braces) from OpenAI usage:
// "input_tokens" (prompt tokens not read from the prefix cache),
// "output_tokens", "cache_read_input_tokens" (prompt_tokens_details.cached_tokens).
void append_usage_members(std::string& out, const Usage& u);

// Translates a whole chat.completion body (the first choice) into an
// Anthropic message written to `out` (overwritten): content blocks in order
// thinking (vLLM's reasoning_content, or `reasoning`, then the thinking parts
// of a content list; only `with_thinking`: the request's thinking.type is
// enabled or adaptive, as Anthropic gives thinking blocks only then), text
// (the content: a string, or the text parts of a list joined, as Mistral
// sends them; other parts skipped), one tool_use per
// tool call (input parsed from the arguments JSON; arguments that are not a
// JSON object are kept as {"_raw": "<text>"}). Returns false when `body` is
// not a chat completion with a choice (out then holds an api_error body).
// The message id is "msg_" + the upstream's id without "chatcmpl-", or
// "msg_" + `fallback_id` (Weir's request id) when it has none or just
// "chatcmpl-" (tool ids made from it stay unique per request).
// A choice whose finish_reason is a failed one (api::Finish::failed: vLLM's
// "abort", "error", "repetition", or a value no mapping knows) is no
// message either: false, `out` an api_error body naming the value
// (api::unfinished_message), and `*unfinished` (when given; cleared
// otherwise) that value, so the caller answers a 502 upstream failure.
bool translate_message(std::string_view body, std::string& out, std::string_view fallback_id = {},
                       bool with_thinking = true, std::string* unfinished = nullptr);

// Translates vLLM's /tokenize answer {"count": N, ...} into
// {"input_tokens": N}. Returns false when there is no count (out then holds
// an api_error body).
bool translate_count(std::string_view body, std::string& out);

}  // namespace weir::api::anthropic
