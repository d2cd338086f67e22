#include "core/multipart.hpp"

#include <algorithm>
#include <cstdint>

#include "core/text.hpp"

namespace weir::core {

namespace {

// RFC 9110 §5.6.2 tchar.
bool tchar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

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

// Content-Disposition's parameters as vLLM's form parser reads them:
// python-multipart's parse_options_header, through Python's
// email.message.Message.get_params() (_parseparam, decode_params,
// email.utils.unquote), emulated byte for byte so that Weir routes and
// authorizes by the very field name the upstream will read.

// str.strip()'s whitespace, for a header decoded as Latin-1.
bool py_space(char ch) {
  const auto c = static_cast<unsigned char>(ch);
  return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c == 0x85 || c == 0xa0;
}
std::string_view py_strip(std::string_view s) {
  while (!s.empty() && py_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && py_space(s.back())) s.remove_suffix(1);
  return s;
}
std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  std::string out;
  std::size_t at = 0;
  for (std::size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size()) {
    out.append(s, at, hit - at);
    out.append(to);
  }
  out.append(s, at);
  return out;
}
// email.utils.unquote: "..." loses its quotes (then \\ → \, then \" → "), <...> its brackets.
std::string py_unquote(std::string_view s) {
  if (s.size() > 1 && s.front() == '"' && s.back() == '"')
    return replace_all(replace_all(std::string(s.substr(1, s.size() - 2)), "\\\\", "\\"), "\\\"", "\"");
  if (s.size() > 1 && s.front() == '<' && s.back() == '>') return std::string(s.substr(1, s.size() - 2));
  return std::string(s);
}
// email.utils.quote: \ → \\, then " → \".
std::string py_quote(std::string_view s) {
  return replace_all(replace_all(std::string(s), "\\", "\\\\"), "\"", "\\\"");
}

struct PyParam {
  std::string key;  // lowercased when the parameter has a value, as _parseparam does
  std::string value;
};
// More parameters than this in one header is refused: no form needs them, and each is a copy of its text.
constexpr std::size_t kMaxParams = 32;

// str.strip(" \t"), as python-multipart 0.0.30 and later strip a parameter.
std::string_view strip_sp_tab(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// How python-multipart reads a header's parameters: before 0.0.30 through Python's email package (whitespace
// str.strip()s, email.utils.unquote: <...> loses its brackets, RFC 2231 name* joined into name); since 0.0.30
// (its PR #291) with its own copy of _parseparam (" \t" stripped, only quotes removed, any key with a '*'
// ignored).
enum class PyReading : std::uint8_t { email, since_0_30 };

// The parameters after the first (the disposition type, returned in `type`), in `out`, as `reading` has
// them. False when the header has more than kMaxParams. One pass: linear in the header's length.
bool python_params(std::string_view header, std::string_view& type, std::vector<PyParam>& out,
                   PyReading reading = PyReading::email) {
  const auto strip = [&](std::string_view v) { return reading == PyReading::email ? py_strip(v) : strip_sp_tab(v); };
  out.clear();
  std::string_view s = header;
  bool first = true;
  for (;;) {
    // A ';' ends the parameter unless an odd number of quotes (not counting \") precede it in the
    // parameter: the count runs once over the parameter, up to each ';' in turn.
    std::size_t counted = 0, quotes = 0, escaped = 0;
    const auto odd = [&](std::size_t end) {
      for (; counted < end; ++counted)
        if (s[counted] == '"') {
          ++quotes;
          if (counted > 0 && s[counted - 1] == '\\') ++escaped;
        }
      return (quotes - escaped) % 2 != 0;
    };
    std::size_t end = s.find(';');
    while (end != std::string_view::npos && end > 0 && odd(end)) end = s.find(';', end + 1);
    const std::string_view f = end == std::string_view::npos ? s : s.substr(0, end);
    if (first) {
      type = strip(f);
      first = false;
    } else if (out.size() == kMaxParams) {
      return false;
    } else if (const auto eq = f.find('='); eq != std::string_view::npos) {
      std::string key(strip(f.substr(0, eq)));
      for (auto& c : key)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      const std::string_view v = strip(f.substr(eq + 1));
      if (reading == PyReading::email) {
        // decode_params unquotes, quotes and get_params unquotes again.
        out.push_back({std::move(key), py_unquote("\"" + py_quote(py_unquote(v)) + "\"")});
      } else if (key.find('*') == std::string::npos) {
        // Quotes only: "..." loses them, then \\ → \, then \" → ".
        out.push_back(
            {std::move(key),
             v.size() >= 2 && v.front() == '"' && v.back() == '"'
                 ? replace_all(replace_all(std::string(v.substr(1, v.size() - 2)), "\\\\", "\\"), "\\\"", "\"")
                 : std::string(v)});
      }
    } else {
      out.push_back({std::string(strip(f)), std::string()});  // a bare attribute: its name, no value
    }
    if (end == std::string_view::npos) break;
    s.remove_prefix(end + 1);
  }
  return true;
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
  // The upstream's form parser (Starlette, through python-multipart's
  // parse_options_header) splits the parameters its own way (a ';' ends one
  // unless an odd count of unescaped quotes precedes it) and decodes the
  // parts' names and values by the `charset` parameter. A header it reads
  // another boundary from, or a charset that is not UTF-8 (or ASCII, its
  // subset), would give it a form Weir never read: refused.
  // Both readings of python-multipart (PyReading: before 0.0.30 and since) must find that one boundary.
  std::string_view type;
  std::vector<PyParam> params;
  for (const PyReading reading : {PyReading::email, PyReading::since_0_30}) {
    int py_count = 0;
    bool same = true;
    std::string_view charset;
    if (!python_params(content_type, type, params, reading))
      return tl::unexpected("The multipart/form-data Content-Type has more than " + std::to_string(kMaxParams) +
                            " parameters.");
    for (const auto& p : params) {
      if (p.key == "boundary") {
        ++py_count;
        same = p.value == found;
      } else if (p.key == "charset") {
        charset = p.value;
      } else if (p.key.starts_with("boundary*") || p.key.starts_with("charset*")) {
        // RFC 2231's boundary*, boundary*0, charset*...: Python's decode_params
        // joins them into `boundary` / `charset` (the last wins there), a value
        // Weir's reading never sees.
        return tl::unexpected(
            std::string("The multipart/form-data Content-Type's boundary and charset must be plain parameters "
                        "(no RFC 2231 boundary* or charset*)."));
      }
    }
    if (py_count != 1 || !same)
      return tl::unexpected(
          std::string("The multipart/form-data Content-Type's parameters are ambiguous (quotes or "
                      "escapes that parsers split differently)."));
    if (!charset.empty() && !iequals(charset, "utf-8") && !iequals(charset, "utf8") && !iequals(charset, "us-ascii") &&
        !iequals(charset, "ascii"))
      return tl::unexpected(std::string("The multipart/form-data charset must be UTF-8."));
  }
  return found;
}

tl::expected<std::vector<FormPart>, std::string> parse_form(std::string_view body, std::string_view boundary,
                                                            std::size_t max_parts) {
  std::string delim = "\r\n--";
  delim += boundary;
  // The first delimiter opens the body, after any CR and LF bytes: python-multipart (vLLM's form parser)
  // skips those and reads no other preamble. RFC 2046 allows one, but a preamble Weir skipped to a
  // delimiter after it is where the upstream would read parts (a prompt, stream=true) Weir never saw:
  // refused, as is a body that does not begin with its delimiter at all.
  std::size_t pos = body.find_first_not_of("\r\n");
  if (pos == std::string_view::npos) pos = body.size();
  if (body.substr(pos, delim.size() - 2) != std::string_view(delim).substr(2))
    return tl::unexpected(std::string(body.find(std::string_view(delim).substr(2)) == std::string_view::npos
                                          ? "The multipart body does not contain its boundary."
                                          : "The multipart body must begin with its boundary (no preamble)."));
  pos += delim.size() - 2;
  std::vector<FormPart> parts;
  for (;;) {
    // After a delimiter: "--" closes the body; else a line end. (RFC 2046's
    // transport padding, spaces before it, is refused: python-multipart, the
    // upstream's parser, reads no delimiter there and goes on with the part,
    // which would then hold what Weir read as the next parts.)
    std::string_view rest = body.substr(pos);
    if (rest.starts_with("--")) return parts;
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
      // A header name is a token (RFC 9110 §5.6.2): python-multipart since 0.0.30 refuses a body with any
      // other byte there (a space before the colon), earlier versions read the line: refused.
      const auto name = line.substr(0, colon);
      if (name.empty() || !std::all_of(name.begin(), name.end(), tchar))
        return tl::unexpected(
            std::string("A multipart part's header name must be a token (RFC 9110 5.6.2: no space before the colon)."));
      auto value = trim_ows(line.substr(colon + 1));
      if (iequals(name, "content-type")) {
        part.content_type = value;
      } else if (iequals(name, "content-disposition")) {
        // Every way a part could name itself twice, or in a spelling Weir
        // does not decode, is refused: the upstream must read the fields
        // Weir routed and authorized by, not others.
        if (disposition)
          return tl::unexpected(std::string("A multipart part has more than one Content-Disposition header."));
        std::string_view type;
        std::vector<PyParam> params;
        if (!python_params(value, type, params))
          return tl::unexpected("A multipart part's Content-Disposition has more than " + std::to_string(kMaxParams) +
                                " parameters.");
        if (!iequals(type, "form-data"))
          return tl::unexpected(std::string("A multipart part's Content-Disposition is not form-data."));
        disposition = true;
        bool named = false;
        for (const auto& p : params) {
          if (p.key == "name") {
            if (named) return tl::unexpected(std::string("A multipart part has more than one name parameter."));
            named = true;
            part.name = p.value;
          } else if (p.key.starts_with("name*")) {
            // RFC 2231's name*, name*0, name*0*, ...: decode_params joins them into `name`.
            return tl::unexpected(
                std::string("A multipart part's name must be a plain name= parameter (RFC 7578 4.2: no name*)."));
          } else if (p.key == "filename" || p.key.starts_with("filename*")) {
            // filename* (RFC 5987) and its RFC 2231 pieces make it a file too; Weir only needs to know it is one.
            if (!part.has_filename || part.filename.empty()) part.filename = p.value;
            part.has_filename = true;
          }
        }
        // The name as python-multipart 0.0.30 and later read it: another one (a name in <...>, which only the
        // older versions unwrap; whitespace other than space and tab around it) is a field Weir cannot know
        // the upstream's reading of: refused.
        (void)python_params(value, type, params, PyReading::since_0_30);
        int names = 0;
        std::string_view newer;
        for (const auto& p : params)
          if (p.key == "name") {
            ++names;
            newer = p.value;
          }
        if (names > 1 || (names == 1) != named || (named && newer != part.name))
          return tl::unexpected(std::string(
              "A multipart part's name reads differently in python-multipart before 0.0.30 and since (a name "
              "in <...>, or whitespace other than spaces and tabs around a parameter): write it name=\"...\"."));
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
