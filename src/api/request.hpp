// The fields of an OpenAI API request body that the gateway acts on
// (OpenAI API reference: chat/completions, completions, embeddings).
// Everything else passes through to the upstream untouched.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

#include "core/error.hpp"

namespace boost::json {
class value;
}

namespace weir::api {

// vllm_extra: vLLM's tokenize, detokenize, rerank, score, pooling and
// classify bodies (vLLM 0.10 protocol.py): `model` optional, prompt text in
// prompt/messages/input/text/query/documents/text_1/text_2.
// audio: /v1/audio/transcriptions and /translations, multipart/form-data
// bodies (parse_audio_request; vLLM 0.10 TranscriptionRequest).
enum class ApiKind : std::uint8_t { chat_completions, completions, embeddings, vllm_extra, audio };

struct RequestFields {
  std::string model;                // "model": non-empty, or empty when the body has none (absent or null)
  bool stream = false;              // "stream": true → SSE response
  bool has_stream_options = false;  // "stream_options" present (object)
  bool include_usage = false;       // stream_options.include_usage == true
  // The client asked for the usage chunk, as vLLM (the reference) reads the
  // body: include_usage true, or a stream_options object without the member
  // (vLLM's StreamOptions defaults it to true; OpenAI reads it as false).
  bool usage_asked = false;
  std::uint32_t max_tokens = 0;  // max_completion_tokens or max_tokens; 0 = not given
  bool echo_only = false;        // completions with echo: true and max_tokens: 0 (the prompt's logprobs, no output)
  std::uint32_t n = 1;           // choices per prompt
  // Sequences generated per prompt, of which the n best are returned (vLLM's
  // best_of on chat and completions; OpenAI's legacy completions); 0 = not given.
  std::uint32_t best_of = 0;
  // Sequences the upstream generates per prompt: what a request's output
  // costs (max_tokens each), whether or not they are all returned.
  std::uint32_t sequences() const { return best_of > n ? best_of : n; }
  // UTF-8 bytes of prompt text: prompt, input, or a chat's messages (their
  // content, and their other members' strings: tool calls' names and
  // arguments, name, reasoning) and the keys and strings of its tools,
  // functions and documents; media (image, audio, video URLs and data) not.
  std::uint64_t prompt_bytes = 0;
  std::uint32_t prompt_count = 1;  // prompts in a completions/embeddings batch
  // Media parts of the prompt (an image, audio or video part of a chat message, an Anthropic image or
  // document block, a Responses input_image): tokens the bytes do not predict, which admission counts at
  // the model's media_tokens each (docs/admission.md, "Token estimate").
  std::uint32_t media_parts = 0;
  // vLLM's min_tokens (chat and completions): the EOS held back until that many tokens; 0 = not given (or not
  // a non-negative integer: the upstream's to refuse). Without max_tokens the answer is at least this long.
  std::uint32_t min_tokens = 0;
  // Prompt tokens the model server adds around the text: the chat template's
  // per-message framing (kChatTokensPerMessage each: role header, end of
  // turn, BOS and the assistant header amortized), or one BOS per prompt.
  std::uint32_t prompt_overhead_tokens = 0;
  // The body's top-level `request_id` (vLLM's extension: chat and completions take it as the request's id
  // when no X-Request-Id header names one), unescaped; empty when absent or not a string (such a value goes
  // as it came: the upstream's to refuse). At most its first kRequestIdKept bytes: a longer one is no id
  // Weir takes (gateway::valid_request_id: 128 at most), so no more of it is held.
  std::string request_id;
  // /v1/messages: the request's thinking.type is "enabled" or "adaptive", so the answer gives the model's
  // reasoning as thinking blocks (Anthropic gives none otherwise: docs/protocols.md).
  bool thinking = false;

  static constexpr std::uint32_t kChatTokensPerMessage = 8;
  static constexpr std::size_t kRequestIdKept = 129;
};

// Parses and validates `body` (RFC 8259 JSON) for `kind`. Errors (400,
// OpenAI's invalid_request_error): not JSON, not an object, `model` missing or
// not a string, `stream` not a boolean, `stream_options` not an object,
// `max_tokens`/`n`/`best_of` not positive integers (as vLLM's pydantic models
// read an int in lax mode: an integral number, 2.0 too, or a string that
// lax_int reads: api/lax_int.hpp), a member Weir reads given twice
// (api/member_names.hpp read_member_index; repeated_member_error). The body itself is not modified.
// (ApiKind::audio bodies are not JSON: parse_audio_request.)
tl::expected<RequestFields, core::Error> parse_request(ApiKind kind, std::string_view body);

// Parses a speech-to-text request: `content_type` is the request's
// Content-Type (multipart/form-data with a boundary), `body` the form
// (RFC 7578). Reads `model` (optional, as on vLLM's extra routes: absent →
// the default pool), `stream` and `stream_include_usage` (form booleans:
// true/false, 1/0, yes/no, on/off, any case), and `prompt` (its bytes are
// prompt text). Errors (400 invalid_request_error, `param` named): not
// multipart, a malformed form, no `file` part, an empty `model`, a bad boolean,
// `model`, `stream` or `stream_include_usage` given twice.
tl::expected<RequestFields, core::Error> parse_audio_request(std::string_view content_type, std::string_view body);

// True when every number in `v` (nested to any depth) is finite. A
// translated body is rebuilt from Boost.JSON's DOM, where a literal such as
// 1e400 became ±infinity: serialized again it would be `Infinity`, which is
// not JSON (RFC 8259 §6), so the translators refuse such a body with a 400.
bool numbers_finite(const boost::json::value& v);

// A form boolean as vLLM's FastAPI/pydantic reads it; nullopt when it is none.
std::optional<bool> form_bool(std::string_view v);

}  // namespace weir::api
