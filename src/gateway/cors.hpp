// Cross-origin requests from browsers (server.cors): the server's side of the
// Fetch standard's CORS protocol (https://fetch.spec.whatwg.org/#http-cors-protocol).
// A browser asks first with a preflight (OPTIONS with Origin and
// Access-Control-Request-Method, §3.2.2) for a request that is not "simple"
// (a JSON body, an Authorization header), then sends it, and hands its
// page the answer only when that answer's Access-Control-Allow-Origin names
// the page's origin (or is `*`). Weir answers for its own routes: the
// upstream's CORS fields are dropped when server.cors is on
// (http::append_response_fields), so each comes once.
#pragma once

#include <string>
#include <string_view>

#include "core/config.hpp"
#include "http/forward.hpp"

namespace weir::gateway {

// Whether `req` is a CORS preflight: OPTIONS with an Origin and an
// Access-Control-Request-Method field (Fetch §3.2.2). An OPTIONS without
// them is no preflight (answered 405 as before).
bool is_preflight(const http::RequestHead& req);

// Appends the CORS fields every answer to `req` carries (errors and streams
// included), `c` being on: `Vary: Origin` when the answer depends on the
// origin (a list of origins, RFC 9110 §12.5.5: a cache must not give one
// origin's answer to another), and, for an Origin the list allows,
// Access-Control-Allow-Origin (that origin, or `*`),
// Access-Control-Allow-Credentials and Access-Control-Expose-Headers.
// Whole "Name: value\r\n" lines. Returns whether the request's origin is
// allowed: false for one not listed (it gets no Allow-Origin, so the
// browser withholds the answer; the request is served as any other), for a
// request without Origin (not cross-origin; nothing to allow), and for one
// with two Origin lines (no browser sends that).
bool append_cors_fields(std::string& out, const core::CorsConfig& c, const http::RequestHead& req);

// Appends a preflight's answer fields for an allowed origin:
// Access-Control-Allow-Origin (and -Allow-Credentials), -Allow-Methods
// (`methods`: what the route serves), -Allow-Headers (those of the
// Access-Control-Request-Headers that `c` grants, lower-case, each a
// token; none when it asks for none), -Max-Age, and Vary (Origin for a
// list of origins; Access-Control-Request-Headers, which the granted list
// echoes). A header `c` does not grant is left out: the browser then
// refuses the request, as Fetch has it decide (§4.8 CORS-preflight fetch).
void append_preflight_fields(std::string& out, const core::CorsConfig& c, const http::RequestHead& req,
                             std::string_view methods);

// The request's Origin, "" when it has none or several.
std::string_view request_origin(const http::RequestHead& req);

}  // namespace weir::gateway
