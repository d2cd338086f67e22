#include "api/openai/stream.hpp"

#include <cstring>

#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "api/json_scan.hpp"
#include "core/text.hpp"

namespace weir::api::openai {

bool ask_for_usage(std::string_view body, bool has_stream_options, std::string& scratch, std::string& out) {
  if (!has_stream_options) return set_member(body, "stream_options", R"({"include_usage":true})", out);
  auto span = find_member(body, "stream_options");
  if (!span) return false;
  std::string_view obj = body.substr(span->value_begin, span->value_end - span->value_begin);
  // vLLM's StreamOptions.include_usage defaults to true: without the member
  // the upstream sends the usage chunk and the client gets it.
  const auto iu = find_member(obj, "include_usage");
  if (!iu) return false;
  // Only a client's false (or null) is turned on: any other value ("true",
  // 1) is the upstream's to read or refuse, and the body goes as it came.
  const std::string_view v = obj.substr(iu->value_begin, iu->value_end - iu->value_begin);
  if (v != "false" && v != "null") return false;
  // vLLM ignores continuous_usage_stats unless include_usage is true: once
  // Weir turns usage on, keep per-chunk usage off, as the client had it.
  std::string no_continuous;
  if (find_member(obj, "continuous_usage_stats") && set_member(obj, "continuous_usage_stats", "false", no_continuous))
    obj = no_continuous;
  return set_member(obj, "include_usage", "true", scratch) && set_member(body, "stream_options", scratch, out);
}

ChunkKind classify_chunk(std::string_view data) {
  // The DOM of an ordinary chunk fits on the stack: no heap allocation
  // (a larger one takes what more it needs from the heap).
  alignas(16) unsigned char stack[4096];
  boost::json::monotonic_resource mr(stack, sizeof stack);
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(data, ec, &mr);
  if (ec || !v.is_object()) return ChunkKind::error;  // an invalid stream
  const auto& o = v.get_object();
  if (o.contains("error")) return ChunkKind::error;
  if (const auto* t = o.if_contains("object"); t && t->is_string() && t->get_string() == "error")
    return ChunkKind::error;
  const auto* choices = o.if_contains("choices");
  if (!choices || !choices->is_array()) return ChunkKind::empty;
  auto non_empty_string = [](const boost::json::value* s) { return s && s->is_string() && !s->get_string().empty(); };
  for (const auto& c : choices->get_array()) {
    if (!c.is_object()) continue;
    const auto& co = c.get_object();
    if (const auto* f = co.if_contains("finish_reason"); f && !f->is_null()) return ChunkKind::content;
    if (non_empty_string(co.if_contains("text"))) return ChunkKind::content;  // completions
    const auto* d = co.if_contains("delta");
    if (!d || !d->is_object()) continue;
    const auto& delta = d->get_object();
    for (const char* k : {"content", "refusal", "reasoning_content", "reasoning"})
      if (non_empty_string(delta.if_contains(k))) return ChunkKind::content;
    if (const auto* t = delta.if_contains("tool_calls"); t && t->is_array() && !t->get_array().empty())
      return ChunkKind::content;
  }
  return ChunkKind::empty;
}

bool begins_like_error(std::string_view data) {
  auto ws = [&](std::size_t i) {
    while (i < data.size() && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r')) ++i;
    return i;
  };
  auto at = [&](std::size_t i, std::string_view s) { return data.substr(i, s.size()) == s; };
  std::size_t i = ws(0);
  if (i >= data.size() || data[i] != '{') return false;
  i = ws(i + 1);
  if (at(i, "\"error\"")) return true;
  std::size_t key = 0;
  if (at(i, "\"object\""))
    key = 8;
  else if (at(i, "\"type\""))
    key = 6;
  else
    return false;
  i = ws(i + key);
  if (i >= data.size() || data[i] != ':') return false;
  return at(ws(i + 1), "\"error\"");
}

bool is_usage_only_chunk(std::string_view data) {
  auto span = find_member(data, "choices");
  if (!span) return false;
  std::string_view v = data.substr(span->value_begin, span->value_end - span->value_begin);
  if (v.size() < 2 || v.front() != '[' || v.back() != ']') return false;
  for (char c : v.substr(1, v.size() - 2))
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return false;
  return find_member(data, "usage").has_value();
}

bool UsageHook::on_data(std::string_view data) {
  // Once per SSE event: one SIMD pass (core::find_substring), not
  // string_view::find, which calls memchr again at each '"' of the chunk
  // (~40 in a vLLM chunk), nor glibc's memmem (~2 instructions per byte).
  if (core::find_substring(data, "\"usage\"") == std::string_view::npos) return true;
  // Counts that do not read (negative, fractional, not numbers) are no
  // usage: the request is metered as one without (gateway settle()).
  if (auto u = extract_usage(data)) {
    has_usage_ = true;
    usage_ = *u;
  }
  // The usage chunk Weir asked for on the client's behalf is not theirs,
  // whatever its numbers say: it is known by its shape, not by its counts.
  return !(strip_ && is_usage_only_chunk(data));
}

bool completion_as_chunk(std::string_view completion, std::string& out) {
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(completion, ec);
  if (ec || !v.is_object()) return false;
  auto& o = v.get_object();
  // (Before the pointer below: adding "object" to a body without it may
  // move the object's members.)
  o["object"] = "chat.completion.chunk";
  auto* choices = o.if_contains("choices");
  if (!choices || !choices->is_array()) return false;
  for (auto& c : choices->get_array()) {
    if (!c.is_object()) continue;
    auto& choice = c.get_object();
    boost::json::value delta = boost::json::object();
    if (auto* m = choice.if_contains("message"); m && m->is_object()) delta = std::move(*m);
    choice.erase("message");
    if (auto* calls = delta.get_object().if_contains("tool_calls"); calls && calls->is_array()) {
      std::int64_t i = 0;
      for (auto& call : calls->get_array()) {
        if (call.is_object() && !call.get_object().contains("index")) call.get_object()["index"] = i;
        ++i;
      }
    }
    choice["delta"] = std::move(delta);
  }
  out = boost::json::serialize(v);
  return true;
}

}  // namespace weir::api::openai
