#include "bench/lib/sse.hpp"

#include <cstring>

namespace weir::bench {

void SseParser::reset() {
  line_.clear();
  data_.clear();
  type_.clear();
  skip_lf_ = false;
  at_start_ = true;
}

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::int64_t parse_int(const char* p, const char* end) {
  std::int64_t v = 0;
  bool any = false;
  while (p != end && *p >= '0' && *p <= '9') {
    v = v * 10 + (*p - '0');
    any = true;
    ++p;
  }
  return any ? v : -1;
}

}  // namespace

JsonScan scan_json(std::string_view json) {
  JsonScan out;
  const char* const s = json.data();
  const char* const end = s + json.size();
  const char* p = s;
  bool first_key = true;
  // Byte loops rather than memchr: the strings of an SSE chunk are a few
  // bytes long, shorter than memchr's call overhead.
  while (p != end) {
    while (p != end && *p != '"') ++p;
    if (p == end) break;
    // The string runs to the next quote not escaped by a backslash.
    const char* a = p + 1;
    const char* b = a;
    while (b != end && *b != '"') {
      if (*b == '\\') {
        if (++b == end) return out;
      }
      ++b;
    }
    if (b == end) return out;
    const std::string_view str(a, static_cast<std::size_t>(b - a));
    p = b + 1;
    while (p != end && is_ws(*p)) ++p;
    if (p == end || *p != ':') continue;  // a value, not a key
    ++p;
    while (p != end && is_ws(*p)) ++p;
    if (first_key) {
      first_key = false;
      if (str == "error") out.is_error = true;
    }
    if (p == end) break;
    switch (str.size()) {
      case 4:   // text
      case 7:   // content / mock_ns
      case 17:  // reasoning_content / completion_tokens
        if (str == "mock_ns") {
          out.mock_ns = parse_int(p, end);
        } else if (str == "content" || str == "text" || str == "reasoning_content") {
          if (*p == '"' && p + 1 != end && p[1] != '"') out.has_content = true;
        } else if (str == "completion_tokens") {
          out.completion_tokens = parse_int(p, end);
        }
        break;
      case 13:  // output_tokens / prompt_tokens
        if (str == "output_tokens") {
          out.completion_tokens = parse_int(p, end);
        } else if (str == "prompt_tokens") {
          out.prompt_tokens = parse_int(p, end);
        }
        break;
      case 12:  // input_tokens
        if (str == "input_tokens") out.prompt_tokens = parse_int(p, end);
        break;
      default:
        break;
    }
  }
  return out;
}

void StreamTracker::start(Histogram* itl, std::int64_t stall_ns) {
  parser_.reset();
  stats_ = StreamStats{};
  itl_ = itl;
  stall_ns_ = stall_ns;
}

void StreamTracker::feed(std::string_view bytes, std::int64_t now_ns) {
  parser_.feed(bytes, [this, now_ns](std::string_view type, std::string_view data) { on_event(type, data, now_ns); });
}

void StreamTracker::on_event(std::string_view type, std::string_view data, std::int64_t now_ns) {
  ++stats_.events;
  if (stats_.done) return;  // nothing after the end marker counts
  if (data == "[DONE]" || type == "message_stop" || type == "response.completed" || type == "response.incomplete") {
    // (A Responses stream's terminal event carries the usage.)
    if (type.starts_with("response.")) {
      const JsonScan scan = scan_json(data);
      if (scan.completion_tokens >= 0) stats_.usage_completion_tokens = scan.completion_tokens;
      if (scan.prompt_tokens >= 0) stats_.usage_prompt_tokens = scan.prompt_tokens;
    }
    stats_.done = true;
    return;
  }
  if (type == "error" || type == "response.failed") {
    stats_.stream_error = true;
    return;
  }
  bool token = false;
  std::int64_t mock_ns = -1;
  if (type.starts_with("response.")) {
    // OpenAI Responses events: the text and reasoning deltas are the tokens;
    // the .done events and the response snapshots repeat text already counted.
    token = type == "response.output_text.delta" || type == "response.reasoning_text.delta";
  } else {
    const JsonScan scan = scan_json(data);
    if (scan.is_error) stats_.stream_error = true;
    if (scan.completion_tokens >= 0) stats_.usage_completion_tokens = scan.completion_tokens;
    if (scan.prompt_tokens >= 0) stats_.usage_prompt_tokens = scan.prompt_tokens;
    token = scan.has_content;
    mock_ns = scan.mock_ns;
  }
  if (!token) return;
  ++stats_.tokens;
  if (stats_.first_token_ns < 0) {
    stats_.first_token_ns = now_ns;
    stats_.first_token_mock_ns = mock_ns;
  } else {
    const std::int64_t gap = now_ns - stats_.last_token_ns;
    if (itl_) itl_->record(gap);
    if (gap > stats_.max_gap_ns) stats_.max_gap_ns = gap;
    if (stall_ns_ > 0 && gap > stall_ns_) stats_.stalled = true;
  }
  stats_.last_token_ns = now_ns;
}

}  // namespace weir::bench
