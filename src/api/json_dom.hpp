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

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/string.hpp>
#include <boost/json/value.hpp>

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

// An answer's `content` (a chat message's, or a stream chunk's delta's): a
// string, or a list of content parts, as Mistral's API gives it ({"type":
// "text", "text"}; its reasoning models, magistral, put their reasoning first
// as {"type": "thinking", "thinking": [{"type": "text", "text"}, ...]}, or a
// string there). Calls `on_text(piece)` for each non-empty text piece and
// `on_thinking(piece)` for each non-empty piece of reasoning, in order (views
// into the DOM, no copy); parts of other types, and members of another type
// than these, are skipped. `content` may be null (absent).
template <class OnText, class OnThinking>
void for_each_content(const boost::json::value* content, OnText&& on_text, OnThinking&& on_thinking) {
  if (content == nullptr) return;
  if (content->is_string()) {
    if (!content->get_string().empty()) on_text(sv(content->get_string()));
    return;
  }
  if (!content->is_array()) return;
  for (const auto& part : content->get_array()) {
    if (!part.is_object()) continue;
    const auto& p = part.get_object();
    const auto* type = p.if_contains("type");
    if (type == nullptr || !type->is_string()) continue;
    if (type->get_string() == "text") {
      if (const std::string_view t = string_at(p, "text"); !t.empty()) on_text(t);
    } else if (type->get_string() == "thinking") {
      const auto* th = p.if_contains("thinking");
      if (th == nullptr) continue;
      if (th->is_string() && !th->get_string().empty()) on_thinking(sv(th->get_string()));
      if (th->is_array())
        for (const auto& inner : th->get_array())
          if (inner.is_object())
            if (const std::string_view t = string_at(inner.get_object(), "text"); !t.empty()) on_thinking(t);
    }
  }
}

// Pieces of text joined (for_each_content's): a view of the one piece when
// there is one (no copy), else of their concatenation, held here.
class JoinedText {
 public:
  void add(std::string_view piece) {
    if (piece.empty()) return;
    if (view_.empty()) {
      view_ = piece;
      return;
    }
    if (joined_.empty()) joined_.assign(view_);
    joined_ += piece;
    view_ = joined_;
  }
  std::string_view view() const { return view_; }

 private:
  std::string_view view_;
  std::string joined_;
};

// A chat answer's message: its reasoning (vLLM's `reasoning_content`, or
// `reasoning`, then the thinking parts of a `content` list) and its text
// (the `content` string, or the text parts of a list), each joined.
inline void read_message_text(const boost::json::object& msg, JoinedText& reasoning, JoinedText& text) {
  std::string_view r = string_at(msg, "reasoning_content");
  if (r.empty()) r = string_at(msg, "reasoning");
  reasoning.add(r);
  for_each_content(
      msg.if_contains("content"), [&](std::string_view t) { text.add(t); },
      [&](std::string_view t) { reasoning.add(t); });
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
