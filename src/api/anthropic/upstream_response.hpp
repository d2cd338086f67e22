// Anthropic's Messages API as the upstream: its answers (Anthropic API
// reference: "Messages" response, "Errors") as OpenAI chat completions
// (OpenAI API reference: the chat completion object, "Error codes"), and
// its usage read for Weir's own accounting. Mappings: docs/protocols.md
// ("Anthropic as the upstream").
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "api/usage.hpp"

namespace weir::api::anthropic {

// OpenAI's finish_reason for an Anthropic stop_reason: end_turn,
// stop_sequence, pause_turn → "stop"; max_tokens and
// model_context_window_exceeded → "length"; tool_use → "tool_calls";
// refusal → "content_filter"; anything else (null, unknown) → "stop".
std::string_view finish_reason(std::string_view stop_reason);

// Token counts of an Anthropic `usage` object as OpenAI counts them:
// prompt_tokens = input_tokens + cache_creation_input_tokens +
// cache_read_input_tokens (Anthropic counts cache reads and writes apart
// from input_tokens; OpenAI's prompt_tokens includes them), cached_tokens =
// cache_read_input_tokens, cache_write_tokens = cache_creation_input_tokens
// (cache_write_1h_tokens = cache_creation.ephemeral_1h_input_tokens, at most
// cache_creation_input_tokens), completion_tokens = output_tokens.
struct AnthropicUsage {
  std::uint64_t input = 0;
  std::uint64_t cache_creation = 0;
  std::uint64_t cache_read = 0;
  std::uint64_t output = 0;
  std::uint64_t cache_creation_1h = 0;  // usage.cache_creation.ephemeral_1h_input_tokens
  // A count came that is no integer in [0, kMaxUsageTokens] (usage.hpp): it
  // was not taken, and the usage as a whole cannot be billed as sent.
  bool invalid = false;
  Usage openai() const {
    const std::uint64_t prompt = input + cache_creation + cache_read;
    return Usage{prompt,     output,         prompt + output,
                 cache_read, cache_creation, std::min(cache_creation_1h, cache_creation)};
  }
};

// Appends OpenAI's usage object for `u`: {"prompt_tokens","completion_tokens",
// "total_tokens","prompt_tokens_details":{"cached_tokens"}}, and in the
// details "cache_write_tokens" (OpenRouter's name) when it is not 0.
void append_openai_usage(std::string& out, const Usage& u);

// Reads the top-level `usage` of an Anthropic message (a whole response body)
// as OpenAI counts it; nullopt when there is none, null or one with no count
// at all ({}), or it is not an object of integers in [0, kMaxUsageTokens]
// (absent or null cache counts read as 0) that says both input_tokens and
// output_tokens (usage.hpp), and then, when it was sent but does not read so,
// sets `*invalid` (when given) to true, as extract_usage does, and when it
// left one of input_tokens and output_tokens out (absent or null), writes
// the part it said to `*partial` (when given), as extract_usage does.
std::optional<Usage> extract_message_usage(std::string_view body, bool* invalid = nullptr,
                                           PartialUsage* partial = nullptr);

// Translates a whole Anthropic message (`type: "message"`) into an OpenAI
// chat.completion written to `out` (overwritten): id "chatcmpl-" + the
// message id, `created` (Unix seconds, Weir's clock: Anthropic sends none),
// the upstream's model; one choice whose message has the text blocks
// concatenated as `content` (null when there are none), the thinking blocks
// as vLLM's `reasoning_content`, the tool_use blocks as `tool_calls` (id,
// name, arguments = the input's JSON text); finish_reason from stop_reason;
// usage as above. Returns false when `body` is not a message (out then holds
// OpenAI's 502 upstream_error body).
bool message_to_chat(std::string_view body, std::int64_t created, std::string& out);

// The event stream Anthropic sends for a whole message (`type: "message"`),
// for a client that asked for a stream and got the message whole, written
// to `out` (overwritten), nothing lost: message_start (the message with
// empty content, stop_reason and stop_sequence null); per content block,
// content_block_start (the block with its text, thinking or input emptied),
// one delta with all of it (text_delta, thinking_delta then signature_delta,
// input_json_delta), content_block_stop (redacted_thinking and other blocks
// start whole, with no delta); message_delta (stop_reason, stop_sequence,
// the usage); message_stop. `deltas` counts the content deltas. Returns
// false when `body` is not a message.
bool message_as_events(std::string_view body, std::string& out, std::uint32_t& deltas);

// Appends OpenAI's error object {"error":{"message","type","param":null,
// "code":null}} for an Anthropic error answer (`status` and its body
// {"type":"error","error":{"type","message"}}): Anthropic's error.type is
// kept as the type (invalid_request_error, authentication_error,
// rate_limit_error, overloaded_error, …); a body without one gives a type
// from the status and api::upstream_error_text()'s message ("Upstream
// answered <status>.", or with the text of a body that is no JSON object).
// A 4xx whose message is a context-length refusal ("prompt is too long: ...",
// api::context_length_error) is OpenAI's: invalid_request_error, param
// "messages", code "context_length_exceeded".
void append_openai_error(std::string& out, int status, std::string_view body);

}  // namespace weir::api::anthropic
