// OpenAI/vLLM streaming specifics (OpenAI API "Create chat completion",
// `stream_options`; vLLM's OpenAI-compatible server): asking the upstream
// for the usage chunk on a client's behalf, and the per-event hook that
// reads usage and keeps that chunk from a client that did not ask for it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "api/usage.hpp"

namespace weir::api::openai {

// Writes to `out` the request body `body` with `stream_options.include_usage`
// set to true (and `continuous_usage_stats` to false when present, as the
// client had it: vLLM honours it only with include_usage), so the stream
// ends with a usage chunk. `has_stream_options`: the body has a
// `stream_options` object. Returns what was done:
// - `for_weir`: usage asked for on the client's behalf (no stream_options,
//   or an include_usage false or null): the usage chunk is Weir's, dropped
//   from the client's stream (UsageHook strip);
// - `for_client`: a stream_options without include_usage, which vLLM reads
//   as true: the client asked for usage; the member is made explicit for an
//   upstream that reads its absence as OpenAI does (no usage), and the
//   chunk is the client's;
// - `none` (out unspecified): nothing changed: the client asked for usage,
//   or gave an include_usage neither false nor null ("true", 1: the
//   upstream's to read or refuse).
// `scratch` is working storage. Every other byte is the client's.
enum class UsageAsk : std::uint8_t { none, for_weir, for_client };
UsageAsk ask_for_usage(std::string_view body, bool has_stream_options, std::string& scratch, std::string& out);

// Whether an upstream's in-band error event (its data: vLLM's and OpenAI's
// `{"error": {...}}`, vLLM's older `{"object": "error", ...}`, Anthropic's
// `{"type": "error", "error": {...}}`) refuses the client's request rather
// than reports a fault of the upstream's: its `code` a 4xx status other than
// 408 and 429 (a number, or digits in a string), or, with no status code,
// a client-error `type` (BadRequestError, invalid_request_error,
// not_found_error and the like). vLLM streams a refusal it finds while the
// engine takes the request (an invalid guided_json schema, a logprobs
// limit) after its 200 head, as the stream's first event; the same request
// unstreamed is a 400. Such an answer is the client's fault, not the
// endpoint's: no failure counted against it, no failover or resume.
bool refuses_request(std::string_view error_data);

// An OpenAI/vLLM stream's final usage chunk, by its shape: top-level
// `"choices": []` and a `usage` member, whatever the member's value (its
// counts are extract_usage's business, not this test's).
bool is_usage_only_chunk(std::string_view data);

// What one streamed chunk (an SSE event's data, not [DONE]) carries:
// `content` when a choice has text, a content/refusal/reasoning_content
// delta, tool calls or a finish_reason; `error` for an in-band
// `{"error": ...}` whose value is not null (vLLM's and OpenAI's stream error; vLLM before 0.6:
// `"object": "error"`) and for data that is no JSON object (an invalid
// stream); `empty` otherwise (vLLM's role-only first chunk, a usage-only
// chunk). Parses the chunk: used on held streams before their first
// content event, and on an event begins_like_error() picked out.
enum class ChunkKind : std::uint8_t { empty, content, error };
ChunkKind classify_chunk(std::string_view data);
// True when `data`'s first member is "error", or "object" or "type" with the
// value "error" (RFC 8259 whitespace allowed): the cheap test before
// classify_chunk(), a few bytes per event.
bool begins_like_error(std::string_view data);

// A whole chat completion (`object: "chat.completion"`) as the one
// `chat.completion.chunk` that carries all of it: each choice's `message`
// becomes its `delta` (tool calls numbered by `index`, as streamed), its
// finish_reason and usage kept. For an upstream that answered a streamed
// request with the whole body: a translated stream (Anthropic Messages,
// Responses) is made from this chunk. Returns false (out unspecified) when
// `completion` is no JSON object with a `choices` array.
bool completion_as_chunk(std::string_view completion, std::string& out);

// The per-event usage hook: fixed state, no allocation per event.
class UsageHook {
 public:
  // `strip`: Weir asked for the usage chunk (ask_for_usage); drop it from the client's stream.
  void reset(bool strip) {
    strip_ = strip;
    has_usage_ = false;
    usage_chunk_ = false;
    usage_ = {};
  }
  // Reads the `data` of one SSE event. Returns false when the event must
  // not reach the client: the usage chunk Weir asked for
  // (is_usage_only_chunk), also when its counts are invalid (then it is no
  // usage: has_usage() stays as it was).
  bool on_data(std::string_view data);
  // After on_data() passed `data` (the same chunk): when Weir asked for usage on the
  // client's behalf and an upstream put it on a chunk that also carries
  // choices (not vLLM's way: some OpenAI-compatible servers put it on the
  // finish chunk), the chunk without its `usage` member (the client sees
  // what it asked for); nullopt when the chunk goes as it came. The view
  // lives until the next call.
  std::optional<std::string_view> without_usage(std::string_view data);
  bool has_usage() const { return has_usage_; }
  // A usage-only chunk (is_usage_only_chunk) went to the client: the one a
  // stream ends with. Per-chunk usage (continuous_usage_stats) is none.
  bool usage_chunk_relayed() const { return usage_chunk_; }
  const Usage& usage() const { return usage_; }
  // Usage read elsewhere (an Anthropic upstream's events, in OpenAI's counts).
  void set(const Usage& u) {
    has_usage_ = true;
    usage_ = u;
  }

 private:
  bool strip_ = false;
  bool has_usage_ = false;
  bool usage_chunk_ = false;
  Usage usage_;
  std::string edited_;      // without_usage()'s chunk
  bool saw_usage_ = false;  // the chunk on_data() read last has a "usage" key
};

}  // namespace weir::api::openai
