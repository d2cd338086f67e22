#include "tracing/context.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace weir::tracing {

namespace {

int lower_hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // uppercase is invalid in traceparent (§3.2.2)
}

template <std::size_t N>
bool read_hex(std::string_view s, std::array<std::uint8_t, N>& out) {
  if (s.size() != 2 * N) return false;
  for (std::size_t i = 0; i < N; ++i) {
    const int hi = lower_hex(s[2 * i]), lo = lower_hex(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool lcalpha(char c) { return c >= 'a' && c <= 'z'; }
bool digit(char c) { return c >= '0' && c <= '9'; }
bool key_char(char c) { return lcalpha(c) || digit(c) || c == '_' || c == '-' || c == '*' || c == '/'; }

// §3.3.1.3.1: simple-key = lcalpha 0*255(key chars);
// multi-tenant-key = tenant-id "@" system-id, tenant-id = (lcalpha / DIGIT) 0*240(key chars),
// system-id = lcalpha 0*13(key chars).
bool valid_key(std::string_view k) {
  const auto at = k.find('@');
  auto rest_ok = [](std::string_view s) { return std::all_of(s.begin(), s.end(), key_char); };
  if (at == std::string_view::npos) return !k.empty() && k.size() <= 256 && lcalpha(k[0]) && rest_ok(k.substr(1));
  const std::string_view tenant = k.substr(0, at), system = k.substr(at + 1);
  return !tenant.empty() && tenant.size() <= 241 && (lcalpha(tenant[0]) || digit(tenant[0])) &&
         rest_ok(tenant.substr(1)) && !system.empty() && system.size() <= 14 && lcalpha(system[0]) &&
         rest_ok(system.substr(1));
}

// §3.3.1.3.2: value = 0*255(chr) nblk-chr; chr = %x20 / nblk-chr;
// nblk-chr = %x21-2B / %x2D-3C / %x3E-7E.
bool valid_value(std::string_view v) {
  if (v.empty() || v.size() > 256 || v.back() == ' ') return false;
  for (char c : v)
    if (c < 0x20 || c > 0x7E || c == ',' || c == '=') return false;
  return true;
}

}  // namespace

bool TraceId::valid() const noexcept {
  return std::any_of(b.begin(), b.end(), [](std::uint8_t x) { return x != 0; });
}
bool SpanId::valid() const noexcept {
  return std::any_of(b.begin(), b.end(), [](std::uint8_t x) { return x != 0; });
}

void append_hex(std::string& out, const std::uint8_t* p, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < n; ++i) {
    out += kHex[p[i] >> 4];
    out += kHex[p[i] & 0xF];
  }
}

std::optional<ParentContext> parse_traceparent(std::string_view value) {
  value = trim(value);
  if (value.size() < 55) return std::nullopt;
  std::array<std::uint8_t, 1> version{};
  if (!read_hex(value.substr(0, 2), version) || version[0] == 0xFF) return std::nullopt;
  // Version 00 is exactly 55 characters; a later version may append fields after a '-'.
  if (version[0] == 0 ? value.size() != 55 : value.size() > 55 && value[55] != '-') return std::nullopt;
  if (value[2] != '-' || value[35] != '-' || value[52] != '-') return std::nullopt;
  ParentContext p;
  std::array<std::uint8_t, 1> flags{};
  if (!read_hex(value.substr(3, 32), p.trace_id.b) || !read_hex(value.substr(36, 16), p.span_id.b) ||
      !read_hex(value.substr(53, 2), flags))
    return std::nullopt;
  if (!p.trace_id.valid() || !p.span_id.valid()) return std::nullopt;
  p.flags = flags[0];
  return p;
}

void format_traceparent(TraceparentText& out, const TraceId& t, const SpanId& s, bool sampled) {
  static constexpr char kHex[] = "0123456789abcdef";
  char* p = out.data();
  *p++ = '0';
  *p++ = '0';
  *p++ = '-';
  for (auto x : t.b) {
    *p++ = kHex[x >> 4];
    *p++ = kHex[x & 0xF];
  }
  *p++ = '-';
  for (auto x : s.b) {
    *p++ = kHex[x >> 4];
    *p++ = kHex[x & 0xF];
  }
  *p++ = '-';
  *p++ = '0';
  *p++ = sampled ? '1' : '0';
}

bool normalize_tracestate(std::string_view value, std::string& out, std::size_t max_bytes) {
  out.clear();
  // Members as views into `value`; a small fixed array (32 members at most) keeps this allocation-free.
  std::array<std::string_view, 32> members;
  std::size_t n = 0;
  while (true) {
    const auto comma = value.find(',');
    const std::string_view m = trim(value.substr(0, comma));
    if (!m.empty()) {
      const auto eq = m.find('=');
      if (eq == std::string_view::npos || !valid_key(m.substr(0, eq)) || !valid_value(m.substr(eq + 1))) return false;
      if (n == members.size()) return false;  // more than 32 members
      for (std::size_t i = 0; i < n; ++i)
        if (members[i].substr(0, members[i].find('=')) == m.substr(0, eq)) return false;  // a key twice
      members[n++] = m;
    }
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  auto total = [&] {
    std::size_t t = 0, k = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (!members[i].empty()) t += members[i].size() + (k++ ? 1 : 0);
    return t;
  };
  if (total() > max_bytes) {
    for (std::size_t i = 0; i < n && total() > max_bytes; ++i)
      if (members[i].size() > 128) members[i] = {};
    for (std::size_t i = n; i-- > 0 && total() > max_bytes;) members[i] = {};
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (members[i].empty()) continue;
    if (!out.empty()) out += ',';
    out += members[i];
  }
  return true;
}

IdGenerator::IdGenerator() {
  std::random_device rd;
  for (auto& s : s_) s = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  if (!(s_[0] | s_[1] | s_[2] | s_[3])) s_[0] = 1;
}

IdGenerator::IdGenerator(std::uint64_t seed) {
  // splitmix64 spreads one seed over the four words.
  for (auto& s : s_) {
    seed += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    s = z ^ (z >> 31);
  }
}

std::uint64_t IdGenerator::next() {
  // xoshiro256** (Blackman and Vigna, 2018).
  const auto rotl = [](std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

TraceId IdGenerator::trace_id() {
  TraceId t;
  do {
    const std::uint64_t a = next(), b = next();
    for (int i = 0; i < 8; ++i) {
      t.b[i] = static_cast<std::uint8_t>(a >> (56 - 8 * i));
      t.b[8 + i] = static_cast<std::uint8_t>(b >> (56 - 8 * i));
    }
  } while (!t.valid());
  return t;
}

SpanId IdGenerator::span_id() {
  SpanId s;
  do {
    const std::uint64_t a = next();
    for (int i = 0; i < 8; ++i) s.b[i] = static_cast<std::uint8_t>(a >> (56 - 8 * i));
  } while (!s.valid());
  return s;
}

Sampler::Sampler(double ratio) : ratio_(std::clamp(ratio, 0.0, 1.0)), threshold_(0), all_(ratio_ >= 1.0) {
  // ratio × 2^64, exact enough: the comparison below decides a fraction `ratio` of uniform ids.
  if (!all_) threshold_ = static_cast<std::uint64_t>(std::ldexp(ratio_, 64));
}

bool Sampler::root_sampled(const TraceId& t) const noexcept {
  if (all_) return true;
  std::uint64_t low = 0;
  for (int i = 8; i < 16; ++i) low = low << 8 | t.b[i];
  return low < threshold_;
}

}  // namespace weir::tracing
