// Anthropic Messages request → OpenAI chat-completions body, with
// Boost.JSON in a per-thread arena: only requests on /v1/messages pay for it.
#include "api/anthropic/request.hpp"
#include "api/json_dom.hpp"

#include <fmt/format.h>
#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include "api/json_write.hpp"

#include "api/error_text.hpp"
#include "api/json_scan.hpp"
#include "api/member_names.hpp"
#include "api/request.hpp"
#include "api/wide_integers.hpp"
#include "core/json_text.hpp"

namespace weir::api::anthropic {

namespace json = boost::json;

namespace {

using Fail = tl::unexpected<core::Error>;

Fail invalid(std::string message, std::string_view param = {}) {
  return Fail(core::bad_request(std::move(message), param));
}

// The `type` member of a content block or tool choice, or "".
std::string_view type_of(const json::object& o) {
  const auto* t = o.if_contains("type");
  return t && t->is_string() ? sv(t->get_string()) : std::string_view{};
}

// A block's string member `name`, or an error naming `where`.
tl::expected<std::string_view, core::Error> string_member(const json::object& o, std::string_view name,
                                                          std::string_view where) {
  const auto* v = o.if_contains(name);
  if (!v || !v->is_string()) return invalid(fmt::format("{}.{}: Field required (a string)", where, name));
  return sv(v->get_string());
}

// One request's translation: `out` is the upstream chat-completions body
// being built, `fields` what the gateway learns on the way.
class Translation {
 public:
  Translation(json::storage_ptr sp, RequestFields& fields)
      : sp_(std::move(sp)), fields_(fields), messages_(sp_), out_(sp_) {}

  tl::expected<void, core::Error> system(const json::value& v);
  tl::expected<void, core::Error> message(const json::value& v, std::size_t i, bool last);
  tl::expected<void, core::Error> tools(const json::value& v);
  tl::expected<void, core::Error> tool_choice(const json::value& v);

  json::array& messages() { return messages_; }
  json::object& out() { return out_; }

 private:
  // Text blocks joined (system prompt, tool results): `where` names the field in errors.
  tl::expected<void, core::Error> join_text(const json::value& v, std::string_view where, json::string& text);
  tl::expected<void, core::Error> user_turn(const json::array& blocks, std::string_view where);
  tl::expected<void, core::Error> assistant_turn(const json::array& blocks, std::string_view where);
  void push(std::string_view role, json::value content) {
    json::object m(sp_);
    m["role"] = role;
    m["content"] = std::move(content);
    messages_.push_back(std::move(m));
    fields_.prompt_overhead_tokens += RequestFields::kChatTokensPerMessage;
  }

  json::storage_ptr sp_;
  RequestFields& fields_;
  json::array messages_;
  json::object out_;
};

tl::expected<void, core::Error> Translation::join_text(const json::value& v, std::string_view where,
                                                       json::string& text) {
  if (v.is_string()) {
    text = v.get_string();
    fields_.prompt_bytes += text.size();
    return {};
  }
  if (!v.is_array()) return invalid(fmt::format("{}: Input should be a string or a list of text blocks", where));
  const auto& a = v.get_array();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string w = fmt::format("{}.{}", where, i);
    if (!a[i].is_object() || type_of(a[i].get_object()) != "text")
      return invalid(fmt::format("{}: only text blocks can be translated here", w));
    auto t = string_member(a[i].get_object(), "text", w);
    if (!t) return tl::unexpected(t.error());
    if (!text.empty()) text.append("\n");
    text.append(*t);
    fields_.prompt_bytes += t->size();
  }
  return {};
}

tl::expected<void, core::Error> Translation::system(const json::value& v) {
  json::string text(sp_);
  if (auto r = join_text(v, "system", text); !r) return r;
  // An empty system prompt ("" or []) is none: an explicit empty system
  // message would replace a chat template's default one.
  if (!text.empty()) push("system", std::move(text));
  return {};
}

tl::expected<void, core::Error> Translation::message(const json::value& v, std::size_t i, bool last) {
  const std::string where = fmt::format("messages.{}", i);
  if (!v.is_object()) return invalid(fmt::format("{}: Input should be an object", where));
  const auto& m = v.get_object();
  auto role = string_member(m, "role", where);
  if (!role) return tl::unexpected(role.error());
  if (*role != "user" && *role != "assistant")
    return invalid(fmt::format("{}.role: Input should be 'user' or 'assistant'", where));
  const auto* content = m.if_contains("content");
  if (!content) return invalid(fmt::format("{}.content: Field required", where));
  if (content->is_string()) {
    fields_.prompt_bytes += content->get_string().size();
    push(*role, content->get_string());
    return {};
  }
  if (!content->is_array())
    return invalid(fmt::format("{}.content: Input should be a string or a list of content blocks", where));
  // (Anthropic's optional final assistant message may be empty: no prefill, left out.)
  if (content->get_array().empty() && last && *role == "assistant") return {};
  if (content->get_array().empty())
    return invalid(fmt::format("{}.content: List should have at least 1 item", where), "messages");
  return *role == "user" ? user_turn(content->get_array(), where) : assistant_turn(content->get_array(), where);
}

// A user turn: text and image blocks become one user message's parts;
// each tool_result becomes a `role: tool` message, in the blocks' order.
tl::expected<void, core::Error> Translation::user_turn(const json::array& blocks, std::string_view where) {
  json::array parts(sp_);
  auto flush = [&] {
    if (!parts.empty()) push("user", std::move(parts));
    parts = json::array(sp_);
  };
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::string w = fmt::format("{}.content.{}", where, i);
    if (!blocks[i].is_object()) return invalid(fmt::format("{}: Input should be a content block object", w));
    const auto& b = blocks[i].get_object();
    const std::string_view type = type_of(b);
    if (type == "text") {
      auto t = string_member(b, "text", w);
      if (!t) return tl::unexpected(t.error());
      fields_.prompt_bytes += t->size();
      parts.push_back(json::object({{"type", "text"}, {"text", *t}}, sp_));
    } else if (type == "image") {
      const auto* src = b.if_contains("source");
      if (!src || !src->is_object()) return invalid(fmt::format("{}.source: Field required", w));
      const auto& s = src->get_object();
      json::string url(sp_);
      if (type_of(s) == "base64") {
        auto media = string_member(s, "media_type", fmt::format("{}.source", w));
        if (!media) return tl::unexpected(media.error());
        auto data = string_member(s, "data", fmt::format("{}.source", w));
        if (!data) return tl::unexpected(data.error());
        url.append("data:").append(*media).append(";base64,").append(*data);
      } else if (type_of(s) == "url") {
        auto u = string_member(s, "url", fmt::format("{}.source", w));
        if (!u) return tl::unexpected(u.error());
        url = *u;
      } else {
        return invalid(fmt::format("{}.source.type: only 'base64' and 'url' images can be translated", w));
      }
      parts.push_back(json::object({{"type", "image_url"}, {"image_url", json::object({{"url", url}}, sp_)}}, sp_));
      ++fields_.media_parts;
    } else if (type == "tool_result") {
      flush();
      auto id = string_member(b, "tool_use_id", w);
      if (!id) return tl::unexpected(id.error());
      json::string text(sp_);
      if (const auto* c = b.if_contains("content"); c && !c->is_null())
        if (auto r = join_text(*c, fmt::format("{}.content", w), text); !r) return r;
      if (const auto* e = b.if_contains("is_error"); e && e->is_bool() && e->get_bool()) text.insert(0, "Error: ");
      json::object tm(sp_);
      tm["role"] = "tool";
      tm["tool_call_id"] = *id;
      tm["content"] = std::move(text);
      messages_.push_back(std::move(tm));
      fields_.prompt_overhead_tokens += RequestFields::kChatTokensPerMessage;
    } else {
      return invalid(fmt::format("{}.type: content block type '{}' cannot be translated for this model server", w,
                                 core::utf8_prefix(type, 64)));
    }
  }
  flush();
  return {};
}

// An assistant turn: text blocks joined into `content`, tool_use blocks into
// `tool_calls`; thinking blocks are dropped (vLLM takes no reasoning input).
tl::expected<void, core::Error> Translation::assistant_turn(const json::array& blocks, std::string_view where) {
  json::string text(sp_);
  json::array calls(sp_);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::string w = fmt::format("{}.content.{}", where, i);
    if (!blocks[i].is_object()) return invalid(fmt::format("{}: Input should be a content block object", w));
    const auto& b = blocks[i].get_object();
    const std::string_view type = type_of(b);
    if (type == "text") {
      auto t = string_member(b, "text", w);
      if (!t) return tl::unexpected(t.error());
      text.append(*t);
      fields_.prompt_bytes += t->size();
    } else if (type == "tool_use") {
      auto id = string_member(b, "id", w);
      if (!id) return tl::unexpected(id.error());
      auto name = string_member(b, "name", w);
      if (!name) return tl::unexpected(name.error());
      const auto* input = b.if_contains("input");
      const std::string args = input && !input->is_null() ? to_json(*input) : std::string("{}");
      fields_.prompt_bytes += args.size();
      calls.push_back(json::object(
          {{"id", *id}, {"type", "function"}, {"function", json::object({{"name", *name}, {"arguments", args}}, sp_)}},
          sp_));
    } else if (type != "thinking" && type != "redacted_thinking") {
      return invalid(fmt::format("{}.type: content block type '{}' cannot be translated for this model server", w,
                                 core::utf8_prefix(type, 64)));
    }
  }
  json::object m(sp_);
  m["role"] = "assistant";
  if (!text.empty() || calls.empty()) m["content"] = std::move(text);
  if (!calls.empty()) m["tool_calls"] = std::move(calls);
  messages_.push_back(std::move(m));
  fields_.prompt_overhead_tokens += RequestFields::kChatTokensPerMessage;
  return {};
}

tl::expected<void, core::Error> Translation::tools(const json::value& v) {
  if (!v.is_array()) return invalid("tools: Input should be a list", "tools");
  json::array out(sp_);
  const auto& a = v.get_array();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string w = fmt::format("tools.{}", i);
    if (!a[i].is_object()) return invalid(fmt::format("{}: Input should be an object", w), "tools");
    const auto& t = a[i].get_object();
    if (const std::string_view type = type_of(t); !type.empty() && type != "custom")
      return invalid(fmt::format("{}.type: server tool '{}' is not available on this model server", w,
                                 core::utf8_prefix(type, 64)),
                     "tools");
    auto name = string_member(t, "name", w);
    if (!name) return tl::unexpected(name.error());
    json::object fn(sp_);
    fn["name"] = *name;
    if (const auto* d = t.if_contains("description"); d && d->is_string()) {
      fn["description"] = d->get_string();
      fields_.prompt_bytes += d->get_string().size();
    }
    const auto* schema = t.if_contains("input_schema");
    if (!schema || !schema->is_object()) return invalid(fmt::format("{}.input_schema: Field required", w), "tools");
    json::object params = schema->get_object();
    params.erase("cache_control");
    fields_.prompt_bytes += name->size() + to_json(params).size();  // the template renders the schema
    fn["parameters"] = std::move(params);
    // (Structured outputs' strict tool use: chat's function.strict.)
    if (const auto* st = t.if_contains("strict"); st && st->is_bool()) fn["strict"] = st->get_bool();
    out.push_back(json::object({{"type", "function"}, {"function", std::move(fn)}}, sp_));
  }
  out_["tools"] = std::move(out);
  return {};
}

tl::expected<void, core::Error> Translation::tool_choice(const json::value& v) {
  if (!v.is_object()) return invalid("tool_choice: Input should be an object", "tool_choice");
  const auto& c = v.get_object();
  const std::string_view type = type_of(c);
  if (type == "auto") {
    out_["tool_choice"] = "auto";
  } else if (type == "any") {
    out_["tool_choice"] = "required";
  } else if (type == "none") {
    out_["tool_choice"] = "none";
  } else if (type == "tool") {
    auto name = string_member(c, "name", "tool_choice");
    if (!name) return tl::unexpected(name.error());
    out_["tool_choice"] = json::object({{"type", "function"}, {"function", json::object({{"name", *name}}, sp_)}}, sp_);
  } else {
    return invalid("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'", "tool_choice");
  }
  if (const auto* p = c.if_contains("disable_parallel_tool_use"); p && p->is_bool() && p->get_bool())
    out_["parallel_tool_calls"] = false;
  return {};
}

// A number member copied as it is (temperature, top_p); `integer`: top_k.
tl::expected<void, core::Error> copy_number(const json::object& in, std::string_view name, json::object& out,
                                            bool integer) {
  const auto* v = in.if_contains(name);
  if (!v || v->is_null()) return {};
  if (integer ? !(v->is_int64() || v->is_uint64()) : !v->is_number())
    return invalid(fmt::format("{}: Input should be a valid {}", name, integer ? "integer" : "number"), name);
  out[name] = *v;
  return {};
}

// Anthropic's structured output (`output_config.format`, and the beta's
// top-level `output_format`: Anthropic API reference, "Structured outputs")
// as chat completions' response_format: {type: json_schema, schema} →
// {"type": "json_schema", "json_schema": {"name": "output", "schema",
// "strict": true}} (Anthropic enforces the schema: vLLM's guided decoding
// does). Null when the request asks for none; a 400 for what cannot be mapped.
tl::expected<json::value, core::Error> response_format(const json::object& in, const json::storage_ptr& sp) {
  const json::value* format = nullptr;
  std::string_view where;
  if (const auto* oc = in.if_contains("output_config"); oc && !oc->is_null()) {
    if (!oc->is_object()) return invalid("output_config: Input should be an object", "output_config");
    if (const auto* f = oc->get_object().if_contains("format"); f && !f->is_null()) {
      format = f;
      where = "output_config.format";
    }
  }
  if (const auto* f = in.if_contains("output_format"); f && !f->is_null()) {
    if (format != nullptr)
      return invalid("output_format: give output_config.format or output_format (deprecated), not both",
                     "output_format");
    format = f;
    where = "output_format";
  }
  if (format == nullptr) return json::value(nullptr);
  const std::string_view param = where.substr(0, where.find('.'));
  if (!format->is_object()) return invalid(fmt::format("{}: Input should be an object", where), param);
  const auto& fo = format->get_object();
  if (type_of(fo) != "json_schema") return invalid(fmt::format("{}.type: Input should be 'json_schema'", where), param);
  const auto* schema = fo.if_contains("schema");
  if (!schema || !schema->is_object())
    return invalid(fmt::format("{}.schema: Field required (an object)", where), param);
  json::object js({{"name", "output"}, {"schema", *schema}, {"strict", true}}, sp);
  return json::value(json::object({{"type", "json_schema"}, {"json_schema", std::move(js)}}, sp));
}

void serialize_into(const json::value& v, std::string& out) {
  out.clear();
  append_json(out, v);
}

}  // namespace

std::string_view upstream_path(Target t) { return t == Target::messages ? "/v1/chat/completions" : "/tokenize"; }

tl::expected<RequestFields, core::Error> translate_request(Target t, std::string_view body, std::string& out,
                                                           bool vllm) {
  // The DOMs (the client's and the upstream's) live in a per-thread arena,
  // then the heap for larger bodies (images); released before returning.
  struct Arena;
  json::monotonic_resource mr(thread_arena<Arena, 64 * 1024>(), 64 * 1024);
  json::storage_ptr sp(&mr);
  json::parse_options opt;
  opt.max_depth = kMaxBodyDepth;
  boost::system::error_code ec;
  json::value doc = json::parse(json::string_view(body.data(), body.size()), ec, sp, opt);
  if (ec) {
    if (body.empty()) return invalid("The request body is empty; expected a JSON object.");
    return invalid(invalid_body_message(ec, body));
  }
  if (!doc.is_object()) return invalid("The request body must be a JSON object.");
  // Every top-level member is read (translated; or, passed on to Anthropic, translated for a fallback):
  // one given twice is refused, as parsers differ on which copy counts.
  if (const auto rep = repeated_member(body, doc.get_object().size()))
    return tl::unexpected(repeated_member_error(*rep));
  if (!numbers_finite(doc)) return invalid("The request body has a number too large for a JSON number (e.g. 1e400).");
  // An integer beyond 64 bits (a tool's schema, a tool_use input) is kept
  // exactly: parsed again with it as a token, restored in the output.
  WideIntegers wide;
  std::string protected_body;
  if (has_wide_integer(doc))
    if (const auto text = wide.protect(body, protected_body); !wide.empty())
      doc = json::parse(json::string_view(text.data(), text.size()), ec, sp, opt);
  const auto& in = doc.get_object();

  RequestFields f;
  Translation tr(sp, f);
  json::object& o = tr.out();
  const auto* model = in.if_contains("model");
  if (!model || !model->is_string() || model->get_string().empty())
    return invalid("model: Field required (a non-empty string)", "model");
  f.model.assign(model->get_string().data(), model->get_string().size());
  o["model"] = model->get_string();

  if (t == Target::messages) {
    const auto* mt = in.if_contains("max_tokens");
    if (!mt || mt->is_null()) return invalid("max_tokens: Field required", "max_tokens");
    // (Weir counts it in 32 bits: a larger one, one past 64 bits that parses as a double too, is refused with
    // its real bound, not as "not positive".)
    if ((mt->is_int64() && mt->get_int64() > 0xffffffffLL) || (mt->is_uint64() && mt->get_uint64() > 0xffffffffULL) ||
        (mt->is_double() && mt->get_double() > 4294967295.0) ||
        (mt->is_string() && wide.literal_of(sv(mt->get_string())).find_first_of("123456789") == 0))
      return invalid("max_tokens: Input should be less than or equal to 4294967295", "max_tokens");
    const bool positive = (mt->is_int64() && mt->get_int64() >= 1) || (mt->is_uint64() && mt->get_uint64() >= 1);
    if (!positive) return invalid("max_tokens: Input should be a positive integer", "max_tokens");
    f.max_tokens = static_cast<std::uint32_t>(mt->to_number<std::uint64_t>());
  }

  if (const auto* s = in.if_contains("system"); s && !s->is_null())
    if (auto r = tr.system(*s); !r) return tl::unexpected(r.error());
  const auto* msgs = in.if_contains("messages");
  if (!msgs) return invalid("messages: Field required", "messages");
  if (!msgs->is_array()) return invalid("messages: Input should be a list", "messages");
  for (std::size_t i = 0; i < msgs->get_array().size(); ++i)
    if (auto r = tr.message(msgs->get_array()[i], i, i + 1 == msgs->get_array().size()); !r)
      return tl::unexpected(r.error());
  // A last assistant turn is a prefill: Anthropic continues it. vLLM does
  // so with continue_final_message (and no new generation prompt); a turn
  // with tool calls cannot be continued. An empty one (no text: "", or only
  // thinking) is no prefill (Anthropic allows it as the optional final
  // message): it is left out, so the model gets its generation prompt.
  auto& out_msgs = tr.messages();
  const auto empty_text = [](const json::value* c) {
    if (c == nullptr || c->is_null()) return true;
    if (c->is_string()) return c->get_string().empty();
    if (!c->is_array()) return false;
    for (const auto& part : c->get_array()) {
      const auto* text = part.is_object() ? part.get_object().if_contains("text") : nullptr;
      if (!text || !text->is_string() || !text->get_string().empty()) return false;
    }
    return true;
  };
  while (!out_msgs.empty()) {
    const auto& last = out_msgs.back().get_object();
    if (last.at("role").as_string() != "assistant" || last.contains("tool_calls") ||
        !empty_text(last.if_contains("content")))
      break;
    out_msgs.pop_back();
  }
  // (A server that refuses unknown members, a hosted API, gets the prefill as the last message and no more.)
  if (!out_msgs.empty() && (vllm || t == Target::count_tokens)) {
    const auto& last = out_msgs.back().get_object();
    if (last.at("role").as_string() == "assistant" && !last.contains("tool_calls")) {
      o["add_generation_prompt"] = false;
      o["continue_final_message"] = true;
    }
  }
  o["messages"] = std::move(tr.messages());

  if (const auto* v = in.if_contains("tools"); v && !v->is_null())
    if (auto r = tr.tools(*v); !r) return tl::unexpected(r.error());
  if (const auto* v = in.if_contains("tool_choice"); v && !v->is_null())
    if (auto r = tr.tool_choice(*v); !r) return tl::unexpected(r.error());
  // (On a token count too: the template's switch changes the prompt it renders, and vLLM's /tokenize
  // takes chat_template_kwargs, so the count is the generation's prompt_tokens.)
  if (const auto* th = in.if_contains("thinking"); th && th->is_object()) {
    // vLLM has no thinking budget; reasoning models whose chat template
    // reads `enable_thinking` (Qwen3, ...) are switched on or off with it.
    // `adaptive` (the model decides how much to think) is on. `between_tools`
    // is thinking off, with whatever the model writes between tool calls
    // given back as thinking blocks: off in the template, and the answer keeps
    // any reasoning the server sends as thinking blocks, as `enabled` does.
    const std::string_view type = type_of(th->get_object());
    if (type != "enabled" && type != "disabled" && type != "adaptive" && type != "between_tools")
      return invalid("thinking.type: Input should be 'enabled', 'disabled', 'adaptive' or 'between_tools'", "thinking");
    f.thinking = type != "disabled";
    const bool think = type == "enabled" || type == "adaptive";
    // (vLLM's member: a server that refuses unknown members, a hosted API, gets none. /tokenize is vLLM's.)
    if (vllm || t == Target::count_tokens) o["chat_template_kwargs"] = json::object({{"enable_thinking", think}}, sp);
  }
  auto format = response_format(in, sp);
  if (!format) return tl::unexpected(format.error());
  // Nothing to answer, nor to count (Anthropic's API refuses both): no generation from an empty prompt.
  // (Checked after the fields both routes read, as before, so their errors come first.)
  const auto no_messages = [&] { return invalid("messages: at least one message is required", "messages"); };
  if (t == Target::count_tokens) {
    if (msgs->get_array().empty()) return no_messages();
    // vLLM's /tokenize takes model, messages, tools (and the chat template
    // switches); sampling fields mean nothing there.
    o.erase("tool_choice");
    o.erase("parallel_tool_calls");
    serialize_into(o, out);
    wide.restore(out);
    return f;
  }

  o["max_tokens"] = f.max_tokens;
  if (const auto* s = in.if_contains("stream"); s && !s->is_null()) {
    if (!s->is_bool()) return invalid("stream: Input should be a valid boolean", "stream");
    f.stream = s->get_bool();
  }
  if (f.stream) {
    o["stream"] = true;
    // (vLLM puts per-chunk usage on the role chunk too: message_start's input_tokens. The last chunk's is the
    // total, as without it: the stream translator and the usage hook take it, never a sum over the chunks.)
    json::object so({{"include_usage", true}}, sp);
    if (vllm) so["continuous_usage_stats"] = true;
    o["stream_options"] = std::move(so);
    f.has_stream_options = f.include_usage = f.usage_asked = true;
  }
  if (const auto* v = in.if_contains("stop_sequences"); v && !v->is_null()) {
    if (!v->is_array()) return invalid("stop_sequences: Input should be a list of strings", "stop_sequences");
    for (const auto& s : v->get_array())
      if (!s.is_string()) return invalid("stop_sequences: Input should be a list of strings", "stop_sequences");
    if (!v->get_array().empty()) o["stop"] = *v;
  }
  for (const char* name : {"temperature", "top_p"})
    if (auto r = copy_number(in, name, o, false); !r) return tl::unexpected(r.error());
  if (auto r = copy_number(in, "top_k", o, true); !r) return tl::unexpected(r.error());
  if (!vllm) o.erase("top_k");  // (vLLM's member, checked all the same: OpenAI's API has none)
  if (!format->is_null()) o["response_format"] = std::move(*format);
  if (const auto* md = in.if_contains("metadata"); md && md->is_object())
    if (const auto* u = md->get_object().if_contains("user_id"); u && u->is_string()) o["user"] = u->get_string();
  if (msgs->get_array().empty()) return no_messages();
  serialize_into(o, out);
  wide.restore(out);
  return f;
}

}  // namespace weir::api::anthropic
