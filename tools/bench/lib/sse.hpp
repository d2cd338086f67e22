// SSE parsing and per-stream timing for weir-bench.
//
// SseParser follows the WHATWG HTML Living Standard §9.2.6 ("Interpreting an
// event stream"): lines end with CRLF, LF or CR (a CR at the end of one chunk
// and an LF at the start of the next are one break); an empty line dispatches
// the event if its data buffer is non-empty; `data` lines are joined with
// '\n'; lines starting with ':' are comments; a leading UTF-8 BOM is skipped;
// a field name with no ':' has an empty value; one space after ':' is removed.
// It keeps only `event` and `data` (what a load generator needs), reuses its
// buffers (no allocation once they have grown to the largest event), and
// accepts the bytes in any split.
//
// StreamTracker turns a response body into the per-request numbers:
//   token event  : an event whose data is a JSON object holding, at any depth,
//                  a member "content", "text" or "reasoning_content" whose
//                  value is a non-empty string (OpenAI chat chunk
//                  choices[].delta.content, legacy completions choices[].text,
//                  Anthropic content_block_delta delta.text, vLLM reasoning),
//                  or an OpenAI Responses response.output_text.delta /
//                  response.reasoning_text.delta event.
//                  Role-only, usage-only and finish chunks are not tokens.
//   TTFT         : arrival time of the first token event (callers subtract the
//                  request's intended send time).
//   ITL          : the gap between the arrival times of consecutive token
//                  events (0 when several arrive in one read).
//   tokens       : number of token events; usage.completion_tokens (or
//                  Anthropic usage.output_tokens) is kept separately, last value wins.
//   done         : `data: [DONE]` (OpenAI/vLLM), `event: message_stop`
//                  (Anthropic) or `event: response.completed` / `response.incomplete`
//                  (OpenAI Responses) was seen; a stream that ends without it is truncated.
//   stalled      : some gap between consecutive token events exceeded stall_ns.
//   stream_error : an `event: error` or `event: response.failed`, or a data object
//                  whose first member is "error".
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "bench/lib/histogram.hpp"

namespace weir::bench {

class SseParser {
 public:
  // Parses `bytes` (any split of the stream) and calls
  // on_event(std::string_view type, std::string_view data) for every complete
  // event; `type` is empty when the event has no `event:` field. The views
  // are valid only during the call.
  template <class F>
  void feed(std::string_view bytes, F&& on_event);

  // Forgets all state (start of a new stream).
  void reset();

 private:
  template <class F>
  void process_line(std::string_view line, F& on_event);

  std::string line_;      // a line split across feeds
  std::string data_;      // the data buffer of the event being built
  std::string type_;      // the event type buffer
  bool skip_lf_ = false;  // the previous byte was CR: a following LF belongs to it
  bool at_start_ = true;  // no line seen yet (BOM check)
};

// Scans one JSON text (an SSE data payload or a whole response body) for the
// members the generator cares about, without building a DOM: one pass over
// the bytes, keys matched anywhere in the object tree, string values skipped
// with escapes honoured. Not a validator: malformed JSON yields what it yields.
struct JsonScan {
  bool has_content = false;             // a non-empty "content"/"text"/"reasoning_content" string
  bool is_error = false;                // the first member's key is "error"
  std::int64_t completion_tokens = -1;  // "completion_tokens" or "output_tokens", -1 if absent
  std::int64_t prompt_tokens = -1;      // "prompt_tokens" or "input_tokens", -1 if absent
  std::int64_t mock_ns = -1;            // "mock_ns": weir-mock --stamp's own time for the request, ns; -1 if absent
};
JsonScan scan_json(std::string_view json);

// What one streamed response looked like. Times are absolute ns on the
// caller's clock; -1 means "did not happen".
struct StreamStats {
  std::int64_t first_token_ns = -1;
  std::int64_t first_token_mock_ns = -1;  // the first token event's "mock_ns" (weir-mock --stamp), -1 if absent
  std::int64_t last_token_ns = -1;
  std::int64_t max_gap_ns = 0;  // largest ITL gap
  std::uint32_t tokens = 0;     // token events
  std::uint32_t events = 0;     // all dispatched events
  std::int64_t usage_completion_tokens = -1;
  std::int64_t usage_prompt_tokens = -1;
  bool done = false;
  bool stalled = false;
  bool stream_error = false;
};

class StreamTracker {
 public:
  // Starts a new stream. Each ITL gap is recorded into `itl` (may be null);
  // a gap longer than stall_ns (<= 0: never) marks the stream stalled.
  void start(Histogram* itl, std::int64_t stall_ns);

  // Body bytes that arrived at now_ns (any split).
  void feed(std::string_view bytes, std::int64_t now_ns);

  const StreamStats& stats() const { return stats_; }
  // The stream ended (or is ending) without its end-of-stream marker.
  bool truncated() const { return !stats_.done; }

 private:
  void on_event(std::string_view type, std::string_view data, std::int64_t now_ns);

  SseParser parser_;
  StreamStats stats_;
  Histogram* itl_ = nullptr;
  std::int64_t stall_ns_ = 0;
};

// ---- SseParser template members ----

template <class F>
void SseParser::process_line(std::string_view line, F& on_event) {
  if (at_start_) {
    at_start_ = false;
    if (line.starts_with("\xEF\xBB\xBF")) line.remove_prefix(3);
  }
  if (line.empty()) {
    if (!data_.empty()) {
      data_.pop_back();  // the data buffer's last LF
      on_event(std::string_view(type_), std::string_view(data_));
    }
    data_.clear();
    type_.clear();
    return;
  }
  if (line.front() == ':') return;  // comment
  std::string_view field = line;
  std::string_view value;
  if (const auto colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    data_.append(value);
    data_.push_back('\n');
  } else if (field == "event") {
    type_.assign(value);
  }
  // "id" and "retry" do not matter to a load generator; other fields are ignored.
}

template <class F>
void SseParser::feed(std::string_view bytes, F&& on_event) {
  const char* p = bytes.data();
  const char* const end = p + bytes.size();
  if (skip_lf_ && p != end) {
    skip_lf_ = false;
    if (*p == '\n') ++p;
  }
  // The next CR is looked up once and reused until passed: streams that use
  // LF only (vLLM, OpenAI) pay one memchr for CR per feed, not per line.
  const char* cr = static_cast<const char*>(std::memchr(p, '\r', static_cast<std::size_t>(end - p)));
  while (p != end) {
    // Next line break: the first CR or LF.
    if (cr && cr < p) {
      cr = static_cast<const char*>(std::memchr(p, '\r', static_cast<std::size_t>(end - p)));
    }
    const auto* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<std::size_t>(end - p)));
    const char* eol = nl ? nl : end;
    if (cr && cr < eol) eol = cr;
    if (eol == end) {
      line_.append(p, end);
      return;
    }
    if (line_.empty()) {
      process_line(std::string_view(p, static_cast<std::size_t>(eol - p)), on_event);
    } else {
      line_.append(p, eol);
      process_line(std::string_view(line_), on_event);
      line_.clear();
    }
    p = eol + 1;
    if (*eol == '\r') {
      if (p == end) {
        skip_lf_ = true;
      } else if (*p == '\n') {
        ++p;
      }
    }
  }
}

}  // namespace weir::bench
