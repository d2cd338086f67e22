#include "requestlog/postgres.hpp"

#include <libpq-fe.h>

#include <charconv>

#include <fmt/format.h>

#include "core/dynamic_library.hpp"
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
  decltype(&::PQerrorMessage) PQerrorMessage = nullptr;
  decltype(&::PQexec) PQexec = nullptr;
  decltype(&::PQexecParams) PQexecParams = nullptr;
  decltype(&::PQfinish) PQfinish = nullptr;
  decltype(&::PQgetResult) PQgetResult = nullptr;
  decltype(&::PQgetisnull) PQgetisnull = nullptr;
  decltype(&::PQgetlength) PQgetlength = nullptr;
  decltype(&::PQgetvalue) PQgetvalue = nullptr;
  decltype(&::PQntuples) PQntuples = nullptr;
  decltype(&::PQputCopyData) PQputCopyData = nullptr;
  decltype(&::PQputCopyEnd) PQputCopyEnd = nullptr;
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
    so.load(l.PQerrorMessage, "PQerrorMessage");
    so.load(l.PQexec, "PQexec");
    so.load(l.PQexecParams, "PQexecParams");
    so.load(l.PQfinish, "PQfinish");
    so.load(l.PQgetResult, "PQgetResult");
    so.load(l.PQgetisnull, "PQgetisnull");
    so.load(l.PQgetlength, "PQgetlength");
    so.load(l.PQgetvalue, "PQgetvalue");
    so.load(l.PQntuples, "PQntuples");
    so.load(l.PQputCopyData, "PQputCopyData");
    so.load(l.PQputCopyEnd, "PQputCopyEnd");
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
    PgResult start(libpq().PQexec(conn_.get(),
                                  "COPY requests (ts_us, request_id, tenant, key_id, model, status, record, bodies) "
                                  "FROM STDIN"));
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
    PgResult r = conn_.exec("SELECT id FROM requests ORDER BY id DESC LIMIT 1 OFFSET $1::bigint", {n.c_str()});
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
  void drain_results() {
    while (pg_result* raw = libpq().PQgetResult(conn_.get())) libpq().PQclear(raw);
  }

  std::int64_t delete_chunked(const char* sql, const std::string& arg, std::string& error) {
    std::int64_t total = 0;
    for (;;) {
      PgResult r = conn_.exec(sql, {arg.c_str()});
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

std::string PgResult::error() const { return one_line(r_ ? libpq().PQresultErrorMessage(r_) : "no result"); }

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

std::unique_ptr<StoreBackend> make_postgres_backend(const RequestLogConfig& config) {
  return std::make_unique<PostgresBackend>(config);
}

}  // namespace weir::requestlog
