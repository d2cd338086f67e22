// RFC 8259 text of a Boost.JSON DOM, as the translators send it upstream and to clients.
#pragma once

#include <string>

namespace boost::json {
class value;
}

namespace weir::api {

// Appends `v` to `out` as compact JSON text: the same bytes as boost::json::serialize (member order as
// stored, no whitespace, the same string escapes: `\"`, `\\`, `\b \t \n \f \r`, `\u00XX` for the other
// control characters, everything else as it is), except for doubles. Boost.JSON 1.81 writes those in its
// own exponent form (`0.7` as `7E-1`, `100.0` as `1E2`, `1e400` as `Infinity`, which is no JSON); here a
// double is the shortest decimal that reads back as the same double (std::to_chars), with `.0` added when
// that is an integer, as Python's json and JavaScript write them: `0.7`, `100.0`, `1e+21`, `-0.0`,
// `1.5e-07`. A double that is not finite (a literal beyond a double's range, parsed) is `1e999` or
// `-1e999`, which reads back as the same infinity in Python, JavaScript and Boost.JSON; NaN (no parse
// makes one) is `null`. Integers (int64, uint64) are written exactly. Iterative: any depth the DOM has.
void append_json(std::string& out, const boost::json::value& v);

// append_json into a new string.
std::string to_json(const boost::json::value& v);

}  // namespace weir::api
