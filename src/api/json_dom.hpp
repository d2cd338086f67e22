// Small accessors for reading Boost.JSON DOMs in the protocol translators
// (api/anthropic, api/responses): views into the DOM's own storage, valid
// while the value lives; and the per-thread block their DOMs start in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/json/object.hpp>
#include <boost/json/string.hpp>

namespace weir::api {

// The deepest nesting of a client's JSON body Weir reads (RFC 8259 §9 lets a
// parser set one; no OpenAI or Anthropic request shape comes near it).
inline constexpr int kMaxBodyDepth = 64;
// A json::string as a std::string_view (no copy).
inline std::string_view sv(const boost::json::string& s) { return {s.data(), s.size()}; }

// The string member `name` of `o`, or "" when it is absent or not a string.
inline std::string_view string_at(const boost::json::object& o, std::string_view name) {
  const auto* v = o.if_contains(name);
  return v && v->is_string() ? sv(v->get_string()) : std::string_view{};
}

// A JSON value's truth as Python reads it (the openai SDK tests a stream's
// `error` member so): null, false, 0, "", {} and [] are false.
inline bool truthy(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null:
      return false;
    case boost::json::kind::bool_:
      return v.get_bool();
    case boost::json::kind::int64:
      return v.get_int64() != 0;
    case boost::json::kind::uint64:
      return v.get_uint64() != 0;
    case boost::json::kind::double_:
      return v.get_double() != 0;
    case boost::json::kind::string:
      return !v.get_string().empty();
    case boost::json::kind::array:
      return !v.get_array().empty();
    case boost::json::kind::object:
      return !v.get_object().empty();
  }
  return false;
}

// An OpenAI/vLLM stream chunk that is an in-band error: an `error` member
// that is truthy (vLLM's and OpenAI's `{"error": {"message": …}}`), or
// `"object": "error"` (vLLM before 0.6: `{"object": "error", "message": …}`),
// as openai::classify_chunk tells one. Returns its message ("" when it has
// none), or nullopt when `chunk` is no error.
inline std::optional<std::string_view> stream_error_message(const boost::json::object& chunk) {
  if (const auto* e = chunk.if_contains("error"); e && truthy(*e))
    return e->is_object() ? string_at(e->get_object(), "message") : std::string_view{};
  if (string_at(chunk, "object") == "error") return string_at(chunk, "message");
  return std::nullopt;
}

// An OpenAI/vLLM stream chunk that carries nothing: no choice (an empty or
// absent `choices`) and no usage object; Azure OpenAI's first chunk (its
// prompt_filter_results, with id "" and model "") is one.
inline bool says_nothing(const boost::json::object& chunk) {
  const auto* choices = chunk.if_contains("choices");
  const auto* usage = chunk.if_contains("usage");
  return (choices == nullptr || (choices->is_array() && choices->get_array().empty())) &&
         !(usage != nullptr && usage->is_object());
}

// A per-thread block of `Size` bytes for a translator's DOMs (the first
// buffer of a json::monotonic_resource; larger bodies go on to the heap),
// one per `Tag` (a type of the call site's own, so nested translations
// never share one). Allocated on the thread's first call and uninitialised:
// a thread that never translates (the control thread, the request-log
// writer) carries none, where a thread_local array would put `Size` bytes
// in every thread's TLS block, zeroed, hence resident, at thread start.
template <class Tag, std::size_t Size>
unsigned char* thread_arena() {
  thread_local std::unique_ptr<unsigned char[]> block;
  if (!block) block.reset(new unsigned char[Size]);
  return block.get();
}

}  // namespace weir::api
