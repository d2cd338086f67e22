// The admin API's errors and JSON text (docs/admin-api.md): an error in
// OpenAI's shape, and a JSON body with every double in plain decimal
// notation. The admin handlers (gateway/admin_handlers.hpp, admin_keys.cpp,
// admin_serve.cpp, admin_server.cpp), the key store and its keys file
// (gateway/key_store.hpp, key_json.hpp) and the Redis key admin
// (gateway/redis_key_admin.hpp) answer with them.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <boost/json/value.hpp>
#include <tl/expected.hpp>

namespace weir::gateway {

// An admin API error, rendered in OpenAI's error shape
// {"error":{"message","type","param","code"}} (empty param/code = null).
struct AdminError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;
  std::string message;
  std::string param;
};
AdminError admin_bad_request(std::string message, std::string param = {});
AdminError admin_not_found(std::string message);
std::string admin_error_json(const AdminError& e);
// `v` as JSON text, every double in plain decimal notation with a fraction
// (25.0, 1.234, 0.001; the shortest that reads back as the same double:
// std::to_chars), as docs/admin-api.md shows them: boost::json::serialize
// writes 2.5E1 and 1E-3, which JSON allows but people and some tools read
// badly. Magnitudes under 1e-9 or from 1e17 on keep the exponent (0 is
// "0.0"); a NaN or infinity, which JSON has not, is null. Every JSON body of
// the admin API and the keys file are written with it.
std::string admin_json_text(const boost::json::value& v);

// The first number of the JSON text `json` (valid JSON, as parsed) with a
// non-zero digit that a double holds as 0 (1e-400, 0.1e-330: an underflow,
// which Boost.JSON reads as 0 without a word, so a limit of 1e-400 would be
// no limit), as written; nullopt when there is none. Numbers in strings are
// not numbers. Every admin API body is checked with it (admin_handlers.hpp).
std::optional<std::string_view> underflowing_number(std::string_view json);

// The first member of the JSON text `json` (valid JSON, as parsed) whose
// name an earlier member of the same object has, at any depth: its path,
// "tenant", "limits.requests_per_minute", "metadata.a[2].b" (names
// unescaped, cut to 256 bytes), or nullopt when no object repeats a name.
// Boost.JSON keeps the last copy without a word; the client listener
// refuses a repeated member it reads (api::repeated_member_error), and
// parsers differ on which copy counts, so every admin API body is checked
// with it (admin_handlers.hpp parse_object). Allocates only for the names of
// open objects; throws only std::bad_alloc.
std::optional<std::string> repeated_member_path(std::string_view json);

template <class T>
using AdminResult = tl::expected<T, AdminError>;

}  // namespace weir::gateway
