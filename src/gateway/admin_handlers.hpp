// Helpers of the admin API's handlers (admin_server.cpp, admin_keys.cpp,
// admin_pools.cpp). Private to them: include nowhere else.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "admission/limiter.hpp"
#include "api/error_text.hpp"
#include "api/json_dom.hpp"
#include "gateway/admin_server.hpp"
#include "gateway/key_store.hpp"

namespace weir::gateway::admin_detail {

namespace json = boost::json;

// (Doubles in plain decimals: admin_json_text.)
inline AdminResponse json_response(int status, const json::value& v) {
  return AdminResponse{status, admin_json_text(v)};
}

inline AdminResponse error_response(const AdminError& e) { return AdminResponse{e.status, admin_error_json(e)}; }

inline AdminError no_keys() {
  return AdminError{409,
                    "invalid_request_error",
                    "no_tenants",
                    "Runtime keys need tenants: this configuration has no auth:/tenants: section.",
                    {}};
}

inline AdminError read_only(std::string_view id) {
  return AdminError{409,
                    "invalid_request_error",
                    "read_only",
                    fmt::format("Key `{}` comes from the configuration file (source: config) and is read-only here.",
                                id.substr(0, 128)),
                    {}};
}

// The body as a JSON object, or 400: empty, not an object, or not valid
// JSON, said as the client listener says it (api::invalid_body_message:
// ill-formed UTF-8 and a lone surrogate escape by name, where Boost.JSON
// says "syntax error"), nested at most api::kMaxBodyDepth levels as there,
// with no number that underflows to 0 (underflowing_number) and no object
// that repeats a member name, at any depth (repeated_member_path: parsers
// differ on which copy counts; Boost.JSON keeps the last), `param` its path.
inline AdminResult<json::object> parse_object(const std::string& body) {
  if (body.empty()) return tl::unexpected(admin_bad_request("The request body is empty; expected a JSON object."));
  boost::system::error_code ec;
  json::parse_options opt;
  opt.max_depth = api::kMaxBodyDepth;
  json::value v = json::parse(body, ec, {}, opt);
  if (ec) return tl::unexpected(admin_bad_request(api::invalid_body_message(ec, body)));
  if (const auto n = underflowing_number(body))
    return tl::unexpected(admin_bad_request(fmt::format(
        "The number {} is too small for a double: it would be read as 0. Write 0, or a number a double holds.",
        n->substr(0, 64))));
  if (!v.is_object()) return tl::unexpected(admin_bad_request("The request body must be a JSON object."));
  if (auto path = repeated_member_path(body))
    return tl::unexpected(admin_bad_request(
        fmt::format("'{}' appears more than once in the request body: JSON parsers differ on which copy of a "
                    "repeated member counts (the first, the last, or neither), so Weir does not guess. Send it once.",
                    *path),
        *path));
  return std::move(v.get_object());
}

inline bool is_config_key(const KeyStore& keys, std::string_view id) {
  for (const auto& k : keys.policy()->keys())
    if (!k.runtime && k.id == id) return true;
  return false;
}

inline std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline json::value bucket_json(const admission::BucketView& v) {
  json::object o;
  o["limit"] = v.limit;
  o["remaining"] = v.remaining;
  o["reset_ms"] = v.reset_ms;
  return o;
}

}  // namespace weir::gateway::admin_detail
