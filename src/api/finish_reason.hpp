// What a chat or completions choice's `finish_reason` says of its generation: the one reading every
// translation and the access log take (docs/protocols.md, "Finish reasons"). OpenAI's values (API
// reference, "The chat completion object": stop, length, tool_calls, content_filter, function_call) and
// vLLM's (vllm/v1/engine FINISH_REASON_STRINGS: stop, length, abort, error, repetition).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace weir::api {

enum class Finish : std::uint8_t {
  none,  // no finish_reason: absent, null or "" (a stream's content chunk)
  // "stop", "tool_calls", "function_call" (OpenAI's older name), and every value not named below: the model
  // ended its answer. Other OpenAI-compatible servers have their own words for it (TGI's "eos_token" and
  // "stop_sequence"), so a value Weir does not know is an ending, as before this reading existed.
  complete,
  length,          // "length" (Mistral's API: "model_length"): max_tokens or the context window cut the answer
  content_filter,  // "content_filter": a filter cut it (OpenAI, Azure)
  // vLLM's three values for a generation that did not end as the model meant, so no translation may call it
  // complete: "abort" (its engine aborted the request: preempted without recompute, a KV transfer that
  // failed, an abort that reached it upstream of Weir), "error" (a request-level internal error, such as a
  // KV load failure: vLLM 0.11 and later answer it as a 500 themselves, an older or another server may send
  // it), "repetition" (vLLM's repetition detection ended a degenerate answer).
  failed,
};

// The Finish of a finish_reason value (its text, unquoted; "" for none). O(1): one length switch and a compare.
Finish finish_of(std::string_view finish_reason) noexcept;

// The message a client gets when its generation ended with a failed finish_reason (`finish_reason`, cut to
// 64 bytes on a UTF-8 boundary, JSON-safe as the caller escapes it): "The upstream ended the generation
// before it was complete (finish_reason \"abort\")."
std::string unfinished_message(std::string_view finish_reason);

// Keeps the failed finish_reason `value` in `into` (cut to 64 bytes on a UTF-8 boundary): a translator
// holds it from the finish chunk to the stream's end.
void keep_finish_reason(std::string& into, std::string_view value);

// The first failed finish_reason (Finish::failed) in `json` (an OpenAI chat or completions answer, or one
// chunk of its stream): the value of a member named "finish_reason" whose value is a string (the raw text
// between its quotes, read as JSON: "\u0061bort" is "abort"), wherever it is; empty when there is none. `choices`: how
// many finish_reason members the answer has (the request's n × prompts), 0 = unknown: the search, from the end, stops
// after that many. Cost: a backward SIMD search for '_' (memrchr), a compare per underscore met, so for an answer whose
// finish_reason follows its message (vLLM's, OpenAI's) it does not grow with the message.
std::string_view failed_finish_in(std::string_view json, std::uint32_t choices = 0);

// A chat or completions stream relayed to its client as it came (vLLM's finish_reason is vLLM's wire): watched
// for a failed finish_reason, so that the access log and the endpoint's record say the generation failed
// (docs/observability.md) while the client gets the bytes. Fixed state, no allocation per event (one when a
// failed value is kept past 15 bytes). A chunk whose last "finish_reason" member is null, 23 to 255 bytes from
// its end, gives the stream's tail from that member on (`"finish_reason":null}]}`: vLLM's chat chunk); a later
// event that ends with as many bytes, the first 23 of them (the name and the value) equal, is a content chunk of
// the same shape, its finish_reason null where that one's was: three 8-byte compares, inline, the cost of an
// event of the stream's shape. Any other event (the role chunk, the finish chunk, the usage chunk) is read
// by a backward search as failed_finish_in()'s. (A chunk of several choices, which neither vLLM nor OpenAI sends, is
// read by its last choice's finish there.)
class FinishWatch {
 public:
  // `one_choice`: the stream has one choice (n = 1, one prompt), so a chunk that ends as a content chunk
  // does carries no other choice's finish: only then is the tail known (a chunk of several choices, the
  // first's failed and the last's null, ends with the same bytes).
  void reset(bool one_choice = true) {
    tail_len_ = 0;
    one_choice_ = one_choice;
    failed_.clear();
  }
  // One event's data (not [DONE]).
  void on_data(std::string_view data) {
    if (tail_len_ != 0 && data.size() >= tail_len_ && same_tail(data.data() + data.size() - tail_len_)) return;
    if (failed_.empty()) read(data);  // (the stream's first failed finish is the one kept)
  }
  // The first failed finish_reason the stream carried (cut to 64 bytes); empty when none.
  std::string_view failed() const { return failed_; }

 private:
  static constexpr std::size_t kTailBytes = 23;  // `"finish_reason":null}]}`: the name, the value, what closes it
  bool same_tail(const char* t) const {
    std::uint64_t a, b, c;
    std::memcpy(&a, t, 8);
    std::memcpy(&b, t + 7, 8);
    std::memcpy(&c, t + 15, 8);
    return ((a ^ tail_[0]) | (b ^ tail_[1]) | (c ^ tail_[2])) == 0;
  }
  void read(std::string_view data);

  std::array<std::uint64_t, 3> tail_{};  // the tail's bytes [0, 8), [7, 15), [15, 23)
  std::uint8_t tail_len_ = 0;            // 0: no tail known yet
  bool one_choice_ = true;
  std::string failed_;
};

}  // namespace weir::api
