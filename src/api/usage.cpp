// OpenAI "usage" extraction: one top-level scan, then Boost.JSON on the usage
// value only (a few dozen bytes), parsed into a stack buffer.
#include "api/usage.hpp"

#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "api/json_scan.hpp"

namespace weir::api {
namespace {

// A token count: 0 when absent or null; nullopt for anything but a
// non-negative JSON integer (1.5, 1e3, "12", true, -1 are all rejected).
std::optional<std::uint64_t> count(const boost::json::object& o, std::string_view name) {
  const boost::json::value* v = o.if_contains(name);
  if (v == nullptr || v->is_null()) return 0;
  if (v->is_uint64()) return v->get_uint64();
  if (v->is_int64() && v->get_int64() >= 0) return static_cast<std::uint64_t>(v->get_int64());
  return std::nullopt;
}

}  // namespace

std::optional<Usage> extract_usage(std::string_view json) {
  const auto span = find_member(json, "usage");
  if (!span) return std::nullopt;
  const std::string_view text = json.substr(span->value_begin, span->value_end - span->value_begin);
  if (text.empty() || text.front() != '{') return std::nullopt;  // null, or not an object

  unsigned char buffer[1024];
  boost::json::monotonic_resource arena(buffer, sizeof buffer);
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(text, ec, &arena);
  if (ec || !v.is_object()) return std::nullopt;
  const boost::json::object& usage = v.get_object();

  const auto prompt = count(usage, "prompt_tokens");
  const auto completion = count(usage, "completion_tokens");
  const auto total = count(usage, "total_tokens");
  if (!prompt || !completion || !total) return std::nullopt;
  Usage out{*prompt, *completion, *total, 0};
  // vLLM's rerank answers give only total_tokens: all of it is prompt.
  if (!usage.contains("prompt_tokens") && *total >= *completion) out.prompt_tokens = *total - *completion;

  if (const boost::json::value* details = usage.if_contains("prompt_tokens_details")) {
    if (details->is_object()) {
      const auto cached = count(details->get_object(), "cached_tokens");
      if (!cached) return std::nullopt;
      out.cached_tokens = *cached;
    } else if (!details->is_null()) {
      return std::nullopt;
    }
  }
  return out;
}

}  // namespace weir::api
