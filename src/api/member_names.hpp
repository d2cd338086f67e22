// Request member names: the ones Weir reads, their repeats (refused), and
// names upstream parsers other than OpenAI's and vLLM's would read as them.
#pragma once

#include <string_view>

#include "core/error.hpp"

namespace weir::api {

// Whether member name `key` (unescaped UTF-8), not one of the names Weir reads (they are compared exactly, as
// OpenAI's API and vLLM's pydantic models do), would be read as one by a server that matches names as Go's
// encoding/json does (bytes.EqualFold: any case; U+017F folds to s, U+212A to k; Ollama's and LocalAI's OpenAI
// layers): the body would then mean one thing to Weir's routing, allow-lists, limits and budgets and another to
// such an upstream. `top`: a member of the body; else of its stream_options. Returns the name it would be read
// as, or an empty view. Throws nothing.
std::string_view folds_to_read_member(std::string_view key, bool top);

}  // namespace weir::api

namespace weir::api {

// The top-level member names Weir reads, acts on or rewrites in a body it passes on as it came (chat
// completions, completions, embeddings, vLLM's extra routes): routing and the estimate (model, stream,
// max_tokens, messages, prompt, input, tools, ...), the splices (model, stream_options), the micro-batch and
// coalescing keys (echo, logprobs, suffix, user, temperature, seed, ...) and resume's checks (response_format,
// guided_*, continue_final_message, ...). One of these given twice is refused (api::repeated_member_error):
// parsers differ on which copy counts. `key` is the unescaped name; returns its index, 0 to
// kReadMemberCount - 1 (a bit of a 64-bit set), or -1 for any other name. Compares only the names as long as
// `key` (a handful at most), inline. Throws nothing.
inline constexpr int kReadMemberCount = 39;
int read_member_index(std::string_view key);
// The name at `index` (read_member_index's), as a static string.
std::string_view read_member_name(int index);

// The same for the members of the top-level stream_options object that Weir reads or rewrites
// (include_usage: 0, continuous_usage_stats: 1); -1 for any other. read_stream_option_param gives the
// error's `param`: "stream_options.include_usage", "stream_options.continuous_usage_stats".
int read_stream_option_index(std::string_view key);
std::string_view read_stream_option_param(int index);

// The 400 (invalid_request_error, `param` = `name`) for a body that gives a member Weir reads more than once
// (`name`: the member, or "stream_options.include_usage"): JSON parsers differ on which copy counts (Python's
// json and Boost.JSON the last, gjson and simdjson the first, serde and TGI refuse the body), so Weir, which
// routes, authorizes and reserves by one copy, cannot know which one the upstream acts on. The message names
// `name` (its first 256 bytes); `param` is it when it is a name Weir knows (a read_member_index one, one of
// stream_options', a top-level member of the Messages or Responses API), else null.
core::Error repeated_member_error(std::string_view name);

}  // namespace weir::api
