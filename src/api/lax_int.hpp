// An integer given as a JSON string, read as vLLM's pydantic models read one
// for an `int` field (lax mode): the request parser's counts (max_tokens, n,
// best_of) sent as strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace weir::api {

// The integer a JSON string holds as pydantic v2 reads one for an `int` field
// in lax mode (pydantic-core's str → int: "Conversion Table", checked against
// pydantic 2.14): leading and trailing Unicode White_Space (Rust's trim: tab,
// LF, VT, FF, CR, space, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028,
// U+2029, U+202F, U+205F, U+3000), an optional + or -, ASCII digits with
// single underscores between them ("1_000"), and optionally "." and zeros
// only ("3.0", "3.000"). nullopt for anything else ("", "3.5", "3e0", "0x10",
// "3.", "1__0", "_1"). Saturates at the int64 range: a count is read up to
// 2^32 - 1 anyway.
std::optional<std::int64_t> lax_int(std::string_view text);

}  // namespace weir::api
