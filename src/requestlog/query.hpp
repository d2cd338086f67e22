// Reading the request-log store (requestlog/store.hpp) for the admin API's
// GET /admin/v1/requests and GET /admin/v1/requests/{request_id} and for
// `weir requests`: on a non-worker thread, through a connection of its own
// (SQLite: read-only, WAL lets it read while the writer writes; PostgreSQL:
// a libpq connection).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <tl/expected.hpp>

#include "core/error.hpp"
#include "requestlog/config.hpp"
#include "requestlog/postgres.hpp"
#include "requestlog/sqlite.hpp"

namespace weir::requestlog {

// A request-log query, from the URL query string (parse_query).
struct Query {
  std::optional<std::int64_t> since_us;              // ts_us >= since (inclusive), Unix µs
  std::optional<std::int64_t> until_us;              // ts_us < until (exclusive)
  std::optional<std::string> tenant, key_id, model;  // exact match
  std::optional<std::string> request_id;             // exact match: every record with this x-request-id
  int status_min = 0, status_max = 0;                // status in [min, max]; 0 = any
  std::uint32_t limit = 50;                          // 1..1000
  // Keyset position: rows strictly older than (ts_us, id) in the order
  // newest first (the previous page's last row).
  std::optional<std::int64_t> after_ts_us;
  std::int64_t after_id = 0;
};

// Parses `since=&until=&tenant=&key_id=&model=&request_id=&status=&limit=&cursor=` (the
// part after '?', percent-decoded, '+' is a space; application/x-www-form-urlencoded):
//   since, until  RFC 3339 (2026-12-01T23:05:00Z, fractions and ±hh:mm
//                 offsets allowed) or Unix seconds (1764630300, 1764630300.25)
//   status        a status (429) or a class (4xx)
//   limit         1..1000, default 50
//   cursor        a previous answer's next_cursor (opaque)
// An unknown or repeated parameter or a bad value is a core::bad_request
// (400, invalid_request_error) whose `param` names it.
tl::expected<Query, core::Error> parse_query(std::string_view url_query);

// The opaque cursor for a keyset position (ts_us, id); parse_query reads it back.
std::string make_cursor(std::int64_t ts_us, std::int64_t id);

// A read-only view of a store. Thread-safe (one query at a time,
// serialized on an internal mutex); never use it on a worker thread.
class Reader {
 public:
  // The SQLite file at `path`.
  explicit Reader(std::string path) : path_(std::move(path)) {}
  // The store `config` names (SQLite or PostgreSQL).
  explicit Reader(const RequestLogConfig& config)
      : kind_(config.kind),
        path_(config.kind == StoreKind::sqlite ? config.path : config.url),
        display_(config.display) {}

  // {"object":"list","data":[records, newest first],"has_more":bool,
  //  "next_cursor":string|null}; each record is the access-log line's JSON
  //  object as stored. Newest first = by ts_us then insertion order,
  //  descending; pages follow next_cursor (keyset, stable while rows are added).
  // Errors: 503 (core::unavailable) when the store cannot be opened or read.
  tl::expected<std::string, core::Error> query_json(const Query& q);
  // The newest record with this request id (newest as query_json orders),
  // or nullopt (a 404 for the caller), with a member "others_with_id": how
  // many other records have the same id (clients choose their
  // x-request-id: two tenants may have used one; query_json with
  // Query::request_id lists them all); and with its captured bodies, when
  // there are any, as a last member "bodies": {"request"?: body,
  // "response"?: body}, body = {"size": bytes, "truncated": bool, "text":
  // string} or, for bytes that are not UTF-8, "base64" in place of "text".
  // Errors as query_json.
  tl::expected<std::optional<std::string>, core::Error> get_json(std::string_view request_id);

 private:
  tl::expected<void, core::Error> ensure_open();
  // db_.prepare(), falling back to an immutable connection where SQLite cannot make PATH-shm (see the .cpp);
  // on failure the connection is closed (opened again next time).
  Stmt prepare(std::string_view sql, std::string& error);
  bool wal_exists() const;  // PATH-wal is there (a stat)
  // A 503 for a statement that failed to step, with SQLite's message; the connection closed.
  core::Error read_failed();
  // pg_.exec(), run once more on a new connection when the server had closed pg_ (PQstatus CONNECTION_BAD:
  // a restart, idle_session_timeout, pg_terminate_backend, a pooler's idle timeout); reads may run twice.
  // On failure `error` is set (one line, no password).
  PgResult exec_pg(const char* sql, const std::vector<const char*>& params, std::string& error);
  tl::expected<std::string, core::Error> query_pg(const Query& q);
  tl::expected<std::optional<std::string>, core::Error> get_pg(std::string_view request_id);

  StoreKind kind_ = StoreKind::sqlite;
  std::string path_;  // SQLite: the file; PostgreSQL: the URL (never shown: display_)
  std::string display_;
  std::mutex mu_;
  Db db_;
  bool immutable_ = false;  // db_ was opened immutable (no writer had the file open then)
  bool wal_noted_ = false;  // db_.note_wal() ran (or has nothing to watch) since db_ was opened
  PgConn pg_;
};

}  // namespace weir::requestlog
