// Generated text counted in bytes for the no-usage charge (text_estimate.hpp). A byte loop that knows
// JSON's strings and brackets and nothing else: no DOM, no allocation, no recursion (a body nested a
// million deep is a loop, not a stack).
#include "api/text_estimate.hpp"

#include <algorithm>
#include <cstring>

#include "core/text.hpp"

namespace weir::api {
namespace {

constexpr bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::size_t skip_ws(std::string_view s, std::size_t i) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}

// The JSON string at s[i] ('"'): the index after its closing quote (s.size() when it has none), and in
// `bytes` its UTF-8 length once decoded (an escape is the character it stands for; a \uXXXX half of a
// surrogate pair 2 bytes, so the pair is the 4 of its character). memchr finds the quotes and backslashes:
// a 100-token delta is a few vector steps, not a loop per byte.
std::size_t string_end(std::string_view s, std::size_t i, std::size_t& bytes) {
  std::size_t n = 0;
  const char* const base = s.data();
  for (++i; i < s.size();) {
    const auto* q = static_cast<const char*>(std::memchr(base + i, '"', s.size() - i));
    if (q == nullptr) break;
    const std::size_t close = static_cast<std::size_t>(q - base);
    const auto* b = static_cast<const char*>(std::memchr(base + i, '\\', close - i));
    if (b == nullptr) {
      bytes = n + (close - i);
      return close + 1;
    }
    const std::size_t esc = static_cast<std::size_t>(b - base);
    n += esc - i;
    if (esc + 1 >= s.size()) break;
    if (s[esc + 1] != 'u') {
      ++n;
      i = esc + 2;
      continue;
    }
    unsigned v = 0;
    std::size_t k = 2;
    for (; k < 6 && esc + k < s.size(); ++k) {
      const int h = core::hex_value(s[esc + k]);
      if (h < 0) break;
      v = v * 16 + static_cast<unsigned>(h);
    }
    n += v < 0x80 ? 1 : v < 0x800 ? 2 : (v >= 0xD800 && v < 0xE000) ? 2 : 3;
    i = esc + k;
  }
  bytes = 0;  // never closed: no text of it is counted
  return s.size();
}

enum class Key : unsigned char { none, text, reasoning_content, reasoning, input };

// The members whose string values are generated text (text_estimate.hpp).
Key key_kind(std::string_view k) {
  switch (k.size()) {
    case 4:
      return k == "text" || k == "name" ? Key::text : Key::none;
    case 5:
      return k == "input" ? Key::input : Key::none;
    case 7:
      return k == "content" || k == "refusal" ? Key::text : Key::none;
    case 8:
      return k == "thinking" ? Key::text : Key::none;
    case 9:
      return k == "arguments" ? Key::text : k == "reasoning" ? Key::reasoning : Key::none;
    case 12:
      return k == "partial_json" ? Key::text : Key::none;
    case 17:
      return k == "reasoning_content" ? Key::reasoning_content : Key::none;
    default:
      return Key::none;
  }
}

struct Counts {
  std::size_t text = 0;
  // vLLM names its reasoning `reasoning_content` and, in newer versions, `reasoning` as well (the same
  // text twice): the larger of the two is counted, never their sum.
  std::size_t reasoning_content = 0;
  std::size_t reasoning = 0;
  std::size_t raw = 0;  // the counted strings' bytes as sent, escapes and all (the frame is the rest)
  std::size_t total() const { return text + std::max(reasoning_content, reasoning); }
};

// Scans the object or array at s[i] to its matching close (or the end of `s`), adding to `c` the
// decoded bytes of each string that is the value of a text member, and the JSON text of each
// object an `input` member holds (an Anthropic tool_use block's arguments). Returns the index after it.
std::size_t scan(std::string_view s, std::size_t i, Counts& c) {
  std::size_t depth = 0;
  Key key = Key::none;          // the member whose value comes next, if a string
  std::size_t input_depth = 0;  // inside an `input` object opened at this depth (0: none)
  std::size_t input_begin = 0;
  while (i < s.size()) {
    const char ch = s[i];
    if (ch == '"') {
      const std::size_t begin = i + 1;
      std::size_t bytes = 0;
      const std::size_t end = string_end(s, i, bytes);
      if (end >= s.size()) return s.size();
      const std::size_t next = skip_ws(s, end);
      if (next < s.size() && s[next] == ':') {
        key = input_depth == 0 ? key_kind(s.substr(begin, end - 1 - begin)) : Key::none;
        i = next + 1;
        continue;
      }
      if (key != Key::none) {
        if (key == Key::text) c.text += bytes;
        if (key == Key::reasoning_content) c.reasoning_content += bytes;
        if (key == Key::reasoning) c.reasoning += bytes;
        c.raw += end - 1 - begin;
      }
      key = Key::none;
      i = end;
      continue;
    }
    if (ch == '{' || ch == '[') {
      ++depth;
      if (key == Key::input && ch == '{') {
        input_depth = depth;
        input_begin = i;
      }
      key = Key::none;
    } else if (ch == '}' || ch == ']') {
      if (input_depth != 0 && depth == input_depth) {
        c.text += i + 1 - input_begin;
        c.raw += i + 1 - input_begin;
        input_depth = 0;
      }
      key = Key::none;
      if (depth <= 1) return i + 1;
      --depth;
    } else if (ch == ',') {
      key = Key::none;
    }
    ++i;
  }
  return s.size();
}

// The first `needle` (a quoted member name) at or after `from` that is a member name: followed by
// whitespace and ':'. Returns the index of its value's first byte, or npos.
std::size_t member_value(std::string_view s, std::size_t from, std::string_view needle) {
  while (from < s.size()) {
    const std::size_t at = core::find_substring(s.substr(from), needle);
    if (at == std::string_view::npos) return std::string_view::npos;
    std::size_t i = skip_ws(s, from + at + needle.size());
    if (i < s.size() && s[i] == ':') return skip_ws(s, i + 1);
    from = from + at + needle.size();
  }
  return std::string_view::npos;
}

}  // namespace

namespace {

Counts event_counts(std::string_view data) {
  Counts c;
  bool delta = false;
  // Each choice's `delta` object (an OpenAI chat chunk; an Anthropic content_block_delta has one).
  for (std::size_t i = member_value(data, 0, "\"delta\""); i != std::string_view::npos;
       i = member_value(data, i, "\"delta\"")) {
    if (i >= data.size()) break;
    if (data[i] != '{') continue;
    delta = true;
    i = scan(data, i, c);
  }
  if (delta) return c;
  // A completions chunk: each choice's `text`.
  for (std::size_t i = member_value(data, 0, "\"text\""); i != std::string_view::npos;
       i = member_value(data, i, "\"text\"")) {
    if (i >= data.size() || data[i] != '"') continue;
    std::size_t bytes = 0;
    const std::size_t end = string_end(data, i, bytes);
    c.text += bytes;
    if (end < data.size()) c.raw += end - 1 - (i + 1);
    i = end;
  }
  return c;
}

}  // namespace

std::size_t event_text_bytes(std::string_view data) { return event_counts(data).total(); }

std::size_t event_text_bytes(std::string_view data, std::size_t& frame) {
  if (data.size() >= frame && data.size() - frame <= kFrameSlack) return data.size() - frame;
  const Counts c = event_counts(data);
  // The shortcut takes an event's bytes over the frame for its text: sound only while the text's bytes on
  // the wire are its bytes as read. Text sent escaped (`\u4e2d`, 6 bytes for 3) or twice (vLLM's
  // `reasoning_content` beside `reasoning`) would be over-counted by it, so such a stream's next event is
  // read whole too.
  frame = c.raw == c.total() ? data.size() - std::min(c.raw, data.size()) : std::string_view::npos;
  return c.total();
}

std::size_t answer_text_bytes(std::string_view json) {
  const std::size_t i = json.find_first_of("{[");
  if (i == std::string_view::npos) return 0;
  Counts c;
  (void)scan(json, i, c);
  return c.total();
}

}  // namespace weir::api
