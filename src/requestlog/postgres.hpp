// PostgreSQL through libpq (https://www.postgresql.org/docs/current/libpq.html):
// a connection for the request log's writer (requestlog/backend.hpp) and its
// reader (requestlog/query.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

struct pg_conn;
struct pg_result;

namespace weir::requestlog {

// A result that clears itself.
class PgResult {
 public:
  PgResult() = default;
  explicit PgResult(pg_result* r) : r_(r) {}
  PgResult(PgResult&& o) noexcept : r_(o.r_) { o.r_ = nullptr; }
  PgResult& operator=(PgResult&& o) noexcept;
  ~PgResult();
  pg_result* get() const { return r_; }
  // PGRES_COMMAND_OK or PGRES_TUPLES_OK.
  bool ok() const;
  int rows() const;
  bool is_null(int row, int col) const;
  std::string_view text(int row, int col) const;  // empty for NULL
  std::int64_t int64(int row, int col) const;
  // The result's severity and message, one line; not its DETAIL or CONTEXT (they may quote row data).
  std::string error() const;

 private:
  pg_result* r_ = nullptr;
};

// One connection. Connects with Weir's defaults, each of which the URL may
// override: connect_timeout=5, application_name=weir, TCP keepalives, and
// a statement_timeout of 10 s set after connecting, so no statement can
// hold a thread (the writer's, the admin's blocking one) for long.
class PgConn {
 public:
  PgConn() = default;
  PgConn(PgConn&& o) noexcept : c_(o.c_) { o.c_ = nullptr; }
  PgConn& operator=(PgConn&& o) noexcept;
  ~PgConn();
  explicit operator bool() const { return c_ != nullptr; }

  // Connects to `url` (postgres://…, libpq's URI syntax); false with `error` set (one line, no password).
  bool connect(const std::string& url, std::string& error);
  void close();
  pg_conn* get() const { return c_; }
  // Runs `sql` with text parameters (null: an SQL NULL).
  PgResult exec(const char* sql, const std::vector<const char*>& params = {});
  // The connection's last error, one line.
  std::string error() const;
  // False once the server went away (PQstatus is CONNECTION_BAD).
  bool healthy() const;

 private:
  pg_conn* c_ = nullptr;
};

// Why libpq would refuse `url` at every connection (empty when it would
// not): what PQconninfoParse rejects (a malformed URI, an unknown
// parameter), and the values libpq checks only when it connects (port
// outside 1–65535, sslmode, gssencmode, channel_binding,
// target_session_attrs and ssl_*_protocol_version outside their sets, an
// integer option that is not one). One line, the password never in it.
// Loads libpq; empty when it cannot be loaded (the store's open says so).
std::string postgres_url_problem(const std::string& url);

// Appends `s` as a field of COPY's text format (§COPY "Text Format"):
// backslash, newline, carriage return and tab escaped, NUL (which a text
// value cannot hold) replaced by U+FFFD.
void append_copy_text(std::string& out, std::string_view s);

}  // namespace weir::requestlog
