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
// because a translated stream always asks for the usage chunk. Errors are 400
// invalid_request_error with `param` the top-level field at fault (`input`,
// `tools`, `previous_response_id`, …) and the full path in the message
// (`input[2].content[0].type: …`); `out` and `echo` are then unspecified.
tl::expected<RequestFields, core::Error> translate_request(std::string_view body, std::string& out, std::string& echo);

}  // namespace weir::api::responses
