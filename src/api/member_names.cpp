// Member names that a server matching names in any case would read as ones Weir reads (api/member_names.hpp).
#include "api/member_names.hpp"

#include <array>

namespace weir::api {

namespace {

// Whether `a` equals the lower-case ASCII name `b` as Go's encoding/json matches a member to a field
// (bytes.EqualFold: Unicode simple case folding, where the only non-ASCII letters that fold to ASCII ones
// are U+017F LATIN SMALL LETTER LONG S, to s, and U+212A KELVIN SIGN, to k).
bool go_fold_equals(std::string_view a, std::string_view b) {
  std::size_t i = 0;
  for (const char want : b) {
    if (i >= a.size()) return false;
    const char c = a[i];
    if (c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') == want : c == want) {
      ++i;
    } else if (want == 's' && a.substr(i, 2) == "\xC5\xBF") {
      i += 2;
    } else if (want == 'k' && a.substr(i, 3) == "\xE2\x84\xAA") {
      i += 3;
    } else {
      return false;
    }
  }
  return i == a.size();
}

}  // namespace

// The names the request checks read (api/request.cpp's FieldsHandler, and the batching key's), as a fold
// may reach them.
std::string_view folds_to_read_member(std::string_view key, bool top) {
  static constexpr std::array<std::string_view, 22> kTop = {"model",
                                                            "stream",
                                                            "stream_options",
                                                            "max_tokens",
                                                            "max_completion_tokens",
                                                            "n",
                                                            "best_of",
                                                            "messages",
                                                            "prompt",
                                                            "input",
                                                            "tools",
                                                            "functions",
                                                            "documents",
                                                            "echo",
                                                            "logprobs",
                                                            "top_logprobs",
                                                            "suffix",
                                                            "user",
                                                            "request_id",
                                                            "chat_template",
                                                            "prompt_logprobs",
                                                            "chat_template_kwargs"};
  static constexpr std::array<std::string_view, 2> kStreamOptions = {"include_usage", "continuous_usage_stats"};
  const auto any = [&](const auto& names) {
    for (const std::string_view n : names)
      if (key != n && go_fold_equals(key, n)) return n;  // (an exact name is no other's: "user", "echo")
    return std::string_view();
  };
  return top ? any(kTop) : any(kStreamOptions);
}

}  // namespace weir::api
