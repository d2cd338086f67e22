// The admin API's errors and JSON text (gateway/admin_json.hpp): OpenAI's
// error shape, and doubles in plain decimal notation. Every admin API body
// and the keys file (gateway/key_store.cpp) are written with them.
#include "gateway/admin_json.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <boost/json/parse.hpp>

#include "api/json_write.hpp"

#include "core/json_text.hpp"

namespace weir::gateway {

namespace json = boost::json;

AdminError admin_bad_request(std::string message, std::string param) {
  return AdminError{400, "invalid_request_error", {}, std::move(message), std::move(param)};
}

AdminError admin_not_found(std::string message) {
  return AdminError{404, "invalid_request_error", "not_found", std::move(message), {}};
}

std::optional<std::string_view> underflowing_number(std::string_view json) {
  for (std::size_t i = 0; i < json.size();) {
    const char c = json[i];
    if (c == '"') {  // a string: to its closing quote, past escapes
      for (++i; i < json.size() && json[i] != '"'; ++i)
        if (json[i] == '\\') ++i;
      ++i;
      continue;
    }
    if (c != '-' && !(c >= '0' && c <= '9')) {
      ++i;
      continue;
    }
    const std::size_t start = i;
    bool nonzero = false, exponent = false;
    for (; i < json.size(); ++i) {
      const char d = json[i];
      if (d == 'e' || d == 'E')
        exponent = true;
      else if (d >= '1' && d <= '9')
        nonzero = nonzero || !exponent;
      else if (!(d == '0' || d == '-' || d == '+' || d == '.'))
        break;
    }
    if (!nonzero) continue;  // 0, -0.0, 0e5: a zero written as one (0.000…1 with 400 zeros underflows too)
    const std::string_view number = json.substr(start, i - start);
    const std::string text(number);  // strtod needs the terminator; the "C" locale's '.' (Weir sets none)
    if (std::strtod(text.c_str(), nullptr) == 0.0) return number;
  }
  return std::nullopt;
}

std::optional<std::string> repeated_member_path(std::string_view json) {
  // One frame per open object or array: an object's names so far (and whether a name comes next), an array's
  // element count so far (its commas), and the path segment that leads to it.
  struct Frame {
    bool object = false;
    bool name_next = false;
    std::size_t index = 0;
    std::string segment;  // ".name", "[i]", or "" for the body itself
    std::unordered_set<std::string> names;
  };
  std::vector<Frame> open;
  std::string last_name;  // the open object's latest member name: the segment of an object or array in it
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (c == '"') {
      const std::size_t start = i;
      bool escaped = false;
      for (++i; i < json.size() && json[i] != '"'; ++i)
        if (json[i] == '\\') escaped = true, ++i;
      if (open.empty() || !open.back().object || !open.back().name_next) continue;  // a value, not a name
      open.back().name_next = false;
      std::string name;
      if (!escaped) {
        name.assign(json.substr(start + 1, i - start - 1));
      } else {
        boost::system::error_code ec;
        const json::value v = json::parse(json.substr(start, i - start + 1), ec);
        if (ec || !v.is_string()) return std::nullopt;  // (not valid JSON: the parse that validates says so)
        name.assign(v.get_string().data(), v.get_string().size());
      }
      last_name = name;
      if (!open.back().names.insert(std::move(name)).second) {
        std::string p;
        for (const auto& f : open) p += f.segment;
        p += "." + last_name;
        return std::string(core::utf8_prefix(std::string_view(p).substr(1), 256));
      }
    } else if (c == '{' || c == '[') {
      std::string segment;
      if (!open.empty()) segment = open.back().object ? "." + last_name : fmt::format("[{}]", open.back().index);
      open.push_back(Frame{c == '{', c == '{', 0, std::move(segment), {}});
    } else if (c == '}' || c == ']') {
      if (!open.empty()) open.pop_back();
    } else if (c == ',' && !open.empty()) {
      if (open.back().object)
        open.back().name_next = true;
      else
        ++open.back().index;
    }
  }
  return std::nullopt;
}

namespace {

void append_plain_double(std::string& out, double d) {
  if (!std::isfinite(d)) {
    out += "null";
    return;
  }
  const double a = std::fabs(d);
  const bool plain = a == 0 || (a >= 1e-9 && a < 1e17);
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, plain ? std::chars_format::fixed : std::chars_format::general);
  const std::string_view text(buf, static_cast<std::size_t>(r.ptr - buf));
  out += text;
  if (plain && text.find('.') == std::string_view::npos) out += ".0";  // a double stays one: 25.0, not 25
}

void append_admin_json(std::string& out, const json::value& v) {
  switch (v.kind()) {
    case json::kind::double_:
      append_plain_double(out, v.get_double());
      return;
    case json::kind::object: {
      out += '{';
      bool first = true;
      for (const auto& kv : v.get_object()) {
        if (!first) out += ',';
        first = false;
        core::append_json_string(out, std::string_view(kv.key().data(), kv.key().size()));
        out += ':';
        append_admin_json(out, kv.value());
      }
      out += '}';
      return;
    }
    case json::kind::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v.get_array()) {
        if (!first) out += ',';
        first = false;
        append_admin_json(out, e);
      }
      out += ']';
      return;
    }
    case json::kind::string:
      core::append_json_string(out, std::string_view(v.get_string().data(), v.get_string().size()));
      return;
    default:  // integers, booleans, null: as Boost.JSON writes them
      out += api::to_json(v);
  }
}

}  // namespace

std::string admin_json_text(const json::value& v) {
  std::string out;
  append_admin_json(out, v);
  return out;
}

std::string admin_error_json(const AdminError& e) {
  // Valid JSON whatever bytes the message quotes (a path's key id, a query
  // parameter's name, percent-decoded: invalid UTF-8 becomes U+FFFD), as
  // the client listener's errors are.
  std::string out = R"({"error":{"message":)";
  core::append_json_string(out, e.message);
  out += R"(,"type":)";
  core::append_json_string(out, e.type);
  out += R"(,"param":)";
  if (e.param.empty())
    out += "null";
  else
    core::append_json_string(out, e.param);
  out += R"(,"code":)";
  if (e.code.empty())
    out += "null";
  else
    core::append_json_string(out, e.code);
  out += "}}";
  return out;
}

}  // namespace weir::gateway
