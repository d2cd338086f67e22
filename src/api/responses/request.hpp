// OpenAI Responses API requests (OpenAI API reference: "Responses", POST
// /v1/responses, with `store: false` semantics: no response is kept)
// translated into the chat-completions body a vLLM upstream takes (POST
// /v1/chat/completions, vLLM 0.10.1). Every mapping, and every field left
// out, is listed in docs/protocols.md ("OpenAI Responses").
#pragma once

#include <string>
#include <string_view>

#include <tl/expected.hpp>

#include "api/request.hpp"
#include "core/error.hpp"

namespace weir::api::responses {

// The upstream path a Responses request is translated to: "/v1/chat/completions".
std::string_view upstream_path();

// Translates the Responses request `body` (RFC 8259 JSON) into the upstream
// chat-completions body, written to `out` (overwritten; its capacity is
// reused). `echo` (overwritten) gets the request's members of the Response
// object, serialized without braces and without a leading comma
// (`"instructions":…,"tools":[…],…,"store":false`): the answer repeats them,
// as OpenAI's does. Returns the fields admission and the gateway act on:
// `model`, `stream`, `max_tokens` (from `max_output_tokens`; 0 when absent),
// the prompt's text bytes and per-message overhead; `include_usage` is set
// because a translated stream always asks for the usage chunk. `vllm` says
// the upstream is self-hosted (vLLM's extensions, the older names): the
// pool's continuous_usage decision (pools.X.continuous_usage, `auto`: every
// endpoint http://); false, a hosted API (an https:// endpoint, or a type:
// anthropic pool's chat step), which refuses members it does not know. It
// decides: max_output_tokens as max_tokens (vLLM) or max_completion_tokens
// (hosted: OpenAI's reasoning models refuse max_tokens); reasoning.effort
// only low, medium or high for vLLM (400 otherwise), any string for a hosted
// API; vLLM's own members (top_k, min_p, repetition_penalty, min_tokens,
// stop_token_ids, ignore_eos, skip_special_tokens,
// include_stop_str_in_output, cache_salt, priority, chat_template_kwargs,
// mm_processor_kwargs) sent as they came to vLLM only, OpenAI's service
// members (service_tier, safety_identifier, prompt_cache_key,
// prompt_cache_retention) to a hosted API only; seed, stop, logit_bias,
// frequency_penalty and presence_penalty to either. `include` with
// "message.output_text.logprobs" is chat's logprobs: true (with
// top_logprobs, 0 to 20, when above 0). Errors are 400
// invalid_request_error with `param` the top-level field at fault (`input`,
// `tools`, `previous_response_id`, …) and the full path in the message
// (`input[2].content[0].type: …`); `out` and `echo` are then unspecified.
tl::expected<RequestFields, core::Error> translate_request(std::string_view body, std::string& out, std::string& echo,
                                                           bool vllm = true);

}  // namespace weir::api::responses
