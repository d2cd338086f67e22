// OpenAI chat-completions body → Anthropic Messages body, with Boost.JSON in
// a per-thread arena: only requests to type: anthropic pools pay for it.
#include "api/anthropic/upstream_request.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include "api/json_write.hpp"

#include "api/error_text.hpp"
#include "api/json_dom.hpp"
#include "api/json_scan.hpp"
#include "api/member_names.hpp"
#include "api/tool_call_stream.hpp"
#include "api/tool_ids.hpp"
#include "api/wide_integers.hpp"
#include "core/json_text.hpp"

namespace weir::api::anthropic {

namespace json = boost::json;

namespace {

using Fail = tl::unexpected<core::Error>;

Fail invalid(std::string message, std::string_view param) { return Fail(core::bad_request(std::move(message), param)); }

void serialize_into(const json::value& v, std::string& out) {
  out.clear();
  append_json(out, v);
}

// Whether the last assistant message of Anthropic `messages` holds a
// tool_use block and begins with no thinking block.
bool last_assistant_uses_tools(const json::value& messages) {
  if (!messages.is_array()) return false;
  const auto& list = messages.get_array();
  for (auto it = list.rbegin(); it != list.rend(); ++it) {
    if (!it->is_object() || string_at(it->get_object(), "role") != "assistant") continue;
    const auto* content = it->get_object().if_contains("content");
    if (content == nullptr || !content->is_array() || content->get_array().empty()) return false;
    const auto& blocks = content->get_array();
    const auto type = [](const json::value& b) { return b.is_object() ? string_at(b.get_object(), "type") : ""; };
    if (type(blocks.front()) == "thinking" || type(blocks.front()) == "redacted_thinking") return false;
    return std::any_of(blocks.begin(), blocks.end(), [&](const json::value& b) { return type(b) == "tool_use"; });
  }
  return false;
}

// Whether `s` has no character but whitespace (Python's str.isspace(), as
// Anthropic's check reads it: ASCII's, U+001C..U+001F, U+0085, U+00A0,
// U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000), or none.
bool blank(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (!(c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f))) return false;
      ++i;
      continue;
    }
    // The multi-byte whitespace characters, as their UTF-8 bytes.
    const auto at = [&](std::string_view bytes) { return s.substr(i, bytes.size()) == bytes; };
    if (at("\xc2\x85") || at("\xc2\xa0")) {
      i += 2;
    } else if (at("\xe1\x9a\x80") || at("\xe2\x80\xa8") || at("\xe2\x80\xa9") || at("\xe2\x80\xaf") ||
               at("\xe2\x81\x9f") || at("\xe3\x80\x80") ||
               (at("\xe2\x80") && i + 2 < s.size() && static_cast<unsigned char>(s[i + 2]) >= 0x80 &&
                static_cast<unsigned char>(s[i + 2]) <= 0x8a)) {
      i += 3;
    } else {
      return false;
    }
  }
  return true;
}

// Thinking budgets for OpenAI's reasoning_effort (tokens): low is
// Anthropic's minimum budget (1024), each step four times the one before.
std::uint32_t thinking_budget(std::string_view effort) {
  if (effort == "low") return 1024;
  if (effort == "medium") return 4096;
  if (effort == "high") return 16384;
  return 0;
}

// One request's translation into `out_` (the Anthropic body being built).
class Translation {
 public:
  Translation(json::storage_ptr sp, WideIntegers& wide)
      : sp_(std::move(sp)), wide_(wide), system_(sp_), messages_(sp_), out_(sp_) {}

  tl::expected<void, core::Error> message(const json::value& v, std::size_t i);
  // An empty user message was left out and the conversation has no opening user turn without it: the 400.
  tl::expected<void, core::Error> empty_user_error() const {
    if (!empty_user_ || (!messages_.empty() && messages_.front().get_object().at("role").as_string() == "user"))
      return {};
    return invalid(fmt::format("messages[{}].content: an Anthropic model refuses an empty user message", *empty_user_),
                   "messages");
  }
  tl::expected<void, core::Error> tools(const json::value& v);
  tl::expected<void, core::Error> tool_choice(const json::value* choice, const json::value* parallel);

  json::array& system() { return system_; }
  json::array& messages() { return messages_; }
  json::object& out() { return out_; }

 private:
  // Appends text or image blocks for one chat content part (`where` names it in errors).
  tl::expected<void, core::Error> part(const json::value& v, std::string_view where, bool images, json::array& blocks);
  // The text of a content that must be text: a string, or text parts joined with "\n".
  tl::expected<json::string, core::Error> text_of(const json::value& v, std::string_view where);
  tl::expected<void, core::Error> image(const json::object& p, std::string_view where, json::array& blocks);
  // Adds `blocks` as a turn of `role`, merged into the previous turn when it
  // has the same role (Anthropic's turns alternate; chat messages need not).
  void turn(std::string_view role, json::array blocks);
  // A chat tool call id as Anthropic takes it (api/tool_ids.hpp): the same for a call and its result.
  json::string anthropic_id(std::string_view id) {
    id_.assign(id);
    to_anthropic_tool_id(id_);
    return json::string(id_, sp_);
  }
  json::object text_block(std::string_view text, const json::object* from) {
    json::object b(sp_);
    b["type"] = "text";
    b["text"] = text;
    if (from)
      if (const auto* cc = from->if_contains("cache_control"); cc && cc->is_object()) b["cache_control"] = *cc;
    return b;
  }

  json::storage_ptr sp_;
  WideIntegers& wide_;
  json::array system_;
  json::array messages_;
  std::optional<std::size_t> empty_user_;  // the first user message left out for being empty
  std::string id_;                         // anthropic_id()'s scratch
  json::object out_;
};

void Translation::turn(std::string_view role, json::array blocks) {
  if (!messages_.empty()) {
    auto& last = messages_.back().get_object();
    if (last.at("role").as_string() == role) {
      auto& content = last.at("content").as_array();
      for (auto& b : blocks) content.push_back(std::move(b));
      return;
    }
  }
  json::object m(sp_);
  m["role"] = role;
  m["content"] = std::move(blocks);
  messages_.push_back(std::move(m));
}

tl::expected<json::string, core::Error> Translation::text_of(const json::value& v, std::string_view where) {
  json::string text(sp_);
  if (v.is_null()) return text;
  if (v.is_string()) return json::string(v.get_string(), sp_);
  if (!v.is_array()) return invalid(fmt::format("{}: expected a string or a list of text parts", where), "messages");
  const auto& a = v.get_array();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto* p = a[i].if_object();
    const std::string_view type = p ? string_at(*p, "type") : std::string_view{};
    if (type != "text" && type != "refusal")
      return invalid(fmt::format("{}[{}].type: only text parts can be sent here to an Anthropic model", where, i),
                     "messages");
    const std::string_view t = string_at(*p, type == "text" ? "text" : "refusal");
    if (!text.empty()) text.append("\n");
    text.append(t);
  }
  return text;
}

tl::expected<void, core::Error> Translation::image(const json::object& p, std::string_view where, json::array& blocks) {
  // image_url is {"url", "detail"} (OpenAI), or the URL itself (some clients).
  std::string_view url;
  if (const auto* iu = p.if_contains("image_url"); iu && iu->is_object())
    url = string_at(iu->get_object(), "url");
  else if (iu && iu->is_string())
    url = sv(iu->get_string());
  if (url.empty()) return invalid(fmt::format("{}.image_url.url: Field required", where), "messages");
  json::object source(sp_);
  if (url.starts_with("data:")) {
    // data:<media type>;base64,<data> (RFC 2397); Anthropic takes base64 only.
    const auto marker = url.find(";base64,");
    if (marker == std::string_view::npos || marker <= 5)
      return invalid(fmt::format("{}.image_url.url: a data URL must be data:<media type>;base64,<data>", where),
                     "messages");
    source["type"] = "base64";
    source["media_type"] = url.substr(5, marker - 5);
    source["data"] = url.substr(marker + 8);
  } else if (url.starts_with("https://") || url.starts_with("http://")) {
    source["type"] = "url";
    source["url"] = url;
  } else {
    return invalid(fmt::format("{}.image_url.url: expected an http(s) URL or a base64 data URL", where), "messages");
  }
  json::object b(sp_);
  b["type"] = "image";
  b["source"] = std::move(source);
  if (const auto* cc = p.if_contains("cache_control"); cc && cc->is_object()) b["cache_control"] = *cc;
  blocks.push_back(std::move(b));
  return {};
}

tl::expected<void, core::Error> Translation::part(const json::value& v, std::string_view where, bool images,
                                                  json::array& blocks) {
  const auto* p = v.if_object();
  if (!p) return invalid(fmt::format("{}: expected a content part object", where), "messages");
  const std::string_view type = string_at(*p, "type");
  if (type == "text" || type == "refusal") {
    const std::string_view t = string_at(*p, type);
    if (!t.empty()) blocks.push_back(text_block(t, p));  // Anthropic refuses empty text blocks
    return {};
  }
  if (type == "image_url" && images) return image(*p, where, blocks);
  return invalid(fmt::format("{}.type: content part type '{}' cannot be sent to an Anthropic model", where,
                             core::utf8_prefix(type, 64)),
                 "messages");
}

tl::expected<void, core::Error> Translation::message(const json::value& v, std::size_t i) {
  const std::string where = fmt::format("messages[{}]", i);
  const auto* m = v.if_object();
  if (!m) return invalid(fmt::format("{}: expected a message object", where), "messages");
  const std::string_view role = string_at(*m, "role");
  const json::value* content = m->if_contains("content");
  static const json::value kNull;
  if (!content) content = &kNull;
  if (role == "system" || role == "developer") {
    if (content->is_string()) {
      if (!content->get_string().empty()) system_.push_back(text_block(sv(content->get_string()), nullptr));
      return {};
    }
    if (!content->is_array())
      return invalid(fmt::format("{}.content: expected a string or a list of text parts", where), "messages");
    for (std::size_t j = 0; j < content->get_array().size(); ++j)
      if (auto r = part(content->get_array()[j], fmt::format("{}.content[{}]", where, j), false, system_); !r) return r;
    return {};
  }
  if (role == "user") {
    json::array blocks(sp_);
    if (content->is_string()) {
      if (!content->get_string().empty()) blocks.push_back(text_block(sv(content->get_string()), nullptr));
    } else if (content->is_array()) {
      for (std::size_t j = 0; j < content->get_array().size(); ++j)
        if (auto r = part(content->get_array()[j], fmt::format("{}.content[{}]", where, j), true, blocks); !r) return r;
    } else {
      return invalid(fmt::format("{}.content: expected a string or a list of content parts", where), "messages");
    }
    if (blocks.empty()) {
      // Anthropic refuses empty text blocks and a turn with no content: an empty user message adds nothing
      // (beside another user turn, either side, the two are one turn). Left out; if that leaves the
      // conversation without its opening user turn, empty_user_error() refuses it, before any upstream call.
      if (!empty_user_) empty_user_ = i;
      return {};
    }
    turn("user", std::move(blocks));
    return {};
  }
  if (role == "assistant") {
    json::array blocks(sp_);
    if (content->is_string()) {
      if (!content->get_string().empty()) blocks.push_back(text_block(sv(content->get_string()), nullptr));
    } else if (content->is_array()) {
      for (std::size_t j = 0; j < content->get_array().size(); ++j)
        if (auto r = part(content->get_array()[j], fmt::format("{}.content[{}]", where, j), false, blocks); !r)
          return r;
    } else if (!content->is_null()) {
      return invalid(fmt::format("{}.content: expected a string or a list of text parts", where), "messages");
    }
    if (m->contains("function_call") && !m->at("function_call").is_null())
      return invalid(fmt::format("{}.function_call: use tool_calls (function_call cannot be sent to an Anthropic "
                                 "model)",
                                 where),
                     "messages");
    if (const auto* tcs = m->if_contains("tool_calls"); tcs && !tcs->is_null()) {
      if (!tcs->is_array()) return invalid(fmt::format("{}.tool_calls: expected a list", where), "messages");
      for (std::size_t j = 0; j < tcs->get_array().size(); ++j) {
        const std::string w = fmt::format("{}.tool_calls[{}]", where, j);
        const auto* call = tcs->get_array()[j].if_object();
        const json::object* fn = nullptr;
        if (call)
          if (const auto* f = call->if_contains("function"); f && f->is_object()) fn = &f->get_object();
        if (!fn) return invalid(fmt::format("{}.function: Field required", w), "messages");
        const std::string_view id = string_at(*call, "id");
        const std::string_view name = string_at(*fn, "name");
        if (id.empty() || name.empty())
          return invalid(fmt::format("{}: a tool call needs an id and a function name", w), "messages");
        // Anthropic's tool_use input is a JSON object; the arguments are its text.
        std::string unencoded;  // (arguments given as a JSON value, not a string: its text)
        const std::string_view args = arguments_text(*fn, unencoded);
        json::value input = json::object(sp_);
        if (!args.empty()) {
          std::string protected_args;
          boost::system::error_code ec;
          input = json::parse(wide_.protect(args, protected_args), ec, sp_);
          if (ec || !input.is_object())
            return invalid(
                fmt::format("{}.function.arguments: must be a JSON object to be sent to an Anthropic model", w),
                "messages");
        }
        json::object b(sp_);
        b["type"] = "tool_use";
        b["id"] = anthropic_id(id);
        b["name"] = name;
        b["input"] = std::move(input);
        blocks.push_back(std::move(b));
      }
    }
    // An assistant turn with nothing in it (empty content, no calls) says nothing: left out.
    if (!blocks.empty()) turn("assistant", std::move(blocks));
    return {};
  }
  if (role == "tool") {
    const std::string_view id = string_at(*m, "tool_call_id");
    if (id.empty()) return invalid(fmt::format("{}.tool_call_id: Field required", where), "messages");
    auto text = text_of(*content, where + ".content");
    if (!text) return tl::unexpected(text.error());
    json::object b(sp_);
    b["type"] = "tool_result";
    b["tool_use_id"] = anthropic_id(id);
    if (!text->empty()) b["content"] = std::move(*text);
    // A cache breakpoint on the message's parts (the LiteLLM-style extension
    // kept on every other part) goes on the block: agent loops mark their
    // last tool result so, and Anthropic takes cache_control on tool_result.
    if (content->is_array())
      for (const auto& part : content->get_array())
        if (const auto* cc = part.is_object() ? part.get_object().if_contains("cache_control") : nullptr;
            cc != nullptr && cc->is_object())
          b["cache_control"] = *cc;
    json::array blocks(sp_);
    blocks.push_back(std::move(b));
    turn("user", std::move(blocks));
    return {};
  }
  if (role == "function")
    return invalid(fmt::format("{}.role: 'function' messages cannot be sent to an Anthropic model (use tool)", where),
                   "messages");
  return invalid(fmt::format("{}.role: expected system, developer, user, assistant or tool", where), "messages");
}

tl::expected<void, core::Error> Translation::tools(const json::value& v) {
  if (!v.is_array()) return invalid("tools: expected a list", "tools");
  json::array out(sp_);
  const auto& a = v.get_array();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto* t = a[i].if_object();
    if (!t || string_at(*t, "type") != "function")
      return invalid(fmt::format("tools[{}].type: only function tools can be sent to an Anthropic model", i), "tools");
    const auto* fv = t->if_contains("function");
    const auto* fn = fv ? fv->if_object() : nullptr;
    if (!fn || string_at(*fn, "name").empty())
      return invalid(fmt::format("tools[{}].function.name: Field required", i), "tools");
    json::object tool(sp_);
    tool["name"] = string_at(*fn, "name");
    if (const auto* d = fn->if_contains("description"); d && d->is_string()) tool["description"] = *d;
    // Anthropic requires an input schema; a function without parameters takes none.
    if (const auto* p = fn->if_contains("parameters"); p && p->is_object())
      tool["input_schema"] = *p;
    else
      tool["input_schema"] = json::object({{"type", "object"}, {"properties", json::object(sp_)}}, sp_);
    if (const auto* cc = t->if_contains("cache_control"); cc && cc->is_object()) tool["cache_control"] = *cc;
    out.push_back(std::move(tool));
  }
  if (!out.empty()) out_["tools"] = std::move(out);
  return {};
}

tl::expected<void, core::Error> Translation::tool_choice(const json::value* choice, const json::value* parallel) {
  json::object c(sp_);
  if (choice && !choice->is_null()) {
    if (choice->is_string()) {
      const std::string_view s = sv(choice->get_string());
      if (s == "auto")
        c["type"] = "auto";
      else if (s == "required")
        c["type"] = "any";
      else if (s == "none")
        c["type"] = "none";
      else
        return invalid("tool_choice: expected auto, required, none or a function", "tool_choice");
    } else if (const auto* o = choice->if_object(); o && string_at(*o, "type") == "function") {
      const auto* f = o->if_contains("function");
      const std::string_view name = f && f->is_object() ? string_at(f->get_object(), "name") : std::string_view{};
      if (name.empty()) return invalid("tool_choice.function.name: Field required", "tool_choice");
      c["type"] = "tool";
      c["name"] = name;
    } else {
      return invalid("tool_choice: expected auto, required, none or {type: function} for an Anthropic model",
                     "tool_choice");
    }
  }
  if (parallel && parallel->is_bool() && !parallel->get_bool() && out_.contains("tools")) {
    if (c.empty()) c["type"] = "auto";
    if (string_at(c, "type") != "none") c["disable_parallel_tool_use"] = true;
  }
  if (!c.empty()) out_["tool_choice"] = std::move(c);
  return {};
}

// A number member copied as it is (temperature, top_p); `integer`: top_k.
tl::expected<void, core::Error> copy_number(const json::object& in, std::string_view name, json::object& out,
                                            bool integer) {
  const auto* v = in.if_contains(name);
  if (!v || v->is_null()) return {};
  if (integer ? !(v->is_int64() || v->is_uint64()) : !v->is_number())
    return invalid(fmt::format("{}: expected a {}", name, integer ? "integer" : "number"), name);
  out[name] = *v;
  return {};
}

// A positive integer member (max_tokens, n), or 0 when absent or null.
tl::expected<std::uint64_t, core::Error> positive(const json::object& in, std::string_view name) {
  const auto* v = in.if_contains(name);
  if (!v || v->is_null()) return 0;
  if ((v->is_int64() && v->get_int64() >= 1) || (v->is_uint64() && v->get_uint64() >= 1))
    return v->to_number<std::uint64_t>();
  return invalid(fmt::format("{}: expected a positive integer", name), name);
}

tl::expected<void, core::Error> translate(const json::object& in, const UpstreamRequestOptions& o, Translation& tr,
                                          json::storage_ptr sp) {
  json::object& a = tr.out();
  a["model"] = o.model;
  // What Anthropic cannot give back: refused rather than silently dropped.
  auto n = positive(in, "n");
  if (!n) return tl::unexpected(n.error());
  if (*n > 1) return invalid("n: an Anthropic model gives one choice per request (n must be 1)", "n");
  if (const auto* lp = in.if_contains("logprobs"); lp && lp->is_bool() && lp->get_bool())
    return invalid("logprobs: an Anthropic model does not return log probabilities", "logprobs");
  if (const auto* tl = in.if_contains("top_logprobs"); tl && tl->is_number() && tl->to_number<double>() > 0)
    return invalid("top_logprobs: an Anthropic model does not return log probabilities", "top_logprobs");
  if (const auto* rf = in.if_contains("response_format"); rf && rf->is_object()) {
    const std::string_view type = string_at(rf->get_object(), "type");
    if (type == "json_schema") {
      // Anthropic's structured outputs (output_config.format {type: json_schema, schema}: the answer is kept to
      // the schema, as OpenAI's strict json_schema keeps it); the name and strict have no counterpart.
      const auto* js = rf->get_object().if_contains("json_schema");
      const json::value* schema = js && js->is_object() ? js->get_object().if_contains("schema") : nullptr;
      if (!schema || !schema->is_object())
        return invalid("response_format.json_schema.schema: Field required (an object)", "response_format");
      a["output_config"] =
          json::object({{"format", json::object({{"type", "json_schema"}, {"schema", *schema}}, sp)}}, sp);
    } else if (!type.empty() && type != "text")
      return invalid(
          fmt::format("response_format.type: '{}' cannot be sent to an Anthropic model (only text or json_schema)",
                      core::utf8_prefix(type, 64)),
          "response_format");
  }
  if (const auto* md = in.if_contains("modalities"); md && md->is_array())
    for (const auto& x : md->get_array())
      if (!(x.is_string() && x.get_string() == "text"))
        return invalid("modalities: an Anthropic model answers in text only", "modalities");
  if (const auto* au = in.if_contains("audio"); au && !au->is_null())
    return invalid("audio: an Anthropic model answers in text only", "audio");

  const auto* msgs = in.if_contains("messages");
  if (!msgs || !msgs->is_array()) return invalid("messages: expected a list of messages", "messages");
  for (std::size_t i = 0; i < msgs->get_array().size(); ++i)
    if (auto r = tr.message(msgs->get_array()[i], i); !r) return r;
  if (auto r = tr.empty_user_error(); !r) return r;
  if (!tr.system().empty()) a["system"] = std::move(tr.system());
  a["messages"] = std::move(tr.messages());

  if (const auto* v = in.if_contains("tools"); v && !v->is_null())
    if (auto r = tr.tools(*v); !r) return r;
  if (auto r = tr.tool_choice(in.if_contains("tool_choice"), in.if_contains("parallel_tool_calls")); !r) return r;

  auto mct = positive(in, "max_completion_tokens");
  if (!mct) return tl::unexpected(mct.error());
  auto mt = positive(in, "max_tokens");
  if (!mt) return tl::unexpected(mt.error());
  const std::uint64_t asked = *mct ? *mct : *mt;
  std::uint64_t max_tokens = asked ? asked : o.default_max_tokens;

  // Thinking: Anthropic's own `thinking` object (the openai SDK's extra_body)
  // as it is, else OpenAI's reasoning_effort as a thinking budget.
  bool effort_thinking = false;  // Weir made `thinking` of reasoning_effort (the sampling fields then yield to it)
  if (const auto* th = in.if_contains("thinking"); th && th->is_object()) {
    a["thinking"] = *th;
  } else if (const auto* re = in.if_contains("reasoning_effort"); re && re->is_string()) {
    const std::string_view effort = sv(re->get_string());
    std::uint32_t budget = thinking_budget(effort);
    // Anthropic refuses thinking in a tool loop whose last assistant turn holds tool_use and no thinking
    // block (the thinking must come back signed, and a chat client has no signature to send back): that
    // turn goes without thinking, as the turns it continues did not carry it either.
    const bool tool_loop = budget > 0 && last_assistant_uses_tools(a["messages"]);
    // Nor with a tool_choice that forces a call (required, or a named function: Anthropic's `any`, `tool`),
    // which Anthropic refuses with thinking: the forced call is what the client asked for outright.
    const std::string_view choice = a.contains("tool_choice") ? string_at(a["tool_choice"].get_object(), "type") : "";
    const bool forced = choice == "any" || choice == "tool";
    if (budget > 0 && !tool_loop && !forced) {
      if (!asked) {
        max_tokens += budget;  // the default answer's room comes on top of the thinking
      } else if (budget >= max_tokens) {
        if (max_tokens <= 1024)
          return invalid(fmt::format("max_tokens: reasoning_effort '{}' needs more than 1024 tokens on an Anthropic "
                                     "model (its smallest thinking budget)",
                                     effort),
                         "max_tokens");
        budget = static_cast<std::uint32_t>(max_tokens - 1);
      }
      a["thinking"] = json::object({{"type", "enabled"}, {"budget_tokens", budget}}, sp);
      effort_thinking = true;
    } else if (budget == 0 && effort != "none" && effort != "minimal") {
      return invalid("reasoning_effort: expected none, minimal, low, medium or high", "reasoning_effort");
    }
  }
  a["max_tokens"] = max_tokens;
  if (o.max_tokens_sent != nullptr) *o.max_tokens_sent = max_tokens;

  if (const auto* v = in.if_contains("stop"); v && !v->is_null()) {
    // Anthropic refuses a stop sequence without a non-whitespace character ("\n", " ", ""): such entries
    // are left out (the rest still stop the answer).
    json::array stops(sp);
    if (v->is_string()) {
      if (!blank(sv(v->get_string()))) stops.push_back(*v);
    } else if (v->is_array()) {
      for (const auto& s : v->get_array()) {
        if (!s.is_string()) return invalid("stop: expected a string or a list of strings", "stop");
        if (!blank(sv(s.get_string()))) stops.push_back(s);
      }
    } else {
      return invalid("stop: expected a string or a list of strings", "stop");
    }
    if (!stops.empty()) a["stop_sequences"] = std::move(stops);
  }
  for (const char* name : {"temperature", "top_p"})
    if (auto r = copy_number(in, name, a, false); !r) return r;
  if (auto r = copy_number(in, "top_k", a, true); !r) return r;
  if (effort_thinking) {
    // Anthropic's thinking samples at temperature 1, with top_p of at least 0.95 and no top_k, and refuses
    // a request that sets them otherwise: the reasoning the client asked for wins, and they are left out.
    const auto below = [&](std::string_view name, double bound) {
      const auto* v = a.if_contains(name);
      return v != nullptr && v->to_number<double>() < bound;
    };
    if (const auto* t = a.if_contains("temperature"); t && t->to_number<double>() != 1.0) a.erase("temperature");
    if (below("top_p", 0.95)) a.erase("top_p");
    a.erase("top_k");
  }
  if (const auto* s = in.if_contains("stream"); s && s->is_bool() && s->get_bool()) a["stream"] = true;
  if (const auto* u = in.if_contains("user"); u && u->is_string() && !u->get_string().empty())
    a["metadata"] = json::object({{"user_id", *u}}, sp);
  return {};
}

}  // namespace

std::string_view messages_path() { return "/v1/messages"; }

std::uint64_t default_answer_cap(std::string_view chat, std::uint32_t default_max_tokens) {
  // As translate() makes it: the default, plus reasoning_effort's thinking budget unless the body brings its
  // own `thinking` (then the budget is the client's, within the default).
  std::uint64_t cap = default_max_tokens;
  if (const auto th = find_member(chat, "thinking"); th && chat[th->value_begin] == '{') return cap;
  if (const auto re = find_member(chat, "reasoning_effort")) {
    const std::string_view v = chat.substr(re->value_begin, re->value_end - re->value_begin);
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') cap += thinking_budget(v.substr(1, v.size() - 2));
  }
  return cap;
}

tl::expected<void, core::Error> chat_to_messages(std::string_view chat, const UpstreamRequestOptions& o,
                                                 std::string& out) {
  struct Arena;
  unsigned char* arena = thread_arena<Arena, 64 * 1024>();
  WideIntegers wide;
  std::string protected_body;
  std::string_view text = chat;
  for (int pass = 0; pass < 2; ++pass) {
    json::monotonic_resource mr(arena, 64 * 1024);
    json::storage_ptr sp(&mr);
    json::parse_options opt;
    opt.max_depth = 64;
    boost::system::error_code ec;
    const json::value doc = json::parse(json::string_view(text.data(), text.size()), ec, sp, opt);
    if (ec) return invalid(invalid_body_message(ec, text), {});
    if (!doc.is_object()) return invalid("The request body must be a JSON object.", {});
    if (!numbers_finite(doc))
      return invalid("The request body has a number too large for a JSON number (e.g. 1e400).", {});
    if (pass == 0 && has_wide_integer(doc)) {
      // An integer beyond 64 bits: parse again with it kept as a token (api/wide_integers.hpp).
      text = wide.protect(chat, protected_body);
      if (!wide.empty()) continue;
    }
    Translation tr(sp, wide);
    if (auto r = translate(doc.get_object(), o, tr, sp); !r) return tl::unexpected(r.error());
    serialize_into(tr.out(), out);
    wide.restore(out);
    return {};
  }
  return {};  // not reached: the second pass always returns
}

namespace {

// A content block's `source` that holds media, not text: base64 (an image,
// a PDF), a url, a file id. A document's text sources (`text`, `content`)
// are prompt text (Anthropic Messages, "PDF support" and "Citations").
bool media_source(const json::value& source) {
  if (!source.is_object()) return false;
  const auto* type = source.get_object().if_contains("type");
  if (type == nullptr || !type->is_string()) return false;
  const std::string_view t(type->get_string());
  return t == "base64" || t == "url" || t == "file";
}

}  // namespace

tl::expected<RequestFields, core::Error> read_messages_request(std::string_view body, bool count) {
  struct Arena;
  json::monotonic_resource mr(thread_arena<Arena, 16 * 1024>(), 16 * 1024);
  json::parse_options opt;
  opt.max_depth = 64;
  boost::system::error_code ec;
  const json::value doc = json::parse(json::string_view(body.data(), body.size()), ec, &mr, opt);
  auto fail = [](std::string m, std::string_view param = {}) { return Fail(core::bad_request(std::move(m), param)); };
  if (ec) {
    if (body.empty()) return fail("The request body is empty; expected a JSON object.");
    return fail(invalid_body_message(ec, body));
  }
  if (!doc.is_object()) return fail("The request body must be a JSON object.");
  // Every top-level member is read (translated; or, passed on to Anthropic, translated for a fallback):
  // one given twice is refused, as parsers differ on which copy counts.
  if (const auto rep = repeated_member(body, doc.get_object().size()))
    return tl::unexpected(repeated_member_error(*rep));
  const auto& in = doc.get_object();
  RequestFields f;
  const auto* model = in.if_contains("model");
  if (!model || !model->is_string() || model->get_string().empty())
    return fail("model: Field required (a non-empty string)", "model");
  f.model.assign(model->get_string().data(), model->get_string().size());
  if (!count) {
    const auto* mt = in.if_contains("max_tokens");
    if (!mt || mt->is_null()) return fail("max_tokens: Field required", "max_tokens");
    // (Weir counts it in 32 bits: a larger one, one past 64 bits that parses as a double too, is refused with
    // its real bound, not as "not positive".)
    if ((mt->is_int64() && mt->get_int64() > 0xffffffffLL) || (mt->is_uint64() && mt->get_uint64() > 0xffffffffULL) ||
        (mt->is_double() && mt->get_double() > 4294967295.0))
      return fail("max_tokens: Input should be less than or equal to 4294967295", "max_tokens");
    const bool ok = (mt->is_int64() && mt->get_int64() >= 1) || (mt->is_uint64() && mt->get_uint64() >= 1);
    if (!ok) return fail("max_tokens: Input should be a positive integer", "max_tokens");
    f.max_tokens = static_cast<std::uint32_t>(mt->to_number<std::uint64_t>());
    if (const auto* s = in.if_contains("stream"); s && !s->is_null()) {
      if (!s->is_bool()) return fail("stream: Input should be a valid boolean", "stream");
      f.stream = s->get_bool();
    }
  }
  // (What a translation for an OpenAI-compatible fallback gives: thinking blocks only when asked for.)
  if (const auto* th = in.if_contains("thinking"); th && th->is_object()) {
    const std::string_view type = string_at(th->get_object(), "type");
    f.thinking = type == "enabled" || type == "adaptive" || type == "between_tools";
  }
  const auto* msgs = in.if_contains("messages");
  if (!msgs) return fail("messages: Field required", "messages");
  if (!msgs->is_array()) return fail("messages: Input should be a list", "messages");
  // The prompt estimate: every string of system, messages and tools (text,
  // tool inputs and results, a document's text source: `{"type": "text",
  // "data": ...}` or `{"type": "content", "content": [...]}`), plus the chat
  // template's framing per message. Media sources (base64, url, file) are
  // no text: each is one media part (RequestFields::media_parts).
  std::vector<const json::value*> pending;
  for (const char* k : {"system", "messages", "tools"})
    if (const auto* v = in.if_contains(k)) pending.push_back(v);
  while (!pending.empty()) {
    const json::value* x = pending.back();
    pending.pop_back();
    if (x->is_string()) {
      f.prompt_bytes += x->get_string().size();
    } else if (x->is_array()) {
      for (const auto& e : x->get_array()) pending.push_back(&e);
    } else if (x->is_object()) {
      for (const auto& kv : x->get_object()) {
        if (kv.key() == "source") {
          if (media_source(kv.value())) {  // an image's or a PDF's bytes are no prompt text: a media part
            if (f.media_parts < 0xffffffffU) ++f.media_parts;
            continue;
          }
        } else if (kv.key() == "type" || kv.key() == "role" || kv.key() == "id" || kv.key() == "tool_use_id" ||
                   kv.key() == "cache_control" || kv.key() == "media_type") {
          continue;
        }
        pending.push_back(&kv.value());
      }
    }
  }
  f.prompt_overhead_tokens =
      static_cast<std::uint32_t>(msgs->get_array().size() + 1) * RequestFields::kChatTokensPerMessage;
  return f;
}

}  // namespace weir::api::anthropic
