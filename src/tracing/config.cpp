#include "tracing/config.hpp"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>
#include <boost/url/parse.hpp>

namespace weir::tracing {

namespace {

using core::config_error;
using core::ConfigResult;

// RFC 9110 §5.6.2 token characters.
bool token_char(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// Header names Weir writes itself, or that would break the request's framing.
bool reserved_header(std::string_view name) {
  static constexpr std::string_view kReserved[] = {
      "host", "content-length", "content-type", "transfer-encoding", "connection", "te", "upgrade", "keep-alive"};
  for (auto r : kReserved) {
    if (r.size() != name.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < r.size() && same; ++i)
      same = r[i] == (name[i] >= 'A' && name[i] <= 'Z' ? static_cast<char>(name[i] - 'A' + 'a') : name[i]);
    if (same) return true;
  }
  return false;
}

ConfigResult<void> check_header(const YAML::Node& n, const std::string& key, std::string_view name,
                                std::string_view value) {
  if (name.empty() || !std::all_of(name.begin(), name.end(), token_char))
    return tl::unexpected(
        config_error(n, key, "a header name must be an HTTP token (letters, digits, -_.!#$%&'*+^`|~)"));
  if (reserved_header(name))
    return tl::unexpected(config_error(n, key, fmt::format("{} is set by Weir itself", core::quoted_text(name))));
  for (char c : value)
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7F)
      return tl::unexpected(config_error(n, key, "a header value must not hold control characters"));
  return {};
}

ConfigResult<TracingConfig> parse_impl(const YAML::Node& n, GetEnv getenv_fn) {
  TracingConfig c;
  if (!n.IsMap())
    return tl::unexpected(config_error(n, "tracing", "expected a mapping (otlp_endpoint, sample_ratio, ...)"));
  WEIR_TRY_VOID(
      core::check_keys(n, "tracing",
                       {"otlp_endpoint", "sample_ratio", "parent_based", "service_name", "resource", "headers",
                        "headers_env", "queue", "batch", "flush_interval", "timeout", "ca_file", "priority"}));
  if (!n["otlp_endpoint"])
    return tl::unexpected(config_error(n, "tracing.otlp_endpoint", "missing (e.g. http://127.0.0.1:4318)"));
  WEIR_TRY(url, core::read_string(n["otlp_endpoint"], "tracing.otlp_endpoint"));
  const auto u = boost::urls::parse_uri(url);
  if (u && u->has_userinfo())
    return tl::unexpected(config_error(n["otlp_endpoint"], "tracing.otlp_endpoint",
                                       "credentials (userinfo before '@') are not allowed in the URL: give them as "
                                       "a header in tracing.headers_env"));
  auto ep = core::parse_endpoint_url(url);
  if (!ep) return tl::unexpected(config_error(n["otlp_endpoint"], "tracing.otlp_endpoint", ep.error().message));
  c.endpoint = std::move(*ep);
  // No path (or "/" alone): OTLP/HTTP's default, /v1/traces. A path is the
  // target as written, a trailing '/' kept (the OpenTelemetry SDKs' rule for a
  // signal's own endpoint: used as is). (base_path drops the slash: the
  // upstreams' rule, a base that request paths are appended to.)
  c.target = c.endpoint.base_path.empty() ? "/v1/traces" : std::string(u->encoded_path());
  if (!c.endpoint.query.empty()) c.target += "?" + c.endpoint.query;
  if (auto v = n["sample_ratio"]) {
    WEIR_TRY(r, core::read_double(v, "tracing.sample_ratio", 0.0, 1.0));
    c.sample_ratio = r;
  }
  if (auto v = n["parent_based"]) {
    WEIR_TRY(b, core::read_bool(v, "tracing.parent_based"));
    c.parent_based = b;
  }
  if (auto v = n["service_name"]) {
    WEIR_TRY(s, core::read_name(v, "tracing.service_name"));
    if (s.empty()) return tl::unexpected(config_error(v, "tracing.service_name", "must not be empty"));
    c.service_name = std::move(s);
  }
  if (auto r = n["resource"]) {
    if (!r.IsMap())
      return tl::unexpected(config_error(
          r, "tracing.resource", "expected a mapping of attribute names to strings (deployment.environment: prod)"));
    for (const auto& kv : r) {
      if (!kv.first.IsScalar())
        return tl::unexpected(config_error(kv.first, "tracing.resource", "attribute names must be strings"));
      const std::string name = kv.first.Scalar();
      const std::string key = "tracing.resource." + name;
      if (name.empty()) return tl::unexpected(config_error(kv.first, "tracing.resource", "an empty attribute name"));
      if (name == "service.name")
        return tl::unexpected(config_error(kv.first, key, "set it with tracing.service_name"));
      WEIR_TRY(value, core::read_string(kv.second, key));
      c.resource.emplace_back(name, std::move(value));
    }
  }
  if (auto h = n["headers"]) {
    if (!h.IsMap())
      return tl::unexpected(config_error(h, "tracing.headers", "expected a mapping of header names to values"));
    for (const auto& kv : h) {
      if (!kv.first.IsScalar())
        return tl::unexpected(config_error(kv.first, "tracing.headers", "header names must be strings"));
      const std::string name = kv.first.Scalar();
      const std::string key = "tracing.headers." + name;
      WEIR_TRY(value, core::read_string(kv.second, key));
      WEIR_TRY_VOID(check_header(kv.first, key, name, value));
      c.headers.emplace_back(name, std::move(value));
    }
  }
  if (auto h = n["headers_env"]) {
    if (!h.IsMap())
      return tl::unexpected(
          config_error(h, "tracing.headers_env", "expected a mapping of header names to environment variable names"));
    for (const auto& kv : h) {
      if (!kv.first.IsScalar())
        return tl::unexpected(config_error(kv.first, "tracing.headers_env", "header names must be strings"));
      const std::string name = kv.first.Scalar();
      const std::string key = "tracing.headers_env." + name;
      WEIR_TRY(var, core::read_string(kv.second, key));
      const char* value = getenv_fn(var.c_str());
      if (!value || !*value)
        return tl::unexpected(
            config_error(kv.second, key, fmt::format("environment variable {} is not set", core::quoted_text(var))));
      WEIR_TRY_VOID(check_header(kv.first, key, name, value));
      c.headers.emplace_back(name, value);
    }
  }
  if (auto v = n["queue"]) {
    WEIR_TRY(i, core::read_int(v, "tracing.queue", 16, 1 << 20));
    c.queue = static_cast<std::uint32_t>(i);
  }
  if (auto v = n["batch"]) {
    WEIR_TRY(i, core::read_int(v, "tracing.batch", 1, 10'000));
    c.batch = static_cast<std::uint32_t>(i);
  }
  if (auto v = n["flush_interval"]) {
    WEIR_TRY(ms, core::read_duration(v, "tracing.flush_interval"));
    if (ms.count() < 1 || ms.count() > 60'000)
      return tl::unexpected(config_error(v, "tracing.flush_interval", "must be between 1ms and 60s"));
    c.flush_interval = ms;
  }
  if (auto v = n["priority"]) {
    WEIR_TRY(i, core::read_choice(v, "tracing.priority", {"idle", "normal"}));
    c.priority = i == 0 ? core::BatchThread::Priority::idle : core::BatchThread::Priority::normal;
  }
  if (auto v = n["timeout"]) {
    WEIR_TRY(ms, core::read_duration(v, "tracing.timeout"));
    if (ms.count() < 10 || ms.count() > 120'000)
      return tl::unexpected(config_error(v, "tracing.timeout", "must be between 10ms and 120s"));
    c.timeout = ms;
  }
  if (auto v = n["ca_file"]) {
    WEIR_TRY(f, core::read_string(v, "tracing.ca_file"));
    if (!c.endpoint.tls)
      return tl::unexpected(config_error(v, "tracing.ca_file", "only for an https:// otlp_endpoint"));
    if (auto why = core::unreadable_file(f); !why.empty())
      return tl::unexpected(
          config_error(v, "tracing.ca_file", fmt::format("{} {}", core::quoted_text(f, core::kQuotedPathBytes), why)));
    c.ca_file = std::move(f);
  }
  return c;
}

}  // namespace

core::ConfigResult<std::optional<TracingConfig>> parse_tracing_config(const YAML::Node& root, const std::string& file,
                                                                      GetEnv getenv_fn) {
  if (!getenv_fn) getenv_fn = [](const char* name) -> const char* { return std::getenv(name); };
  const YAML::Node n = root["tracing"];
  if (!n) return std::optional<TracingConfig>{};
  auto c = parse_impl(n, getenv_fn);
  if (!c) {
    auto e = std::move(c.error());
    e.file = file;
    return tl::unexpected(std::move(e));
  }
  return std::optional<TracingConfig>(std::move(*c));
}

}  // namespace weir::tracing
