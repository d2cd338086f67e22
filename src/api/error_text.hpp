// The texts of two errors the translators and the request parser pass on:
// a client body's 400 (invalid_body_message) and the message inside an
// upstream's error answer (upstream_error_message). Both run on failure
// paths only.
#pragma once

#include <string>
#include <string_view>

#include <boost/system/error_code.hpp>

namespace weir::api {

// The 400 message for a client `body` the parser refused with `ec`: "The
// request body is not valid JSON: <why>.", or, when it is nested deeper than
// kMaxBodyDepth, that (it is valid JSON Weir does not read). <why> names
// the two faults Boost.JSON reports vaguely: ill-formed UTF-8 (RFC 8259
// §8.1), which it calls a syntax error, and a lone surrogate escape
// ("\ud800" without its low half, or "\udc00" alone: §8.2 and Unicode
// §3.9 leave it no character), which it calls a syntax error or an
// illegal leading or trailing surrogate by where its buffer ended. Told
// apart by scanning `body`, on this failure path only.
std::string invalid_body_message(const boost::system::error_code& ec, std::string_view body);

// The message of an upstream's error answer: vLLM's and OpenAI's
// {"error":{"message"}}, vLLM's older {"object":"error","message"},
// FastAPI's {"detail": "<text>"}, or FastAPI's validation answer {"detail":
// [{"loc", "msg"}, ...]} as "loc.path: msg; ..." without the leading
// "body". "" when `body` has none, and when it is not valid JSON (ill-formed
// UTF-8 among that): what is returned is valid UTF-8 to relay.
std::string upstream_error_message(std::string_view body);

}  // namespace weir::api
