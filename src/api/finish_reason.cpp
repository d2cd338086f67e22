// finish_reason values read once for every translation (finish_reason.hpp).
#include "api/finish_reason.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <boost/json/parse.hpp>

#include "core/json_text.hpp"

namespace weir::api {

namespace {
constexpr std::size_t kMaxKept = 64;
constexpr std::string_view kName = "\"finish_reason\"";

constexpr bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Each "finish_reason" member of `json` from the last to the first: f(at, value_at) with the offset of its
// name and of its value's first byte; f returns false to stop. Found backward by its '_' (memrchr: glibc's
// SIMD search, a fraction of an instruction per byte), so a whole answer's search ends at its last choice's
// finish_reason (vLLM and OpenAI write it after the message, so what is read is the usage and the few members
// after it, however long the message): the cost is that of the underscores after it (member names such as
// prompt_tokens), a compare each. In valid JSON the name with both its quotes, then ':', is a member's name:
// inside a string its quotes would be escaped.
template <typename F>
void for_each_finish_backward(std::string_view json, F&& f) {
  constexpr std::size_t kUnderscore = 7;  // kName[7] == '_'
  std::size_t end = json.size();          // searched: [0, end)
  while (end > 0) {
    const void* hit = ::memrchr(json.data(), '_', end);
    if (hit == nullptr) return;
    const std::size_t u = static_cast<std::size_t>(static_cast<const char*>(hit) - json.data());
    end = u;
    if (u < kUnderscore || json.size() - (u - kUnderscore) < kName.size()) continue;
    const std::size_t at = u - kUnderscore;
    if (json[at] != '"' || json.compare(at, kName.size(), kName) != 0) continue;
    std::size_t i = at + kName.size();
    while (i < json.size() && is_ws(json[i])) ++i;
    if (i >= json.size() || json[i] != ':') continue;
    ++i;
    while (i < json.size() && is_ws(json[i])) ++i;
    end = at;
    if (i >= json.size()) continue;
    if (!f(at, i)) return;
  }
}

// The raw text of the JSON string that begins at json[i] ('"'), escapes as they are; nullopt when it is not
// closed.
std::string_view string_text(std::string_view json, std::size_t i) {
  for (std::size_t j = i + 1; j < json.size(); ++j) {
    if (json[j] == '\\') {
      ++j;
      continue;
    }
    if (json[j] == '"') return json.substr(i + 1, j - i - 1);
  }
  return {};
}
}  // namespace

Finish finish_of(std::string_view r) noexcept {
  if (r.empty()) return Finish::none;
  if (r == "length" || r == "model_length") return Finish::length;
  if (r == "content_filter") return Finish::content_filter;
  if (r == "abort" || r == "error" || r == "repetition") return Finish::failed;
  return Finish::complete;  // stop, tool_calls, function_call, eos_token, stop_sequence, and any other
}

void keep_finish_reason(std::string& into, std::string_view value) { into.assign(core::utf8_prefix(value, kMaxKept)); }

std::string unfinished_message(std::string_view finish_reason) {
  return fmt::format("The upstream ended the generation before it was complete (finish_reason \"{}\").",
                     core::utf8_prefix(finish_reason, kMaxKept));
}

// The Finish of a finish_reason's raw string text (between its quotes, escapes as they are): decoded first
// when it has an escape ("st\u006fp" is "stop"), a rare path that parses it.
Finish finish_of_raw(std::string_view raw) {
  if (raw.find('\\') == std::string_view::npos) return finish_of(raw);
  std::string quoted;
  quoted.reserve(raw.size() + 2);
  quoted += '"';
  quoted += raw;
  quoted += '"';
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(quoted, ec);
  if (ec || !v.is_string()) return Finish::none;
  return finish_of(std::string_view(v.get_string()));
}

std::string_view failed_finish_in(std::string_view json, std::uint32_t choices) {
  std::string_view failed;
  std::uint32_t seen = 0;
  for_each_finish_backward(json, [&](std::size_t, std::size_t v) {
    if (json[v] == '"') {
      const std::string_view value = string_text(json, v);
      // (An unclosed string, or "": no finish said.) Read backward: the earliest failed one is kept.
      if (finish_of_raw(value) == Finish::failed) failed = value;
    }
    return choices == 0 || ++seen < choices;
  });
  return failed;
}

void FinishWatch::read(std::string_view data) {
  std::size_t last_null = std::string_view::npos;  // the last member's, when its value is null
  bool last = true;
  for_each_finish_backward(data, [&](std::size_t at, std::size_t v) {
    if (data[v] == '"') {
      if (const std::string_view value = string_text(data, v); finish_of_raw(value) == Finish::failed) {
        keep_finish_reason(failed_, value);
        return false;
      }
    } else if (last && data.substr(v, 4) == "null") {
      last_null = at;
    }
    last = false;
    return true;
  });
  if (!failed_.empty() || last_null == std::string_view::npos || !one_choice_) return;
  const std::size_t len = data.size() - last_null;
  if (len < kTailBytes || len > 255) return;
  tail_len_ = static_cast<std::uint8_t>(len);
  const char* t = data.data() + last_null;
  std::memcpy(&tail_[0], t, 8);
  std::memcpy(&tail_[1], t + 7, 8);
  std::memcpy(&tail_[2], t + 15, 8);
}

}  // namespace weir::api
