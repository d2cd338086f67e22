#include "gateway/cors.hpp"

#include <charconv>

#include "core/text.hpp"
#include "http/headers.hpp"

namespace weir::gateway {

namespace bh = boost::beast::http;

namespace {

// RFC 9110 §5.6.2 tchar.
bool is_tchar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// Whether `c` grants the request header `name` (lower-case).
bool grants(const core::CorsConfig& c, std::string_view name) {
  if (c.any_header) return true;
  for (const auto& h : c.headers) {
    if (h.back() == '*') {
      const std::string_view prefix = std::string_view(h).substr(0, h.size() - 1);
      if (name.size() > prefix.size() && name.starts_with(prefix)) return true;
    } else if (name == h) {
      return true;
    }
  }
  return false;
}

bool origin_allowed(const core::CorsConfig& c, std::string_view origin) {
  if (origin.empty()) return false;
  if (c.any_origin) return true;
  for (const auto& o : c.origins)
    if (core::iequals(origin, o)) return true;  // (the config's are lower-case, as browsers send them)
  return false;
}

void append_allow_origin(std::string& out, const core::CorsConfig& c, std::string_view origin) {
  // `*` only without credentials (refused at --check otherwise): the same answer for every origin.
  http::append_header(out, "Access-Control-Allow-Origin", c.any_origin ? std::string_view("*") : origin);
  if (c.allow_credentials) out += "Access-Control-Allow-Credentials: true\r\n";
}

}  // namespace

std::string_view request_origin(const http::RequestHead& req) {
  std::string_view origin;
  int n = 0;
  for (const auto& f : req)
    if (f.name() == bh::field::origin && ++n == 1) origin = f.value();
  return n == 1 ? origin : std::string_view();
}

bool is_preflight(const http::RequestHead& req) {
  return req.method() == bh::verb::options && http::has_field(req, bh::field::origin) &&
         http::has_field(req, bh::field::access_control_request_method);
}

bool append_cors_fields(std::string& out, const core::CorsConfig& c, const http::RequestHead& req) {
  if (!c.any_origin) out += "Vary: Origin\r\n";
  const std::string_view origin = request_origin(req);
  if (!origin_allowed(c, origin)) return false;
  append_allow_origin(out, c, origin);
  if (!c.expose_headers.empty()) http::append_header(out, "Access-Control-Expose-Headers", c.expose_headers);
  return true;
}

void append_preflight_fields(std::string& out, const core::CorsConfig& c, const http::RequestHead& req,
                             std::string_view methods) {
  append_allow_origin(out, c, request_origin(req));
  http::append_header(out, "Access-Control-Allow-Methods", methods);
  // The requested names (a comma-separated list, on one line or several: RFC 9110 §5.3) that `c` grants,
  // each once, lower-case, at most kMaxGranted of them: a browser asks for the few its page sets, and a list
  // of thousands (a head of 64 KiB holds ~16,000 names) must not cost this worker more than a usual request
  // (the preflight comes before authentication). A name that is no token is never echoed.
  constexpr std::size_t kMaxGranted = 64;
  std::string granted;
  std::size_t n_granted = 0;
  for (const auto& f : req) {
    if (f.name() != bh::field::access_control_request_headers) continue;
    std::string_view v = f.value();
    while (!v.empty() && n_granted < kMaxGranted) {
      const std::size_t comma = v.find(',');
      const std::string_view raw = core::trim_ows(v.substr(0, comma));
      v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
      if (raw.empty() || raw.size() > 128) continue;
      char buf[128];
      bool token = true;
      for (std::size_t i = 0; i < raw.size(); ++i) {
        token = token && is_tchar(raw[i]);
        buf[i] = core::ascii_lower(raw[i]);
      }
      const std::string_view name(buf, raw.size());
      if (!token || !grants(c, name)) continue;
      // (Each once: a list of at most kMaxGranted names, searched as it grows.)
      bool seen = false;
      for (std::string_view g = granted; !g.empty() && !seen;) {
        const std::size_t sep = g.find(", ");
        seen = g.substr(0, sep) == name;
        g = sep == std::string_view::npos ? std::string_view() : g.substr(sep + 2);
      }
      if (seen) continue;
      if (!granted.empty()) granted += ", ";
      granted += name;
      ++n_granted;
    }
  }
  if (!granted.empty()) http::append_header(out, "Access-Control-Allow-Headers", granted);
  char num[12];
  const auto [p, ec] = std::to_chars(num, num + sizeof num, c.max_age_s);
  (void)ec;
  http::append_header(out, "Access-Control-Max-Age", std::string_view(num, static_cast<std::size_t>(p - num)));
  out += c.any_origin ? "Vary: Access-Control-Request-Headers\r\n" : "Vary: Origin, Access-Control-Request-Headers\r\n";
}

}  // namespace weir::gateway
