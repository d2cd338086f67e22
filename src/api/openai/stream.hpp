// OpenAI/vLLM streaming specifics (OpenAI API "Create chat completion",
// `stream_options`; vLLM's OpenAI-compatible server): asking the upstream
// for the usage chunk on a client's behalf, and the per-event hook that
// reads usage and keeps that chunk from a client that did not ask for it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/json_scan.hpp"
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
// delta (content a non-empty string, or a non-empty list of parts as Mistral
// sends it), tool calls or a finish_reason; `error` for an in-band
// `{"error": ...}` whose value is not null (vLLM's and OpenAI's stream error; vLLM before 0.6:
// `"object": "error"`) and for data that is no JSON object (an invalid
// stream); `empty` otherwise (vLLM's role-only first chunk, a usage-only
// chunk). Parses the chunk: used on held streams before their first
// content event (a held stream's refusal or invalid first event falls back),
// and on an event begins_like_error() picked out.
enum class ChunkKind : std::uint8_t { empty, content, error };
ChunkKind classify_chunk(std::string_view data);
// Whether a chunk carries content, without a parse: the first-token test of a
// stream that is not held, where only `content` or not matters (an in-band
// error is begins_like_error()'s, and an invalid chunk is relayed as it came).
// True when a member named content, refusal, reasoning_content, reasoning or
// text has a value other than "", [] or null, tool_calls one other than [] or
// null, or finish_reason one other than null. It answers as classify_chunk()
// does (`content` or not) for every chunk whose content members sit where
// OpenAI's and vLLM's do (a choice, its delta); a member of those names
// elsewhere is taken for content (never a token missed). Data with a backslash
// (an escaped name could hide one) is classified by classify_chunk(). Cost:
// one memchr per member and a compare of its name, ~500 instructions for a
// 230-byte chunk where classify_chunk() costs ~3,000.
bool looks_like_content(std::string_view data);
// A chunk that carries completion tokens: `content` (classify_chunk) for
// more than a finish_reason, i.e. a choice with text, a content, refusal or
// reasoning delta, or tool calls. A finish chunk with an empty delta
// (`"delta":{}` or `"text":""` with its finish_reason) carries none: the
// fallback count of a stream without usage (one token per content event)
// leaves it out. Parses the chunk.
bool chunk_has_tokens(std::string_view data);
// The cheap test before chunk_has_tokens() on every event of a stream: false
// when no "finish_reason" member of `data` has a value other than null (a
// content chunk as vLLM and OpenAI write it), so the chunk is no finish and
// counts as a token event without a parse. (A false true only costs the parse.)
bool may_be_finish_only(std::string_view data);
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

// The per-event usage hook: fixed state, no allocation per event (one per
// new choice index of a stream with per-chunk usage, kept across streams).
//
// Usage comes in two shapes. The request's total is on a chunk with no
// choice: vLLM's final usage-only chunk (`"choices": []`). With vLLM's
// `stream_options.continuous_usage_stats` every chunk with a choice also
// carries a usage, but only that choice's (serving_chat, serving_completion):
// its prompt's prompt_tokens and the choice's completion tokens so far. Such
// per-choice counts are summed (the last of each choice index, each prompt
// once), never taken for the request's total: a stream that ends before its
// usage-only chunk would otherwise be counted as one choice of one prompt.
class UsageHook {
 public:
  // `strip`: Weir asked for the usage chunk (ask_for_usage); drop it from the client's stream.
  // `choices_per_prompt`: the request's n (at least 1): vLLM numbers a
  // stream's choices prompt by prompt (index = prompt × n + choice), so the
  // choices of one prompt share its prompt_tokens.
  // `prompts`: the request's prompts (at least 1; a /v1/completions prompt
  // list's length), for every_prompt().
  void reset(bool strip, std::uint32_t choices_per_prompt = 1, std::uint32_t prompts = 1) {
    strip_ = strip;
    whole_ = false;
    usage_chunk_ = false;
    invalid_ = false;
    usage_ = {};
    partial_ = {};
    choices_per_prompt_ = choices_per_prompt ? choices_per_prompt : 1;
    prompts_ = prompts ? prompts : 1;
    choices_.clear();  // (its capacity stays: no allocation on the next stream)
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
  // what it asked for), written in `out` (the caller's scratch: an open
  // stream carries none of its own); nullopt when the chunk goes as it
  // came. The view is into `out`.
  std::optional<std::string_view> without_usage(std::string_view data, std::string& out) const;
  // A chunk carried a usage the upstream sent but that cannot be billed as
  // sent (extract_usage's invalid: a count negative, fractional, not a number
  // or over api::kMaxUsageTokens): that chunk's usage was not read.
  bool invalid() const { return invalid_; }
  // What the last usage that left its prompt or completion count out (absent or null) said of the other
  // (read_usage's `partial`: then invalid() too); nothing said otherwise.
  const PartialUsage& partial() const { return partial_; }
  // Some usage was read: whole() or per-choice.
  bool has_usage() const { return whole_ || !choices_.empty(); }
  // The usage is the request's total: a chunk with no choice carried it
  // (vLLM's usage-only chunk), or set() gave it. False when usage() is the
  // sum of per-choice counts (continuous_usage_stats without the final
  // chunk, or a server that puts its usage on a choice's chunk): the whole
  // of what the upstream reported only if the stream ended whole.
  bool whole() const { return whole_; }
  // A usage-only chunk (is_usage_only_chunk) went to the client: the one a
  // stream ends with. Per-chunk usage (continuous_usage_stats) is none.
  bool usage_chunk_relayed() const { return usage_chunk_; }
  // The request's total when whole(); else the per-choice counts summed
  // (the last of each choice; prompt and cached tokens once per prompt, the
  // largest its choices said); zeros without usage.
  Usage usage() const;
  // Every prompt of the request said its count: whole(), or per-choice usage
  // from at least one choice of each prompt (index / n), so usage()'s
  // prompt_tokens (and cached_tokens) are the upstream's count of the whole
  // request's prompts, not of some of them. (Completion counts may still
  // trail: a choice's last chunk says only its tokens so far.)
  bool every_prompt() const;
  // Usage read elsewhere was invalid (an Anthropic upstream's events): invalid().
  void mark_invalid() { invalid_ = true; }
  // Usage read elsewhere (an Anthropic upstream's events, in OpenAI's counts).
  void set(const Usage& u) {
    whole_ = true;
    usage_ = u;
  }

  // Choice indexes past this are not counted (their chunks' usage is
  // ignored): per-choice state is bounded whatever index an upstream sends.
  static constexpr std::size_t kMaxChoices = 4096;

 private:
  struct ChoiceCounts {
    bool seen = false;
    std::uint64_t prompt_tokens = 0;
    std::uint64_t completion_tokens = 0;
    std::uint64_t cached_tokens = 0;
  };
  // on_data()'s valid usage `u` of the chunk `data`: a total, or one choice's.
  // `choices`: the chunk's top-level "choices" member, if any.
  void on_usage(std::string_view data, const std::optional<MemberSpan>& choices, const Usage& u, bool usage_only);

  bool strip_ = false;
  bool whole_ = false;  // usage_ holds the request's total
  bool usage_chunk_ = false;
  bool invalid_ = false;  // invalid()
  Usage usage_;
  PartialUsage partial_;  // partial()
  std::uint32_t choices_per_prompt_ = 1;
  std::uint32_t prompts_ = 1;          // the request's prompts (every_prompt())
  std::vector<ChoiceCounts> choices_;  // per-choice usage, by choice index
  bool saw_usage_ = false;             // the chunk on_data() read last has a "usage" key
  MemberSpan usage_span_;              // where, when saw_usage_ ...
  std::string_view usage_of_;          // ... in this chunk
};

}  // namespace weir::api::openai
