// Appending many small pieces to one std::string on the request path (the
// access-log line, x-ratelimit-* header lines) without a call and a
// capacity check in libstdc++ per piece: the writer grows the string once
// by a chunk and writes through a pointer; each put checks its room inline.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace weir::core {

class TextWriter {
 public:
  // Appends at the end of `out`, `room` bytes made at first (more on demand).
  // `out` holds unwritten bytes at its end until finish() or the destructor:
  // touch it only through this writer meanwhile.
  explicit TextWriter(std::string& out, std::size_t room = 256) : out_(out), base_(out.size()) {
    const std::size_t at = base_;
    out.resize(at + room);
    p_ = out.data() + at;
    end_ = out.data() + out.size();
  }
  ~TextWriter() { finish(); }
  TextWriter(const TextWriter&) = delete;
  TextWriter& operator=(const TextWriter&) = delete;

  // Cuts `out` to what was written. Idempotent; nothing may be put after it.
  void finish() {
    if (p_) out_.resize(static_cast<std::size_t>(p_ - out_.data()));
    p_ = end_ = nullptr;
  }

  // Room for `n` more bytes: the next puts totalling ≤ n need no check.
  [[gnu::always_inline]] void ensure(std::size_t n) {
    if (static_cast<std::size_t>(end_ - p_) < n) [[unlikely]]
      grow(n);
  }

  [[gnu::always_inline]] void put(std::string_view s) {
    if (s.empty()) return;  // its data() may be null, which memcpy must not see
    ensure(s.size());
    std::memcpy(p_, s.data(), s.size());
    p_ += s.size();
  }
  [[gnu::always_inline]] void put(char c) {
    ensure(1);
    *p_++ = c;
  }
  // Decimal, as JSON writes numbers.
  [[gnu::always_inline]] void put_uint(std::uint64_t v) {
    ensure(20);
    p_ = std::to_chars(p_, p_ + 20, v).ptr;
  }
  [[gnu::always_inline]] void put_int(std::int64_t v) {
    ensure(20);
    p_ = std::to_chars(p_, p_ + 20, v).ptr;
  }
  // v / 10^decimals with exactly `decimals` fraction digits (decimals ≤ 18):
  // append_scaled in json_text.hpp.
  void put_scaled(std::int64_t v, unsigned decimals);
  // `s` as a JSON string literal: append_json_string in json_text.hpp.
  void put_json_string(std::string_view s) { put_string<false>(s); }
  // The same, except that U+0000 (a NUL byte) is written as U+FFFD, not as
  // \u0000: a log line's value (the access log, the request log's `record`),
  // which PostgreSQL's json and jsonb cannot hold with a U+0000 in it (its
  // docs, "JSON Types": \u0000 is refused when the text is read as json), so
  // one row with it failed every `record::json` query over the table. The
  // same cost as put_json_string: a NUL takes the escape path either way.
  void put_log_string(std::string_view s) { put_string<true>(s); }

 private:
  template <bool kNulAsReplacement>
  void put_string(std::string_view s);
  [[gnu::cold, gnu::noinline]] void grow(std::size_t n);

  std::string& out_;
  std::size_t base_;  // out_'s size before this writer
  char* p_;
  char* end_;
};

}  // namespace weir::core
