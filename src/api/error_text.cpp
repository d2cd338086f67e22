// The texts of a client body's 400 and of an upstream's error answer
// (error_text.hpp).
#include "api/error_text.hpp"

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <boost/json/error.hpp>
#include <boost/json/monotonic_resource.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "api/json_dom.hpp"
#include "core/json_text.hpp"
#include "core/text.hpp"

namespace weir::api {

namespace json = boost::json;

namespace {

// An error body as JSON, up to 256 levels deep (Boost.JSON's default is 32: an OpenAI-shaped error whose
// details echo a deep request body, or FastAPI's 422 with the body in `detail[].input`, would be read as text
// and rewritten). The body is bounded by server.max_response; the resource is a monotonic one (no recursive
// destruction).
json::value parse_error_body(std::string_view body, boost::system::error_code& ec, json::storage_ptr sp) {
  json::parse_options opt;
  opt.max_depth = 256;
  return json::parse(json::string_view(body.data(), body.size()), ec, std::move(sp), opt);
}

// Whether `body` holds a \u escape of a surrogate that is not half of a
// pair (a high one not followed by \u and a low one, or a low one alone).
// An escaped backslash is skipped (`\\ud800` in JSON text is a backslash
// and "ud800"): a scan of strings' escapes, not of the syntax around them.
bool lone_surrogate_escape(std::string_view body) {
  const auto surrogate_at = [&](std::size_t i, bool high) {  // "\uD8xx".."\uDBxx" (high) or "\uDCxx".."\uDFxx"
    if (i + 6 > body.size() || body[i] != '\\' || (body[i + 1] != 'u') || core::ascii_lower(body[i + 2]) != 'd')
      return false;
    const int h = core::hex_value(body[i + 3]);
    return high ? (h >= 8 && h <= 11) : (h >= 12 && h <= 15);
  };
  for (std::size_t i = 0; i + 1 < body.size(); ++i) {
    if (body[i] != '\\') continue;
    if (body[i + 1] != 'u') {
      ++i;  // an escaped character, a backslash among them
      continue;
    }
    if (surrogate_at(i, false)) return true;
    if (surrogate_at(i, true)) {
      if (!surrogate_at(i + 6, false)) return true;
      i += 11;
    }
  }
  return false;
}

// FastAPI's validation answer (vLLM's 400/422): `detail` a list of
// {"loc": [...], "msg", "type", ...} (FastAPI's RequestValidationError), as
// one message: "loc.joined: msg" per item (the leading "body" left out, as
// the client's request is the body), joined with "; ". "" when no item has a msg.
std::string detail_message(const json::array& items) {
  std::string m;
  for (const auto& item : items) {
    if (!item.is_object()) continue;
    const std::string_view msg = string_at(item.get_object(), "msg");
    if (msg.empty()) continue;
    if (!m.empty()) m += "; ";
    std::string loc;
    if (const auto* l = item.get_object().if_contains("loc"); l && l->is_array())
      for (const auto& part : l->get_array()) {
        if (loc.empty() && part.is_string() && part.get_string() == "body") continue;
        if (!loc.empty()) loc += '.';
        if (part.is_string())
          loc += sv(part.get_string());
        else if (part.is_int64())
          loc += std::to_string(part.get_int64());
      }
    if (!loc.empty()) {
      m += loc;
      m += ": ";
    }
    m += msg;
  }
  return m;
}

// The decimal count right after the first `phrase` in `m` (past "at least "), or right before it (`after`
// false); -1 when `m` has no such phrase or no digits there, or they do not fit an int64.
std::int64_t count_at(std::string_view m, std::string_view phrase, bool after) {
  const std::size_t at = m.find(phrase);
  if (at == std::string_view::npos) return -1;
  std::size_t begin = 0, end = 0;
  if (after) {
    begin = end = at + phrase.size();
    if (m.substr(begin).starts_with("at least ")) begin = end = begin + 9;
    while (end < m.size() && m[end] >= '0' && m[end] <= '9') ++end;
  } else {
    begin = end = at;
    while (begin > 0 && m[begin - 1] >= '0' && m[begin - 1] <= '9') --begin;
  }
  if (begin == end || end - begin > 18) return -1;
  std::int64_t n = 0;
  for (std::size_t i = begin; i < end; ++i) n = n * 10 + (m[i] - '0');
  return n;
}

// The first count `m` gives by any of `phrases` ({phrase, whether the count follows it}); -1 when none.
std::int64_t first_count(std::string_view m, std::initializer_list<std::pair<std::string_view, bool>> phrases) {
  for (const auto& [phrase, after] : phrases)
    if (const std::int64_t n = count_at(m, phrase, after); n >= 0) return n;
  return -1;
}

}  // namespace

std::optional<ContextLengthError> context_length_error(std::string_view m) {
  // What only a context-length refusal says (vLLM's, OpenAI's and Anthropic's wordings, error_text.hpp).
  static constexpr std::string_view kSignatures[] = {
      "maximum context length",                   // vLLM (every version), OpenAI
      "the model's context length is only",       // vLLM's renderer
      "is longer than the maximum model length",  // vLLM's engine
      "prompt is too long: ",                     // Anthropic
      "exceed context limit: ",                   // Anthropic
  };
  bool matched = false;
  for (const auto sig : kSignatures) matched = matched || m.find(sig) != std::string_view::npos;
  if (!matched) return std::nullopt;
  ContextLengthError e;
  e.limit = first_count(m, {{"maximum context length is ", true},
                            {"maximum context length of ", true},
                            {"context length is only ", true},
                            {"maximum model length of ", true},
                            {" maximum", false},  // Anthropic's "I tokens > L maximum"
                            {" > ", true}});      // Anthropic's "I + O > L"
  e.input = first_count(m, {{" in the messages", false},
                            {" in the prompt", false},
                            {" in your prompt", false},
                            {" tokens in the messages", false},
                            {" tokens in the input", false},
                            {" input tokens", false},
                            {" tokens from the input", false},
                            {"prompt (length ", true},
                            {"resulted in ", true},
                            {"prompt is too long: ", true},
                            {"exceed context limit: ", true}});
  e.output = first_count(m, {{" in the completion", false},
                             {" for the completion", false},
                             {" output tokens", false},
                             {" tokens for the completion", false},
                             {"is too large: ", true},
                             {" > ", false}});  // Anthropic's "I + O > L"
  return e;
}

std::string anthropic_context_length_message(const ContextLengthError& e) {
  if (e.limit <= 0 || e.input < 0) return {};
  if (e.input > e.limit) return fmt::format("prompt is too long: {} tokens > {} maximum", e.input, e.limit);
  if (e.output > 0 && e.output > e.limit - e.input)
    return fmt::format(
        "input length and `max_tokens` exceed context limit: {} + {} > {}, decrease input length or `max_tokens` "
        "and try again",
        e.input, e.output, e.limit);
  return {};
}

std::string upstream_error_message(std::string_view body) {
  unsigned char buf[4096];
  json::monotonic_resource mr(buf, sizeof buf);
  boost::system::error_code ec;
  const json::value v = parse_error_body(body, ec, &mr);
  if (ec || !v.is_object()) return {};
  const auto& o = v.get_object();
  std::string_view message;
  if (const auto* e = o.if_contains("error"); e && e->is_object()) message = string_at(e->get_object(), "message");
  if (message.empty()) message = string_at(o, "error");  // (TGI's and Ollama's {"error": "<text>"})
  if (message.empty()) message = string_at(o, "message");
  if (message.empty()) message = string_at(o, "detail");
  if (const auto* d = o.if_contains("detail"); message.empty() && d && d->is_array())
    return detail_message(d->get_array());
  return std::string(message);
}

std::string upstream_error_text(int status, std::string_view body) {
  std::string message = upstream_error_message(body);
  if (!message.empty()) return message;
  message = status > 0 ? fmt::format("Upstream answered {}", status) : std::string("The upstream's stream failed");
  // A body that is no JSON object: its text, told apart from one that parses (an object without a message).
  // (One parse more, on this failure path only.)
  bool text = false;
  {
    unsigned char buf[4096];
    json::monotonic_resource mr(buf, sizeof buf);
    boost::system::error_code ec;
    const json::value v = parse_error_body(body, ec, &mr);
    text = ec || !v.is_object();
  }
  std::string squeezed;  // whitespace runs as one space, trimmed; cut a little past the bound
  if (text) {
    for (const char c : body) {
      if (squeezed.size() > 4 * kMaxUpstreamTextBytes) break;
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
        if (!squeezed.empty() && squeezed.back() != ' ') squeezed += ' ';
      } else {
        squeezed += c;
      }
    }
    while (!squeezed.empty() && squeezed.back() == ' ') squeezed.pop_back();
  }
  if (squeezed.empty()) {
    message += '.';
    return message;
  }
  message += ": ";
  const std::string_view cut = core::utf8_prefix(squeezed, kMaxUpstreamTextBytes);
  core::append_valid_utf8(message, cut);
  if (cut.size() < squeezed.size()) message += "...";
  return message;
}

bool is_openai_error(std::string_view body) {
  unsigned char buf[4096];
  json::monotonic_resource mr(buf, sizeof buf);
  boost::system::error_code ec;
  const json::value v = parse_error_body(body, ec, &mr);
  if (ec || !v.is_object()) return false;
  const auto* e = v.get_object().if_contains("error");
  if (e == nullptr || !e->is_object()) return false;
  const auto& err = e->get_object();
  const auto* message = err.if_contains("message");
  if (message == nullptr || !message->is_string()) return false;
  for (const std::string_view name : {"type", "param", "code"})
    if (const auto* m = err.if_contains(name); m != nullptr && !m->is_null() && !m->is_string()) return false;
  // A context-length refusal without its code (an OpenAI-compatible server's) is given it.
  if (string_at(err, "code").empty() && context_length_error(sv(message->get_string()))) return false;
  return true;
}

void append_openai_error_for(std::string& out, int status, std::string_view body,
                             std::string_view (*rename_param)(std::string_view), std::string_view context_param) {
  unsigned char buf[4096];
  json::monotonic_resource mr(buf, sizeof buf);
  boost::system::error_code ec;
  const json::value v = parse_error_body(body, ec, &mr);
  std::string_view type, param, code;
  std::int64_t number = 0;  // an integer code: the status vLLM means (an error event's only one)
  if (!ec && v.is_object()) {
    const auto& o = v.get_object();
    const auto* e = o.if_contains("error");
    const auto& where = e && e->is_object() ? e->get_object() : o;
    type = string_at(where, "type");
    param = string_at(where, "param");
    if (rename_param != nullptr && !param.empty()) param = rename_param(param);
    code = string_at(where, "code");
    if (const auto* c = where.if_contains("code"); c && c->is_int64()) number = c->get_int64();
  }
  const bool client_fault = status > 0 ? status < 500 : number >= 400 && number < 500;
  const std::string message = upstream_error_text(status, body);
  if (client_fault && code.empty() && context_length_error(message)) {
    // OpenAI's own error for it: clients compare the code (to trim the conversation), not vLLM's wording.
    type = "invalid_request_error";
    code = "context_length_exceeded";
    if (param.empty())
      param = rename_param != nullptr && !context_param.empty() ? rename_param(context_param) : context_param;
  }
  out += R"({"error":{"message":)";
  core::append_json_string(out, message);
  out += R"(,"type":)";
  core::append_json_string(out, !type.empty() ? type : client_fault ? "invalid_request_error" : "server_error");
  for (const auto& [name, value] : {std::pair{",\"param\":", param}, std::pair{",\"code\":", code}}) {
    out += name;
    if (value.empty())
      out += "null";
    else
      core::append_json_string(out, value);
  }
  out += "}}";
}

std::string invalid_body_message(const boost::system::error_code& ec, std::string_view body) {
  if (ec == json::error::too_deep)
    return fmt::format("The request body is nested deeper than {} levels, the most Weir reads.", kMaxBodyDepth);
  const bool surrogate_error =
      ec == json::error::illegal_leading_surrogate || ec == json::error::illegal_trailing_surrogate;
  if (ec == json::error::syntax)
    for (std::size_t i = 0, n = 0; i < body.size(); i += n)
      if ((n = core::utf8_sequence_length(body, i)) == 0)
        return fmt::format("The request body is not valid JSON: invalid UTF-8 (byte 0x{:02X} at offset {}).",
                           static_cast<unsigned char>(body[i]), i);
  if (surrogate_error || (ec == json::error::syntax && lone_surrogate_escape(body)))
    return "The request body is not valid JSON: lone surrogate escape in a string (a \\uD800-\\uDBFF escape "
           "must be followed by a \\uDC00-\\uDFFF one, and a \\uDC00-\\uDFFF escape must follow one).";
  return fmt::format("The request body is not valid JSON: {}.", ec.message());
}

}  // namespace weir::api
