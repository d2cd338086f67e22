// The request-log store's two databases behind one writer (requestlog/store.hpp):
// what the writer thread asks of a store. One implementation per StoreKind:
// SQLite (requestlog/sqlite_store.cpp) and PostgreSQL (requestlog/postgres.cpp).
//
// Schema (version 2), the same in both: table `requests` with
//   id         insertion order (SQLite INTEGER PRIMARY KEY; PostgreSQL BIGSERIAL)
//   ts_us      the record's "ts", Unix µs
//   request_id, tenant, key_id, model   text (NULL when absent)
//   status     integer
//   record     the access-log line's JSON object (text)
//   bodies     captured bodies as a JSON object (text; NULL when none were captured)
// and indexes on (ts_us, id), (tenant, ts_us, id), (key_id, ts_us, id),
// (model, ts_us, id), (status, ts_us, id) and (request_id). A version-1
// store (no `bodies`) gets the column at open.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "requestlog/config.hpp"
#include "requestlog/queue.hpp"

namespace weir::requestlog {

class StoreBackend {
 public:
  virtual ~StoreBackend() = default;
  // Opens (connects), creates or upgrades the schema, prepares what the
  // writes need. False with `error` set; the store is then closed.
  virtual bool open(std::string& error) = 0;
  virtual bool is_open() const = 0;
  virtual void close() = 0;
  // Called before each batch. True when the store must be opened again,
  // `why` saying why: SQLite's file, or its write-ahead log, was deleted or
  // replaced since it was opened (a server-backed store never is); what was
  // written before is saved first where it can be (close()). False with
  // `why` set: it was, but cannot be left yet (the log's rows could not be
  // saved: writes go on where they are, and it is tried again); a failure
  // to count.
  virtual bool moved(std::string& why) {
    (void)why;
    return false;
  }
  // One batch: begin(), add() per record, then commit(), or rollback()
  // after a failure (the batch is lost, the caller closes and reopens).
  // `bodies`: the record's captured bodies as JSON text, empty = NULL. The
  // record's text columns are valid UTF-8 (the writer checked).
  virtual bool begin(std::string& error) = 0;
  virtual bool add(const Record& r, std::string_view bodies, std::string& error) = 0;
  virtual bool commit(std::string& error) = 0;
  virtual void rollback() = 0;
  // Retention: deletes rows with ts_us < cutoff_us, then all but the newest
  // max_rows, in chunks; returns the rows deleted, with `error` set
  // (non-empty) when a statement failed.
  virtual std::int64_t delete_older(std::int64_t cutoff_us, std::string& error) = 0;
  virtual std::int64_t keep_newest(std::uint64_t max_rows, std::string& error) = 0;
};

// The store for `config.kind`.
std::unique_ptr<StoreBackend> make_sqlite_backend(const RequestLogConfig& config);
std::unique_ptr<StoreBackend> make_postgres_backend(const RequestLogConfig& config);

// Rows retention deletes per statement: a long delete never holds the store for long.
inline constexpr std::int64_t kRetentionChunk = 10'000;

}  // namespace weir::requestlog
