// Anthropic Messages API requests (Anthropic API reference: "Messages",
// POST /v1/messages, and "Count Message tokens", POST
// /v1/messages/count_tokens) translated into the OpenAI chat-completions
// body a vLLM upstream takes (POST /v1/chat/completions, or vLLM's POST
// /tokenize for a count). Every mapping, and every field left out, is
// listed in docs/protocols.md ("Anthropic Messages").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

#include "api/request.hpp"
#include "core/error.hpp"

namespace weir::api::anthropic {

// What the upstream is asked for: a generation (chat completions) or a
// token count (vLLM's /tokenize with `messages`).
enum class Target : std::uint8_t { messages, count_tokens };

// The upstream path for `t`: "/v1/chat/completions" or "/tokenize".
std::string_view upstream_path(Target t);

// Translates the Anthropic request `body` (RFC 8259 JSON) into the upstream
// body, written to `out` (overwritten; its capacity is reused). Returns the
// fields admission and the gateway act on: `model`, `stream`, `max_tokens`
// (required for `messages`, not for `count_tokens`), the prompt's text bytes
// and per-message overhead, and `thinking` (thinking.type enabled, adaptive
// or between_tools: the answer keeps the server's reasoning as thinking
// blocks); `include_usage` is set because a translated stream always asks
// for the usage chunk. `vllm` (the pool's continuous_usage: on for a
// self-hosted, http:// server, off for a hosted API, which refuses unknown
// members) says the upstream takes vLLM's extensions: only then does a
// generation carry `stream_options.continuous_usage_stats` (usage on every
// chunk, so message_start has the prompt's count), `chat_template_kwargs`
// (`thinking`'s enable_thinking), `top_k`, and a prefill's
// `continue_final_message`/`add_generation_prompt`; without it those are
// left out (a prefill is then the conversation's last message, which the
// model answers after). A count (vLLM's /tokenize) always carries them. Anthropic's structured output
// (`output_config.format`, the beta's `output_format`: {type: json_schema,
// schema}) becomes `response_format` json_schema (strict) for a generation.
// Errors are 400
// invalid_request_error with Anthropic's "field: problem" messages (missing
// `model`/`max_tokens`/`messages`, a wrong type, an unknown role, a content
// block Weir cannot translate, a structured output that is not a json_schema
// with an object schema); `out` is then unspecified.
tl::expected<RequestFields, core::Error> translate_request(Target t, std::string_view body, std::string& out,
                                                           bool vllm = false);

}  // namespace weir::api::anthropic
