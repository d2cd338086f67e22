// The web console's static files (console/ in the repository), compiled
// into the binary at build time by src/gateway/console_assets.cmake, and
// the answers the admin listener gives for them under /console/
// (docs/console.md): the bytes, a Content-Type, an ETag for conditional
// requests (RFC 9110 §8.8.3, §13.1.2) and a strict Content-Security-Policy.
#pragma once

#include <span>
#include <string_view>

namespace weir::gateway::console {

struct Asset {
  std::string_view path;          // "/console/index.html"
  std::string_view content_type;  // "text/html; charset=utf-8"
  std::string_view etag;          // a strong ETag with its quotes: "\"0123456789abcdef\"" (SHA-256 prefix)
  std::string_view body;          // the file's bytes
};

// Every file, sorted by path (generated).
std::span<const Asset> assets();

// The asset a GET of `path` (without the query) answers, or null:
// "/console/" is index.html; "/console/x" the file x. Paths with "..",
// "//", a backslash or a percent-escape match nothing (there is nothing to
// decode: asset names are plain ASCII). O(log assets).
const Asset* find(std::string_view path);

// Whether an If-None-Match field value (RFC 9110 §13.1.2: "*", or a list of
// entity tags, weak ones compared weakly) matches `etag`.
bool etag_matches(std::string_view if_none_match, std::string_view etag);

// The Content-Security-Policy of every answer on the admin listener: only
// this origin's scripts, styles, images and fetches; no inline script or
// style, no eval, no frames, no plugins, no forms posted anywhere, and
// Trusted Types with no policy, so no string ever reaches an HTML sink
// (innerHTML and the like throw): the console builds its pages from DOM
// nodes and text only.
inline constexpr std::string_view kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'; require-trusted-types-for 'script'; "
    "trusted-types 'none'";

}  // namespace weir::gateway::console
