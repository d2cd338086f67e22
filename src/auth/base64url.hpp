// base64url without padding (RFC 4648 §5), as JOSE uses it (RFC 7515 §2).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace weir::auth {

// Decodes unpadded base64url text into bytes. Returns nullopt on any
// character outside [A-Za-z0-9_-], on a length of 1 mod 4, or on non-zero
// trailing bits (a non-canonical encoding). Padding '=' is rejected, as
// RFC 7515 requires for JWS compact serialization.
std::optional<std::string> base64url_decode(std::string_view in);

// Appends the unpadded base64url encoding of `bytes` to `out`.
void base64url_encode(std::string& out, std::string_view bytes);
std::string base64url_encode(std::string_view bytes);

}  // namespace weir::auth
