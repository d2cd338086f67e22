// Responses request → OpenAI chat-completions body, with Boost.JSON in a
// per-thread arena: only requests on /v1/responses pay for it.
#include "api/responses/request.hpp"
#include "api/json_dom.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

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

namespace weir::api::responses {

namespace json = boost::json;

namespace {

using Fail = tl::unexpected<core::Error>;

Fail invalid(std::string message, std::string_view param) { return Fail(core::bad_request(std::move(message), param)); }

// The `type` member of an item, part or tool, or "".
std::string_view type_of(const json::object& o) {
  const auto* t = o.if_contains("type");
  return t && t->is_string() ? sv(t->get_string()) : std::string_view{};
}

// A member that is absent or JSON null.
bool absent(const json::object& o, std::string_view name) {
  const auto* v = o.if_contains(name);
  return !v || v->is_null();
}

// One request's translation into the upstream's `messages`; `fields` gets
// the prompt's size on the way.
class Translation {
 public:
  Translation(json::storage_ptr sp, RequestFields& fields) : sp_(std::move(sp)), fields_(fields), messages_(sp_) {}

  void system(std::string_view text) { push("system", json::string(text, sp_)); }
  tl::expected<void, core::Error> input(const json::value& v);
  tl::expected<json::array, core::Error> tools(const json::value& v);
  tl::expected<json::value, core::Error> tool_choice(const json::value& v);
  tl::expected<json::value, core::Error> text_format(const json::value& v);

  json::array& messages() { return messages_; }

 private:
  tl::expected<void, core::Error> item(const json::value& v, std::size_t i);
  tl::expected<void, core::Error> message(const json::object& m, std::string_view where);
  tl::expected<void, core::Error> function_call(const json::object& c, std::string_view where);
  tl::expected<void, core::Error> function_call_output(const json::object& o, std::string_view where);
  // A string member required in `o`; `where` names `o` in the error.
  tl::expected<std::string_view, core::Error> required_string(const json::object& o, std::string_view name,
                                                              std::string_view where);
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
};

tl::expected<std::string_view, core::Error> Translation::required_string(const json::object& o, std::string_view name,
                                                                         std::string_view where) {
  const auto* v = o.if_contains(name);
  if (!v || !v->is_string()) return invalid(fmt::format("{}.{}: Field required (a string)", where, name), "input");
  return sv(v->get_string());
}

tl::expected<void, core::Error> Translation::input(const json::value& v) {
  if (v.is_string()) {
    fields_.prompt_bytes += v.get_string().size();
    push("user", v.get_string());
    return {};
  }
  if (!v.is_array()) return invalid("input: Input should be a string or a list of input items", "input");
  const auto& items = v.get_array();
  for (std::size_t i = 0; i < items.size(); ++i)
    if (auto r = item(items[i], i); !r) return r;
  return {};
}

tl::expected<void, core::Error> Translation::item(const json::value& v, std::size_t i) {
  const std::string where = fmt::format("input[{}]", i);
  if (!v.is_object()) return invalid(fmt::format("{}: Input should be an object", where), "input");
  const auto& o = v.get_object();
  const std::string_view type = type_of(o);
  // An easy input message has no `type`.
  if (type == "message" || (type.empty() && o.contains("role"))) return message(o, where);
  if (type == "function_call") return function_call(o, where);
  if (type == "function_call_output") return function_call_output(o, where);
  if (type == "reasoning") return {};  // an earlier output fed back: vLLM takes no reasoning input
  if (type == "item_reference")
    return invalid(
        fmt::format("{}.type: item references need a response store, which this server does not keep", where), "input");
  if (type.empty()) return invalid(fmt::format("{}.type: Field required", where), "input");
  return invalid(fmt::format("{}.type: input item type '{}' cannot be translated for this model server", where,
                             core::utf8_prefix(type, 64)),
                 "input");
}

// A message: user content keeps its parts (text and images); the other roles'
// text parts are joined into one string, which every chat template takes.
tl::expected<void, core::Error> Translation::message(const json::object& m, std::string_view where) {
  auto role = required_string(m, "role", where);
  if (!role) return tl::unexpected(role.error());
  const bool user = *role == "user";
  const bool assistant = *role == "assistant";
  if (!user && !assistant && *role != "system" && *role != "developer")
    return invalid(fmt::format("{}.role: Input should be 'user', 'assistant', 'system' or 'developer'", where),
                   "input");
  // Chat completions has no developer role: vLLM's templates know system.
  const std::string_view chat_role = *role == "developer" ? std::string_view("system") : *role;
  const auto* content = m.if_contains("content");
  if (!content) return invalid(fmt::format("{}.content: Field required", where), "input");
  if (content->is_string()) {
    fields_.prompt_bytes += content->get_string().size();
    push(chat_role, content->get_string());
    return {};
  }
  if (!content->is_array())
    return invalid(fmt::format("{}.content: Input should be a string or a list of content parts", where), "input");
  const auto& parts = content->get_array();
  json::array out_parts(sp_);
  json::string text(sp_);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::string w = fmt::format("{}.content[{}]", where, i);
    if (!parts[i].is_object()) return invalid(fmt::format("{}: Input should be a content part object", w), "input");
    const auto& p = parts[i].get_object();
    const std::string_view type = type_of(p);
    if (type == "input_text" || type == "output_text" || type == "refusal") {
      auto t = required_string(p, type == "refusal" ? "refusal" : "text", w);
      if (!t) return tl::unexpected(t.error());
      fields_.prompt_bytes += t->size();
      if (user) {
        out_parts.push_back(json::object({{"type", "text"}, {"text", *t}}, sp_));
      } else {
        if (!text.empty() && !assistant) text.append("\n");
        text.append(*t);
      }
    } else if (type == "input_image" && user) {
      if (!absent(p, "file_id") && absent(p, "image_url"))
        return invalid(fmt::format("{}.file_id: images by file id need OpenAI's file store; send image_url", w),
                       "input");
      auto url = required_string(p, "image_url", w);
      if (!url) return tl::unexpected(url.error());
      json::object image({{"url", *url}}, sp_);
      if (const auto* d = p.if_contains("detail"); d && d->is_string()) image["detail"] = d->get_string();
      out_parts.push_back(json::object({{"type", "image_url"}, {"image_url", std::move(image)}}, sp_));
      ++fields_.media_parts;
    } else {
      return invalid(fmt::format("{}.type: content part type '{}' cannot be translated for a {} message", w,
                                 core::utf8_prefix(type, 64), *role),
                     "input");
    }
  }
  if (user)
    push("user", std::move(out_parts));
  else
    push(chat_role, std::move(text));
  return {};
}

// A function call the model made earlier: a tool call on an assistant
// message (the preceding one when it is an assistant turn, so parallel calls
// and the text before them stay one turn).
tl::expected<void, core::Error> Translation::function_call(const json::object& c, std::string_view where) {
  auto call_id = required_string(c, "call_id", where);
  if (!call_id) return tl::unexpected(call_id.error());
  auto name = required_string(c, "name", where);
  if (!name) return tl::unexpected(name.error());
  auto args = required_string(c, "arguments", where);
  if (!args) return tl::unexpected(args.error());
  fields_.prompt_bytes += name->size() + args->size();
  json::object call({{"id", *call_id},
                     {"type", "function"},
                     {"function", json::object({{"name", *name}, {"arguments", *args}}, sp_)}},
                    sp_);
  if (!messages_.empty()) {
    auto& last = messages_.back().get_object();
    if (last.at("role").as_string() == "assistant") {
      auto* calls = last.if_contains("tool_calls");
      if (!calls) calls = &(last["tool_calls"] = json::array(sp_));
      calls->get_array().push_back(std::move(call));
      if (const auto* t = last.if_contains("content"); t && t->is_string() && t->get_string().empty())
        last.erase("content");
      return {};
    }
  }
  json::object m(sp_);
  m["role"] = "assistant";
  m["tool_calls"] = json::array({std::move(call)}, sp_);
  messages_.push_back(std::move(m));
  fields_.prompt_overhead_tokens += RequestFields::kChatTokensPerMessage;
  return {};
}

// A function's result: a `role: tool` message; output parts (input_text)
// are joined with "\n".
tl::expected<void, core::Error> Translation::function_call_output(const json::object& o, std::string_view where) {
  auto call_id = required_string(o, "call_id", where);
  if (!call_id) return tl::unexpected(call_id.error());
  const auto* out = o.if_contains("output");
  json::string text(sp_);
  if (out && out->is_string()) {
    text = out->get_string();
  } else if (out && out->is_array()) {
    const auto& parts = out->get_array();
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const std::string w = fmt::format("{}.output[{}]", where, i);
      if (!parts[i].is_object() || type_of(parts[i].get_object()) != "input_text")
        return invalid(fmt::format("{}: only input_text parts can be translated in a function call output", w),
                       "input");
      auto t = required_string(parts[i].get_object(), "text", w);
      if (!t) return tl::unexpected(t.error());
      if (!text.empty()) text.append("\n");
      text.append(*t);
    }
  } else {
    return invalid(fmt::format("{}.output: Field required (a string or a list of input_text parts)", where), "input");
  }
  fields_.prompt_bytes += text.size();
  json::object m(sp_);
  m["role"] = "tool";
  m["tool_call_id"] = *call_id;
  m["content"] = std::move(text);
  messages_.push_back(std::move(m));
  fields_.prompt_overhead_tokens += RequestFields::kChatTokensPerMessage;
  return {};
}

// Responses' flat function tools → chat's {"type":"function","function":{…}}.
tl::expected<json::array, core::Error> Translation::tools(const json::value& v) {
  if (!v.is_array()) return invalid("tools: Input should be a list", "tools");
  json::array out(sp_);
  const auto& a = v.get_array();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string w = fmt::format("tools[{}]", i);
    if (!a[i].is_object()) return invalid(fmt::format("{}: Input should be an object", w), "tools");
    const auto& t = a[i].get_object();
    if (const std::string_view type = type_of(t); type != "function")
      return invalid(fmt::format("{}.type: tool type '{}' is not available on this model server (only 'function')", w,
                                 core::utf8_prefix(type, 64)),
                     "tools");
    const auto* name = t.if_contains("name");
    if (!name || !name->is_string() || name->get_string().empty())
      return invalid(fmt::format("{}.name: Field required (a string)", w), "tools");
    json::object fn(sp_);
    fn["name"] = name->get_string();
    if (const auto* d = t.if_contains("description"); d && d->is_string()) {
      fn["description"] = d->get_string();
      fields_.prompt_bytes += d->get_string().size();
    }
    if (const auto* p = t.if_contains("parameters"); p && !p->is_null()) {
      if (!p->is_object()) return invalid(fmt::format("{}.parameters: Input should be an object", w), "tools");
      fn["parameters"] = *p;
      fields_.prompt_bytes += to_json(*p).size();
    }
    if (const auto* s = t.if_contains("strict"); s && s->is_bool()) fn["strict"] = s->get_bool();
    out.push_back(json::object({{"type", "function"}, {"function", std::move(fn)}}, sp_));
  }
  return out;
}

tl::expected<json::value, core::Error> Translation::tool_choice(const json::value& v) {
  if (v.is_string()) {
    const std::string_view c = sv(v.get_string());
    if (c == "auto" || c == "none" || c == "required") return json::value(c, sp_);
    return invalid("tool_choice: Input should be 'auto', 'none', 'required' or a function", "tool_choice");
  }
  if (!v.is_object()) return invalid("tool_choice: Input should be a string or an object", "tool_choice");
  const auto& c = v.get_object();
  if (type_of(c) != "function")
    return invalid(fmt::format("tool_choice.type: '{}' cannot be translated for this model server (only 'function')",
                               core::utf8_prefix(type_of(c), 64)),
                   "tool_choice");
  const auto* name = c.if_contains("name");
  if (!name || !name->is_string()) return invalid("tool_choice.name: Field required (a string)", "tool_choice");
  return json::value(
      json::object({{"type", "function"}, {"function", json::object({{"name", name->get_string()}}, sp_)}}, sp_));
}

// text.format → response_format (null: plain text, no response_format).
tl::expected<json::value, core::Error> Translation::text_format(const json::value& v) {
  if (!v.is_object()) return invalid("text: Input should be an object", "text");
  const auto* f = v.get_object().if_contains("format");
  if (!f || f->is_null()) return json::value(nullptr);
  if (!f->is_object()) return invalid("text.format: Input should be an object", "text");
  const auto& fo = f->get_object();
  const std::string_view type = type_of(fo);
  if (type == "text") return json::value(nullptr);
  if (type == "json_object") return json::value(json::object({{"type", "json_object"}}, sp_));
  if (type != "json_schema")
    return invalid("text.format.type: Input should be 'text', 'json_schema' or 'json_object'", "text");
  const auto* name = fo.if_contains("name");
  if (!name || !name->is_string()) return invalid("text.format.name: Field required (a string)", "text");
  const auto* schema = fo.if_contains("schema");
  if (!schema || !schema->is_object()) return invalid("text.format.schema: Field required (an object)", "text");
  json::object js({{"name", name->get_string()}, {"schema", *schema}}, sp_);
  if (const auto* d = fo.if_contains("description"); d && d->is_string()) js["description"] = d->get_string();
  if (const auto* s = fo.if_contains("strict"); s && s->is_bool()) js["strict"] = s->get_bool();
  return json::value(json::object({{"type", "json_schema"}, {"json_schema", std::move(js)}}, sp_));
}

void serialize_into(const json::value& v, std::string& out) {
  out.clear();
  append_json(out, v);
}

// A number member copied as it is (temperature, top_p), also to the echo.
tl::expected<void, core::Error> copy_number(const json::object& in, std::string_view name, json::object& out,
                                            json::object& echo) {
  const auto* v = in.if_contains(name);
  if (!v || v->is_null()) {
    echo[name] = nullptr;
    return {};
  }
  if (!v->is_number()) return invalid(fmt::format("{}: Input should be a valid number", name), name);
  out[name] = *v;
  echo[name] = *v;
  return {};
}

// Members of the request that chat completions takes with the same meaning, sent under the same name as they
// came (the upstream judges their values, as on /v1/chat/completions): OpenAI's standard chat members to any
// pool; vLLM's own sampling and serving members only to a self-hosted one (`vllm`); OpenAI's hosted-service
// members (which a self-hosted server has no use for) only to a hosted one.
enum class Pools : std::uint8_t { any, self_hosted, hosted };
constexpr std::pair<std::string_view, Pools> kCarried[] = {
    {"seed", Pools::any},
    {"stop", Pools::any},
    {"logit_bias", Pools::any},
    {"frequency_penalty", Pools::any},
    {"presence_penalty", Pools::any},
    {"service_tier", Pools::hosted},
    {"safety_identifier", Pools::hosted},
    {"prompt_cache_key", Pools::hosted},
    {"prompt_cache_retention", Pools::hosted},
    {"top_k", Pools::self_hosted},
    {"min_p", Pools::self_hosted},
    {"repetition_penalty", Pools::self_hosted},
    {"min_tokens", Pools::self_hosted},
    {"stop_token_ids", Pools::self_hosted},
    {"ignore_eos", Pools::self_hosted},
    {"skip_special_tokens", Pools::self_hosted},
    {"include_stop_str_in_output", Pools::self_hosted},
    {"cache_salt", Pools::self_hosted},
    {"priority", Pools::self_hosted},
    {"chat_template_kwargs", Pools::self_hosted},
    {"mm_processor_kwargs", Pools::self_hosted},
};

// A member that has no meaning without a response store (or a feature this
// server lacks): a 400 naming it when it is set.
tl::expected<void, core::Error> refuse(const json::object& in, std::string_view name, std::string_view why) {
  const auto* v = in.if_contains(name);
  if (!v || v->is_null() || (v->is_bool() && !v->get_bool())) return {};
  return invalid(fmt::format("{}: {}", name, why), name);
}

}  // namespace

std::string_view upstream_path() { return "/v1/chat/completions"; }

tl::expected<RequestFields, core::Error> translate_request(std::string_view body, std::string& out, std::string& echo,
                                                           bool vllm) {
  // The DOMs (the client's, the upstream's, the echo) live in a per-thread
  // arena, then the heap for larger bodies; released before returning.
  struct Arena;
  json::monotonic_resource mr(thread_arena<Arena, 64 * 1024>(), 64 * 1024);
  json::storage_ptr sp(&mr);
  json::parse_options opt;
  opt.max_depth = kMaxBodyDepth;
  boost::system::error_code ec;
  json::value doc = json::parse(json::string_view(body.data(), body.size()), ec, sp, opt);
  if (ec) {
    if (body.empty()) return invalid("The request body is empty; expected a JSON object.", {});
    return invalid(invalid_body_message(ec, body), {});
  }
  if (!doc.is_object()) return invalid("The request body must be a JSON object.", {});
  // Every top-level member is read (translated): one given twice is refused, as parsers differ on which copy
  // counts (a client's parser may have sent either, meaning it).
  if (const auto rep = repeated_member(body, doc.get_object().size()))
    return tl::unexpected(repeated_member_error(*rep));
  if (!numbers_finite(doc))
    return invalid("The request body has a number too large for a JSON number (e.g. 1e400).", {});
  // An integer beyond 64 bits (a tool's or format's schema) is kept exactly:
  // parsed again with it as a token, restored in the output and the echo.
  WideIntegers wide;
  std::string protected_body;
  if (has_wide_integer(doc))
    if (const auto text = wide.protect(body, protected_body); !wide.empty())
      doc = json::parse(json::string_view(text.data(), text.size()), ec, sp, opt);
  const auto& in = doc.get_object();

  // Without a response store there is nothing to continue from or run later.
  constexpr std::string_view kNoStore =
      "this server keeps no responses (store: false semantics); send the whole conversation in `input`";
  if (auto r = refuse(in, "previous_response_id", kNoStore); !r) return tl::unexpected(r.error());
  if (auto r = refuse(in, "conversation", kNoStore); !r) return tl::unexpected(r.error());
  if (auto r = refuse(in, "background", "background responses need a response store, which this server does not keep");
      !r)
    return tl::unexpected(r.error());
  if (auto r = refuse(in, "prompt", "prompt templates are not available on this server; send `input`"); !r)
    return tl::unexpected(r.error());

  RequestFields f;
  Translation tr(sp, f);
  json::object o(sp);
  json::object e(sp);  // the echo
  const auto* model = in.if_contains("model");
  if (!model || !model->is_string() || model->get_string().empty())
    return invalid("model: Field required (a non-empty string)", "model");
  f.model.assign(model->get_string().data(), model->get_string().size());
  o["model"] = model->get_string();

  e["instructions"] = nullptr;
  if (const auto* ins = in.if_contains("instructions"); ins && !ins->is_null()) {
    if (!ins->is_string()) return invalid("instructions: Input should be a string", "instructions");
    f.prompt_bytes += ins->get_string().size();
    tr.system(sv(ins->get_string()));
    e["instructions"] = *ins;
  }
  const auto* input = in.if_contains("input");
  if (!input || input->is_null()) return invalid("input: Field required", "input");
  if (auto r = tr.input(*input); !r) return tl::unexpected(r.error());
  if (tr.messages().empty()) return invalid("input: Input should not be empty", "input");
  o["messages"] = std::move(tr.messages());

  e["max_output_tokens"] = nullptr;
  if (const auto* mt = in.if_contains("max_output_tokens"); mt && !mt->is_null()) {
    // (Weir counts it in 32 bits: a larger one, one past 64 bits that parses as a double too, is refused with
    // its real bound, not as "not positive".)
    if ((mt->is_int64() && mt->get_int64() > 0xffffffffLL) || (mt->is_uint64() && mt->get_uint64() > 0xffffffffULL) ||
        (mt->is_double() && mt->get_double() > 4294967295.0) ||
        (mt->is_string() && wide.literal_of(sv(mt->get_string())).find_first_of("123456789") == 0))
      return invalid("max_output_tokens: Input should be less than or equal to 4294967295", "max_output_tokens");
    const bool positive = (mt->is_int64() && mt->get_int64() >= 1) || (mt->is_uint64() && mt->get_uint64() >= 1);
    if (!positive) return invalid("max_output_tokens: Input should be a positive integer", "max_output_tokens");
    f.max_tokens = static_cast<std::uint32_t>(mt->to_number<std::uint64_t>());
    // OpenAI's reasoning models refuse max_tokens ("Use 'max_completion_tokens' instead"), which every hosted
    // chat API takes; a self-hosted server other than vLLM may read only the older name.
    o[vllm ? "max_tokens" : "max_completion_tokens"] = f.max_tokens;
    e["max_output_tokens"] = f.max_tokens;
  }

  e["metadata"] = json::object(sp);
  if (const auto* md = in.if_contains("metadata"); md && !md->is_null()) {
    if (!md->is_object()) return invalid("metadata: Input should be an object", "metadata");
    // OpenAI's Metadata: at most 16 pairs, keys strings of at most 64 characters, values strings of at most
    // 512 (Unicode characters: UTF-8 lead bytes counted). A client's labels that OpenAI refuses are refused
    // here too, not echoed as if they were kept.
    const auto chars = [](std::string_view s) {
      return static_cast<std::size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
    };
    if (md->get_object().size() > 16)
      return invalid(fmt::format("metadata: Object should have at most 16 pairs, not {}", md->get_object().size()),
                     "metadata");
    for (const auto& kv : md->get_object()) {
      const std::string_view key{kv.key().data(), kv.key().size()};
      if (chars(key) > 64)
        return invalid(fmt::format("metadata.{}: a key should have at most 64 characters, not {}",
                                   core::utf8_prefix(key, 64), chars(key)),
                       "metadata");
      if (!kv.value().is_string())
        return invalid(fmt::format("metadata.{}: Input should be a valid string", key), "metadata");
      if (const std::size_t n = chars(sv(kv.value().get_string())); n > 512)
        return invalid(fmt::format("metadata.{}: String should have at most 512 characters, not {}", key, n),
                       "metadata");
    }
    e["metadata"] = *md;  // the client's own labels: echoed, not sent upstream
  }

  e["parallel_tool_calls"] = true;
  if (const auto* p = in.if_contains("parallel_tool_calls"); p && !p->is_null()) {
    if (!p->is_bool()) return invalid("parallel_tool_calls: Input should be a valid boolean", "parallel_tool_calls");
    o["parallel_tool_calls"] = *p;
    e["parallel_tool_calls"] = *p;
  }
  e["previous_response_id"] = nullptr;

  e["reasoning"] = nullptr;
  if (const auto* rs = in.if_contains("reasoning"); rs && !rs->is_null()) {
    if (!rs->is_object()) return invalid("reasoning: Input should be an object", "reasoning");
    // vLLM's reasoning_effort (chat completions, v0.10.1) takes low, medium and high; a hosted API's takes
    // its own (OpenAI's: none, minimal, low, medium, high, xhigh, as its models do): the upstream judges.
    if (const auto* eff = rs->get_object().if_contains("effort"); eff && !eff->is_null()) {
      if (!eff->is_string()) return invalid("reasoning.effort: Input should be a string", "reasoning");
      const std::string_view v = sv(eff->get_string());
      if (vllm && v != "low" && v != "medium" && v != "high")
        return invalid("reasoning.effort: this model server takes 'low', 'medium' or 'high'", "reasoning");
      o["reasoning_effort"] = *eff;
    }
    e["reasoning"] = *rs;
  }

  if (const auto* s = in.if_contains("store"); s && !s->is_null() && !s->is_bool())
    return invalid("store: Input should be a valid boolean", "store");
  e["store"] = false;  // whatever was asked: nothing is stored

  if (const auto* s = in.if_contains("stream"); s && !s->is_null()) {
    if (!s->is_bool()) return invalid("stream: Input should be a valid boolean", "stream");
    f.stream = s->get_bool();
  }
  if (f.stream) {
    o["stream"] = true;
    o["stream_options"] = json::object({{"include_usage", true}}, sp);
    f.has_stream_options = f.include_usage = f.usage_asked = true;
  }

  if (auto r = copy_number(in, "temperature", o, e); !r) return tl::unexpected(r.error());
  if (auto r = copy_number(in, "top_p", o, e); !r) return tl::unexpected(r.error());

  e["text"] = json::object({{"format", json::object({{"type", "text"}}, sp)}}, sp);
  if (const auto* t = in.if_contains("text"); t && !t->is_null()) {
    auto rf = tr.text_format(*t);
    if (!rf) return tl::unexpected(rf.error());
    if (!rf->is_null()) o["response_format"] = std::move(*rf);
    if (const auto* fmt_ = t->get_object().if_contains("format"); fmt_ && !fmt_->is_null()) e["text"] = *t;
  }

  e["tool_choice"] = "auto";
  if (const auto* tc = in.if_contains("tool_choice"); tc && !tc->is_null()) {
    auto c = tr.tool_choice(*tc);
    if (!c) return tl::unexpected(c.error());
    o["tool_choice"] = std::move(*c);
    e["tool_choice"] = *tc;
  }
  e["tools"] = json::array(sp);
  if (const auto* ts = in.if_contains("tools"); ts && !ts->is_null()) {
    auto t = tr.tools(*ts);
    if (!t) return tl::unexpected(t.error());
    if (!t->empty()) o["tools"] = std::move(*t);
    e["tools"] = *ts;
  }

  if (const auto* tr_ = in.if_contains("truncation"); tr_ && !tr_->is_null()) {
    if (!tr_->is_string() || (tr_->get_string() != "disabled" && tr_->get_string() != "auto"))
      return invalid("truncation: Input should be 'auto' or 'disabled'", "truncation");
    if (tr_->get_string() == "auto")
      return invalid("truncation: 'auto' cannot be translated: this model server does not drop input to fit",
                     "truncation");
  }
  e["truncation"] = "disabled";

  // Log probabilities of the output text: include's "message.output_text.logprobs" asks for them (with
  // top_logprobs alternatives per token), chat's logprobs and top_logprobs; the answer's come back as the
  // output_text's logprobs (response.cpp, stream.cpp).
  bool logprobs = false;
  if (const auto* inc = in.if_contains("include"); inc && !inc->is_null()) {
    if (!inc->is_array()) return invalid("include: Input should be a list", "include");
    for (const auto& x : inc->get_array())
      if (x.is_string() && x.get_string() == "message.output_text.logprobs") logprobs = true;
  }
  e["top_logprobs"] = nullptr;
  if (const auto* tl = in.if_contains("top_logprobs"); tl && !tl->is_null()) {
    if (!(tl->is_int64() && tl->get_int64() >= 0 && tl->get_int64() <= 20))
      return invalid("top_logprobs: Input should be an integer from 0 to 20", "top_logprobs");
    e["top_logprobs"] = *tl;
    if (logprobs && tl->get_int64() > 0) o["top_logprobs"] = *tl;
  }
  if (logprobs) o["logprobs"] = true;

  for (const auto& [name, pools] : kCarried)
    if (pools == Pools::any || (pools == Pools::self_hosted) == vllm)
      if (const auto* v = in.if_contains(name); v && !v->is_null()) o[name] = *v;

  e["user"] = nullptr;
  if (const auto* u = in.if_contains("user"); u && !u->is_null()) {
    if (!u->is_string()) return invalid("user: Input should be a string", "user");
    o["user"] = *u;
    e["user"] = *u;
  }
  e["background"] = false;

  serialize_into(o, out);
  serialize_into(e, echo);
  wide.restore(out);
  wide.restore(echo);
  // The members only: the response object is written around them.
  echo.pop_back();
  echo.erase(0, 1);
  return f;
}

}  // namespace weir::api::responses
