// Micro-batching of OpenAI completions on vLLM's wire (OpenAI API "Create
// completion"; vLLM serving_completion.py, v0.10): which requests may share
// one upstream request, the batch's body (one prompt list), and the
// byte-exact pieces of each chunk the demultiplexer needs to give every
// member its own stream (batching/batch.hpp).
//
// vLLM streams a prompt list as one stream whose chunks each carry one
// choice, `index = prompt_idx * n + i`, all under one response id; with
// `stream_options.continuous_usage_stats` every chunk also carries the usage
// of its own prompt and choice (prompt_tokens of that prompt, completion
// tokens of that choice so far), and the stream ends with one usage chunk
// summing all prompts. Batches are formed only of requests with n = 1, so a
// chunk's index is its member's position.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "api/json_scan.hpp"

namespace weir::api::openai {

// Decides whether the completions body `body` (valid JSON, as it would go
// upstream: model renamed, stream_options spliced) may join a micro-batch.
// If so, writes its compatibility key to `key` and returns its prompt's JSON
// text (a string, quotes included). The key is the body without `prompt`
// and `user`: two requests merge only when every other byte is the same
// (same members, values, order and spelling), so identical sampling
// parameters, model, stream and stream_options. Never merged (nullopt):
// `prompt` not one string (a list or token ids), `n` other than 1,
// `best_of`, `echo`, `logprobs`, `prompt_logprobs` or `suffix` present and
// not null/false, members the batch sets or drops that vLLM would refuse
// unbatched (`user` not a string; `stream_options` without `"stream": true`,
// or with other members than boolean include_usage/continuous_usage_stats),
// a non-streaming request with a member set (not null or false) other than
// the sampling and output parameters that leave vLLM's non-streamed answer
// its shape (its answer is assembled from the batch's stream in that shape:
// CompletionAssembler; `return_token_ids`, `kv_transfer_params` or a member
// Weir does not know could add to it what the stream cannot give back), and
// bodies that are not objects.
std::optional<std::string_view> completion_batch_key(std::string_view body, std::string& key);

// Writes to `out` the batch's upstream body: `key` (its first member's key)
// with `prompt` set to the list of `prompts` (JSON strings, member order),
// `"stream": true`, and `stream_options` {"include_usage": true,
// "continuous_usage_stats": true} (each member's usage then comes on its own
// chunks). `scratch` is working storage.
void build_completion_batch(std::string_view key, std::span<const std::string_view> prompts, std::string& scratch,
                            std::string& out);

// Decides whether the chat or completions body `body` (valid JSON, as it
// would go upstream) may share another identical request's generation
// (request coalescing, pools.X.coalesce). If so, writes its key to `key`:
// the body without `user` and `stream_options` (client-only: the upstream
// generates the same tokens whatever they say). Only deterministic requests
// coalesce: `temperature` 0 or a `seed` given (not null). Never when
// `stream_options.continuous_usage_stats` is asked for (the generation's
// per-chunk usage is its leader's choice), nor with `user` or
// `stream_options` that vLLM would refuse (as for completion_batch_key), or
// on bodies that are not objects. Never with a (not null)
// `kv_transfer_params` or `ec_transfer_params` (vLLM's disaggregated
// serving): the answer is then that request's own state (the KV or encoder
// cache blocks left for one decoder to pull), not a function of the body.
// The other members of vLLM's ChatCompletionRequest and CompletionRequest
// leave the answer a function of the body (`request_id` names the answer's
// id, which each member gets as its own; `priority`, `cache_salt`,
// `return_token_ids` change nothing it says between identical bodies).
bool coalesce_key(std::string_view body, std::string& key);

// Writes to `out` a coalesced generation's upstream body: `body` (its first
// member's) with `user` removed and, for a stream, `stream_options`
// {"include_usage": true} (every member's usage is the generation's).
// `scratch` is working storage.
void build_coalesced(std::string_view body, bool stream, std::string& scratch, std::string& out);

// Appends to `out` the JSON object `data` with its top-level "id" set to
// `id_json`; `data` unchanged when it has none or is not an object.
void append_with_id(std::string_view data, std::string_view id_json, std::string& out);

// One chunk of a batched completions stream (an SSE event's data, not
// [DONE]), as the demultiplexer reads it. Offsets are into the chunk.
struct BatchChunk {
  enum class Kind : std::uint8_t {
    choice,  // one choice: the member at `index`
    usage,   // `"choices": []` with the usage summed over every prompt
    error,   // an in-band error (vLLM's {"error": ...}, no choices): every member's
    empty,   // `"choices": []` and no usage: no member's
    other,   // anything else (not a JSON object, a choice without a readable
             // index): no member can be given it; the batch has failed
  };
  Kind kind = Kind::other;
  std::uint32_t index = 0;                // choice: choices[0].index
  std::optional<MemberSpan> id;           // top-level "id"
  std::optional<MemberSpan> created;      // top-level "created"
  std::optional<MemberSpan> model;        // top-level "model"
  std::optional<MemberSpan> usage;        // top-level "usage" (a choice's own with continuous_usage_stats)
  ValueSpan index_value;                  // choice: the index number
  std::optional<MemberSpan> text;         // choice: its "text" (a JSON string)
  std::optional<MemberSpan> finish;       // choice: its "finish_reason"
  std::optional<MemberSpan> stop_reason;  // choice: its "stop_reason"
};
// Reads `data`. A chunk whose choices[0] has no integer index (missing,
// negative, a string, a float, null, over 2^32-1), or that has more than
// one choice, is `other`: its text is some member's (or several members'),
// and no one member can be given it whole.
BatchChunk parse_batch_chunk(std::string_view data);

// Appends to `out` the chunk `data` (parsed as `c`) as one member gets it:
// "id" set to `id_json`, a choice's index to 0, and "usage" to `usage_json`
// (empty: unchanged). Every other byte is the upstream's.
void append_member_chunk(std::string_view data, const BatchChunk& c, std::string_view id_json,
                         std::string_view usage_json, std::string& out);

// Appends to `out` the usage object `total` (the upstream's final usage
// chunk's, over every prompt of a batch of several) with prompt_tokens,
// completion_tokens and total_tokens taken from `own` (a member's last
// per-chunk usage), so the member's usage has the final chunk's shape, and
// without `prompt_tokens_details` and `completion_tokens_details`: those
// are not the member's. (vLLM's cached_tokens there is one prompt's, its
// first result's, whichever member that is: serving_completion.py,
// completion_stream_generator. A member credited with it could be charged
// less than its cost; without it, it is charged its prompt at the full
// input price, never less than its cost.) Returns false (out unchanged)
// when either is not an object with those numbers.
bool append_member_usage(std::string_view total, std::string_view own, std::string& out);

// Appends to `out` the final usage chunk vLLM sends a request whose last
// choice has finished, built from that member's finishing chunk `data`
// (parsed as `c`, with its own per-chunk usage): "id" set to `id_json`,
// "choices" to [] and "usage" to its usage without null members (the final
// chunk is serialized with exclude_none). Returns false (out unchanged) when
// the chunk carries no usage object.
bool append_usage_chunk(std::string_view data, const BatchChunk& c, std::string_view id_json, std::string& out);

// The response id a member gets: the upstream's `upstream_id_json` (a JSON
// string) with its suffix `batch_request_id` (vLLM's id is "cmpl-" + the
// X-Request-Id it was sent) replaced by `member_request_id`, which is the id
// vLLM gives the same request unbatched; else the upstream's id with
// "-<slot>" appended. Appends a JSON string to `out`.
void append_member_id(std::string_view upstream_id_json, std::string_view batch_request_id,
                      std::string_view member_request_id, std::uint32_t slot, std::string& out);

// A non-streaming member's answer, assembled from its chunks of the batch's
// stream in vLLM's CompletionResponse shape (v0.10:
// {id, object, created, model, choices[{index, text, logprobs, finish_reason,
// stop_reason, prompt_logprobs}], service_tier, system_fingerprint, usage,
// kv_transfer_params}). The text's escapes are the upstream's bytes.
class CompletionAssembler {
 public:
  void reset();
  // One of this member's chunks (kind choice), rewritten already or not.
  void on_chunk(std::string_view data, const BatchChunk& c);
  // The upstream's final usage object `total` of a batch this member was
  // alone in: its own usage, with the prompt_tokens_details (cached tokens)
  // vLLM puts only there. The answer's usage keeps its per-chunk shape (as
  // vLLM's non-streamed usage, "prompt_tokens_details": null when nothing
  // was cached) with total's details, or is `total` when no chunk had usage.
  void on_own_total(std::string_view total);
  // Appends the whole body, with `id_json` as its id.
  void finish(std::string_view id_json, std::string& out) const;
  // Chunks seen.
  std::uint32_t chunks() const { return chunks_; }

 private:
  std::string text_;  // JSON-escaped text, without quotes
  std::string created_, model_, finish_, stop_reason_, usage_;
  std::uint32_t chunks_ = 0;
};

}  // namespace weir::api::openai
