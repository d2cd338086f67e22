// Anthropic's Messages API as the upstream (pools with `type: anthropic`):
// an OpenAI chat-completions request (OpenAI API reference, "Create chat
// completion") translated into an Anthropic Messages request (Anthropic API
// reference, "Messages", POST /v1/messages), and the light reading of an
// Anthropic request that goes to such a pool as it came. Every mapping, and
// every field that cannot be mapped, is listed in docs/protocols.md
// ("Anthropic as the upstream").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

#include "api/request.hpp"
#include "core/error.hpp"

namespace weir::api::anthropic {

struct UpstreamRequestOptions {
  std::string_view model;                // the `model` sent (the target's upstream name)
  std::uint32_t default_max_tokens = 0;  // tokens, when the request gives neither max_completion_tokens nor max_tokens
  // Set (when not null) to the max_tokens sent, in tokens: the request's, or the default (plus the thinking
  // budget made of reasoning_effort): the most the answer can use, which admission reserves.
  std::uint64_t* max_tokens_sent = nullptr;
};

// Translates the chat-completions body `chat` (RFC 8259 JSON, already read
// by parse_request or written by the Responses translator) into the Anthropic
// Messages body, written to `out` (overwritten; its capacity is reused):
// system and developer messages into `system` text blocks, user, assistant
// and tool messages into alternating user/assistant turns (tool results as
// tool_result blocks of a user turn, tool calls as tool_use blocks), images
// as base64 or url sources, tools, tool_choice, stop, max_tokens (or
// `o.default_max_tokens`), temperature, top_p, top_k, stream, user,
// reasoning_effort (as `thinking`), a json_schema response_format (as
// `output_config.format` {type: json_schema, schema}: Anthropic's structured
// outputs). What Anthropic would refuse is made what
// it takes: tool ids outside ^[a-zA-Z0-9_-]+$ mapped alike in a call and its
// result (api/tool_ids.hpp), whitespace-only stop strings left out, and with
// the thinking made of reasoning_effort no temperature other than 1, top_p
// below 0.95 or top_k (and no thinking when tool_choice forces a call).
// Errors are 400 invalid_request_error in
// OpenAI's shape, `param` the top-level field and the path in the message
// (`messages[2].content[0].type: …`), for what Anthropic cannot express: n
// above 1, logprobs, a json_object response_format (or a json_schema one
// without an object schema), audio or file parts, tool call
// arguments that are not a JSON object, a function role, non-function tools.
tl::expected<void, core::Error> chat_to_messages(std::string_view chat, const UpstreamRequestOptions& o,
                                                 std::string& out);

// The most max_tokens chat_to_messages sends for `chat` (RFC 8259 JSON) when
// it gives neither max_completion_tokens nor max_tokens, in tokens, without
// translating it: `default_max_tokens` (pools.X.anthropic.max_tokens) plus
// the thinking budget of its reasoning_effort (low 1024, medium 4096, high
// 16384) unless it brings its own `thinking` object. An upper bound: the
// translation leaves the budget out in a tool loop or with a forced tool
// call. What admission reserves for a fallback to an Anthropic pool.
std::uint64_t default_answer_cap(std::string_view chat, std::uint32_t default_max_tokens);

// What the gateway needs from an Anthropic Messages request that goes to an
// Anthropic upstream unchanged (POST /v1/messages, `count` false) or to its
// count_tokens (`count` true): `model`, `stream`, `max_tokens` (required for
// a message, as Anthropic requires it), the prompt's text bytes (every string
// of `system`, `messages` and `tools`) and per-message overhead. Everything
// else is the upstream's to judge. Errors are 400 invalid_request_error with
// Anthropic's "field: problem" messages (not JSON, not an object, `model`,
// `max_tokens`, `messages` missing or of the wrong type, `stream` not a
// boolean).
tl::expected<RequestFields, core::Error> read_messages_request(std::string_view body, bool count);

// The upstream target of an Anthropic pool for a chat-completions or
// Responses request: "/v1/messages".
std::string_view messages_path();

}  // namespace weir::api::anthropic
