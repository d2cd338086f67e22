// gzip (RFC 1952) decoding of buffered upstream bodies, with zlib.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace weir::http {

// Decodes a gzip body (RFC 1952: one member or several in a row, as `cat
// a.gz b.gz` makes; or zlib-wrapped deflate) into `out`, refusing output
// beyond `max_out` bytes in all (decompression bombs). Returns false on
// corrupt or truncated input, bytes after the last member that are not
// another member, or when the limit is hit (then `*over_limit`, when given,
// says which); `out` is then unspecified.
bool gunzip(std::string_view in, std::string& out, std::uint64_t max_out, bool* over_limit = nullptr);

}  // namespace weir::http
