#include "api/wide_integers.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <random>

#include <fmt/format.h>
#include <boost/json/value.hpp>

namespace weir::api {

namespace json = boost::json;

namespace {

// What Boost.JSON makes of a literal it cannot hold: an integer beyond
// int64/uint64 (an integral double of at least 2^63), or a number beyond a
// double's range (1e400: infinity, which it would write as no JSON number).
bool wide_double(double d) {
  return !std::isfinite(d) || (std::fabs(d) >= 9223372036854775808.0 && std::trunc(d) == d);
}

// True when the number literal `lit` is beyond a double's range (its
// magnitude overflows, or a nonzero one underflows to 0).
bool out_of_double_range(std::string_view lit) {
  double v = 0;
  const auto r = std::from_chars(lit.data(), lit.data() + lit.size(), v);
  return r.ec == std::errc::result_out_of_range;
}

// True when the integer literal `digits` (an optional '-' then decimal
// digits) does not fit int64 (negative) or uint64.
bool too_wide(std::string_view lit) {
  if (lit.starts_with('-')) {
    std::int64_t v = 0;
    const auto r = std::from_chars(lit.data(), lit.data() + lit.size(), v);
    return r.ec == std::errc::result_out_of_range;
  }
  std::uint64_t v = 0;
  const auto r = std::from_chars(lit.data(), lit.data() + lit.size(), v);
  return r.ec == std::errc::result_out_of_range;
}

bool digit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

bool has_wide_integer(const json::value& v) {
  std::vector<const json::value*> pending{&v};
  while (!pending.empty()) {
    const json::value* x = pending.back();
    pending.pop_back();
    if (x->is_double()) {
      if (wide_double(x->get_double())) return true;
    } else if (x->is_array()) {
      for (const auto& e : x->get_array()) pending.push_back(&e);
    } else if (x->is_object()) {
      for (const auto& kv : x->get_object()) pending.push_back(&kv.value());
    }
  }
  return false;
}

void WideIntegers::make_nonce() {
  // Unpredictable to the client, so no body can hold a token in advance.
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  nonce_ = fmt::format("wi{:016x}{:016x}_", rng(), rng());
}

std::string_view WideIntegers::protect(std::string_view json, std::string& storage) {
  storage.clear();
  std::size_t copied = 0;
  std::size_t i = 0;
  const std::size_t n = json.size();
  while (i < n) {
    const char c = json[i];
    if (c == '"') {  // skip the string
      ++i;
      while (i < n && json[i] != '"') i += json[i] == '\\' ? 2 : 1;
      ++i;
      continue;
    }
    if (c != '-' && !digit(c)) {
      ++i;
      continue;
    }
    // A number: [-] digits [. digits] [e [+-] digits]. Tokens: an integer
    // literal beyond 64 bits, and any beyond a double's range (1e400).
    const std::size_t start = i;
    if (json[i] == '-') ++i;
    while (i < n && digit(json[i])) ++i;
    const std::size_t int_end = i;
    bool integer = true;
    while (i < n &&
           (digit(json[i]) || json[i] == '.' || json[i] == 'e' || json[i] == 'E' || json[i] == '+' || json[i] == '-')) {
      integer = false;
      ++i;
    }
    const std::size_t end = integer ? int_end : i;
    if (integer ? !too_wide(json.substr(start, end - start)) : !out_of_double_range(json.substr(start, end - start)))
      continue;
    if (nonce_.empty()) make_nonce();
    storage.append(json.substr(copied, start - copied));
    storage += '"';
    storage += nonce_;
    fmt::format_to(std::back_inserter(storage), "{}", literals_.size());
    storage += '"';
    literals_.emplace_back(json.substr(start, end - start));
    copied = end;
  }
  if (copied == 0) return json;
  storage.append(json.substr(copied));
  return storage;
}

void WideIntegers::restore(std::string& text) const {
  if (literals_.empty()) return;
  std::string out;
  std::size_t copied = 0;
  std::size_t pos = 0;
  while ((pos = text.find(nonce_, pos)) != std::string::npos) {
    // Before the nonce: k backslashes then a quote, read backwards ("tok", \"tok\", \\\"tok\\\" …).
    if (pos == 0 || text[pos - 1] != '"') {
      pos += nonce_.size();
      continue;
    }
    std::size_t k = 0;
    while (pos >= 2 + k && text[pos - 2 - k] == '\\') ++k;
    const std::size_t open = pos - 1 - k;
    std::size_t j = pos + nonce_.size();
    std::size_t index = 0;
    const auto r = std::from_chars(text.data() + j, text.data() + text.size(), index);
    j = static_cast<std::size_t>(r.ptr - text.data());
    bool closes = r.ec == std::errc() && index < literals_.size() && j + k < text.size();
    for (std::size_t b = 0; closes && b < k; ++b) closes = text[j + b] == '\\';
    if (!closes || text[j + k] != '"') {
      pos = j;
      continue;
    }
    if (open < copied) {  // overlaps what was already replaced: not one of ours
      pos = j;
      continue;
    }
    out.append(text, copied, open - copied);
    out += literals_[index];
    copied = j + k + 1;
    pos = copied;
  }
  if (copied == 0) return;
  out.append(text, copied);
  text = std::move(out);
}

std::string_view WideIntegers::literal_of(std::string_view s) const {
  if (literals_.empty() || !s.starts_with(nonce_)) return {};
  s.remove_prefix(nonce_.size());
  std::size_t index = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), index);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size() || index >= literals_.size()) return {};
  return literals_[index];
}

}  // namespace weir::api
