// Request member names as upstream parsers other than OpenAI's and vLLM's
// read them.
#pragma once

#include <string_view>

namespace weir::api {

// Whether member name `key` (unescaped UTF-8), not one of the names Weir reads (they are compared exactly, as
// OpenAI's API and vLLM's pydantic models do), would be read as one by a server that matches names as Go's
// encoding/json does (bytes.EqualFold: any case; U+017F folds to s, U+212A to k; Ollama's and LocalAI's OpenAI
// layers): the body would then mean one thing to Weir's routing, allow-lists, limits and budgets and another to
// such an upstream. `top`: a member of the body; else of its stream_options. Returns the name it would be read
// as, or an empty view. Throws nothing.
std::string_view folds_to_read_member(std::string_view key, bool top);

}  // namespace weir::api
