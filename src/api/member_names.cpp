// Member names that a server matching names in any case would read as ones Weir reads (api/member_names.hpp).
#include "api/member_names.hpp"

#include <array>
#include <cstdint>

#include <fmt/format.h>

#include "core/json_text.hpp"

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

// The names the request checks read (read_member_index's: api/request.cpp's FieldsHandler, the splices,
// the batching and coalescing keys, resume's checks), as a fold may reach them.
std::string_view folds_to_read_member(std::string_view key, bool top) {
  static constexpr std::array<std::string_view, 2> kStreamOptions = {"include_usage", "continuous_usage_stats"};
  // (An exact name is no other's: "user", "echo".) At the top level: every member Weir reads
  // (read_member_index's), as a repeat of one is refused.
  if (top) {
    for (int i = 0; i < kReadMemberCount; ++i)
      if (const std::string_view n = read_member_name(i); key != n && go_fold_equals(key, n)) return n;
    return {};
  }
  for (const std::string_view n : kStreamOptions)
    if (key != n && go_fold_equals(key, n)) return n;
  return {};
}

}  // namespace weir::api

namespace weir::api {

namespace {

// read_member_index's names by index (ordered by length, as its switch is).
constexpr std::array<std::string_view, kReadMemberCount> kReadMembers = {
    "n",
    "seed",
    "user",
    "echo",
    "text",
    "model",
    "input",
    "query",
    "tools",
    "stream",
    "prompt",
    "suffix",
    "text_1",
    "text_2",
    "best_of",
    "messages",
    "logprobs",
    "documents",
    "functions",
    "max_tokens",
    "min_tokens",
    "request_id",
    "temperature",
    "guided_json",
    "guided_regex",
    "top_logprobs",
    "chat_template",
    "guided_choice",
    "stream_options",
    "guided_grammar",
    "structural_tag",
    "prompt_logprobs",
    "response_format",
    "structured_outputs",
    "chat_template_kwargs",
    "max_completion_tokens",
    "add_generation_prompt",
    "continue_final_message",
    "guided_whitespace_pattern",
};

static_assert(kReadMemberCount <= 64);  // (bits of a std::uint64_t)

}  // namespace

int read_member_index(std::string_view key) {
  // A switch on the length, then literals: each compare has a constant length, which the compiler does inline
  // (a few loads), not as a memcmp call. The indexes are kReadMembers' (ReadMemberNames checks each).
  switch (key.size()) {
    case 1:
      if (key == "n") return 0;
      return -1;
    case 4:
      if (key == "seed") return 1;
      if (key == "user") return 2;
      if (key == "echo") return 3;
      if (key == "text") return 4;
      return -1;
    case 5:
      if (key == "model") return 5;
      if (key == "input") return 6;
      if (key == "query") return 7;
      if (key == "tools") return 8;
      return -1;
    case 6:
      if (key == "stream") return 9;
      if (key == "prompt") return 10;
      if (key == "suffix") return 11;
      if (key == "text_1") return 12;
      if (key == "text_2") return 13;
      return -1;
    case 7:
      if (key == "best_of") return 14;
      return -1;
    case 8:
      if (key == "messages") return 15;
      if (key == "logprobs") return 16;
      return -1;
    case 9:
      if (key == "documents") return 17;
      if (key == "functions") return 18;
      return -1;
    case 10:
      if (key == "max_tokens") return 19;
      if (key == "min_tokens") return 20;
      if (key == "request_id") return 21;
      return -1;
    case 11:
      if (key == "temperature") return 22;
      if (key == "guided_json") return 23;
      return -1;
    case 12:
      if (key == "guided_regex") return 24;
      if (key == "top_logprobs") return 25;
      return -1;
    case 13:
      if (key == "chat_template") return 26;
      if (key == "guided_choice") return 27;
      return -1;
    case 14:
      if (key == "stream_options") return 28;
      if (key == "guided_grammar") return 29;
      if (key == "structural_tag") return 30;
      return -1;
    case 15:
      if (key == "prompt_logprobs") return 31;
      if (key == "response_format") return 32;
      return -1;
    case 18:
      if (key == "structured_outputs") return 33;
      return -1;
    case 20:
      if (key == "chat_template_kwargs") return 34;
      return -1;
    case 21:
      if (key == "max_completion_tokens") return 35;
      if (key == "add_generation_prompt") return 36;
      return -1;
    case 22:
      if (key == "continue_final_message") return 37;
      return -1;
    case 25:
      if (key == "guided_whitespace_pattern") return 38;
      return -1;
    default:
      return -1;
  }
}

std::string_view read_member_name(int index) { return kReadMembers[static_cast<std::size_t>(index)]; }

int read_stream_option_index(std::string_view key) {
  if (key == "include_usage") return 0;
  if (key == "continuous_usage_stats") return 1;
  return -1;
}

std::string_view read_stream_option_param(int index) {
  return index == 0 ? "stream_options.include_usage" : "stream_options.continuous_usage_stats";
}

namespace {

// `name` when it is a member Weir knows: a read_member_index name, one of stream_options', or a top-level member
// of an Anthropic Messages or OpenAI Responses request; else empty (any other name is the client's text, named
// in the message only).
std::string_view static_member_name(std::string_view name) {
  if (const int i = read_member_index(name); i >= 0) return read_member_name(i);
  for (int i = 0; i < 2; ++i)
    if (name == read_stream_option_param(i)) return read_stream_option_param(i);
  static constexpr std::array<std::string_view, 36> kTranslated = {"system",
                                                                   "metadata",
                                                                   "stop_sequences",
                                                                   "top_k",
                                                                   "top_p",
                                                                   "tool_choice",
                                                                   "thinking",
                                                                   "service_tier",
                                                                   "container",
                                                                   "mcp_servers",
                                                                   "output_config",
                                                                   "output_format",
                                                                   "context_management",
                                                                   "instructions",
                                                                   "max_output_tokens",
                                                                   "max_tool_calls",
                                                                   "parallel_tool_calls",
                                                                   "previous_response_id",
                                                                   "reasoning",
                                                                   "store",
                                                                   "text",
                                                                   "truncation",
                                                                   "include",
                                                                   "background",
                                                                   "conversation",
                                                                   "prompt_cache_key",
                                                                   "safety_identifier",
                                                                   "stop",
                                                                   "frequency_penalty",
                                                                   "presence_penalty",
                                                                   "logit_bias",
                                                                   "modalities",
                                                                   "audio",
                                                                   "prediction",
                                                                   "web_search_options",
                                                                   "verbosity"};
  for (const std::string_view n : kTranslated)
    if (n == name) return n;
  return {};
}

}  // namespace

core::Error repeated_member_error(std::string_view name) {
  return core::bad_request(
      fmt::format("'{}' appears more than once in the request body: JSON parsers differ on which copy of a repeated "
                  "member counts (the first, the last, or neither: a refusal), so Weir cannot know which one the "
                  "upstream would act on. Send it once.",
                  core::utf8_prefix(name, core::kMaxEchoBytes)),
      static_member_name(name));
}

}  // namespace weir::api
