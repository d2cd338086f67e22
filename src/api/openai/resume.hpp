// Resuming a chat-completions stream whose upstream broke mid-way
// (pools.X.resume, docs/upstreams.md#resume-mid-stream): what Weir notes of
// the stream as it passes (the assistant text and tokens the client has,
// the stream's id, created and model), the continuation request built from
// the original body (vLLM's chat-template parameters continue_final_message
// and add_generation_prompt, OpenAI API "Create chat completion"), and the
// rewrite of the continuation's chunks into the original stream (one id,
// no second role chunk, usage summed over the attempts).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace weir::api::openai {

// What one chunk of the original stream said, for the resume decision.
enum class ChunkNote : std::uint8_t {
  other,    // a role chunk, a usage chunk, text: nothing that rules a resume out
  error,    // an in-band `{"error": ...}` event (vLLM's mid-stream error)
  blocked,  // tool calls, reasoning, a choice other than index 0: a resume could not continue it
};

// Per-stream notes, fed every data chunk (not [DONE]) while the pool has
// resume on; nothing is kept otherwise. Fixed state plus two strings whose
// capacity is kept across requests: the content text as it came (escaped
// JSON string contents, concatenated: no decoding per chunk) and the ids.
class ResumeTracker {
 public:
  // A new request: forgets everything; `reserve_bytes` for the text.
  void reset(std::size_t reserve_bytes);
  // Reads one chunk's data (`{...}` JSON text, not [DONE]). Cost: a few
  // top-level member scans (api/json_scan.hpp), no parse, no allocation
  // beyond the text's growth.
  ChunkNote on_chunk(std::string_view data);

  // Nothing rules a continuation out: no tool call, reasoning or other choice,
  // and no finish_reason yet. With content() it is a continuation; without, a
  // plain resend of the request (nothing but a role chunk reached the client).
  bool resumable() const { return !blocked_ && !finished_; }
  // Content (assistant text, or completion tokens counted by usage) reached the client.
  bool content() const { return tokens_ > 0 || !text_.empty(); }
  // A chunk other than an in-band error was noted: the client has the stream's first (role) chunk.
  bool noted() const { return noted_; }
  // A finish_reason went to the client: the generation was over when the stream broke.
  bool finished() const { return finished_; }
  bool blocked() const { return blocked_; }
  // The assistant content so far as JSON string contents (escapes kept, no quotes).
  std::string_view text_json() const { return text_; }
  // Completion tokens so far: content chunks (vLLM sends one per token), or
  // the latest usage.completion_tokens when chunks carry usage
  // (stream_options.continuous_usage_stats).
  std::uint64_t tokens() const { return tokens_; }
  // The first chunk's `id`, `created` and `model` values as JSON text ("" before it).
  std::string_view id_json() const { return {ids_.data(), id_end_}; }
  std::string_view created_json() const { return std::string_view(ids_).substr(id_end_, created_end_ - id_end_); }
  std::string_view model_json() const { return std::string_view(ids_).substr(created_end_); }

 private:
  std::string text_;
  std::string ids_;  // id, created and model values, back to back
  std::size_t id_end_ = 0;
  std::size_t created_end_ = 0;
  std::uint64_t tokens_ = 0;
  bool have_ids_ = false;
  bool noted_ = false;
  bool blocked_ = false;
  bool finished_ = false;
};

enum class Continuation : std::uint8_t {
  ok,           // `out` holds the continuation body
  exhausted,    // max_tokens / max_completion_tokens are used up: finish the stream instead
  unsupported,  // the body or the text cannot be continued (not an object, no messages array, bad text, ...)
};

// The continuation request for a chat-completions `body` (the JSON the
// broken attempt sent upstream) whose stream gave the client `text_json`
// (escaped JSON string contents, as ResumeTracker keeps them) in
// `tokens_done` completion tokens: the same body with
//   - `{"role":"assistant","content":TEXT}` appended to `messages` (or TEXT
//     appended to a final assistant message the client was continuing
//     already, with continue_final_message true),
//   - "continue_final_message": true, "add_generation_prompt": false,
//   - max_tokens, max_completion_tokens lowered by tokens_done (and
//     min_tokens, not below 0); `echo` removed (the prefix is not the client's to see again).
// Every other member keeps its value (parsed and serialized by Boost.JSON:
// key order and values kept, whitespace and number spelling may change).
// `out` is overwritten.
Continuation continuation_body(std::string_view body, std::string_view text_json, std::uint64_t tokens_done,
                               std::string& out);

// True when a chat-completions request `body` asks for something a
// continuation cannot reproduce: `logprobs` true, `top_logprobs`,
// `prompt_logprobs`, `n` other than 1, or structured output (a
// `response_format` other than {"type": "text"}, vLLM's `guided_*`,
// `structured_outputs`, `structural_tag`), `echo` (vLLM streams the
// prefill back first), or `continue_final_message` / `add_generation_prompt`
// given as anything but a JSON boolean (vLLM's pydantic reads "true" and 1
// as true), a scan of the top-level members.
bool resume_excluded(std::string_view body);

// What rewrite_chunk did with a chunk of the continuation stream.
enum class Rewrite : std::uint8_t {
  keep,     // pass `data` as it is
  changed,  // pass `out` instead
  drop,     // the continuation's role-only first chunk: the client had it from the first attempt
};

// A chunk of the continuation stream (`data`, not [DONE]) as the client's
// stream goes on: its `id`, `created` and `model` set to `id_json`,
// `created_json`, `model_json` (JSON values; an empty one is left as it
// is) where they differ; a usage object (the final usage chunk, or
// per-chunk usage) moved to the whole generation: `tokens_before`
// completion tokens came before this attempt, and the continuation counted
// them in its prompt, so prompt_tokens − tokens_before, completion_tokens +
// tokens_before (total_tokens unchanged). A chunk whose only delta is the
// role is dropped. Unparsable chunks are kept. `scratch` is working storage.
Rewrite rewrite_chunk(std::string_view data, std::string_view id_json, std::string_view created_json,
                      std::string_view model_json, std::uint64_t tokens_before, std::string& out, std::string& scratch);

}  // namespace weir::api::openai
