// vLLM's OpenAI-compatible wire format, as weir-mock emits it.
//
// Follows vLLM v0.10.1 (vllm/entrypoints/openai/protocol.py, serving_chat.py,
// serving_completion.py, serving_embedding.py; the first release with the
// nested {"error": {...}} error object, vLLM PR #22099). Chunk JSON matches
// pydantic's model_dump_json the way vLLM calls it: chat chunks with
// exclude_unset=True, completion chunks with exclude_unset=False, the final
// usage chunk with exclude_none=True, non-streaming bodies with model_dump().
//
// Text is deterministic: token `pos` of choice `c` is a word picked by a hash
// of the prompt, c and pos (token_text). Token counts follow the rule in
// tools/mock/README.md ("Token counts").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config.hpp"
#include "util.hpp"

namespace weir::mock {

// The three generation endpoints.
enum class Endpoint : std::uint8_t { chat, completion, embedding };

// An error to answer in vLLM's shape: {"error":{"message","type","param","code"}}.
struct ApiError {
  int status = 400;     // HTTP status, also error.code
  std::string message;  // error.message
};

// One validated generation or embedding request: everything needed to emit
// its bytes at each step. Reused across requests on a connection (clear()).
struct Plan {
  Endpoint endpoint = Endpoint::chat;
  bool stream = false;
  int n = 1;       // choices per prompt
  int tokens = 1;  // the message's length per choice in tokens (its end position), > start
  // Chat with continue_final_message (vLLM's chat-template parameter) and a
  // final assistant message: the tokens that message already holds. The
  // generation continues at this position (token `start` is the first one
  // produced), so a continuation of an unbroken run's prefix produces
  // exactly the rest of that run. 0 otherwise.
  int start = 0;
  bool cut_by_length = false;                // finish_reason "length" (the request's limit cut it) else "stop"
  bool include_usage = false;                // final usage chunk (stream_options.include_usage)
  bool continuous_usage = false;             // usage on every chunk (stream_options.continuous_usage_stats)
  std::vector<std::uint64_t> prompt_hash;    // per prompt (chat: exactly one)
  std::vector<std::uint32_t> prompt_tokens;  // per prompt, tokens
  std::uint64_t total_prompt_tokens = 0;
  std::string model;         // model name as received or resolved (raw, for x-mock-model)
  std::string chunk_prefix;  // `{"id":...,"choices":[{"index":` shared by every chunk
  std::string usage_prefix;  // `{"id":...,"choices":[],"usage":` for the final usage chunk
  std::string body_head;     // `{"id":...,"object":...,"created":...,"model":"..."` of the full body
  std::string role_json;     // chat: response role, JSON-escaped
  int dimensions = 16;       // embeddings: floats per vector
  bool base64 = false;       // embeddings: encoding_format == "base64"
  // Chat only, set from x-mock-* headers (tools/mock/README.md):
  int reasoning_tokens = 0;             // the first N tokens go out as `reasoning_content`
  int tool_calls = 0;                   // tool calls after the text (finish_reason "tool_calls")
  std::vector<std::string> tool_names;  // the request's tools[].function.name, in order
  std::string stop_string;              // the request's first `stop` string (for x-mock-stop-hit)
  bool stop_hit = false;                // end on `stop_string`: finish_reason "stop", stop_reason "<it>"

  // Number of choices in the response: prompts * n.
  int choices() const { return static_cast<int>(prompt_hash.size()) * n; }
  // Tokens produced per choice (from `start` to `tokens`).
  int produced() const { return tokens - start; }
  std::uint64_t completion_tokens() const {
    return static_cast<std::uint64_t>(choices()) * static_cast<std::uint64_t>(produced());
  }
  void clear();
};

// Parses and validates `body` (the raw request bytes) for `ep` into `plan`.
// `request_id` is the X-Request-Id header (vLLM uses it as the response id
// suffix when present). Returns the vLLM error to answer on failure: 400 for
// malformed JSON and validation errors, 404 for an unknown model.
std::optional<ApiError> build_plan(Endpoint ep, std::string_view body, std::string_view request_id,
                                   const MockConfig& cfg, Rng& rng, Plan& plan);

// The text of token `pos` of choice `choice` for a prompt hash: one word with
// a leading space, e.g. " river". Pure function.
std::string_view token_text(std::uint64_t prompt_hash, int choice, int pos);

// Appends one SSE event `data: <json>\n\n` framed as one HTTP/1.1 chunk
// (RFC 9112 §7.1), the way uvicorn frames each body message.
void append_sse_chunk(std::string& out, std::string_view json);

// Appends the SSE chunks of streaming step `step` (0-based token position in
// the message, from plan.start) of `plan` to `out`: at step plan.start the chat role chunks, then one token chunk per
// choice; at the last step also the final usage chunk (if asked), `data:
// [DONE]` and the chunked-encoding terminator. `scratch` is a reusable buffer.
// `end` false: the last step without the usage chunk, [DONE] and the
// terminator (a stream cut right after its last token). `stamp_ns` >= 0:
// the first token chunk (choice 0 at plan.start) carries `"mock_ns":
// stamp_ns` as its first member (--stamp).
void append_stream_step(const Plan& plan, int step, std::string& scratch, std::string& out, bool end = true,
                        std::int64_t stamp_ns = -1);

// Appends the non-streaming JSON body (chat.completion, text_completion, or
// the embedding list) to `out`; `stamp_ns` >= 0: with `"mock_ns": stamp_ns`
// as its first member (--stamp).
void append_full_body(const Plan& plan, std::string& out, std::int64_t stamp_ns = -1);

// vLLM's error body for `status` and `message`; `type` defaults to
// error_type(status). (vLLM's HTTPException handler uses the reason phrase,
// e.g. "Not Found", as the type.)
std::string error_body(int status, std::string_view message, std::string_view type = {});

// vLLM's error.type for a status: "BadRequestError", "NotFoundError",
// "InternalServerError", otherwise the reason phrase without spaces + "Error".
std::string error_type(int status);

// The HTTP reason phrase for a status ("OK", "Not Found", ...).
std::string_view reason_phrase(int status);

// POST /tokenize (vLLM's TokenizeRequest: `prompt`, or chat `messages`):
// writes {"count","max_model_len","tokens","token_strs":null} to `out`, with
// the prompt-token rule of the generation endpoints. Errors as build_plan.
std::optional<ApiError> tokenize_body(std::string_view body, const MockConfig& cfg, std::string& out);

// vLLM's other non-generating routes (vLLM 0.10 protocol.py): POST
// /detokenize {tokens} → {prompt}; /rerank, /v1/rerank, /v2/rerank {query,
// documents, top_n?} → {id, model, usage{total_tokens}, results[{index,
// document{text}, relevance_score}]} best first; /score, /v1/score {text_1,
// text_2} → {id, object:"list", created, model, data[{index, object:"score",
// score}], usage}; /pooling and /classify {input} → data per input
// ({object:"pooling", data:[floats]} / {label, probs, num_classes}), usage.
// Word counts are the tokens; scores are deterministic in the texts.
// Returns nullopt for a path it does not serve (in `handled` false).
std::optional<ApiError> extra_route_body(std::string_view path, std::string_view body, const MockConfig& cfg,
                                         std::int64_t created, std::string& out, bool& handled);

// POST /v1/audio/transcriptions and /v1/audio/translations (vLLM 0.10's
// TranscriptionRequest, a multipart/form-data body with `file`, `model`,
// `response_format`, `stream`, `stream_include_usage`). The "transcript" is
// "heard N bytes of FILENAME" followed by the `prompt` field's words (so a
// test sees the form arrived whole). Writes to `out` and sets
// `content_type`: {"text", "usage":{"type":"duration","seconds"}} for json
// (the default) and verbose_json (with language, duration, segments:[]),
// the text alone as text/plain for text, srt and vtt; with stream=true an SSE
// body of transcription.chunk events, one per word, a finish_reason "stop"
// on the last, a usage chunk (choices:[]) when stream_include_usage, then
// [DONE]. Errors: 400 for a body that is not a form or has no file, 404
// for a model it does not serve.
std::optional<ApiError> audio_body(std::string_view path, std::string_view content_type_in, std::string_view body,
                                   const MockConfig& cfg, std::int64_t created, std::string& out,
                                   std::string& content_type);

// GET /v1/models body: vLLM's ModelList with one ModelCard per --model.
std::string models_body(const MockConfig& cfg, std::int64_t created, Rng& rng);

// Appends `s` JSON-escaped (without quotes) to `out`.
void append_json_escaped(std::string& out, std::string_view s);

}  // namespace weir::mock
