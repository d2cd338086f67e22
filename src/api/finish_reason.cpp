// finish_reason values read once for every translation (finish_reason.hpp).
#include "api/finish_reason.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "core/json_text.hpp"
#include "core/text.hpp"

namespace weir::api {

namespace {
constexpr std::size_t kMaxKept = 64;
constexpr std::string_view kName = "\"finish_reason\"";

constexpr bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Each "finish_reason" member of `json`: f(at, value_at) with the offset of its name and of its value's first
// byte; f returns false to stop.
template <typename F>
void for_each_finish(std::string_view json, F&& f) {
  std::size_t from = 0;
  while (from < json.size()) {
    const std::size_t found = core::find_substring(json.substr(from), kName);
    if (found == std::string_view::npos) return;
    const std::size_t at = from + found;
    std::size_t i = at + kName.size();
    from = i;
    while (i < json.size() && is_ws(json[i])) ++i;
    if (i >= json.size() || json[i] != ':') continue;  // (a string's text, not a member name)
    ++i;
    while (i < json.size() && is_ws(json[i])) ++i;
    if (i >= json.size()) return;
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
  if (r == "stop" || r == "tool_calls" || r == "function_call") return Finish::complete;
  if (r == "length") return Finish::length;
  if (r == "content_filter") return Finish::content_filter;
  return Finish::failed;
}

void keep_finish_reason(std::string& into, std::string_view value) { into.assign(core::utf8_prefix(value, kMaxKept)); }

std::string unfinished_message(std::string_view finish_reason) {
  return fmt::format("The upstream ended the generation before it was complete (finish_reason \"{}\").",
                     core::utf8_prefix(finish_reason, kMaxKept));
}

std::string_view failed_finish_in(std::string_view json) {
  std::string_view failed;
  for_each_finish(json, [&](std::size_t, std::size_t v) {
    if (json[v] != '"') return true;
    const std::string_view value = string_text(json, v);
    // (An unclosed string, or "": no finish said.)
    if (finish_of(value) == Finish::failed) failed = value;
    return failed.empty();
  });
  return failed;
}

void FinishWatch::read(std::string_view data) {
  std::size_t last_null = std::string_view::npos;
  for_each_finish(data, [&](std::size_t at, std::size_t v) {
    if (data[v] == '"') {
      if (const std::string_view value = string_text(data, v); finish_of(value) == Finish::failed) {
        keep_finish_reason(failed_, value);
        return false;
      }
      last_null = std::string_view::npos;  // (a later member's null is the tail's, not this one's)
    } else if (data.substr(v, 4) == "null") {
      last_null = at;
    }
    return true;
  });
  if (!failed_.empty() || last_null == std::string_view::npos) return;
  const std::size_t len = data.size() - last_null;
  if (len < kTailBytes || len > 255) return;
  tail_len_ = static_cast<std::uint8_t>(len);
  const char* t = data.data() + last_null;
  std::memcpy(&tail_[0], t, 8);
  std::memcpy(&tail_[1], t + 7, 8);
  std::memcpy(&tail_[2], t + 15, 8);
}

}  // namespace weir::api
