#include "requestlog/postgres.hpp"

#include <libpq-fe.h>

#include <charconv>
#include <cstdint>
#include <initializer_list>

#include <fmt/format.h>

#include "core/dynamic_library.hpp"
#include "core/url.hpp"
#include "requestlog/backend.hpp"

namespace weir::requestlog {

namespace {

// libpq is loaded when a PostgreSQL store is first connected, not linked:
// it brings about twenty libraries (Kerberos, LDAP, GnuTLS, …) whose
// loading and initialisation add ~5 MiB to every Weir's resident set,
// also to the many that never use PostgreSQL.
struct Libpq {
  decltype(&::PQclear) PQclear = nullptr;
  decltype(&::PQcmdTuples) PQcmdTuples = nullptr;
  decltype(&::PQconnectdbParams) PQconnectdbParams = nullptr;
  decltype(&::PQconninfoFree) PQconninfoFree = nullptr;
  decltype(&::PQconninfoParse) PQconninfoParse = nullptr;
  decltype(&::PQerrorMessage) PQerrorMessage = nullptr;
  decltype(&::PQexec) PQexec = nullptr;
  decltype(&::PQexecParams) PQexecParams = nullptr;
  decltype(&::PQfinish) PQfinish = nullptr;
  decltype(&::PQfreemem) PQfreemem = nullptr;
  decltype(&::PQgetResult) PQgetResult = nullptr;
  decltype(&::PQgetisnull) PQgetisnull = nullptr;
  decltype(&::PQgetlength) PQgetlength = nullptr;
  decltype(&::PQgetvalue) PQgetvalue = nullptr;
  decltype(&::PQntuples) PQntuples = nullptr;
  decltype(&::PQputCopyData) PQputCopyData = nullptr;
  decltype(&::PQputCopyEnd) PQputCopyEnd = nullptr;
  decltype(&::PQresultErrorField) PQresultErrorField = nullptr;
  decltype(&::PQresultErrorMessage) PQresultErrorMessage = nullptr;
  decltype(&::PQresultStatus) PQresultStatus = nullptr;
  decltype(&::PQsetClientEncoding) PQsetClientEncoding = nullptr;
  decltype(&::PQsetNoticeProcessor) PQsetNoticeProcessor = nullptr;
  decltype(&::PQstatus) PQstatus = nullptr;
  std::string error;  // why it could not be loaded; empty when loaded
};

const Libpq& libpq() {
  static const Libpq lib = [] {
    Libpq l;
    core::DynamicLibrary so("libpq.so.5", "the PostgreSQL client library (libpq.so.5, Debian package libpq5)");
    so.load(l.PQclear, "PQclear");
    so.load(l.PQcmdTuples, "PQcmdTuples");
    so.load(l.PQconnectdbParams, "PQconnectdbParams");
    so.load(l.PQconninfoFree, "PQconninfoFree");
    so.load(l.PQconninfoParse, "PQconninfoParse");
    so.load(l.PQerrorMessage, "PQerrorMessage");
    so.load(l.PQexec, "PQexec");
    so.load(l.PQexecParams, "PQexecParams");
    so.load(l.PQfinish, "PQfinish");
    so.load(l.PQfreemem, "PQfreemem");
    so.load(l.PQgetResult, "PQgetResult");
    so.load(l.PQgetisnull, "PQgetisnull");
    so.load(l.PQgetlength, "PQgetlength");
    so.load(l.PQgetvalue, "PQgetvalue");
    so.load(l.PQntuples, "PQntuples");
    so.load(l.PQputCopyData, "PQputCopyData");
    so.load(l.PQputCopyEnd, "PQputCopyEnd");
    so.load(l.PQresultErrorField, "PQresultErrorField");
    so.load(l.PQresultErrorMessage, "PQresultErrorMessage");
    so.load(l.PQresultStatus, "PQresultStatus");
    so.load(l.PQsetClientEncoding, "PQsetClientEncoding");
    so.load(l.PQsetNoticeProcessor, "PQsetNoticeProcessor");
    so.load(l.PQstatus, "PQstatus");
    l.error = so.error();
    return l;
  }();
  return lib;
}

// libpq's messages end in a newline and may span lines: one line for logs.
std::string one_line(const char* msg) {
  std::string s = msg ? msg : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  for (char& c : s)
    if (c == '\n') c = ' ';
  return s.empty() ? std::string("unknown error") : s;
}

// The password in a postgres:// URL's userinfo (as written), empty when none.
std::string url_password(std::string_view url) {
  const auto scheme = url.find("://");
  if (scheme == std::string_view::npos) return {};
  std::string_view rest = url.substr(scheme + 3);
  rest = rest.substr(0, rest.find_first_of("/?#"));
  const auto at = rest.rfind('@');
  if (at == std::string_view::npos) return {};
  const auto colon = rest.substr(0, at).find(':');
  return colon == std::string_view::npos ? std::string() : std::string(rest.substr(colon + 1, at - colon - 1));
}

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS requests (
  id BIGSERIAL PRIMARY KEY,
  ts_us BIGINT NOT NULL,
  request_id TEXT NOT NULL,
  tenant TEXT,
  key_id TEXT,
  model TEXT,
  status INTEGER NOT NULL,
  record TEXT NOT NULL,
  bodies TEXT
);
ALTER TABLE requests ADD COLUMN IF NOT EXISTS bodies TEXT;
CREATE INDEX IF NOT EXISTS requests_ts ON requests (ts_us, id);
CREATE INDEX IF NOT EXISTS requests_tenant ON requests (tenant, ts_us, id);
CREATE INDEX IF NOT EXISTS requests_key_id ON requests (key_id, ts_us, id);
CREATE INDEX IF NOT EXISTS requests_model ON requests (model, ts_us, id);
CREATE INDEX IF NOT EXISTS requests_status ON requests (status, ts_us, id);
CREATE INDEX IF NOT EXISTS requests_request_id ON requests (request_id);
)sql";

// Replicas that start at once must not race on CREATE TABLE (its catalog rows
// are unique): the schema is made under a transaction-scoped advisory lock.
constexpr const char* kSchemaLock = "SELECT pg_advisory_xact_lock(7310593958240105273)";  // "weir.requests" hashed

class PostgresBackend final : public StoreBackend {
 public:
  explicit PostgresBackend(const RequestLogConfig& c) : url_(c.url) {}

  bool open(std::string& error) override {
    close();
    if (!conn_.connect(url_, error)) return false;
    for (const char* sql : {"BEGIN", kSchemaLock, kSchema, "COMMIT"}) {
      PgResult r = conn_.exec(sql);
      if (!r.ok()) {
        error = fmt::format("schema: {}", r.error());
        close();
        return false;
      }
    }
    return true;
  }

  bool is_open() const override { return static_cast<bool>(conn_); }
  void close() override { conn_.close(); }

  bool begin(std::string& error) override {
    (void)error;
    copy_.clear();
    return true;
  }

  bool add(const Record& r, std::string_view bodies, std::string& error) override {
    (void)error;
    // One line of COPY's text format: fields split by tabs, \N for NULL.
    fmt::format_to(std::back_inserter(copy_), "{}\t", r.ts_us);
    append_copy_text(copy_, r.request_id);
    for (const std::string* col : {&r.tenant, &r.key_id, &r.model}) {
      copy_ += '\t';
      if (col->empty())
        copy_ += "\\N";
      else
        append_copy_text(copy_, *col);
    }
    fmt::format_to(std::back_inserter(copy_), "\t{}\t", r.status);
    append_copy_text(copy_, r.json);
    copy_ += '\t';
    if (bodies.empty())
      copy_ += "\\N";
    else
      append_copy_text(copy_, bodies);
    copy_ += '\n';
    return true;
  }

  bool commit(std::string& error) override {
    // One COPY per batch: a single statement, so the batch is stored whole or not at all.
    constexpr const char* kCopy =
        "COPY requests (ts_us, request_id, tenant, key_id, model, status, record, bodies) FROM STDIN";
    PgResult start(libpq().PQexec(conn_.get(), kCopy));
    if (libpq().PQresultStatus(start.get()) != PGRES_COPY_IN && !conn_.healthy() && conn_) {
      // The server had closed the connection while it was idle (a restart, idle_session_timeout,
      // pg_terminate_backend, a pooler's idle timeout): COPY never started, so no row of the batch was sent.
      // Connected again, the batch is copied once more rather than lost.
      const std::string lost = start.get() ? start.error() : conn_.error();
      std::string why;
      if (!open(why)) {
        error = fmt::format("COPY: {}; connecting again: {}", lost, why);
        return false;
      }
      start = PgResult(libpq().PQexec(conn_.get(), kCopy));
    }
    if (libpq().PQresultStatus(start.get()) != PGRES_COPY_IN) {
      error = fmt::format("COPY: {}", start.get() ? start.error() : conn_.error());
      return false;
    }
    if (libpq().PQputCopyData(conn_.get(), copy_.data(), static_cast<int>(copy_.size())) != 1 ||
        libpq().PQputCopyEnd(conn_.get(), nullptr) != 1) {
      error = fmt::format("COPY: {}", conn_.error());
      drain_results();
      return false;
    }
    bool ok = true;
    while (pg_result* raw = libpq().PQgetResult(conn_.get())) {
      PgResult r(raw);
      if (ok && libpq().PQresultStatus(raw) != PGRES_COMMAND_OK) {
        error = fmt::format("COPY: {}", r.error());
        ok = false;
      }
    }
    if (copy_.capacity() > (8u << 20)) std::string().swap(copy_);
    return ok;
  }

  void rollback() override { copy_.clear(); }

  std::int64_t delete_older(std::int64_t cutoff_us, std::string& error) override {
    const std::string arg = std::to_string(cutoff_us);
    return delete_chunked(
        "DELETE FROM requests WHERE id IN (SELECT id FROM requests WHERE ts_us < $1::bigint LIMIT 10000)", arg, error);
  }

  std::int64_t keep_newest(std::uint64_t max_rows, std::string& error) override {
    const std::string n = std::to_string(max_rows);
    PgResult r = exec("SELECT id FROM requests ORDER BY id DESC LIMIT 1 OFFSET $1::bigint", {n.c_str()});
    if (!r.ok()) {
      error = fmt::format("retention: {}", r.error());
      return 0;
    }
    if (r.rows() == 0) return 0;
    const std::string cut = std::to_string(r.int64(0, 0));
    return delete_chunked(
        "DELETE FROM requests WHERE id IN (SELECT id FROM requests WHERE id <= $1::bigint ORDER BY id LIMIT 10000)",
        cut, error);
  }

 private:
  // conn_.exec(), run once more on a new connection when it failed because the server had closed this one
  // (retention's statements: each may run twice). A failure to connect again closes the store (reopened
  // before the next batch); the first result is returned then.
  PgResult exec(const char* sql, const std::vector<const char*>& params) {
    PgResult r = conn_.exec(sql, params);
    if (r.ok() || !conn_ || conn_.healthy()) return r;
    std::string why;
    if (!open(why)) return r;
    return conn_.exec(sql, params);
  }

  void drain_results() {
    while (pg_result* raw = libpq().PQgetResult(conn_.get())) libpq().PQclear(raw);
  }

  std::int64_t delete_chunked(const char* sql, const std::string& arg, std::string& error) {
    std::int64_t total = 0;
    for (;;) {
      PgResult r = exec(sql, {arg.c_str()});
      if (!r.ok()) {
        error = fmt::format("retention: {}", r.error());
        return total;
      }
      std::int64_t n = 0;
      const char* tuples = libpq().PQcmdTuples(r.get());
      std::from_chars(tuples, tuples + std::char_traits<char>::length(tuples), n);
      total += n;
      if (n < kRetentionChunk) return total;
    }
  }

  std::string url_;
  PgConn conn_;
  std::string copy_;  // the batch's COPY data
};

}  // namespace

PgResult& PgResult::operator=(PgResult&& o) noexcept {
  if (this != &o) {
    if (r_) libpq().PQclear(r_);
    r_ = o.r_;
    o.r_ = nullptr;
  }
  return *this;
}

PgResult::~PgResult() {
  if (r_) libpq().PQclear(r_);
}

bool PgResult::ok() const {
  const auto s = libpq().PQresultStatus(r_);
  return r_ && (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK);
}

int PgResult::rows() const { return r_ ? libpq().PQntuples(r_) : 0; }

bool PgResult::is_null(int row, int col) const { return libpq().PQgetisnull(r_, row, col) != 0; }

std::string_view PgResult::text(int row, int col) const {
  if (is_null(row, col)) return {};
  return {libpq().PQgetvalue(r_, row, col), static_cast<std::size_t>(libpq().PQgetlength(r_, row, col))};
}

std::int64_t PgResult::int64(int row, int col) const {
  const std::string_view t = text(row, col);
  std::int64_t v = 0;
  std::from_chars(t.data(), t.data() + t.size(), v);
  return v;
}

std::string PgResult::error() const {
  if (!r_) return "no result";
  // Severity and message, not DETAIL or CONTEXT: a constraint's DETAIL quotes the failing row ("Failing row
  // contains (…)": a record, a prompt) and COPY's CONTEXT a line's value, which stderr must not carry.
  const char* severity = libpq().PQresultErrorField(r_, PG_DIAG_SEVERITY);
  const char* primary = libpq().PQresultErrorField(r_, PG_DIAG_MESSAGE_PRIMARY);
  if (!primary) return one_line(libpq().PQresultErrorMessage(r_));
  return one_line(fmt::format("{}:  {}", severity ? severity : "ERROR", primary).c_str());
}

PgConn& PgConn::operator=(PgConn&& o) noexcept {
  if (this != &o) {
    close();
    c_ = o.c_;
    o.c_ = nullptr;
  }
  return *this;
}

PgConn::~PgConn() { close(); }

void PgConn::close() {
  if (c_) libpq().PQfinish(c_);
  c_ = nullptr;
}

bool PgConn::connect(const std::string& url, std::string& error) {
  close();
  if (!libpq().error.empty()) {
    error = libpq().error;
    return false;
  }
  // Defaults first: keywords in the URL (expanded from dbname) come after, so they win.
  // tcp_user_timeout (ms): a server that stops acknowledging fails a send within 10 s, not the kernel's minutes.
  const char* keys[] = {"connect_timeout",  "application_name", "keepalives", "keepalives_idle",
                        "tcp_user_timeout", "dbname",           nullptr};
  const char* values[] = {"5", "weir", "1", "30", "10000", url.c_str(), nullptr};
  PGconn* c = libpq().PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (!c) {
    error = "out of memory";
    return false;
  }
  if (libpq().PQstatus(c) != CONNECTION_OK) {
    error = one_line(libpq().PQerrorMessage(c));
    libpq().PQfinish(c);
    return false;
  }
  c_ = c;
  // The schema's "already exists, skipping" NOTICEs would go to stderr: Weir's own messages say what matters.
  libpq().PQsetNoticeProcessor(
      c_, [](void*, const char*) {}, nullptr);
  if (libpq().PQsetClientEncoding(c_, "UTF8") != 0) {
    error = "cannot set client_encoding to UTF8: " + this->error();
    close();
    return false;
  }
  PgResult r = exec("SET statement_timeout = '10s'");
  if (!r.ok()) {
    error = r.error();
    close();
    return false;
  }
  return true;
}

PgResult PgConn::exec(const char* sql, const std::vector<const char*>& params) {
  if (params.empty()) return PgResult(libpq().PQexec(c_, sql));
  return PgResult(
      libpq().PQexecParams(c_, sql, static_cast<int>(params.size()), nullptr, params.data(), nullptr, nullptr, 0));
}

std::string PgConn::error() const { return one_line(c_ ? libpq().PQerrorMessage(c_) : "not connected"); }

bool PgConn::healthy() const { return c_ && libpq().PQstatus(c_) == CONNECTION_OK; }

void append_copy_text(std::string& out, std::string_view s) {
  for (char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\0':
        out += "\xEF\xBF\xBD";
        break;
      default:
        out += c;
    }
  }
}

namespace {

// libpq's integer options (parse_int_param): optional blanks, an optional sign, digits, optional blanks.
bool int_text(std::string_view v, long lo, long hi) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (!v.empty() && v.front() == '+') v.remove_prefix(1);
  long n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  return !v.empty() && ec == std::errc() && end == v.data() + v.size() && n >= lo && n <= hi;
}

// What libpq refuses when it connects, not when it parses (connectOptions2, connectDBStart): an option's
// value outside its set. Empty when none; the option's value is said (none of these holds a secret).
std::string option_problem(std::string_view key, std::string_view val) {
  struct Choice {
    std::string_view key;
    std::initializer_list<std::string_view> values;
  };
  static const Choice kChoices[] = {
      {"sslmode", {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}},
      {"gssencmode", {"disable", "prefer", "require"}},
      {"channel_binding", {"disable", "prefer", "require"}},
      {"target_session_attrs", {"any", "read-write", "read-only", "primary", "standby", "prefer-standby"}},
      {"ssl_min_protocol_version", {"", "TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"}},
      {"ssl_max_protocol_version", {"", "TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"}},
  };
  for (const Choice& c : kChoices) {
    if (key != c.key) continue;
    std::string all;
    for (std::string_view v : c.values) {
      if (v == val) return {};
      if (!v.empty()) all += fmt::format("{}{}", all.empty() ? "" : ", ", v);
    }
    return fmt::format("{}={} is not one of {}", key, val, all);
  }
  if (key == "port") {
    // One per host, comma-separated; an empty one is the default (5432).
    for (std::size_t at = 0;;) {
      const std::size_t comma = val.find(',', at);
      const std::string_view p = val.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
      if (!p.empty() && !int_text(p, 1, 65535)) return fmt::format("port {} is not a port number (1 to 65535)", p);
      if (comma == std::string_view::npos) return {};
      at = comma + 1;
    }
  }
  for (std::string_view k : {"connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
                             "keepalives_count", "tcp_user_timeout"})
    if (key == k && !val.empty() && !int_text(val, INT32_MIN, INT32_MAX))
      return fmt::format("{}={} is not an integer", key, val);
  return {};
}

}  // namespace

std::string postgres_url_problem(const std::string& url) {
  const Libpq& l = libpq();
  if (!l.error.empty()) return {};  // the store's open says so, and retries
  char* err = nullptr;
  PQconninfoOption* opts = l.PQconninfoParse(url.c_str(), &err);
  std::string problem;
  if (!opts) {
    problem = err ? one_line(err) : "libpq could not read it";
    if (err) l.PQfreemem(err);
  } else {
    for (const PQconninfoOption* o = opts; o->keyword && problem.empty(); ++o)
      if (o->val) problem = option_problem(o->keyword, o->val);
    l.PQconninfoFree(opts);
  }
  if (problem.empty()) return {};
  // libpq's message may quote the URL, or a part of it (a percent-encoded token): never the password.
  // (Each search goes on past what it put in: the replacement may hold what it replaced.)
  auto replace_all = [&](const std::string& what, const std::string& with) {
    for (std::size_t at = problem.find(what); at != std::string::npos; at = problem.find(what, at + with.size()))
      problem.replace(at, what.size(), with);
  };
  replace_all(url, core::redact_url(url));
  if (const std::string pw = url_password(url); !pw.empty()) replace_all(pw, "REDACTED");
  return problem;
}

std::unique_ptr<StoreBackend> make_postgres_backend(const RequestLogConfig& config) {
  return std::make_unique<PostgresBackend>(config);
}

}  // namespace weir::requestlog
