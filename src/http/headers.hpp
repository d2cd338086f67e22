// Header handling shared by the downstream and upstream sides (RFC 9110).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include <boost/beast/http/field.hpp>

#include "core/text.hpp"

namespace weir::http {

using core::iequals;  // ASCII case-insensitive (field names, RFC 9110 §5.1)

// True for the fields a proxy never forwards (RFC 9110 §7.6.1, with the
// legacy Proxy-Connection and Keep-Alive and §11.7's proxy credentials):
// Connection, Proxy-Connection, Keep-Alive, TE, Transfer-Encoding, Upgrade,
// Trailer, Proxy-Authorization, Proxy-Authenticate, by Beast's field code
// (Beast gives every field it knows its code whatever the name's case, so
// none of these is ever field::unknown). The one list of them.
bool is_fixed_hop_by_hop(boost::beast::http::field f);

// The same for a field name, or any field that the message's Connection
// header lists (`connection_value`).
bool is_hop_by_hop(std::string_view name, std::string_view connection_value);

// True if the comma-separated list `list` contains `token` (case-insensitive),
// e.g. has_token("gzip, br", "gzip"). A "q=0" parameter excludes the token.
bool has_token(std::string_view list, std::string_view token);

// The value of the first field `f` (a Beast field code) of `fields` (a
// Beast header or field list), or "" when it has none: what Beast's
// operator[] answers, found by a scan in order comparing codes rather than a
// case-insensitive search of its tree (a message carries about a dozen
// fields; on a vLLM response head, ~40 instructions against ~550).
template <class Fields, class Code>
requires std::is_enum_v<Code> std::string_view first_field(const Fields& fields, Code f) {
  for (const auto& e : fields)
    if (e.name() == f) return e.value();
  return {};
}

// The codings a message's Content-Encoding lines give, all of them joined
// (RFC 9110 §5.3: two lines are their values joined by a comma), without
// `identity` (no coding) and empty list elements: "" for none, "gzip", or
// "gzip, br" for two (which no decoder takes).
template <class Fields>
std::string content_codings(const Fields& fields) {
  std::string out;
  for (const auto& e : fields) {
    if (e.name() != boost::beast::http::field::content_encoding) continue;
    std::string_view v = e.value();
    while (!v.empty()) {
      const auto comma = v.find(',');
      const std::string_view c = core::trim_ows(v.substr(0, comma));
      v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
      if (c.empty() || iequals(c, "identity")) continue;
      if (!out.empty()) out += ", ";
      out += c;
    }
  }
  return out;
}

// Whether a Connection line of `fields` lists `close` (RFC 9110 §7.6.1, RFC
// 9112 §9.6): the connection ends after this message, whatever else the
// lines list (Beast's keep_alive() reads it on HTTP/1.1 only: on HTTP/1.0
// a `keep-alive` beside it won).
template <class Fields>
bool connection_close(const Fields& fields) {
  for (const auto& e : fields)
    if (e.name() == boost::beast::http::field::connection && has_token(e.value(), "close")) return true;
  return false;
}

// The same by name (ASCII case-insensitive): for fields Beast has no code
// for (x-api-key, x-request-id, ...).
template <class Fields>
std::string_view first_field(const Fields& fields, std::string_view name) {
  for (const auto& e : fields) {
    const std::string_view n = e.name_string();
    if (n.size() == name.size() && iequals(n, name)) return e.value();
  }
  return {};
}

// The value of the one field named `name` (ASCII case-insensitive), "" when
// there is none; `repeated` when there are several lines: RFC 9110 §5.3 reads
// them as one comma-joined value, which a single-valued field cannot be (the
// first or the last would be a guess: a proxy that appends its own line
// meant it to win, a client that sends two meant something else).
template <class Fields>
std::string_view only_field(const Fields& fields, std::string_view name, bool& repeated) {
  std::string_view found;
  bool seen = false;
  repeated = false;
  for (const auto& e : fields) {
    const std::string_view n = e.name_string();
    if (n.size() != name.size() || !iequals(n, name)) continue;
    if (seen) {
      repeated = true;
      return {};
    }
    seen = true;
    found = e.value();
  }
  return found;
}

// True when `fields` has a field `f` (a Beast field code).
template <class Fields, class Code>
requires std::is_enum_v<Code>
bool has_field(const Fields& fields, Code f) {
  for (const auto& e : fields)
    if (e.name() == f) return true;
  return false;
}

// Appends "Name: value\r\n".
inline void append_header(std::string& out, std::string_view name, std::string_view value) {
  out.append(name);
  out.append(": ");
  out.append(value);
  out.append("\r\n");
}

// Appends "HTTP/1.1 <status> <reason>\r\n".
void append_status_line(std::string& out, int status);

// Appends the lowercase hexadecimal form of n (chunk sizes, RFC 9112 §7.1).
void append_hex(std::string& out, std::uint64_t n);

}  // namespace weir::http
