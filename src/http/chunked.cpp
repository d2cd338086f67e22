#include "http/chunked.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include "core/text.hpp"
#include "http/response_source.hpp"

namespace weir::http {

namespace {

// RFC 9110 §5.6.2 tchar.
constexpr bool is_tchar(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

// HEXDIG's value by octet, 0xff for no hex digit: one load per digit of a size line.
constexpr std::array<std::uint8_t, 256> kHex = [] {
  std::array<std::uint8_t, 256> t{};
  for (auto& v : t) v = 0xff;
  for (int c = 0; c < 10; ++c) t['0' + c] = static_cast<std::uint8_t>(c);
  for (int c = 0; c < 6; ++c) t['a' + c] = t['A' + c] = static_cast<std::uint8_t>(10 + c);
  return t;
}();

// RFC 9110 §5.6.4: qdtext = HTAB / SP / %x21 / %x23-5B / %x5D-7E / obs-text.
constexpr bool is_qdtext(unsigned char c) {
  return c == '\t' || c == ' ' || c == 0x21 || (c >= 0x23 && c <= 0x5B) || (c >= 0x5D && c <= 0x7E) || c >= 0x80;
}

// quoted-pair's second octet: HTAB / SP / VCHAR / obs-text.
constexpr bool is_quotable(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7F); }

// A field value's octet (RFC 9110 §5.5): VCHAR, obs-text, SP, HTAB.
constexpr bool is_value_octet(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7F); }

// The end of a line at `i` of `in`: 2 when it is CRLF, 0 when `in` ends
// within it (a lone CR at the end), -1 when it is a bad line ending (a CR
// not followed by LF, or a bare LF).
int line_end(std::string_view in, std::size_t i) {
  if (in[i] == '\n') return -1;
  if (i + 1 >= in.size()) return 0;
  return in[i + 1] == '\n' ? 2 : -1;
}

// The trailer section's most bytes, as the head's.
constexpr std::size_t kMaxTrailers = kMaxResponseHead;

}  // namespace

// chunk      = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
// chunk-ext  = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )
// chunk-ext-val = token / quoted-string
// Parsed as it comes: a byte that cannot continue the line makes it bad at
// once (no wait for its CRLF); its end not yet in `in` returns 0.
std::size_t ChunkDecoder::size_line(std::string_view in) {
  const auto n = in.size();
  std::size_t i = 0;
  std::uint64_t size = 0;
  for (; i < n; ++i) {
    const std::uint8_t d = kHex[static_cast<unsigned char>(in[i])];
    if (d == 0xff) break;
    if (size > (std::numeric_limits<std::uint64_t>::max() >> 4)) {  // over 2^64 - 1
      state_ = State::bad;
      return 0;
    }
    size = (size << 4) | d;
  }
  if (i == n) return 0;  // (the digits may go on)
  if (i == 0) {
    state_ = State::bad;
    return 0;
  }
  if (in[i] == '\r' && i + 1 < n && in[i + 1] == '\n') {  // no extension: every server's line
    i += 2;
  } else if (!extensions(in, i)) {
    return 0;  // (incomplete, or state_ = bad)
  }
  if (size == 0) {
    state_ = State::trailers;
  } else {
    left_ = size;
    state_ = State::data;
  }
  return i;
}

bool ChunkDecoder::extensions(std::string_view in, std::size_t& i) {
  const auto n = in.size();
  auto bad = [&] {
    state_ = State::bad;
    return false;
  };
  auto skip_bws = [&] {
    while (i < n && (in[i] == ' ' || in[i] == '\t')) ++i;
  };
  auto skip_token = [&] {
    const std::size_t from = i;
    while (i < n && is_tchar(static_cast<unsigned char>(in[i]))) ++i;
    return i > from;
  };
  for (;;) {
    skip_bws();
    if (i == n) return false;
    if (in[i] == '\r' || in[i] == '\n') {
      // The line ends here, unless BWS came before it (no extension after it).
      if (i > 0 && (in[i - 1] == ' ' || in[i - 1] == '\t')) return bad();
      const int e = line_end(in, i);
      if (e < 0) return bad();
      if (e == 0) return false;
      i += 2;
      return true;
    }
    if (in[i] != ';') return bad();
    ++i;
    skip_bws();
    if (i == n) return false;
    if (!skip_token()) return bad();
    if (i == n) return false;
    const std::size_t before_bws = i;
    skip_bws();
    if (i == n) return false;
    if (in[i] != '=') {
      i = before_bws;  // (BWS then ';' or the line's end: the loop's top judges it)
      continue;
    }
    ++i;
    skip_bws();
    if (i == n) return false;
    if (in[i] == '"') {
      for (++i;; ++i) {
        if (i == n) return false;
        const auto c = static_cast<unsigned char>(in[i]);
        if (c == '"') break;
        if (c == '\\') {
          if (++i == n) return false;
          if (!is_quotable(static_cast<unsigned char>(in[i]))) return bad();
        } else if (!is_qdtext(c)) {
          return bad();
        }
      }
      ++i;
    } else if (!skip_token()) {
      return bad();
    }
  }
}

// trailer-section = *( field-line CRLF ), then CRLF. Each whole field line
// is taken (and dropped) as it comes; the section's bytes are bounded.
std::size_t ChunkDecoder::trailer_section(std::string_view in) {
  std::size_t i = 0;
  for (;;) {
    if (i == in.size()) return i;
    if (in[i] == '\r' || in[i] == '\n') {  // the empty line: the end
      const int e = line_end(in, i);
      if (e < 0) {
        state_ = State::bad;
        return 0;
      }
      if (e == 0) return i;
      state_ = State::done;
      return i + 2;
    }
    // field-line = field-name ":" OWS field-value OWS. A line that begins with SP or HTAB (obs-fold) is no
    // field name either.
    std::size_t j = i;
    while (j < in.size() && is_tchar(static_cast<unsigned char>(in[j]))) ++j;
    if (j == in.size()) return i;
    if (j == i || in[j] != ':') {
      state_ = State::bad;
      return 0;
    }
    for (++j; j < in.size() && in[j] != '\r' && in[j] != '\n'; ++j) {
      if (!is_value_octet(static_cast<unsigned char>(in[j]))) {
        state_ = State::bad;
        return 0;
      }
    }
    if (j == in.size()) return i;
    const int e = line_end(in, j);
    if (e < 0) {
      state_ = State::bad;
      return 0;
    }
    if (e == 0) return i;
    trailer_bytes_ += j + 2 - i;
    if (trailer_bytes_ > kMaxTrailers || !trailer_field(in.substr(i, j - i))) {
      state_ = State::bad;
      return 0;
    }
    i = j + 2;
  }
}

// What Beast's parser judged in a trailer field beyond its syntax (basic_parser::do_field): a framing field
// (Content-Length, Transfer-Encoding) is refused, and a Connection field's list must read; its `close` is kept.
bool ChunkDecoder::trailer_field(std::string_view line) {
  const std::size_t colon = line.find(':');
  const std::string_view name = line.substr(0, colon);
  if (core::iequals(name, "content-length") || core::iequals(name, "transfer-encoding")) return false;
  if (!core::iequals(name, "connection")) return true;
  for (std::string_view list = line.substr(colon + 1); !list.empty();) {
    const auto comma = list.find(',');
    const std::string_view option = core::trim_ows(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    for (const char c : option)
      if (!is_tchar(static_cast<unsigned char>(c))) return false;
    if (core::iequals(option, "close")) close_ = true;
  }
  return true;
}

ChunkDecoder::Result ChunkDecoder::decode(std::string_view in, std::span<char> out) {
  Result r;
  for (;;) {
    const std::string_view rest = in.substr(r.used);
    switch (state_) {
      case State::data: {
        const std::size_t n =
            static_cast<std::size_t>(std::min<std::uint64_t>(left_, std::min(rest.size(), out.size() - r.out)));
        if (n == 0) return r;  // (`in` used up, or `out` full)
        std::memcpy(out.data() + r.out, rest.data(), n);
        r.used += n;
        r.out += n;
        left_ -= n;
        if (left_ == 0) state_ = State::data_crlf;
        continue;
      }
      case State::data_crlf:
        if (rest.size() < 2) {
          if (rest.empty()) return r;
          if (rest[0] != '\r') break;
          r.status = Status::need_more;
          return r;
        }
        if (rest[0] != '\r' || rest[1] != '\n') break;
        r.used += 2;
        state_ = State::size_line;
        continue;
      case State::size_line: {
        if (rest.empty()) return r;
        const std::size_t n = size_line(rest);
        if (state_ == State::bad) break;
        if (n == 0) {
          r.status = Status::need_more;
          return r;
        }
        r.used += n;
        continue;
      }
      case State::trailers: {
        const std::size_t n = trailer_section(rest);
        if (state_ == State::bad) break;
        r.used += n;
        if (state_ == State::done) continue;
        // Incomplete: a line that has begun waits for the rest of it.
        if (trailer_bytes_ + (rest.size() - n) > kMaxTrailers) {
          state_ = State::bad;
          break;
        }
        if (n < rest.size()) r.status = Status::need_more;
        return r;
      }
      case State::done:
        r.status = Status::done;
        return r;
      case State::bad:
        break;
    }
    state_ = State::bad;
    r.status = Status::bad;
    return r;
  }
}

}  // namespace weir::http
