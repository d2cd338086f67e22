// Writing JSON text by hand on hot paths (access log lines, error bodies,
// response heads) without building a DOM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace weir::core {

// Appends `s` as a JSON string literal to `out`: always valid JSON text
// (RFC 8259 §7 and §8.1: UTF-8), whatever bytes `s` holds. Quote, backslash
// and control characters are escaped (\" \\ \b \f \n \r \t, else \u00XX),
// C0 (U+0000..U+001F), DEL (U+007F) and C1 (U+0080..U+009F) alike: no byte
// of a log line is one a terminal acts on (U+009B is CSI);
// well-formed UTF-8 (Unicode §3.9 Table 3-7: no overlongs, no surrogates
// ED A0..BF, nothing above U+10FFFF) is copied as it is; every maximal
// ill-formed subsequence (a lone continuation byte, a truncated sequence,
// C0/C1, F5..FF, ...) becomes one U+FFFD, as the WHATWG Encoding Standard's
// decoder and Python's errors="replace" count them. Runs of plain ASCII are
// copied in one append.
void append_json_string(std::string& out, std::string_view s);

// Appends `s` to `out` as valid UTF-8 text by append_json_string's rule:
// well-formed sequences as they are, each maximal ill-formed subsequence as
// one U+FFFD. The result is the text append_json_string's literal decodes
// to, so a column stored from it equals the log line's field (the request
// log's model, tenant and key_id); from utf8_prefix(s, max) it is at most
// `max` bytes.
void append_valid_utf8(std::string& out, std::string_view s);

// `s` as a JSON string literal (append_json_string), cut to its
// utf8_prefix(s, max_bytes) with "..." before the closing quote when cut:
// text from outside (a name from a file or Redis) shown in a stderr line or
// an error message, with no control byte a terminal acts on and no
// ill-formed UTF-8, and nothing that could end the line early.
std::string quoted_text(std::string_view s, std::size_t max_bytes = 128);

// Appends `v` in decimal (a JSON number), with no format-string parsing:
// the access log's counters on the request path.
void append_uint(std::string& out, std::uint64_t v);
void append_int(std::string& out, std::int64_t v);

// Appends v / 10^decimals with exactly `decimals` fraction digits: a
// quantity kept as an integer in a small unit printed in a larger one (µs
// as ms: append_scaled(out, 1234, 3) → "1.234"; nano-USD as USD with 9
// digits), exact where printing the quotient as a double could round.
// decimals ≤ 18.
void append_scaled(std::string& out, std::int64_t v, unsigned decimals);

// The longest prefix of `s` that never ends inside a UTF-8 sequence and is
// at most `max_bytes` bytes as append_json_string writes it (each maximal
// ill-formed subsequence as one 3-byte U+FFFD; escapes of control characters
// not counted), for capping client-supplied fields in logs and messages.
std::string_view utf8_prefix(std::string_view s, std::size_t max_bytes) noexcept;

// The length of the well-formed UTF-8 sequence at s[i] (Unicode §3.9 Table
// 3-7: no overlongs, no surrogates, nothing above U+10FFFF), 0 when it
// starts an ill-formed one (or i is at the end).
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) noexcept;

// Client-supplied fields (path, model, method) are echoed in logs and error
// messages at most this long.
inline constexpr std::size_t kMaxEchoBytes = 256;

}  // namespace weir::core
