// The generated text an answer carried, in bytes: what a request is charged for when its upstream
// reported no usage (docs/admission.md, "No usage reported"), at 4 bytes a token as the prompt is
// estimated (admission::TokenEstimate). No DOM, no allocation.
#pragma once

#include <cstddef>
#include <string_view>

namespace weir::api {

// The UTF-8 bytes of the generated text in one streamed event's data (a JSON object's text), as the
// client reads it (escapes decoded: `\n` is 1 byte, `\u00e9` 2, `\u4e2d` 3):
//   - an OpenAI chat chunk's `delta` (each choice's): its `content`, `reasoning_content`, `reasoning`,
//     `refusal`, and its tool calls' `name` and `arguments`;
//   - an OpenAI completions chunk's choices' `text`;
//   - an Anthropic `content_block_delta`'s `delta`: `text`, `partial_json`, `thinking` (a
//     `signature_delta` is no text).
// Other members (ids, roles, logprobs, usage) are not counted. 0 for data that is no such event or is
// malformed past what is counted. Cost: one SIMD search for `"delta"` over the data (core::find_substring;
// a completions chunk, without one, a second for `"text"`), then a byte loop over the delta objects only.
std::size_t event_text_bytes(std::string_view data);

// The same count for the next content event of one stream, cheaply: `frame` (std::string_view::npos before the
// stream's first event) is the bytes of the data that were not text in the last event counted whole. Events of
// one stream differ in little but their text (the same id, model and members: vLLM's, OpenAI's, Anthropic's
// deltas), so an event whose data is 0 to kFrameSlack bytes over that frame is taken to carry that many bytes
// of text, with no look at it (one compare: the common 1-token event of a self-hosted server). Any other (the
// first, a shorter one, one carrying more: many tokens, another shape such as reasoning or a tool call after
// text) is counted whole as event_text_bytes does, and its frame becomes `frame`; after an event whose text
// came escaped (`\u4e2d`) or twice (vLLM's `reasoning_content` beside `reasoning`), where bytes over the
// frame are not the text's bytes, `frame` is npos and the next is counted whole too. A shape up to
// kFrameSlack bytes larger is taken as text: at most 8 bytes (2 tokens) over an event.
std::size_t event_text_bytes(std::string_view data, std::size_t& frame);
inline constexpr std::size_t kFrameSlack = 8;

// The same count over a whole answer (a JSON object's text, non-streamed): the string values of the
// members named above anywhere in it (a chat completion's `message`s, a completion's `text`s, an
// Anthropic message's `content` blocks' `text` and `thinking`, a Responses answer's output `text` and
// `arguments`), and the JSON text of an Anthropic `tool_use` block's `input`, in bytes. Cost: one byte
// loop over the body; run only for a 2xx answer without usage.
std::size_t answer_text_bytes(std::string_view json);

// Tokens for `bytes` of generated text: ceil(bytes / 4), the prompt estimate's rate.
constexpr std::size_t text_tokens(std::size_t bytes) noexcept { return (bytes + 3) / 4; }

}  // namespace weir::api
