#include "api/openai/resume.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>

#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include "api/json_write.hpp"

#include "api/json_scan.hpp"
#include "api/request.hpp"
#include "api/usage.hpp"
#include "api/wide_integers.hpp"
#include "core/json_text.hpp"

namespace weir::api::openai {

namespace json = boost::json;

namespace {

std::string_view value_of(std::string_view json, const MemberSpan& m) {
  return json.substr(m.value_begin, m.value_end - m.value_begin);
}

std::optional<std::string_view> member(std::string_view json, std::string_view key) {
  auto m = find_member(json, key);
  if (!m) return std::nullopt;
  return value_of(json, *m);
}

bool is_null(std::string_view v) { return v == "null"; }

// A JSON string literal's contents (between its quotes), escapes kept; nullopt for anything else.
std::optional<std::string_view> string_contents(std::string_view v) {
  if (v.size() < 2 || v.front() != '"' || v.back() != '"') return std::nullopt;
  return v.substr(1, v.size() - 2);
}

// A non-empty array or string, or an object with members: a delta field that carries something.
bool carries(std::string_view v) {
  if (v.size() < 2) return !v.empty() && !is_null(v);
  if (is_null(v)) return false;
  if (v == "[]" || v == "{}" || v == "\"\"") return false;
  return v != "false";
}

}  // namespace

void ResumeTracker::reset(std::size_t reserve_bytes) {
  text_.clear();
  if (text_.capacity() < reserve_bytes) text_.reserve(reserve_bytes);
  ids_.clear();
  id_end_ = created_end_ = 0;
  tokens_ = 0;
  have_ids_ = noted_ = blocked_ = finished_ = false;
}

ChunkNote ResumeTracker::on_chunk(std::string_view data) {
  const std::string_view keys[] = {"id", "created", "model", "choices", "usage", "error"};
  std::optional<MemberSpan> found[std::size(keys)];
  if (!find_members(data, keys, found)) {
    noted_ = true;  // (it goes to the client all the same)
    return ChunkNote::other;
  }
  if (found[5]) return ChunkNote::error;
  noted_ = true;
  if (!have_ids_ && found[0]) {
    have_ids_ = true;
    ids_.append(value_of(data, *found[0]));
    id_end_ = ids_.size();
    if (found[1]) ids_.append(value_of(data, *found[1]));
    created_end_ = ids_.size();
    if (found[2]) ids_.append(value_of(data, *found[2]));
  }
  if (found[4] && !is_null(value_of(data, *found[4]))) {
    if (auto u = extract_usage(data)) tokens_ = std::max(tokens_, u->completion_tokens);
  }
  if (!found[3]) return ChunkNote::other;
  const std::string_view choices = value_of(data, *found[3]);
  const auto first = first_element(choices);
  if (!first) return ChunkNote::other;  // the usage chunk: "choices": []
  const std::string_view choice = choices.substr(first->begin, first->end - first->begin);
  // One choice per chunk (n is 1): anything after the first element is another choice.
  {
    std::size_t i = first->end;
    while (i < choices.size() && (choices[i] == ' ' || choices[i] == '\n' || choices[i] == '\r' || choices[i] == '\t'))
      ++i;
    if (i < choices.size() && choices[i] == ',') {
      blocked_ = true;
      return ChunkNote::blocked;
    }
  }
  const std::string_view ckeys[] = {"index", "delta", "finish_reason"};
  std::optional<MemberSpan> cf[std::size(ckeys)];
  if (!find_members(choice, ckeys, cf)) return ChunkNote::other;
  if (cf[0] && value_of(choice, *cf[0]) != "0") {
    blocked_ = true;
    return ChunkNote::blocked;
  }
  if (cf[2] && !is_null(value_of(choice, *cf[2]))) finished_ = true;
  if (!cf[1]) return ChunkNote::other;
  const std::string_view delta = value_of(choice, *cf[1]);
  const std::string_view dkeys[] = {"content",           "tool_calls", "function_call",
                                    "reasoning_content", "reasoning",  "refusal"};
  std::optional<MemberSpan> df[std::size(dkeys)];
  if (!find_members(delta, dkeys, df)) return ChunkNote::other;
  for (std::size_t i = 1; i < std::size(dkeys); ++i) {
    if (df[i] && carries(value_of(delta, *df[i]))) {
      blocked_ = true;
      return ChunkNote::blocked;
    }
  }
  if (df[0]) {
    if (auto s = string_contents(value_of(delta, *df[0])); s && !s->empty()) {
      text_.append(*s);
      // Usage on every chunk (continuous_usage_stats) already counted this one.
      if (!(found[4] && !is_null(value_of(data, *found[4])))) ++tokens_;
    }
  }
  return ChunkNote::other;
}

bool resume_excluded(std::string_view body) {
  // Structured output (OpenAI's response_format other than text; vLLM's
  // guided_* fields, structured_outputs and structural_tag): vLLM applies
  // the grammar to the tokens it generates, never to an assistant prefix, so
  // a continuation would start the document or the choice over.
  const std::string_view keys[] = {"logprobs",
                                   "top_logprobs",
                                   "prompt_logprobs",
                                   "n",
                                   "guided_json",
                                   "guided_regex",
                                   "guided_choice",
                                   "guided_grammar",
                                   "guided_whitespace_pattern",
                                   "structured_outputs",
                                   "structural_tag",
                                   "echo",
                                   "continue_final_message",
                                   "add_generation_prompt",
                                   "response_format"};
  std::optional<MemberSpan> found[std::size(keys)];
  if (!find_members(body, keys, found)) return true;
  if (found[0] && value_of(body, *found[0]) != "false" && !is_null(value_of(body, *found[0]))) return true;
  if (found[1] && !is_null(value_of(body, *found[1]))) return true;
  if (found[2] && !is_null(value_of(body, *found[2]))) return true;
  if (found[3] && value_of(body, *found[3]) != "1" && !is_null(value_of(body, *found[3]))) return true;
  for (std::size_t i = 4; i < 11; ++i)
    if (found[i] && !is_null(value_of(body, *found[i]))) return true;
  // vLLM's chat echo streams the last message's content (an assistant
  // prefill) as its own chunk first: the client's text would then hold the
  // prefill twice in a continuation's message.
  if (found[11] && value_of(body, *found[11]) != "false" && !is_null(value_of(body, *found[11]))) return true;
  // The prefill flags as anything but JSON booleans ("true", 1): vLLM's
  // pydantic reads them as booleans, and a continuation that read them
  // otherwise would render another prompt.
  for (std::size_t i = 12; i < 14; ++i)
    if (found[i]) {
      const std::string_view v = value_of(body, *found[i]);
      if (v != "true" && v != "false" && !is_null(v)) return true;
    }
  if (const auto& rf = found[std::size(keys) - 1]; rf && !is_null(value_of(body, *rf))) {
    // {"type": "text"} is no constraint; any other value is (or is not understood).
    const std::string_view fmt = value_of(body, *rf);
    const std::string_view tkeys[] = {"type"};
    std::optional<MemberSpan> t[1];
    if (!find_members(fmt, tkeys, t) || !t[0] || value_of(fmt, *t[0]) != "\"text\"") return true;
  }
  return false;
}

Continuation continuation_body(std::string_view body, std::string_view text_json, std::uint64_t tokens_done,
                               std::string& out) {
  json::monotonic_resource mr;
  boost::system::error_code ec;
  json::value doc = json::parse(body, ec, &mr);
  if (ec || !doc.is_object() || !numbers_finite(doc)) return Continuation::unsupported;
  // An integer beyond 64 bits (a tool's schema, a seed) reaches the upstream
  // exactly: parsed again with it as a token, restored in the output
  // (api/wide_integers.hpp).
  WideIntegers wide;
  std::string protected_body;
  if (has_wide_integer(doc))
    if (const auto text = wide.protect(body, protected_body); !wide.empty()) {
      doc = json::parse(text, ec, &mr);
      if (ec || !doc.is_object()) return Continuation::unsupported;
    }
  auto& o = doc.get_object();
  auto* msgs = o.if_contains("messages");
  if (msgs == nullptr || !msgs->is_array()) return Continuation::unsupported;

  // The text: escaped JSON string contents, decoded by the parser (escapes,
  // surrogate pairs split across chunks, raw UTF-8 all come out whole).
  std::string quoted;
  quoted.reserve(text_json.size() + 2);
  quoted += '"';
  quoted += text_json;
  quoted += '"';
  json::value text = json::parse(quoted, ec, &mr);
  if (ec || !text.is_string()) return Continuation::unsupported;

  // The limits, lowered by what was produced; nothing left: finish instead.
  for (const char* k : {"max_tokens", "max_completion_tokens"}) {
    auto* v = o.if_contains(k);
    if (v == nullptr || v->is_null()) continue;
    std::int64_t left = 0;
    if (v->is_int64())
      left = v->get_int64() - static_cast<std::int64_t>(std::min<std::uint64_t>(tokens_done, INT64_MAX));
    else if (v->is_uint64())
      left = static_cast<std::int64_t>(std::min<std::uint64_t>(v->get_uint64(), INT64_MAX)) -
             static_cast<std::int64_t>(std::min<std::uint64_t>(tokens_done, INT64_MAX));
    else
      return Continuation::unsupported;
    if (left <= 0) return Continuation::exhausted;
    *v = left;
  }
  // (min_tokens lowered too; a value other than an integer (50.0, which vLLM reads as 50) is not resumed: the
  // continuation would force the whole minimum again.)
  if (auto* v = o.if_contains("min_tokens"); v != nullptr && !v->is_null()) {
    const auto done = static_cast<std::int64_t>(std::min<std::uint64_t>(tokens_done, INT64_MAX));
    if (v->is_int64())
      *v = std::max<std::int64_t>(0, v->get_int64() - done);
    else if (v->is_uint64())
      *v = std::max<std::int64_t>(
          0, static_cast<std::int64_t>(std::min<std::uint64_t>(v->get_uint64(), INT64_MAX)) - done);
    else
      return Continuation::unsupported;
  }

  auto& arr = msgs->get_array();
  const auto* cont = o.if_contains("continue_final_message");
  const bool continuing = cont != nullptr && cont->is_bool() && cont->get_bool();
  json::object* last = !arr.empty() && arr.back().is_object() ? &arr.back().get_object() : nullptr;
  const auto* last_role = last ? last->if_contains("role") : nullptr;
  auto* last_content = last ? last->if_contains("content") : nullptr;
  // The client was continuing an assistant message of its own: the text goes
  // on from it, a string or its last text part (as vLLM renders parts: the
  // text continues where that part ends).
  json::string* continued = nullptr;
  if (continuing && last_role && last_role->is_string() && last_role->get_string() == "assistant" && last_content) {
    if (last_content->is_string()) {
      continued = &last_content->get_string();
    } else if (last_content->is_array() && !last_content->get_array().empty() &&
               last_content->get_array().back().is_object()) {
      auto& part = last_content->get_array().back().get_object();
      const auto* type = part.if_contains("type");
      auto* t = part.if_contains("text");
      if (type && type->is_string() && type->get_string() == "text" && t && t->is_string())
        continued = &t->get_string();
    }
  }
  if (continued) {
    continued->append(text.get_string());
  } else {
    json::object m(&mr);
    m["role"] = "assistant";
    m["content"] = std::move(text);
    arr.emplace_back(std::move(m));
  }
  o["continue_final_message"] = true;
  o["add_generation_prompt"] = false;
  o.erase("echo");
  out = to_json(doc);
  wide.restore(out);
  return Continuation::ok;
}

Rewrite rewrite_chunk(std::string_view data, std::string_view id_json, std::string_view created_json,
                      std::string_view model_json, std::uint64_t tokens_before, std::string& out,
                      std::string& scratch) {
  const std::string_view keys[] = {"id", "created", "model", "choices", "usage"};
  std::optional<MemberSpan> found[std::size(keys)];
  if (!find_members(data, keys, found)) return Rewrite::keep;

  // The continuation's first chunk: the role, and nothing else (vLLM's role chunk, `"content":""`).
  if (found[3]) {
    const std::string_view choices = value_of(data, *found[3]);
    if (auto first = first_element(choices)) {
      const std::string_view choice = choices.substr(first->begin, first->end - first->begin);
      const std::string_view ckeys[] = {"delta", "finish_reason"};
      std::optional<MemberSpan> cf[2];
      if (find_members(choice, ckeys, cf) && cf[0] && (!cf[1] || is_null(value_of(choice, *cf[1])))) {
        const std::string_view delta = value_of(choice, *cf[0]);
        const std::string_view dkeys[] = {"role", "content"};
        std::optional<MemberSpan> df[2];
        if (find_members(delta, dkeys, df) && df[0]) {
          const bool no_text = !df[1] || !carries(value_of(delta, *df[1]));
          // Any other member with something in it (tool calls, reasoning) keeps the chunk.
          bool other = false;
          for (const char* k : {"tool_calls", "function_call", "reasoning_content", "reasoning", "refusal"})
            if (auto v = member(delta, k); v && carries(*v)) other = true;
          if (no_text && !other) return Rewrite::drop;
        }
      }
    }
  }

  std::string_view cur = data;
  bool changed = false;
  // Each edit writes into the buffer that does not hold `cur`.
  auto set = [&](std::string_view key, std::string_view value) {
    std::string& dst = (changed && cur.data() == out.data()) ? scratch : out;
    if (!set_member(cur, key, value, dst)) return;
    cur = dst;
    changed = true;
  };
  if (!id_json.empty() && found[0] && value_of(data, *found[0]) != id_json) set("id", id_json);
  if (!created_json.empty() && found[1] && value_of(data, *found[1]) != created_json) set("created", created_json);
  if (!model_json.empty() && found[2] && value_of(data, *found[2]) != model_json) set("model", model_json);
  if (found[4] && tokens_before > 0) {
    const std::string_view usage = value_of(data, *found[4]);
    if (auto u = extract_usage(data)) {
      const std::uint64_t prompt = u->prompt_tokens > tokens_before ? u->prompt_tokens - tokens_before : 0;
      const std::uint64_t completion = u->completion_tokens + tokens_before;
      std::string obj(usage);
      std::string tmp;
      std::string num;
      auto put = [&](std::string_view k, std::uint64_t v) {
        if (!find_member(obj, k)) return;
        num.clear();
        core::append_uint(num, v);
        if (set_member(obj, k, num, tmp)) obj.swap(tmp);
      };
      put("prompt_tokens", prompt);
      put("completion_tokens", completion);
      put("total_tokens", prompt + completion);
      // Cached tokens are some of the prompt's: the continuation's cache hits on the tokens it was given
      // back are none of the client's prompt.
      if (u->cached_tokens > prompt)
        if (const auto d = find_member(obj, "prompt_tokens_details")) {
          std::string details(obj.substr(d->value_begin, d->value_end - d->value_begin));
          num.clear();
          core::append_uint(num, prompt);
          if (find_member(details, "cached_tokens") && set_member(details, "cached_tokens", num, tmp) &&
              set_member(obj, "prompt_tokens_details", tmp, details))
            obj.swap(details);
        }
      set("usage", obj);
    }
  }
  if (!changed) return Rewrite::keep;
  if (cur.data() != out.data()) out.assign(cur);
  return Rewrite::changed;
}

}  // namespace weir::api::openai
