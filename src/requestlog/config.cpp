#include "requestlog/config.hpp"

#include <sys/stat.h>

#include <fmt/format.h>

#include "core/url.hpp"
#include "requestlog/postgres.hpp"

namespace weir::requestlog {

namespace {

using core::config_error;
using core::ConfigResult;

ConfigResult<RequestLogConfig> parse_impl(const YAML::Node& n) {
  RequestLogConfig c;
  if (!n.IsMap()) return tl::unexpected(config_error(n, "request_log", "expected a mapping (url, queue, batch, ...)"));
  WEIR_TRY_VOID(core::check_keys(
      n, "request_log", {"url", "queue", "batch", "flush_interval", "retention", "capture_bodies", "priority"}));
  if (!n["url"])
    return tl::unexpected(
        config_error(n, "request_log.url", "missing (sqlite:/path/requests.db or postgres://user@host/db)"));
  WEIR_TRY(url, core::read_string(n["url"], "request_log.url"));
  if (url.starts_with("postgres://") || url.starts_with("postgresql://")) {
    // libpq reads the URI itself (https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-CONNSTRING-URIS);
    // here only what would make every connection fail for sure.
    const auto rest = std::string_view(url).substr(url.find("://") + 3);
    if (rest.find_first_of(" \t\r\n") != std::string_view::npos)
      return tl::unexpected(config_error(n["url"], "request_log.url", "the URL must not hold spaces or line breaks"));
    // What libpq itself refuses (parsed as it parses it: a bad port, sslmode=, an unknown parameter) is a
    // mistake found here and by --check, not a store retried in vain every second.
    if (const std::string problem = postgres_url_problem(url); !problem.empty())
      return tl::unexpected(
          config_error(n["url"], "request_log.url", fmt::format("libpq cannot connect with this URL: {}", problem)));
    c.kind = StoreKind::postgres;
    c.url = url;
    c.display = core::redact_url(url);
  } else if (url.starts_with("sqlite:")) {
    std::string path = url.substr(7);
    // sqlite:///abs/path (URI style) and sqlite:/abs/path are the same file.
    if (path.starts_with("///")) path.erase(0, 2);
    if (path.empty() || path.back() == '/')
      return tl::unexpected(config_error(n["url"], "request_log.url", "expected a file path after sqlite:"));
    // A directory that does not exist is a mistake caught here (and by --check);
    // one that exists but is not writable is found at start-up, and counted.
    const auto slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return tl::unexpected(
          config_error(n["url"], "request_log.url",
                       fmt::format("directory {} does not exist", core::quoted_text(dir, core::kQuotedPathBytes))));
    // So is a path that names something other than a file (a directory, a pipe): no retry opens it.
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      return tl::unexpected(
          config_error(n["url"], "request_log.url",
                       fmt::format("{} is not a file (a directory or a device): name the database "
                                   "file, e.g. {}",
                                   core::quoted_text(path, core::kQuotedPathBytes),
                                   core::quoted_text(path + "/requests.db", core::kQuotedPathBytes))));
    c.url = url;
    c.path = path;
    c.display = path;
  } else {
    return tl::unexpected(
        config_error(n["url"], "request_log.url", "expected sqlite:/path/requests.db or postgres://user@host/db"));
  }
  if (auto v = n["queue"]) {
    WEIR_TRY(i, core::read_int(v, "request_log.queue", 16, 1 << 20));
    c.queue = static_cast<std::uint32_t>(i);
  }
  if (auto v = n["batch"]) {
    WEIR_TRY(i, core::read_int(v, "request_log.batch", 1, 100'000));
    c.batch = static_cast<std::uint32_t>(i);
  }
  if (auto v = n["flush_interval"]) {
    WEIR_TRY(ms, core::read_duration(v, "request_log.flush_interval"));
    if (ms.count() < 1 || ms.count() > 10'000)
      return tl::unexpected(config_error(v, "request_log.flush_interval", "must be between 1ms and 10s"));
    c.flush_interval = ms;
  }
  if (auto v = n["priority"]) {
    WEIR_TRY(i, core::read_choice(v, "request_log.priority", {"idle", "normal"}));
    c.priority = i == 0 ? core::BatchThread::Priority::idle : core::BatchThread::Priority::normal;
  }
  if (auto r = n["retention"]) {
    if (!r.IsMap())
      return tl::unexpected(config_error(r, "request_log.retention", "expected a mapping (max_age, max_rows)"));
    WEIR_TRY_VOID(core::check_keys(r, "request_log.retention", {"max_age", "max_rows", "interval"}));
    if (auto v = r["max_age"]) {
      WEIR_TRY(ms, core::read_duration(v, "request_log.retention.max_age"));
      c.max_age = ms;
    }
    if (auto v = r["max_rows"]) {
      WEIR_TRY(i, core::read_int(v, "request_log.retention.max_rows", 0, std::int64_t{1} << 40));
      c.max_rows = static_cast<std::uint64_t>(i);
    }
    if (auto v = r["interval"]) {
      WEIR_TRY(ms, core::read_duration(v, "request_log.retention.interval"));
      if (ms.count() < 100)
        return tl::unexpected(config_error(v, "request_log.retention.interval", "must be at least 100ms"));
      c.retention_interval = ms;
    }
  }
  if (auto b = n["capture_bodies"]) {
    if (!b.IsMap())
      return tl::unexpected(config_error(b, "request_log.capture_bodies",
                                         "expected a mapping (tenants, max_request_bytes, max_response_bytes)"));
    WEIR_TRY_VOID(
        core::check_keys(b, "request_log.capture_bodies", {"tenants", "max_request_bytes", "max_response_bytes"}));
    CaptureConfig cap;
    const YAML::Node t = b["tenants"];
    if (!t || !t.IsSequence() || t.size() == 0)
      return tl::unexpected(config_error(t ? t : b, "request_log.capture_bodies.tenants",
                                         "expected a list of tenant names (or [\"*\"] for every tenant)"));
    for (std::size_t i = 0; i < t.size(); ++i) {
      const std::string key = fmt::format("request_log.capture_bodies.tenants[{}]", i);
      WEIR_TRY(name, core::read_name(t[i], key));
      if (name.empty()) return tl::unexpected(config_error(t[i], key, "must not be empty"));
      if (name == "*")
        cap.all = true;
      else
        cap.tenants.push_back(std::move(name));
    }
    for (auto [field, out] : {std::pair{"max_request_bytes", &cap.max_request_bytes},
                              std::pair{"max_response_bytes", &cap.max_response_bytes}}) {
      if (auto v = b[field]) {
        const std::string key = std::string("request_log.capture_bodies.") + field;
        WEIR_TRY(bytes, core::read_bytes(v, key));
        if (bytes < 1 || bytes > (16u << 20))
          return tl::unexpected(config_error(v, key, "must be between 1 byte and 16MiB"));
        *out = bytes;
      }
    }
    c.capture = std::move(cap);
  }
  return c;
}

}  // namespace

ConfigResult<std::optional<RequestLogConfig>> parse_request_log_config(const YAML::Node& root,
                                                                       const std::string& file) {
  const YAML::Node n = root["request_log"];
  if (!n) return std::optional<RequestLogConfig>{};
  auto c = parse_impl(n);
  if (!c) {
    auto e = std::move(c.error());
    e.file = file;
    return tl::unexpected(std::move(e));
  }
  return std::optional<RequestLogConfig>(std::move(*c));
}

}  // namespace weir::requestlog
