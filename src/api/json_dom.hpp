// Small accessors for reading Boost.JSON DOMs in the protocol translators
// (api/anthropic, api/responses): views into the DOM's own storage, valid
// while the value lives.
#pragma once

#include <string_view>

#include <boost/json/object.hpp>
#include <boost/json/string.hpp>

namespace weir::api {

// A json::string as a std::string_view (no copy).
inline std::string_view sv(const boost::json::string& s) { return {s.data(), s.size()}; }

// The string member `name` of `o`, or "" when it is absent or not a string.
inline std::string_view string_at(const boost::json::object& o, std::string_view name) {
  const auto* v = o.if_contains(name);
  return v && v->is_string() ? sv(v->get_string()) : std::string_view{};
}

}  // namespace weir::api
