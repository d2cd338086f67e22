// The `server.cors` section of the configuration (docs/operations.md,
// "Browsers (CORS)"): the origins whose pages may call Weir, the request
// headers a preflight is granted, the response fields a page may read, the
// preflight's cache time and credentials. parse_server() (core/config.cpp)
// calls parse_cors() when the section is given; gateway/cors.hpp answers
// with what it read.
#include "core/config_cors.hpp"

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace weir::core {

namespace {

// The request headers a browser's OpenAI or Anthropic SDK sends (openai-node with dangerouslyAllowBrowser,
// @anthropic-ai/sdk with dangerouslyAllowBrowser: its anthropic-dangerous-direct-browser-access), and Weir's
// own request controls: what a preflight is granted unless server.cors.allowed_headers says otherwise.
constexpr std::string_view kCorsDefaultHeaders[] = {
    "authorization",       "content-type",      "accept",         "user-agent",
    "x-api-key",           "anthropic-version", "anthropic-beta", "anthropic-dangerous-direct-browser-access",
    "openai-organization", "openai-project",    "openai-beta",    "idempotency-key",
    "x-stainless-*",       "x-request-id",      "x-weir-*"};
// The response fields those SDKs and their users read that CORS does not expose by itself (only
// Cache-Control, Content-Language, Content-Length, Content-Type, Expires, Last-Modified and Pragma are).
constexpr std::string_view kCorsDefaultExpose =
    "x-request-id, request-id, retry-after, retry-after-ms, x-should-retry, x-ratelimit-limit-requests, "
    "x-ratelimit-limit-tokens, x-ratelimit-remaining-requests, x-ratelimit-remaining-tokens, "
    "x-ratelimit-reset-requests, x-ratelimit-reset-tokens, openai-processing-ms, openai-version";

// RFC 9110 §5.6.2 token.
bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos))
      return false;
  return true;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

// A list of strings (one string is a list of one), each non-empty.
ConfigResult<std::vector<std::pair<std::string, YAML::Node>>> read_names(const YAML::Node& n, const std::string& key) {
  std::vector<std::pair<std::string, YAML::Node>> out;
  if (n.IsScalar()) {
    WEIR_TRY(s, read_string(n, key));
    out.emplace_back(s, n);
  } else if (n.IsSequence()) {
    for (std::size_t i = 0; i < n.size(); ++i) {
      WEIR_TRY(s, read_string(n[i], fmt::format("{}[{}]", key, i)));
      out.emplace_back(s, n[i]);
    }
  } else {
    return tl::unexpected(config_error(n, key, "expected a list of strings"));
  }
  for (const auto& [s, node] : out)
    if (s.empty()) return tl::unexpected(config_error(node, key, "empty entry"));
  return out;
}

}  // namespace

ConfigResult<void> parse_cors(const YAML::Node& n, CorsConfig& c) {
  WEIR_TRY_VOID(check_keys(n, "server.cors",
                           {"allowed_origins", "allowed_headers", "expose_headers", "max_age", "allow_credentials"}));
  const YAML::Node origins = n["allowed_origins"];
  if (!origins)
    return tl::unexpected(config_error(n, "server.cors.allowed_origins",
                                       "required: the origins whose pages may call Weir (\"https://app.example.com\", "
                                       "or \"*\" for every one)"));
  WEIR_TRY(os, read_names(origins, "server.cors.allowed_origins"));
  if (os.empty())
    return tl::unexpected(config_error(origins, "server.cors.allowed_origins", "empty: leave server.cors out instead"));
  for (const auto& [o, node] : os) {
    if (o == "*") {
      if (os.size() > 1)
        return tl::unexpected(
            config_error(node, "server.cors.allowed_origins", "\"*\" allows every origin: list it alone"));
      c.any_origin = true;
      continue;
    }
    // A serialized origin (RFC 6454 §6.2, what a browser sends in Origin): scheme "://" host [":" port], no
    // path, no userinfo. Browsers send scheme and host in lower case; the port only when it is not the default.
    const std::size_t sep = o.find("://");
    const std::string_view scheme = std::string_view(o).substr(0, sep);
    const std::string_view authority =
        sep == std::string::npos ? std::string_view() : std::string_view(o).substr(sep + 3);
    const bool scheme_ok = !scheme.empty() && std::all_of(scheme.begin(), scheme.end(), [](char ch) {
      return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '+' ||
             ch == '-' || ch == '.';
    });
    // The port, when written: digits, and never the scheme's default (a browser leaves that out, so
    // "https://a.example:443" would match no page). (An IPv6 host's colons are inside its brackets.)
    const std::size_t close = authority.rfind(']');
    const std::size_t colon = authority.rfind(':');
    const bool has_port = colon != std::string_view::npos && (close == std::string_view::npos || colon > close);
    const std::string_view port = has_port ? authority.substr(colon + 1) : std::string_view();
    const bool port_ok =
        !has_port || (!port.empty() && port.size() <= 5 &&
                      std::all_of(port.begin(), port.end(), [](char ch) { return ch >= '0' && ch <= '9'; }));
    const bool default_port = has_port && ((lower(std::string(scheme)) == "https" && port == "443") ||
                                           (lower(std::string(scheme)) == "http" && port == "80"));
    const bool controls = std::any_of(authority.begin(), authority.end(), [](char ch) {
      return static_cast<unsigned char>(ch) <= 0x20 || ch == 0x7f || ch == '\\';
    });
    if (default_port)
      return tl::unexpected(config_error(
          node, "server.cors.allowed_origins",
          fmt::format("{} names its scheme's default port, which a browser leaves out of Origin: write {}",
                      quoted_text(o, kQuotedPathBytes),
                      quoted_text(fmt::format("{}://{}", scheme, authority.substr(0, colon)), kQuotedPathBytes))));
    if (sep == std::string::npos || !scheme_ok || authority.empty() || authority.front() == ':' || !port_ok ||
        controls || authority.find_first_of("/?#@ *") != std::string_view::npos)
      return tl::unexpected(config_error(
          node, "server.cors.allowed_origins",
          fmt::format("{} is no origin: expected scheme://host[:port] as a browser sends it (no path, no trailing "
                      "'/', no wildcard in the host), or \"*\"",
                      quoted_text(o, kQuotedPathBytes))));
    c.origins.push_back(lower(o));
  }
  if (auto v = n["allowed_headers"]) {
    WEIR_TRY(hs, read_names(v, "server.cors.allowed_headers"));
    for (const auto& [h, node] : hs) {
      if (h == "*") {
        c.any_header = true;
        continue;
      }
      const bool prefix = h.size() > 1 && h.back() == '*';
      if (!is_token(prefix ? std::string_view(h).substr(0, h.size() - 1) : std::string_view(h)) ||
          (!prefix && h.find('*') != std::string::npos))
        return tl::unexpected(config_error(
            node, "server.cors.allowed_headers",
            fmt::format("{} is no header name (a name, a prefix ending in '*' such as x-stainless-*, or \"*\")",
                        quoted_text(h))));
      c.headers.push_back(lower(h));
    }
  } else {
    for (std::string_view h : kCorsDefaultHeaders) c.headers.emplace_back(h);
  }
  if (auto v = n["expose_headers"]) {
    WEIR_TRY(hs, read_names(v, "server.cors.expose_headers"));
    for (const auto& [h, node] : hs) {
      // (Fetch reads "*" as every field only for a request without credentials: written as given.)
      if (!is_token(h))
        return tl::unexpected(
            config_error(node, "server.cors.expose_headers", fmt::format("{} is no header name", quoted_text(h))));
      if (!c.expose_headers.empty()) c.expose_headers += ", ";
      c.expose_headers += lower(h);
    }
  } else {
    c.expose_headers = kCorsDefaultExpose;
  }
  if (auto v = n["max_age"]) {
    WEIR_TRY(ms, read_duration(v, "server.cors.max_age"));
    if (ms.count() < 0 || ms.count() > 86'400'000)
      return tl::unexpected(config_error(v, "server.cors.max_age", "must be between 0s and 1d"));
    // Access-Control-Max-Age is in whole seconds: 900ms would be sent as 0 (no caching at all).
    if (ms.count() % 1000 != 0)
      return tl::unexpected(config_error(v, "server.cors.max_age", "must be whole seconds (Access-Control-Max-Age)"));
    c.max_age_s = static_cast<std::uint32_t>(ms.count() / 1000);
  }
  if (auto v = n["allow_credentials"]) {
    WEIR_TRY(b, read_bool(v, "server.cors.allow_credentials"));
    // Fetch refuses `Access-Control-Allow-Origin: *` on a request with credentials; reflecting every origin
    // instead would hand any web page the browser's cookies for Weir.
    if (b && c.any_origin)
      return tl::unexpected(config_error(v, "server.cors.allow_credentials",
                                         "true needs a list of origins, not \"*\" (browsers refuse credentials with "
                                         "\"*\", and every origin with credentials would let any page use them)"));
    c.allow_credentials = b;
  }
  c.enabled = true;
  return {};
}

}  // namespace weir::core
