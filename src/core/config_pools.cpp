// The `pools:` section of the configuration (README, "Configuration"):
// one pool's endpoints, retry, outlier detection and circuit breaker, queue,
// balancing, TLS and Anthropic upstream settings. parse_config()
// (core/config.cpp) calls parse_pool() for each entry.
#include "core/config_pools.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <boost/url/parse.hpp>

#include "core/ip_net.hpp"
#include "core/text.hpp"
#include "core/url.hpp"

namespace weir::core {

// The shortest health-probe or load-scrape interval: each is a request to every endpoint from every worker.
constexpr std::chrono::milliseconds kMinProbeInterval{10};

namespace {

// One host however written (RFC 3986 §6.2.2): an IP literal by its address
// ([::1] and [0:0::1] are one), a name case-insensitively.
std::string canonical_host(std::string_view host) {
  const std::string h(host);
  unsigned char buf[sizeof(in6_addr)];
  char out[INET6_ADDRSTRLEN];
  if (::inet_pton(AF_INET6, h.c_str(), buf) == 1 && ::inet_ntop(AF_INET6, buf, out, sizeof out)) return out;
  if (::inet_pton(AF_INET, h.c_str(), buf) == 1 && ::inet_ntop(AF_INET, buf, out, sizeof out)) return out;
  std::string lower(h);
  for (auto& c : lower) c = ascii_lower(c);
  return lower;
}

// A path (or query) however written (RFC 3986 §6.2.2.1-2): an encoded
// unreserved character decoded (%76%31 is v1), the other escapes upper-case.
std::string canonical_path(std::string_view path) {
  std::string out;
  out.reserve(path.size());
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 2 < path.size() && hex_value(path[i + 1]) >= 0 && hex_value(path[i + 2]) >= 0) {
      const char c = static_cast<char>(hex_value(path[i + 1]) * 16 + hex_value(path[i + 2]));
      const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
                              c == '.' || c == '_' || c == '~';
      if (unreserved) {
        out += c;
      } else {
        out += '%';
        out += static_cast<char>(std::toupper(static_cast<unsigned char>(path[i + 1])));
        out += static_cast<char>(std::toupper(static_cast<unsigned char>(path[i + 2])));
      }
      i += 2;
    } else {
      out += path[i];
    }
  }
  return out;
}

ConfigResult<void> parse_retry(const YAML::Node& n, const std::string& key, RetryConfig& r) {
  WEIR_TRY_VOID(check_keys(
      n, key,
      {"attempts", "backoff", "max_backoff", "retry_after_cap", "budget", "min_concurrent", "response_timeout"}));
  if (auto v = n["attempts"]) {
    WEIR_TRY(i, read_int(v, key + ".attempts", 1, 10));
    r.attempts = static_cast<std::uint32_t>(i);
  }
  struct D {
    const char* k;
    Millis* out;
  };
  for (D d : {D{"backoff", &r.backoff}, D{"max_backoff", &r.max_backoff}, D{"retry_after_cap", &r.retry_after_cap}}) {
    if (auto v = n[d.k]) {
      WEIR_TRY(ms, read_duration(v, key + "." + d.k));
      *d.out = ms;
    }
  }
  if (r.max_backoff < r.backoff) {
    // A backoff above the default ceiling, with no max_backoff written, is
    // the ceiling too: the user never wrote the 1s it would contradict.
    if (n["max_backoff"]) return tl::unexpected(config_error(n, key + ".max_backoff", "must not be less than backoff"));
    r.max_backoff = r.backoff;
  }
  if (auto v = n["budget"]) {
    WEIR_TRY(b, read_double(v, key + ".budget", 0.0, 1.0));
    r.budget = b;
  }
  if (auto v = n["min_concurrent"]) {
    WEIR_TRY(i, read_int(v, key + ".min_concurrent", 0, 1'000'000));
    r.min_concurrent = static_cast<std::uint32_t>(i);
  }
  if (auto v = n["response_timeout"]) {
    WEIR_TRY(b, read_bool(v, key + ".response_timeout"));
    r.response_timeout = b;
  }
  return {};
}

// pools.X.outlier (ejection on failures and on TTFT) and pools.X.breaker.
ConfigResult<void> parse_outlier_breaker(const YAML::Node& n, const std::string& key, PoolConfig& p) {
  if (auto o = n["outlier"]) {
    const std::string ok = key + ".outlier";
    WEIR_TRY_VOID(
        check_keys(o, ok, {"consecutive_failures", "max_ejected_percent", "ttft_factor", "ttft_min_samples"}));
    if (auto v = o["consecutive_failures"]) {
      WEIR_TRY(i, read_int(v, ok + ".consecutive_failures", 0, 1'000'000));
      p.outlier.consecutive_failures = static_cast<std::uint32_t>(i);
    }
    if (auto v = o["max_ejected_percent"]) {
      WEIR_TRY(i, read_int(v, ok + ".max_ejected_percent", 0, 100));
      p.outlier.max_ejected_percent = static_cast<std::uint32_t>(i);
    }
    if (auto v = o["ttft_factor"]) {
      WEIR_TRY(d, read_double(v, ok + ".ttft_factor", 0.0, 1000.0));
      if (d != 0 && d <= 1.0) return tl::unexpected(config_error(v, ok + ".ttft_factor", "must be 0 (off) or above 1"));
      p.outlier.ttft_factor = d;
    }
    if (auto v = o["ttft_min_samples"]) {
      // The window holds an endpoint's last 32 samples (routing/health.hpp).
      WEIR_TRY(i, read_int(v, ok + ".ttft_min_samples", 1, 32));
      p.outlier.ttft_min_samples = static_cast<std::uint32_t>(i);
    }
  }
  if (auto b = n["breaker"]) {
    const std::string bk = key + ".breaker";
    if (b.IsScalar()) {
      auto on = read_bool(b, bk);
      if (!on) return tl::unexpected(config_error(b, bk, "expected true, false or {half_open_trials, max_open_for}"));
      p.breaker.enabled = *on;
    } else {
      WEIR_TRY_VOID(check_keys(b, bk, {"half_open_trials", "max_open_for"}));
      p.breaker.enabled = true;
      if (auto v = b["half_open_trials"]) {
        WEIR_TRY(i, read_int(v, bk + ".half_open_trials", 1, 1'000));
        p.breaker.half_open_trials = static_cast<std::uint32_t>(i);
      }
      if (auto v = b["max_open_for"]) {
        WEIR_TRY(ms, read_duration(v, bk + ".max_open_for"));
        if (ms < p.eject_for)
          return tl::unexpected(config_error(v, bk + ".max_open_for", "must not be less than the pool's eject_for"));
        p.breaker.max_open_for = ms;
      }
    }
  }
  return {};
}

// pools.X.queue (after load_metrics: its saturation detector needs the
// scrapes; and after type: an Anthropic pool has none to read).
ConfigResult<void> parse_queue(const YAML::Node& n, const std::string& key, PoolConfig& p) {
  auto q = n["queue"];
  if (!q) return {};
  const std::string qk = key + ".queue";
  if (q.IsScalar()) {
    auto on = read_bool(q, qk);
    if (!on)
      return tl::unexpected(config_error(
          q, qk, "expected true, false or {size, max_concurrent, timeout, shed_status, retry_after, saturation}"));
    p.queue.enabled = *on;
  } else {
    WEIR_TRY_VOID(check_keys(q, qk, {"size", "max_concurrent", "timeout", "shed_status", "retry_after", "saturation"}));
    p.queue.enabled = true;
    if (auto v = q["size"]) {
      WEIR_TRY(i, read_int(v, qk + ".size", 0, 100'000));
      p.queue.size = static_cast<std::uint32_t>(i);
    }
    if (auto v = q["max_concurrent"]) {
      WEIR_TRY(i, read_int(v, qk + ".max_concurrent", 0, 1'000'000));
      p.queue.max_concurrent = static_cast<std::uint32_t>(i);
    }
    if (auto v = q["timeout"]) {
      WEIR_TRY(ms, read_duration(v, qk + ".timeout"));
      if (ms.count() <= 0) return tl::unexpected(config_error(v, qk + ".timeout", "must be positive"));
      p.queue.timeout = ms;
    }
    if (auto v = q["shed_status"]) {
      WEIR_TRY(i, read_int(v, qk + ".shed_status", 0, 999));
      if (i != 429 && i != 503) return tl::unexpected(config_error(v, qk + ".shed_status", "expected 429 or 503"));
      p.queue.shed_status = static_cast<int>(i);
    }
    if (auto v = q["retry_after"]) {
      WEIR_TRY(ms, read_duration(v, qk + ".retry_after"));
      if (ms.count() < 1'000 || ms.count() > 3'600'000)
        return tl::unexpected(config_error(v, qk + ".retry_after", "must be between 1s and 1h"));
      p.queue.retry_after = ms;
    }
    if (auto s = q["saturation"]) {
      const std::string sk = qk + ".saturation";
      if (s.IsScalar()) {
        auto on = read_bool(s, sk);
        if (!on) return tl::unexpected(config_error(s, sk, "expected true, false or {waiting, kv_cache}"));
        p.queue.saturation = *on;
      } else {
        WEIR_TRY_VOID(check_keys(s, sk, {"waiting", "kv_cache"}));
        if (auto v = s["waiting"]) {
          WEIR_TRY(i, read_int(v, sk + ".waiting", 1, 1'000'000));
          p.queue.saturation_waiting = static_cast<std::uint32_t>(i);
        }
        if (auto v = s["kv_cache"]) {
          WEIR_TRY(d, read_double(v, sk + ".kv_cache", 0.01, 1.0));
          p.queue.saturation_kv_cache = d;
        }
      }
    }
  }
  if (p.type == UpstreamType::anthropic) {
    // Anthropic's API publishes no vLLM metrics: there is nothing to read
    // saturation from (and a scrape would carry the pool's key to /metrics).
    if (auto s = q.IsMap() ? q["saturation"] : YAML::Node(); s && p.queue.saturation)
      return tl::unexpected(
          config_error(s, qk + ".saturation", "is not available for type: anthropic (it reads vLLM's /metrics)"));
    p.queue.saturation = false;
  }
  if (p.queue.enabled && p.queue.saturation) {
    // The saturation detector reads the endpoints' /metrics: the scraper must run.
    if (auto m = n["load_metrics"]; m && m.IsScalar() && !p.load_metrics.enabled)
      return tl::unexpected(config_error(m, key + ".load_metrics",
                                         "is off, but queue.saturation reads it (give queue: {saturation: false})"));
    p.load_metrics.enabled = true;
  }
  return {};
}

// pools.X.balance, load_metrics, imbalance, prefix_affinity, session_header.
ConfigResult<void> parse_balance(const YAML::Node& n, const std::string& key, PoolConfig& p) {
  if (auto v = n["balance"]) {
    WEIR_TRY(s, read_string(v, key + ".balance"));
    if (s == "p2c")
      p.balance = Balance::p2c;
    else if (s == "least_load")
      p.balance = Balance::least_load;
    else if (s == "prefix_affinity")
      p.balance = Balance::prefix_affinity;
    else
      return tl::unexpected(config_error(v, key + ".balance", "expected p2c, least_load or prefix_affinity"));
  }
  if (auto v = n["session_header"]) {
    WEIR_TRY(s, read_string(v, key + ".session_header"));
    const bool token = !s.empty() && s.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789!#$%&'*+-.^_`|~") == std::string::npos;
    if (!token)
      return tl::unexpected(config_error(v, key + ".session_header", "must be a header name (RFC 9110 token)"));
    p.session_header = s;
  }
  p.load_metrics.enabled = p.balance != Balance::p2c || !p.session_header.empty();
  if (auto m = n["load_metrics"]) {
    const std::string mk = key + ".load_metrics";
    if (m.IsScalar()) {
      WEIR_TRY(b, read_bool(m, mk));
      p.load_metrics.enabled = b;
    } else {
      WEIR_TRY_VOID(check_keys(m, mk, {"path", "interval", "timeout"}));
      p.load_metrics.enabled = true;
      if (auto v = m["path"]) {
        WEIR_TRY(s, read_string(v, mk + ".path"));
        if (s.empty() || s.front() != '/' || s.find_first_of(" \r\n") != std::string::npos)
          return tl::unexpected(config_error(v, mk + ".path", "must be a path starting with '/'"));
        p.load_metrics.path = s;
      }
      for (auto [k, out] :
           {std::pair{"interval", &p.load_metrics.interval}, std::pair{"timeout", &p.load_metrics.timeout}}) {
        if (auto v = m[k]) {
          WEIR_TRY(ms, read_duration(v, mk + "." + k));
          if (ms.count() <= 0) return tl::unexpected(config_error(v, mk + "." + k, "must be positive"));
          if (std::string_view(k) == "interval" && ms < kMinProbeInterval)
            return tl::unexpected(config_error(
                v, mk + "." + k, "must be at least 10ms (each is a request to every endpoint from every worker)"));
          *out = ms;
        }
      }
    }
  }
  if (auto g = n["imbalance"]) {
    const std::string gk = key + ".imbalance";
    WEIR_TRY_VOID(check_keys(g, gk, {"absolute", "relative"}));
    if (auto v = g["absolute"]) {
      WEIR_TRY(i, read_int(v, gk + ".absolute", 0, 1'000'000));
      p.imbalance.absolute = static_cast<std::uint32_t>(i);
    }
    if (auto v = g["relative"]) {
      WEIR_TRY(d, read_double(v, gk + ".relative", 1.0, 1000.0));
      p.imbalance.relative = d;
    }
  }
  if (auto a = n["prefix_affinity"]) {
    const std::string ak = key + ".prefix_affinity";
    WEIR_TRY_VOID(check_keys(a, ak, {"block_bytes", "max_blocks", "index_entries", "match_threshold"}));
    if (auto v = a["block_bytes"]) {
      WEIR_TRY(i, read_int(v, ak + ".block_bytes", 8, 65'536));
      p.prefix_affinity.block_bytes = static_cast<std::uint32_t>(i);
    }
    if (auto v = a["max_blocks"]) {
      WEIR_TRY(i, read_int(v, ak + ".max_blocks", 1, 4'096));
      p.prefix_affinity.max_blocks = static_cast<std::uint32_t>(i);
    }
    if (auto v = a["index_entries"]) {
      WEIR_TRY(i, read_int(v, ak + ".index_entries", 64, 1 << 28));
      p.prefix_affinity.index_entries = static_cast<std::uint32_t>(i);
    }
    if (auto v = a["match_threshold"]) {
      WEIR_TRY(d, read_double(v, ak + ".match_threshold", 0.0, 1.0));
      p.prefix_affinity.match_threshold = d;
    }
  }
  return {};
}

// tls.server_name as given: a DNS name (LDH labels, '_' tolerated), its
// trailing dot dropped (a fully qualified name is the same host; RFC 6066
// §3 sends none in SNI), or an IP address (an IPv6 one also in brackets),
// kept without brackets: verified against the IP SANs, no SNI. Empty when
// it is neither (a wildcard, an empty label, a port, a space).
std::string parse_server_name(std::string_view s) {
  if (s.size() > 2 && s.front() == '[' && s.back() == ']' && parse_ip(s)) return std::string(s.substr(1, s.size() - 2));
  if (parse_ip(s)) return std::string(s);
  if (!s.empty() && s.back() == '.') s.remove_suffix(1);
  if (s.empty() || s.size() > 253) return std::string();
  for (std::string_view rest = s; !rest.empty();) {
    const auto dot = rest.find('.');
    const std::string_view label = rest.substr(0, dot);
    if (label.empty() || label.size() > 63) return std::string();
    for (const char c : label)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return std::string();
    if (dot == std::string_view::npos) break;
    rest = rest.substr(dot + 1);
    if (rest.empty()) return std::string();  // ("a..": two dots at the end)
  }
  return std::string(s);
}

// A file the process must be able to read at start-up.
ConfigResult<void> check_readable(const YAML::Node& v, const std::string& key, const std::string& path) {
  if (auto why = unreadable_file(path); !why.empty())
    return tl::unexpected(config_error(v, key, fmt::format("{} {}", quoted_text(path, kQuotedPathBytes), why)));
  return {};
}

ConfigResult<void> parse_tls(const YAML::Node& t, const std::string& key, TlsConfig& tls) {
  WEIR_TRY_VOID(check_keys(t, key, {"ca_file", "verify", "server_name", "client_cert", "client_key"}));
  if (auto v = t["ca_file"]) {
    WEIR_TRY(s, read_string(v, key + ".ca_file"));
    WEIR_TRY_VOID(check_readable(v, key + ".ca_file", s));
    tls.ca_file = s;
  }
  if (auto v = t["verify"]) {
    WEIR_TRY(b, read_bool(v, key + ".verify"));
    tls.verify = b;
  }
  if (auto v = t["server_name"]) {
    WEIR_TRY(s, read_string(v, key + ".server_name"));
    std::string name = parse_server_name(s);
    if (name.empty())
      return tl::unexpected(config_error(
          v, key + ".server_name",
          s.find('*') != std::string::npos
              ? "expected a host name, not a wildcard (a certificate's pattern is matched against the name given)"
              : "expected a host name (letters, digits, '-', '_' and '.') or an IP address"));
    tls.server_name = std::move(name);
  }
  if (auto v = t["client_cert"]) {
    WEIR_TRY(s, read_string(v, key + ".client_cert"));
    WEIR_TRY_VOID(check_readable(v, key + ".client_cert", s));
    tls.client_cert = s;
  }
  if (auto v = t["client_key"]) {
    WEIR_TRY(s, read_string(v, key + ".client_key"));
    WEIR_TRY_VOID(check_readable(v, key + ".client_key", s));
    tls.client_key = s;
  }
  if (tls.client_cert.empty() != tls.client_key.empty())
    return tl::unexpected(config_error(t, key, "client_cert and client_key go together (mutual TLS)"));
  return {};
}

// A pool's `anthropic:` section (type: anthropic only), its checks against
// the pool's other settings, and the header lines every request to the pool
// carries (PoolConfig::upstream_lines).
ConfigResult<void> parse_anthropic_upstream(const YAML::Node& n, const std::string& key, PoolConfig& p) {
  const bool anthropic = p.type == UpstreamType::anthropic;
  if (auto a = n["anthropic"]) {
    if (!anthropic)
      return tl::unexpected(config_error(a, key + ".anthropic", "is only for pools with type: anthropic"));
    WEIR_TRY_VOID(check_keys(a, key + ".anthropic", {"version", "max_tokens"}));
    if (auto v = a["version"]) {
      WEIR_TRY(s, read_string(v, key + ".anthropic.version"));
      if (!field_value_ok(s))
        return tl::unexpected(
            config_error(v, key + ".anthropic.version", "expected an anthropic-version value such as 2023-06-01"));
      p.anthropic.version = s;
    }
    if (auto v = a["max_tokens"]) {
      WEIR_TRY(i, read_int(v, key + ".anthropic.max_tokens", 1, 1'000'000));
      p.anthropic.max_tokens = static_cast<std::uint32_t>(i);
    }
  }
  if (!p.api_key.empty() && !field_value_ok(p.api_key))
    return tl::unexpected(config_error(n[p.api_key_env.empty() ? "api_key" : "api_key_env"],
                                       key + (p.api_key_env.empty() ? ".api_key" : ".api_key_env"),
                                       "the key has characters an HTTP header cannot carry (spaces at its ends, "
                                       "control characters or non-ASCII)"));
  if (anthropic) {
    // Micro-batching and coalescing merge OpenAI bodies; Anthropic's Messages API takes neither.
    if (n["batch"])
      return tl::unexpected(config_error(n["batch"], key + ".batch", "is not available for type: anthropic"));
    if (p.coalesce)
      return tl::unexpected(config_error(n["coalesce"], key + ".coalesce", "is not available for type: anthropic"));
    // A continuation is vLLM's continue_final_message: Anthropic's API has no such parameter on this path.
    if (p.resume)
      return tl::unexpected(config_error(n["resume"], key + ".resume", "is not available for type: anthropic"));
    if (!p.api_key.empty()) p.upstream_lines = fmt::format("x-api-key: {}\r\n", p.api_key);
    p.upstream_lines += fmt::format("anthropic-version: {}\r\n", p.anthropic.version);
  } else if (!p.api_key.empty()) {
    p.upstream_lines = fmt::format("Authorization: Bearer {}\r\n", p.api_key);
  }
  return {};
}

}  // namespace

ConfigResult<PoolConfig> parse_pool(const std::string& name, const YAML::Node& n) {
  const std::string key = "pools." + name;
  PoolConfig p;
  p.name = name;
  WEIR_TRY_VOID(check_keys(n, key,
                           {"endpoints",
                            "timeouts",
                            "max_idle_per_endpoint",
                            "idle_keepalive",
                            "api_key",
                            "api_key_env",
                            "eject_for",
                            "request_usage",
                            "retry",
                            "outlier",
                            "breaker",
                            "queue",
                            "health",
                            "balance",
                            "load_metrics",
                            "imbalance",
                            "prefix_affinity",
                            "session_header",
                            "batch",
                            "coalesce",
                            "resume",
                            "type",
                            "anthropic",
                            "tls",
                            "continuous_usage"}));
  auto eps = n["endpoints"];
  if (!eps)
    return tl::unexpected(config_error(n, key + ".endpoints", "is required (a list of http:// or https:// URLs)"));
  if (!eps.IsSequence() || eps.size() == 0)
    return tl::unexpected(
        config_error(eps, key + ".endpoints", "expected a non-empty list of http:// or https:// URLs"));
  for (std::size_t i = 0; i < eps.size(); ++i) {
    const std::string k = fmt::format("{}.endpoints[{}]", key, i);
    WEIR_TRY(url, read_string(eps[i], k));
    auto ep = parse_endpoint_url(url);
    if (!ep) return tl::unexpected(config_error(eps[i], k, ep.error().message));
    if (eps[i].Mark().line >= 0) {
      ep->line = eps[i].Mark().line + 1;
      ep->column = eps[i].Mark().column + 1;
    }
    // Each endpoint once: logs, /metrics and the admin API name an endpoint
    // by its (redacted) URL, and two of one name would be two series of one
    // name (Prometheus' exposition format: undefined).
    // One server, however written: "http://h:8000" and "http://h:8000/", "http://H" and "http://h:80" are
    // one endpoint (the same address, path and query), which would take twice its share of the traffic.
    const auto same = [&](const EndpointConfig& a) {
      return a.tls == ep->tls && canonical_host(a.host) == canonical_host(ep->host) && a.port == ep->port &&
             canonical_path(a.base_path) == canonical_path(ep->base_path) &&
             canonical_path(a.query) == canonical_path(ep->query);
    };
    // (Compared as written, never by the redacted display: "?session=a" and "?session=b" are two endpoints.)
    for (std::size_t j = 0; j < p.endpoints.size(); ++j)
      if (same(p.endpoints[j]))
        return tl::unexpected(config_error(eps[i], k,
                                           fmt::format("is {}.endpoints[{}] again ({}): list each endpoint once", key,
                                                       j, quoted_text(ep->display, kQuotedPathBytes))));
    // Two endpoints that differ only in a redacted secret would show one name (logs, /metrics, the admin
    // API): the later one's display takes its index as a fragment ("...?session=REDACTED#1"; an endpoint
    // URL has no fragment of its own, and it is never sent), so each name is one endpoint's.
    if (std::any_of(p.endpoints.begin(), p.endpoints.end(),
                    [&](const EndpointConfig& e) { return e.display == ep->display; }))
      ep->display = fmt::format("{}#{}", ep->display, i);
    p.endpoints.push_back(std::move(*ep));
  }
  if (auto t = n["timeouts"]) {
    WEIR_TRY_VOID(check_keys(t, key + ".timeouts", {"connect", "first_byte", "response", "idle", "first_token"}));
    struct D {
      const char* k;
      Millis* out;
    };
    for (D d : {D{"connect", &p.timeouts.connect}, D{"first_byte", &p.timeouts.first_byte},
                D{"response", &p.timeouts.response}, D{"idle", &p.timeouts.idle}}) {
      if (auto v = t[d.k]) {
        WEIR_TRY(ms, read_duration(v, key + ".timeouts." + d.k));
        if (ms.count() <= 0) return tl::unexpected(config_error(v, key + ".timeouts." + d.k, "must be positive"));
        *d.out = ms;
      }
    }
    if (auto v = t["first_token"]) {
      WEIR_TRY(ms, read_duration(v, key + ".timeouts.first_token"));
      if (ms.count() < 0)
        return tl::unexpected(config_error(v, key + ".timeouts.first_token", "must be 0 (off) or positive"));
      p.timeouts.first_token = ms;
    }
    // A pool that sets first_byte and not response bounds every head by first_byte, as before response existed.
    if (t["first_byte"] && !t["response"]) p.timeouts.response = p.timeouts.first_byte;
  }
  if (auto v = n["max_idle_per_endpoint"]) {
    WEIR_TRY(i, read_int(v, key + ".max_idle_per_endpoint", 0, 1'000'000));
    p.max_idle_per_endpoint = static_cast<std::uint32_t>(i);
  }
  if (auto v = n["idle_keepalive"]) {
    WEIR_TRY(ms, read_duration(v, key + ".idle_keepalive"));
    p.idle_keepalive = ms;
  }
  if (auto v = n["eject_for"]) {
    WEIR_TRY(ms, read_duration(v, key + ".eject_for"));
    // 0 would open an endpoint's breaker "until now": ejection silently off. (outlier and health: off there.)
    if (ms.count() <= 0) return tl::unexpected(config_error(v, key + ".eject_for", "must be positive"));
    p.eject_for = ms;
  }
  if (auto v = n["request_usage"]) {
    WEIR_TRY(b, read_bool(v, key + ".request_usage"));
    p.request_usage = b;
  }
  if (auto r = n["retry"]) WEIR_TRY_VOID(parse_retry(r, key + ".retry", p.retry));
  if (auto h = n["health"]) {
    const std::string hk = key + ".health";
    WEIR_TRY_VOID(check_keys(h, hk, {"path", "interval", "timeout", "unhealthy_after"}));
    p.health.enabled = true;
    if (auto v = h["path"]) {
      WEIR_TRY(s, read_string(v, hk + ".path"));
      if (s.empty() || s.front() != '/' || s.find_first_of(" \r\n") != std::string::npos)
        return tl::unexpected(config_error(v, hk + ".path", "must be a path starting with '/'"));
      p.health.path = s;
    }
    for (auto [k, out] : {std::pair{"interval", &p.health.interval}, std::pair{"timeout", &p.health.timeout}}) {
      if (auto v = h[k]) {
        WEIR_TRY(ms, read_duration(v, hk + "." + k));
        if (ms.count() <= 0) return tl::unexpected(config_error(v, hk + "." + k, "must be positive"));
        if (std::string_view(k) == "interval" && ms < kMinProbeInterval)
          return tl::unexpected(config_error(
              v, hk + "." + k, "must be at least 10ms (each is a request to every endpoint from every worker)"));
        *out = ms;
      }
    }
    if (auto v = h["unhealthy_after"]) {
      WEIR_TRY(i, read_int(v, hk + ".unhealthy_after", 1, 1'000));
      p.health.unhealthy_after = static_cast<std::uint32_t>(i);
    }
  }
  if (auto v = n["coalesce"]) {
    WEIR_TRY(b, read_bool(v, key + ".coalesce"));
    p.coalesce = b;
  }
  if (auto v = n["resume"]) {
    WEIR_TRY(b, read_bool(v, key + ".resume"));
    p.resume = b;
  }
  if (auto b = n["batch"]) {
    const std::string bk = key + ".batch";
    WEIR_TRY_VOID(check_keys(b, bk, {"window", "max_size"}));
    if (auto v = b["window"]) {
      WEIR_TRY(ms, read_duration(v, bk + ".window"));
      if (ms.count() < 0 || ms.count() > 1'000)
        return tl::unexpected(config_error(v, bk + ".window", "must be between 0 (off) and 1s"));
      p.batch.window = ms;
    } else {
      p.batch.window = Millis{5};
    }
    if (auto v = b["max_size"]) {
      WEIR_TRY(i, read_int(v, bk + ".max_size", 2, 256));
      p.batch.max_size = static_cast<std::uint32_t>(i);
    }
  }
  WEIR_TRY_VOID(parse_balance(n, key, p));
  WEIR_TRY_VOID(parse_outlier_breaker(n, key, p));
  if (auto v = n["api_key"]) {
    WEIR_TRY(s, read_string(v, key + ".api_key"));
    // Empty is none, as an empty api_key_env: the pool would forward the client's credential to the provider.
    if (s.empty())
      return tl::unexpected(config_error(v, key + ".api_key", "is empty (leave it out for a pool without a key)"));
    p.api_key = s;
  }
  if (auto v = n["api_key_env"]) {
    WEIR_TRY(s, read_string(v, key + ".api_key_env"));
    if (n["api_key"])
      return tl::unexpected(config_error(v, key + ".api_key_env", "give one of api_key and api_key_env, not both"));
    const char* env = std::getenv(s.c_str());
    // Empty is unset: a pool without its key would forward the client's credential to the provider.
    if (!env || !*env)
      return tl::unexpected(config_error(v, key + ".api_key_env",
                                         fmt::format("environment variable {} is not set (or empty)", quoted_text(s))));
    p.api_key = env;
    p.api_key_env = s;
  }
  if (auto v = n["type"]) {
    WEIR_TRY(s, read_string(v, key + ".type"));
    if (s == "anthropic")
      p.type = UpstreamType::anthropic;
    else if (s == "openai")
      p.type = UpstreamType::openai;
    else
      return tl::unexpected(config_error(v, key + ".type", "expected openai or anthropic"));
  }
  // (auto: every endpoint http://, the self-hosted servers that read or ignore it; an https:// one may be a
  // hosted API, which refuses a field it does not know.)
  p.continuous_usage = std::none_of(p.endpoints.begin(), p.endpoints.end(), [](const auto& e) { return e.tls; });
  if (auto v = n["continuous_usage"]) {
    bool b = false;
    if (v.IsScalar() && YAML::convert<bool>::decode(v, b))
      p.continuous_usage = b;
    else if (!v.IsScalar() || v.Scalar() != "auto")
      return tl::unexpected(config_error(v, key + ".continuous_usage", "expected auto, true or false"));
  }
  if (p.type == UpstreamType::anthropic) p.continuous_usage = false;  // (its events carry usage anyway)
  WEIR_TRY_VOID(parse_queue(n, key, p));
  WEIR_TRY_VOID(parse_anthropic_upstream(n, key, p));
  if (auto t = n["tls"]) {
    WEIR_TRY_VOID(parse_tls(t, key + ".tls", p.tls));
    bool any_tls = false;
    for (const auto& e : p.endpoints) any_tls = any_tls || e.tls;
    if (!any_tls)
      return tl::unexpected(config_error(t, key + ".tls", "is set but no endpoint of the pool is https://"));
  }
  return p;
}

}  // namespace weir::core
