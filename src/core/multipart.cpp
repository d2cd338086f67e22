#include "core/multipart.hpp"

#include <cctype>

#include <fmt/format.h>

#include "core/json_text.hpp"
#include "core/text.hpp"

namespace weir::core {

namespace {

// Splits "a; b=c; d" at the next ';' outside a quoted string; returns the
// text before it and leaves `rest` after it.
std::string_view next_param(std::string_view& rest) {
  bool quoted = false;
  for (std::size_t i = 0; i < rest.size(); ++i) {
    const char c = rest[i];
    if (quoted && c == '\\') {
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ';' && !quoted) {
      const auto p = rest.substr(0, i);
      rest.remove_prefix(i + 1);
      return trim_ows(p);
    }
  }
  const auto p = rest;
  rest = {};
  return trim_ows(p);
}

// "name=value" or name="value" → the value without its quotes, if the
// parameter is `name` (case-insensitive). Escapes inside quotes are kept as written.
bool param_value(std::string_view param, std::string_view name, std::string_view& value) {
  const auto eq = param.find('=');
  if (eq == std::string_view::npos || !iequals(trim_ows(param.substr(0, eq)), name)) return false;
  auto v = trim_ows(param.substr(eq + 1));
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
  value = v;
  return true;
}

// True when the parameter's name is `prefix` then '*' and anything (RFC 2231:
// name*, name*0, name*0*, ...: Python's email.message.get_params(), which
// Starlette's python-multipart reads Content-Disposition with, joins those
// into `name`).
bool starred(std::string_view param, std::string_view prefix) {
  const auto key = trim_ows(param.substr(0, param.find('=')));
  return key.size() > prefix.size() && key[prefix.size()] == '*' && iequals(key.substr(0, prefix.size()), prefix);
}

// RFC 9110 §5.6.2 token characters.
bool token(std::string_view s) {
  if (s.empty()) return false;
  for (const char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) ||
          std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos))
      return false;
  return true;
}

// A Content-Disposition parameter both Weir and Python's email parser read
// alike (python-multipart, vLLM's form parser, splits parameters with
// email.message's rules: a \" outside quotes is no quote there, "<v>" and
// <v> lose their brackets, a bare `name` is a name with an empty value):
// `token=token` or `token="text"`, the text without quote or backslash.
bool plain_param(std::string_view p) {
  const auto eq = p.find('=');
  if (eq == std::string_view::npos || !token(trim_ows(p.substr(0, eq)))) return false;
  const auto v = trim_ows(p.substr(eq + 1));
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"')
    return v.substr(1, v.size() - 2).find_first_of("\"\\") == std::string_view::npos;
  return token(v);
}

// The next line of a part head, without its CRLF.
enum class Line : std::uint8_t { ok, none, bare };
Line next_line(std::string_view& s, std::string_view& line) {
  const auto lf = s.find('\n');
  if (lf == std::string_view::npos) return Line::none;
  line = s.substr(0, lf);
  // RFC 2046 ends lines with CRLF. python-multipart (vLLM's form parser)
  // ends a header line only there and keeps a bare LF or CR in the value,
  // where a second name="..." would be a field Weir never saw: refused.
  if (line.empty() || line.back() != '\r') return Line::bare;
  line.remove_suffix(1);
  if (line.find('\r') != std::string_view::npos) return Line::bare;
  s.remove_prefix(lf + 1);
  return Line::ok;
}

}  // namespace

tl::expected<std::string_view, std::string> form_boundary(std::string_view content_type) {
  std::string_view rest = content_type;
  if (!iequals(next_param(rest), "multipart/form-data"))
    return tl::unexpected(
        std::string("The request body must be multipart/form-data (Content-Type: "
                    "multipart/form-data; boundary=...)."));
  // Two boundary parameters would let Weir read one form and the upstream
  // (whose parser keeps the last) another: refused.
  std::string_view found;
  int count = 0;
  while (!rest.empty()) {
    std::string_view b;
    if (!param_value(next_param(rest), "boundary", b)) continue;
    if (b.empty() || b.size() > 70 || b.find_first_of("\\\"\r\n") != std::string_view::npos)
      return tl::unexpected(std::string("The multipart boundary must be 1 to 70 characters (RFC 2046)."));
    found = b;
    ++count;
  }
  if (count > 1)
    return tl::unexpected(std::string("The multipart/form-data Content-Type has more than one boundary parameter."));
  if (count == 0) return tl::unexpected(std::string("The multipart/form-data Content-Type has no boundary parameter."));
  return found;
}

tl::expected<std::vector<FormPart>, std::string> parse_form(std::string_view body, std::string_view boundary,
                                                            std::size_t max_parts) {
  std::string delim = "\r\n--";
  delim += boundary;
  // The first delimiter may open the body (no preamble) or follow a preamble's CRLF.
  std::size_t pos = 0;
  if (body.substr(0, delim.size() - 2) == std::string_view(delim).substr(2)) {
    pos = delim.size() - 2;
  } else {
    pos = body.find(delim);
    if (pos == std::string_view::npos)
      return tl::unexpected(std::string("The multipart body does not contain its boundary."));
    pos += delim.size();
  }
  std::vector<FormPart> parts;
  for (;;) {
    // After a delimiter: "--" closes the body; else transport padding and a line end.
    std::string_view rest = body.substr(pos);
    if (rest.starts_with("--")) return parts;
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    if (rest.starts_with("\r\n"))
      rest.remove_prefix(2);
    else
      return tl::unexpected(std::string("The multipart body is malformed after a boundary."));
    if (parts.size() == max_parts)
      return tl::unexpected("The multipart body has more than " + std::to_string(max_parts) + " parts.");

    FormPart part;
    bool disposition = false;
    std::string_view line;
    for (;;) {
      const Line got = next_line(rest, line);
      if (got == Line::none) return tl::unexpected(std::string("A multipart part has no end to its header lines."));
      if (got == Line::bare)
        return tl::unexpected(std::string("A multipart part's header line does not end in CRLF (RFC 2046)."));
      if (line.empty()) break;
      const auto colon = line.find(':');
      if (colon == std::string_view::npos)
        return tl::unexpected(std::string("A multipart part has a header line without a colon."));
      const auto name = trim_ows(line.substr(0, colon));
      auto value = trim_ows(line.substr(colon + 1));
      if (iequals(name, "content-type")) {
        part.content_type = value;
      } else if (iequals(name, "content-disposition")) {
        // Every way a part could name itself twice, or in a spelling Weir
        // does not decode, is refused: the upstream must read the fields
        // Weir routed and authorized by, not others.
        if (disposition)
          return tl::unexpected(std::string("A multipart part has more than one Content-Disposition header."));
        if (value.find('\\') != std::string_view::npos)
          return tl::unexpected(std::string(
              "A multipart part's Content-Disposition holds a backslash: the upstream's parser would split its "
              "parameters differently."));
        if (!iequals(next_param(value), "form-data"))
          return tl::unexpected(std::string("A multipart part's Content-Disposition is not form-data."));
        disposition = true;
        bool named = false;
        while (!value.empty()) {
          const auto p = next_param(value);
          if (p.empty()) continue;  // (";;": no parameter, for Python's parser too)
          if (!plain_param(p))
            return tl::unexpected(fmt::format(
                "A multipart part's Content-Disposition parameter '{}' is not token=token or token=\"text\".",
                utf8_prefix(p, 64)));
          std::string_view v;
          if (param_value(p, "name", v)) {
            if (named) return tl::unexpected(std::string("A multipart part has more than one name parameter."));
            named = true;
            part.name = v;
          } else if (starred(p, "name")) {
            return tl::unexpected(
                std::string("A multipart part's name must be a plain name= parameter (RFC 7578 4.2: no name*)."));
          } else if (param_value(p, "filename", v) || starred(p, "filename")) {
            // filename* (RFC 5987's charset'lang'value) and its RFC 2231 pieces (filename*0, ...) make it a file
            // too, as for Python's email parser; the value is not read: Weir only needs to know it is a file.
            if (!part.has_filename || part.filename.empty()) part.filename = v;
            part.has_filename = true;
          }
        }
      }
    }
    if (!disposition)
      return tl::unexpected(std::string("A multipart part has no Content-Disposition: form-data header."));
    const std::size_t start = body.size() - rest.size();
    const std::size_t end = body.find(delim, start);
    if (end == std::string_view::npos)
      return tl::unexpected(std::string("The multipart body ends before its closing boundary."));
    part.value = body.substr(start, end - start);
    parts.push_back(part);
    pos = end + delim.size();
  }
}

const FormPart* find_part(const std::vector<FormPart>& parts, std::string_view name) {
  for (const auto& p : parts)
    if (p.name == name) return &p;
  return nullptr;
}

void replace_part_value(std::string_view body, const FormPart& part, std::string_view value, std::string& out) {
  const auto begin = static_cast<std::size_t>(part.value.data() - body.data());
  out.clear();
  out.reserve(body.size() - part.value.size() + value.size());
  out.append(body.substr(0, begin));
  out.append(value);
  out.append(body.substr(begin + part.value.size()));
}

void append_form_field(std::string_view body, std::string_view boundary, const FormPart& last, std::string_view name,
                       std::string_view value, std::string& out) {
  const auto end = static_cast<std::size_t>(last.value.data() + last.value.size() - body.data());
  out.clear();
  out.reserve(body.size() + boundary.size() + name.size() + value.size() + 48);
  out.append(body.substr(0, end));
  out.append("\r\n--");
  out.append(boundary);
  out.append("\r\nContent-Disposition: form-data; name=\"");
  out.append(name);
  out.append("\"\r\n\r\n");
  out.append(value);
  out.append(body.substr(end));  // "\r\n--boundary--" and the epilogue
}

}  // namespace weir::core
