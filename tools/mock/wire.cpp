// vLLM v0.10.1 wire format for weir-mock (see wire.hpp).
#include "wire.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <ctime>
#include <iterator>
#include <limits>

#include <fmt/format.h>
#include <boost/json.hpp>

#include "api/lax_int.hpp"
#include "core/multipart.hpp"

namespace weir::mock {
namespace json = boost::json;

namespace {

// Token vocabulary: one word per token, each with its leading space.
constexpr std::array<std::string_view, 64> kWords = {
    " the",     " river",   " stone",  " light",  " over",   " quiet",  " north",  " glass",  " seven",  " paper",
    " under",   " bright",  " market", " ocean",  " signal", " garden", " copper", " window", " across", " silver",
    " engine",  " winter",  " forest", " thread", " simple", " harbor", " cloud",  " number", " people", " moving",
    " little",  " open",    " field",  " table",  " orange", " before", " after",  " steady", " swift",  " token",
    " bridge",  " valley",  " summer", " letter", " circle", " yellow", " mirror", " island", " follow", " gentle",
    " morning", " station", " rapid",  " canyon", " pencil", " wonder", " marble", " planet", " basket", " echo",
    " meadow",  " lantern", " velvet", " anchor",
};

// Python's bool("") style truthiness is not needed; these are pydantic-like
// readers: absent or null member -> nullopt, wrong type -> a 400.
using OptErr = std::optional<ApiError>;

std::string quoted_loc(std::string_view key) { return fmt::format("'{}'", key); }

// FastAPI turns pydantic errors into RequestValidationError; vLLM answers them
// with 400 BadRequestError and the error list's repr as the message. `loc` is
// the part of the location after 'body' (empty for model-level errors).
ApiError validation(std::string_view type, std::string_view loc, std::string_view msg) {
  if (loc.empty()) return {400, fmt::format("[{{'type': '{}', 'loc': ('body',), 'msg': '{}'}}]", type, msg)};
  return {400, fmt::format("[{{'type': '{}', 'loc': ('body', {}), 'msg': '{}'}}]", type, loc, msg)};
}

// vLLM's model check (_check_model): 404 for a name not served. An empty
// name is the served model, as a missing one (_is_model_supported).
OptErr unserved(const MockConfig& cfg, std::string_view model) {
  if (model.empty()) return std::nullopt;
  for (const auto& m : cfg.models)
    if (m == model) return std::nullopt;
  return ApiError{404, fmt::format("The model `{}` does not exist.", model)};
}

OptErr opt_int(const json::object& o, std::string_view key, std::optional<std::int64_t>& out) {
  const json::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (v->is_int64()) {
    out = v->get_int64();
    return std::nullopt;
  }
  if (v->is_uint64()) {
    const auto u = v->get_uint64();
    out = u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
              ? std::numeric_limits<std::int64_t>::max()
              : static_cast<std::int64_t>(u);
    return std::nullopt;
  }
  if (v->is_double()) {
    const double d = v->get_double();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e18) {
      out = static_cast<std::int64_t>(d);
      return std::nullopt;
    }
    return validation("int_from_float", quoted_loc(key),
                      "Input should be a valid integer, got a number with a fractional part");
  }
  if (v->is_bool()) {  // pydantic's lax mode: true is 1, false 0 (then refused as a count below 1)
    out = v->get_bool() ? 1 : 0;
    return std::nullopt;
  }
  if (v->is_string()) {
    // A string of one, as pydantic's lax mode reads it ("3", " 3 ", "1_000", "3.0"): Weir's own reader of
    // vLLM's counts, so the mock and the gateway take the same strings.
    if (const auto i = api::lax_int(std::string_view(v->get_string()))) {
      out = *i;
      return std::nullopt;
    }
    return validation("int_parsing", quoted_loc(key),
                      "Input should be a valid integer, unable to parse string as an integer");
  }
  return validation("int_type", quoted_loc(key), "Input should be a valid integer");
}

OptErr opt_bool(const json::object& o, std::string_view key, std::optional<bool>& out) {
  const json::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_bool()) return validation("bool_type", quoted_loc(key), "Input should be a valid boolean");
  out = v->get_bool();
  return std::nullopt;
}

OptErr opt_string(const json::object& o, std::string_view key, std::optional<std::string_view>& out) {
  const json::value* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_string()) return validation("string_type", quoted_loc(key), "Input should be a valid string");
  out = std::string_view(v->get_string());
  return std::nullopt;
}

std::uint64_t fnv1a(std::string_view s, std::uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Whitespace-separated words: the mock's "tokenizer".
std::uint32_t count_words(std::string_view s) {
  std::uint32_t n = 0;
  bool in_word = false;
  for (unsigned char c : s) {
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
    if (!space && !in_word) ++n;
    in_word = !space;
  }
  return n;
}

// A prompt given as a list of token ids: every element must be an integer.
bool all_ints(const json::array& a) {
  for (const auto& e : a)
    if (!e.is_int64() && !e.is_uint64()) return false;
  return true;
}

// Reads the `prompt` (completions) or `input` (embeddings) union:
// str | list[str] | list[int] | list[list[int]]. String prompts count
// words + 1 (the BOS token: add_special_tokens defaults to true there);
// token-id prompts count their ids.
OptErr read_prompts(const json::value& v, std::string_view field, Plan& plan) {
  const auto loc = quoted_loc(field);
  if (v.is_string()) {
    const std::string_view s = v.get_string();
    plan.prompt_hash.push_back(mix64(fnv1a(s, fnv1a("s"))));
    plan.prompt_tokens.push_back(1 + count_words(s));
    return std::nullopt;
  }
  if (!v.is_array()) return validation("string_type", loc, "Input should be a valid string");
  const auto& a = v.get_array();
  if (a.empty()) return ApiError{400, fmt::format("{} cannot be empty", field == "prompt" ? "Prompt" : "Input")};
  if (a.size() > 4096) return ApiError{400, fmt::format("weir-mock accepts at most 4096 {}s", field)};
  if (a.front().is_string()) {
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_string())
        return validation("string_type", fmt::format("{}, {}", loc, i), "Input should be a valid string");
      const std::string_view s = a[i].get_string();
      plan.prompt_hash.push_back(mix64(fnv1a(s, fnv1a("s"))));
      plan.prompt_tokens.push_back(1 + count_words(s));
    }
    return std::nullopt;
  }
  if (all_ints(a)) {
    plan.prompt_hash.push_back(mix64(fnv1a(json::serialize(a), fnv1a("t"))));
    plan.prompt_tokens.push_back(static_cast<std::uint32_t>(a.size()));
    return std::nullopt;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_array() || !all_ints(a[i].get_array()))
      return validation("list_type", fmt::format("{}, {}", loc, i), "Input should be a valid list of integers");
    if (a[i].get_array().empty())
      return ApiError{400, fmt::format("{} cannot be empty", field == "prompt" ? "Prompt" : "Input")};
    plan.prompt_hash.push_back(mix64(fnv1a(json::serialize(a[i]), fnv1a("t"))));
    plan.prompt_tokens.push_back(static_cast<std::uint32_t>(a[i].get_array().size()));
  }
  return std::nullopt;
}

// Chat messages: list of objects with a string `role`; `content` a string,
// null, or a list of parts whose "text" strings count. Each message costs
// 4 tokens of template overhead plus its words.
OptErr read_messages(const json::object& o, Plan& plan, std::string_view& last_role) {
  const json::value* v = o.if_contains("messages");
  if (v == nullptr) return validation("missing", "'messages'", "Field required");
  if (!v->is_array()) return validation("list_type", "'messages'", "Input should be a valid list");
  const auto& msgs = v->get_array();
  std::uint64_t tokens = 0;
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    if (!msgs[i].is_object())
      return validation("dict_type", fmt::format("'messages', {}", i), "Input should be a valid dictionary");
    const auto& m = msgs[i].get_object();
    const json::value* role = m.if_contains("role");
    if (role == nullptr) return validation("missing", fmt::format("'messages', {}, 'role'", i), "Field required");
    if (!role->is_string())
      return validation("string_type", fmt::format("'messages', {}, 'role'", i), "Input should be a valid string");
    last_role = role->get_string();
    std::uint64_t words = 0;
    if (const json::value* c = m.if_contains("content"); c != nullptr && !c->is_null()) {
      if (c->is_string()) {
        words = count_words(c->get_string());
      } else if (c->is_array()) {
        for (std::size_t j = 0; j < c->get_array().size(); ++j) {
          const auto& part = c->get_array()[j];
          if (!part.is_object())
            return validation("dict_type", fmt::format("'messages', {}, 'content', {}", i, j),
                              "Input should be a valid dictionary");
          if (const json::value* t = part.get_object().if_contains("text"); t != nullptr && t->is_string())
            words += count_words(t->get_string());
        }
      } else {
        return validation("string_type", fmt::format("'messages', {}, 'content'", i), "Input should be a valid string");
      }
    }
    tokens += 4 + words;
  }
  plan.prompt_hash.push_back(mix64(fnv1a(json::serialize(msgs), fnv1a("c"))));
  plan.prompt_tokens.push_back(static_cast<std::uint32_t>(std::min<std::uint64_t>(tokens, 0xffffffffu)));
  return std::nullopt;
}

// continue_final_message with a final assistant message whose content is a
// string: the generation goes on from that message's tokens (Plan::start),
// as vLLM continues it without closing the turn. The text and its hash are
// those of the conversation before that message, so a continuation of the
// first K tokens of a run produces exactly the rest of it. The message
// costs its words in prompt tokens, not the 4 of a closed turn (its open
// header stands for the generation prompt add_generation_prompt would add).
void continue_message(const json::array& msgs, const MockConfig& cfg, std::optional<std::int64_t> requested_max,
                      Plan& plan) {
  if (msgs.empty() || plan.prompt_hash.empty()) return;
  const auto& last = msgs.back().get_object();  // read_messages checked every message is an object with a role
  const json::value* role = last.if_contains("role");
  const json::value* content = last.if_contains("content");
  if (role == nullptr || !role->is_string() || role->get_string() != "assistant" || content == nullptr ||
      !content->is_string())
    return;
  const std::uint32_t done = count_words(content->get_string());
  const json::array before(msgs.begin(), msgs.end() - 1);
  plan.prompt_hash.back() = mix64(fnv1a(json::serialize(before), fnv1a("c")));
  plan.prompt_tokens.back() -= std::min<std::uint32_t>(plan.prompt_tokens.back(), 4);
  plan.start = static_cast<int>(std::min<std::uint32_t>(done, 1u << 20));
  plan.cut_by_length = false;
  if (plan.start >= cfg.max_tokens) {
    plan.tokens = plan.start + 1;  // past the natural length: one more word, then stop
  } else if (requested_max && *requested_max < cfg.max_tokens - plan.start) {
    plan.tokens = plan.start + static_cast<int>(*requested_max);
    plan.cut_by_length = true;
  } else {
    plan.tokens = cfg.max_tokens;
  }
}

// stream_options: {"include_usage": bool = true, "continuous_usage_stats": bool = false}.
// An explicit null reads as false (pydantic keeps None, which is falsy).
OptErr read_stream_options(const json::object& o, bool stream, Plan& plan) {
  const json::value* v = o.if_contains("stream_options");
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_object())
    return validation("model_type", "'stream_options'",
                      "Input should be a valid dictionary or instance of StreamOptions");
  const auto& so = v->get_object();
  if (!so.empty() && !stream)
    return validation("value_error", "", "Value error, Stream options can only be defined when `stream=True`.");
  bool include = true;
  if (const json::value* iu = so.if_contains("include_usage")) {
    if (iu->is_null())
      include = false;
    else if (iu->is_bool())
      include = iu->get_bool();
    else
      return validation("bool_type", "'stream_options', 'include_usage'", "Input should be a valid boolean");
  }
  bool continuous = false;
  if (const json::value* cu = so.if_contains("continuous_usage_stats")) {
    if (cu->is_bool())
      continuous = cu->get_bool();
    else if (!cu->is_null())
      return validation("bool_type", "'stream_options', 'continuous_usage_stats'", "Input should be a valid boolean");
  }
  plan.include_usage = stream && include;
  plan.continuous_usage = plan.include_usage && continuous;
  return std::nullopt;
}

void append_int(std::string& out, std::uint64_t v) {
  char buf[24];
  char* end = buf + sizeof buf;
  char* p = end;
  do {
    *--p = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  out.append(p, static_cast<std::size_t>(end - p));
}

// `{"prompt_tokens":P,"total_tokens":P+C,"completion_tokens":C` + details + `}`
// (pydantic field order of vLLM's UsageInfo).
void append_usage(std::string& s, std::uint64_t prompt, std::uint64_t completion, bool with_details) {
  s += "{\"prompt_tokens\":";
  append_int(s, prompt);
  s += ",\"total_tokens\":";
  append_int(s, prompt + completion);
  s += ",\"completion_tokens\":";
  append_int(s, completion);
  s += with_details ? ",\"prompt_tokens_details\":null}" : "}";
}

std::string_view finish_reason_json(const Plan& p) {
  if (p.tool_calls > 0) return "\"tool_calls\"";
  return p.cut_by_length && !p.stop_hit ? "\"length\"" : "\"stop\"";
}

// vLLM's stop_reason: the matched stop string (x-mock-stop-hit), else null.
void append_stop_reason(std::string& s, const Plan& p) {
  if (!p.stop_hit) {
    s += "null";
    return;
  }
  s += '"';
  append_json_escaped(s, p.stop_string);
  s += '"';
}

// Tool call `j` of a chat plan: vLLM's id ("chatcmpl-tool-" + 32 hex), the
// request's j-th tool name (cycling; "tool" without tools) and arguments
// {"q": "<word>"} in two pieces, as a streaming tool parser sends them.
std::string tool_call_id(const Plan& p, int j) {
  return fmt::format("chatcmpl-tool-{:016x}{:016x}", mix64(p.prompt_hash[0] ^ static_cast<std::uint64_t>(j + 1)),
                     mix64(p.prompt_hash[0] + static_cast<std::uint64_t>(j)));
}
std::string_view tool_name(const Plan& p, int j) {
  return p.tool_names.empty() ? std::string_view("tool")
                              : std::string_view(p.tool_names[static_cast<std::size_t>(j) % p.tool_names.size()]);
}
std::string tool_args_head() { return "{\\\"q\\\": \\\""; }
std::string tool_args_tail(const Plan& p, int j) {
  return fmt::format("{}\\\"}}", token_text(p.prompt_hash[0], 100, j).substr(1));
}

// A deterministic unit vector of `dims` float32 values for an input hash.
void embedding_vector(std::uint64_t hash, int dims, std::vector<float>& v) {
  v.resize(static_cast<std::size_t>(dims));
  std::uint64_t state = mix64(hash ^ (static_cast<std::uint64_t>(dims) * 0x9e3779b97f4a7c15ULL));
  double norm = 0;
  for (auto& x : v) {
    state += 0x9e3779b97f4a7c15ULL;
    const double u = static_cast<double>(mix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
    x = static_cast<float>(u * 2.0 - 1.0);
    norm += static_cast<double>(x) * static_cast<double>(x);
  }
  norm = std::sqrt(norm);
  if (norm == 0) norm = 1;
  for (auto& x : v) x = static_cast<float>(static_cast<double>(x) / norm);
}

}  // namespace

void Plan::clear() {
  endpoint = Endpoint::chat;
  stream = false;
  n = 1;
  tokens = 1;
  start = 0;
  cut_by_length = false;
  include_usage = false;
  continuous_usage = false;
  prompt_hash.clear();
  prompt_tokens.clear();
  total_prompt_tokens = 0;
  model.clear();
  chunk_prefix.clear();
  usage_prefix.clear();
  body_head.clear();
  role_json.clear();
  dimensions = 16;
  base64 = false;
  reasoning_tokens = 0;
  tool_calls = 0;
  tool_names.clear();
  stop_string.clear();
  stop_hit = false;
}

void append_json_escaped(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += ch;
        }
    }
  }
}

std::optional<ApiError> build_plan(Endpoint ep, std::string_view body, std::string_view request_id,
                                   const MockConfig& cfg, Rng& rng, Plan& plan) {
  plan.clear();
  plan.endpoint = ep;

  json::monotonic_resource mr;
  boost::system::error_code ec;
  const json::value doc = json::parse(body, ec, &mr);
  if (ec) return validation("json_invalid", "0", "JSON decode error");
  if (!doc.is_object())
    return validation("model_attributes_type", "",
                      "Input should be a valid dictionary or object to extract fields from");
  const auto& o = doc.get_object();

  std::optional<std::string_view> model;
  if (auto e = opt_string(o, "model", model)) return e;
  std::optional<std::string_view> body_request_id;
  if (auto e = opt_string(o, "request_id", body_request_id)) return e;

  std::string_view last_role;
  std::optional<bool> stream;
  std::optional<std::int64_t> requested_max;  // the request's max_tokens, for the context-length check
  if (ep != Endpoint::embedding) {
    if (auto e = opt_bool(o, "stream", stream)) return e;
    plan.stream = stream.value_or(false);
    if (auto e = read_stream_options(o, plan.stream, plan)) return e;

    std::optional<std::int64_t> n;
    if (auto e = opt_int(o, "n", n)) return e;
    if (n && *n < 1) return ApiError{400, fmt::format("n must be at least 1, got {}.", *n)};
    if (n && *n > 128) return ApiError{400, fmt::format("weir-mock accepts n <= 128, got {}.", *n)};
    plan.n = static_cast<int>(n.value_or(1));

    // max_completion_tokens wins over the deprecated max_tokens (vLLM).
    std::optional<std::int64_t> max_tokens;
    if (ep == Endpoint::chat)
      if (auto e = opt_int(o, "max_completion_tokens", max_tokens)) return e;
    if (!max_tokens)
      if (auto e = opt_int(o, "max_tokens", max_tokens)) return e;
    if (max_tokens && *max_tokens < 1)
      return ApiError{400, fmt::format("max_tokens must be at least 1, got {}.", *max_tokens)};
    requested_max = max_tokens;
    plan.tokens = cfg.max_tokens;
    if (max_tokens && *max_tokens < cfg.max_tokens) {
      plan.tokens = static_cast<int>(*max_tokens);
      plan.cut_by_length = true;
    }
  }

  if (ep == Endpoint::chat) {
    if (auto e = read_messages(o, plan, last_role)) return e;
    if (const json::value* tools = o.if_contains("tools"); tools != nullptr && tools->is_array())
      for (const auto& t : tools->get_array())
        if (const auto* fn = t.is_object() ? t.get_object().if_contains("function") : nullptr; fn && fn->is_object())
          if (const auto* name = fn->get_object().if_contains("name"); name && name->is_string())
            plan.tool_names.emplace_back(name->get_string());
    if (const json::value* stop = o.if_contains("stop"); stop != nullptr) {
      if (stop->is_string())
        plan.stop_string = stop->get_string();
      else if (stop->is_array() && !stop->get_array().empty() && stop->get_array()[0].is_string())
        plan.stop_string = stop->get_array()[0].get_string();
    }
    std::optional<bool> add_generation_prompt;
    if (auto e = opt_bool(o, "add_generation_prompt", add_generation_prompt)) return e;
    std::optional<bool> continue_final;
    if (auto e = opt_bool(o, "continue_final_message", continue_final)) return e;
    if (continue_final.value_or(false) && add_generation_prompt.value_or(true))
      return ApiError{400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True."};
    if (continue_final.value_or(false)) continue_message(o.at("messages").get_array(), cfg, requested_max, plan);
    const std::string_view role =
        (add_generation_prompt.value_or(true) || last_role.empty()) ? std::string_view("assistant") : last_role;
    append_json_escaped(plan.role_json, role);
  } else if (ep == Endpoint::completion) {
    const json::value* prompt = o.if_contains("prompt");
    if (prompt == nullptr || prompt->is_null())
      return validation("value_error", "", "Value error, At least one of `prompt` or `prompt_embeds` must be set.");
    if (auto e = read_prompts(*prompt, "prompt", plan)) return e;
    if (const json::value* suffix = o.if_contains("suffix"); suffix != nullptr && !suffix->is_null())
      return ApiError{400, "suffix is not currently supported"};
  } else {
    const json::value* input = o.if_contains("input");
    if (input == nullptr) return validation("missing", "'input'", "Field required");
    if (auto e = read_prompts(*input, "input", plan)) return e;
    std::optional<std::string_view> fmt_name;
    if (auto e = opt_string(o, "encoding_format", fmt_name)) return e;
    if (fmt_name && *fmt_name != "float" && *fmt_name != "base64")
      return validation("literal_error", "'encoding_format'", "Input should be 'float' or 'base64'");
    plan.base64 = fmt_name && *fmt_name == "base64";
    std::optional<std::int64_t> dims;
    if (auto e = opt_int(o, "dimensions", dims)) return e;
    if (dims && (*dims < 1 || *dims > 65536))
      return ApiError{400, fmt::format("dimensions must be between 1 and 65536, got {}.", *dims)};
    plan.dimensions = dims ? static_cast<int>(*dims) : cfg.embedding_dim;
    plan.tokens = 0;
  }
  if (plan.choices() > 1024) return ApiError{400, "weir-mock accepts at most 1024 choices per request"};
  for (auto t : plan.prompt_tokens) plan.total_prompt_tokens += t;
  // vLLM checks every prompt against the context length (vllm/renderers/params.py, TokenizeParams: a max_tokens
  // past the context length, then a prompt past what is left of it; serving_engine.py's _validate_input before)
  // and refuses the whole request for one that does not fit. Its tokenizer stops one token past the most that
  // fits: the count it gives is at most that. (max_tokens near int64's top: clients send 2^63-1 for "no limit".)
  if (ep != Endpoint::embedding) {
    const std::int64_t limit = cfg.max_model_len;
    if (requested_max && *requested_max > limit)
      return ApiError{400, fmt::format("max_tokens={} cannot be greater than max_model_len={}. Please request fewer "
                                       "output tokens.",
                                       *requested_max, limit)};
    for (auto t : plan.prompt_tokens) {
      const auto n = static_cast<std::int64_t>(t);
      if (requested_max && n > limit - *requested_max)
        return ApiError{
            400, fmt::format("You passed {} input tokens and requested {} output tokens. However, the "
                             "model's context length is only {} tokens, resulting in a maximum input "
                             "length of {} tokens. Please reduce the length of the input prompt.",
                             std::min(n, limit - *requested_max + 1), *requested_max, limit, limit - *requested_max)};
      if (!requested_max && static_cast<std::int64_t>(t) >= cfg.max_model_len)
        return ApiError{400, fmt::format("This model's maximum context length is {} tokens. However, your request "
                                         "has {} input tokens. Please reduce the length of the input messages.",
                                         cfg.max_model_len, t)};
    }
  }

  // Model check after validation, as vLLM does (_check_model): 404 for a name
  // not served. The response names vLLM's first served name, or with
  // --any-model the name asked for.
  std::string_view response_model = cfg.models.front();
  if (model && !model->empty()) {  // ("" is the served model, as a missing one: vLLM's _is_model_supported)
    plan.model = *model;
    if (cfg.any_model) {
      response_model = *model;
    } else if (auto e = unserved(cfg, *model)) {
      return e;
    }
  }

  // vLLM's id: prefix + X-Request-Id header, else the body's request_id, else a random uuid4 hex.
  std::string id = ep == Endpoint::chat ? "chatcmpl-" : ep == Endpoint::completion ? "cmpl-" : "embd-";
  if (!request_id.empty())
    append_json_escaped(id, request_id);
  else if (body_request_id && ep != Endpoint::embedding)
    append_json_escaped(id, *body_request_id);
  else
    id += random_hex32(rng);

  std::string tail = fmt::format(",\"created\":{},\"model\":\"", static_cast<std::int64_t>(std::time(nullptr)));
  append_json_escaped(tail, response_model);
  tail += '"';
  const std::string_view object = ep == Endpoint::chat         ? "chat.completion"
                                  : ep == Endpoint::completion ? "text_completion"
                                                               : "list";
  const std::string_view chunk_object = ep == Endpoint::chat ? "chat.completion.chunk" : "text_completion";
  plan.body_head = fmt::format("{{\"id\":\"{}\",\"object\":\"{}\"{}", id, object, tail);
  plan.chunk_prefix =
      fmt::format("{{\"id\":\"{}\",\"object\":\"{}\"{},\"choices\":[{{\"index\":", id, chunk_object, tail);
  plan.usage_prefix =
      fmt::format("{{\"id\":\"{}\",\"object\":\"{}\"{},\"choices\":[],\"usage\":", id, chunk_object, tail);
  return std::nullopt;
}

std::string_view token_text(std::uint64_t prompt_hash, int choice, int pos) {
  const std::uint64_t h = mix64(prompt_hash ^ (static_cast<std::uint64_t>(choice + 1) * 0xd6e8feb86659fd93ULL) ^
                                (static_cast<std::uint64_t>(pos) * 0x9e3779b97f4a7c15ULL));
  return kWords[h & 63];
}

void append_sse_chunk(std::string& out, std::string_view json) {
  static constexpr char hex[] = "0123456789abcdef";
  std::size_t len = json.size() + 8;  // "data: " + json + "\n\n"
  char buf[16];
  char* end = buf + sizeof buf;
  char* p = end;
  do {
    *--p = hex[len & 15];
    len >>= 4;
  } while (len != 0);
  out.append(p, static_cast<std::size_t>(end - p));
  out += "\r\ndata: ";
  out += json;
  out += "\n\n\r\n";
}

namespace {

// --stamp: `"mock_ns":N,` as the first member of the JSON object that starts `s` at `at`.
void insert_stamp(std::string& s, std::size_t at, std::int64_t stamp_ns) {
  if (stamp_ns < 0) return;
  std::string m = "\"mock_ns\":";
  append_int(m, static_cast<std::uint64_t>(stamp_ns));
  m += ',';
  s.insert(at + 1, m);
}

}  // namespace

void append_stream_step(const Plan& p, int step, std::string& s, std::string& out, bool end, std::int64_t stamp_ns) {
  if (step != p.start) stamp_ns = -1;
  const bool last = step == p.tokens - 1;
  const auto done = static_cast<std::uint64_t>(step - p.start) + 1;  // tokens per choice produced after this step
  if (p.endpoint == Endpoint::chat) {
    const std::uint64_t prompt = p.total_prompt_tokens;
    if (step == p.start) {
      for (int i = 0; i < p.n; ++i) {
        s = p.chunk_prefix;
        append_int(s, static_cast<std::uint64_t>(i));
        s += ",\"delta\":{\"role\":\"";
        s += p.role_json;
        s += "\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]";
        if (p.continuous_usage) {
          s += ",\"usage\":";
          append_usage(s, prompt, 0, false);
        }
        s += '}';
        append_sse_chunk(out, s);
      }
    }
    for (int i = 0; i < p.n; ++i) {
      s = p.chunk_prefix;
      if (i == 0) insert_stamp(s, 0, stamp_ns);
      append_int(s, static_cast<std::uint64_t>(i));
      s += step < p.reasoning_tokens ? ",\"delta\":{\"reasoning_content\":\"" : ",\"delta\":{\"content\":\"";
      s += token_text(p.prompt_hash[0], i, step);
      s += "\"},\"logprobs\":null,\"finish_reason\":";
      if (last && p.tool_calls == 0) {
        s += finish_reason_json(p);
        s += ",\"stop_reason\":";
        append_stop_reason(s, p);
        s += "}]";
      } else {
        s += "null}]";
      }
      if (p.continuous_usage) {
        s += ",\"usage\":";
        append_usage(s, prompt, done, false);
      }
      s += '}';
      append_sse_chunk(out, s);
      if (!last || p.tool_calls == 0) continue;
      // Tool calls after the text, one after another, as vLLM's tool parsers
      // stream them: the id and name, then the arguments in two pieces.
      for (int j = 0; j < p.tool_calls; ++j) {
        const auto chunk = [&](std::string_view delta) {
          s = p.chunk_prefix;
          append_int(s, static_cast<std::uint64_t>(i));
          s += ",\"delta\":{\"tool_calls\":[";
          s += delta;
          s += "]},\"logprobs\":null,\"finish_reason\":null}]";
          if (p.continuous_usage) {  // (vLLM's usage is on every chunk: tool call deltas too)
            s += ",\"usage\":";
            append_usage(s, prompt, done, false);
          }
          s += '}';
          append_sse_chunk(out, s);
        };
        std::string name;
        append_json_escaped(name, tool_name(p, j));
        chunk(fmt::format("{{\"id\":\"{}\",\"type\":\"function\",\"index\":{},\"function\":{{\"name\":\"{}\"}}}}",
                          tool_call_id(p, j), j, name));
        chunk(fmt::format("{{\"index\":{},\"function\":{{\"arguments\":\"{}\"}}}}", j, tool_args_head()));
        chunk(fmt::format("{{\"index\":{},\"function\":{{\"arguments\":\"{}\"}}}}", j, tool_args_tail(p, j)));
      }
      s = p.chunk_prefix;
      append_int(s, static_cast<std::uint64_t>(i));
      s += ",\"delta\":{},\"logprobs\":null,\"finish_reason\":\"tool_calls\",\"stop_reason\":null}]";
      if (p.continuous_usage) {
        s += ",\"usage\":";
        append_usage(s, prompt, done, false);
      }
      s += '}';
      append_sse_chunk(out, s);
    }
  } else {
    for (std::size_t pi = 0; pi < p.prompt_hash.size(); ++pi) {
      for (int i = 0; i < p.n; ++i) {
        s = p.chunk_prefix;
        if (pi == 0 && i == 0) insert_stamp(s, 0, stamp_ns);
        append_int(s, pi * static_cast<std::size_t>(p.n) + static_cast<std::size_t>(i));
        s += ",\"text\":\"";
        s += token_text(p.prompt_hash[pi], i, step);
        s += "\",\"logprobs\":null,\"finish_reason\":";
        s += last ? finish_reason_json(p) : std::string_view("null");
        s += ",\"stop_reason\":null}],\"usage\":";
        if (p.continuous_usage)
          append_usage(s, p.prompt_tokens[pi], done, true);
        else
          s += "null";
        s += '}';
        append_sse_chunk(out, s);
      }
    }
  }
  if (!last || !end) return;
  if (p.include_usage) {
    s = p.usage_prefix;
    append_usage(s, p.total_prompt_tokens, p.completion_tokens(), false);
    s += '}';
    append_sse_chunk(out, s);
  }
  append_sse_chunk(out, "[DONE]");
  out += "0\r\n\r\n";
}

void append_full_body(const Plan& p, std::string& out, std::int64_t stamp_ns) {
  const std::size_t at = out.size();
  out += p.body_head;
  insert_stamp(out, at, stamp_ns);
  if (p.endpoint == Endpoint::embedding) {
    out += ",\"data\":[";
    std::vector<float> v;
    for (std::size_t i = 0; i < p.prompt_hash.size(); ++i) {
      if (i) out += ',';
      out += "{\"index\":";
      append_int(out, i);
      out += ",\"object\":\"embedding\",\"embedding\":";
      embedding_vector(p.prompt_hash[i], p.dimensions, v);
      if (p.base64) {
        out += '"';
        out += base64_encode(std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
        out += '"';
      } else {
        out += '[';
        for (std::size_t j = 0; j < v.size(); ++j) {
          if (j) out += ',';
          fmt::format_to(std::back_inserter(out), "{}", static_cast<double>(v[j]));
        }
        out += ']';
      }
      out += '}';
    }
    out += "],\"usage\":";
    append_usage(out, p.total_prompt_tokens, 0, true);
    out += '}';
    return;
  }
  out += ",\"choices\":[";
  for (std::size_t pi = 0; pi < p.prompt_hash.size(); ++pi) {
    for (int i = 0; i < p.n; ++i) {
      if (pi || i) out += ',';
      out += "{\"index\":";
      append_int(out, pi * static_cast<std::size_t>(p.n) + static_cast<std::size_t>(i));
      out += p.endpoint == Endpoint::chat ? ",\"message\":{\"role\":\"" : ",\"text\":\"";
      if (p.endpoint == Endpoint::chat) {
        out += p.role_json;
        out += "\",\"content\":";
        const int r = std::min(p.reasoning_tokens, p.tokens);
        if (r == p.tokens) {
          out += "null";
        } else {
          out += '"';
          for (int t = std::max(r, p.start); t < p.tokens; ++t) out += token_text(p.prompt_hash[pi], i, t);
          out += '"';
        }
        out += ",\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"tool_calls\":[";
        for (int j = 0; j < p.tool_calls; ++j) {
          if (j) out += ',';
          std::string name;
          append_json_escaped(name, tool_name(p, j));
          out += fmt::format(
              "{{\"id\":\"{}\",\"type\":\"function\",\"function\":{{\"name\":\"{}\",\"arguments\":\"{}{}\"}}}}",
              tool_call_id(p, j), name, tool_args_head(), tool_args_tail(p, j));
        }
        out += "],\"reasoning_content\":";
        if (r <= p.start) {
          out += "null";
        } else {
          out += '"';
          for (int t = p.start; t < r; ++t) out += token_text(p.prompt_hash[pi], i, t);
          out += '"';
        }
        out += "},\"logprobs\":null,\"finish_reason\":";
      } else {
        for (int t = 0; t < p.tokens; ++t) out += token_text(p.prompt_hash[pi], i, t);
        out += "\",\"logprobs\":null,\"finish_reason\":";
      }
      out += finish_reason_json(p);
      out += ",\"stop_reason\":";
      append_stop_reason(out, p);
      out += p.endpoint == Endpoint::chat ? "}" : ",\"prompt_logprobs\":null}";
    }
  }
  out += "],\"service_tier\":null,\"system_fingerprint\":null,\"usage\":";
  append_usage(out, p.total_prompt_tokens, p.completion_tokens(), true);
  out += p.endpoint == Endpoint::chat ? ",\"prompt_logprobs\":null,\"kv_transfer_params\":null}"
                                      : ",\"kv_transfer_params\":null}";
}

namespace {
// Parses `body` into `doc` (a JSON object, else vLLM's validation error)
// and checks its optional `model` is served (else vLLM's 404).
OptErr parse_model_body(std::string_view body, const MockConfig& cfg, json::monotonic_resource& mr, json::value& doc,
                        std::optional<std::string_view>& model) {
  boost::system::error_code ec;
  doc = json::parse(body, ec, &mr);
  if (ec) return validation("json_invalid", "0", "JSON decode error");
  if (!doc.is_object())
    return validation("model_attributes_type", "",
                      "Input should be a valid dictionary or object to extract fields from");
  if (auto e = opt_string(doc.get_object(), "model", model)) return e;
  if (model && !cfg.any_model) return unserved(cfg, *model);
  return std::nullopt;
}
}  // namespace

std::optional<ApiError> tokenize_body(std::string_view body, const MockConfig& cfg, std::string& out) {
  json::monotonic_resource mr;
  json::value doc;
  std::optional<std::string_view> model;
  if (auto e = parse_model_body(body, cfg, mr, doc, model)) return e;
  const auto& o = doc.get_object();
  Plan plan;
  if (o.contains("messages")) {
    std::string_view last_role;
    if (auto e = read_messages(o, plan, last_role)) return e;
  } else {
    const json::value* prompt = o.if_contains("prompt");
    if (prompt == nullptr) return validation("missing", "'prompt'", "Field required");
    if (auto e = read_prompts(*prompt, "prompt", plan)) return e;
    if (plan.prompt_tokens.size() != 1) return validation("string_type", "'prompt'", "Input should be a valid string");
  }
  const std::uint32_t count = plan.prompt_tokens.front();
  out = "{\"count\":";
  append_int(out, count);
  out += ",\"max_model_len\":";
  append_int(out, static_cast<std::uint64_t>(cfg.max_model_len));
  out += ",\"tokens\":[";
  for (std::uint32_t t = 0; t < count; ++t) {
    if (t) out += ',';
    append_int(out, 1000 + t);
  }
  out += "],\"token_strs\":null}";
  return std::nullopt;
}

namespace {
// A deterministic score in [0, 1) for two texts (FNV-1a of both).
double pair_score(std::string_view a, std::string_view b) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::string_view s : {a, std::string_view("\x1f"), b})
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return static_cast<double>(h >> 11) / static_cast<double>(1ull << 53);
}

// A string or a list of strings under `key` (vLLM's `str | list[str]`).
OptErr string_list(const json::object& o, std::string_view key, std::vector<std::string_view>& out) {
  const json::value* v = o.if_contains(key);
  if (!v) return validation("missing", fmt::format("'{}'", key), "Field required");
  if (v->is_string()) {
    out.push_back(v->get_string());
    return std::nullopt;
  }
  if (!v->is_array() || v->get_array().empty())
    return validation("string_type", fmt::format("'{}'", key), "Input should be a valid string or list");
  for (const auto& e : v->get_array()) {
    if (!e.is_string()) return validation("string_type", fmt::format("'{}'", key), "Input should be a valid string");
    out.push_back(e.get_string());
  }
  return std::nullopt;
}

void usage_json(std::string& out, std::uint64_t prompt) {
  out += ",\"usage\":{\"prompt_tokens\":";
  append_int(out, prompt);
  out += ",\"total_tokens\":";
  append_int(out, prompt);
  out += ",\"completion_tokens\":0,\"prompt_tokens_details\":null}";
}
}  // namespace

std::optional<ApiError> extra_route_body(std::string_view path, std::string_view body, const MockConfig& cfg,
                                         std::int64_t created, std::string& out, bool& handled) {
  handled = path == "/detokenize" || path == "/rerank" || path == "/v1/rerank" || path == "/v2/rerank" ||
            path == "/score" || path == "/v1/score" || path == "/pooling" || path == "/classify";
  if (!handled) return std::nullopt;
  json::monotonic_resource mr;
  json::value doc;
  std::optional<std::string_view> model;
  if (auto e = parse_model_body(body, cfg, mr, doc, model)) return e;
  const auto& o = doc.get_object();
  const std::string name = cfg.any_model && model ? std::string(*model) : cfg.models.front();
  out.clear();
  if (path == "/detokenize") {
    const json::value* t = o.if_contains("tokens");
    if (!t) return validation("missing", "'tokens'", "Field required");
    if (!t->is_array() || !all_ints(t->get_array()))
      return validation("list_type", "'tokens'", "Input should be a valid list");
    out = "{\"prompt\":\"";
    for (std::size_t i = 0; i < t->get_array().size(); ++i) out += i ? " w" : "w";
    out += "\"}";
    return std::nullopt;
  }
  auto header = [&](std::string_view prefix) {
    out = "{\"id\":\"";
    out += prefix;
    out += "-mock\",\"object\":\"list\",\"created\":";
    append_int(out, static_cast<std::uint64_t>(created));
    out += ",\"model\":\"";
    append_json_escaped(out, name);
    out += "\",\"data\":[";
  };
  if (path.ends_with("rerank")) {
    const json::value* q = o.if_contains("query");
    if (!q || !q->is_string()) return validation("missing", "'query'", "Field required");
    std::vector<std::string_view> docs;
    if (auto e = string_list(o, "documents", docs)) return e;
    std::vector<std::pair<double, std::size_t>> ranked;
    std::uint64_t tokens = 0;
    for (std::size_t i = 0; i < docs.size(); ++i) {
      ranked.emplace_back(pair_score(q->get_string(), docs[i]), i);
      tokens += count_words(q->get_string()) + count_words(docs[i]);
    }
    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::size_t top = ranked.size();
    std::optional<std::int64_t> top_n;  // 0 or less (vLLM's default 0): every document
    if (auto e = opt_int(o, "top_n", top_n)) return e;
    if (top_n && *top_n > 0) top = std::min<std::size_t>(top, static_cast<std::size_t>(*top_n));
    out = "{\"id\":\"rerank-mock\",\"model\":\"";
    append_json_escaped(out, name);
    out += "\",\"usage\":{\"total_tokens\":";
    append_int(out, tokens);
    out += "},\"results\":[";
    for (std::size_t k = 0; k < top; ++k) {
      if (k) out += ',';
      out += "{\"index\":";
      append_int(out, ranked[k].second);
      out += ",\"document\":{\"text\":\"";
      append_json_escaped(out, docs[ranked[k].second]);
      out += fmt::format("\"}},\"relevance_score\":{:.6f}}}", ranked[k].first);
    }
    out += "]}";
    return std::nullopt;
  }
  if (path.ends_with("score")) {
    std::vector<std::string_view> a, b;
    if (auto e = string_list(o, "text_1", a)) return e;
    if (auto e = string_list(o, "text_2", b)) return e;
    if (a.size() != 1 && a.size() != b.size())
      return validation("value_error", "'text_1'", "text_1 must be one text or as many as text_2");
    header("score");
    std::uint64_t tokens = 0;
    for (std::size_t i = 0; i < b.size(); ++i) {
      const auto& x = a.size() == 1 ? a[0] : a[i];
      tokens += count_words(x) + count_words(b[i]);
      if (i) out += ',';
      out += fmt::format("{{\"index\":{},\"object\":\"score\",\"score\":{:.6f}}}", i, pair_score(x, b[i]));
    }
    out += "]";
    usage_json(out, tokens);
    out += "}";
    return std::nullopt;
  }
  std::vector<std::string_view> inputs;
  if (auto e = string_list(o, "input", inputs)) return e;
  const bool classify = path == "/classify";
  header(classify ? "classify" : "pool");
  std::uint64_t tokens = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    tokens += count_words(inputs[i]);
    const double p = pair_score(inputs[i], "");
    if (i) out += ',';
    if (classify)
      out += fmt::format(R"({{"index":{},"label":"{}","probs":[{:.6f},{:.6f}],"num_classes":2}})", i,
                         p >= 0.5 ? "positive" : "negative", 1.0 - p, p);
    else
      out += fmt::format(R"({{"index":{},"object":"pooling","data":[{:.6f},{:.6f},{:.6f}]}})", i, p, 1.0 - p, p / 2);
  }
  out += "]";
  usage_json(out, tokens);
  out += "}";
  return std::nullopt;
}

std::string_view reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 413:
      return "Request Entity Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return status < 500 ? "Client Error" : "Server Error";
  }
}

std::string error_type(int status) {
  std::string t;
  for (char c : reason_phrase(status))
    if (c != ' ' && c != '-') t += c;
  if (t.size() < 5 || t.compare(t.size() - 5, 5, "Error") != 0) t += "Error";
  return t;
}

std::string error_body(int status, std::string_view message, std::string_view type) {
  std::string out = "{\"error\":{\"message\":\"";
  append_json_escaped(out, message);
  out += "\",\"type\":\"";
  if (type.empty())
    append_json_escaped(out, error_type(status));
  else
    append_json_escaped(out, type);
  out += "\",\"param\":null,\"code\":";
  append_int(out, static_cast<std::uint64_t>(status));
  out += "}}";
  return out;
}

std::string models_body(const MockConfig& cfg, std::int64_t created, Rng& rng) {
  std::string out = "{\"object\":\"list\",\"data\":[";
  for (std::size_t i = 0; i < cfg.models.size(); ++i) {
    if (i) out += ',';
    out += "{\"id\":\"";
    append_json_escaped(out, cfg.models[i]);
    fmt::format_to(std::back_inserter(out), "\",\"object\":\"model\",\"created\":{},\"owned_by\":\"vllm\",\"root\":\"",
                   created);
    append_json_escaped(out, cfg.models[i]);
    fmt::format_to(std::back_inserter(out),
                   "\",\"parent\":null,\"max_model_len\":{},\"permission\":[{{\"id\":\"modelperm-{}\","
                   "\"object\":\"model_permission\",\"created\":{},\"allow_create_engine\":false,"
                   "\"allow_sampling\":true,\"allow_logprobs\":true,\"allow_search_indices\":false,"
                   "\"allow_view\":true,\"allow_fine_tuning\":false,\"organization\":\"*\",\"group\":null,"
                   "\"is_blocking\":false}}]}}",
                   cfg.max_model_len, random_hex32(rng), created);
  }
  out += "]}";
  return out;
}

std::optional<ApiError> audio_body(std::string_view path, std::string_view content_type_in, std::string_view body,
                                   const MockConfig& cfg, std::int64_t created, std::string& out,
                                   std::string& content_type) {
  const auto boundary = core::form_boundary(content_type_in);
  if (!boundary) return ApiError{400, boundary.error()};
  const auto parts = core::parse_form(body, *boundary);
  if (!parts) return ApiError{400, parts.error()};
  const auto* file = core::find_part(*parts, "file");
  if (!file) return validation("missing", "'file'", "Field required");
  auto field = [&](std::string_view name, std::string_view dflt) {
    const auto* p = core::find_part(*parts, name);
    return p ? p->value : dflt;
  };
  const std::string_view model = field("model", cfg.models.front());
  if (!cfg.any_model)
    if (auto e = unserved(cfg, model)) return e;
  auto truthy = [&](std::string_view name) {
    const auto v = field(name, "false");
    return v == "true" || v == "True" || v == "1";
  };
  std::vector<std::string> words = {"heard", std::to_string(file->value.size()), "bytes", "of",
                                    std::string(file->filename)};
  for (std::string_view p = field("prompt", ""); !p.empty();) {
    const auto sp = p.find(' ');
    if (sp != 0) words.emplace_back(p.substr(0, sp));
    if (sp == std::string_view::npos) break;
    p.remove_prefix(sp + 1);
  }
  std::string text;
  for (const auto& w : words) (text.empty() ? text : text += ' ') += w;
  const std::uint64_t seconds = 1 + file->value.size() / 32000;  // 16 kHz, 16-bit mono
  out.clear();
  if (truthy("stream")) {
    content_type = "text/event-stream";
    const std::string_view object = path.ends_with("translations") ? "translation.chunk" : "transcription.chunk";
    for (std::size_t i = 0; i < words.size(); ++i) {
      out += fmt::format("data: {{\"id\":\"trsc-mock\",\"object\":\"{}\",\"created\":{},\"model\":\"", object, created);
      append_json_escaped(out, model);
      out += "\",\"choices\":[{\"delta\":{\"content\":\"";
      append_json_escaped(out, i ? " " + words[i] : words[i]);
      out += i + 1 == words.size() ? "\"},\"finish_reason\":\"stop\",\"stop_reason\":null}]}\n\n"
                                   : "\"},\"finish_reason\":null,\"stop_reason\":null}]}\n\n";
    }
    if (truthy("stream_include_usage")) {
      out += fmt::format("data: {{\"id\":\"trsc-mock\",\"object\":\"{}\",\"created\":{},\"model\":\"", object, created);
      append_json_escaped(out, model);
      out += fmt::format(
          "\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{0},\"total_tokens\":{1},"
          "\"completion_tokens\":{2}}}}}\n\n",
          seconds * 50, seconds * 50 + words.size(), words.size());
    }
    out += "data: [DONE]\n\n";
    return std::nullopt;
  }
  const std::string_view format = field("response_format", "json");
  if (format == "text" || format == "srt" || format == "vtt") {
    content_type = "text/plain; charset=utf-8";
    out = text;
    return std::nullopt;
  }
  if (format != "json" && format != "verbose_json")
    return ApiError{400, fmt::format("Unsupported response_format: {}", format)};
  content_type = "application/json";
  out = "{\"text\":\"";
  append_json_escaped(out, text);
  out += "\"";
  if (format == "verbose_json")
    out += fmt::format(",\"language\":\"{}\",\"duration\":\"{}\",\"segments\":[]", "en", seconds);
  out += fmt::format(",\"usage\":{{\"type\":\"duration\",\"seconds\":{}}}}}", seconds);
  return std::nullopt;
}

}  // namespace weir::mock
