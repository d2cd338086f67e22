#include "http/request_check.hpp"

#include <array>

#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>

#include "http/headers.hpp"

namespace weir::http {

namespace bh = boost::beast::http;

namespace {

bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) { return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }
// unreserved / sub-delims (RFC 3986 §2.2, §2.3): a reg-name's characters but pct-encoded.
// reg-name's characters but pct-encoded (RFC 3986 §3.2.2): unreserved and
// sub-delims. A table: the Host of every request is checked byte by byte.
constexpr auto kRegChar = [] {
  std::array<bool, 256> t{};
  for (int c = 'a'; c <= 'z'; ++c) t[c] = t[c - 'a' + 'A'] = true;
  for (int c = '0'; c <= '9'; ++c) t[c] = true;
  for (const char c : std::string_view("-._~!$&'()*+,;=")) t[static_cast<unsigned char>(c)] = true;
  return t;
}();

bool is_reg_char(unsigned char c) { return kRegChar[c]; }

// Walks a comma-separated list of transfer codings (RFC 9110 §5.6.1: empty
// elements and OWS allowed; a coding may carry ";param" parts).
struct CodingScan {
  unsigned codings = 0;  // codings seen
  unsigned chunked = 0;  // of which chunked
  bool last_chunked = false;
  bool chunked_params = false;  // a chunked with ";..." (RFC 9112 §7.1: it defines no parameters)
  bool empty = true;            // no coding at all

  void add(std::string_view list) {
    std::size_t i = 0;
    while (i <= list.size()) {
      std::size_t comma = list.find(',', i);
      if (comma == std::string_view::npos) comma = list.size();
      std::string_view item = core::trim_ows(list.substr(i, comma - i));
      const auto semi = item.find(';');
      if (semi != std::string_view::npos) item = core::trim_ows(item.substr(0, semi));
      if (!item.empty()) {
        empty = false;
        ++codings;
        last_chunked = iequals(item, "chunked");
        if (last_chunked) ++chunked;
        if (last_chunked && semi != std::string_view::npos) chunked_params = true;
      }
      i = comma + 1;
    }
  }
};

// The length of an absolute-form target's "http://" or "https://" (any
// case, RFC 9110 §4.2), or 0.
std::size_t scheme_len(std::string_view t) {
  if (t.size() >= 7 && iequals(t.substr(0, 7), "http://")) return 7;
  if (t.size() >= 8 && iequals(t.substr(0, 8), "https://")) return 8;
  return 0;
}

}  // namespace

bool valid_host(std::string_view v) {
  std::size_t i = 0;
  if (!v.empty() && v[0] == '[') {
    // IP-literal: IPv6address or IPvFuture; checked for its characters only.
    const auto close = v.find(']');
    if (close == std::string_view::npos || close == 1) return false;
    for (std::size_t k = 1; k < close; ++k) {
      const auto c = static_cast<unsigned char>(v[k]);
      if (!(is_reg_char(c) || c == ':')) return false;
    }
    i = close + 1;
  } else {
    for (; i < v.size() && v[i] != ':'; ++i) {
      const auto c = static_cast<unsigned char>(v[i]);
      if (c == '%') {
        if (i + 2 >= v.size() || !is_hex(static_cast<unsigned char>(v[i + 1])) ||
            !is_hex(static_cast<unsigned char>(v[i + 2])))
          return false;
        i += 2;
      } else if (!is_reg_char(c)) {
        return false;
      }
    }
  }
  if (i == v.size()) return true;
  if (v[i] != ':') return false;
  for (++i; i < v.size(); ++i)
    if (!is_digit(static_cast<unsigned char>(v[i]))) return false;
  return true;
}

std::string_view origin_form(std::string_view target, std::string& scratch) {
  if (!target.empty() && target[0] == '/') return target;
  const std::size_t scheme = scheme_len(target);
  if (scheme == 0) return {};
  const std::size_t end = target.find_first_of("/?#", scheme);
  // The authority is a host (and port): an empty host is invalid (RFC 9110
  // §4.2.1: MUST be rejected), userinfo is an error (§4.2.4), and the rest
  // is checked as a Host field's value is.
  const std::string_view authority = target.substr(scheme, end == std::string_view::npos ? target.npos : end - scheme);
  if (authority.empty() || authority[0] == ':' || authority.find('@') != std::string_view::npos ||
      !valid_host(authority))
    return {};
  if (end == std::string_view::npos) return "/";
  if (target[end] == '/') return target.substr(end);
  if (target[end] == '#') return {};  // a fragment is no part of a request target (RFC 9112 §3.2)
  scratch.assign("/");
  scratch.append(target.substr(end));
  return scratch;
}

namespace {
// Expect = #expectation (RFC 9110 §10.1.1), empty members skipped:
// 100-continue is the one HTTP defines. Counts the members of `v` that are
// 100-continue (`continues`) and the others (`unknown`).
struct ExpectScan {
  unsigned continues = 0;
  unsigned unknown = 0;
  void add(std::string_view v) {
    while (!v.empty()) {
      const auto comma = v.find(',');
      const std::string_view member = core::trim_ows(v.substr(0, comma));
      if (!member.empty()) ++(iequals(member, "100-continue") ? continues : unknown);
      if (comma == std::string_view::npos) break;
      v.remove_prefix(comma + 1);
    }
  }
};
}  // namespace

bool begins_head_request(std::string_view unparsed) {
  const std::size_t line = unparsed.find_first_not_of("\r\n");
  return line != std::string_view::npos && unparsed.substr(line).starts_with("HEAD ");
}

bool begins_proxy_protocol(std::string_view unparsed) {
  if (unparsed.starts_with("PROXY ")) return true;
  // v2: \r\n\r\n\0\r\nQUIT\n (its leading CRLFs may have been taken as empty lines before a request).
  static constexpr std::string_view kV2{"\r\n\r\n\0\r\nQUIT\n", 12};
  const std::size_t line = unparsed.find_first_not_of("\r\n");
  if (line == std::string_view::npos) return false;
  return unparsed.substr(line).starts_with(kV2.substr(4)) || unparsed.starts_with(kV2);
}

namespace {

// The HTTP-version at the end of `unparsed`'s first line (empty lines before
// it skipped): its last SP-separated token, as a view into `unparsed`; empty
// when it is not exactly "HTTP/" DIGIT "." DIGIT (RFC 9112 §2.3).
std::string_view sent_version(std::string_view unparsed) {
  const std::size_t from = unparsed.find_first_not_of("\r\n");
  if (from == std::string_view::npos) return {};
  std::string_view line = unparsed.substr(from);
  line = line.substr(0, line.find_first_of("\r\n"));
  const std::size_t sp = line.rfind(' ');
  if (sp == std::string_view::npos) return {};
  const std::string_view version = line.substr(sp + 1);
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (version.size() != 8 || !version.starts_with("HTTP/") || !digit(version[5]) || version[6] != '.' ||
      !digit(version[7]))
    return {};
  return version;
}

}  // namespace

char sent_major_version(std::string_view unparsed) {
  const std::string_view version = sent_version(unparsed);
  return version.empty() ? 0 : version[5];
}

bool take_higher_minor_as_11(std::span<char> unparsed) {
  const std::string_view all(unparsed.data(), unparsed.size());
  const std::string_view version = sent_version(all);
  if (version.empty() || version[5] != '1' || version[7] < '2') return false;
  unparsed[static_cast<std::size_t>(version.data() - all.data()) + 7] = '1';
  return true;
}

bool request_line_over(bool line_parsed, std::string_view unparsed, std::size_t limit) {
  // (A parsed line fitted: Beast parses it within the limit only.)
  return !line_parsed && unparsed.substr(0, limit).find("\r\n") == std::string_view::npos;
}

bool expects_continue(const RequestHead& req) {
  if (req.version() < 11) return false;
  ExpectScan scan;
  for (const auto& f : req)
    if (f.name() == bh::field::expect) scan.add(f.value());
  return scan.continues > 0;
}

HeadProblem check_request_head(const RequestHead& req) {
  unsigned hosts = 0;
  std::string_view host;
  bool te = false;
  bool cl = false;
  CodingScan codings;
  ExpectScan expect;
  for (const auto& f : req) {
    switch (f.name()) {
      case bh::field::host:
        ++hosts;
        host = f.value();
        break;
      case bh::field::transfer_encoding:
        te = true;
        codings.add(f.value());
        break;
      case bh::field::content_length:
        // (Beast took only lists of equal values, on one line or several.)
        if (cl || f.value().find(',') != std::string_view::npos) return HeadProblem::bad_framing;
        cl = true;
        break;
      case bh::field::expect:
        expect.add(f.value());
        break;
      default:
        break;
    }
  }
  if (te) {
    // RFC 9112 §6.1: a server MAY treat an HTTP/1.0 request with
    // Transfer-Encoding as faulty framing; §6.3: with Content-Length it is
    // a smuggling attempt; chunked must come last and once; §7.1: chunked
    // defines no parameters, and their presence is treated as an error.
    if (req.version() < 11 || cl || codings.empty || !codings.last_chunked || codings.chunked != 1 ||
        codings.chunked_params)
      return HeadProblem::bad_framing;
    if (codings.codings > 1) return HeadProblem::unsupported_coding;
  }
  if (req.version() >= 11 && (hosts != 1 || !valid_host(core::trim_ows(host)))) return HeadProblem::bad_host;
  // HTTP/1.0 may leave Host out; one it sends is checked as 1.1's (a Host the admin listener's allow list
  // compares must be a host, not `localhost:1@elsewhere`).
  if (req.version() < 11 && (hosts > 1 || (hosts == 1 && !valid_host(core::trim_ows(host)))))
    return HeadProblem::bad_host;
  const std::string_view t = req.target();
  std::string scratch;  // (an absolute-form target's authority is checked: origin_form)
  if (t.empty() || (t[0] != '/' && (scheme_len(t) == 0 || origin_form(t, scratch).empty())) ||
      t.find('#') != std::string_view::npos)
    return HeadProblem::bad_target;
  if (expect.unknown > 0) return HeadProblem::unsupported_expectation;
  return HeadProblem::none;
}

void ChunkExtCheck::operator()(std::uint64_t, std::string_view ext, boost::system::error_code& ec) {
  if (ext.size() > left) {
    over = true;
    ec = boost::beast::http::error::bad_chunk_extension;
    return;
  }
  left -= ext.size();
  for (const char ch : ext) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      ec = boost::beast::http::error::bad_chunk_extension;
      return;
    }
  }
}

}  // namespace weir::http
