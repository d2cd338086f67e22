// The texts of a client body's 400 and of an upstream's error answer
// (error_text.hpp).
#include "api/error_text.hpp"

#include <cstddef>
#include <cstdint>
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

}  // namespace

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
  return true;
}

void append_openai_error_for(std::string& out, int status, std::string_view body,
                             std::string_view (*rename_param)(std::string_view)) {
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
  out += R"({"error":{"message":)";
  core::append_json_string(out, upstream_error_text(status, body));
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
